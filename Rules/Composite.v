(** * Composite training rules. *)
From mathcomp Require Import all_ssreflect all_algebra.
From TVCert Require Import Semantics.
Set Implicit Arguments.
Unset Strict Implicit.
Unset Printing Implicit Defensive.
Import GRing.Theory Num.Theory.
Local Open Scope ring_scope.

(** ** Vocab-parallel embedding. *)
(** Masked local lookup: rank [r] owns rows [[r*b, r*b+b)] of the table. *)
Definition masked_lookup {J : Type} {R : zmodType} (b : nat) (LW : nat -> nat -> J -> R)
  (t : nat) : nat -> J -> R :=
  fun r j => if ((r * b <= t) && (t < r * b + b))%N then LW r (t - r * b)%N j else 0.

Lemma masked_lookup_sum {J : Type} {R : zmodType} (p b t : nat) (W : nat -> J -> R)
  (LW : nat -> nat -> J -> R) :
  (0 < b)%N -> (t < p * b)%N -> shard p b W LW ->
  forall j, \sum_(0 <= r < p) masked_lookup b LW t r j = W t j.
Proof.
move=> b0 tpb h j; rewrite /masked_lookup.
rewrite (eq_bigr (fun r => if r == (t %/ b)%N then LW r (t - r * b)%N j else 0));
  last by move=> r _; rewrite block_mem // eq_sym.
rewrite sum_only_one ?block_rank_lt // h ?block_rank_lt //.
  by rewrite subnKC // leq_trunc_div.
have -> : (t - t %/ b * b = t %% b)%N 
  by apply/eqP; rewrite -(eqn_add2l (t %/ b * b)) subnKC ?leq_trunc_div // -divn_eq.
by rewrite ltn_pmod.
Qed.

(** Masked local lookup into a vocab-sharded table followed by all_reduce sum
    is the logical embedding lookup, on every rank. *)
Theorem vocab_parallel_embedding {J : Type} {R : zmodType} (p b t : nat)
  (W : nat -> J -> R) (LW : nat -> nat -> J -> R) :
  (0 < b)%N -> (t < p * b)%N -> shard p b W LW ->
  replicate p (W t) (all_reduce_sum p (masked_lookup b LW t)).
Proof. by move=> b0 tpb h r j _; rewrite /all_reduce_sum (masked_lookup_sum b0 tpb h). Qed.

(** Per token, the rank's shifted-id scatter of its zeroed gradient hits
    local row [j] exactly when the global id is [r*b + j]. *)
Lemma vp_embed_grad_token {R : zmodType} (b r v j : nat) (x : R) :
  (j < b)%N ->
  (if (if ((r * b <= v) && (v < r * b + b))%N then (v - r * b)%N else 0%N) == j
   then (if ((r * b <= v) && (v < r * b + b))%N then x else 0) else 0)
  = (if v == (r * b + j)%N then x else 0).
Proof.
move=> jb; case: andP => [[lo _] | out]; last first.
  rewrite if_same; case: eqP => // ev; case: out.
  by rewrite ev leq_addr ltn_add2l.
by rewrite -(eqn_add2l (r * b)) subnKC.
Qed.

