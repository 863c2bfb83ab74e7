(** * Layout: permute, reshape, slice, concat. *)
From Coq Require Import FunctionalExtensionality.
From mathcomp Require Import all_ssreflect all_algebra.
From TVCert Require Import Semantics.
Set Implicit Arguments.
Unset Strict Implicit.
Unset Printing Implicit Defensive.

(** ** Permute, on tensors of any rank.
    A multi-index is a function from dimension numbers to coordinates. *)
Definition upd (o : nat -> nat) (d v : nat) : nat -> nat :=
  fun k => if k == d then v else o k.

(** Shard(d) on a tensor of any rank. *)
Definition shard_dim {V : Type} (d p b : nat) (E : (nat -> nat) -> V)
  (L : nat -> (nat -> nat) -> V) : Prop :=
  forall r o, r < p -> o d < b -> L r o = E (upd o d (r * b + o d)).

(** [permute pinv E] is torch's [E.permute(perm)] where [pinv] is the inverse
    of [perm]: output dim [j] is input dim [perm j], so input dim [k] is read
    at output coordinate [pinv k]. *)
Definition permute {V : Type} (pinv : nat -> nat) (E : (nat -> nat) -> V)
  : (nat -> nat) -> V :=
  fun o => E (fun k => o (pinv k)).

Theorem permute_shard {V : Type} (perm pinv : nat -> nat) (d p b : nat)
  (E : (nat -> nat) -> V) (L : nat -> (nat -> nat) -> V) :
  cancel pinv perm -> shard_dim d p b E L ->
  shard_dim (pinv d) p b (permute pinv E) (fun r => permute pinv (L r)).
Proof.
move=> can h r o rp ob; rewrite /permute h //; congr E.
apply: functional_extensionality => k; rewrite /upd.
by rewrite (inj_eq (can_inj can)).
Qed.

(** ** Reshape. *)
(** Split the leading dim into [(_, m)]. *)
Definition split_dim {I V : Type} (m : nat) (E : nat -> I -> V) : nat -> nat -> I -> V :=
  fun i1 i2 x => E (i1 * m + i2) x.

(** Merge the two leading dims [(_, n2)] into one. *)
Definition merge_dims {I V : Type} (n2 : nat) (E : nat -> nat -> I -> V) : nat -> I -> V :=
  fun k x => E (k %/ n2) (k %% n2) x.

(** Splitting a dim of size [p*b*m] sharded in blocks [b*m] into [(p*b, m)]
    gives Shard of the leading output dim with blocks [b]; merging [(p*c, n2)]
    sharded on the leading dim in blocks [c] gives Shard with blocks [c*n2]. *)
Theorem reshape_shard_block {I V : Type} (p b m c n2 : nat)
  (E : nat -> I -> V) (L : nat -> nat -> I -> V)
  (F : nat -> nat -> I -> V) (LF : nat -> nat -> nat -> I -> V) :
  (shard p (b * m) E L ->
   forall r i1 i2 x, r < p -> i1 < b -> i2 < m ->
     split_dim m (L r) i1 i2 x = split_dim m E (r * b + i1) i2 x) /\
  (0 < n2 -> shard p c F LF ->
   shard p (c * n2) (merge_dims n2 F) (fun r => merge_dims n2 (LF r))).
Proof.
split.
  move=> h r i1 i2 x rp i1b i2m; rewrite /split_dim h //.
    by rewrite mulnDl addnA mulnA.
  by rewrite -ltn_divLR ?divnMDl ?divn_small ?addn0 // (leq_ltn_trans _ i2m).
move=> n0 h r k x rp kcn; rewrite /merge_dims h ?ltn_divLR //.
by rewrite mulnA divnMDl // modnMDl.
Qed.

(** The falsifier: reshaping a [2 x 3] tensor to [3 x 2] is not its
    transpose; a reshape-transpose swap without the compensating transpose
    changes the tensor. *)
Definition reshape2 {V : Type} (n_in n_out : nat) (E : nat -> nat -> V) : nat -> nat -> V :=
  fun i j => E ((i * n_out + j) %/ n_in) ((i * n_out + j) %% n_in).

Definition transpose {V : Type} (E : nat -> nat -> V) : nat -> nat -> V :=
  fun i j => E j i.

Theorem reshape_transpose_swap_differs :
  let E := fun i j : nat => i * 3 + j in
  reshape2 3 2 E 0 1 = 1 /\ transpose E 0 1 = 3 /\
  ~ (forall i j, i < 3 -> j < 2 -> reshape2 3 2 E i j = transpose E i j).
Proof. by split; [|split] => // /(_ 0 1 isT isT). Qed.

(** ** Slice and concat. *)
Theorem slice_other_dim {I V : Type} (p b s : nat) (E : nat -> nat -> I -> V)
  (L : nat -> nat -> nat -> I -> V) :
  shard p b E L ->
  shard p b (fun i k x => E i (s + k) x) (fun r i k x => L r i (s + k) x).
Proof. by move=> h r i k rp ib; rewrite h. Qed.

(** Rank [r] taking rows [[r*b, (r+1)*b)] of a replicated tensor holds Shard. *)
Theorem slice_block_to_shard {I V : Type} (p b : nat) (E : nat -> I -> V)
  (LR : nat -> nat -> I -> V) :
  (forall r i x, r < p -> LR r i x = E i x) ->
  shard p b E (fun r i x => LR r (r * b + i) x).
Proof. by move=> h r i x rp ib; rewrite h. Qed.

Definition concat {I V : Type} (n1 : nat) (A B : nat -> I -> V) : nat -> I -> V :=
  fun k x => if k < n1 then A k x else B (k - n1) x.

Theorem concat_other_dim {I V : Type} (p b n1 : nat) (E1 E2 : nat -> nat -> I -> V)
  (L1 L2 : nat -> nat -> nat -> I -> V) :
  shard p b E1 L1 -> shard p b E2 L2 ->
  shard p b (fun i => concat n1 (E1 i) (E2 i)) (fun r i => concat n1 (L1 r i) (L2 r i)).
Proof.
move=> h1 h2 r i k rp ib; rewrite /concat.
by case: (k < n1); rewrite ?h1 ?h2.
Qed.
