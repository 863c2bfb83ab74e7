(** * Semantics of placements and collectives on one mesh axis.

    A tensor is a plain function from indices to values.  When a tensor is
    sharded, the sharded dimension is written as the first argument (a [nat])
    and every other dimension is collected in an arbitrary index type [I]
    (so [Shard(d)] of a tensor of any rank is covered by currying / a
    permutation, see [Layout.permute_shard] for the general multi-index form).
    A mesh axis has [p] ranks; a family of local tensors is [L : nat -> ...],
    indexed by the rank.  Sums are MathComp big operators over [nat] ranges. *)
From mathcomp Require Import all_ssreflect all_algebra.
Set Implicit Arguments.
Unset Strict Implicit.
Unset Printing Implicit Defensive.
Import GRing.Theory.
Local Open Scope ring_scope.

(** ** Placements *)

(** [Shard]: rank [r] holds rows [r*b .. r*b+b-1] of the logical tensor. *)
Definition shard {I V : Type} (p b : nat) (E : nat -> I -> V)
  (L : nat -> nat -> I -> V) : Prop :=
  forall r i x, (r < p)%N -> (i < b)%N -> L r i x = E (r * b + i)%N x.

(** Padded (uneven) shard of a flat buffer of length [n], as used by ZeRO:
    positions past [n] hold the padding value. *)
Definition shard_padded {V : Type} (p b n : nat) (pad : V) (E : nat -> V)
  (L : nat -> nat -> V) : Prop :=
  forall r i, (r < p)%N -> (i < b)%N ->
    L r i = if (r * b + i < n)%N then E (r * b + i)%N else pad.

(** [Replicate]: every rank holds the whole logical tensor. *)
Definition replicate {I V : Type} (p : nat) (E : I -> V) (L : nat -> I -> V) : Prop :=
  forall r x, (r < p)%N -> L r x = E x.

(** [Partial(op)] for any commutative monoid [op]: combining the local
    tensors with [op] over the ranks gives the logical tensor. *)
Definition partial_op {I V : Type} {idx : V} (op : Monoid.com_law idx) (p : nat)
  (E : I -> V) (L : nat -> I -> V) : Prop :=
  forall x, \big[op/idx]_(0 <= r < p) L r x = E x.

(** [Partial(sum)]. *)
Definition partial_sum {I : Type} {R : zmodType} (p : nat) (E : I -> R)
  (L : nat -> I -> R) : Prop :=
  forall x, \sum_(0 <= r < p) L r x = E x.

(** [Partial(avg)]: the mean over the ranks is the logical tensor. *)
Definition partial_avg {I : Type} {R : fieldType} (p : nat) (E : I -> R)
  (L : nat -> I -> R) : Prop :=
  forall x, ((p%:R)^-1 * \sum_(0 <= r < p) L r x)%R = E x.

(** [Partial(max)]: the join (max on a total order; a bottom element, e.g.
    -infinity, is the identity) over the ranks is the logical tensor. *)
Definition partial_max {I : Type} {disp : unit} {T : bLatticeType disp} (p : nat)
  (E : I -> T) (L : nat -> I -> T) : Prop :=
  forall x, \big[Order.join/Order.bottom]_(0 <= r < p) L r x = E x.

(** ** Collectives, as functions on the family of local tensors.
    The result is again a family indexed by the rank. *)

Definition all_reduce_op {I V : Type} {idx : V} (op : Monoid.com_law idx) (p : nat)
  (L : nat -> I -> V) : nat -> I -> V :=
  fun _ x => \big[op/idx]_(0 <= s < p) L s x.

Definition all_reduce_sum {I : Type} {R : zmodType} (p : nat) (L : nat -> I -> R)
  : nat -> I -> R := fun _ x => \sum_(0 <= s < p) L s x.

Definition all_reduce_avg {I : Type} {R : fieldType} (p : nat) (L : nat -> I -> R)
  : nat -> I -> R := fun _ x => (p%:R)^-1 * \sum_(0 <= s < p) L s x.

Definition all_reduce_max {I : Type} {disp : unit} {T : bLatticeType disp} (p : nat)
  (L : nat -> I -> T) : nat -> I -> T :=
  fun _ x => \big[Order.join/Order.bottom]_(0 <= s < p) L s x.

(** all_gather along the sharded dimension (blocks of size [b]). *)
Definition all_gather {I V : Type} (b : nat) (L : nat -> nat -> I -> V)
  : nat -> nat -> I -> V :=
  fun _ k x => L (k %/ b)%N (k %% b)%N x.

(** reduce_scatter (sum) into blocks of size [b]. *)
Definition reduce_scatter {I : Type} {R : zmodType} (p b : nat)
  (L : nat -> nat -> I -> R) : nat -> nat -> I -> R :=
  fun r i x => \sum_(0 <= s < p) L s (r * b + i)%N x.

(** broadcast from rank [src]. *)
Definition broadcast {I V : Type} (src : nat) (L : nat -> I -> V) : nat -> I -> V :=
  fun _ x => L src x.

(** send/recv along a rank map [peer]: rank [r] receives what [peer r] sent. *)
Definition send_recv {I V : Type} (peer : nat -> nat) (L : nat -> I -> V)
  : nat -> I -> V := fun r x => L (peer r) x.