(** Vocab-parallel embedding backward (Megatron): rank [r] zeroes the
    gradient of tokens outside its vocab block, shifts ids into the block
    (outside tokens get local id 0) and scatter-adds; local row [j] is row
    [r*b + j] of the logical embedding gradient, i.e. the rank's shard. *)
Theorem vocab_parallel_embedding_backward {R : zmodType} (p b r T : nat)
  (ids : nat -> nat) (g : nat -> R) :
  (r < p)%N -> (0 < b)%N -> forall j, (j < b)%N ->
  let in_block t := ((r * b <= ids t) && (ids t < r * b + b))%N in
  let lid t := if in_block t then (ids t - r * b)%N else 0%N in
  let g' t := if in_block t then g t else 0 in
  \sum_(0 <= t < T) (if lid t == j then g' t else 0)
  = \sum_(0 <= t < T) (if ids t == (r * b + j)%N then g t else 0).
Proof.
by move=> _ _ j jb /=; apply: eq_bigr => t _; rewrite vp_embed_grad_token.
Qed.

(** torchtitan's clamped lookup: clamp the shifted id into the block and
    multiply by the in-block indicator; this is Megatron's masked lookup. *)
Lemma clamped_lookup_masked {J : Type} {R : ringType} (b t r : nat)
  (LW : nat -> nat -> J -> R) (j : J) :
  (0 < b)%N ->
  LW r (minn (t - r * b) b.-1) j
    * (if ((r * b <= t) && (t < r * b + b))%N then 1 else 0)
  = masked_lookup b LW t r j.
Proof.
move=> b0; rewrite /masked_lookup; case: andP => [[lo hi] | _]; last by rewrite mulr0.
have lt : (t - r * b < b)%N by rewrite ltn_subLR // addnC.
by rewrite mulr1 (minn_idPl _) // -ltnS prednK.
Qed.

(** torchtitan's vocab-parallel embedding (clamped local id times in-block
    indicator) followed by all_reduce sum is the logical row, on every rank. *)
Theorem vocab_parallel_embedding_clamped {J : Type} {R : ringType} (p b t : nat)
  (W : nat -> J -> R) (LW : nat -> nat -> J -> R) :
  (0 < b)%N -> (t < p * b)%N -> shard p b W LW ->
  replicate p (W t) (all_reduce_sum p (fun r j =>
    LW r (minn (t - r * b) b.-1) j
      * (if ((r * b <= t) && (t < r * b + b))%N then 1 else 0))).
Proof.
move=> b0 tpb h r j _; rewrite /all_reduce_sum -(masked_lookup_sum b0 tpb h).
by apply: eq_bigr => r' _; rewrite clamped_lookup_masked.
Qed.

(** Per token, torchtitan's backward of the clamped lookup (gradient times the
    in-block indicator, scattered at the clamped local id) hits local row [j]
    exactly when the global id is [r*b + j]. *)
Lemma clamped_grad_token {R : ringType} (b r v j : nat) (x : R) :
  (0 < b)%N -> (j < b)%N ->
  (if minn (v - r * b) b.-1 == j
   then x * (if ((r * b <= v) && (v < r * b + b))%N then 1 else 0) else 0)
  = (if v == (r * b + j)%N then x else 0).
Proof.
move=> b0 jb; case: andP => [[lo hi] | out]; last first.
  rewrite mulr0 if_same; case: eqP => // ev; case: out.
  by rewrite ev leq_addr ltn_add2l.
have lt : (v - r * b < b)%N by rewrite ltn_subLR // addnC.
rewrite mulr1 (minn_idPl _); last by rewrite -ltnS prednK.
by rewrite -(eqn_add2l (r * b) (v - r * b)) subnKC.
Qed.

(** torchtitan's vocab-parallel embedding backward: rank [r] multiplies the
    gradient by the in-block indicator and scatter-adds it at the clamped
    local ids; local row [j] is row [r*b + j] of the logical embedding
    gradient, i.e. the rank's shard. *)
Theorem vocab_parallel_embedding_clamped_backward {R : ringType} (p b r T : nat)
  (ids : nat -> nat) (g : nat -> R) :
  (r < p)%N -> (0 < b)%N -> forall j, (j < b)%N ->
  \sum_(0 <= t < T) (if minn (ids t - r * b) b.-1 == j
                     then g t * (if ((r * b <= ids t) && (ids t < r * b + b))%N then 1 else 0)
                     else 0)
  = \sum_(0 <= t < T) (if ids t == (r * b + j)%N then g t else 0).
Proof. by move=> _ b0 j jb; apply: eq_bigr => t _; rewrite clamped_grad_token. Qed.

(** ** Vocab-parallel cross-entropy. *)
Section CrossEntropy.
Variable R : realFieldType.
Variables exp log : R -> R.

Definition local_max (b : nat) (row : nat -> R) : R := max_upto row b.

(** The distributed protocol, for logits [L r i] (vocab sharded) and target [t]:
    local max, all_reduce max, local sum of [exp (x - m)], all_reduce sum,
    target logit through masked lookup + all_reduce sum. *)
Definition vp_global_max (p b : nat) (L : nat -> nat -> R) : R :=
  max_upto (fun r => local_max b (L r)) p.

Definition vp_cross_entropy (p b t : nat) (L : nat -> nat -> R) : R :=
  let m := vp_global_max p b L in
  let S := \sum_(0 <= r < p) \sum_(0 <= i < b) exp (L r i - m) in
  let T := \sum_(0 <= r < p) masked_lookup b (fun r i (_ : unit) => L r i) t r tt in
  m + log S - T.

Definition cross_entropy (n t : nat) (x : nat -> R) : R :=
  log (\sum_(0 <= k < n) exp (x k)) - x t.

Lemma sum_exp_gt0 (n : nat) (F : nat -> R) :
  (forall a, 0 < exp a) -> (0 < n)%N -> 0 < \sum_(0 <= k < n) exp (F k).
Proof.
move=> pos; case: n => [//|n] _; rewrite big_nat_recr //=.
by rewrite ltr_paddl ?pos // sumr_ge0 // => k _; apply: Order.POrderTheory.ltW.
Qed.

Theorem vocab_parallel_cross_entropy (p b t : nat) (x : nat -> R) (L : nat -> nat -> R) :
  (forall a c, exp (a + c) = exp a * exp c) ->
  (forall a, 0 < exp a) ->
  (forall a y, 0 < y -> log (exp a * y) = a + log y) ->
  (0 < p)%N -> (0 < b)%N -> (t < p * b)%N ->
  (forall r i, (r < p)%N -> (i < b)%N -> L r i = x (r * b + i)%N) ->
  vp_cross_entropy p b t L = cross_entropy (p * b) t x.
Proof.
move=> expD pos logE p0 b0 tpb h; rewrite /vp_cross_entropy /cross_entropy.
set m := vp_global_max p b L.
have hs : shard p b (fun k (_ : unit) => x k) (fun r i (_ : unit) => L r i).
  by move=> r i u rp ib; rewrite h.
rewrite (masked_lookup_sum b0 tpb hs tt).
have -> : \sum_(0 <= r < p) \sum_(0 <= i < b) exp (L r i - m)
          = \sum_(0 <= k < p * b) exp (x k - m).
  rewrite sum_blocks; apply: eq_big_nat => r /andP[_ rp].
  by apply: eq_big_nat => i /andP[_ ib]; rewrite h.
have -> : \sum_(0 <= k < p * b) exp (x k) = exp m * \sum_(0 <= k < p * b) exp (x k - m).
  by rewrite mulr_sumr; apply: eq_bigr => k _; rewrite -expD addrC subrK.
by rewrite logE // sum_exp_gt0 // muln_gt0 p0.
Qed.

(** ** Online softmax merge (ring attention / flash attention).
    Keys [p*b] split into [p] blocks; block [r] keeps an arbitrary reference
    [mloc r] (its running max), the sum [l_r] of [exp (s - mloc r)] and the
    unnormalised accumulator [acc_r] of [exp (s - mloc r) * v].  Merging with
    any reference [m] and the correction [exp (mloc r - m)] gives softmax
    attention over all keys.  Only [exp (a+c) = exp a * exp c] and
    [exp a <> 0] are needed. *)
Definition block_lsum (b : nat) (s : nat -> R) (mloc : nat -> R) (r : nat) : R :=
  \sum_(0 <= i < b) exp (s (r * b + i)%N - mloc r).

Definition block_acc (b : nat) (s v : nat -> R) (mloc : nat -> R) (r : nat) : R :=
  \sum_(0 <= i < b) exp (s (r * b + i)%N - mloc r) * v (r * b + i)%N.

Definition online_merge (p b : nat) (s v : nat -> R) (mloc : nat -> R) (m : R) : R :=
  (\sum_(0 <= r < p) exp (mloc r - m) * block_acc b s v mloc r) /
  (\sum_(0 <= r < p) exp (mloc r - m) * block_lsum b s mloc r).

Definition softmax_attention (n : nat) (s v : nat -> R) : R :=
  (\sum_(0 <= k < n) exp (s k) * v k) / (\sum_(0 <= k < n) exp (s k)).

Lemma div_cancel_l (c a d : R) : c != 0 -> (c * a) / (c * d) = a / d.
Proof. by move=> c0; rewrite invfM mulrACA divff // mul1r. Qed.

(** The same merge when each block ships its *normalised* output
    [acc_r / l_r] (flash / ring attention): the output is rescaled by the
    corrected block sum. *)
Definition online_merge_normalized (p b : nat) (s v : nat -> R) (mloc : nat -> R) (m : R) : R :=
  (\sum_(0 <= r < p) exp (mloc r - m) * block_lsum b s mloc r *
       (block_acc b s v mloc r / block_lsum b s mloc r)) /
  (\sum_(0 <= r < p) exp (mloc r - m) * block_lsum b s mloc r).

Theorem online_softmax_merge (p b : nat) (s v : nat -> R) (mloc : nat -> R) (m : R) :
  (forall a c, exp (a + c) = exp a * exp c) -> (forall a, 0 < exp a) ->
  online_merge p b s v mloc m = softmax_attention (p * b) s v /\
  ((0 < b)%N -> online_merge_normalized p b s v mloc m = softmax_attention (p * b) s v).
Proof.
move=> expD pos.
have nz : forall a, exp a != 0 by move=> a; apply: lt0r_neq0.
have merge : online_merge p b s v mloc m = softmax_attention (p * b) s v.
  rewrite /online_merge /softmax_attention.
  have corr : forall r k, exp (mloc r - m) * exp (s k - mloc r) = exp (- m) * exp (s k).
    by move=> r k; rewrite -!expD addrC addrA subrK addrC.
  rewrite -[RHS](div_cancel_l _ _ (nz (- m))) !mulr_sumr !sum_blocks.
  congr (_ / _); apply: eq_bigr => r _; rewrite ?mulr_sumr; apply: eq_bigr => i _.
    by rewrite mulrA corr mulrA.
  by rewrite corr.
split=> // b0; rewrite -merge /online_merge_normalized /online_merge.
congr (_ / _); apply: eq_bigr => r _.
have l0 : block_lsum b s mloc r != 0.
  by apply: lt0r_neq0; rewrite /block_lsum sum_exp_gt0.
move: l0; set l := block_lsum b s mloc r => l0.
by rewrite -mulrA [l * _]mulrC divfK.
Qed.
End CrossEntropy.

(** ** Data parallel and gradient accumulation. *)
(** The mean of per-shard means over [p] equal shards of size [b] is the
    global mean. *)
Theorem dp_mean_of_means {R : fieldType} (p b : nat) (loss : nat -> R) :
  ((p%:R)^-1 * \sum_(0 <= r < p) ((b%:R)^-1 * \sum_(0 <= i < b) loss (r * b + i)%N))%R
  = (((p * b)%N%:R)^-1 * \sum_(0 <= k < p * b) loss k)%R.
Proof. by rewrite -mulr_sumr sum_blocks natrM invfM mulrA. Qed.

(** Summing [M] micro-batch gradients (each the sum over its [b] samples)
    and then scaling by [c] is the full-batch gradient scaled by [c]. *)
Theorem grad_accumulation {I : Type} {R : ringType} (M b : nat) (c : R)
  (g : nat -> I -> R) :
  forall x, (c * \sum_(0 <= mb < M) \sum_(0 <= i < b) g (mb * b + i)%N x)%R
            = (c * \sum_(0 <= k < M * b) g k x)%R.
Proof. by move=> x; rewrite sum_blocks. Qed.

(** ** ZeRO-1/2.  Every rank holds the full (flattened, padded) gradient
    partial [G s]; reduce_scatter gives rank [r] the summed gradient of the
    slice it owns; rank [r] applies an elementwise update [upd] (AdamW: new
    parameter and moments from the parameter, its moments, its gradient and the
    replicated step / hyper-parameters) to its slice of the flattened, padded
    optimizer state [w]; all_gather and un-padding give the update of the whole
    buffer with the full gradient [g = sum_s G s]. *)
Theorem zero_sharded_adamw {P W : Type} {R : zmodType} (upd : P -> R -> W)
  (p b n : nat) (pad : P) (w : nat -> P) (Lw : nat -> nat -> P)
  (g : nat -> R) (G : nat -> nat -> R) :
  (0 < b)%N -> (n <= p * b)%N -> shard_padded p b n pad w Lw ->
  (forall k, (k < n)%N -> \sum_(0 <= s < p) G s k = g k) ->
  forall r k, (r < p)%N -> (k < n)%N ->
    all_gather b
      (fun r i (_ : unit) =>
         upd (Lw r i) (reduce_scatter p b (fun s k (_ : unit) => G s k) r i tt))
      r k tt
    = upd (w k) (g k).
Proof.
move=> b0 npb h hg r k _ kn.
have kpb : (k < p * b)%N by exact: leq_trans kn npb.
rewrite /all_gather /reduce_scatter h ?ltn_pmod ?block_rank_lt // -divn_eq kn.
by rewrite hg.
Qed.

(** ** Mixture of experts.  Token [t] is routed to [K] slots; slot [(t,s)]
    has flat position [t*K + s], expert [e t s] and gate weight [w t s].
    The all_to_all dispatch is a permutation [sigma] of flat positions with
    inverse [sinv]; the dispatched buffer position [q] holds the entry of flat
    position [sinv q], the owning expert processes it, and combine reads
    position [sigma f] back. *)
Definition moe_dispatch {V : Type} (sinv : nat -> nat) (X : nat -> V) : nat -> V :=
  fun q => X (sinv q).

Definition moe_combine {V : Type} (sigma : nat -> nat) (Y : nat -> V) : nat -> V :=
  fun f => Y (sigma f).

Theorem moe_dispatch_combine {V J : Type} {R : ringType} (K : nat)
  (sigma sinv : nat -> nat) (x : nat -> V) (e : nat -> nat -> nat) (w : nat -> nat -> R)
  (expert : nat -> V -> J -> R) :
  cancel sigma sinv ->
  (forall X : nat -> V, forall f, moe_combine sigma (moe_dispatch sinv X) f = X f) /\
  (forall t j,
     (\sum_(0 <= s < K) w t s *
        moe_combine sigma
          (fun q => expert (e ((sinv q) %/ K)%N ((sinv q) %% K)%N)
                           (moe_dispatch sinv (fun f => x (f %/ K)%N) q) j)
          (t * K + s)%N)%R
     = (\sum_(0 <= s < K) w t s * expert (e t s) (x t) j)%R).
Proof.
move=> can; split=> [X f|t j]; first by rewrite /moe_combine /moe_dispatch can.
apply: eq_big_nat => s /andP[_ sK]; rewrite /moe_combine /moe_dispatch can.
by rewrite block_div ?block_mod // (leq_ltn_trans _ sK).
Qed.
