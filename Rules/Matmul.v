(** * Matmul and einsum over any ring.
    A matrix is a function of two indices; [K] is the contraction size. *)
From mathcomp Require Import all_ssreflect all_algebra.
From TVCert Require Import Semantics.
Set Implicit Arguments.
Unset Strict Implicit.
Unset Printing Implicit Defensive.
Import GRing.Theory.
Local Open Scope ring_scope.

Definition matmul {R : ringType} (K : nat) (A B : nat -> nat -> R) : nat -> nat -> R :=
  fun i j => \sum_(0 <= k < K) A i k * B k j.

(** Placements of matrices: Shard(0) is [shard]; Shard(1), Replicate and
    Partial(sum) of a two-index tensor, pointwise. *)
Definition shard_col {V : Type} (p b : nat) (A : nat -> nat -> V)
  (L : nat -> nat -> nat -> V) : Prop :=
  forall r i j, (r < p)%N -> (j < b)%N -> L r i j = A i (r * b + j)%N.

Definition replicate2 {V : Type} (p : nat) (A : nat -> nat -> V)
  (L : nat -> nat -> nat -> V) : Prop :=
  forall r i j, (r < p)%N -> L r i j = A i j.

Definition partial_sum2 {R : zmodType} (p : nat) (A : nat -> nat -> R)
  (L : nat -> nat -> nat -> R) : Prop :=
  forall i j, \sum_(0 <= r < p) L r i j = A i j.

Theorem matmul_replicate {R : ringType} (p K : nat) (A B : nat -> nat -> R)
  (LA LB : nat -> nat -> nat -> R) :
  replicate2 p A LA -> replicate2 p B LB ->
  replicate2 p (matmul K A B) (fun r => matmul K (LA r) (LB r)).
Proof.
move=> hA hB r i j rp; apply: eq_bigr => k _; by rewrite hA ?hB.
Qed.

(** Column parallel: Replicate x Shard(1) -> Shard(1). *)
Theorem matmul_col_parallel {R : ringType} (p b K : nat) (A B : nat -> nat -> R)
  (LA LB : nat -> nat -> nat -> R) :
  replicate2 p A LA -> shard_col p b B LB ->
  shard_col p b (matmul K A B) (fun r => matmul K (LA r) (LB r)).
Proof.
move=> hA hB r i j rp jb; apply: eq_bigr => k _; by rewrite hA ?hB.
Qed.

(** Row parallel: Shard(1) x Shard(0) -> Partial(sum) (contraction split in
    [p] contiguous blocks of size [b]). *)
Theorem matmul_row_parallel {R : ringType} (p b : nat) (A B : nat -> nat -> R)
  (LA LB : nat -> nat -> nat -> R) :
  shard_col p b A LA -> shard p b B LB ->
  partial_sum2 p (matmul (p * b) A B) (fun r => matmul b (LA r) (LB r)).
Proof.
move=> hA hB i j; rewrite /matmul sum_blocks.
apply: eq_big_nat => r /andP[_ rp]; apply: eq_big_nat => k /andP[_ kb].
by rewrite hA ?hB.
Qed.

(** Batch / row sharded lhs: Shard(0) x Replicate -> Shard(0). *)
Theorem matmul_batch_shard {R : ringType} (p b K : nat) (A B : nat -> nat -> R)
  (LA LB : nat -> nat -> nat -> R) :
  shard p b A LA -> replicate2 p B LB ->
  shard p b (matmul K A B) (fun r => matmul K (LA r) (LB r)).
Proof.
move=> hA hB r i j rp ib; apply: eq_bigr => k _; by rewrite hA ?hB.
Qed.

Theorem matmul_partial_lhs {R : ringType} (p K : nat) (A B : nat -> nat -> R)
  (LA LB : nat -> nat -> nat -> R) :
  partial_sum2 p A LA -> replicate2 p B LB ->
  partial_sum2 p (matmul K A B) (fun r => matmul K (LA r) (LB r)).
