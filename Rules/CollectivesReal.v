(** * Collectives real code runs on replicated tensors and over several mesh axes.

    [reduce_scatter_replicate]: reduce_scatter (sum) of a tensor every rank
    holds alike gives rank [r] block [r] of [p * E]: Shard of [p * E] (the
    average gives Shard of [E]).  [allreduce_avg_partial_sum_axes]: an
    all_reduce(avg) over the flattened group of two axes (rank [k] is
    [(k / pb, k mod pb)], mesh order) of a tensor Partial(sum) over both gives
    [E / (pa * pb)] on every rank; more axes nest (the first axes' group is
    again one axis). *)
From mathcomp Require Import all_ssreflect all_algebra.
From TVCert Require Import Semantics NormaliseReductions.
Set Implicit Arguments.
Unset Strict Implicit.
Unset Printing Implicit Defensive.
Import GRing.Theory.
Local Open Scope ring_scope.

Theorem reduce_scatter_replicate {I : Type} {R : numFieldType} (p b : nat)
  (E : nat -> I -> R) (L : nat -> nat -> I -> R) :
  (forall r k x, (r < p)%N -> L r k x = E k x) ->
  shard p b (fun k x => p%:R * E k x) (reduce_scatter p b L) /\
  ((0 < p)%N -> shard p b E (fun r i x => (p%:R)^-1 * reduce_scatter p b L r i x)).
Proof.
move=> h; have sum_p : forall r i x, reduce_scatter p b L r i x = p%:R * E (r * b + i)%N x.
  move=> r i x; rewrite /reduce_scatter (eq_big_nat _ _ (fun s sp => h s _ x (andP sp).2)).
  by rewrite sumr_const_nat subn0 mulr_natl.
split=> [r i x _ _|p0 r i x _ _]; rewrite sum_p //.
by rewrite mulrA mulVf ?mul1r // Num.Theory.pnatr_eq0 -lt0n.
Qed.

Theorem allreduce_avg_partial_sum_axes {I : Type} {R : fieldType} (pa pb : nat)
  (E : I -> R) (L : nat -> nat -> I -> R) :
  (forall x, \sum_(0 <= r < pa) \sum_(0 <= s < pb) L r s x = E x) ->
  forall x : I, (((pa * pb)%N%:R)^-1 * (\sum_(0 <= k < pa * pb) L (k %/ pb)%N (k %% pb)%N x) =
            ((pa * pb)%N%:R)^-1 * E x)%R.
Proof.
move=> h x; congr (_ * _); rewrite -h.
by have [_ [_ [sp _]]] := reduction_normal_form; rewrite (proj1 (sp R pa pb (fun r s => L r s x))).
Qed.

(** A Partial(sum) of [E] is a Partial(avg) of [E / p], and back: the local
    losses of ranks that divide by the global count (a Partial(sum) of the
    mean) read as the Partial(avg) a user declares, with the factor [p]
    checked, never assumed (kernel/partial_read.py). *)
Theorem partial_sum_as_avg {I : Type} {R : numFieldType} (p : nat)
  (E : I -> R) (L : nat -> I -> R) :
  (0 < p)%N -> (partial_sum p E L <-> partial_avg p (fun x => (p%:R)^-1 * E x) L).
Proof.
move=> p0; have pn : (p%:R)^-1 != 0 :> R by rewrite invr_eq0 Num.Theory.pnatr_eq0 -lt0n.
split=> h x; first by rewrite h.
by apply: (mulfI pn); exact: h x.
Qed.

(** all_gather of partial statistics followed by a sum over the gathered
    dimension: rank [s] sums the concatenated pieces, which is the sum of the
    Partial(sum)'s combination (kernel/gathered.py). *)
Theorem allgather_partial_sum {I : Type} {R : zmodType} (p b : nat)
  (E : nat -> I -> R) (L : nat -> nat -> I -> R) :
  (forall i x, \sum_(0 <= r < p) L r i x = E i x) ->
  forall s x, \sum_(0 <= k < p * b) all_gather b L s k x = \sum_(0 <= i < b) E i x.
Proof.
move=> h s x; case: b h => [|b] h; first by rewrite muln0 !big_geq.
rewrite sum_blocks.
rewrite (eq_bigr (fun r => \sum_(0 <= i < b.+1) L r i x)); last first.
  move=> r _; apply: eq_big_nat => i /andP[_ ib].
  by rewrite /all_gather block_div // block_mod.
rewrite exchange_big; apply: eq_bigr => i _; exact: h.
Qed.

(** all_reduce(avg) over axis [a] of a tensor Partial(sum) over [a] and
    Partial(sum) (or Partial(avg)) over another axis [b]: the result is
    Replicate over [a] and still Partial(sum) (Partial(avg)) over [b], of
    [E / pa].  The averaging is linear, so the other axis's combination
    passes through it; nesting order does not matter (the sums exchange). *)
Theorem allreduce_avg_partial_sum_nested {I : Type} {R : fieldType} (pa pb : nat)
  (E : I -> R) (L : nat -> nat -> I -> R) :
  ((forall x : I, \sum_(0 <= r < pa) \sum_(0 <= s < pb) L r s x = E x) ->
   forall x : I, \sum_(0 <= s < pb) ((pa%:R)^-1 * \sum_(0 <= r < pa) L r s x) = (pa%:R)^-1 * E x) /\
  ((forall x : I, ((pb%:R)^-1 * \sum_(0 <= r < pa) \sum_(0 <= s < pb) L r s x)%R = E x) ->
   forall x : I, ((pb%:R)^-1 * \sum_(0 <= s < pb) ((pa%:R)^-1 * \sum_(0 <= r < pa) L r s x))%R = (pa%:R)^-1 * E x).
Proof.
have key : forall x, \sum_(0 <= s < pb) ((pa%:R)^-1 * \sum_(0 <= r < pa) L r s x) =
                     (pa%:R)^-1 * \sum_(0 <= r < pa) \sum_(0 <= s < pb) L r s x.
  by move=> x; rewrite -mulr_sumr exchange_big.
split=> h x; rewrite key -h //.
by rewrite !mulrA [(pb%:R)^-1 * _]mulrC.
Qed.
