(** * Elementwise operations on equally placed operands. *)
From mathcomp Require Import all_ssreflect all_algebra.
From TVCert Require Import Semantics.
Set Implicit Arguments.
Unset Strict Implicit.
Unset Printing Implicit Defensive.

Theorem ew_unary_shard {I V W : Type} (f : V -> W) (p b : nat)
  (E : nat -> I -> V) (L : nat -> nat -> I -> V) :
  shard p b E L ->
  shard p b (fun i x => f (E i x)) (fun r i x => f (L r i x)).
Proof. by move=> h r i x rp ib; rewrite h. Qed.

Theorem ew_unary_replicate {I V W : Type} (f : V -> W) (p : nat)
  (E : I -> V) (L : nat -> I -> V) :
  replicate p E L -> replicate p (fun x => f (E x)) (fun r x => f (L r x)).
Proof. by move=> h r x rp; rewrite h. Qed.

Theorem ew_binary_shard {I U V W : Type} (f : U -> V -> W) (p b : nat)
  (E1 : nat -> I -> U) (L1 : nat -> nat -> I -> U)
  (E2 : nat -> I -> V) (L2 : nat -> nat -> I -> V) :
  shard p b E1 L1 -> shard p b E2 L2 ->
  shard p b (fun i x => f (E1 i x) (E2 i x)) (fun r i x => f (L1 r i x) (L2 r i x)).
Proof. by move=> h1 h2 r i x rp ib; rewrite h1 ?h2. Qed.

Theorem ew_binary_replicate {I U V W : Type} (f : U -> V -> W) (p : nat)
  (E1 : I -> U) (L1 : nat -> I -> U) (E2 : I -> V) (L2 : nat -> I -> V) :
  replicate p E1 L1 -> replicate p E2 L2 ->
  replicate p (fun x => f (E1 x) (E2 x)) (fun r x => f (L1 r x) (L2 r x)).
Proof. by move=> h1 h2 r x rp; rewrite h1 ?h2. Qed.

(** A sharded operand combined with a replicated operand that does not
    depend on the sharded index (it is broadcast along that dimension). *)
Theorem ew_binary_shard_broadcast {I U V W : Type} (f : U -> V -> W) (p b : nat)
  (E1 : nat -> I -> U) (L1 : nat -> nat -> I -> U) (B : I -> V) (LB : nat -> I -> V) :
  shard p b E1 L1 -> replicate p B LB ->
  shard p b (fun i x => f (E1 i x) (B x)) (fun r i x => f (L1 r i x) (LB r x)).
Proof. by move=> h1 h2 r i x rp ib; rewrite h1 ?h2. Qed.
