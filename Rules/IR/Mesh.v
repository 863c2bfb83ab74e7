(** * tvcert IR, stage 2: plans on a mesh of several axes (trusted definitions).

    Built on the one-axis definitions of [Denote.v] ([placed], [local_shape],
    [op_val], [run]).  The mesh is a list of axis sizes, axis 0 outermost; a rank
    is a coordinate list [c] (one entry per axis); a placement is one
    [placement] per axis.  Placements nest as in [torch.distributed.tensor]: the
    logical tensor is placed on axis 0, each of the pieces so obtained is placed
    on axis 1, and so on; two [Shard]s of one dim nest, the first axis outermost.

    A collective runs over one axis [k]: its group is the ranks whose
    coordinates differ only at [k].  A node's op is a stage-1 [op] ([GO]) or a
    layout / reduction / row-wise op of [LayoutOps.v] ([GL]); the logical graph is
    evaluated by [lrun] (one tensor per node). *)
From mathcomp Require Import all_ssreflect all_algebra.
From TVCert Require Import IR.Syntax IR.Denote IR.LayoutOps.
Set Implicit Arguments.
Unset Strict Implicit.
Unset Printing Implicit Defensive.
Import GRing.Theory Num.Theory.
Import JSyntax JDenote JLayout.

Module JMesh.

(** ** Syntax *)
(** The op of a node: one of [Denote.op_val] or one of [LayoutOps.lop_val]. *)
Inductive gop := GO (o : op) | GL (o : lop).

Record gnode := GNode { g_op : gop; g_args : seq nat }.

Definition gop_shape (o : gop) (ss : seq shape) : shape :=
  match o with GO o => op_shape 1 o ss | GL o => lop_shape o ss end.

Inductive coll :=
| CAllReduce (r : reduce_op)   (* all_reduce(r) *)
| CAllGather (d : nat)         (* all_gather_into_tensor along dim d, in rank order *)
| CReduceScatter (d : nat)     (* reduce_scatter_tensor(sum) along dim d: rank r keeps block r *)
| CSliceRank (d m : nat).      (* not a collective but a local op whose bounds depend on the rank's
                                  coordinate r on the axis: x[r*m : r*m+m] along dim d *)

Inductive pnode :=
| PLocal (o : gop) (args : seq nat)      (* [o] on every rank (the checker refuses AllReduce / AllGather here) *)
| PColl (c : coll) (k : nat) (a : nat).  (* collective [c] over mesh axis [k] of node [a] *)

Record mplan := MPlan {
  mesh : seq nat;                           (* axis sizes, axis 0 outermost *)
  ml_inputs : seq (seq nat);                (* shapes of the logical inputs *)
  ml_nodes : seq gnode;                     (* the single-device graph *)
  mp_inputs : seq (nat * seq placement);    (* local input j: piece of logical value (fst), one placement per axis;
                                               the value is a logical input, or a binding layout of one: a
                                               node the printer appends to [ml_nodes] (ZeRO's flat optimizer
                                               state, reshape(permute(x))) *)
  mp_nodes : seq pnode;                     (* the SPMD program every rank runs *)
  mp_outputs : seq (nat * nat * seq placement)  (* (logical id, parallel id, placements); the logical value is
                                                   an output, or a binding layout of one, as for inputs *)
}.

(** Local shape of a tensor of shape [s] under one placement per axis. *)
Fixpoint mlocal_shape (ms : seq nat) (s : shape) (pls : seq placement) : shape :=
  match ms, pls with
  | p :: ms', pl :: pls' => mlocal_shape ms' (local_shape p s pl) pls'
  | _, _ => s
  end.

Definition coll_shape (p : nat) (cl : coll) (s : shape) : shape :=
  match cl with
  | CAllReduce _ => s
  | CAllGather d => set_nth 0%N s d (nth 0%N s d * p)
  | CReduceScatter d => set_nth 0%N s d (nth 0%N s d %/ p)
  | CSliceRank d m => set_nth 0%N s d m
  end.

