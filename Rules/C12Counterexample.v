(** * TrainVerify's Theorem C.12 is false.
    Kernel [u0 + u1] over two slots ([bool]); [f = [[1,1],[1,1]] x] and
    [g = [[1,1],[2,0]] x] (values in [nat]). *)
From mathcomp Require Import all_ssreflect.
From TVCert Require Import ShapeReduction.
Set Implicit Arguments.
Unset Strict Implicit.
Unset Printing Implicit Defensive.

Definition ce_theta (u : bool -> nat) : nat := u false + u true.
Definition ce_tau_f (j : nat) (a : bool) : nat := nat_of_bool a.
Definition ce_tau_g (j : nat) (a : bool) : nat := if j == 0 then nat_of_bool a else 0.

Definition ce_f := simd ce_theta ce_tau_f.
Definition ce_g := simd ce_theta ce_tau_g.

Theorem c12_ce_agree_at_0 : forall x, ce_f x 0 = ce_g x 0.
Proof. by []. Qed.

Theorem c12_ce_differ_at_1 : exists x, ce_f x 1 <> ce_g x 1.
Proof. by exists id. Qed.

(** (H1) fails for every [P]. *)
Theorem c12_ce_violates_H1 :
  forall P : bool -> bool, ~ (forall j a, ce_tau_g j a = ce_tau_f j (P a)).
Proof.
move=> P H; have h0 := H 0 true; have h1 := H 1 true.
by rewrite /ce_tau_g /ce_tau_f /= in h0 h1; rewrite -h0 in h1.
Qed.

(** (H2) holds at [j0 = 0]: the counterexample isolates (H1). *)
Theorem c12_ce_satisfies_H2 : injective (ce_tau_f 0).
Proof. by move=> [] []. Qed.

(** C.12 as stated (no H1, no H2) is false. *)
Theorem c12_original_false :
  ~ (forall (theta_f theta_g : (bool -> nat) -> nat) (tau_f tau_g : nat -> bool -> nat)
        (j0 : nat),
        (forall x, simd theta_f tau_f x j0 = simd theta_g tau_g x j0) ->
        forall x j, simd theta_f tau_f x j = simd theta_g tau_g x j).
Proof.
move=> C; have [x hx] := c12_ce_differ_at_1.
by apply: hx; apply: (C _ _ _ _ 0) => //; exact: c12_ce_agree_at_0.
Qed.

(** Keeping (H2) and the extensionality side conditions but dropping (H1)
    is still false. *)
Theorem c12_without_H1_false :
  ~ (forall (theta_f theta_g : (bool -> nat) -> nat) (tau_f tau_g : nat -> bool -> nat)
        (j0 : nat),
        kernel_ext theta_f -> kernel_ext theta_g -> injective (tau_f j0) ->
        (forall x, simd theta_f tau_f x j0 = simd theta_g tau_g x j0) ->
        forall x j, simd theta_f tau_f x j = simd theta_g tau_g x j).
Proof.
move=> C; have [x hx] := c12_ce_differ_at_1.
apply: hx; apply: (C _ _ _ _ 0) => //.
- by move=> u v h; rewrite /ce_theta !h.
- by move=> u v h; rewrite /ce_theta !h.
- exact: c12_ce_satisfies_H2.
Qed.

(** Dropping (H2) but keeping (H1) is false too: [f x = [x0+x0, x0+x1]],
    [g x = [2 x0, 2 x0]] with the same dependency maps ([P = id]) and kernels
    [u0 + u1] versus [2 u0]. *)
Theorem c12_without_H2_false :
  ~ (forall (theta_f theta_g : (bool -> nat) -> nat) (tau_f tau_g : nat -> bool -> nat)
        (j0 : nat),
        kernel_ext theta_f -> kernel_ext theta_g ->
        (exists P : bool -> bool, forall j a, tau_g j a = tau_f j (P a)) ->
        (forall x, simd theta_f tau_f x j0 = simd theta_g tau_g x j0) ->
        forall x j, simd theta_f tau_f x j = simd theta_g tau_g x j).
Proof.
move=> C.
pose tau := fun (j : nat) (a : bool) => if j == 0 then 0 else nat_of_bool a.
pose thg := fun u : bool -> nat => u false + u false.
have ext1 : kernel_ext ce_theta by move=> u v h; rewrite /ce_theta !h.
have ext2 : kernel_ext thg by move=> u v h; rewrite /thg !h.
have H1 : exists P : bool -> bool, forall j a, tau j a = tau j (P a) by exists id.
have ag : forall x, simd ce_theta tau x 0 = simd thg tau x 0 by [].
by have := C _ _ _ _ 0 ext1 ext2 H1 ag id 1.
Qed.
