(** * Linear operations on [Partial(sum)], and the row-parallel bias. *)
From mathcomp Require Import all_ssreflect all_algebra.
From TVCert Require Import Semantics.
Set Implicit Arguments.
Unset Strict Implicit.
Unset Printing Implicit Defensive.
Import GRing.Theory Num.Theory.
Local Open Scope ring_scope.

Lemma sum_replicated {R : zmodType} (p : nat) (F : nat -> R) (c : R) :
  (forall r, (r < p)%N -> F r = c) -> \sum_(0 <= r < p) F r = c *+ p.
Proof.
move=> h; rewrite (eq_big_nat _ _ (F2 := fun _ => c)); last first.
  by move=> r /andP[_ rp]; rewrite h.
by rewrite sumr_const_nat subn0.
Qed.

(** Multiplication by a replicated tensor [c] (on the right). *)
Theorem partial_scale {I : Type} {R : ringType} (p : nat) (E c : I -> R)
  (L Lc : nat -> I -> R) :
  partial_sum p E L -> replicate p c Lc ->
  partial_sum p (fun x => E x * c x) (fun r x => L r x * Lc r x).
Proof.
move=> hE hc x; rewrite -hE mulr_suml.
by apply: eq_big_nat => r /andP[_ rp]; rewrite hc.
Qed.

(** Division by a replicated tensor (no side condition: in a field [y / 0 = 0]
    on both sides). *)
Theorem partial_div {I : Type} {R : fieldType} (p : nat) (E c : I -> R)
  (L Lc : nat -> I -> R) :
  partial_sum p E L -> replicate p c Lc ->
  partial_sum p (fun x => E x / c x) (fun r x => L r x / Lc r x).
Proof.
move=> hE hc x; rewrite -hE mulr_suml.
by apply: eq_big_nat => r /andP[_ rp]; rewrite hc.
Qed.

Theorem partial_neg {I : Type} {R : zmodType} (p : nat) (E : I -> R)
  (L : nat -> I -> R) :
  partial_sum p E L -> partial_sum p (fun x => - E x) (fun r x => - L r x).
Proof. by move=> hE x; rewrite sumrN hE. Qed.

Theorem partial_add {I : Type} {R : zmodType} (p : nat) (E1 E2 : I -> R)
  (L1 L2 : nat -> I -> R) :
  partial_sum p E1 L1 -> partial_sum p E2 L2 ->
  partial_sum p (fun x => E1 x + E2 x) (fun r x => L1 r x + L2 r x).
Proof. by move=> h1 h2 x; rewrite big_split /= h1 h2. Qed.

Theorem partial_sub {I : Type} {R : zmodType} (p : nat) (E1 E2 : I -> R)
  (L1 L2 : nat -> I -> R) :
  partial_sum p E1 L1 -> partial_sum p E2 L2 ->
  partial_sum p (fun x => E1 x - E2 x) (fun r x => L1 r x - L2 r x).
Proof. by move=> h1 h2 x; rewrite sumrB h1 h2. Qed.

(** Any additive map of tensors (reshape, permute, slice, sum-reduction,
    cast, ...), applied locally, maps [Partial(sum)] to [Partial(sum)].
    [A] must be additive, send zero to zero, and respect pointwise equality. *)
Theorem partial_linear_map {I J : Type} {R S : zmodType}
  (A : (I -> R) -> J -> S) (p : nat) (E : I -> R) (L : nat -> I -> R) :
  (forall f g y, A (fun x => f x + g x) y = A f y + A g y) ->
  (forall y, A (fun _ => 0) y = 0) ->
  (forall f g, (forall x, f x = g x) -> forall y, A f y = A g y) ->
  partial_sum p E L -> partial_sum p (A E) (fun r => A (L r)).
Proof.
move=> Aadd A0 Aext hE y.
have -> : A E y = A (fun x => \sum_(0 <= r < p) L r x) y.
  by apply: Aext => x; rewrite hE.
elim: p {hE} => [|p IH].
  rewrite big_geq // -(A0 y); apply: Aext => x; by rewrite big_geq.
rewrite big_nat_recr //= IH -Aadd; apply: Aext => x.
by rewrite big_nat_recr.
Qed.

(** Row-parallel bias, correct form 1: every rank adds [b / p]. *)
Theorem partial_add_replicate_scaled {I : Type} {R : numFieldType} (p : nat)
  (E B : I -> R) (L LB : nat -> I -> R) :
  (0 < p)%N -> partial_sum p E L -> replicate p B LB ->
  partial_sum p (fun x => E x + B x) (fun r x => L r x + LB r x / p%:R).
Proof.
move=> p0 hE hB x; rewrite big_split /= hE; congr (_ + _).
rewrite (sum_replicated (c := B x / p%:R)) => [|r rp]; last by rewrite hB.
by rewrite -mulr_natr mulfVK // pnatr_eq0 -lt0n.
Qed.

(** Row-parallel bias, correct form 2: only rank 0 adds [b]. *)
Theorem partial_add_replicate_one_rank {I : Type} {R : zmodType} (p : nat)
  (E B : I -> R) (L LB : nat -> I -> R) :
  (0 < p)%N -> partial_sum p E L -> replicate p B LB ->
  partial_sum p (fun x => E x + B x)
    (fun r x => L r x + (if r == 0%N then LB r x else 0)).
Proof.
move=> p0 hE hB x; rewrite big_split /= hE; congr (_ + _).
by rewrite (sum_only_one (fun r => LB r x)) // hB.
Qed.

(** The row-parallel bias bug: adding the replicated [b] on every rank gives
    [Partial(E + p b)], which differs from [E + b] when [p > 1] and [b <> 0]. *)
Theorem partial_plus_replicate_not_partial {I : Type} {R : numDomainType} (p : nat)
  (E B : I -> R) (L LB : nat -> I -> R) :
  partial_sum p E L -> replicate p B LB ->
  partial_sum p (fun x => E x + B x *+ p) (fun r x => L r x + LB r x) /\
  (forall x, (1 < p)%N -> B x != 0 -> E x + B x *+ p != E x + B x).
Proof.
move=> hE hB; split=> [x|x p1 b0].
  rewrite big_split /= hE (sum_replicated (c := B x)) // => r rp; exact: hB.
rewrite (can_eq (addKr _)) -subr_eq0 -{2}[B x]mulr1n -mulrnBr; last exact: ltnW.
by rewrite mulrn_eq0 negb_or subn_eq0 -ltnNge p1.
Qed.

(** [Partial(avg)] with every local divided by [p] is [Partial(sum)]. *)
Theorem partial_avg_div_p_to_sum {I : Type} {R : fieldType} (p : nat)
  (E : I -> R) (L : nat -> I -> R) :
  partial_avg p E L -> partial_sum p E (fun r x => L r x / p%:R).
Proof. by move=> hE x; rewrite -hE -mulr_suml mulrC. Qed.
