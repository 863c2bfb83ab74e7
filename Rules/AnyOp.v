(** * Rules for arbitrary ops: replicated operands, row-wise ops, congruence.

    An op with several operands is modelled as one function of the bundled
    operands [A : K -> I -> V] (operand [k] at index [x]); heterogeneous
    operands are bundled through a sum type for [V] and [I].  Its result is a
    tensor [J -> W] (a tuple of outputs through a product type [W]). *)
From Coq Require Import FunctionalExtensionality.
From mathcomp Require Import all_ssreflect.
From TVCert Require Import Semantics.
Set Implicit Arguments.
Unset Strict Implicit.
Unset Printing Implicit Defensive.

(** An op respects pointwise equality of its operands (every op that is a
    function of the operands' values does; see [op_ext_funext]). *)
Definition op_ext {K I V J W : Type} (f : (K -> I -> V) -> J -> W) : Prop :=
  forall A B, (forall k x, A k x = B k x) -> forall y, f A y = f B y.

(** With function extensionality every function is [op_ext]. *)
Lemma op_ext_funext {K I V J W : Type} (f : (K -> I -> V) -> J -> W) : op_ext f.
Proof.
move=> A B e y; congr (f _ y).
by apply: functional_extensionality => k; apply: functional_extensionality => x.
Qed.

(** ** replicate_any: every rank applies the same [f] to the same (replicated)
    operands, so every rank holds [f] of the logical operands. *)
Theorem replicate_any {K I V J W : Type} (f : (K -> I -> V) -> J -> W) (p : nat)
  (E : K -> I -> V) (L : nat -> K -> I -> V) :
  op_ext f -> (forall k, replicate p (E k) (fun r => L r k)) ->
  replicate p (f E) (fun r => f (L r)).
Proof. by move=> ext h r y rp; apply: ext => k x; apply: h. Qed.

(** ** rowwise_shard.
    [f] acts independently along a dim [d] (written first, so the sharded
    dim of the operands and of the result may sit at different positions):
    slice [i] of the result is [g] of slice [i] of the operands that have
    [d] ([A]) and of the operands lacking [d] ([B], broadcast). *)
Definition rowwise {K I V M U O W : Type}
  (f : (K -> nat -> I -> V) -> (M -> U) -> nat -> O -> W)
  (g : (K -> I -> V) -> (M -> U) -> O -> W) : Prop :=
  forall A B i o, f A B i o = g (fun k => A k i) B o.

(** [g] respects pointwise equality of both operand groups. *)
Definition slice_ext {K I V M U O W : Type}
  (g : (K -> I -> V) -> (M -> U) -> O -> W) : Prop :=
  forall A A' B B', (forall k x, A k x = A' k x) -> (forall m, B m = B' m) ->
  forall o, g A B o = g A' B' o.

Theorem rowwise_shard {K I V M U O W : Type}
  (f : (K -> nat -> I -> V) -> (M -> U) -> nat -> O -> W)
  (g : (K -> I -> V) -> (M -> U) -> O -> W) (p b : nat)
  (E : K -> nat -> I -> V) (L : nat -> K -> nat -> I -> V)
  (B : M -> U) (LB : nat -> M -> U) :
  rowwise f g -> slice_ext g ->
  (forall k, shard p b (E k) (fun r => L r k)) -> replicate p B LB ->
  shard p b (f E B) (fun r => f (L r) (LB r)).
Proof.
move=> rw ext hE hB r i o rp ib; rewrite !rw; apply: ext => [k x|m].
  by rewrite hE.
by rewrite hB.
Qed.

(** ** congruence: equal arguments give equal results, for any function, and
    pointwise for any op on tensors (the latter by function extensionality). *)
Theorem congruence :
  (forall (T U : Type) (f : T -> U) (x y : T), x = y -> f x = f y) /\
  (forall (K I V J W : Type) (f : (K -> I -> V) -> J -> W) (A B : K -> I -> V),
     (forall k x, A k x = B k x) -> forall y, f A y = f B y).
Proof. by split=> [T U f x y -> // | K I V J W f]; apply: op_ext_funext. Qed.
