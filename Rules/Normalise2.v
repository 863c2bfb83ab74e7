(** * A common scalar factor out of a sum, a difference or a concat whose
    operands carry different factors.

    Rule [scale_common_factor] (kernel/reductions.py [common_factor], used by
    [Prover.norm] in kernel/equality.py): the backward of a data-parallel mean
    loss carries the local [1/count] through every op of the layer; where two
    paths meet ([add] of the residual and the layer's gradient, [sub] / [add]
    of the complex RoPE products, [concat] of the rotated halves) their
    factors differ (say [-1/16] and [1/1024]).  Reading
    [op(c_1 A_1, .., c_n A_n)] as [c_1 * op(A_1, (c_2/c_1) A_2, ..)] keeps the
    ratio of the factors inside and moves only [c_1] out, so two spellings that
    differ by a global factor compare by their factors; [c_1 <> 0] is
    checked. *)
From mathcomp Require Import all_ssreflect all_algebra.
From TVCert Require Import OpFlags.
Set Implicit Arguments.
Unset Strict Implicit.
Unset Printing Implicit Defensive.
Import GRing.Theory.
Local Open Scope ring_scope.

(** Homogeneous jointly in all its operands (bundled by [K]), and respecting
    pointwise equality of the operands. *)
Definition joint_homogeneous {K I J : Type} {R : ringType} (M : (K -> I -> R) -> J -> R) : Prop :=
  (forall c A j, M (fun k i => c * A k i) j = c * M A j) /\
  (forall A B, (forall k i, A k i = B k i) -> forall j, M A j = M B j).

Lemma common_factor_out {K I J : Type} {R : fieldType} (M : (K -> I -> R) -> J -> R)
  (c : K -> R) (k0 : K) (A : K -> I -> R) (j : J) :
  joint_homogeneous M -> c k0 != 0 ->
  M (fun k i => c k * A k i) j = c k0 * M (fun k i => (c k / c k0) * A k i) j.
Proof.
move=> [hom ext] nz; rewrite -hom; apply: ext => k i.
by rewrite mulrA mulrCA mulfV // mulr1.
Qed.

(** The two-operand pointwise sum and difference (operands bundled by [bool]). *)
Definition add2 {I : Type} {R : ringType} (A : bool -> I -> R) : I -> R := fun i => A true i + A false i.
Definition sub2 {I : Type} {R : ringType} (A : bool -> I -> R) : I -> R := fun i => A true i - A false i.

(** [concat] of operands [k : K], as [OpFlags.concat_op] reads them. *)
Definition concatK {K I : Type} {R : Type} (which : nat -> K * nat) (A : K -> nat * I -> R) : nat * I -> R :=
  concat_op which (fun x => A x.1 x.2).

Theorem scale_common_factor :
  (forall (K I J : Type) (R : fieldType) (M : (K -> I -> R) -> J -> R) (c : K -> R) (k0 : K) A j,
     joint_homogeneous M -> c k0 != 0 ->
     M (fun k i => c k * A k i) j = c k0 * M (fun k i => (c k / c k0) * A k i) j) /\
  (forall (I : Type) (R : ringType), joint_homogeneous (@add2 I R)) /\
  (forall (I : Type) (R : ringType), joint_homogeneous (@sub2 I R)) /\
  (forall (K I : Type) (R : ringType) (which : nat -> K * nat), joint_homogeneous (@concatK K I R which)).
Proof.
split; first by move=> K I J R M c k0 A j; apply: common_factor_out.
split; first by split=> [c A j|A B e j]; rewrite /add2 ?mulrDr ?e.
split; first by split=> [c A j|A B e j]; rewrite /sub2 ?mulrBr ?e.
by move=> K I R which; split=> [c A j|A B e j]; rewrite /concatK /concat_op ?e.
Qed.
