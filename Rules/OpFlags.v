(** * The algebraic flags of the ops, proved op by op.

    The kernel lets a [Partial] value pass through an op ([partial_linear_map],
    [partial_neg], [partial_scale], [partial_div], the [linear_in] of a row-wise
    op) only where the op is additive in that operand, and the equality prover
    moves a scalar factor across an op ([scale_commutes_linear]) only where the
    op is homogeneous in it.  Those are claims about each op; this file proves
    them for the op's semantics (the docstrings of orchestrator/tvcert/ops/),
    one theorem per flag (the table [OPFLAG_THEOREMS] in tvcert.proofkit), and
    gives counterexamples for the flags that were wrong and are now removed
    (softmax / log_softmax forward, a cast into int, masked_fill / pad with a
    nonzero value).

    Index sets are abstract types; a sharded or reduced dim is written first as
    a [nat] (so [nat * I] is "that dim and all the others"), as in
    [Semantics]. *)
From mathcomp Require Import all_ssreflect all_algebra.
From TVCert Require Import Semantics Partial Layout Reductions EqSteps.
Set Implicit Arguments.
Unset Strict Implicit.
Unset Printing Implicit Defensive.
Import GRing.Theory Num.Theory.
Local Open Scope ring_scope.

(** Additivity, zero and extensionality of an op that only reads its operand. *)
Ltac reindex_linear := split; [by [] | split; [by [] | intros ? ? Hfg ?; apply: Hfg]].

(** ** What the flags claim *)

(** [linear_op A]: the three hypotheses of [Partial.partial_linear_map]. *)
Definition linear_op {I J : Type} {R S : zmodType} (A : (I -> R) -> J -> S) : Prop :=
  (forall f g y, A (fun x => f x + g x) y = A f y + A g y) /\
  (forall y, A (fun _ => 0) y = 0) /\
  (forall f g, (forall x, f x = g x) -> forall y, A f y = A g y).

(** A flagged op maps [Partial(sum)] to [Partial(sum)] (the rule the flag enables). *)
Theorem linear_op_partial {I J : Type} {R S : zmodType} (A : (I -> R) -> J -> S)
  (p : nat) (E : I -> R) (L : nat -> I -> R) :
  linear_op A -> partial_sum p E L -> partial_sum p (A E) (fun r => A (L r)).
Proof. by move=> [h1 [h2 h3]]; apply: partial_linear_map. Qed.

(** ... and [Partial(avg)] to [Partial(avg)] when it is also homogeneous. *)
Theorem linear_op_partial_avg {I J : Type} {R : fieldType} (A : (I -> R) -> J -> R)
  (p : nat) (E : I -> R) (L : nat -> I -> R) :
  linear_op A -> homogeneous A -> partial_avg p E L -> partial_avg p (A E) (fun r => A (L r)).
Proof.
move=> hA hom hE y.
have hS : partial_sum p (fun x => \sum_(0 <= r < p) L r x) L by [].
have := linear_op_partial hA hS y => ->.
have [_ [_ ext]] := hA.
rewrite -hom; apply: ext => x; exact: hE.
Qed.

(** ** Ops that read their operand through an index map, with zeros at masked
    positions: reshape / view / flatten / squeeze / unsqueeze, permute /
    transpose, slice / split, expand, flip, triu / tril, gather / index_select /
    embedding (the index tensor fixed), pad with value 0, where(c, x, 0). *)
Definition masked_reindex {I J : Type} {R : zmodType} (keep : J -> bool) (pi : J -> I)
  (x : I -> R) : J -> R := fun j => if keep j then x (pi j) else 0.

Theorem masked_reindex_linear {I J : Type} {R : zmodType} (keep : J -> bool) (pi : J -> I) :
  linear_op (@masked_reindex I J R keep pi).
Proof.
rewrite /masked_reindex; split; first by move=> f g y; case: (keep y); rewrite ?addr0.
by split=> [y|f g e y]; case: (keep y); rewrite ?e.
Qed.

Theorem masked_reindex_homogeneous {I J : Type} {R : ringType} (keep : J -> bool) (pi : J -> I) :
  homogeneous (@masked_reindex I J R keep pi).
Proof. by move=> c x j; rewrite /masked_reindex; case: (keep j); rewrite ?mulr0. Qed.

Theorem reindex_linear {I J : Type} {R : zmodType} (pi : J -> I) :
  linear_op (@reindexed I J R pi).
