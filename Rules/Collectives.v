(** * Collectives. *)
From mathcomp Require Import all_ssreflect all_algebra.
From TVCert Require Import Semantics.
Set Implicit Arguments.
Unset Strict Implicit.
Unset Printing Implicit Defensive.
Import GRing.Theory.
Local Open Scope ring_scope.

Theorem allreduce_sum_partial {I : Type} {R : zmodType} (p : nat) (E : I -> R)
  (L : nat -> I -> R) :
  partial_sum p E L -> replicate p E (all_reduce_sum p L).
Proof. by move=> h r x _; exact: h. Qed.

Theorem allreduce_avg_partial_avg {I : Type} {R : fieldType} (p : nat) (E : I -> R)
  (L : nat -> I -> R) :
  partial_avg p E L -> replicate p E (all_reduce_avg p L).
Proof. by move=> h r x _; exact: h. Qed.

(** all_reduce max of [Partial(max)] is Replicate: for a lattice with bottom
    (join) and for a totally ordered field such as the reals. *)
Theorem allreduce_max_partial_max :
  (forall (I : Type) (disp : unit) (T : bLatticeType disp) (p : nat)
     (E : I -> T) (L : nat -> I -> T),
   partial_max p E L -> replicate p E (all_reduce_max p L)) /\
  (forall (I : Type) (R : realDomainType) (p : nat) (E : I -> R) (L : nat -> I -> R),
   partial_max_real p E L -> replicate p E (all_reduce_max_real p L)).
Proof. by split=> I > h r x _; exact: h. Qed.

(** all_gather along the sharded dim of Shard gives the whole tensor on
    every rank (on the [p*b] gathered positions). *)
Theorem allgather_shard {I V : Type} (p b : nat) (E : nat -> I -> V)
  (L : nat -> nat -> I -> V) :
  (0 < b)%N -> shard p b E L ->
  forall r k x, (r < p)%N -> (k < p * b)%N -> all_gather b L r k x = E k x.
Proof.
move=> b0 h r k x _ kpb; rewrite /all_gather h ?ltn_pmod ?block_rank_lt //.
by rewrite -divn_eq.
Qed.

Theorem reduce_scatter_partial {I : Type} {R : zmodType} (p b : nat)
  (E : nat -> I -> R) (L : nat -> nat -> I -> R) :
  (forall k x, \sum_(0 <= s < p) L s k x = E k x) ->
  shard p b E (reduce_scatter p b L).
Proof. by move=> h r i x _ _; exact: h. Qed.

(** all_to_all: rank [s] sends to rank [t] the columns of block [t] of its
    rows; rank [t] stacks what it receives by source rank.  Shard(0) with
    blocks [ba] becomes Shard(1) with blocks [bb]. *)
Definition all_to_all {V : Type} (ba bb : nat) (L : nat -> nat -> nat -> V)
  : nat -> nat -> nat -> V :=
  fun t i j => L (i %/ ba)%N (i %% ba)%N (t * bb + j)%N.

Theorem all_to_all_reshard {V : Type} (p ba bb : nat) (E : nat -> nat -> V)
  (L : nat -> nat -> nat -> V) :
  (0 < ba)%N -> shard p ba E L ->
  forall t i j, (t < p)%N -> (i < p * ba)%N -> (j < bb)%N ->
    all_to_all ba bb L t i j = E i (t * bb + j)%N.
Proof.
move=> b0 h t i j _ ipb _; rewrite /all_to_all h ?ltn_pmod ?block_rank_lt //.
by rewrite -divn_eq.
Qed.

Theorem broadcast_replicate {I V : Type} (p src : nat) (E : I -> V)
  (L : nat -> I -> V) :
  (forall x, L src x = E x) -> replicate p E (broadcast src L).
Proof. by move=> h r x _; exact: h. Qed.

(** send/recv: every receiver gets exactly what its peer sent, and a
    stage-to-stage transfer (rank [r] to rank [r]) preserves any placement. *)
