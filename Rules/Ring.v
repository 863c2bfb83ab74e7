(** * Ring attention: online softmax folded over a ring of key blocks. *)
From mathcomp Require Import all_ssreflect all_algebra.
From TVCert Require Import Semantics Composite.
Set Implicit Arguments.
Unset Strict Implicit.
Unset Printing Implicit Defensive.
Import GRing.Theory Num.Theory.
Local Open Scope ring_scope.

(** ** Reindexing a sum by an injection of [[0,p)] into itself. *)

(** A sum over [[0,p)] is unchanged when the summand is read through an
    [order] that maps [[0,p)] injectively into [[0,p)] (a permutation). *)
Lemma sum_reindex_inj {R : zmodType} (p : nat) (order : nat -> nat) (F : nat -> R) :
  (forall t, (t < p)%N -> (order t < p)%N) ->
  (forall t u, (t < p)%N -> (u < p)%N -> order t = order u -> t = u) ->
  \sum_(0 <= j < p) F (order j) = \sum_(0 <= r < p) F r.
Proof.
move=> ord_lt ord_inj; rewrite !big_mkord.
pose h (j : 'I_p) : 'I_p := Ordinal (ord_lt j (ltn_ord j)).
have h_inj : injective h by move=> j k /(congr1 val) /= /ord_inj e; apply/val_inj/e.
by rewrite [RHS](reindex_inj h_inj).
Qed.

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
