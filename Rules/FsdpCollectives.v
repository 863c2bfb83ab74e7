(** * reduce_scatter(avg) of partial sums (FSDP2's gradient reduce-scatter).

    FSDP2 reduce-scatters each rank's local gradient with [ReduceOp.AVG] over
    the data-parallel group: with the local gradients [L s] summing to [E],
    rank [r] keeps block [r] of [E / p].  Under HSDP the gradient is also a
    partial sum over the replicate axis (its [L t s] sum over both axes to
    [E]): after the reduce-scatter over [s] the blocks still sum over [t], to
    block [r] of [E / p]. *)
From mathcomp Require Import all_ssreflect all_algebra.
From TVCert Require Import Semantics.
Set Implicit Arguments.
Unset Strict Implicit.
Unset Printing Implicit Defensive.
Import GRing.Theory.
Local Open Scope ring_scope.

(** reduce_scatter(avg) is [1/p] times reduce_scatter(sum) (as in
    [CollectivesReal.reduce_scatter_replicate]).  First conjunct: one axis;
    second: a Partial(sum) on another axis [t] (of [pa] ranks) is kept, the
    blocks of every [t] summing to block [r] of [E / p]. *)
Theorem reduce_scatter_avg_partial_sum :
  (forall (I : Type) (R : fieldType) (p b : nat) (E : nat -> I -> R) (L : nat -> nat -> I -> R),
   (forall k x, \sum_(0 <= s < p) L s k x = E k x) ->
   shard p b (fun k x => E k x / p%:R) (fun r i x => (p%:R)^-1 * reduce_scatter p b L r i x)) /\
  (forall (I : Type) (R : fieldType) (pa p b : nat) (E : nat -> I -> R) (L : nat -> nat -> nat -> I -> R),
   (forall k x, \sum_(0 <= t < pa) \sum_(0 <= s < p) L t s k x = E k x) ->
   forall r i x, (r < p)%N -> (i < b)%N ->
     \sum_(0 <= t < pa) (p%:R)^-1 * reduce_scatter p b (L t) r i x = E (r * b + i)%N x / p%:R).
Proof.
split=> [I R p b E L h r i x _ _|I R pa p b E L h r i x _ _]; first by rewrite /reduce_scatter h mulrC.
by rewrite -big_distrr /= /reduce_scatter h mulrC.
Qed.
