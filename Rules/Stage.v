(** * Stage composition.
    A stage relates a logical function [F] to a parallel function [f]:
    related inputs give related outputs (the relation being "the local tensors
    are the placement of the logical tensors"). *)
From mathcomp Require Import ssreflect ssrfun ssrnat.
Set Implicit Arguments.
Unset Strict Implicit.
Unset Printing Implicit Defensive.

Definition stage_ok {A B a b : Type} (RA : A -> a -> Prop) (RB : B -> b -> Prop)
  (F : A -> B) (f : a -> b) : Prop :=
  forall X x, RA X x -> RB (F X) (f x).

Theorem stage_compose {A B C a b c : Type} (R1 : A -> a -> Prop) (R2 : B -> b -> Prop)
  (R3 : C -> c -> Prop) (F : A -> B) (f : a -> b) (G : B -> C) (g : b -> c) :
  stage_ok R1 R2 F f -> stage_ok R2 R3 G g ->
  stage_ok R1 R3 (fun X => G (F X)) (fun x => g (f x)).
Proof. by move=> h1 h2 X x r; apply: h2; apply: h1. Qed.

(** Memoized layers: one proof for a stage serves [n] identical copies. *)
Theorem stage_repeat {A a : Type} (R : A -> a -> Prop) (F : A -> A) (f : a -> a) :
  stage_ok R R F f -> forall n, stage_ok R R (iter n F) (iter n f).
Proof. by move=> h; elim=> [//|n IH] X x r /=; apply: h; apply: IH. Qed.
