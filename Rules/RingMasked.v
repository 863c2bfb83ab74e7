(** * Torch's causal / load-balanced ring: flash pairs of masked, skipped and partial blocks merged.

    [_templated_ring_attention] with [is_causal] attends, per rank and step, a key block with the causal
    mask (the diagonal block, [tril]), without a mask (a block entirely in the past), not at all (a block
    entirely in the future: skipped), or, with load balancing, a chunk of the queries or keys only.  Each
    flash call then is the flash pair over the keys with a 0 / 1 weight [w k] (its kept keys):
      out_w = sum_k w k exp (s k - m) v k / sum_k w k exp (s k - m),   lse_w = m + ln (sum_k w k exp (s k - m))
    (the kernel fills masked scores with any value [s'] and multiplies [exp (s' - m)] by the 0 / 1 mask:
    [masked_fill_exp]).  Merged in sigmoid form ([RingMerge.merge_out], [RingMerge.merge_lse]) over any
    schedule of calls each keeping some key, the result is softmax attention over the keys weighted by the
    sum of the calls' weights ([ring_masked_merge]); the engine checks, per query chunk and on every rank,
    that this sum is the causal mask exactly (each kept chunk once, the diagonal through [tril]).
    [safe_softmax_masked]: the logical causal SDPA's spelling ([_safe_softmax] of the scores with masked
    entries filled, zeroed and renormalised) is that weighted softmax.  The backward
    ([ring_masked_merge_backward]): probabilities from the merged lse, masked, are the weighted softmax
    probabilities; a rank's masked per-call terms sum to the mask-weighted sum. *)
From mathcomp Require Import all_ssreflect all_algebra.
From TVCert Require Import Semantics Composite Ring RingMerge.
Set Implicit Arguments.
Unset Strict Implicit.
Unset Printing Implicit Defensive.
Import GRing.Theory Num.Theory.
Local Open Scope ring_scope.

Section MaskedMerge.
Variable R : realFieldType.
Variable exp ln : R -> R.
Hypothesis expD : forall a c, exp (a + c) = exp a * exp c.
Hypothesis exp_pos : forall a, 0 < exp a.
Hypothesis expK : forall a, ln (exp a) = a.
Hypothesis lnK : forall y, 0 < y -> exp (ln y) = y.

Variable n : nat.
Variables s v : nat -> R.

(** A 0 / 1 weight over the keys that keeps at least one key. *)
Definition is_mask (w : nat -> R) := forall k, w k = 0 \/ w k = 1.
Definition keeps (w : nat -> R) := exists2 k, (k < n)%N & w k = 1.

Definition wsum (w : nat -> R) : R := \sum_(0 <= k < n) w k * exp (s k).
Definition wacc (w : nat -> R) : R := \sum_(0 <= k < n) w k * exp (s k) * v k.

