(** * IntRange: counts of labels that are not [ignore_index], under the plan's int input contract.

    An int input declared with [range R] holds values in [0, R) (the plan contract, which the
    interpreter draws from).  A comparison of such values (through reshapes, permutes, expands,
    slices: the same values) with a constant the interval [lo, hi] decides is constant
    ([compare_decided]); a sum of a constant fill over [n] elements is [n] times it and a mean of
    one is it ([fill_sum_mean]).  So DTensor's mean cross-entropy divisor
    [cast(sum(labels != -100))] is the token count, and the loss is the mean
    ([int_range_count]). *)
From mathcomp Require Import all_ssreflect all_algebra.
Set Implicit Arguments.
Unset Strict Implicit.
Unset Printing Implicit Defensive.

Import GRing.Theory Num.Theory Order.Theory.
Local Open Scope ring_scope.

Theorem compare_decided {I : Type} {T : realDomainType} (lo hi c : T) (x : I -> T) :
  (forall i, lo <= x i <= hi) ->
  [/\ (c < lo \/ hi < c) -> forall i, (x i == c) = false,
      hi < c -> forall i, (x i < c) = true, c <= lo -> forall i, (x i < c) = false,
      hi <= c -> forall i, (x i <= c) = true & c < lo -> forall i, (x i <= c) = false].
Proof.
move=> h; split=> hc i; have /andP[l u] := h i.
- apply/negbTE/eqP => e; rewrite -e in hc.
  by case: hc => hc; [move: (lt_le_trans hc l) | move: (le_lt_trans u hc)]; rewrite ltxx.
- exact: le_lt_trans u hc.
- by apply/negbTE; rewrite -leNgt (le_trans hc l).
- exact: le_trans u hc.
- by apply/negbTE; rewrite -ltNge (lt_le_trans hc l).
Qed.

Theorem fill_sum_mean {T : numFieldType} (n : nat) (c : T) :
  \sum_(i < n) c = n%:R * c /\ ((0 < n)%N -> (n%:R : T)^-1 * (\sum_(i < n) c) = c).
Proof.
have s : \sum_(i < n) c = n%:R * c by rewrite sumr_const card_ord mulr_natl.
split=> // n0; rewrite s mulrA mulVf ?mul1r //.
by rewrite pnatr_eq0 -lt0n.
Qed.

Theorem int_range_count {I : finType} {T : numFieldType} (R c : int) (x : I -> int) (a : T) :
  (forall i, (0 <= x i) && (x i < R)) -> (c < 0 \/ R <= c) ->
  \sum_(i : I) (x i != c)%:R * a = #|I|%:R * a.
Proof.
move=> h hc.
have ne : forall i, x i != c.
  move=> i; have /andP[l u] := h i; apply/eqP => e; rewrite e in l u.
  by case: hc => hc; [move: (lt_le_trans hc l) | move: (lt_le_trans u hc)]; rewrite ltxx.
rewrite (eq_bigr (fun _ => a)) => [|i _]; last by rewrite ne mul1r.
by rewrite sumr_const mulr_natl.
Qed.

(** The rule's statement: the three folds together. *)
Theorem int_range_fold :
  (forall (I : Type) (T : realDomainType) (lo hi c : T) (x : I -> T),
     (forall i, lo <= x i <= hi) ->
     [/\ (c < lo \/ hi < c) -> forall i, (x i == c) = false,
         hi < c -> forall i, (x i < c) = true, c <= lo -> forall i, (x i < c) = false,
         hi <= c -> forall i, (x i <= c) = true & c < lo -> forall i, (x i <= c) = false]) /\
  (forall (T : numFieldType) (n : nat) (c : T),
     \sum_(i < n) c = n%:R * c /\ ((0 < n)%N -> (n%:R : T)^-1 * (\sum_(i < n) c) = c)) /\
  (forall (I : finType) (T : numFieldType) (R c : int) (x : I -> int) (a : T),
     (forall i, (0 <= x i) && (x i < R)) -> (c < 0 \/ R <= c) ->
     \sum_(i : I) (x i != c)%:R * a = #|I|%:R * a).
Proof.
split; first by move=> *; apply: compare_decided.
split; first by move=> *; apply: fill_sum_mean.
by move=> *; apply: int_range_count.
Qed.