(** ** The block-partition identity behind every sharded reduction. *)
Lemma big_blocks {V : Type} {idx : V} (op : Monoid.com_law idx) (p b : nat)
  (F : nat -> V) :
  \big[op/idx]_(0 <= k < p * b) F k =
  \big[op/idx]_(0 <= r < p) \big[op/idx]_(0 <= i < b) F (r * b + i)%N.
Proof.
elim: p => [|p IH]; first by rewrite mul0n !big_geq.
rewrite big_nat_recr //= -IH mulSnr.
rewrite (big_cat_nat _ _ _ (leq0n (p * b)) (leq_addr b (p * b))) /=.
congr (op _ _).
rewrite -{1}[(p * b)%N]add0n big_addn addKn.
by apply: eq_bigr => i _; rewrite addnC.
Qed.

Lemma sum_blocks {R : zmodType} (p b : nat) (F : nat -> R) :
  \sum_(0 <= k < p * b) F k = \sum_(0 <= r < p) \sum_(0 <= i < b) F (r * b + i)%N.
Proof. exact: (big_blocks (GRing.add_comoid R)). Qed.

(** Index arithmetic of contiguous blocks. *)
Lemma block_rank_lt (p b k : nat) : (0 < b)%N -> (k < p * b)%N -> (k %/ b < p)%N.
Proof. by move=> b0 kpb; rewrite ltn_divLR. Qed.

Lemma block_div (b r i : nat) : (0 < b)%N -> (i < b)%N -> ((r * b + i) %/ b)%N = r.
Proof. by move=> b0 ib; rewrite divnMDl // divn_small // addn0. Qed.

Lemma block_mod (b r i : nat) : (i < b)%N -> ((r * b + i) %% b)%N = i.
Proof. by move=> ib; rewrite modnMDl modn_small. Qed.

Lemma block_mem (b r t : nat) : (0 < b)%N ->
  ((r * b <= t) && (t < r * b + b))%N = ((t %/ b)%N == r).
Proof.
move=> b0; rewrite eqn_leq leq_divRL // andbC; congr (_ && _).
by rewrite -[X in _ = X]ltnS ltn_divLR // mulSnr.
Qed.

(** A sum over ranks where only rank [s] contributes. *)
Lemma sum_only_one {R : zmodType} (p s : nat) (F : nat -> R) :
  (s < p)%N -> \sum_(0 <= r < p) (if r == s then F r else 0) = F s.
Proof.
elim: p => [//|p IH] sp.
rewrite big_nat_recr //=.
have [lt|ge] := ltnP s p; first by rewrite IH // (gtn_eqF lt) addr0.
have -> : s = p by apply/eqP; rewrite eqn_leq ge -ltnS sp.
rewrite eqxx big_nat_cond big1 ?add0r // => r /andP[/andP[_ rp] _].
by rewrite (ltn_eqF rp).
Qed.

(** ** Max over a nonempty range of a totally ordered field (the reals have no
    bottom element, so [max] over [0 .. n-1] is seeded with its first term). *)
Section MaxUpto.
Variable R : realDomainType.
Import Order.TTheory Num.Theory.

Fixpoint max_upto (F : nat -> R) (n : nat) : R :=
  if n is n'.+1 then Num.max (max_upto F n') (F n') else F 0%N.

Lemma max_upto_ub (F : nat -> R) (n i : nat) : (i < n)%N -> F i <= max_upto F n.
Proof.
elim: n => [//|n IH]; rewrite ltnS leq_eqVlt => /orP[/eqP->|lt] /=.
  by rewrite le_maxr lexx orbT.
by rewrite le_maxr IH.
Qed.

Lemma max_upto_attained (F : nat -> R) (n : nat) :
  (0 < n)%N -> exists2 i, (i < n)%N & max_upto F n = F i.
Proof.
have aux : forall m, exists2 i, (i <= m)%N & max_upto F m = F i.
  elim=> [|m [i ilem e]]; first by exists 0%N.
  rewrite /= e maxEle; case: ifP => _; first by exists m.
  by exists i; rewrite // (leq_trans ilem).
case: n => [//|n] _; have [i ilen e] := aux n.
rewrite /= e maxEle; case: ifP => _; first by exists n.
by exists i.
Qed.

Lemma max_upto_unique (F : nat -> R) (n : nat) (M : R) :
  (0 < n)%N -> (forall i, (i < n)%N -> F i <= M) -> (exists2 i, (i < n)%N & M = F i) ->
  max_upto F n = M.
Proof.
move=> n0 ub [i ilt eM]; apply/eqP; rewrite eq_le {2}eM max_upto_ub // andbT.
by have [j jlt ->] := max_upto_attained F n0; apply: ub.
Qed.
End MaxUpto.

(** [Partial(max)] and all_reduce max over a totally ordered field ([p > 0]
    ranks). *)
Definition partial_max_real {I : Type} {R : realDomainType} (p : nat)
  (E : I -> R) (L : nat -> I -> R) : Prop :=
  forall x, max_upto (fun r => L r x) p = E x.

Definition all_reduce_max_real {I : Type} {R : realDomainType} (p : nat)
  (L : nat -> I -> R) : nat -> I -> R :=
  fun _ x => max_upto (fun s => L s x) p.
