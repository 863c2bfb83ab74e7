(** * Ring attention: online softmax folded over a ring of key blocks. *)
From mathcomp Require Import all_ssreflect all_algebra.
From TVCert Require Import Semantics Composite.
Set Implicit Arguments.
Unset Strict Implicit.
Unset Printing Implicit Defensive.
Import GRing.Theory Num.Theory.
Local Open Scope ring_scope.

(** ** Reindexing a sum by an injection of [[0,p)] into itself. *)

(** A big operator over [[0,n)] (any commutative monoid) is unchanged when
    the term is read through an injection [f] of [[0,n)] into itself. *)
Lemma big_reindex_inj {V : Type} {idx : V} (op : Monoid.com_law idx) (n : nat)
  (f : nat -> nat) (F : nat -> V) :
  (forall k, (k < n)%N -> (f k < n)%N) ->
  (forall k k', (k < n)%N -> (k' < n)%N -> f k = f k' -> k = k') ->
  \big[op/idx]_(0 <= k < n) F (f k) = \big[op/idx]_(0 <= k < n) F k.
Proof.
move=> f_lt f_inj; rewrite !big_mkord.
pose h (j : 'I_n) : 'I_n := Ordinal (f_lt j (ltn_ord j)).
have h_inj : injective h by move=> j k /(congr1 val) /= /f_inj e; apply/val_inj/e.
by rewrite [RHS](reindex_inj h_inj).
Qed.

(** A sum over [[0,p)] is unchanged when the summand is read through an
    [order] that maps [[0,p)] injectively into [[0,p)] (a permutation). *)
Lemma sum_reindex_inj {R : zmodType} (p : nat) (order : nat -> nat) (F : nat -> R) :
  (forall t, (t < p)%N -> (order t < p)%N) ->
  (forall t u, (t < p)%N -> (u < p)%N -> order t = order u -> t = u) ->
  \sum_(0 <= j < p) F (order j) = \sum_(0 <= r < p) F r.
Proof. exact: (big_reindex_inj (GRing.add_comoid R)). Qed.

(** ** The ring schedule: at step [t] rank [r] holds block [(r + p - t) mod p]. *)

(** The ring schedule stays inside [[0,p)]. *)
Lemma ring_order_lt (p r t : nat) : (0 < p)%N -> ((r + p - t) %% p < p)%N.
Proof. exact: ltn_pmod. Qed.

(** Over one round ([t, u < p]) the ring schedule visits distinct blocks. *)
Lemma ring_order_inj (p r t u : nat) : (t < p)%N -> (u < p)%N ->
  ((r + p - t) %% p)%N = ((r + p - u) %% p)%N -> t = u.
Proof.
move=> tp up e.
have le_rp : forall w, (w < p)%N -> (w <= r + p)%N
  by move=> w wp; rewrite (leq_trans (ltnW wp)) // leq_addl.
have : (r + p - t + (t + u) = r + p - u + (u + t) %[mod p])%N
  by rewrite [(u + t)%N]addnC -modnDml e modnDml.
rewrite !addnA !subnK ?le_rp // => /eqP; rewrite eqn_modDl.
by rewrite !modn_small // => /eqP.
Qed.

Section RingAttention.
Variable R : realFieldType.
Variable exp : R -> R.
Hypothesis expD : forall a c, exp (a + c) = exp a * exp c.
Hypothesis exp_pos : forall a, 0 < exp a.

(** ** State of one query row on one rank.  [ring_ref] is the reference
    (running max in the protocol, arbitrary here), [ring_lsum] the running
    sum of [exp (s - ref)] and [ring_acc] the unnormalised accumulator of
    [exp (s - ref) * v]. *)
Record ring_state := RingState { ring_ref : R; ring_lsum : R; ring_acc : R }.

(** One online-softmax step on key block [blk] (keys [blk*b .. blk*b+b-1])
    with the new reference [m']: rescale by [exp (m - m')] and add the block. *)