Proof. rewrite /reindexed; reindex_linear. Qed.

Theorem reindex_homogeneous {I J : Type} {R : ringType} (pi : J -> I) :
  homogeneous (@reindexed I J R pi).
Proof. by []. Qed.

(** reshape (row-major, [EqSteps.reshape]) *)
Theorem reshape_op_linear {Is It : Type} {R : ringType} (unflat_s : nat -> Is) (flat_t : It -> nat) :
  linear_op (@reshape Is It R unflat_s flat_t) /\ homogeneous (@reshape Is It R unflat_s flat_t).
Proof.
split; last by [].
rewrite /reshape; reindex_linear.
Qed.

(** permute / transpose ([Layout.permute]) *)
Theorem permute_op_linear {R : ringType} (pinv : nat -> nat) :
  linear_op (@permute R pinv) /\ homogeneous (@permute R pinv).
Proof.
split; last by [].
rewrite /permute; reindex_linear.
Qed.

(** slice / split along a dim: output row [j] is input row [start + step * j] *)
Definition slice_op {I : Type} {R : Type} (start step : nat) (x : nat * I -> R) : nat * I -> R :=
  fun ji => x (start + step * ji.1, ji.2)%N.

Theorem slice_op_linear {I : Type} {R : ringType} (start step : nat) :
  linear_op (@slice_op I R start step) /\ homogeneous (@slice_op I R start step).
Proof.
split; last by [].
rewrite /slice_op; reindex_linear.
Qed.

(** flip of a dim of size [n] *)
Definition flip_op {I : Type} {R : Type} (n : nat) (x : nat * I -> R) : nat * I -> R :=
  fun ji => x (n.-1 - ji.1, ji.2)%N.

Theorem flip_op_linear {I : Type} {R : ringType} (n : nat) :
  linear_op (@flip_op I R n) /\ homogeneous (@flip_op I R n).
Proof.
split; last by [].
rewrite /flip_op; reindex_linear.
Qed.

(** expand of a size-1 dim: every output row reads row 0 *)
Definition expand_op {I : Type} {R : Type} (x : nat * I -> R) : nat * I -> R :=
  fun ji => x (0%N, ji.2).

Theorem expand_op_linear {I : Type} {R : ringType} :
  linear_op (@expand_op I R) /\ homogeneous (@expand_op I R).
Proof.
split; last by [].
rewrite /expand_op; reindex_linear.
Qed.

(** triu / tril with an integer diagonal offset [k] (leading batch index [I]) *)
Definition tri_op {I : Type} {R : zmodType} (upper : bool) (k : int) (x : I * nat * nat -> R)
  : I * nat * nat -> R :=
  masked_reindex (fun bij : I * nat * nat =>
                    if upper then (bij.1.2%:Z + k <= bij.2%:Z)%R else (bij.2%:Z <= bij.1.2%:Z + k)%R)
                 id x.

Theorem tri_op_linear {I : Type} {R : ringType} (upper : bool) (k : int) :
  linear_op (@tri_op I R upper k) /\ homogeneous (@tri_op I R upper k).
Proof. by split; [apply: masked_reindex_linear | apply: masked_reindex_homogeneous]. Qed.

(** gather / index_select / embedding: the data input read at indices given by
    the (fixed) index tensor [ix] *)
Definition gather_op {I J : Type} {R : Type} (ix : J -> I) (x : I -> R) : J -> R :=
  fun j => x (ix j).

Theorem gather_linear {I J : Type} {R : ringType} (ix : J -> I) :
  linear_op (@gather_op I J R ix) /\ homogeneous (@gather_op I J R ix).
Proof.
split; last by [].
rewrite /gather_op; reindex_linear.
Qed.

(** pad a dim of size [n] by [lo] before (and anything after) with [v] *)
Definition pad_op {I : Type} {R : Type} (v : R) (lo n : nat) (x : nat * I -> R) : nat * I -> R :=
  fun ji => if (lo <= ji.1 < lo + n)%N then x (ji.1 - lo, ji.2)%N else v.

Theorem pad_zero_linear {I : Type} {R : ringType} (lo n : nat) :
  linear_op (@pad_op I R 0 lo n) /\ homogeneous (@pad_op I R 0 lo n).
Proof.
rewrite /pad_op; split; last by move=> c x j; case: ifP; rewrite ?mulr0.
split; first by move=> f g y; case: ifP => _; rewrite ?addr0.
by split=> [y|f g e y]; case: ifP; rewrite ?e.
Qed.

