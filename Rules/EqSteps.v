(** * The equality steps of the engine ([kernel/equality.py]): scalar
    factors through linear ops, layouts through pointwise ops, and the
    elementwise-region check (a corollary of [shape_reduction_corrected]). *)
From mathcomp Require Import all_ssreflect all_algebra.
From TVCert Require Import Layout ShapeReduction.
Set Implicit Arguments.
Unset Strict Implicit.
Unset Printing Implicit Defensive.
Import GRing.Theory.
Local Open Scope ring_scope.

(** ** scale_commutes_linear *)
Definition additive_map {I J : Type} {R : ringType} (L : (I -> R) -> J -> R) : Prop :=
  forall x y j, L (fun i => x i + y i) j = L x j + L y j.

Definition homogeneous {I J : Type} {R : ringType} (L : (I -> R) -> J -> R) : Prop :=
  forall c x j, L (fun i => c * x i) j = c * L x j.

(** Scaling operand [k] only, the others unchanged. *)
Definition scale_at {K : eqType} {I : Type} {R : ringType} (k : K) (c : R)
  (A : K -> I -> R) : K -> I -> R :=
  fun k' i => if k' == k then c * A k' i else A k' i.

(** Homogeneous in each operand separately (matmul, einsum), and respecting
    pointwise equality of the operands. *)
Definition multi_homogeneous {K : eqType} {I J : Type} {R : ringType}
  (M : (K -> I -> R) -> J -> R) : Prop :=
  (forall k c A j, M (scale_at k c A) j = c * M A j) /\
  (forall A B, (forall k i, A k i = B k i) -> forall j, M A j = M B j).

Lemma multi_homogeneous_scale {K : finType} {I J : Type} {R : comRingType}
  (M : (K -> I -> R) -> J -> R) (c : K -> R) (A : K -> I -> R) (j : J) :
  multi_homogeneous M ->
  M (fun k i => c k * A k i) j = (\prod_k c k) * M A j.
Proof.
move=> [hom ext].
pose S (s : seq K) := fun k i => (if k \in s then c k else 1) * A k i.
have ind : forall s, uniq s -> M (S s) j = (\prod_(k <- s) c k) * M A j.
  elim=> [|k s IH] /=.
    by move=> _; rewrite big_nil mul1r; apply: ext => k i; rewrite /S in_nil mul1r.
  move=> /andP[ks us]; rewrite big_cons -mulrA -IH // -(hom k); apply: ext => k' i.
  rewrite /scale_at /S in_cons; case: eqP => [->|_] /=; last by [].
  by rewrite (negPf ks) mul1r.
rewrite -big_enum -ind ?enum_uniq //; apply: ext => k i.
by rewrite /S mem_enum.
Qed.

