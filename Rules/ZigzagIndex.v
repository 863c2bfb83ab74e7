(** * Head-tail load balancing by an index: [index_select] at the balancer's permutation, then a rank's block.

    torch's [_HeadTailLoadBalancer] (what [context_parallel()] and torchtitan's
    [prepare_context_parallel_input] use) does not slice the two chunks of
    each rank: it builds one index [P] of the [p * (2 * c)] rows, chunks
    [0, 2p-1, 1, 2p-2, ...] (pairs [(r, 2p-1-r)]), reads the buffer at it
    ([index_select] or a [gather] broadcast along the other dims) and rank [r]
    keeps block [r] of [2c] rows of the result.  When [P] is that
    permutation ([zz_flat]), the rank's block is its zig-zag shard. *)
From mathcomp Require Import all_ssreflect.
From TVCert Require Import Semantics Zigzag.
Set Implicit Arguments.
Unset Strict Implicit.
Unset Printing Implicit Defensive.

(** Rank [r]'s block of [2c] rows lies in the [p * (2 * c)] rows. *)
Lemma rank_block_lt (p b r i : nat) : (r < p)%N -> (i < b)%N -> (r * b + i < p * b)%N.
Proof.
move=> rp ib; apply: (@leq_trans (r.+1 * b)); last by rewrite leq_mul2r rp orbT.
by rewrite mulSn [X in (_ < X)%N]addnC ltn_add2l.
Qed.

(** Block [r] of a replica read at the head-tail permutation is rank [r]'s
    zig-zag shard. *)
Theorem zigzag_from_index_block {I V : Type} (p c : nat) (P : nat -> nat) (X : nat -> I -> V)
  (LX : nat -> nat -> I -> V) :
  (forall k, (k < p * (2 * c))%N -> P k = zz_flat p c k) ->
  replicate p X LX ->
  shard_zigzag p c X (fun r i => LX r (P (r * (2 * c) + i)%N)).
Proof.
move=> hP h r i x rp i2c.
by rewrite h // hP ?zz_flat_block // rank_block_lt.
Qed.
