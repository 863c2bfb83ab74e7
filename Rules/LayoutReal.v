(** * LayoutReal: reshapes of sharded tensors, on logical shapes (row-major index arithmetic).

    A reshape reads the same row-major storage under another shape.  It maps dims group by
    group (minimal runs of input and output dims with equal products, [flat_cat]), so a group is
    modelled here with its flat storage [E : nat -> I -> V] (the dims outside it in [I]) and
    read through [view ns], the row-major view of that storage with sizes [ns].

    [reshape_shard_rowmajor]: if the sharded dim heads its input group (block [b] of [p*b], the
    rest of the group [rin]) and the output group is headed by [p*c] (rest [rout]), the rank's
    local reshape (the same local storage read with sizes [c :: rout]) is Shard of the leading
    output dim with block [c].  Size-1 dims heading a group read coordinate 0 and change no flat
    index ([flat_unit]), so the rule skips them on either side; a shard holding one head
    ([c = 1]: local [.., 1, HD]) is the case [c = 1].  Nested shards over two axes are one shard
    with [p = p1 * p2] ([reshape_shard_nested]).  A sharded dim that does not head its group
    interleaves the ranks ([reshape_shard_interleaved_differs]).

    [pad_block_to_partial]: padding rank [r]'s block of a shard back to its place (zeros
    before [r*b] and after [r*b + b]: the backward of a rank slicing its block, or a shard padded
    to the full size before a reduction) gives Partial(sum) of the logical tensor.

    [allgather_other_dim]: all_gather along dim [g] of a shard of dim [d] stacks the blocks
    along [g]: the result reads [E] at ((k / n) * b + i, k mod n), the layout "split d into
    (p, b), move p in front of g, merge". *)
From mathcomp Require Import all_ssreflect all_algebra.
From TVCert Require Import Semantics.
Set Implicit Arguments.
Unset Strict Implicit.
Unset Printing Implicit Defensive.

