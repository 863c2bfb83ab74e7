(** * Reductions and softmax. *)
From mathcomp Require Import all_ssreflect all_algebra.
From TVCert Require Import Semantics.
Set Implicit Arguments.
Unset Strict Implicit.
Unset Printing Implicit Defensive.
Import GRing.Theory.
Local Open Scope ring_scope.

(** Reducing with any commutative monoid over the sharded dimension gives
    [Partial(op)]. *)
Lemma reduce_op_sharded_dim {I V : Type} {idx : V} (op : Monoid.com_law idx)
  (p b : nat) (E : nat -> I -> V) (L : nat -> nat -> I -> V) :
  shard p b E L ->
  partial_op op p (fun x => \big[op/idx]_(0 <= k < p * b) E k x)
                  (fun r x => \big[op/idx]_(0 <= i < b) L r i x).
Proof.
move=> h x; rewrite big_blocks; apply: eq_big_nat => r /andP[_ rp].
by apply: eq_big_nat => i /andP[_ ib]; rewrite h.
Qed.

Theorem reduce_sum_sharded_dim {I : Type} {R : zmodType} (p b : nat)
  (E : nat -> I -> R) (L : nat -> nat -> I -> R) :
  shard p b E L ->
  partial_sum p (fun x => \sum_(0 <= k < p * b) E k x)
                (fun r x => \sum_(0 <= i < b) L r i x).
Proof. exact: (reduce_op_sharded_dim (GRing.add_comoid R)). Qed.

(** Max over the sharded dimension gives [Partial(max)]: for a lattice with a
    bottom (join; e.g. reals extended with -infinity), and for a totally ordered
    field such as the reals, with [p, b > 0] (max of a nonempty range). *)
Theorem reduce_max_sharded_dim :
  (forall (I : Type) (disp : unit) (T : bLatticeType disp) (p b : nat)
     (E : nat -> I -> T) (L : nat -> nat -> I -> T),
   shard p b E L ->
   partial_max p (fun x => \big[Order.join/Order.bottom]_(0 <= k < p * b) E k x)
                 (fun r x => \big[Order.join/Order.bottom]_(0 <= i < b) L r i x)) /\
  (forall (I : Type) (R : realDomainType) (p b : nat)
     (E : nat -> I -> R) (L : nat -> nat -> I -> R),
   (0 < p)%N -> (0 < b)%N -> shard p b E L ->
   partial_max_real p (fun x => max_upto (fun k => E k x) (p * b))
                      (fun r x => max_upto (fun i => L r i x) b)).
Proof.
split=> [I disp T p b E L|I R p b E L p0 b0 h x].
  exact: (reduce_op_sharded_dim Order.BLatticeTheory.join_comoid).
have blk : forall r i, (r < p)%N -> (i < b)%N -> (r * b + i < p * b)%N.
  move=> r i rp ib; rewrite (@leq_trans (r * b + b)) ?ltn_add2l //.
  by rewrite -mulSnr leq_mul2r rp orbT.
symmetry; apply: max_upto_unique => [|k kpb|].
- by rewrite muln_gt0 p0.
- have kb : (k %/ b < p)%N by rewrite ltn_divLR.
  have -> : E k x = L (k %/ b)%N (k %% b)%N x by rewrite h ?ltn_pmod // -divn_eq.
  apply: (Order.POrderTheory.le_trans
            (max_upto_ub (fun i => L (k %/ b)%N i x) (ltn_pmod k b0))).
  exact: (max_upto_ub (fun r => max_upto (fun i => L r i x) b) kb).
- have [r rp ->] := max_upto_attained (fun r => max_upto (fun i => L r i x) b) p0.
  have [i ib ->] := max_upto_attained (fun i => L r i x) b0.
  by exists (r * b + i)%N; rewrite ?blk ?h.
Qed.

(** Mean over the sharded dimension with even shards: the local means are a
    [Partial(avg)] of the global mean. *)
Theorem reduce_mean_sharded_dim {I : Type} {R : fieldType} (p b : nat)
  (E : nat -> I -> R) (L : nat -> nat -> I -> R) :
  shard p b E L ->
  partial_avg p (fun x => ((p * b)%N%:R)^-1 * \sum_(0 <= k < p * b) E k x)
                (fun r x => (b%:R)^-1 * \sum_(0 <= i < b) L r i x).
Proof.
move=> h x; rewrite -mulr_sumr (reduce_sum_sharded_dim h) natrM invfM.
by rewrite mulrA.
Qed.

(** Reducing (sum, max, any commutative monoid) over an unsharded dimension
    and post-processing with any [g] (e.g. division by [n] for the mean)
    keeps Shard on the sharded dimension. *)
Theorem reduce_other_dim {I V W : Type} {idx : V} (op : Monoid.com_law idx)
  (g : V -> W) (p b n : nat) (E : nat -> nat -> I -> V) (L : nat -> nat -> nat -> I -> V) :
  shard p b E L ->
  shard p b (fun i x => g (\big[op/idx]_(0 <= k < n) E i k x))
            (fun r i x => g (\big[op/idx]_(0 <= k < n) L r i k x)).
Proof.
move=> h r i x rp ib; congr (g _); apply: eq_bigr => k _; by rewrite h.
Qed.

Definition softmax {R : fieldType} (exp : R -> R) (n : nat) (row : nat -> R) (k : nat) : R :=
  exp (row k) / \sum_(0 <= j < n) exp (row j).

Definition log_softmax {R : fieldType} (exp log : R -> R) (n : nat) (row : nat -> R)
  (k : nat) : R :=
  row k - log (\sum_(0 <= j < n) exp (row j)).

(** Softmax and log-softmax along a dimension other than the sharded one
    keep the Shard ([exp], [log] are arbitrary functions).  The tensor is
    [E i x k]: sharded dim [i] first, any other dims [x : I], softmax dim [k]
    (size [n]) last. *)
Theorem softmax_other_dim {I : Type} {R : fieldType} (exp log : R -> R) (p b n : nat)
  (E : nat -> I -> nat -> R) (L : nat -> nat -> I -> nat -> R) :
  (forall r i x k, (r < p)%N -> (i < b)%N -> L r i x k = E (r * b + i)%N x k) ->
  forall r i x k, (r < p)%N -> (i < b)%N ->
    softmax exp n (L r i x) k = softmax exp n (E (r * b + i)%N x) k /\
    log_softmax exp log n (L r i x) k = log_softmax exp log n (E (r * b + i)%N x) k.
Proof.
move=> h r i x k rp ib; split.
  by rewrite /softmax h //; congr (_ / _); apply: eq_bigr => j _; rewrite h.
by rewrite /log_softmax h //; congr (_ - log _); apply: eq_bigr => j _; rewrite h.
Qed.
