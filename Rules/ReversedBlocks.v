(** * Rank-reversed blocks: rank [r] works on block [p-1-r] of a replicated tensor
    ([kernel/reversed_blocks.py]).

    The rank's slice [[(p-1-r)*b, (p-r)*b)] of a replicated [E] is the plain Shard of the
    block-reversed tensor [rev_blocks p b E]: the dim (size [p*b]) read as [[p; b]], the [p]
    factor flipped, read back ([rev_blocks_at]: the layout chain reshape / flip / reshape the
    engine spells).  [slice_reversed_block_to_shard] is that fact for any block permutation
    [pi] (the engine uses [pi r = p-1-r], the one rank-affine permutation besides the identity).

    [reversed_blocks_commute]: the reversal is a reindexing of one dim, so it commutes with the
    ops that read that dim index by index (the commuting clauses of [Interleave.interleave_commutes],
    restated for this reindexing); it is an involution (gathering the blocks and flipping them over
    the ranks undoes it); and a contraction whose dim is reversed in both operands is the
    contraction of the unreversed operands (a sum is invariant under a bijection of its index). *)
From mathcomp Require Import all_ssreflect all_algebra.
From TVCert Require Import Semantics LayoutReal Matmul Interleave.
Set Implicit Arguments.
Unset Strict Implicit.
Unset Printing Implicit Defensive.