Theorem send_recv_preserves {I V : Type} (peer : nat -> nat) (L : nat -> I -> V) :
  (forall r x, send_recv peer L r x = L (peer r) x) /\
  (forall P : (nat -> I -> V) -> Prop, P L -> P (send_recv (fun r => r) L)).
Proof. by split. Qed.

(** Nested mesh axes: ranks [a*q + c] for axis sizes [p] (outer) and [q]
    (inner).  Reducing over the inner axis and then the outer one, or in the
    other order, equals reducing over the flattened product axis.  Holds for
    any commutative monoid (sum, max, ...). *)
Theorem allreduce_nested_axes {I V : Type} {idx : V} (op : Monoid.com_law idx)
  (p q : nat) (L : nat -> I -> V) :
  forall r x,
    all_reduce_op op p (fun a => all_reduce_op op q (fun c => L (a * q + c)%N) r) r x
      = all_reduce_op op (p * q) L r x /\
    all_reduce_op op q (fun c => all_reduce_op op p (fun a => L (a * q + c)%N) r) r x
      = all_reduce_op op (p * q) L r x.
Proof.
move=> r x; rewrite /all_reduce_op (big_blocks op p q (fun s => L s x)).
by split=> //; rewrite exchange_big.
Qed.

(** Nested placements: Shard over an outer axis of [p] ranks (blocks [q*c])
    whose local tensors are again Shard over an inner axis of [q] ranks
    (blocks [c]) is Shard over the flattened [p*q] ranks, rank [r1*q + r2]. *)
Theorem shard_nested_axes {I V : Type} (p q c : nat) (E : nat -> I -> V)
  (L1 : nat -> nat -> I -> V) (L2 : nat -> nat -> nat -> I -> V) :
  (0 < q)%N -> shard p (q * c) E L1 -> (forall r1, (r1 < p)%N -> shard q c (L1 r1) (L2 r1)) ->
  shard (p * q) c E (fun s => L2 (s %/ q)%N (s %% q)%N).
Proof.
move=> q0 h1 h2 s i x spq ic.
have sp : (s %/ q < p)%N by rewrite ltn_divLR.
have iqc : (s %% q * c + i < q * c)%N.
  apply: (@leq_trans ((s %% q).+1 * c)); first by rewrite mulSn addnC ltn_add2r.
  by rewrite leq_mul2r ltn_pmod ?orbT.
rewrite h2 ?ltn_pmod // h1 //; congr E.
by rewrite [in RHS](divn_eq s q) mulnDl -mulnA addnA.
Qed.

(** all_reduce(avg) of [Partial(sum)] [E] is Replicate [E / p]. *)
Theorem allreduce_avg_partial_sum {I : Type} {R : fieldType} (p : nat) (E : I -> R)
  (L : nat -> I -> R) :
  partial_sum p E L -> replicate p (fun x => E x / p%:R) (all_reduce_avg p L).
Proof. by move=> h r x _; rewrite /all_reduce_avg h mulrC. Qed.

(** ** Collectives applied to a replicated input (every rank of the group
    holds the same logical tensor [E]). *)

(** Summing [p] copies of a value. *)
Lemma sum_over_ranks_of_replicate {I : Type} {R : zmodType} (p : nat) (E : I -> R)
  (L : nat -> I -> R) :
  replicate p E L -> forall x, \sum_(0 <= s < p) L s x = E x *+ p.
Proof.
move=> h x; rewrite (@eq_big_nat _ _ _ 0 p _ (fun _ => E x)); last first.
  by move=> s /andP[_ sp]; exact: h.
by rewrite sumr_const_nat subn0.
Qed.

(** all_reduce(sum) over [p] ranks of Replicate [E] is Replicate [p·E]. *)
Theorem allreduce_sum_replicate {I : Type} {R : zmodType} (p : nat) (E : I -> R)
  (L : nat -> I -> R) :
  replicate p E L -> replicate p (fun x => E x *+ p) (all_reduce_sum p L).
