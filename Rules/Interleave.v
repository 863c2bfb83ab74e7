(** * Interleave: a fused tensor sharded per part (a fused [w_qkv], gate / up merged).

    Rank [r] of [p] holds its block of each of the [k] parts of a fused dim: [[Wq_r; Wk_r; Wv_r]].
    That is the plain Shard of the interleaved tensor: the dim (size [k*p*n]) read as [k; p; n],
    the first two swapped, read back as [p*k*n] -- row-major, position [flat [p;k;n] [r;i;t]] of
    the result reads position [flat [k;p;n] [i;r;t]] of [E] ([interleave_at]; the binding layout
    reshape / transpose / reshape a trace spec writes).

    [split_interleaved_shard]: chunk [i] of rank [r]'s block is block [r] of chunk [i] of [E]
    (Shard of the logical part).  [concat_interleaved_shard]: the parts' shards concatenated on the
    rank are the shard of the interleave of the logical concatenation.  [interleave_commutes]: the
    interleave is a reindexing of one dim, and a reindexing of one dim commutes with every op that
    reads that dim index by index: a matmul's column (rhs) or row (lhs), a pointwise op, a permute
    (the dim moves) and a row-major reshape that keeps the dim whole with the same element count
    before it ([flat_cat]: the dim's index enters the flat index only through its own term). *)
From mathcomp Require Import all_ssreflect all_algebra.
From TVCert Require Import Semantics Layout LayoutReal Matmul.
Set Implicit Arguments.
Unset Strict Implicit.
Unset Printing Implicit Defensive.

Definition interleave {I V : Type} (k p n : nat) (E : nat -> I -> V) : nat -> I -> V :=
  fun j x => E ((j %/ n) %% k * (p * n) + (j %/ (k * n)) * n + j %% n)%N x.

Lemma part_lt (k n i t : nat) : i < k -> t < n -> i * n + t < k * n.
Proof.
move=> ik tn; apply: (@leq_trans (i * n + n)); first by rewrite ltn_add2l.
by rewrite addnC -mulSn leq_mul2r ik orbT.
Qed.

Lemma interleave_index (k n r i t : nat) : i < k -> t < n ->
  [/\ (r * (k * n) + (i * n + t)) %/ (k * n) = r, ((r * (k * n) + (i * n + t)) %/ n) %% k = i
    & (r * (k * n) + (i * n + t)) %% n = t].
Proof.
move=> ik tn.
have n0 : 0 < n by apply: leq_ltn_trans tn.
have it := part_lt ik tn.
have kn0 : 0 < k * n by apply: leq_ltn_trans it.
have e : r * (k * n) + (i * n + t) = (r * k + i) * n + t by rewrite mulnA addnA mulnDl.
split.
- by rewrite divnMDl // divn_small // addn0.
- by rewrite e divnMDl // divn_small // addn0 modnMDl modn_small.
- by rewrite e modnMDl modn_small.
Qed.

Lemma interleave_block {I V : Type} (k p n : nat) (E : nat -> I -> V) r i t x :
  i < k -> t < n ->
  interleave k p n E (r * (k * n) + (i * n + t)) x = E (i * (p * n) + (r * n + t)) x.
Proof.
move=> ik tn; have [d1 d2 d3] := interleave_index r ik tn.
by rewrite /interleave d1 d2 d3 addnA.
Qed.

(** Row-major: the interleave reads [E] at [flat [k;p;n] [i;r;t]] from [flat [p;k;n] [r;i;t]]. *)
Lemma interleave_at {I V : Type} (k p n : nat) (E : nat -> I -> V) r i t x :
  i < k -> t < n ->
  interleave k p n E (flat [:: p; k; n] [:: r; i; t]) x = E (flat [:: k; p; n] [:: i; r; t]) x.
Proof.
move=> ik tn; rewrite /flat !big_cons !big_nil !muln1 !addn0; exact: interleave_block.
Qed.

Theorem split_interleaved_shard {I V : Type} (k p n : nat) (E : nat -> I -> V) (L : nat -> nat -> I -> V) :
  shard p (k * n) (interleave k p n E) L ->
  forall i, i < k -> shard p n (fun u x => E (i * (p * n) + u) x) (fun r t x => L r (i * n + t) x).
Proof.
move=> h i ik r t x rp tn.
have it := part_lt ik tn.
by rewrite h // interleave_block.
Qed.

Theorem concat_interleaved_shard {I V : Type} (k p n : nat) (E : nat -> nat -> I -> V)
  (L : nat -> nat -> nat -> I -> V) :
  (forall i, i < k -> shard p n (E i) (L i)) ->
  shard p (k * n) (interleave k p n (fun u x => E (u %/ (p * n)) (u %% (p * n)) x))
    (fun r j x => L (j %/ n) r (j %% n) x).
Proof.
move=> h r j x rp jl.
have n0 : 0 < n by rewrite lt0n; apply/eqP => n0; move: jl; rewrite n0 muln0.
have ik : j %/ n < k by rewrite ltn_divLR // mulnC.
have tn : j %% n < n by rewrite ltn_mod.
have rt := part_lt rp tn.
have -> : r * (k * n) + j = r * (k * n) + (j %/ n * n + j %% n) by rewrite -divn_eq.
rewrite interleave_block // h //.
have pn0 : 0 < p * n by apply: leq_ltn_trans rt.
by rewrite divnMDl // (divn_small rt) addn0 modnMDl (modn_small rt).
Qed.

Import GRing.Theory.

Theorem interleave_commutes :
  (* a matmul's column reads the rhs's column, its row the lhs's row *)
  (forall (R : ringType) (K : nat) (A B : nat -> nat -> R) (sigma : nat -> nat) i j,
     matmul K A (fun c j' => B c (sigma j')) i j = matmul K A B i (sigma j) /\
     matmul K (fun i' c => A (sigma i') c) B i j = matmul K A B (sigma i) j) /\
  (* a pointwise op of laid-out operands is the laid-out pointwise op *)
  (forall (Kt V W : Type) (f : (Kt -> V) -> W) (x : Kt -> nat -> V) (sigma : nat -> nat) j,
     (fun j' => f (fun k => x k j')) (sigma j) = f (fun k => x k (sigma j))) /\
  (* a permute moves the reindexed dim: input coordinate [d] is read at output coordinate [pinv d]
     ([Layout.permute]: output [o] reads input [o \o pinv]) *)
  (forall (pinv sigma o : nat -> nat) (d : nat), injective pinv -> forall m,
     (if m == d then sigma (o (pinv m)) else o (pinv m))
     = (fun m' => if m' == pinv d then sigma (o m') else o m') (pinv m)) /\
  (* a row-major reshape keeping the dim whole reads it through its own term of the flat index *)
  (forall (a b ia ib : seq nat) (N j : nat), size ia = size a ->
     flat (a ++ N :: b) (ia ++ j :: ib) = flat a ia * (N * \prod_(m <- b) m) + (j * \prod_(m <- b) m + flat b ib)) /\
  (* the interleave is that reindexing, by a block of each part per rank *)
  (forall (I V : Type) (k p n : nat) (E : nat -> I -> V) r i t x, i < k -> t < n ->
     interleave k p n E (r * (k * n) + (i * n + t)) x = E (i * (p * n) + (r * n + t)) x).
Proof.
split; first by move=> R K A B sigma i j; split.
split; first by [].
split; first by move=> pinv sigma o d inj m /=; rewrite (inj_eq inj).
split; last by move=> *; apply: interleave_block.
by move=> a b ia ib N j sz; rewrite flat_cat //= big_cons.
Qed.
