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
From TVCert Require Import OpFlags NormaliseReductions.
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

(** ** [allreduce_mixed_axes]: an all_reduce(sum) or all_reduce(avg) over the
    flattened group of two axes (rank [k] is [(k / pb, k mod pb)], mesh order;
    more axes nest, the first axes' group being again one axis) of a tensor
    that is, on each axis of the group, Replicate, Partial(sum) or
    Partial(avg).  The sum gives [f_a f_b E] with [f = p] for Replicate and
    Partial(avg) and [1] for Partial(sum); the average gives [E / p] for
    each Partial(sum) axis and [E] otherwise (kernel/rules.py,
    [_allreduce_mixed]). *)
Inductive axis_kind := KR | KSum | KAvg.

(** How the pieces along one axis combine into the logical tensor. *)
Definition comb {R : fieldType} (k : axis_kind) (p : nat) (F : nat -> R) : R :=
  match k with
  | KR => F 0%N
  | KSum => \sum_(0 <= r < p) F r
  | KAvg => (p%:R)^-1 * \sum_(0 <= r < p) F r
  end.

(** Replicate: every rank of the axis holds the same piece. *)
Definition kind_ok {R : Type} (k : axis_kind) (p : nat) (F : nat -> R) : Prop :=
  k = KR -> forall r, (r < p)%N -> F r = F 0%N.

Definition sum_factor {R : ringType} (k : axis_kind) (p : nat) : R :=
  match k with KSum => 1 | _ => p%:R end.

Lemma sum_as_comb {R : numFieldType} (k : axis_kind) (p : nat) (F : nat -> R) :
  (0 < p)%N -> kind_ok k p F -> \sum_(0 <= r < p) F r = sum_factor k p * comb k p F.
Proof.
move=> p0; case: k => [h|_|_] /=; rewrite ?mul1r //.
  rewrite (eq_big_nat _ _ (fun r rp => h erefl r (andP rp).2)) sumr_const_nat subn0.
  by rewrite mulr_natl.
by rewrite mulrA mulfV ?mul1r // Num.Theory.pnatr_eq0 -lt0n.
Qed.

Lemma comb_ext {R : fieldType} (k : axis_kind) (p : nat) (F G : nat -> R) :
  (0 < p)%N -> (forall r, (r < p)%N -> F r = G r) -> comb k p F = comb k p G.
Proof.
move=> p0 e; have e' := eq_big_nat _ _ (fun r rp => e r (andP rp).2).
by case: k => /=; rewrite ?e // e'.
Qed.

Theorem allreduce_mixed_axes {I : Type} {R : numFieldType} (pa pb : nat) (ka kb : axis_kind)
  (E : I -> R) (L : nat -> nat -> I -> R) :
  (0 < pa)%N -> (0 < pb)%N ->
  (forall s x, (s < pb)%N -> kind_ok ka pa (fun r => L r s x)) ->
  (forall r x, (r < pa)%N -> kind_ok kb pb (fun s => L r s x)) ->
  (forall x, comb ka pa (fun r => comb kb pb (fun s => L r s x)) = E x) ->
  forall x : I,
    \sum_(0 <= k < pa * pb) L (k %/ pb)%N (k %% pb)%N x = sum_factor ka pa * sum_factor kb pb * E x /\
    (((pa * pb)%N%:R)^-1 * (\sum_(0 <= k < pa * pb) L (k %/ pb)%N (k %% pb)%N x) =
      (sum_factor ka pa / pa%:R) * (sum_factor kb pb / pb%:R) * E x)%R.
Proof.
move=> pa0 pb0 ha hb hE x.
have flat : \sum_(0 <= k < pa * pb) L (k %/ pb)%N (k %% pb)%N x = \sum_(0 <= r < pa) \sum_(0 <= s < pb) L r s x.
  by have [_ [_ [sp _]]] := reduction_normal_form; rewrite (proj1 (sp R pa pb (fun r s => L r s x))).
have inner : forall r, (r < pa)%N -> \sum_(0 <= s < pb) L r s x = sum_factor kb pb * comb kb pb (fun s => L r s x).
  by move=> r rp; apply: sum_as_comb => //; apply: hb.
have outer : \sum_(0 <= r < pa) \sum_(0 <= s < pb) L r s x =
             sum_factor kb pb * (sum_factor ka pa * E x).
  rewrite (eq_big_nat _ _ (fun r rp => inner r (andP rp).2)) -mulr_sumr -hE; congr (_ * _).
  apply: sum_as_comb => //; rewrite /kind_ok => kaR r rp.
  apply: comb_ext => // s sp; exact: (ha s x sp kaR r rp).
have sumeq : \sum_(0 <= k < pa * pb) L (k %/ pb)%N (k %% pb)%N x = sum_factor ka pa * sum_factor kb pb * E x.
  by rewrite flat outer mulrCA mulrA.
split=> //; rewrite sumeq natrM invfM.
set a := sum_factor ka pa; set b := sum_factor kb pb.
rewrite !mulrA; congr (_ * _).
by rewrite [a / _]mulrC -!mulrA; congr (_ * _); rewrite mulrCA [b / _]mulrC.
Qed.
