(** * Reductions spelled differently, and broadcasts read as shards.

    Rule [reduction_normal_form] (kernel/reductions.py) rewrites float sums and
    means into [c * sum(x, D)]: a mean is a sum divided by its element count, a
    sum of a sum is one sum over the product of the index ranges (in either
    order), a scalar factor leaves a sum, and a broadcast of a broadcast of a
    scalar is one broadcast.  Rule [replicate_broadcast_as_shard]
    (kernel/broadcast.py): a local tensor whose value does not depend on the
    index along the sharded dimension is every rank's block of the tensor
    with that value at every index. *)
From mathcomp Require Import all_ssreflect all_algebra.
From TVCert Require Import Semantics.
Set Implicit Arguments.
Unset Strict Implicit.
Unset Printing Implicit Defensive.
Import GRing.Theory.
Local Open Scope ring_scope.

(** The mean of [n] values, as ops/reduce.py computes it. *)
Definition mean_upto {R : fieldType} (n : nat) (F : nat -> R) : R :=
  (n%:R)^-1 * \sum_(0 <= k < n) F k.

(** A sum over two dims, flattened row-major: the merged reduction. *)
Lemma sum_pair {V : zmodType} (m n : nat) (F : nat -> nat -> V) :
  \sum_(0 <= i < m) \sum_(0 <= j < n) F i j =
  \sum_(0 <= k < m * n) F (k %/ n)%N (k %% n)%N.
Proof.
case: n => [|n].
  rewrite muln0 [RHS]big_geq //; apply: big1 => i _; exact: big_geq.
rewrite (sum_blocks m n.+1 (fun k => F (k %/ n.+1)%N (k %% n.+1)%N)).
apply: eq_bigr => i _; apply: eq_big_nat => j /andP[_ jn].
by rewrite block_div // block_mod.
Qed.

Theorem reduction_normal_form :
  (* a mean over [n] elements is their sum times [n^-1] *)
  (forall (R : fieldType) (n : nat) (F : nat -> R),
     mean_upto n F = (n%:R)^-1 * \sum_(0 <= k < n) F k) /\
  (* a mean of means over an [m x n] block is the mean over its [m * n] elements *)
  (forall (R : fieldType) (m n : nat) (F : nat -> nat -> R),
     mean_upto m (fun i => mean_upto n (F i)) =
     ((m * n)%N%:R)^-1 * \sum_(0 <= k < m * n) F (k %/ n)%N (k %% n)%N) /\
  (* a sum of sums is one sum over the union of the dims, in either order *)
  (forall (V : zmodType) (m n : nat) (F : nat -> nat -> V),
     \sum_(0 <= i < m) \sum_(0 <= j < n) F i j =
       \sum_(0 <= k < m * n) F (k %/ n)%N (k %% n)%N /\
     \sum_(0 <= i < m) \sum_(0 <= j < n) F i j =
       \sum_(0 <= j < n) \sum_(0 <= i < m) F i j) /\
  (* a scalar factor leaves a sum *)
  (forall (R : ringType) (n : nat) (c : R) (F : nat -> R),
     \sum_(0 <= k < n) c * F k = c * \sum_(0 <= k < n) F k) /\
  (* a broadcast (any index map) of a broadcast of a scalar is the broadcast of the scalar *)
  (forall (I J V : Type) (s : V) (f : J -> I),
     (fun y : J => (fun _ : I => s) (f y)) = (fun _ : J => s)) /\
  (* a sum over a unit dim is its one element (a reshape) *)
  (forall (V : zmodType) (F : nat -> V), \sum_(0 <= k < 1) F k = F 0%N).
Proof.
split=> [//|]; split=> [R m n F|]; last split=> [V m n F|]; last split=> [R n c F|].
4: by split=> [//|V F]; rewrite big_nat1.
- rewrite /mean_upto -sum_pair natrM invfM -mulrA; congr (_ * _).
  by rewrite mulr_sumr.
- by split; [exact: sum_pair | exact: exchange_big].
- by rewrite mulr_sumr.
Qed.

(** A local tensor constant along the sharded dimension (value [g x] at
    every index [i]) is the shard of the tensor with value [g x] at every
    index of the full dimension. *)
Theorem replicate_broadcast_as_shard {I V : Type} (p b : nat) (g : I -> V)
  (L : nat -> nat -> I -> V) :
  (forall r i x, (r < p)%N -> (i < b)%N -> L r i x = g x) ->
  shard p b (fun _ x => g x) L.
Proof. by move=> h r i x rp ib; rewrite h. Qed.
