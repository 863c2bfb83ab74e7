(** * ConcatGroups: a fused tensor of parts of different sizes sharded per part (a GQA [w_qkv]).

    Rank [r] of [p] holds its block of each part of a fused dim whose parts have per-rank sizes
    [ns] (query heads, then kv heads): [[Wq_r; Wk_r; Wv_r]].  That is the plain Shard of
    [concat_groups ns p E]: position [r * N + off i + t] (N = sumn ns, off i = n_0 + .. + n_(i-1),
    t < n_i) reads position [p * off i + r * n_i + t] of [E] ([concat_groups_at];
    kernel/concat_groups.py's layout, spelled there as split / reshape / concat / reshape).

    [split_grouped_shard]: part [i] of rank [r]'s block is block [r] of part [i] of [E] (Shard of
    the logical part).  [concat_grouped_shard]: the parts' shards concatenated on the rank are the
    shard of the grouped layout of the logical concatenation.  [concat_groups_commutes]: like the
    interleave it is a reindexing of one dim, and reindexing one dim commutes with the ops that read
    it index by index ([Interleave.interleave_commutes]'s clauses). *)
From mathcomp Require Import all_ssreflect all_algebra.
From TVCert Require Import Semantics Layout LayoutReal Matmul Interleave.
Set Implicit Arguments.
Unset Strict Implicit.
Unset Printing Implicit Defensive.

(** Offset of part [i] within a rank's block. *)
Definition off (ns : seq nat) (i : nat) : nat := sumn (take i ns).

(** The logical position that position [u] of rank [r]'s block reads. *)
Fixpoint src (ns : seq nat) (p r u : nat) : nat :=
  match ns with
  | [::] => 0
  | n :: ns' => if u < n then r * n + u else p * n + src ns' p r (u - n)
  end.

Definition concat_groups {I V : Type} (ns : seq nat) (p : nat) (E : nat -> I -> V) : nat -> I -> V :=
  fun j x => E (src ns p (j %/ sumn ns) (j %% sumn ns)) x.

Lemma src_at (ns : seq nat) (p r i t : nat) : i < size ns -> t < nth 0 ns i ->
  src ns p r (off ns i + t) = p * off ns i + (r * nth 0 ns i + t).
Proof.
elim: ns i => [|n ns IH] [|i] //= ilt tlt; rewrite /off /=.
- by rewrite add0n tlt muln0 add0n.
- rewrite -/(off ns i) -addnA ltnNge leq_addr /= addKn IH //.
  by rewrite mulnDr -!addnA.
Qed.

Lemma off_lt (ns : seq nat) (i t : nat) : i < size ns -> t < nth 0 ns i -> off ns i + t < sumn ns.
Proof.
elim: ns i => [|n ns IH] [|i] //= ilt tlt; rewrite /off /=.
- by rewrite add0n; apply: (leq_trans tlt); rewrite leq_addr.
- by rewrite -/(off ns i) -addnA ltn_add2l IH.
Qed.

Lemma decomp (ns : seq nat) (j : nat) : j < sumn ns ->
  exists i t, [/\ i < size ns, t < nth 0 ns i & j = off ns i + t].
Proof.
elim: ns j => [|n ns IH] j //= jlt.
case: (ltnP j n) => jn.
- by exists 0, j; rewrite /off /= add0n.
- have [i [t [il tl e]]] : exists i t, [/\ i < size ns, t < nth 0 ns i & j - n = off ns i + t].
    by apply: IH; rewrite ltn_subLR.
  exists i.+1, t; split=> //; rewrite /off /= -/(off ns i) -addnA -e.
  by rewrite subnKC.
Qed.

Lemma block_lt (p n r t : nat) : r < p -> t < n -> r * n + t < p * n.
Proof. exact: part_lt. Qed.

Lemma concat_groups_at {I V : Type} (ns : seq nat) (p : nat) (E : nat -> I -> V) r i t x :
  i < size ns -> t < nth 0 ns i ->
  concat_groups ns p E (r * sumn ns + (off ns i + t)) x = E (p * off ns i + (r * nth 0 ns i + t)) x.
Proof.
move=> il tl; have ot := off_lt il tl.
have N0 : 0 < sumn ns by apply: leq_ltn_trans ot.
by rewrite /concat_groups divnMDl // (divn_small ot) addn0 modnMDl (modn_small ot) src_at.
Qed.

Theorem split_grouped_shard {I V : Type} (ns : seq nat) (p : nat) (E : nat -> I -> V) (L : nat -> nat -> I -> V) :
  shard p (sumn ns) (concat_groups ns p E) L ->
  forall i, i < size ns ->
    shard p (nth 0 ns i) (fun u x => E (p * off ns i + u) x) (fun r t x => L r (off ns i + t) x).
Proof.
move=> h i il r t x rp tl.
by rewrite h // ?off_lt // concat_groups_at.
Qed.

(** [C] is the logical concatenation of the parts [Es i] (part [i] at offset [p * off ns i]), [L]
    the rank's concatenation of their local blocks [Ls i] (at offset [off ns i]). *)
Theorem concat_grouped_shard {I V : Type} (ns : seq nat) (p : nat) (C : nat -> I -> V)
  (L : nat -> nat -> I -> V) (Es : nat -> nat -> I -> V) (Ls : nat -> nat -> nat -> I -> V) :
  (forall i, i < size ns -> shard p (nth 0 ns i) (Es i) (Ls i)) ->
  (forall i u x, i < size ns -> u < p * nth 0 ns i -> C (p * off ns i + u) x = Es i u x) ->
  (forall i r t x, i < size ns -> t < nth 0 ns i -> L r (off ns i + t) x = Ls i r t x) ->
  shard p (sumn ns) (concat_groups ns p C) L.
Proof.
move=> hs hc hl r j x rp jl.
have [i [t [il tl ->]]] := decomp jl.
by rewrite hl // hs // concat_groups_at // hc // block_lt.
Qed.

Import GRing.Theory.

Theorem concat_groups_commutes :
  (* the reindexing clauses of the interleave's equality step: matmul row / column, pointwise,
     permute, a reshape keeping the dim whole *)
  ((forall (R : ringType) (K : nat) (A B : nat -> nat -> R) (sigma : nat -> nat) i j,
     matmul K A (fun c j' => B c (sigma j')) i j = matmul K A B i (sigma j) /\
     matmul K (fun i' c => A (sigma i') c) B i j = matmul K A B (sigma i) j) /\
   (forall (Kt V W : Type) (f : (Kt -> V) -> W) (x : Kt -> nat -> V) (sigma : nat -> nat) j,
     (fun j' => f (fun k => x k j')) (sigma j) = f (fun k => x k (sigma j))) /\
   (forall (pinv sigma o : nat -> nat) (d : nat), injective pinv -> forall m,
     (if m == d then sigma (o (pinv m)) else o (pinv m))
     = (fun m' => if m' == pinv d then sigma (o m') else o m') (pinv m)) /\
   (forall (a b ia ib : seq nat) (N j : nat), size ia = size a ->
     flat (a ++ N :: b) (ia ++ j :: ib) = flat a ia * (N * \prod_(m <- b) m) + (j * \prod_(m <- b) m + flat b ib))) /\
  (* the grouped layout is that reindexing, by a block of each part per rank *)
  (forall (I V : Type) (ns : seq nat) (p : nat) (E : nat -> I -> V) r i t x, i < size ns -> t < nth 0 ns i ->
     concat_groups ns p E (r * sumn ns + (off ns i + t)) x = E (p * off ns i + (r * nth 0 ns i + t)) x).
Proof.
have [c1 [c2 [c3 [c4 _]]]] := interleave_commutes.
split; first by split; [exact: c1 | split; [exact: c2 | split; [exact: c3 | exact: c4]]].
by move=> *; apply: concat_groups_at.
Qed.