(** A nonzero pad value at a padded position: not additive (it sends 0 to a nonzero tensor). *)
Theorem pad_nonzero_not_additive {I : Type} {R : ringType} (v : R) (lo n j : nat) (i : I) :
  v != 0 -> ~~ (lo <= j < lo + n)%N -> ~ linear_op (@pad_op I R v lo n).
Proof.
move=> v0 out [_ [z _]]; move: (z (j, i)); rewrite /pad_op /= (negPf out) => e.
by move: v0; rewrite e eqxx.
Qed.

(** where(c, x, 0) and masked_fill(x, m, 0) *)
Definition where_zero {I : Type} {R : zmodType} (c : I -> bool) (x : I -> R) : I -> R :=
  fun i => if c i then x i else 0.

Theorem where_zero_linear {I : Type} {R : ringType} (c : I -> bool) :
  linear_op (@where_zero I R c) /\ homogeneous (@where_zero I R c).
Proof.
have -> : @where_zero I R c = masked_reindex c id by [].
by split; [apply: masked_reindex_linear | apply: masked_reindex_homogeneous].
Qed.

Definition masked_fill_op {I : Type} {R : Type} (v : R) (m : I -> bool) (x : I -> R) : I -> R :=
  fun i => if m i then v else x i.

Theorem masked_fill_zero_linear {I : Type} {R : ringType} (m : I -> bool) :
  linear_op (@masked_fill_op I R 0 m) /\ homogeneous (@masked_fill_op I R 0 m).
Proof.
rewrite /masked_fill_op; split; last by move=> c x j; case: (m j); rewrite ?mulr0.
split; first by move=> f g y; case: (m y); rewrite ?addr0.
by split=> [y|f g e y]; case: (m y); rewrite ?e.
Qed.

Theorem masked_fill_nonzero_not_additive {I : Type} {R : ringType} (v : R) (m : I -> bool) (i : I) :
  v != 0 -> m i -> ~ linear_op (@masked_fill_op I R v m).
Proof. by move=> v0 mi [_ [z _]]; move: (z i) v0; rewrite /masked_fill_op mi => ->; rewrite eqxx. Qed.

(** ** concat: additive jointly in its operands (bundled as [K * (nat * I)];
    output row [j] comes from operand [(which j).1], row [(which j).2]) *)
Definition concat_op {K I : Type} {R : Type} (which : nat -> K * nat) (x : K * (nat * I) -> R)
  : nat * I -> R := fun ji => x ((which ji.1).1, ((which ji.1).2, ji.2)).

Theorem concat_linear {K I : Type} {R : ringType} (which : nat -> K * nat) :
  linear_op (@concat_op K I R which) /\ homogeneous (@concat_op K I R which).
Proof.
split; last by [].
rewrite /concat_op; reindex_linear.
Qed.

(** ** Elementwise: neg, scale, cast into float, mul in either operand, div in
    its numerator *)
Theorem neg_linear {I : Type} {R : ringType} :
  linear_op (fun (x : I -> R) i => - x i) /\ homogeneous (fun (x : I -> R) i => - x i).
Proof.
split; last by move=> c x j; rewrite mulrN.
by split=> [f g y|]; [rewrite opprD | split=> [y|f g e y]; rewrite ?oppr0 ?e].
Qed.

Theorem mul_linear_l {I : Type} {R : comRingType} (w : I -> R) :
  linear_op (fun (x : I -> R) i => x i * w i) /\ homogeneous (fun (x : I -> R) i => x i * w i).
Proof.
split; last by move=> c x j; rewrite mulrA.
by split=> [f g y|]; [rewrite mulrDl | split=> [y|f g e y]; rewrite ?mul0r ?e].
Qed.

Theorem mul_linear_r {I : Type} {R : comRingType} (w : I -> R) :
  linear_op (fun (x : I -> R) i => w i * x i) /\ homogeneous (fun (x : I -> R) i => w i * x i).
Proof.
split; last by move=> c x j; rewrite mulrCA.
by split=> [f g y|]; [rewrite mulrDr | split=> [y|f g e y]; rewrite ?mulr0 ?e].
Qed.

Theorem div_linear_num {I : Type} {R : fieldType} (w : I -> R) :
  linear_op (fun (x : I -> R) i => x i / w i) /\ homogeneous (fun (x : I -> R) i => x i / w i).
Proof. exact: (mul_linear_l (fun i => (w i)^-1)). Qed.

