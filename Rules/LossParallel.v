(** * Loss parallel (torchtitan's [_LossParallelCrossEntropy]): the
    vocab-parallel log_softmax, the target pick with ignore_index, and the
    backward, each a placement of the logical log_softmax / nll_loss form.

    A row [y] of [p * b] logits is sharded by vocabulary blocks: rank [r]
    holds [L r i = y (r * b + i)] for [i < b].  The target [t] of a token is
    kept when [keep] (PyTorch: [target <> ignore_index]); an ignored target
    has the zero one-hot row, as in PyTorch's [nll_loss].  [exp] and [log]
    are abstract, with [exp (a + c) = exp a * exp c], [exp a > 0] and
    [log (exp a * y) = a + log y] for [y > 0]. *)
From mathcomp Require Import all_ssreflect all_algebra.
From TVCert Require Import Semantics Composite.
Set Implicit Arguments.
Unset Strict Implicit.
Unset Printing Implicit Defensive.
Import GRing.Theory Num.Theory.
Local Open Scope ring_scope.

(** ** Block-local target ids (integer bookkeeping, shared by forward and backward). *)
Definition out_of_block (b r t : nat) : bool := ((t < r * b) || (r * b + b <= t))%N.

Definition local_id (b r t : nat) : nat := if out_of_block b r t then 0%N else (t - r * b)%N.

Lemma out_of_block_not_mem (b r t : nat) :
  out_of_block b r t = ~~ ((r * b <= t) && (t < r * b + b))%N.
Proof. by rewrite /out_of_block negb_and -ltnNge -leqNgt. Qed.

Lemma in_block_local_id (b r t i : nat) :
  ~~ out_of_block b r t -> (local_id b r t == i) = (t == r * b + i)%N.
Proof.
rewrite /local_id out_of_block_not_mem negbK => /andP[lo hi]; rewrite lo hi /=.
by rewrite -(eqn_add2l (r * b) (t - r * b)) subnKC.
Qed.

Lemma out_of_block_ne (b r t i : nat) :
  (i < b)%N -> out_of_block b r t -> (t == r * b + i)%N = false.
Proof.
move=> ib; rewrite /out_of_block; apply: contraTF => /eqP ->.
by rewrite negb_or -leqNgt -ltnNge leq_addr ltn_add2l.
Qed.

Section LossParallel.
Variable R : realFieldType.
Variables exp log : R -> R.

(** ** Logical side. *)
(** [log_softmax] of a row of length [n]. *)
Definition log_softmax (n : nat) (y : nat -> R) (k : nat) : R :=
  y k - log (\sum_(0 <= j < n) exp (y j)).

(** One-hot row of the target (the zero row for an ignored target). *)
Definition one_hot_keep (keep : bool) (t k : nat) : R := if keep && (k == t) then 1 else 0.

(** [neg (sum (mul (ls, one_hot t)))]: the logical nll of one token. *)
Definition nll (n : nat) (keep : bool) (t : nat) (ls : nat -> R) : R :=
  - \sum_(0 <= k < n) ls k * one_hot_keep keep t k.

(** [mul (neg (one_hot t), g)]: nll_loss_backward (sum reduction, scalar [g]). *)
Definition nll_grad (keep : bool) (t : nat) (g : R) (k : nat) : R := - one_hot_keep keep t k * g.

(** [g - exp out * sum g]: log_softmax_backward. *)
Definition log_softmax_backward (n : nat) (go out : nat -> R) (k : nat) : R :=
  go k - exp (out k) * \sum_(0 <= j < n) go j.

(** ** Parallel side (rank [r], local column [i]). *)
(** [(x - m) - log (all_reduce_sum (sum (exp (x - m))))] with [m] the
    all_reduce max of the local maxima. *)
Definition vp_log_softmax (p b : nat) (L : nat -> nat -> R) (r i : nat) : R :=
  let m := vp_global_max p b L in
  (L r i - m) - log (\sum_(0 <= s < p) \sum_(0 <= j < b) exp (L s j - m)).

(** The safe target [where (keep, t, 0)]. *)
Definition safe_target (keep : bool) (t : nat) : nat := if keep then t else 0%N.

(** [where (out, 0, gather (LY r, local_id))]: the rank's pick. *)
Definition local_pick (b r t : nat) (LY : nat -> nat -> R) : R :=
  if out_of_block b r t then 0 else LY r (local_id b r t).

(** [where (keep, - all_reduce_sum (local_pick), 0)]. *)
Definition vp_nll (p b : nat) (keep : bool) (t : nat) (LY : nat -> nat -> R) : R :=
  if keep then - \sum_(0 <= s < p) local_pick b s (safe_target keep t) LY else 0.

(** [(where (one_hot (local_id), cast out - 1, 0) + exp LY) * where (keep, g, 0)]. *)
Definition vp_nll_backward (b r : nat) (keep : bool) (t : nat) (g : R) (LY : nat -> nat -> R) (i : nat) : R :=
  let t' := safe_target keep t in
  ((if local_id b r t' == i then (if out_of_block b r t' then 1 else 0) - 1 else 0) + exp (LY r i))
  * (if keep then g else 0).

(** ** Lemmas ([Composite.sum_exp_gt0] gives the positive normalizer). *)
(** Any common shift [m] leaves log_softmax unchanged. *)
Lemma log_softmax_shift (n : nat) (y : nat -> R) (m : R) (k : nat) :
  (forall a c, exp (a + c) = exp a * exp c) -> (forall a, 0 < exp a) ->
  (forall a z, 0 < z -> log (exp a * z) = a + log z) -> (0 < n)%N ->
  (y k - m) - log (\sum_(0 <= j < n) exp (y j - m)) = log_softmax n y k.
Proof.
move=> expD pos logE n0; rewrite /log_softmax.
have -> : \sum_(0 <= j < n) exp (y j) = exp m * \sum_(0 <= j < n) exp (y j - m).
  by rewrite mulr_sumr; apply: eq_bigr => j _; rewrite -expD addrC subrK.
by rewrite logE ?sum_exp_gt0 // opprD addrA.
Qed.

Lemma local_pick_masked (b r t : nat) (LY : nat -> nat -> R) :
  local_pick b r t LY = masked_lookup b (fun r i (_ : unit) => LY r i) t r tt.
Proof.
rewrite /local_pick /masked_lookup /local_id out_of_block_not_mem.
by case: ((r * b <= t) && (t < r * b + b))%N.
Qed.

Lemma one_hot_keep_sum (n : nat) (keep : bool) (t : nat) (F : nat -> R) :
  (keep -> t < n)%N ->
  \sum_(0 <= k < n) F k * one_hot_keep keep t k = if keep then F t else 0.
Proof.
rewrite /one_hot_keep; case: keep => /= [tn | _]; last by rewrite big1 // => k _; rewrite mulr0.
rewrite (eq_bigr (fun k => if k == t then F t else 0)); last first.
  by move=> k _; case: eqP => [->|_]; rewrite ?mulr1 ?mulr0.
exact: sum_only_one (tn isT).
Qed.

(** The rank's local one-hot column, negated: [-1] exactly at the global target. *)
Lemma local_neg_one_hot (b r t i : nat) :
  (i < b)%N ->
  (if local_id b r t == i then (if out_of_block b r t then 1 else 0) - 1 else 0 : R)
  = - (if t == (r * b + i)%N then 1 else 0).
Proof.
move=> ib; case o: (out_of_block b r t).
  by rewrite subrr if_same out_of_block_ne // oppr0.
by rewrite in_block_local_id ?o // sub0r; case: eqP; rewrite ?oppr0.
Qed.

(** ** Theorems. *)
(** Vocab-parallel log_softmax: on every rank, the local result is the rank's
    vocab block of the logical log_softmax (Shard over the vocab dim). *)
Theorem vocab_parallel_log_softmax (p b : nat) (y : nat -> R) (L : nat -> nat -> R) :
  (forall a c, exp (a + c) = exp a * exp c) -> (forall a, 0 < exp a) ->
  (forall a z, 0 < z -> log (exp a * z) = a + log z) ->
  (0 < p)%N -> (0 < b)%N ->
  (forall r i, (r < p)%N -> (i < b)%N -> L r i = y (r * b + i)%N) ->
  forall r i, (r < p)%N -> (i < b)%N ->
  vp_log_softmax p b L r i = log_softmax (p * b) y (r * b + i)%N.
Proof.
move=> expD pos logE p0 b0 h r i rp ib; rewrite /vp_log_softmax h //.
rewrite -(log_softmax_shift _ (vp_global_max p b L) _ expD pos logE) ?muln_gt0 ?p0 //.
congr (_ - log _); rewrite sum_blocks; apply: eq_big_nat => s /andP[_ sp].
by apply: eq_big_nat => j /andP[_ jb]; rewrite h.
Qed.

(** Vocab-parallel nll with ignore_index: the masked picks of the safe target,
    all_reduce summed, negated and zeroed for ignored targets, are the logical
    nll, on every rank. *)
Theorem vocab_parallel_nll_loss (p b : nat) (keep : bool) (t : nat) (ls : nat -> R)
  (LY : nat -> nat -> R) :
  (0 < b)%N -> (keep -> t < p * b)%N ->
  (forall r i, (r < p)%N -> (i < b)%N -> LY r i = ls (r * b + i)%N) ->
  vp_nll p b keep t LY = nll (p * b) keep t ls.
Proof.
move=> b0 tr h; rewrite /vp_nll /nll one_hot_keep_sum //.
case: keep tr => [tr | _] /=; last by rewrite oppr0.
have hs : shard p b (fun k (_ : unit) => ls k) (fun r i (_ : unit) => LY r i).
  by move=> r i u rp ib; rewrite h.
rewrite -(masked_lookup_sum b0 (tr isT) hs tt).
by congr (- _); apply: eq_bigr => s _; rewrite local_pick_masked.
Qed.

(** Vocab-parallel nll + log_softmax backward: the rank's local gradient is its
    vocab block (Shard over the vocab dim) of the logical
    [log_softmax_backward (nll_grad), ls]. *)
Theorem vocab_parallel_nll_backward (p b : nat) (keep : bool) (t : nat) (g : R)
  (ls : nat -> R) (LY : nat -> nat -> R) :
  (0 < b)%N -> (keep -> t < p * b)%N ->
  (forall r i, (r < p)%N -> (i < b)%N -> LY r i = ls (r * b + i)%N) ->
  forall r i, (r < p)%N -> (i < b)%N ->
  vp_nll_backward b r keep t g LY i
  = log_softmax_backward (p * b) (nll_grad keep t g) ls (r * b + i)%N.
Proof.
move=> b0 tr h r i rp ib.
rewrite /vp_nll_backward /log_softmax_backward /nll_grad h // local_neg_one_hot //.
have -> : \sum_(0 <= j < p * b) - one_hot_keep keep t j * g = - \sum_(0 <= j < p * b) g * one_hot_keep keep t j.
  by rewrite -sumrN; apply: eq_bigr => j _; rewrite mulNr mulrC.
rewrite one_hot_keep_sum // /one_hot_keep /safe_target.
case: keep tr => [_ | _] /=; last by rewrite !oppr0 !mulr0 !mul0r subr0.
by rewrite [t == _]eq_sym mulrDl mulrN opprK.
Qed.
End LossParallel.