(** The shapes of the logical graph's values (inputs first): the shape part of [lrun] below. *)
Fixpoint lrun_s (ss : seq shape) (ns : seq gnode) : seq shape :=
  match ns with
  | [::] => ss
  | n :: ns' => lrun_s (rcons ss (gop_shape (g_op n) (map (nth [::] ss) (g_args n)))) ns'
  end.

Local Open Scope ring_scope.

Section Values.
Variable R : realFieldType.
Variable fn : nat -> R -> R.

Definition gop_val (o : gop) (ss : seq shape) (ts : seq (tensor R)) : tensor R :=
  match o with GO o => op_val fn o ss ts | GL o => lop_val fn o ss ts end.

(** ** The logical graph: each node's op on its operands' shapes and values *)
Definition lentry := (shape * tensor R)%type.
Definition ldflt : lentry := ([::], zero_t R).

Definition lrun_node (env : seq lentry) (n : gnode) : lentry :=
  let a := map (nth ldflt env) (g_args n) in
  (gop_shape (g_op n) (map fst a), gop_val (g_op n) (map fst a) (map snd a)).

Fixpoint lrun (env : seq lentry) (ns : seq gnode) : seq lentry :=
  match ns with
  | [::] => env
  | n :: ns' => lrun (rcons env (lrun_node env n)) ns'
  end.

Definition coord := seq nat.
Definition mfamily := coord -> tensor R.   (* the tensor held by each rank *)

(** ** Nested placements: [T] of shape [s] is held by the ranks' tensors [L]. *)
Fixpoint mplaced (ms : seq nat) (s : shape) (pls : seq placement) (T : tensor R) (L : mfamily) : Prop :=
  match ms, pls with
  | [::], [::] => forall i, inb s i -> L [::] i = T i
  | p :: ms', pl :: pls' =>
      exists M : family R, placed p s pl T M /\
        forall r, (r < p)%N -> mplaced ms' (local_shape p s pl) pls' (M r) (fun c => L (r :: c))
  | _, _ => False
  end.

(** A collective over axis [k] on operands of local shape [s]: rank [c] combines the
    tensors of the ranks [set_nth 0 c k r], [r < p]. *)
Definition coll_step (ms : seq nat) (cl : coll) (k : nat) (s : shape) (f : mfamily) : mfamily :=
  let p := nth 0%N ms k in
  let g r (c : coord) := f (set_nth 0%N c k r) in
  fun c => mask (coll_shape p cl s)
  (match cl with
   | CAllReduce RSum => fun i => sumR p (fun r => g r c i)
   | CAllReduce RAvg => fun i => p%:R^-1 * sumR p (fun r => g r c i)
   | CAllReduce RMax => fun i => foldr (fun r m => Num.max (g r c i) m) (g 0%N c i) (iota 0 p)
   | CAllGather d =>      (* block r of dim d comes from rank r *)
       let m := nth 0%N s d in
       fun i => g (nth 0%N i d %/ m)%N c (set_nth 0%N i d (nth 0%N i d %% m)%N)
   | CReduceScatter d =>  (* rank c keeps block (nth 0 c k) of dim d of the sum *)
       let m := (nth 0%N s d %/ p)%N in
       fun i => sumR p (fun r => g r c (shift d (nth 0%N c k * m) i))
   | CSliceRank d m =>    (* rank c slices its own tensor *)
       fun i => f c (shift d (nth 0%N c k * m) i)
   end).

Definition mentry := (shape * mfamily)%type.
Definition mdflt : mentry := ([::], fun _ => zero_t R).

Definition mrun_node (ms : seq nat) (env : seq mentry) (n : pnode) : mentry :=
  match n with
  | PLocal o args =>
      let a := map (nth mdflt env) args in
      (gop_shape o (map fst a), fun c => gop_val o (map fst a) (map (fun e => e.2 c) a))
  | PColl cl k x =>
      let e := nth mdflt env x in
      (coll_shape (nth 0%N ms k) cl e.1, coll_step ms cl k e.1 e.2)
  end.

Fixpoint mrun (ms : seq nat) (env : seq mentry) (ns : seq pnode) : seq mentry :=
  match ns with
  | [::] => env
  | n :: ns' => mrun ms (rcons env (mrun_node ms env n)) ns'
  end.

(** ** The plan's meaning *)
Definition ml_init (P : mplan) (X : seq (tensor R)) : seq lentry :=
  mkseq (fun j => let s := nth [::] (ml_inputs P) j in
                  (s, mask s (nth (zero_t R) X j))) (size (ml_inputs P)).

Definition mp_init (P : mplan) (L : seq mfamily) : seq mentry :=
  mkseq (fun j => let b := nth (0%N, [::]) (mp_inputs P) j in
                  let s := mlocal_shape (mesh P) (nth [::] (lrun_s (ml_inputs P) (ml_nodes P)) b.1) b.2 in
                  (s, fun c => mask s (nth (fun _ => zero_t R) L j c))) (size (mp_inputs P)).

(** For all logical inputs [X] and all local inputs [L] placed as declared (each the
    piece of its logical value: an input of [X], or a binding layout of one), every
    declared output of the parallel program has the local shape of its logical value
    under its placements and holds it under them. *)
Definition mequiv_at (P : mplan) : Prop :=
  forall (X : seq (tensor R)) (L : seq mfamily),
  let le := lrun (ml_init P X) (ml_nodes P) in
  (forall j, (j < size (mp_inputs P))%N ->
     let b := nth (0%N, [::]) (mp_inputs P) j in
     mplaced (mesh P) (nth ldflt le b.1).1 b.2 (nth ldflt le b.1).2 (nth (fun _ => zero_t R) L j)) ->
  let pe := mrun (mesh P) (mp_init P L) (mp_nodes P) in
  forall lo po pls, List.In (lo, po, pls) (mp_outputs P) ->
    (nth mdflt pe po).1 = mlocal_shape (mesh P) (nth ldflt le lo).1 pls /\
    mplaced (mesh P) (nth ldflt le lo).1 pls (nth ldflt le lo).2 (nth mdflt pe po).2.

End Values.

(** Where a local input may be bound: a logical input, or a reshape / permute (a step of a
    binding layout) of a value bound so, at most [k] steps deep. *)
Fixpoint layout_of_input (ni : nat) (ns : seq gnode) (k l : nat) : bool :=
  (l < ni)%N ||
  match k with
  | 0 => false
  | k'.+1 =>
      let n := nth (GNode (GO Add) [::]) ns (l - ni) in
      let a := head 0%N (g_args n) in
      (l < ni + size ns)%N && (size (g_args n) == 1%N) && (a < l)%N &&
      match g_op n with GL (Reshape _) | GL (Permute _) => true | _ => false end &&
      layout_of_input ni ns k' a
  end.

Definition bind_ok (P : mplan) : bool :=
  all (fun b => layout_of_input (size (ml_inputs P)) (ml_nodes P) (size (ml_nodes P)) b.1) (mp_inputs P).

(** The parallel plan computes the logical graph: its local inputs are pieces of its logical
    inputs or of their binding layouts, and over every real field and every interpretation of
    the pointwise functions the outputs hold the logical values. *)
Definition mplan_equiv (P : mplan) : Prop :=
  bind_ok P = true /\ forall (R : realFieldType) (fn : nat -> R -> R), mequiv_at fn P.

End JMesh.
