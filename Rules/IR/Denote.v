(** * tvcert IR: what the stage-1 ops and the placements on one mesh axis mean.

    Values live in an arbitrary real field [R] (MathComp [realFieldType]); the
    pointwise nonlinear functions ([Fn f]: tanh, exp, ...) are an arbitrary
    family [fn], so a theorem proved here holds for every interpretation of them.
    A tensor is a function from index lists to values; every tensor an evaluation
    produces is 0 outside its shape ([mask]), so two tensors of one shape are equal
    exactly when they agree on in-bounds indices.  [placed p s pl T L] relates a
    logical tensor to the tensors of the [p] ranks of one mesh axis; [Mesh.v]
    nests it over several axes and evaluates plans. *)
From mathcomp Require Import all_ssreflect all_algebra.
From TVCert Require Import IR.Syntax.
Set Implicit Arguments.
Unset Strict Implicit.
Unset Printing Implicit Defensive.
Import GRing.Theory Num.Theory.
Import JSyntax.

Module JDenote.

(** ** Shapes and indices (plain computation; the checker runs these) *)
Definition shape := seq nat.
Definition index := seq nat.

(** [i] is an index of a tensor of shape [s]. *)
Fixpoint inb (s : shape) (i : index) : bool :=
  match s, i with
  | [::], [::] => true
  | n :: s', k :: i' => (k < n)%N && inb s' i'
  | _, _ => false
  end.

(** Broadcast shape of two operands, aligned on the right (torch.broadcast_shapes). *)
Fixpoint bc_rev (a b : shape) : shape :=
  match a, b with
  | [::], _ => b
  | _, [::] => a
  | x :: a', y :: b' => (if x == 1%N then y else x) :: bc_rev a' b'
  end.
Definition bshape (a b : shape) : shape := rev (bc_rev (rev a) (rev b)).

Definition rem_at (e : nat) (s : seq nat) : seq nat := take e s ++ drop e.+1 s.
Definition ins_at (e k : nat) (i : seq nat) : seq nat := take e i ++ k :: drop e i.
Definition swap (d0 d1 : nat) (s : seq nat) : seq nat :=
  set_nth 0%N (set_nth 0%N s d0 (nth 0%N s d1)) d1 (nth 0%N s d0).

(** Dims of a sum, largest first, so that removing one does not move the others. *)
Definition sum_order (ds : seq nat) : seq nat := sort geq ds.
Definition sum_shape (ds : seq nat) (s : shape) : shape :=
  foldl (fun s e => rem_at e s) s (sum_order ds).

(** Output shape of an op on a mesh axis of [p] ranks. *)
Definition op_shape (p : nat) (o : op) (ss : seq shape) : shape :=
  let s0 := nth [::] ss 0 in
  let s1 := nth [::] ss 1 in
  match o with
  | Add | Sub | Mul | Div => bshape s0 s1
  | Neg | Square | Scale _ | Fn _ | AllReduce _ => s0
  | Const _ s => s
  | MM => [:: nth 0%N s0 0; nth 0%N s1 1]
  | Sum ds => sum_shape ds s0
  | Transpose d0 d1 => swap d0 d1 s0
  | AllGather d => set_nth 0%N s0 d (nth 0%N s0 d * p)
  end.

(** Local shape of a tensor of shape [s] under a placement. *)
Definition local_shape (p : nat) (s : shape) (pl : placement) : shape :=
  match pl with
  | Shard d => set_nth 0%N s d (nth 0%N s d %/ p)
  | _ => s
  end.

(** The index [i] with [off] added on dim [d]. *)
Definition shift (d off : nat) (i : index) : index := set_nth 0%N i d (off + nth 0%N i d).

Local Open Scope ring_scope.

Section Values.
Variable R : realFieldType.
Variable fn : nat -> R -> R.   (* the meaning of [Fn f] *)

Definition tensor := index -> R.
Definition family := nat -> tensor.     (* the tensor held by each rank *)

Definition mask (s : shape) (t : tensor) : tensor := fun i => if inb s i then t i else 0.