Definition ring_step (b : nat) (s v : nat -> R) (blk : nat) (m' : R)
  (x : ring_state) : ring_state :=
  let c := exp (ring_ref x - m') in
  RingState m'
    (ring_lsum x * c + \sum_(0 <= i < b) exp (s (blk * b + i)%N - m'))
    (ring_acc x * c + \sum_(0 <= i < b) exp (s (blk * b + i)%N - m') * v (blk * b + i)%N).

(** [t] steps from [x0]; step [t'] processes block [order t'] with reference
    [refs t'], and the last step applied is [t - 1]. *)
Fixpoint ring_fold (b : nat) (s v : nat -> R) (order : nat -> nat) (refs : nat -> R)
  (x0 : ring_state) (t : nat) : ring_state :=
  if t is t'.+1 then ring_step b s v (order t') (refs t') (ring_fold b s v order refs x0 t')
  else x0.

(** Shifting an exponent by a reference: [exp (a - m) = exp (- m) * exp a]. *)
Lemma exp_shift (a m : R) : exp (a - m) = exp (- m) * exp a.
Proof. by rewrite -expD addrC. Qed.

(** Rescaling a total kept relative to [m] to the new reference [m'] and
    adding a block kept relative to [m'] gives the sum relative to [m']. *)
Lemma rescale_add (m m' S B : R) :
  exp (- m) * S * exp (m - m') + exp (- m') * B = exp (- m') * (S + B).
Proof. by rewrite mulrAC -expD addKr mulrDr. Qed.

(** Invariant of the running sum: after [t] steps it is
    [exp (- ref)] times the sum of [exp s] over the [t] blocks seen so far. *)
Lemma ring_fold_lsum (b : nat) (s v : nat -> R) (order : nat -> nat) (refs : nat -> R)
  (x0 : ring_state) (t : nat) :
  ring_lsum x0 = 0 ->
  ring_lsum (ring_fold b s v order refs x0 t) =
  exp (- ring_ref (ring_fold b s v order refs x0 t)) *
  \sum_(0 <= j < t) \sum_(0 <= i < b) exp (s (order j * b + i)%N).
Proof.
move=> l0; elim: t => [|t IH]; first by rewrite big_geq // mulr0.
rewrite /= IH big_nat_recr //= -(rescale_add (ring_ref (ring_fold b s v order refs x0 t))).
by congr (_ + _); rewrite mulr_sumr; apply: eq_bigr => i _; rewrite exp_shift.
Qed.

(** Invariant of the accumulator: after [t] steps it is [exp (- ref)] times
    the sum of [exp s * v] over the [t] blocks seen so far. *)
Lemma ring_fold_acc (b : nat) (s v : nat -> R) (order : nat -> nat) (refs : nat -> R)
  (x0 : ring_state) (t : nat) :
  ring_acc x0 = 0 ->
  ring_acc (ring_fold b s v order refs x0 t) =
  exp (- ring_ref (ring_fold b s v order refs x0 t)) *
  \sum_(0 <= j < t) \sum_(0 <= i < b) exp (s (order j * b + i)%N) * v (order j * b + i)%N.
Proof.
move=> a0; elim: t => [|t IH]; first by rewrite big_geq // mulr0.
rewrite /= IH big_nat_recr //= -(rescale_add (ring_ref (ring_fold b s v order refs x0 t))).
by congr (_ + _); rewrite mulr_sumr; apply: eq_bigr => i _; rewrite exp_shift mulrA.
Qed.

(** A double sum over the blocks of a permuted schedule is the sum over all
    [p*b] keys. *)
Lemma sum_blocks_reindex (p b : nat) (order : nat -> nat) (F : nat -> R) :
  (forall t, (t < p)%N -> (order t < p)%N) ->
  (forall t u, (t < p)%N -> (u < p)%N -> order t = order u -> t = u) ->
  \sum_(0 <= j < p) \sum_(0 <= i < b) F (order j * b + i)%N = \sum_(0 <= k < p * b) F k.
Proof.
move=> ord_lt ord_inj; rewrite sum_blocks.
exact: (sum_reindex_inj (fun r => \sum_(0 <= i < b) F (r * b + i)%N) ord_lt ord_inj).
Qed.

(** Online softmax folded over any schedule that visits each of the [p] key
    blocks once, with arbitrary references [refs] and initial reference, and
    zero initial sum and accumulator: [acc / l] is softmax attention over all
    [p*b] keys. *)
Theorem online_softmax_fold (p b : nat) (s v : nat -> R) (order : nat -> nat)
  (refs : nat -> R) (x0 : ring_state) :
  (forall t, (t < p)%N -> (order t < p)%N) ->
  (forall t u, (t < p)%N -> (u < p)%N -> order t = order u -> t = u) ->
  ring_lsum x0 = 0 -> ring_acc x0 = 0 ->
  ring_acc (ring_fold b s v order refs x0 p) / ring_lsum (ring_fold b s v order refs x0 p)
  = softmax_attention exp (p * b) s v.
Proof.
move=> ord_lt ord_inj l0 a0.
rewrite ring_fold_acc // ring_fold_lsum // div_cancel_l ?lt0r_neq0 //.
rewrite /softmax_attention -(sum_blocks_reindex b (fun k => exp (s k) * v k) ord_lt ord_inj).
by rewrite -(sum_blocks_reindex b (fun k => exp (s k)) ord_lt ord_inj).
Qed.

(** Ring attention on rank [r]: it starts with its own key block and receives
    the block of rank [r - 1 mod p] at every step, so at step [t] it holds
    block [(r + p - t) mod p].  After [p] steps [acc / l] is softmax attention
    over all [p*b] keys, for any references. *)
Theorem ring_attention_online_softmax (p b r : nat) (s v : nat -> R)
  (refs : nat -> R) (x0 : ring_state) :
  ring_lsum x0 = 0 -> ring_acc x0 = 0 ->
  let x := ring_fold b s v (fun t => ((r + p - t) %% p)%N) refs x0 p in
  ring_acc x / ring_lsum x = softmax_attention exp (p * b) s v.
Proof.
move=> l0 a0 /=; apply: online_softmax_fold => // [t tp|t u tp up].
  by apply: ring_order_lt; case: p tp.
exact: ring_order_inj.
Qed.
End RingAttention.

(** * Ring attention backward. *)

(** ** Index arithmetic of the ring. *)

(** Reading the schedule of rank [r - 1 mod p] at step [t] is reading the
    schedule of rank [r] at step [t + 1]. *)
Lemma ring_prev_step (p r t : nat) : (0 < p)%N -> (t < p)%N ->
  (((r + p - 1) %% p + p - t) %% p = (r + p - t.+1) %% p)%N.
Proof.
move=> p0 tp; apply/eqP; rewrite -(eqn_modDr t.+1) addnS subnK; last first.
  by rewrite (leq_trans (ltnW tp)) // leq_addl.
rewrite subnK; last by rewrite (leq_trans tp) // leq_addl.
by rewrite -addSn modnDr -addn1 modnDml subnK // (leq_trans p0) // leq_addl.
Qed.

(** ** Blocks passed around the ring. *)

(** If every rank starts with its own block [B r] and at every step receives
    what rank [r - 1 mod p] held, then at step [t <= p] rank [r] holds block
    [(r + p - t) mod p]. *)
Lemma ring_pass_block (T : Type) (p : nat) (B : nat -> T) (X : nat -> nat -> T) :
  (0 < p)%N ->
  (forall r, (r < p)%N -> X 0%N r = B r) ->
  (forall t r, (r < p)%N -> X t.+1 r = X t ((r + p - 1) %% p)%N) ->
  forall t r, (t <= p)%N -> (r < p)%N -> X t r = B ((r + p - t) %% p)%N.
Proof.
move=> p0 X0 XS; elim=> [|t IH] r tp rp; first by rewrite subn0 modnDr modn_small // X0.
by rewrite XS // IH ?(ltnW tp) ?ltn_pmod // ring_prev_step.
Qed.

(** After [p] steps every block is back at its owner. *)
Lemma ring_pass_block_home (T : Type) (p : nat) (B : nat -> T) (X : nat -> nat -> T) :
  (0 < p)%N ->
  (forall r, (r < p)%N -> X 0%N r = B r) ->
  (forall t r, (r < p)%N -> X t.+1 r = X t ((r + p - 1) %% p)%N) ->
  forall r, (r < p)%N -> X p r = B r.
Proof.
move=> p0 X0 XS r rp.
by rewrite (ring_pass_block p0 X0 XS (leqnn p) rp) addnK modn_small.
Qed.

(** ** An accumulator travelling with its block (dK, dV). *)

(** After [t <= p] steps rank [r] holds the accumulator of block
    [(r + p - t) mod p], which holds the contributions of ranks
    [r - 1, ..., r - t (mod p)] to that block. *)
Lemma ring_travelling_sum_at {R : zmodType} (p : nat) (c : nat -> nat -> R)
  (A : nat -> nat -> R) :
  (0 < p)%N ->
  (forall r, (r < p)%N -> A 0%N r = 0) ->
  (forall t r, (r < p)%N -> A t.+1 r =
     let q := ((r + p - 1) %% p)%N in A t q + c q ((q + p - t) %% p)%N) ->
  forall t r, (t <= p)%N -> (r < p)%N ->
  A t r = \sum_(0 <= j < t) c ((r + p - j.+1) %% p)%N ((r + p - t) %% p)%N.
Proof.
move=> p0 A0 AS; elim=> [|t IH] r tp rp; first by rewrite big_geq // A0.
rewrite AS //= IH ?(ltnW tp) ?ltn_pmod // (ring_prev_step r p0 tp) big_nat_recl // addrC.
congr (_ + _); apply: eq_big_nat => j /andP [_ jt].
by rewrite ring_prev_step // (leq_ltn_trans jt tp).
Qed.

(** After [p] steps the accumulator that arrives back at the owner [r] of a
    block holds the contributions of all [p] ranks to that block. *)
Lemma ring_travelling_sum {R : zmodType} (p : nat) (c : nat -> nat -> R)
  (A : nat -> nat -> R) :
  (0 < p)%N ->
  (forall r, (r < p)%N -> A 0%N r = 0) ->
  (forall t r, (r < p)%N -> A t.+1 r =
     let q := ((r + p - 1) %% p)%N in A t q + c q ((q + p - t) %% p)%N) ->
  forall r, (r < p)%N -> A p r = \sum_(0 <= r' < p) c r' r.
Proof.
move=> p0 A0 AS r rp.
rewrite (ring_travelling_sum_at p0 A0 AS (leqnn p) rp) addnK modn_small //.
transitivity (\sum_(0 <= j < p) c (((r + p - 1) %% p + p - j) %% p)%N r).
  by apply: eq_big_nat => j /andP [_ jp]; rewrite ring_prev_step.
apply: (sum_reindex_inj (fun r' => c r' r)) => [t tp|t u tp up].
  exact: ring_order_lt.
exact: ring_order_inj.
Qed.

(** ** A local accumulator (dQ). *)

(** After [t] steps the local accumulator of rank [r] holds the terms of the
    [t] blocks it has seen. *)
Lemma ring_local_sum_at {R : zmodType} (p r : nat) (g : nat -> R) (Q : nat -> R) :
  Q 0%N = 0 -> (forall t, Q t.+1 = Q t + g ((r + p - t) %% p)%N) ->
  forall t, Q t = \sum_(0 <= j < t) g ((r + p - j) %% p)%N.
Proof.
by move=> Q0 QS; elim=> [|t IH]; [rewrite big_geq | rewrite QS IH big_nat_recr].
Qed.

(** After [p] steps the local accumulator holds the terms of all [p] blocks. *)
Lemma ring_local_sum {R : zmodType} (p r : nat) (g : nat -> R) (Q : nat -> R) :
  (0 < p)%N ->
  Q 0%N = 0 -> (forall t, Q t.+1 = Q t + g ((r + p - t) %% p)%N) ->
  Q p = \sum_(0 <= b < p) g b.
Proof.
move=> p0 Q0 QS; rewrite (ring_local_sum_at Q0 QS).
apply: (sum_reindex_inj g) => [t tp|t u tp up]; first exact: ring_order_lt.
exact: ring_order_inj.
Qed.

(** ** Probabilities recomputed from the forward's final state. *)
Section RingProbabilities.
Variable R : realFieldType.
Variable exp : R -> R.
Hypothesis expD : forall a c, exp (a + c) = exp a * exp c.
Hypothesis exp_pos : forall a, 0 < exp a.

(** After a fold over a schedule visiting each of the [p] blocks once, from a
    zero running sum, [exp (s k - ref) / l] is the softmax probability of key
    [k] over all [p*b] keys, for any references. *)
Lemma ring_fold_probabilities (p b : nat) (s v : nat -> R) (order : nat -> nat)
  (refs : nat -> R) (x0 : ring_state R) :
  (forall t, (t < p)%N -> (order t < p)%N) ->
  (forall t u, (t < p)%N -> (u < p)%N -> order t = order u -> t = u) ->
  ring_lsum x0 = 0 ->
  let x := ring_fold exp b s v order refs x0 p in
  forall k, exp (s k - ring_ref x) / ring_lsum x =
            exp (s k) / \sum_(0 <= k' < p * b) exp (s k').
Proof.
move=> ord_lt ord_inj l0 x k; rewrite /x (ring_fold_lsum expD) // (exp_shift expD).
rewrite div_cancel_l ?lt0r_neq0 //.
by rewrite (sum_blocks_reindex b (fun k => exp (s k)) ord_lt ord_inj).
Qed.

(** The instance on rank [r] of the ring, which holds block
    [(r + p - t) mod p] at step [t]. *)
Theorem ring_probabilities (p b r : nat) (s v : nat -> R) (refs : nat -> R)
  (x0 : ring_state R) :
  ring_lsum x0 = 0 ->
  let x := ring_fold exp b s v (fun t => ((r + p - t) %% p)%N) refs x0 p in
  forall k, exp (s k - ring_ref x) / ring_lsum x =
            exp (s k) / \sum_(0 <= k' < p * b) exp (s k').
Proof.
move=> l0; apply: ring_fold_probabilities => // [t tp|t u tp up].
  by apply: ring_order_lt; case: p tp.
exact: ring_order_inj.
Qed.
End RingProbabilities.

(** ** The row sum [D]. *)

(** [D = sum_h dO_h * Out_h], where [Out_h = sum_k P_k * V_(k,h)] is the
    forward output, is [sum_k P_k * dP_k] with [dP_k = sum_h dO_h * V_(k,h)]
    (exchange of the two finite sums). *)
Lemma softmax_backward_rowsum {R : comRingType} (n H : nat) (P : nat -> R)
  (V : nat -> nat -> R) (dO Out : nat -> R) :
  (forall h, (h < H)%N -> Out h = \sum_(0 <= k < n) P k * V k h) ->
  \sum_(0 <= h < H) dO h * Out h = \sum_(0 <= k < n) P k * \sum_(0 <= h < H) dO h * V k h.
Proof.
move=> hOut; transitivity (\sum_(0 <= h < H) \sum_(0 <= k < n) dO h * (P k * V k h)).
  by apply: eq_big_nat => h /andP [_ hH]; rewrite hOut // mulr_sumr.
rewrite exchange_big; apply: eq_bigr => k _; rewrite mulr_sumr.
by apply: eq_bigr => h _; rewrite mulrCA.
Qed.

(** ** Ring attention backward: the facts the engine relies on.
    (1) K and V blocks passed to rank [r + 1] at every step are back at their
    owner after [p] steps; (2) a dK / dV accumulator travelling with its block
    arrives back at the owner holding the contributions of all [p] ranks;
    (3) the local dQ accumulator of rank [r] holds the terms of all [p] blocks;
    (4) the probabilities recomputed from the forward's final state
    [(ref, l)] are the softmax probabilities over all [p*b] keys;
    (5) [D = sum_h dO_h * O_h] is [sum_k P_k * dP_k]. *)
Theorem ring_attention_backward :
  (forall (T : Type) (p : nat) (B : nat -> T) (X : nat -> nat -> T),
     (0 < p)%N ->
     (forall r, (r < p)%N -> X 0%N r = B r) ->
     (forall t r, (r < p)%N -> X t.+1 r = X t ((r + p - 1) %% p)%N) ->
     forall r, (r < p)%N -> X p r = B r) /\
  (forall (R : zmodType) (p : nat) (c : nat -> nat -> R) (A : nat -> nat -> R),
     (0 < p)%N ->
     (forall r, (r < p)%N -> A 0%N r = 0) ->
     (forall t r, (r < p)%N -> A t.+1 r =
        let q := ((r + p - 1) %% p)%N in A t q + c q ((q + p - t) %% p)%N) ->
     forall r, (r < p)%N -> A p r = \sum_(0 <= r' < p) c r' r) /\
  (forall (R : zmodType) (p r : nat) (g : nat -> R) (Q : nat -> R),
     (0 < p)%N ->
     Q 0%N = 0 -> (forall t, Q t.+1 = Q t + g ((r + p - t) %% p)%N) ->
     Q p = \sum_(0 <= b < p) g b) /\
  (forall (R : realFieldType) (exp : R -> R),
     (forall a c, exp (a + c) = exp a * exp c) ->
     (forall a, 0 < exp a) ->
     forall (p b r : nat) (s v : nat -> R) (refs : nat -> R) (x0 : ring_state R),
     ring_lsum x0 = 0 ->
     let x := ring_fold exp b s v (fun t => ((r + p - t) %% p)%N) refs x0 p in
     forall k, exp (s k - ring_ref x) / ring_lsum x =
               exp (s k) / \sum_(0 <= k' < p * b) exp (s k')) /\
  (forall (R : comRingType) (n H : nat) (P : nat -> R) (V : nat -> nat -> R)
     (dO Out : nat -> R),
     (forall h, (h < H)%N -> Out h = \sum_(0 <= k < n) P k * V k h) ->
     \sum_(0 <= h < H) dO h * Out h =
     \sum_(0 <= k < n) P k * \sum_(0 <= h < H) dO h * V k h).
Proof.
split; first exact: ring_pass_block_home.
split.
  move=> R p c A p0 A0 AS; exact: (ring_travelling_sum p0 A0 AS).
split.
  move=> R p r g Q p0 Q0 QS; exact: (ring_local_sum p0 Q0 QS).
split; first exact: ring_probabilities.
move=> R n H P V dO Out hOut; exact: softmax_backward_rowsum.
Qed.