Theorem scale_linear {I : Type} {R : comRingType} (v : R) :
  linear_op (fun (x : I -> R) i => x i * v) /\ homogeneous (fun (x : I -> R) i => x i * v).
Proof. exact: (mul_linear_l (fun=> v)). Qed.

(** cast of an int tensor into float: the ring morphism [int -> R] *)
Definition cast_float {I : Type} {R : ringType} (x : I -> int) : I -> R := fun i => (x i)%:~R.

Theorem cast_float_linear {I : Type} {R : ringType} : linear_op (@cast_float I R).
Proof. by rewrite /cast_float; split=> [f g y|]; [rewrite intrD | split=> [y|f g e y]; rewrite ?e]. Qed.

(** Only integer factors move across it (the operand is an int tensor). *)
Theorem cast_float_homogeneous {I : Type} {R : ringType} (c : int) (x : I -> int) (i : I) :
  @cast_float I R (fun j => c * x j) i = c%:~R * @cast_float I R x i.
Proof. by rewrite /cast_float intrM. Qed.

(** A cast into int (truncation toward zero) is neither additive nor
    homogeneous: any [T] with [T(1/2) = 0] and [T(1) = 1] is a counterexample to
    both (so [4 * int(x / 4) = int(x)] is false). *)
Theorem cast_int_not_additive {R : numFieldType} (T : R -> int) :
  T (1 / 2%:R) = 0 -> T 1 = 1 ->
  ~ (forall a b, T (a + b) = T a + T b) /\ ~ (forall (c a : R), (T (c * a))%:~R = c * (T a)%:~R).
Proof.
move=> h0 h1; split=> [add|hom].
  by move: h1; rewrite {1}(splitr 1) add h0.
have := hom 2%:R (1 / 2%:R); rewrite h0 mulr0 mul1r mulfV ?pnatr_eq0 // h1 => /eqP.
by rewrite oner_eq0.
Qed.

(** ** Reductions: sum and mean over a dim of size [n] *)
Definition sum_op {I : Type} {R : zmodType} (n : nat) (x : nat * I -> R) : I -> R :=
  fun i => \sum_(0 <= k < n) x (k, i).

Theorem sum_op_linear {I : Type} {R : ringType} (n : nat) :
  linear_op (@sum_op I R n) /\ homogeneous (@sum_op I R n).
Proof.
rewrite /sum_op; split; last by move=> c x j; rewrite mulr_sumr.
split; first by move=> f g y; rewrite big_split.
split=> [y|f g e y]; first by rewrite big1.
by apply: eq_bigr => k _; rewrite e.
Qed.

Definition mean_op {I : Type} {R : fieldType} (n : nat) (x : nat * I -> R) : I -> R :=
  fun i => (n%:R)^-1 * sum_op n x i.

Theorem mean_op_linear {I : Type} {R : fieldType} (n : nat) :
  linear_op (@mean_op I R n) /\ homogeneous (@mean_op I R n).
Proof.
have [[a [z e]] h] := @sum_op_linear I R n.
rewrite /mean_op; split; last by move=> c x j; rewrite h mulrCA.
split; first by move=> f g y; rewrite a mulrDr.
by split=> [y|f g ex y]; rewrite ?z ?mulr0 ?(e f g ex).
Qed.

(** embedding_backward: row [v] sums the gradient rows of the tokens with id [v] *)
Definition embedding_backward_op {H : Type} {R : zmodType} (T : nat) (ids : nat -> nat)
  (g : nat * H -> R) : nat * H -> R :=
  fun vh => \sum_(0 <= t < T) (if ids t == vh.1 then g (t, vh.2) else 0).

Theorem embedding_backward_linear {H : Type} {R : ringType} (T : nat) (ids : nat -> nat) :
  linear_op (@embedding_backward_op H R T ids) /\ homogeneous (@embedding_backward_op H R T ids).
Proof.
rewrite /embedding_backward_op; split.
  split; first by move=> f g y; rewrite -big_split /=; apply: eq_bigr => t _; case: ifP => _; rewrite ?addr0.
  split=> [y|f g e y]; first by rewrite big1 // => t _; case: ifP => _.
  by apply: eq_bigr => t _; rewrite e.
by move=> c x j; rewrite mulr_sumr; apply: eq_bigr => t _; case: ifP => _; rewrite ?mulr0.
Qed.

(** scatter_add / index_add: [x] plus the source entries scattered at their
    (fixed) positions; additive jointly in [(x, src)] (affine in either alone) *)
