(** * Microbatch: the micro-batches of a data-parallel shard.

    Rank [r] of [p] holds rows [r*(k*n) + j] of the logical batch [E] ([shard p (k*n) E L]); a
    pipeline schedule splits its rows into [k] micro-batches of [n], so micro-batch [i] of rank [r]
    is rows [r*(k*n) + (i*n + t)] of [E]: the nested split (rank, micro-batch) is logical block
    [(r, i)].  Read through [interleave p k n E] (the batch dim as [p; k; n], the first two
    swapped, [Interleave.interleave] with the parts and the ranks exchanged), micro-batch [i] of
    every rank lies contiguous and rank-major, so each rank's micro-batch [i] is its Shard of the
    logical micro-batch [i]: [slice_shard_microbatch]. *)
From mathcomp Require Import all_ssreflect.
From TVCert Require Import Semantics Interleave.
Set Implicit Arguments.
Unset Strict Implicit.
Unset Printing Implicit Defensive.

(** Position [i*(p*n) + (r*n + t)] of the exchanged interleave is rank [r]'s row [i*n + t]. *)
Lemma microbatch_index {I V : Type} (p k n : nat) (E : nat -> I -> V) r i t x :
  r < p -> t < n ->
  interleave p k n E (i * (p * n) + (r * n + t)) x = E (r * (k * n) + (i * n + t)) x.
Proof. by move=> rp tn; rewrite interleave_block. Qed.

Theorem slice_shard_microbatch {I V : Type} (p k n : nat) (E : nat -> I -> V) (L : nat -> nat -> I -> V) :
  shard p (k * n) E L ->
  forall i, i < k ->
  shard p n (fun u x => interleave p k n E (i * (p * n) + u) x) (fun r t x => L r (i * n + t) x).
Proof.
move=> h i ik r t x rp tn.
by rewrite microbatch_index // h // part_lt.
Qed.