(** The flash kernel's pair for one call with kept keys [w] and any reference [m]. *)
Definition mflash_out (w : nat -> R) (m : R) : R :=
  (\sum_(0 <= k < n) w k * exp (s k - m) * v k) / (\sum_(0 <= k < n) w k * exp (s k - m)).
Definition mflash_lse (w : nat -> R) (m : R) : R :=
  m + ln (\sum_(0 <= k < n) w k * exp (s k - m)).

Lemma w_ge0 (w : nat -> R) k : is_mask w -> 0 <= w k.
Proof. by move=> /(_ k) [->|->]; rewrite ?ler01. Qed.

Lemma wsum_pos (w : nat -> R) : is_mask w -> keeps w -> 0 < wsum w.
Proof.
move=> mw [k0 k0n wk0]; rewrite /wsum big_mkord (bigD1 (Ordinal k0n)) //= wk0 mul1r.
apply: ltr_paddr; last exact: exp_pos.
by apply: sumr_ge0 => i _; apply: mulr_ge0; [exact: w_ge0 | exact: Order.POrderTheory.ltW].
Qed.

Lemma wsum_shift (w : nat -> R) (m : R) :
  \sum_(0 <= k < n) w k * exp (s k - m) = exp (- m) * wsum w.
Proof.
by rewrite /wsum mulr_sumr; apply: eq_bigr => k _; rewrite (exp_shift expD) mulrCA.
Qed.

Lemma mflash_lse_exp (w : nat -> R) (m : R) : is_mask w -> keeps w -> exp (mflash_lse w m) = wsum w.
Proof.
move=> mw kw; have pos := wsum_pos mw kw.
rewrite /mflash_lse wsum_shift expD lnK ?mulr_gt0 ?exp_pos // mulrA -expD subrr.
have e0 : exp 0 = 1 by apply: (mulfI (exp_nz exp_pos 0)); rewrite mulr1 -expD addr0.
by rewrite e0 mul1r.
Qed.

Lemma mflash_out_eq (w : nat -> R) (m : R) : mflash_out w m = wacc w / wsum w.
Proof.
rewrite /mflash_out wsum_shift.
have -> : \sum_(0 <= k < n) w k * exp (s k - m) * v k = exp (- m) * wacc w.
  by rewrite /wacc mulr_sumr; apply: eq_bigr => k _; rewrite (exp_shift expD) !mulrA [w k * _]mulrC.
by rewrite div_cancel_l ?(exp_nz exp_pos).
Qed.

(** The kernel's masked block: scores filled anywhere the mask is 0, [exp] times the mask. *)
Lemma masked_fill_exp (keep sc sc' m : R) :
  (keep = 0 \/ keep = 1) -> (keep = 1 -> sc' = sc) -> exp (sc' - m) * keep = keep * exp (sc - m).
Proof. by case=> ->; [rewrite mulr0 mul0r | move=> /(_ erefl) ->; rewrite mulr1 mul1r]. Qed.

(** Calls [0 .. T] with kept keys [W t], references [refs t], merged in order. *)
Variable W : nat -> nat -> R.
Variable refs : nat -> R.

Fixpoint mfold (t : nat) : R * R :=
  if t is t'.+1 then
    let x := mfold t' in
    (merge_out exp x.1 x.2 (mflash_out (W t) (refs t)) (mflash_lse (W t) (refs t)),
     merge_lse exp ln x.2 (mflash_lse (W t) (refs t)))
  else (mflash_out (W 0%N) (refs 0%N), mflash_lse (W 0%N) (refs 0%N)).

Lemma mfold_inv (T : nat) : (forall t, (t <= T)%N -> is_mask (W t) /\ keeps (W t)) ->
  exp (mfold T).2 = \sum_(0 <= j < T.+1) wsum (W j) /\
  (mfold T).1 = (\sum_(0 <= j < T.+1) wacc (W j)) / \sum_(0 <= j < T.+1) wsum (W j).
Proof.
elim: T => [|T IH] hw /=.
  have [m k] := hw 0%N (leqnn 0).
  by rewrite !big_nat1 mflash_lse_exp // mflash_out_eq.
have [IHl IHo] := IH (fun t tT => hw t (leqW tT)).
have [m k] := hw T.+1 (leqnn _).
have nzS : \sum_(0 <= j < T.+1) wsum (W j) != 0 by rewrite -IHl; exact: (exp_nz exp_pos).
have cancel : forall x y : R, y != 0 -> y * (x / y) = x by move=> x y y0; rewrite mulrC divfK.
rewrite (merge_lse_exp expD exp_pos expK lnK) (merge_out_weighted expD exp_pos) IHl IHo mflash_lse_exp //.
rewrite mflash_out_eq !cancel ?(lt0r_neq0 (wsum_pos m k)) //.
by rewrite (big_nat_recr T.+1) ?(big_nat_recr T.+1 _ (fun j => wacc (W j))) //.
Qed.

(** The rule [ring_masked_merge]: any schedule of calls, each with a 0 / 1 mask keeping some key, merged
    in sigmoid form, is softmax attention weighted by the calls' summed mask [M], and its log-sum-exp is
    [ln] of the [M]-weighted sum of [exp s]. *)
Theorem ring_masked_merge (T : nat) :
  (forall t, (t <= T)%N -> is_mask (W t) /\ keeps (W t)) ->
  let M := fun k => \sum_(0 <= j < T.+1) W j k in
  (mfold T).1 = wacc M / wsum M /\ (mfold T).2 = ln (wsum M).
Proof.
move=> hw M; have [l o] := mfold_inv hw.
have Hs : \sum_(0 <= j < T.+1) wsum (W j) = wsum M.
  rewrite /wsum /M exchange_big /=; apply: eq_bigr => k _; by rewrite mulr_suml.
have Ha : \sum_(0 <= j < T.+1) wacc (W j) = wacc M.
  rewrite /wacc /M exchange_big /=; apply: eq_bigr => k _; by rewrite mulr_suml mulr_suml.
split; first by rewrite o Hs Ha.
by rewrite -[LHS]expK l Hs.
Qed.

(** The logical causal SDPA's spelling: softmax of the scores with masked entries ([M k = 1]) filled with
    any [lo], zeroed where masked and divided by the row sum (1 where that sum is 0), is the softmax
    weighted by the kept keys [1 - M], when some key is kept. *)
Theorem safe_softmax_masked (Mk : nat -> R) (lo : R) (k : nat) :
  is_mask Mk -> keeps (fun j => 1 - Mk j) ->
  let sf := fun j => if Mk j == 1 then lo else s j in
  let p := fun j => exp (sf j) / \sum_(0 <= i < n) exp (sf i) in
  let q := fun j => (1 - Mk j) * p j in
  let z := \sum_(0 <= i < n) q i in
  q k / (if z == 0 then 1 else z) = (1 - Mk k) * exp (s k) / wsum (fun j => 1 - Mk j).
Proof.
move=> mM kM sf p q z.
have Zp : 0 < \sum_(0 <= i < n) exp (sf i).
  have [j jn _] := kM; rewrite big_mkord (bigD1 (Ordinal jn)) //=.
  apply: ltr_paddr; last exact: exp_pos.
  by apply: sumr_ge0 => i _; apply: Order.POrderTheory.ltW.
have keepE : forall j, (1 - Mk j) * exp (sf j) = (1 - Mk j) * exp (s j).
  move=> j; rewrite /sf; case: (mM j) => ->; last by rewrite subrr !mul0r.
  by have -> : ((0:R) == 1) = false by rewrite eq_sym oner_eq0.
have zE : z = wsum (fun j => 1 - Mk j) / \sum_(0 <= i < n) exp (sf i).
  rewrite /z /q /p /wsum mulr_suml; apply: eq_bigr => j _; by rewrite mulrA keepE.
have zpos : 0 < z by rewrite zE divr_gt0 // wsum_pos // => j; case: (mM j) => ->; rewrite ?subr0 ?subrr; auto.
rewrite (negbTE (lt0r_neq0 zpos)) zE /q /p mulrA keepE.
by rewrite invf_div mulrA divfK ?(lt0r_neq0 Zp).
Qed.
End MaskedMerge.

(** ** Backward. *)
Section MaskedMergeBackward.
Variable R : realFieldType.
Variable exp ln : R -> R.
Hypothesis expD : forall a c, exp (a + c) = exp a * exp c.
Hypothesis exp_pos : forall a, 0 < exp a.
Hypothesis lnK : forall y, 0 < y -> exp (ln y) = y.

(** (1) A call's probabilities [w k * exp (s k - lse)] from the merged lse [ln (sum_k M k exp (s k))] are the
    [M]-weighted softmax probabilities on its kept keys; (2) a rank's per-call terms, each weighted by its
    call's mask, sum to the [M]-weighted sum when [M] is the calls' summed mask (each kept key once);
    (3) [D = sum_h dO_h * O_h] is [sum_k P_k * dP_k] for [O] the [P]-weighted values (P any weights, the
    masked ones included): [RingMerge.ring_sigmoid_merge_backward]'s third fact. *)
Theorem ring_masked_merge_backward :
  (forall (n : nat) (s M w : nat -> R) (k : nat),
     0 < \sum_(0 <= k' < n) M k' * exp (s k') ->
     w k * exp (s k - ln (\sum_(0 <= k' < n) M k' * exp (s k'))) =
     w k * (exp (s k) / \sum_(0 <= k' < n) M k' * exp (s k'))) /\
  (forall (T n : nat) (W : nat -> nat -> R) (F : nat -> R),
     \sum_(0 <= t < T) \sum_(0 <= k < n) W t k * F k =
     \sum_(0 <= k < n) (\sum_(0 <= t < T) W t k) * F k) /\
  (forall (n H : nat) (P : nat -> R) (V : nat -> nat -> R) (dO Out : nat -> R),
     (forall h, (h < H)%N -> Out h = \sum_(0 <= k < n) P k * V k h) ->
     \sum_(0 <= h < H) dO h * Out h = \sum_(0 <= k < n) P k * \sum_(0 <= h < H) dO h * V k h).
Proof.
split.
  move=> n s M w k pos; congr (_ * _).
  by rewrite expD (expN expD exp_pos) lnK.
split.
  move=> T n W F; rewrite exchange_big /=; apply: eq_bigr => k _; by rewrite mulr_suml.
by move=> n H P V dO Out; exact: softmax_backward_rowsum.
Qed.
End MaskedMergeBackward.