Definition scatter_add_op {J : eqType} {R : zmodType} (S : nat) (pos : nat -> J) (x : J -> R) (src : nat -> R)
  : J -> R := fun j => x j + \sum_(0 <= s < S) (if pos s == j then src s else 0).

Theorem scatter_add_linear {J : eqType} {R : ringType} (S : nat) (pos : nat -> J) :
  (forall (x1 x2 : J -> R) s1 s2 j, scatter_add_op S pos (fun i => x1 i + x2 i) (fun s => s1 s + s2 s) j =
                          scatter_add_op S pos x1 s1 j + scatter_add_op S pos x2 s2 j) /\
  (forall j, @scatter_add_op J R S pos (fun _ => 0) (fun _ => 0) j = 0) /\
  (forall (c : R) x src j, scatter_add_op S pos (fun i => c * x i) (fun s => c * src s) j = c * scatter_add_op S pos x src j).
Proof.
rewrite /scatter_add_op; split.
  move=> x1 x2 s1 s2 j; rewrite addrACA; congr (_ + _); rewrite -big_split /=.
  by apply: eq_bigr => s _; case: ifP => _; rewrite ?addr0.
split; first by move=> j; rewrite big1 ?addr0 // => s _; case: ifP.
move=> c x src j; rewrite mulrDr mulr_sumr; congr (_ + _).
by apply: eq_bigr => s _; case: ifP => _; rewrite ?mulr0.
Qed.

(** ** matmul and einsum: additive and homogeneous in each operand *)
Definition matmul_op {R : ringType} (K : nat) (A B : nat * nat -> R) : nat * nat -> R :=
  fun ij => \sum_(0 <= k < K) A (ij.1, k) * B (k, ij.2).

Theorem matmul_linear {R : comRingType} (K : nat) (A B : nat * nat -> R) :
  (linear_op (fun X => matmul_op K X B) /\ homogeneous (fun X => matmul_op K X B)) /\
  (linear_op (fun X => matmul_op K A X) /\ homogeneous (fun X => matmul_op K A X)).
Proof.
rewrite /matmul_op; split; split.
- split; first by move=> f g y; rewrite -big_split /=; apply: eq_bigr => k _; rewrite mulrDl.
  split=> [y|f g e y]; first by rewrite big1 // => k _; rewrite mul0r.
  by apply: eq_bigr => k _; rewrite e.
- by move=> c x j; rewrite mulr_sumr; apply: eq_bigr => k _; rewrite mulrA.
- split; first by move=> f g y; rewrite -big_split /=; apply: eq_bigr => k _; rewrite mulrDr.
  split=> [y|f g e y]; first by rewrite big1 // => k _; rewrite mulr0.
  by apply: eq_bigr => k _; rewrite e.
- by move=> c x j; rewrite mulr_sumr; apply: eq_bigr => k _; rewrite mulrCA.
Qed.

(** An einsum sums, over the assignments [s] of its letters consistent with the
    output index [j], the product of every operand [k] read at [idx k j s]:
    each operand occurs once in each product. *)
Definition einsum_op {K S : finType} {I J : Type} {R : comRingType} (idx : K -> J -> S -> I)
  (A : K -> I -> R) : J -> R :=
  fun j => \sum_(s : S) \prod_(k : K) A k (idx k j s).

Definition with_at {K : eqType} {I : Type} {R : Type} (k0 : K) (x : I -> R) (A : K -> I -> R) : K -> I -> R :=
  fun k => if k == k0 then x else A k.

Lemma prod_with_at {K : finType} {I : Type} {R : comRingType} (k0 : K) (x : I -> R)
  (A : K -> I -> R) (F : K -> I) :
  \prod_(k : K) with_at k0 x A k (F k) = x (F k0) * \prod_(k | k != k0) A k (F k).
Proof.
rewrite (bigD1 k0) //= /with_at eqxx; congr (_ * _).
by apply: eq_bigr => k /negPf ->.
Qed.

Theorem einsum_linear {K S : finType} {I J : Type} {R : comRingType} (idx : K -> J -> S -> I)
  (k0 : K) (A : K -> I -> R) :
  linear_op (fun x => einsum_op idx (with_at k0 x A)) /\
  homogeneous (fun x => einsum_op idx (with_at k0 x A)).
