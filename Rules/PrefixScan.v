(** * A prefix scan over a sharded dim: each block's local cumsum plus the carried offset
    ([kernel/prefix_scan.py], multi-op rule [block_prefix_sum]).

    Real code computes [cumsum] along a sequence sharded over an axis of [p] ranks (blocks of [b] rows) as
    rank [r]'s local cumsum plus the sum of the totals of the ranks before it: an all_gather of the per-rank
    totals ([sum(x, d, keepdim)], one row per rank) and a sum over the gathered dim weighted by a rank-dependent
    coefficient row [M r] (a mask [arange(p) < r] cast to reals, [where(mask, tots, 0)], or row [r] of a strictly
    lower-triangular mask times the totals).  The IR spells cumsum along [n] as a matmul with [triu(ones(n, n))]:
    [y i = \sum_j x j * [j <= i]] ([cumsum] below).  The engine checks, by evaluating the coefficient row on
    every rank, that [M r j = [j < r]]; the theorem then gives the logical cumsum's block [r]. *)
From mathcomp Require Import all_ssreflect all_algebra.
From TVCert Require Import Semantics.
Set Implicit Arguments.
Unset Strict Implicit.
Unset Printing Implicit Defensive.
Import GRing.Theory.
Local Open Scope ring_scope.

(** cumsum along the first index, as the IR spells it: [x^T @ triu(ones(n, n))] (entry [(j, i)] is 1 iff [j <= i]). *)
Definition cumsum {I : Type} {R : ringType} (n : nat) (X : nat -> I -> R) : nat -> I -> R :=
  fun i x => \sum_(0 <= j < n) X j x * (if (j <= i)%N then 1 else 0).

(** Row [s*b + k] of block [s] precedes row [r*b + i] of block [r] iff [s < r], or [s = r] and [k <= i]. *)
Lemma block_le (b s r k i : nat) : (k < b)%N -> (i < b)%N ->
  (s * b + k <= r * b + i)%N = (s < r)%N || (s == r) && (k <= i)%N.
Proof.
move=> kb ib.
have up : forall t j, (j < b)%N -> (t * b + j < t.+1 * b)%N.
  by move=> t j jb; rewrite mulSn addnC ltn_add2r.
case: (ltngtP s r) => [sr|rs|->] /=; last by rewrite leq_add2l.
  have h2 : (s.+1 * b <= r * b)%N by rewrite leq_mul2r sr orbT.
  exact: leq_trans (ltnW (leq_trans (up s k kb) h2)) (leq_addr _ _).
apply/negbTE; rewrite -ltnNge.
have h2 : (r.+1 * b <= s * b)%N by rewrite leq_mul2r rs orbT.
exact: leq_trans (leq_trans (up r i ib) h2) (leq_addr _ _).
Qed.

(** Block [s] of the logical cumsum's sum at row [r*b + i]: its total if [s < r], the local cumsum if [s = r], 0
    after. *)
Lemma cumsum_block {I : Type} {R : comRingType} (b : nat) (E : nat -> I -> R) (L : nat -> nat -> I -> R)
  (r i s : nat) (x : I) :
  (forall k, (k < b)%N -> L s k x = E (s * b + k)%N x) -> (i < b)%N ->
  \sum_(0 <= k < b) E (s * b + k)%N x * (if (s * b + k <= r * b + i)%N then 1 else 0) =
  (if (s < r)%N then 1 else 0) * (\sum_(0 <= k < b) L s k x) +
  (if s == r then cumsum b (L s) i x else 0).
Proof.
move=> hL ib; rewrite /cumsum.
rewrite (eq_big_nat _ _ (fun k kb => congr2 (fun u v => u * (if v then 1 else 0)) (esym (hL k (andP kb).2))
                                                (block_le s r (andP kb).2 ib))).
case: (ltngtP s r) => [sr|rs|->] /=.
- by rewrite mul1r addr0; apply: eq_bigr => k _; rewrite mulr1.
- by rewrite mul0r addr0 big1 // => k _; rewrite mulr0.
- by rewrite mul0r add0r.
Qed.

(** The block prefix sum: on rank [r] of an axis of [p] ranks holding blocks of [b] rows, the local cumsum plus
    [\sum_j M r j * G j] -- [G] the all_gather (blocks of 1) of the per-rank totals, [M r j = [j < r]] -- is block
    [r] of the logical cumsum over [p * b] rows. *)
Theorem block_prefix_sum {I : Type} {R : comRingType} (p b : nat) (E : nat -> I -> R)
  (L : nat -> nat -> I -> R) (M : nat -> nat -> R) :
  (forall r k x, (r < p)%N -> (k < b)%N -> L r k x = E (r * b + k)%N x) ->
  (forall r j, (r < p)%N -> (j < p)%N -> M r j = if (j < r)%N then 1 else 0) ->
  forall r i x, (r < p)%N -> (i < b)%N ->
    cumsum b (L r) i x + \sum_(0 <= j < p) M r j * all_gather 1 (fun s _ y => \sum_(0 <= k < b) L s k y) r j x
    = cumsum (p * b) E (r * b + i)%N x.
Proof.
move=> hL hM r i x rp ib.
rewrite [RHS]/cumsum sum_blocks.
rewrite (eq_big_nat _ _ (fun s sp => @cumsum_block I R b E L r i s x (fun k kb => hL s k x (andP sp).2 kb) ib)).
rewrite big_split /= sum_only_one // addrC; congr (_ + _).
apply: eq_big_nat => j /andP[_ jp].
by rewrite hM // /all_gather divn1.
Qed.

(** The coefficient row's spellings: [where(m, g, 0)] is [[m] * g]; a mask cast to reals times [g] is the same;
    the vector-matrix product [M @ G] along the gathered dim is [\sum_j M j * G j] (its definition). *)
Lemma where_coefficient {R : ringType} (m : bool) (g : R) :
  (if m then g else 0) = (if m then 1 else 0) * g.
Proof. by case: m; rewrite ?mul1r ?mul0r. Qed.

(** The offset read off a cumsum of the gathered totals: the inclusive prefix at row [r] minus row [r] itself is the
    masked sum with [M r j = [j < r]]. *)
Lemma exclusive_prefix {I : Type} {R : comRingType} (p r : nat) (G : nat -> I -> R) (x : I) :
  (r < p)%N ->
  cumsum p G r x - G r x = \sum_(0 <= j < p) (if (j < r)%N then 1 else 0) * G j x.
Proof.
move=> rp; rewrite /cumsum -(sum_only_one (fun j => G j x) rp) -sumrB.
apply: eq_bigr => j _; case: (ltngtP j r) => [jr|rj|->] /=.
- by rewrite mulr1 subr0 mul1r.
- by rewrite mulr0 subr0 mul0r.
- by rewrite mulr1 subrr mul0r.
Qed.

(** The block prefix sum with the offset spelled [cumsum(G)[r] - G[r]] over the gathered totals [G]
    ([block_prefix_sum_scanned]: real code's [torch.cumsum(tots, 0)[r] - tots[r]]). *)
Theorem block_prefix_sum_scanned {I : Type} {R : comRingType} (p b : nat) (E : nat -> I -> R)
  (L : nat -> nat -> I -> R) :
  (forall r k x, (r < p)%N -> (k < b)%N -> L r k x = E (r * b + k)%N x) ->
  forall r i x, (r < p)%N -> (i < b)%N ->
    cumsum b (L r) i x + (cumsum p (all_gather 1 (fun s _ y => \sum_(0 <= k < b) L s k y) r) r x -
                          all_gather 1 (fun s _ y => \sum_(0 <= k < b) L s k y) r r x)
    = cumsum (p * b) E (r * b + i)%N x.
Proof.
move=> hL r i x rp ib; rewrite exclusive_prefix //.
by apply: (@block_prefix_sum I R p b E L (fun r j => if (j < r)%N then 1 else 0)).
Qed.

(** ** Reversed scans: [flip(cumsum(flip(x)))], the suffix sums, carry the totals of the ranks after it. *)

(** [flip] along the first index of [n] rows, as the IR's [flip] reads it. *)
Definition flip {I V : Type} (n : nat) (X : nat -> I -> V) : nat -> I -> V := fun i x => X (n - i.+1)%N x.

Lemma flip_cumsum_flip {I : Type} {R : comRingType} (n : nat) (X : nat -> I -> R) (i : nat) (x : I) :
  (i < n)%N ->
  flip n (cumsum n (flip n X)) i x = \sum_(0 <= j < n) X j x * (if (i <= j)%N then 1 else 0).
Proof.
move=> iN; rewrite /flip /cumsum big_nat_rev /= add0n.
apply: eq_big_nat => j /andP[_ jn].
have e : (n - (n - j.+1).+1)%N = j by rewrite subnSK // subKn // ltnW.
have c : (n - j.+1 <= n - i.+1)%N = (i <= j)%N.
  by rewrite leq_subLR -{1}(subnK iN) [(j.+1 + _)%N]addnC leq_add2l ltnS.
by rewrite e c.
Qed.

(** The block suffix sum: rank [r]'s local reversed scan plus [\sum_j M r j * G j] with [M r j = [r < j]] is block
    [r] of the logical reversed scan. *)
Theorem block_suffix_sum {I : Type} {R : comRingType} (p b : nat) (E : nat -> I -> R)
  (L : nat -> nat -> I -> R) (M : nat -> nat -> R) :
  (forall r k x, (r < p)%N -> (k < b)%N -> L r k x = E (r * b + k)%N x) ->
  (forall r j, (r < p)%N -> (j < p)%N -> M r j = if (r < j)%N then 1 else 0) ->
  forall r i x, (r < p)%N -> (i < b)%N ->
    flip b (cumsum b (flip b (L r))) i x +
      \sum_(0 <= j < p) M r j * all_gather 1 (fun s _ y => \sum_(0 <= k < b) L s k y) r j x
    = flip (p * b) (cumsum (p * b) (flip (p * b) E)) (r * b + i)%N x.
Proof.
move=> hL hM r i x rp ib.
have rbi : (r * b + i < p * b)%N.
  apply: (leq_trans (_ : r * b + i < r.+1 * b)%N); first by rewrite mulSn addnC ltn_add2r.
  by rewrite leq_mul2r rp orbT.
rewrite flip_cumsum_flip // flip_cumsum_flip // sum_blocks.
have blk : forall s, (s < p)%N ->
    \sum_(0 <= k < b) E (s * b + k)%N x * (if (r * b + i <= s * b + k)%N then 1 else 0) =
    (if (r < s)%N then 1 else 0) * (\sum_(0 <= k < b) L s k x) +
    (if s == r then \sum_(0 <= k < b) L s k x * (if (i <= k)%N then 1 else 0) else 0).
  move=> s sp.
  rewrite (eq_big_nat _ _ (fun k kb => congr2 (fun u v => u * (if v then 1 else 0)) (esym (hL s k x sp (andP kb).2))
                                                  (block_le r s ib (andP kb).2))).
  case: (ltngtP r s) => [rs|sr|<-] /=.
  - by rewrite mul1r addr0; apply: eq_bigr => k _; rewrite mulr1.
  - by rewrite mul0r addr0 big1 // => k _; rewrite mulr0.
  - by rewrite mul0r add0r.
rewrite (eq_big_nat _ _ (fun s sp => blk s (andP sp).2)).
rewrite big_split /= (sum_only_one (fun s => \sum_(0 <= k < b) L s k x * (if (i <= k)%N then 1 else 0)) rp).
rewrite addrC; congr (_ + _).
apply: eq_big_nat => j /andP[_ jp].
by rewrite hM // /all_gather divn1.
Qed.

(** A block's total read off its own scan ([scan_last_row_total]): the last row of its cumsum, or the first row of
    its reversed scan, is the sum of its rows (real code gathers [y[-1:]] of the local scan as the carry). *)
Theorem scan_last_row_total {I : Type} {R : comRingType} (b : nat) (X : nat -> I -> R) (y : I) :
  (0 < b)%N ->
  cumsum b X (b - 1) y = \sum_(0 <= k < b) X k y /\ flip b (cumsum b (flip b X)) 0 y = \sum_(0 <= k < b) X k y.
Proof.
move=> b0; split.
  apply: eq_big_nat => k /andP[_ kb].
  by rewrite subn1 -ltnS prednK // kb mulr1.
by rewrite flip_cumsum_flip //; apply: eq_bigr => k _; rewrite leq0n mulr1.
Qed.

(** ** The offset through a reduce_scatter: autograd's backward of the carried offset.

    The backward of [off r = \sum_j M r j * G j] (G the all_gather of the totals) is a reduce_scatter: rank [s]
    sends [M s j * T s] for every [j] (its weighted gradient total), and rank [r] receives [\sum_s M s r * T s].
    With the forward's row [M s j = [j < s]] that is the totals of the ranks after [r]: the carried offset of the
    reversed scan (and with [M s j = [s < j]], of the ranks before it: the backward of a reversed scan). *)

(** The scattered offset is the gathered one with the coefficient row transposed. *)
Lemma scattered_offset {I : Type} {R : comRingType} (p b : nat) (L : nat -> nat -> I -> R) (M : nat -> nat -> R)
  (r : nat) (x : I) :
  reduce_scatter p 1 (fun s j y => M s j * \sum_(0 <= k < b) L s k y) r 0 x =
  \sum_(0 <= j < p) M j r * all_gather 1 (fun s _ y => \sum_(0 <= k < b) L s k y) r j x.
Proof.
rewrite /reduce_scatter /all_gather muln1 addn0.
by apply: eq_bigr => j _; rewrite divn1.
Qed.

(** The block suffix sum with the offset scattered ([block_suffix_sum_scattered]): rank [r]'s local reversed scan
    plus the reduce_scatter of [M s j * T s] with [M s j = [j < s]] is block [r] of the logical reversed scan. *)
Theorem block_suffix_sum_scattered {I : Type} {R : comRingType} (p b : nat) (E : nat -> I -> R)
  (L : nat -> nat -> I -> R) (M : nat -> nat -> R) :
  (forall r k x, (r < p)%N -> (k < b)%N -> L r k x = E (r * b + k)%N x) ->
  (forall s j, (s < p)%N -> (j < p)%N -> M s j = if (j < s)%N then 1 else 0) ->
  forall r i x, (r < p)%N -> (i < b)%N ->
    flip b (cumsum b (flip b (L r))) i x +
      reduce_scatter p 1 (fun s j y => M s j * \sum_(0 <= k < b) L s k y) r 0 x
    = flip (p * b) (cumsum (p * b) (flip (p * b) E)) (r * b + i)%N x.
Proof.
move=> hL hM r i x rp ib; rewrite scattered_offset.
apply: (@block_suffix_sum I R p b E L (fun r j => M j r)) => // r' j rp' jp.
exact: hM.
Qed.

(** The block prefix sum with the offset scattered ([block_prefix_sum_scattered]): [M s j = [s < j]] (the backward
    of a reversed scan) gives block [r] of the logical cumsum. *)
Theorem block_prefix_sum_scattered {I : Type} {R : comRingType} (p b : nat) (E : nat -> I -> R)
  (L : nat -> nat -> I -> R) (M : nat -> nat -> R) :
  (forall r k x, (r < p)%N -> (k < b)%N -> L r k x = E (r * b + k)%N x) ->
  (forall s j, (s < p)%N -> (j < p)%N -> M s j = if (s < j)%N then 1 else 0) ->
  forall r i x, (r < p)%N -> (i < b)%N ->
    cumsum b (L r) i x + reduce_scatter p 1 (fun s j y => M s j * \sum_(0 <= k < b) L s k y) r 0 x
    = cumsum (p * b) E (r * b + i)%N x.
Proof.
move=> hL hM r i x rp ib; rewrite scattered_offset.
apply: (@block_prefix_sum I R p b E L (fun r j => M j r)) => // r' j rp' jp.
exact: hM.
Qed.

(** Flipping twice along a dim is the identity ([scan_flip_pairs]): autograd's backward of a reversed scan spells
    [flip(flip(cumsum(flip(flip(g)))))], a cumsum inside pairs of flips. *)
Theorem scan_flip_pairs {I V : Type} (n : nat) (X : nat -> I -> V) (i : nat) (x : I) :
  (i < n)%N -> flip n (flip n X) i x = X i x.
Proof. by move=> iN; rewrite /flip subnSK // subKn // ltnW. Qed.
