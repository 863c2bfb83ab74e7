(** * A rank's block of positions written as an iota with a rank-dependent start.

    A context-parallel program may make rank [r]'s positions directly,
    [arange(s0 + r*n*t, s0 + (r+1)*n*t, t)], instead of cutting them from the
    sequence's iota: rank [r]'s iota of [n] elements starting at
    [s0 + (r*n) t] is block [r] of the iota of [p*n] elements from [s0]. *)
From mathcomp Require Import all_ssreflect all_algebra.
From TVCert Require Import Semantics.
Set Implicit Arguments.
Unset Strict Implicit.
Unset Printing Implicit Defensive.
Import GRing.Theory.
Local Open Scope ring_scope.

(** The iota [s0, s0 + t, ...] of any length, as a tensor of one dim. *)
Definition iota_at {R : ringType} (s0 t : R) (k : nat) (_ : unit) : R := s0 + k%:R * t.

Theorem iota_rank_block {R : ringType} (p n : nat) (s0 t : R) :
  shard p n (iota_at s0 t) (fun r i u => iota_at (s0 + (r * n)%:R * t) t i u).
Proof. by move=> r i u rp ilt; rewrite /iota_at natrD mulrDl addrA. Qed.
