(** * Torch's unrolled ring attention: per-block (out, lse) merged in sigmoid form.

    [torch.distributed.tensor.experimental._context_parallel._SDPAMerger] merges the (output, log-sum-exp)
    of each key block a rank attends to as
      out <- out - sigmoid (lse_b - lse) * (out - out_b)
      lse <- lse - logsigmoid (lse - lse_b)
    with [logsigmoid x] computed as [min 0 x - ln (1 + exp (- |x|))].  Over the reals, with
      sigmoid x = 1 / (1 + exp (- x))     (the interpreter's [sigmoid])
    and the only facts of [exp] / [ln] used being
      exp (a + c) = exp a * exp c,  0 < exp a,  ln (exp a) = a,  0 < y -> exp (ln y) = y,
    merging the blocks of any schedule that visits each of the [p] key blocks once gives softmax attention
    over all [p * b] keys, and the merged log-sum-exp is [ln] of the sum of all [exp s]
    ([ring_sigmoid_merge]).  Each block's pair is the flash kernel's: [m] any reference (the row max in the
    kernel), [out_b = sum exp (s - m) v / sum exp (s - m)], [lse_b = m + ln (sum exp (s - m))].
    The backward ([ring_sigmoid_merge_backward]) recomputes probabilities as [exp (s - lse)] from the merged
    log-sum-exp, sums a rank's per-block terms over any schedule visiting each block once, and reads
    [D = sum dO * O]. *)
From mathcomp Require Import all_ssreflect all_algebra.
From TVCert Require Import Semantics Composite Ring.
Set Implicit Arguments.
Unset Strict Implicit.
Unset Printing Implicit Defensive.
Import GRing.Theory Num.Theory.
Local Open Scope ring_scope.

Section SigmoidMerge.
Variable R : realFieldType.
Variable exp ln : R -> R.
Hypothesis expD : forall a c, exp (a + c) = exp a * exp c.
Hypothesis exp_pos : forall a, 0 < exp a.
Hypothesis expK : forall a, ln (exp a) = a.
Hypothesis lnK : forall y, 0 < y -> exp (ln y) = y.

Definition sigmoid (x : R) : R := 1 / (1 + exp (- x)).
(** torch's [F.logsigmoid], as its decomposition computes it. *)
Definition logsigmoid (x : R) : R := Num.min 0 x - ln (exp (- `|x|) + 1).

Definition merge_out (o l ob lb : R) : R := o - sigmoid (lb - l) * (o - ob).
Definition merge_lse (l lb : R) : R := l - logsigmoid (l - lb).

Lemma exp_nz (a : R) : exp a != 0.
Proof. exact: lt0r_neq0. Qed.

Lemma exp0 : exp 0 = 1.
Proof.
have e : exp 0 * exp 0 = exp 0 * 1 by rewrite mulr1 -expD addr0.
by apply: (mulfI (exp_nz 0)).
Qed.

Lemma expN (a : R) : exp (- a) = (exp a)^-1.
Proof.
apply: (mulfI (exp_nz a)); rewrite -expD subrr exp0 divff //; exact: exp_nz.
Qed.

Lemma ln_mul_exp (a y : R) : 0 < y -> ln (exp a * y) = a + ln y.
Proof. by move=> y0; rewrite -{1}(lnK y0) -expD expK. Qed.

(** [logsigmoid x = - ln (1 + exp (- x))] for every real [x]. *)
Lemma logsigmoidE (x : R) : logsigmoid x = - ln (1 + exp (- x)).
Proof.
rewrite /logsigmoid; case: (lerP 0 x) => x0.
  by rewrite ger0_norm // sub0r addrC.
rewrite ltr0_norm // opprK.
have -> : 1 + exp (- x) = exp (- x) * (exp x + 1).
  by rewrite mulrDr -expD addNr exp0 mulr1 addrC.
by rewrite ln_mul_exp ?addr_gt0 ?exp_pos ?ltr01 // opprD opprK addrC.
Qed.

(** The merged log-sum-exp: [exp] of it is the sum of the two blocks' [exp lse]. *)
Lemma merge_lse_exp (l lb : R) : exp (merge_lse l lb) = exp l + exp lb.
Proof.
rewrite /merge_lse logsigmoidE opprK expD lnK ?addr_gt0 ?exp_pos ?ltr01 //.
by rewrite mulrDr mulr1 -expD opprB addrCA subrr addr0.
Qed.

(** The merged output is the two outputs weighted by [exp lse]. *)
Lemma merge_out_weighted (o l ob lb : R) :
  merge_out o l ob lb = (exp l * o + exp lb * ob) / (exp l + exp lb).
Proof.
have zl : exp l + exp lb != 0 by apply: lt0r_neq0; rewrite addr_gt0 ?exp_pos.
have E : exp l + exp lb = exp lb * (1 + exp (l - lb)).
  by rewrite mulrDr mulr1 -expD addrCA subrr addr0 addrC.
have sig : sigmoid (lb - l) = exp lb / (exp l + exp lb).
  by rewrite E invfM mulrA divff ?exp_nz // mul1r /sigmoid opprB div1r.
rewrite /merge_out sig; apply: (mulIf zl); rewrite divfK //.
rewrite mulrBl [_ / _ * _ * _]mulrAC divfK // mulrBr mulrDr opprB [o * exp l]mulrC [o * exp lb]mulrC -addrA.
by congr (_ + _); rewrite addrCA subrr addr0.
Qed.

(** One key block: keys [blk * b + i], [i < b]. *)
Definition blk_sum (b : nat) (s : nat -> R) (blk : nat) : R :=
  \sum_(0 <= i < b) exp (s (blk * b + i)%N).
Definition blk_acc (b : nat) (s v : nat -> R) (blk : nat) : R :=
  \sum_(0 <= i < b) exp (s (blk * b + i)%N) * v (blk * b + i)%N.

(** The flash kernel's pair for one block, with any reference [m]. *)
Definition flash_out (b : nat) (s v : nat -> R) (blk : nat) (m : R) : R :=
  (\sum_(0 <= i < b) exp (s (blk * b + i)%N - m) * v (blk * b + i)%N) /
  (\sum_(0 <= i < b) exp (s (blk * b + i)%N - m)).
Definition flash_lse (b : nat) (s : nat -> R) (blk : nat) (m : R) : R :=
  m + ln (\sum_(0 <= i < b) exp (s (blk * b + i)%N - m)).

Lemma sum_exp_shift (b : nat) (s : nat -> R) (blk : nat) (m : R) :
  \sum_(0 <= i < b) exp (s (blk * b + i)%N - m) = exp (- m) * blk_sum b s blk.
Proof. by rewrite /blk_sum mulr_sumr; apply: eq_bigr => i _; rewrite (exp_shift expD). Qed.

Lemma flash_lse_exp (b : nat) (s : nat -> R) (blk : nat) (m : R) :
  (0 < b)%N -> exp (flash_lse b s blk m) = blk_sum b s blk.
Proof.
move=> b0; have pos : 0 < blk_sum b s blk.
  rewrite /blk_sum; case: b b0 => // b _; rewrite big_nat_recl //.
  by apply: ltr_paddr; [apply: sumr_ge0 => i _; apply: Order.POrderTheory.ltW | ]; apply: exp_pos.
rewrite /flash_lse sum_exp_shift expD lnK ?mulr_gt0 ?exp_pos // mulrA -expD subrr exp0 mul1r //.
Qed.

Lemma flash_out_eq (b : nat) (s v : nat -> R) (blk : nat) (m : R) :
  flash_out b s v blk m = blk_acc b s v blk / blk_sum b s blk.
Proof.
rewrite /flash_out sum_exp_shift.
have -> : \sum_(0 <= i < b) exp (s (blk * b + i)%N - m) * v (blk * b + i)%N = exp (- m) * blk_acc b s v blk.
  by rewrite /blk_acc mulr_sumr; apply: eq_bigr => i _; rewrite (exp_shift expD) mulrA.
by rewrite div_cancel_l ?exp_nz.
Qed.

(** The merge folded over [t + 1] blocks: block [order 0] first, then [order 1], ... with references [refs]. *)
Fixpoint merge_fold (b : nat) (s v : nat -> R) (order : nat -> nat) (refs : nat -> R) (t : nat) : R * R :=
  if t is t'.+1 then
    let x := merge_fold b s v order refs t' in
    let ob := flash_out b s v (order t) (refs t) in
    let lb := flash_lse b s (order t) (refs t) in
    (merge_out x.1 x.2 ob lb, merge_lse x.2 lb)
  else (flash_out b s v (order 0%N) (refs 0%N), flash_lse b s (order 0%N) (refs 0%N)).

(** Invariant: after blocks [order 0 .. order t], [exp lse] is their sum of [exp s] and the output their
    [exp s * v] sum divided by it. *)
Lemma merge_fold_inv (b : nat) (s v : nat -> R) (order : nat -> nat) (refs : nat -> R) (t : nat) :
  (0 < b)%N ->
  let x := merge_fold b s v order refs t in
  exp x.2 = \sum_(0 <= j < t.+1) blk_sum b s (order j) /\
  x.1 = (\sum_(0 <= j < t.+1) blk_acc b s v (order j)) / \sum_(0 <= j < t.+1) blk_sum b s (order j).
Proof.
move=> b0; have nz : forall j, blk_sum b s j != 0.
  move=> j; rewrite -(flash_lse_exp s j 0 b0); exact: exp_nz.
have cancel : forall x y : R, y != 0 -> y * (x / y) = x by move=> x y y0; rewrite mulrC divfK.
elim: t => [|t [IHl IHo]] /=.
  by rewrite !big_nat1 flash_lse_exp // flash_out_eq.
have nzS : \sum_(0 <= j < t.+1) blk_sum b s (order j) != 0 by rewrite -IHl; exact: exp_nz.
rewrite merge_lse_exp merge_out_weighted IHl IHo flash_lse_exp // flash_out_eq !cancel //.
have recr : forall F : nat -> R, \sum_(0 <= j < t.+2) F j = \sum_(0 <= j < t.+1) F j + F t.+1.
  by move=> F; rewrite big_nat_recr.
by rewrite !recr.
Qed.

(** The rule [ring_sigmoid_merge]: any schedule visiting each of the [p] blocks once. *)
Theorem ring_sigmoid_merge (p b : nat) (s v : nat -> R) (order : nat -> nat) (refs : nat -> R) :
  (0 < p)%N -> (0 < b)%N ->
  (forall t, (t < p)%N -> (order t < p)%N) ->
  (forall t u, (t < p)%N -> (u < p)%N -> order t = order u -> t = u) ->
  let x := merge_fold b s v order refs p.-1 in
  x.1 = softmax_attention exp (p * b) s v /\ x.2 = ln (\sum_(0 <= k < p * b) exp (s k)).
Proof.
move=> p0 b0 ord_lt ord_inj /=; have [l o] := merge_fold_inv s v order refs p.-1 b0.
rewrite prednK // in l o.
have Hs := sum_blocks_reindex b (fun k => exp (s k)) ord_lt ord_inj.
have Ha := sum_blocks_reindex b (fun k => exp (s k) * v k) ord_lt ord_inj.
split; first by rewrite o /blk_acc /blk_sum Hs Ha.
by rewrite -[LHS]expK l /blk_sum Hs.
Qed.
End SigmoidMerge.

(** ** Backward. *)
Section SigmoidMergeBackward.
Variable R : realFieldType.
Variable exp ln : R -> R.
Hypothesis expD : forall a c, exp (a + c) = exp a * exp c.
Hypothesis exp_pos : forall a, 0 < exp a.
Hypothesis expK : forall a, ln (exp a) = a.
Hypothesis lnK : forall y, 0 < y -> exp (ln y) = y.

(** Probabilities recomputed from a log-sum-exp equal to [ln] of the sum of all [exp s]. *)
Lemma probability_from_lse (n : nat) (s : nat -> R) (k : nat) :
  (0 < n)%N ->
  exp (s k - ln (\sum_(0 <= k' < n) exp (s k'))) = exp (s k) / \sum_(0 <= k' < n) exp (s k').
Proof.
move=> n0; have pos : 0 < \sum_(0 <= k' < n) exp (s k').
  case: n n0 => // n _; rewrite big_nat_recl //.
  by apply: ltr_paddr; [apply: sumr_ge0 => i _; apply: Order.POrderTheory.ltW | ]; apply: exp_pos.
by rewrite expD (expN expD exp_pos) lnK.
Qed.

(** The facts the backward rule rests on: (1) probabilities from the merged log-sum-exp are the softmax
    probabilities over all keys; (2) a rank's terms over a schedule visiting each of the [p] blocks once
    (dQ's per-block terms, or the terms a travelling dK / dV block collects from the [p] ranks) sum to the
    sum over all blocks; (3) [D = sum_h dO_h * O_h] is [sum_k P_k * dP_k]; (4) [(M^T N)_(i,j) =
    ((N^T M)^T)_(i,j)]: the entry [sum_k M_(k,i) N_(k,j)] of either spelling of the transposed product. *)
Theorem ring_sigmoid_merge_backward :
  (forall (n : nat) (s : nat -> R) (k : nat), (0 < n)%N ->
     exp (s k - ln (\sum_(0 <= k' < n) exp (s k'))) = exp (s k) / \sum_(0 <= k' < n) exp (s k')) /\
  (forall (p : nat) (order : nat -> nat) (F : nat -> R),
     (forall t, (t < p)%N -> (order t < p)%N) ->
     (forall t u, (t < p)%N -> (u < p)%N -> order t = order u -> t = u) ->
     \sum_(0 <= j < p) F (order j) = \sum_(0 <= r < p) F r) /\
  (forall (n H : nat) (P : nat -> R) (V : nat -> nat -> R) (dO Out : nat -> R),
     (forall h, (h < H)%N -> Out h = \sum_(0 <= k < n) P k * V k h) ->
     \sum_(0 <= h < H) dO h * Out h = \sum_(0 <= k < n) P k * \sum_(0 <= h < H) dO h * V k h) /\
  (forall (K : nat) (M N : nat -> nat -> R) (i j : nat),
     \sum_(0 <= k < K) M k i * N k j = \sum_(0 <= k < K) N k j * M k i).
Proof.
split; first by move=> n s k n0; exact: probability_from_lse.
split; first by move=> p order F; exact: sum_reindex_inj.
split; first by move=> n H P V dO Out; exact: softmax_backward_rowsum.
by move=> K M N i j; apply: eq_bigr => k _; rewrite mulrC.
Qed.
End SigmoidMergeBackward.