(** Row-major flat index of the multi-index [ix] over sizes [ns]. *)
Fixpoint flat (ns ix : seq nat) : nat :=
  match ns, ix with
  | _ :: ns', i :: ix' => i * \prod_(m <- ns') m + flat ns' ix'
  | _, _ => 0
  end.

(** [ix] is a multi-index in bounds of [ns]. *)
Fixpoint inb (ns ix : seq nat) : bool :=
  match ns, ix with
  | n :: ns', i :: ix' => (i < n) && inb ns' ix'
  | [::], [::] => true
  | _, _ => false
  end.

(** The row-major view with sizes [ns] of flat storage [E]. *)
Definition view {I V : Type} (ns : seq nat) (E : nat -> I -> V) : seq nat -> I -> V :=
  fun ix x => E (flat ns ix) x.

Lemma flat_lt ns ix : inb ns ix -> flat ns ix < \prod_(m <- ns) m.
Proof.
elim: ns ix => [|n ns IH] [|i ix] //=; first by rewrite big_nil.
case/andP=> lt /IH h; rewrite big_cons.
apply: (@leq_trans (i * \prod_(m <- ns) m + \prod_(m <- ns) m)); first by rewrite ltn_add2l.
by rewrite addnC -mulSn leq_mul2r lt orbT.
Qed.

(** Every flat index in range is the flat index of a multi-index in bounds. *)
Lemma flat_onto ns k : k < \prod_(m <- ns) m -> exists ix, inb ns ix /\ flat ns ix = k.
Proof.
elim: ns k => [|n ns IH] k.
  by rewrite big_nil ltnS leqn0 => /eqP->; exists [::].
rewrite big_cons => lt.
have P0 : 0 < \prod_(m <- ns) m.
  by rewrite lt0n; apply/eqP => P0; move: lt; rewrite P0 muln0.
have [ix [inis fl]] := IH (k %% \prod_(m <- ns) m) (ltn_pmod k P0).
exists (k %/ \prod_(m <- ns) m :: ix); split => /=.
  by rewrite inis andbT ltn_divLR.
by rewrite fl -divn_eq.
Qed.

(** Row-major over concatenated shapes: a reshape acts group by group. *)
Lemma flat_cat a b ia ib : size ia = size a ->
  flat (a ++ b) (ia ++ ib) = flat a ia * \prod_(m <- b) m + flat b ib.
Proof.
elim: a ia => [|n a IH] [|i ia] //= [sz].
by rewrite IH // big_cat /= mulnDl mulnA addnA.
Qed.

(** A size-1 dim heading a group is read at coordinate 0 and adds nothing to the flat index. *)
Lemma flat_unit ns i ix : inb (1 :: ns) (i :: ix) -> i = 0 /\ flat (1 :: ns) (i :: ix) = flat ns ix.
Proof. by move=> /= /andP[]; rewrite ltnS leqn0 => /eqP-> _; split. Qed.

Theorem reshape_shard_rowmajor {I V : Type} (p b c : nat) (rin rout : seq nat)
  (E : nat -> I -> V) (L : nat -> nat -> I -> V) :
  b * \prod_(m <- rin) m = c * \prod_(m <- rout) m ->
  (forall r i ix x, r < p -> i < b -> inb rin ix ->
     view (b :: rin) (L r) (i :: ix) x = view (p * b :: rin) E (r * b + i :: ix) x) ->
  forall r j js x, r < p -> j < c -> inb rout js ->
     view (c :: rout) (L r) (j :: js) x = view (p * c :: rout) E (r * c + j :: js) x.
Proof.
move=> eq h r j js x rp jc injs; rewrite /view /=.
have kl : j * \prod_(m <- rout) m + flat rout js < \prod_(m <- b :: rin) m.
  rewrite big_cons eq.
  by have := @flat_lt (c :: rout) (j :: js); rewrite /= jc injs big_cons; apply.
have [[|i ix] [inis fl]] := flat_onto kl; first by [].
move: inis => /= /andP[ib inis].
move: fl => /= fl.
have := h r i ix x rp ib inis; rewrite /view /= fl => ->.
congr E.
by rewrite !mulnDl -!addnA -!mulnA fl eq.
Qed.

(** Nested shards over two axes (outer [p1], inner [p2], mesh order) are the shard of the
    flattened rank [r1 * p2 + r2] over [p1 * p2] ranks. *)
Corollary reshape_shard_nested {I V : Type} (p1 p2 b c : nat) (rin rout : seq nat)
  (E : nat -> I -> V) (L : nat -> nat -> nat -> I -> V) :
  b * \prod_(m <- rin) m = c * \prod_(m <- rout) m ->
  (forall r1 r2 i ix x, r1 < p1 -> r2 < p2 -> i < b -> inb rin ix ->
     view (b :: rin) (L r1 r2) (i :: ix) x = view (p1 * p2 * b :: rin) E ((r1 * p2 + r2) * b + i :: ix) x) ->
  forall r1 r2 j js x, r1 < p1 -> r2 < p2 -> j < c -> inb rout js ->
     view (c :: rout) (L r1 r2) (j :: js) x = view (p1 * p2 * c :: rout) E ((r1 * p2 + r2) * c + j :: js) x.
Proof.
move=> eq h r1 r2 j js x r1p r2p jc injs.
have rp : r1 * p2 + r2 < p1 * p2.
  apply: (@leq_trans (r1 * p2 + p2)); first by rewrite ltn_add2l.
  by rewrite addnC -mulSn leq_mul2r r1p orbT.
pose L' r := L (r %/ p2) (r %% p2).
have P2 : 0 < p2 by apply: (leq_ltn_trans _ r2p).
have key : forall r, r < p1 * p2 -> r = r %/ p2 * p2 + r %% p2 by move=> r _; apply: divn_eq.
have h' : forall r i ix x, r < p1 * p2 -> i < b -> inb rin ix ->
    view (b :: rin) (L' r) (i :: ix) x = view (p1 * p2 * b :: rin) E (r * b + i :: ix) x.
  move=> r i ix y rl ib inis; rewrite /L' {3}(key r rl).
  by apply: h => //; rewrite ?ltn_divLR ?ltn_pmod.
have := @reshape_shard_rowmajor I V (p1 * p2) b c rin rout E L' eq h' _ j js x rp jc injs.
by rewrite /L' divnMDl // divn_small // addn0 modnMDl modn_small.
Qed.

(** The falsifier: merging [2 x 4] sharded on dim 1 (not heading its group) over 2 ranks into
    [8] gives rank 0 the flat elements 0, 1, 4, 5, not the block 0 .. 3 of Shard(0). *)
Theorem reshape_shard_interleaved_differs :
  let E := fun k : nat => k in
  let L0 := fun k : nat => E (flat [:: 2; 4] [:: k %/ 2; k %% 2]) in
  L0 2 = 4 /\ E (0 * 4 + 2) = 2 /\ L0 2 <> E (0 * 4 + 2).
Proof. by rewrite /= !big_cons !big_nil. Qed.

(** ** Rank-dependent pad: a block put back at its place. *)
Definition embed_block {I : Type} {V : zmodType} (b r : nat) (Lr : nat -> I -> V) : nat -> I -> V :=
  fun k x => if (r * b <= k)%N && (k < r * b + b)%N then Lr (k - r * b)%N x else 0%R.

Lemma block_index (b r k : nat) : (r * b <= k)%N -> (k < r * b + b)%N -> k %/ b = r /\ (k - r * b < b)%N.
Proof.
move=> lo hi.
have lt : (k - r * b < b)%N by rewrite -(ltn_add2l (r * b)) (subnKC lo).
have b0 : (0 < b)%N by apply: leq_ltn_trans lt.
by split => //; rewrite -{1}(subnKC lo) divnMDl // divn_small ?addn0.
Qed.

Import GRing.Theory.
Local Open Scope ring_scope.

Theorem pad_block_to_partial {I : Type} {V : zmodType} (p b : nat)
  (E : nat -> I -> V) (L : nat -> nat -> I -> V) :
  shard p b E L ->
  forall k x, (k < p * b)%N -> \sum_(0 <= r < p) embed_block b r (L r) k x = E k x.
Proof.
move=> h k x kl.
have b0 : (0 < b)%N by rewrite lt0n; apply/eqP => b0; move: kl; rewrite b0 muln0.
have r0p : (k %/ b < p)%N by rewrite ltn_divLR.
have hi0 : (k < k %/ b * b + b)%N by rewrite addnC -mulSn ltn_ceil.
rewrite big_mkord (bigD1 (Ordinal r0p)) //= big1 ?addr0 => [|[r rp] /= ne].
  rewrite /embed_block leq_trunc_div hi0 /=.
  have [_ lt] := block_index (leq_trunc_div k b) hi0.
  by rewrite h // (subnKC (leq_trunc_div k b)).
rewrite /embed_block; case: ifP => // /andP[lo hi].
have [q _] := block_index lo hi.
by move: ne; rewrite (_ : Ordinal rp = Ordinal r0p) ?eqxx //; apply: val_inj => /=.
Qed.

(** ** all_gather along another dim: blocks stacked along [g].
    The local tensor of rank [r] is indexed (dim d, dim g, rest); gathering along [g] over [p]
    ranks with local size [n] reads rank [k / n] at [k mod n]. *)
Definition all_gather_along {I V : Type} (n : nat) (L : nat -> nat -> nat -> I -> V) : nat -> nat -> I -> V :=
  fun i k x => L (k %/ n)%N i (k %% n)%N x.

Theorem allgather_other_dim {I V : Type} (p b n : nat) (E : nat -> nat -> I -> V)
  (L : nat -> nat -> nat -> I -> V) :
  (forall r i j x, (r < p)%N -> (i < b)%N -> L r i j x = E (r * b + i)%N j x) ->
  forall i k x, (i < b)%N -> (k < p * n)%N ->
    all_gather_along n L i k x = E ((k %/ n) * b + i)%N (k %% n)%N x.
Proof.
move=> h i k x ib kl.
have n0 : (0 < n)%N by rewrite lt0n; apply/eqP => n0; move: kl; rewrite n0 muln0.
by rewrite /all_gather_along h // ltn_divLR.
Qed.