(** The constant tensor with value [v] (torch's [full(v)]). *)
Definition const_tensor {I : Type} {R : ringType} (v : R) : I -> R := fun _ => v.

Theorem scale_commutes_linear {I1 I2 J : Type} {R : fieldType} :
  (forall L : (I1 -> R) -> J -> R, additive_map L -> homogeneous L ->
     forall c x j, L (fun i => c * x i) j = c * L x j) /\
  (forall B : (I1 -> R) -> (I2 -> R) -> J -> R,
     (forall y, homogeneous (fun x => B x y)) -> (forall x, homogeneous (B x)) ->
     forall c1 c2 x y j, B (fun i => c1 * x i) (fun i => c2 * y i) j = c1 * c2 * B x y j) /\
  (forall (K : finType) (M : (K -> I1 -> R) -> J -> R), multi_homogeneous M ->
     forall c A j, M (fun k i => c k * A k i) j = (\prod_k c k) * M A j) /\
  (forall c1 c2 a b : R, c2 != 0 -> (c1 * a) / (c2 * b) = (c1 / c2) * (a / b)) /\
  (forall c a b k : R, c * a + c * b = c * (a + b) /\ c * a - c * b = c * (a - b) /\
     - (c * a) = - c * a /\ (c * a) * k = (c * k) * a /\ k * (c * a) = (c * k) * a) /\
  (forall (v : R) (i : I1), const_tensor v i = v * const_tensor 1 i).
Proof.
split; first by move=> L _ hom; apply: hom.
split; first by move=> B h1 h2 c1 c2 x y j; rewrite h1 h2 mulrA.
split; first by move=> K M hM c A j; apply: multi_homogeneous_scale.
split; first by move=> c1 c2 a b _; rewrite invfM mulrACA.
split; last by move=> v i; rewrite /const_tensor mulr1.
move=> c a b k; rewrite mulrDr mulrBr mulNr; split=> //; split=> //; split=> //.
by rewrite -!mulrA (mulrC a) mulrCA (mulrC k).
Qed.

(** ** layout_commutes_pointwise.
    A layout op reads its operand through an index map [pi : J -> I] (output
    index [j] reads input index [pi j]); a reshape reads through the flat
    (row-major) index: [reshape unflat_s flat_t x = x o unflat_s o flat_t]. *)
Definition reindexed {I J V : Type} (pi : J -> I) (x : I -> V) : J -> V :=
  fun j => x (pi j).

Definition reshape {Is It V : Type} (unflat_s : nat -> Is) (flat_t : It -> nat)
  (x : Is -> V) : It -> V :=
  fun j => x (unflat_s (flat_t j)).

(** A full reduction (any commutative monoid: sum, max as a join with a
    bottom element) over a finite index type is invariant under a bijection
    of the index type; so is the mean. *)
Lemma big_bijective {I J : finType} {V : Type} {idx : V} (op : Monoid.com_law idx)
  (pi : J -> I) (F : I -> V) :
  bijective pi -> \big[op/idx]_(j : J) F (pi j) = \big[op/idx]_(i : I) F i.
Proof. by move=> bij; rewrite (reindex pi) //; apply: onW_bij. Qed.

Lemma mean_bijective {I J : finType} {R : fieldType} (pi : J -> I) (F : I -> R) :
  bijective pi ->
  (#|J|%:R)^-1 * (\sum_(j : J) F (pi j)) = (#|I|%:R)^-1 * (\sum_(i : I) F i).
Proof.
by move=> bij; rewrite (big_bijective (GRing.add_comoid R) F bij) (bij_eq_card bij).
Qed.

Theorem layout_commutes_pointwise :
  (* the layout of a pointwise op is the pointwise op of the laid-out operands
     (scalar operands are constants captured in [f]) *)
  (forall (K I J V W : Type) (f : (K -> V) -> W) (x : K -> I -> V) (pi : J -> I) (j : J),
     reindexed pi (fun i => f (fun k => x k i)) j = f (fun k => reindexed pi (x k) j)) /\
  (* index maps compose *)
  (forall (I J L V : Type) (pi1 : J -> I) (pi2 : L -> J) (x : I -> V) (l : L),
     reindexed pi2 (reindexed pi1 x) l = reindexed (fun l' => pi1 (pi2 l')) x l) /\
  (* permute after permute is one permute; its inverse is the composed inverse *)
  (forall (V : Type) (perm1 pinv1 perm2 pinv2 : nat -> nat) (E : (nat -> nat) -> V) o,
     cancel pinv1 perm1 -> cancel pinv2 perm2 ->
     permute pinv2 (permute pinv1 E) o = permute (fun k => pinv2 (pinv1 k)) E o /\
     cancel (fun k => pinv2 (pinv1 k)) (fun k => perm1 (perm2 k))) /\
  (* reshape after reshape is one reshape (same number N of elements) *)
  (forall (Is It Iu V : Type) (N : nat) (unflat_s : nat -> Is) (flat_t : It -> nat)
     (unflat_t : nat -> It) (flat_u : Iu -> nat) (x : Is -> V),
     (forall n, (n < N)%N -> flat_t (unflat_t n) = n) -> (forall k, (flat_u k < N)%N) ->
     forall k, reshape unflat_t flat_u (reshape unflat_s flat_t x) k = reshape unflat_s flat_u x k) /\
  (* a full reduction does not see a bijective layout *)
  (forall (I J : finType) (V : Type) (idx : V) (op : Monoid.com_law idx) (pi : J -> I) (F : I -> V),
     bijective pi -> \big[op/idx]_(j : J) F (pi j) = \big[op/idx]_(i : I) F i) /\
  (forall (I J : finType) (R : fieldType) (pi : J -> I) (F : I -> R),
     bijective pi ->
     (#|J|%:R)^-1 * (\sum_(j : J) F (pi j)) = (#|I|%:R)^-1 * (\sum_(i : I) F i)).
Proof.
split=> //; split=> //; split.
  by move=> V perm1 pinv1 perm2 pinv2 E o c1 c2; split=> // k; rewrite c2 c1.
split; first by move=> Is It Iu V N us ft ut fu x h hu k; rewrite /reshape h.
split; first by move=> I J V idx op pi F; apply: big_bijective.
by move=> I J R pi F; apply: mean_bijective.
Qed.

(** ** elementwise_smt.
    An elementwise region: both sides read leaf [a] at output index [j] at
    the input position [tau j a] (the same dependency map on both sides,
    i.e. [P] = identity), distinct leaves at distinct positions at the
    witness index [j0] ([tau j0] injective), and apply their scalar kernels.
    They agree at every index for every input iff the kernels agree for all
    leaf values (the question asked of the SMT solver). *)
Theorem elementwise_smt {A : finType} {X : eqType} {V J : Type}
  (theta_f theta_g : (A -> V) -> V) (tau : J -> A -> X) (j0 : J) :
  inhabited V -> kernel_ext theta_f -> kernel_ext theta_g -> injective (tau j0) ->
  (forall u : A -> V, theta_f u = theta_g u) <->
  (forall (x : X -> V) (j : J), simd theta_f tau x j = simd theta_g tau x j).
Proof.
move=> [v0] extf extg inj; split=> [agree | all].
  apply: (shape_reduction_corrected extf extg _ inj) => [|x].
    by exists id.
  exact: agree.
move=> u; pose x y := if [pick a | tau j0 a == y] is Some a then u a else v0.
have hx : forall a, x (tau j0 a) = u a.
  move=> a; rewrite /x; case: pickP => [a' /eqP /inj -> //|].
  by move=> /(_ a); rewrite eqxx.
have := all x j0; rewrite /simd => e.
transitivity (theta_f (fun a => x (tau j0 a))); first by apply: extf => a; rewrite hx.
by rewrite e; apply: extg => a; rewrite hx.
Qed.