Proof.
rewrite /einsum_op; split.
  split; first by move=> f g y; rewrite -big_split /=; apply: eq_bigr => s _; rewrite !prod_with_at mulrDl.
  split=> [y|f g e y]; first by rewrite big1 // => s _; rewrite prod_with_at mul0r.
  by apply: eq_bigr => s _; rewrite !prod_with_at e.
by move=> c x j; rewrite mulr_sumr; apply: eq_bigr => s _; rewrite !prod_with_at mulrA.
Qed.

Theorem einsum_multi_homogeneous {K S : finType} {I J : Type} {R : comRingType}
  (idx : K -> J -> S -> I) : multi_homogeneous (fun A => @einsum_op K S I J R idx A).
Proof.
rewrite /einsum_op; split=> [k c A j|A B e j].
  rewrite mulr_sumr; apply: eq_bigr => s _.
  rewrite (bigD1 k) //= (bigD1 k (P := predT)) //= /scale_at eqxx -mulrA; congr (_ * _).
  by congr (_ * _); apply: eq_bigr => k' /negPf ->.
by apply: eq_bigr => s _; apply: eq_bigr => k _; rewrite e.
Qed.

(** ** softmax / log_softmax backward: linear in the incoming gradient [g] for a
    fixed forward output [o] (row of size [n]) *)
Definition softmax_backward_op {R : ringType} (n : nat) (o : nat -> R) (g : nat -> R) : nat -> R :=
  fun k => o k * (g k - \sum_(0 <= j < n) g j * o j).

Theorem softmax_backward_linear {R : comRingType} (n : nat) (o : nat -> R) :
  linear_op (softmax_backward_op n o) /\ homogeneous (softmax_backward_op n o).
Proof.
rewrite /softmax_backward_op; split.
  split.
    move=> f g y; rewrite -mulrDr; congr (_ * _).
    rewrite (eq_bigr (fun j => f j * o j + g j * o j)) => [|j _]; last by rewrite mulrDl.
    by rewrite big_split /= opprD addrACA.
  split=> [y|f g e y]; last by rewrite e; congr (_ * (_ - _)); apply: eq_bigr => j _; rewrite e.
  by rewrite big1 ?subr0 ?mulr0 // => j _; rewrite mul0r.
move=> c x j; rewrite mulrCA; congr (_ * _).
rewrite mulrBr mulr_sumr; congr (_ - _); apply: eq_bigr => k _; by rewrite mulrA.
Qed.

Definition log_softmax_backward_op {R : ringType} (exp : R -> R) (n : nat) (o : nat -> R) (g : nat -> R)
  : nat -> R := fun k => g k - exp (o k) * \sum_(0 <= j < n) g j.

Theorem log_softmax_backward_linear {R : comRingType} (exp : R -> R) (n : nat) (o : nat -> R) :
  linear_op (log_softmax_backward_op exp n o) /\ homogeneous (log_softmax_backward_op exp n o).
Proof.
rewrite /log_softmax_backward_op; split.
  split; first by move=> f g y; rewrite big_split /= mulrDr opprD addrACA.
  split=> [y|f g e y]; last by rewrite e; congr (_ - _ * _); apply: eq_bigr => j _; rewrite e.
  by rewrite big1 ?mulr0 ?subr0.
by move=> c x j; rewrite mulrBr -mulr_sumr mulrCA.
Qed.

(** ** The forward softmax is not linear (the flag [_rw_softmax] had): the
    softmax of the zero row is [1/n], not 0, for any [exp] with [exp 0 <> 0];
    log_softmax of the zero row is [-log(n exp 0)], not 0 unless that log is 0. *)
Theorem softmax_not_additive {R : numFieldType} (exp : R -> R) (n : nat) :
  (0 < n)%N -> exp 0 != 0 -> ~ linear_op (softmax exp n).
Proof.
move=> n0 e0 [_ [z _]]; move: (z 0%N); rewrite /softmax sumr_const_nat subn0 => /eqP.
rewrite mulf_eq0 invr_eq0 mulrn_eq0 (negPf e0) /= orbF => /eqP n00.
by move: n0; rewrite n00.
Qed.

Theorem log_softmax_not_additive {R : numFieldType} (exp log : R -> R) (n : nat) :
  log (\sum_(0 <= j < n) exp 0) != 0 -> ~ linear_op (log_softmax exp log n).
Proof.
move=> l0 [_ [z _]]; move: (z 0%N); rewrite /log_softmax sub0r => /eqP.
by rewrite oppr_eq0 (negPf l0).
Qed.