Proof. by move=> h r x _; rewrite /all_reduce_sum (sum_over_ranks_of_replicate h). Qed.

(** The mean of [p] copies is the value, when [p] is invertible in the field. *)
Lemma avg_of_copies {R : fieldType} (p : nat) (e : R) :
  p%:R != 0 :> R -> (p%:R)^-1 * (e *+ p) = e.
Proof. by move=> p0; rewrite -[e *+ p]mulr_natl mulrA mulVf // mul1r. Qed.

(** all_reduce(avg) of Replicate [E] is Replicate [E]: (a) over any field in
    which [p] is invertible ([p%:R != 0]; in characteristic [c] with [c | p]
    the claim is false); (b) over an ordered field such as the reals, for
    [p > 0]. *)
Theorem allreduce_avg_replicate :
  (forall (I : Type) (R : fieldType) (p : nat) (E : I -> R) (L : nat -> I -> R),
   p%:R != 0 :> R -> replicate p E L -> replicate p E (all_reduce_avg p L)) /\
  (forall (I : Type) (R : numFieldType) (p : nat) (E : I -> R) (L : nat -> I -> R),
   (0 < p)%N -> replicate p E L -> replicate p E (all_reduce_avg p L)).
Proof.
have gen : forall (I : Type) (R : fieldType) (p : nat) (E : I -> R) (L : nat -> I -> R),
    p%:R != 0 :> R -> replicate p E L -> replicate p E (all_reduce_avg p L).
  move=> I R p E L p0 h r x _.
  by rewrite /all_reduce_avg (sum_over_ranks_of_replicate h) avg_of_copies.
split=> [//|I R p E L p0]; apply: gen.
by rewrite Num.Theory.pnatr_eq0 -lt0n.
Qed.

(** The join of [n > 0] copies of a lattice element is that element. *)
Lemma join_of_copies {disp : unit} {T : bLatticeType disp} (n : nat) (e : T) :
  (0 < n)%N -> \big[Order.join/Order.bottom]_(0 <= s < n) e = e.
Proof.
case: n => [//|n] _; rewrite big_const_nat subn0.
elim: n => [|n IH]; first exact: Order.BLatticeTheory.joinx0.
by rewrite iterS IH Order.LatticeTheoryJoin.joinxx.
Qed.

(** The max of [n > 0] copies of a value of a totally ordered field is that value. *)
Lemma max_upto_of_copies {R : realDomainType} (F : nat -> R) (n : nat) (e : R) :
  (0 < n)%N -> (forall s, (s < n)%N -> F s = e) -> max_upto F n = e.
Proof.
move=> n0 h; apply: max_upto_unique => //.
  by move=> i /h ->; exact: Order.POrderTheory.lexx.
by exists 0%N => //; rewrite h.
Qed.

(** all_reduce(max) of Replicate [E] is Replicate [E], for [p > 0] ranks:
    (a) for a lattice with bottom (join); (b) for a totally ordered field such
    as the reals ([max_upto]). *)
Theorem allreduce_max_replicate :
  (forall (I : Type) (disp : unit) (T : bLatticeType disp) (p : nat)
     (E : I -> T) (L : nat -> I -> T),
   (0 < p)%N -> replicate p E L -> replicate p E (all_reduce_max p L)) /\
  (forall (I : Type) (R : realDomainType) (p : nat) (E : I -> R) (L : nat -> I -> R),
   (0 < p)%N -> replicate p E L -> replicate p E (all_reduce_max_real p L)).
Proof.
split=> [I disp T p E L p0 h r x _ | I R p E L p0 h r x _].
  rewrite /all_reduce_max (@eq_big_nat _ _ _ 0 p _ (fun _ => E x)); last first.
    by move=> s /andP[_ sp]; exact: h.
  exact: join_of_copies.
by rewrite /all_reduce_max_real; apply: max_upto_of_copies => // s sp; exact: h.
Qed.
