(** * Megatron's target-logit pick of vocab-parallel cross-entropy, and its backward ([kernel/vocab_pick.py]).

    Megatron-core's [calculate_predicted_logits] (cross_entropy.py:48-64) masks the targets outside rank [r]'s
    vocabulary block [[r*b, r*b + b)], picks [logits_2d[arange(N), masked_target]] (the front end's row-wise gather:
    row [n] reads its local column [t_n - r*b], or 0 when masked), zeroes the masked picks and all-reduces; its
    backward subtracts [1 - mask] at the picked column ([grad_2d[arange(N), masked_target] -= 1 - mask]).  Per token
    row [n] with target [t] (any integer) and logits row [X] over the global vocabulary, rank [r] holding the block
    [X (r*b + k)]:
    - [vocab_parallel_target_logit]: the sum over ranks of the masked picks is the same masked pick over the whole
      vocabulary, one block [[0, p*b)] (Megatron's code at degree 1: vocab_start 0, vocab_end V);
    - [vocab_parallel_target_logit_backward]: rank [r]'s updated column [k] is column [r*b + k] of the update over the
      whole vocabulary.
    No range is assumed of [t]: a target outside [[0, p*b)] is masked on every rank and at degree 1 alike. *)
From mathcomp Require Import all_ssreflect all_algebra.
From TVCert Require Import Semantics.
Set Implicit Arguments.
Unset Strict Implicit.
Unset Printing Implicit Defensive.
Import GRing.Theory Num.Theory Order.Theory.
Local Open Scope ring_scope.

(** [t] lies in block [r] of [b] ids; the local id [t - r*b] there (0 when masked, as [where(mask, 0, t - r*b)]);
    the masked pick [where(mask, 0, Xr[local id])]; the backward's update of column [k]:
    [where(one_hot(local id)[k], Xr[local id] - (1 - float(mask)), Xr[k])]. *)
Definition in_block (b r : nat) (t : int) : bool := ((r * b)%:Z <= t) && (t < (r * b + b)%:Z).
Definition local_id (b r : nat) (t : int) : nat := if in_block b r t then absz (t - (r * b)%:Z) else 0%N.
Definition masked_pick {R : ringType} (b r : nat) (Xr : nat -> R) (t : int) : R :=
  if ~~ in_block b r t then 0 else Xr (local_id b r t).
Definition pick_update {R : ringType} (b r : nat) (Xr : nat -> R) (t : int) (k : nat) : R :=
  if k == local_id b r t then Xr (local_id b r t) - (1 - (if ~~ in_block b r t then 1 else 0)) else Xr k.

(** Block membership of a non-negative id, and of a negative one (never). *)
Lemma in_block_nat (b r n : nat) : in_block b r n%:Z = ((r * b <= n) && (n < r * b + b))%N.
Proof. by rewrite /in_block lez_nat ltz_nat. Qed.

Lemma in_block_neg (b r : nat) (t : int) : t < 0 -> in_block b r t = false.
Proof.
move=> t0; rewrite /in_block; apply/negbTE; rewrite negb_and -ltNge.
by apply/orP; left; exact: lt_le_trans t0 (le0z_nat _).
Qed.

Lemma local_id_nat (b r n : nat) : in_block b r n%:Z -> local_id b r n%:Z = (n - r * b)%N.
Proof.
move=> h; rewrite /local_id h; move: h; rewrite in_block_nat => /andP[lo _].
by rewrite subzn.
Qed.

(** Row [r*b + k] of block [r] holds [n] iff [n] is in block [r] at [n - r*b = k]. *)
Lemma block_hit (b r n k : nat) : (k < b)%N -> (r * b + k == n)%N = in_block b r n%:Z && (k == n - r * b)%N.
Proof.
move=> kb; rewrite in_block_nat.
apply/eqP/andP => [<-|[/andP[lo hi] /eqP ->]]; last by rewrite subnKC.
by rewrite leq_addr ltn_add2l kb addKn.
Qed.

(** The forward: the sum over the ranks' masked picks is the masked pick over the whole vocabulary. *)
Theorem vocab_parallel_target_logit {R : ringType} (p b : nat) (X : nat -> R) (t : int) :
  \sum_(0 <= r < p) masked_pick b r (fun k => X (r * b + k)%N) t = masked_pick (p * b) 0 X t.
Proof.
case: (ltrP t 0) => [t0|].
  rewrite /masked_pick in_block_neg // big1 // => r _.
  by rewrite in_block_neg.
case: t => // n _.
case b0: (b == 0)%N.
  rewrite (eqP b0) muln0 /masked_pick in_block_nat big1 ?ltn0 ?andbF // => r _.
  by rewrite in_block_nat muln0 addn0 ltn0 andbF.
have bp : (0 < b)%N by rewrite lt0n b0.
have one : forall r, masked_pick b r (fun k => X (r * b + k)%N) n%:Z =
                     if r == (n %/ b)%N then X n else 0.
  move=> r; rewrite /masked_pick in_block_nat block_mem // eq_sym.
  case: eqP => // e; rewrite local_id_nat ?in_block_nat ?block_mem 1?eq_sym ?e //.
  by rewrite /= subnKC // leq_trunc_div.
rewrite (eq_bigr _ (fun r _ => one r)) /masked_pick in_block_nat mul0n add0n leq0n /=.
case: ltnP => [np|pn].
  rewrite sum_only_one ?ltn_divLR //.
  by rewrite local_id_nat ?in_block_nat ?mul0n ?add0n ?leq0n // subn0.
rewrite big1_seq // => r /andP[_]; rewrite mem_index_iota => /andP[_ rp].
case: eqP => // e; exfalso; move: rp; rewrite e ltn_divLR // ltnNge.
by rewrite pn.
Qed.

(** The backward: rank [r]'s update of its column [k] is the whole vocabulary's update of column [r*b + k]. *)
Theorem vocab_parallel_target_logit_backward {R : ringType} (p b : nat) (X : nat -> R) (t : int) (r k : nat) :
  (r < p)%N -> (k < b)%N ->
  pick_update b r (fun k => X (r * b + k)%N) t k = pick_update (p * b) 0 X t (r * b + k).
Proof.
move=> rp kb; rewrite /pick_update.
have rbk : (r * b + k < p * b)%N.
  apply: (@leq_trans (r * b + b)%N); first by rewrite ltn_add2l.
  by rewrite -mulSnr leq_mul2r rp orbT.
case: (ltrP t 0) => [t0|].
  rewrite /local_id !in_block_neg //= subrr subr0.
  rewrite subr0; case: (k =P 0%N) => [->|_]; last by case: eqP => // ->.
  by rewrite addn0; case: eqP => // ->.
case: t => // n _.
case hb: (in_block b r n%:Z).
  have hV : in_block (p * b) 0 n%:Z.
    move: hb; rewrite !in_block_nat mul0n add0n leq0n => /andP[_ hi] /=.
    by apply: leq_trans hi _; rewrite -mulSnr leq_mul2r rp orbT.
  rewrite hV /= !local_id_nat // mul0n subn0.
  have lo : (r * b <= n)%N by move: hb; rewrite in_block_nat => /andP[].
  by rewrite subnKC // block_hit // hb.
rewrite /= subrr subr0 /local_id hb -/(local_id (p * b) 0 n%:Z).
have -> : (if k == 0%N then X (r * b + 0)%N else X (r * b + k)%N) = X (r * b + k)%N by case: eqP => // ->.
case hV: (in_block (p * b) 0 n%:Z).
  by rewrite local_id_nat // mul0n subn0 block_hit // hb.
by rewrite /local_id hV /= subrr subr0; case: eqP => // ->.
Qed.