Definition lit (c : rat_lit) : R :=
  let: (neg, n, d) := c in (if neg then -1 else 1) * (nat_of_bin n)%:R / (nat_of_bin d)%:R.

(** The index of an operand of shape [a] read by output index [i] of shape [o]
    under broadcasting: the trailing dims, 0 where the operand has size 1. *)
Definition proj (a o : shape) (i : index) : index :=
  map (fun x => if x.1 == 1%N then 0%N else x.2) (zip a (drop (size o - size a) i)).

(** [F 0 + ... + F (n-1)] by plain recursion (MathComp's locked big operators do not
    run under [vm_compute]; [SoundOps.sumRE] proves this is [\sum_(0 <= k < n) F k]). *)
Definition sumR (n : nat) (F : nat -> R) : R := foldr (fun k acc => F k + acc) 0 (iota 0 n).

(** Sum over dim [e] of a tensor of shape [s]. *)
Definition sum1 (s : shape) (e : nat) (t : tensor) : tensor :=
  fun i => sumR (nth 0%N s e) (fun k => t (ins_at e k i)).
Fixpoint sum_many (ds : seq nat) (s : shape) (t : tensor) : tensor :=
  match ds with
  | [::] => t
  | e :: ds' => sum_many ds' (rem_at e s) (sum1 s e t)
  end.

Definition zero_t : tensor := fun _ => 0.

(** A local (per-rank) op on its operands' shapes [ss] and values [ts]. *)
Definition op_val (o : op) (ss : seq shape) (ts : seq tensor) : tensor :=
  let s0 := nth [::] ss 0 in
  let s1 := nth [::] ss 1 in
  let t0 := nth zero_t ts 0 in
  let t1 := nth zero_t ts 1 in
  let so := op_shape 1 o ss in
  mask so (match o with
  | Add => fun i => t0 (proj s0 so i) + t1 (proj s1 so i)       (* torch.add *)
  | Sub => fun i => t0 (proj s0 so i) - t1 (proj s1 so i)       (* torch.sub *)
  | Mul => fun i => t0 (proj s0 so i) * t1 (proj s1 so i)       (* torch.mul *)
  | Div => fun i => t0 (proj s0 so i) / t1 (proj s1 so i)       (* torch.div *)
  | Neg => fun i => - t0 i                                      (* torch.neg *)
  | Square => fun i => t0 i * t0 i                              (* torch.square *)
  | Scale c => fun i => t0 i * lit c                            (* x * c *)
  | Fn f => fun i => fn f (t0 i)                                (* e.g. torch.tanh *)
  | Const c _ => fun _ => lit c                                 (* torch.full *)
  | MM => fun i => sumR (nth 0%N s0 1)                          (* torch.mm *)
                     (fun k => t0 [:: nth 0%N i 0; k] * t1 [:: k; nth 0%N i 1])
  | Sum ds => sum_many (sum_order ds) s0 t0                     (* torch.sum(x, ds) *)
  | Transpose d0 d1 => fun i => t0 (swap d0 d1 i)               (* torch.transpose *)
  | AllReduce _ | AllGather _ => t0                             (* never checked: see [Syntax.op] *)
  end).

(** ** Placements: a logical tensor [T] of shape [s] and the ranks' tensors [L]. *)
Definition placed (p : nat) (s : shape) (pl : placement) (T : tensor) (L : family) : Prop :=
  match pl with
  | Replicate => forall r i, (r < p)%N -> inb s i -> L r i = T i
  | Shard d =>
      let m := (nth 0%N s d %/ p)%N in
      [/\ (d < size s)%N, (m * p)%N = nth 0%N s d &
          forall r i, (r < p)%N -> inb (local_shape p s pl) i -> L r i = T (shift d (r * m) i)]
  | Partial RSum => forall i, inb s i -> \sum_(0 <= r < p) L r i = T i
  | Partial RAvg => forall i, inb s i -> ((p%:R)^-1 * \sum_(0 <= r < p) L r i)%R = T i
  | Partial RMax => forall i, inb s i ->
      (forall r, (r < p)%N -> L r i <= T i) /\ exists2 r, (r < p)%N & L r i = T i
  end.

End Values.

End JDenote.