(** Rows [pi q]'s block of [E] placed as block [q]. *)
Definition perm_blocks {I V : Type} (pi : nat -> nat) (b : nat) (E : nat -> I -> V) : nat -> I -> V :=
  fun u x => E (pi (u %/ b) * b + u %% b)%N x.

(** The block reversal: block [q] of the result is block [p-1-q] of [E]. *)
Definition rev_blocks {I V : Type} (p b : nat) (E : nat -> I -> V) : nat -> I -> V :=
  perm_blocks (fun q => p - q.+1) b E.

Lemma block_index (b r t : nat) : t < b -> (r * b + t) %/ b = r /\ (r * b + t) %% b = t.
Proof.
move=> tb; have b0 : 0 < b by apply: leq_ltn_trans tb.
by rewrite divnMDl // divn_small // addn0 modnMDl modn_small.
Qed.

Lemma perm_blocks_block {I V : Type} (pi : nat -> nat) (b : nat) (E : nat -> I -> V) r t x :
  t < b -> perm_blocks pi b E (r * b + t) x = E (pi r * b + t) x.
Proof. by move=> tb; have [d m] := block_index r tb; rewrite /perm_blocks d m. Qed.

(** Row-major: position [flat [p; b] [q; t]] of the reversal reads position [flat [p; b] [p-1-q; t]]
    of [E] (reshape to [[p; b]], flip the first dim, reshape back). *)
Lemma rev_blocks_at {I V : Type} (p b : nat) (E : nat -> I -> V) q t x :
  t < b -> rev_blocks p b E (flat [:: p; b] [:: q; t]) x = E (flat [:: p; b] [:: p - q.+1; t]) x.
Proof.
by move=> tb; rewrite /flat !big_cons !big_nil !muln1 !addn0 /rev_blocks perm_blocks_block.
Qed.

(** A slice at the rank-dependent offset [pi r * b] of a replicated tensor is the Shard of the
    block-permuted tensor. *)
Theorem slice_permuted_block_to_shard {I V : Type} (pi : nat -> nat) (p b : nat) (E : nat -> I -> V)
  (LR : nat -> nat -> I -> V) :
  (forall r i x, r < p -> LR r i x = E i x) ->
  shard p b (perm_blocks pi b E) (fun r i => LR r (pi r * b + i)).
Proof. by move=> h r i x rp ib; rewrite h // perm_blocks_block. Qed.

Theorem slice_reversed_block_to_shard {I V : Type} (p b : nat) (E : nat -> I -> V)
  (LR : nat -> nat -> I -> V) :
  (forall r i x, r < p -> LR r i x = E i x) ->
  shard p b (rev_blocks p b E) (fun r i => LR r ((p - r.+1) * b + i)).
Proof. exact: (@slice_permuted_block_to_shard I V (fun q => p - q.+1)). Qed.

(** The reversal of a block index stays in range and is an involution there. *)
Lemma rev_lt (p q : nat) : q < p -> p - q.+1 < p.
Proof. by move=> qp; rewrite -subSn // subSS leq_subr. Qed.

Lemma rev_rev (p q : nat) : q < p -> p - (p - q.+1).+1 = q.
Proof. by move=> qp; rewrite -subSn // subSS subKn // ltnW. Qed.

Lemma rev_blocks_involutive {I V : Type} (p b : nat) (E : nat -> I -> V) u x :
  u < p * b -> rev_blocks p b (rev_blocks p b E) u x = E u x.
Proof.
move=> up; have b0 : 0 < b by rewrite lt0n; apply/eqP => b0; move: up; rewrite b0 muln0.
have qp : u %/ b < p by rewrite ltn_divLR // mulnC.
have tb : u %% b < b by rewrite ltn_mod.
rewrite {1}(divn_eq u b) /rev_blocks perm_blocks_block // perm_blocks_block //=.
by rewrite rev_rev // -divn_eq.
Qed.

Import GRing.Theory.
Local Open Scope ring_scope.

(** A sum over [p*b] indices read through the block reversal is the plain sum. *)
Lemma sum_rev_blocks {R : zmodType} (p b : nat) (F : nat -> R) :
  \sum_(0 <= k < p * b) F ((p - (k %/ b).+1) * b + k %% b)%N = \sum_(0 <= k < p * b) F k.
Proof.
rewrite !sum_blocks big_nat_rev /=; apply: eq_big_nat => r /andP[_ rp].
rewrite add0n; apply: eq_big_nat => t /andP[_ tb].
by have [-> ->] := block_index (p - r.+1) tb; rewrite rev_rev.
Qed.

Theorem reversed_blocks_commute :
  (* a matmul's column reads the rhs's column, its row the lhs's row *)
  (forall (R : ringType) (K : nat) (A B : nat -> nat -> R) (sigma : nat -> nat) i j,
     matmul K A (fun c j' => B c (sigma j')) i j = matmul K A B i (sigma j) /\
     matmul K (fun i' c => A (sigma i') c) B i j = matmul K A B (sigma i) j) /\
  (* a pointwise op of laid-out operands is the laid-out pointwise op *)
  (forall (Kt V W : Type) (f : (Kt -> V) -> W) (x : Kt -> nat -> V) (sigma : nat -> nat) j,
     (fun j' => f (fun k => x k j')) (sigma j) = f (fun k => x k (sigma j))) /\
  (* a permute moves the reindexed dim *)
  (forall (pinv sigma o : nat -> nat) (d : nat), injective pinv -> forall m,
     (if m == d then sigma (o (pinv m)) else o (pinv m))
     = (fun m' => if m' == pinv d then sigma (o m') else o m') (pinv m)) /\
  (* a row-major reshape keeping the dim whole reads it through its own term of the flat index *)
  (forall (a b ia ib : seq nat) (N j : nat), size ia = size a ->
     flat (a ++ N :: b) (ia ++ j :: ib) = flat a ia * (N * \prod_(m <- b) m) + (j * \prod_(m <- b) m + flat b ib))%N /\
  (* the reversal is that reindexing, block q reading block p-1-q, and it undoes itself *)
  (forall (I V : Type) (p b : nat) (E : nat -> I -> V) q t x, t < b ->
     rev_blocks p b E (q * b + t) x = E ((p - q.+1) * b + t) x)%N /\
  (forall (I V : Type) (p b : nat) (E : nat -> I -> V) u x, u < p * b ->
     rev_blocks p b (rev_blocks p b E) u x = E u x)%N /\
  (* a contraction over a dim reversed in both operands is the contraction of the operands *)
  (forall (R : ringType) (p b : nat) (A B : nat -> nat -> R) i j,
     matmul (p * b) (fun i' c => rev_blocks p b (fun c' (_ : unit) => A i' c') c tt)
                    (fun c j' => rev_blocks p b (fun c' (_ : unit) => B c' j') c tt) i j
     = matmul (p * b) A B i j).
Proof.
have [h1 [h2 [h3 [h4 _]]]] := interleave_commutes.
split; first exact: h1.
split; first exact: h2.
split; first exact: h3.
split; first exact: h4.
split; first by move=> I V p b E q t x tb; exact: perm_blocks_block.
split; first by move=> I V p b E u x; exact: rev_blocks_involutive.
move=> R p b A B i j; rewrite /matmul /rev_blocks /perm_blocks.
exact: (sum_rev_blocks p b (fun c => A i c * B c j)).
Qed.
