(** * Corrected shape reduction (TrainVerify's Theorem C.12 with the
    hypotheses that make it true).

    A SIMD tensor function reads, at output index [j], the input positions
    [tau j a] for the kernel slots [a : A] and applies one kernel [theta] to
    the gathered values. *)
From mathcomp Require Import all_ssreflect.
Set Implicit Arguments.
Unset Strict Implicit.
Unset Printing Implicit Defensive.

Definition simd {A X V J : Type} (theta : (A -> V) -> V) (tau : J -> A -> X)
  (x : X -> V) (j : J) : V :=
  theta (fun a => x (tau j a)).

Definition kernel_ext {A V : Type} (theta : (A -> V) -> V) : Prop :=
  forall u v, (forall a, u a = v a) -> theta u = theta v.

(** (H1) [tau_g j a = tau_f j (P a)] at every output index for one fixed [P];
    (H2) [tau_f j0] is injective;  [f] and [g] agree at [j0] for all inputs.
    Then they agree at every index.  Slots are a finite type, input
    positions have decidable equality, kernels are extensional. *)
Theorem shape_reduction_corrected {A : finType} {X : eqType} {V J : Type}
  (theta_f theta_g : (A -> V) -> V) (tau_f tau_g : J -> A -> X) (j0 : J) :
  kernel_ext theta_f -> kernel_ext theta_g ->
  (exists P : A -> A, forall j a, tau_g j a = tau_f j (P a)) ->
  injective (tau_f j0) ->
  (forall x, simd theta_f tau_f x j0 = simd theta_g tau_g x j0) ->
  forall x j, simd theta_f tau_f x j = simd theta_g tau_g x j.
Proof.
move=> extf extg [P H1] H2 agree x j.
pose x' := fun y : X => if [pick a | tau_f j0 a == y] is Some a then x (tau_f j a) else x y.
have hx' : forall a, x' (tau_f j0 a) = x (tau_f j a).
  move=> a; rewrite /x'; case: pickP => [a' /eqP /H2 -> //|].
  by move=> /(_ a); rewrite eqxx.
have := agree x'; rewrite /simd => e.
transitivity (theta_f (fun a => x' (tau_f j0 a))); first by apply: extf => a; rewrite hx'.
rewrite e; apply: extg => a; by rewrite !H1 hx'.
Qed.
