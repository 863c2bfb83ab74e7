(** * Replicated scalar factors move across homogeneous ops
    ([kernel/scalar_factor.py], equality step [scalar_factor_commutes]).

    Real code averages a loss over a global token count [n = all_reduce(sum(labels != -100))]: a 0-d tensor,
    one real number, the same on every rank and at every index it is broadcast to.  Autograd carries [1/n] into
    the gradients through [where], [log_softmax_backward], [matmul] and the gradient all-reduce, while the logical
    graph divides elsewhere.  [EqSteps.scale_commutes_linear] moves rational constants; this file states the same
    algebra for a factor [s : R] that is the value of any 0-d expression, and with no hypothesis [s != 0] where the
    engine divides by [s] on both sides (GRing's [s^-1] is total; the engine never cancels a divisor, so both sides
    divide by the same values and have the same domain).

    The normal form is [c * (prod num) / (prod den) * core]: the clauses are the steps that build it (an op
    homogeneous in an operand, a bilinear op, a division, [where] with a zero branch, a shared factor of [add] /
    [sub], the scalar [1] left as the core of a 0-d factor) and the comparison of factors matched one to one in any
    order.  The per-op homogeneity flags are [OpFlags]' theorems. *)
From mathcomp Require Import all_ssreflect all_algebra.
From TVCert Require Import EqSteps OpFlags.
Set Implicit Arguments.
Unset Strict Implicit.
Unset Printing Implicit Defensive.
Import GRing.Theory.
Local Open Scope ring_scope.

Theorem scalar_factor_commutes {I1 I2 J : Type} {R : fieldType} :
  (* an op homogeneous in its operand moves any real factor, so the value of a 0-d expression *)
  (forall L : (I1 -> R) -> J -> R, homogeneous L -> forall (s : R) x j, L (fun i => s * x i) j = s * L x j) /\
  (* a bilinear op (matmul, mul, einsum in two operands) moves both operands' factors *)
  (forall B : (I1 -> R) -> (I2 -> R) -> J -> R,
     (forall y, homogeneous (fun x => B x y)) -> (forall x, homogeneous (B x)) ->
     forall (s t : R) x y j, B (fun i => s * x i) (fun i => t * y i) j = s * t * B x y j) /\
  (* normal forms multiply and divide factor by factor, every divisor included (no [t != 0]) *)
  (forall (c1 c2 p1 p2 q1 q2 a b : R),
     (c1 * p1 / q1 * a) * (c2 * p2 / q2 * b) = (c1 * c2) * (p1 * p2) / (q1 * q2) * (a * b) /\
     (c1 * p1 / q1 * a) / (c2 * p2 * b) = (c1 / c2) * p1 / (q1 * p2) * (a / b)) /\
  (* where(c, s x, 0) and where(c, 0, s x) *)
  (forall (c : I1 -> bool) (s : R) x i, where_zero c (fun i => s * x i) i = s * where_zero c x i) /\
  (forall (c : I1 -> bool) (s : R) x i, (if c i then 0 else s * x i) = s * (if c i then 0 else x i)) /\
  (* the same factor on every operand of add / sub, and a negation *)
  (forall s a b : R, s * a + s * b = s * (a + b) /\ s * a - s * b = s * (a - b) /\ - (s * a) = (- 1) * s * a) /\
  (* a 0-d expression is its factors times the scalar 1 *)
  (forall s : R, s = s * 1) /\
  (* factors compared one to one in any order have the same product *)
  (forall (n : nat) (f g : 'I_n -> R) (sigma : 'I_n -> 'I_n),
     injective sigma -> (forall k, f k = g (sigma k)) -> \prod_k f k = \prod_k g k).
Proof.
split; first by move=> L hom s x j; apply: hom.
split; first by move=> B h1 h2 s t x y j; rewrite h1 h2 mulrA.
split.
  move=> c1 c2 p1 p2 q1 q2 a b; split.
    rewrite invfM [LHS]mulrACA; congr (_ * _); rewrite [LHS]mulrACA; congr (_ * _).
    by rewrite mulrACA.
  rewrite !invfM [LHS]mulrACA; congr (_ * _); rewrite [LHS]mulrACA; congr (_ * _).
  by rewrite mulrAC.
split; first by move=> c s x i; rewrite /where_zero; case: (c i); rewrite ?mulr0.
split; first by move=> c s x i; case: (c i); rewrite ?mulr0.
split; first by move=> s a b; rewrite mulrDr mulrBr mulN1r mulNr.
split; first by move=> s; rewrite mulr1.
move=> n f g sigma inj fg; rewrite [RHS](reindex_inj inj) /=.
by apply: eq_bigr => k _; rewrite fg.
Qed.