Proof.
move=> hA hB i j; rewrite /matmul exchange_big /=; apply: eq_bigr => k _.
rewrite -hA mulr_suml; apply: eq_big_nat => r /andP[_ rp]; by rewrite hB.
Qed.

Theorem matmul_partial_rhs {R : ringType} (p K : nat) (A B : nat -> nat -> R)
  (LA LB : nat -> nat -> nat -> R) :
  replicate2 p A LA -> partial_sum2 p B LB ->
  partial_sum2 p (matmul K A B) (fun r => matmul K (LA r) (LB r)).
Proof.
move=> hA hB i j; rewrite /matmul exchange_big /=; apply: eq_bigr => k _.
rewrite -hB mulr_sumr; apply: eq_big_nat => r /andP[_ rp]; by rewrite hA.
Qed.

(** Generic einsum.  All operands that carry the sharded index are bundled in
    [A] (the sharded index first, their other indices in [I]); [term] reads a
    slice of [A] and the replicated operands and gives the summand for output
    index [j] and contraction index [k].  [term] must respect pointwise
    equality of slices. *)
Theorem einsum_shard_free_index {I X J : Type} {R : zmodType} (p b K : nat)
  (term : (I -> X) -> J -> nat -> R) (A : nat -> I -> X) (LA : nat -> nat -> I -> X) :
  (forall u v, (forall y, u y = v y) -> forall j k, term u j k = term v j k) ->
  shard p b A LA ->
  shard p b (fun i j => \sum_(0 <= k < K) term (A i) j k)
            (fun r i j => \sum_(0 <= k < K) term (LA r i) j k).
Proof.
move=> ext hA r i j rp ib; apply: eq_bigr => k _; apply: ext => y; exact: hA.
Qed.

(** Sharding a summed index in every operand that carries it: the local
    einsums are a [Partial(sum)] of the logical one.  Here [A] bundles the
    operands carrying the contraction index (first argument). *)
Theorem einsum_shard_contracted_index {I X J : Type} {R : zmodType} (p b : nat)
  (term : (I -> X) -> J -> R) (A : nat -> I -> X) (LA : nat -> nat -> I -> X) :
  (forall u v, (forall y, u y = v y) -> forall j, term u j = term v j) ->
  shard p b A LA ->
  partial_sum p (fun j => \sum_(0 <= k < p * b) term (A k) j)
                (fun r j => \sum_(0 <= k < b) term (LA r k) j).
Proof.
move=> ext hA j; rewrite sum_blocks; apply: eq_big_nat => r /andP[_ rp].
apply: eq_big_nat => k /andP[_ kb]; apply: ext => y; exact: hA.
Qed.

(** An einsum is linear in each operand: with one [Partial(sum)] operand [A]
    (read at position [rd j k]) and the product of the replicated operands'
    reads on its left ([cl]) and right ([cr]), the local einsums are a
    [Partial(sum)] of the logical one. *)
Theorem einsum_partial_operand {I J : Type} {R : ringType} (p K : nat)
  (rd : J -> nat -> I) (cl cr : J -> nat -> R) (Lcl Lcr : nat -> J -> nat -> R)
  (A : I -> R) (LA : nat -> I -> R) :
  partial_sum p A LA ->
  (forall r j k, (r < p)%N -> Lcl r j k = cl j k) ->
  (forall r j k, (r < p)%N -> Lcr r j k = cr j k) ->
  partial_sum p (fun j => \sum_(0 <= k < K) cl j k * A (rd j k) * cr j k)
                (fun r j => \sum_(0 <= k < K) Lcl r j k * LA r (rd j k) * Lcr r j k).
Proof.
move=> hA hl hr j; rewrite exchange_big /=; apply: eq_bigr => k _.
rewrite -hA mulr_sumr mulr_suml; apply: eq_big_nat => r /andP[_ rp].
by rewrite hl ?hr.
Qed.
