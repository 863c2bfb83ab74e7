(** * tvcert IR, stage 2: the checker for plans on several mesh axes.

    As in [Check.v], the certificate gives one fact per parallel node, now
    [(l, pls)]: "the node holds, on every rank, the piece of logical node [l]
    under the placements [pls], one per axis".
    - A local op is checked on every axis: [Check.rule] (a stage-1 op) or
      [LayoutRule.lrule] (a layout op) must accept the axis-[k] placements of its
      operands and of the result, the shapes being the local shapes after axes
      [0 .. k-1] ([mrule]).
    - A collective over axis [k] changes the placement at [k] only
      (all_reduce(r): Partial(r) -> Replicate; all_gather(d): Shard(d) ->
      Replicate; reduce_scatter(d): Partial(sum) -> Shard(d)), and only when every
      axis after [k] commutes with it ([inner_ok]): Replicate, a Shard (of another
      dim than the gathered / scattered one), or a Partial(sum|avg) (not under a max).
    - A logical node may read, instead of a fact's logical value, one equal to it ([veq]); an
      elementwise op of flat views is the flat view of the logical op ([comm_ok]).  The views are
      auxiliary logical nodes of the certificate ([mcheckx]). *)
From mathcomp Require Import all_ssreflect.
From TVCert Require Import IR.Syntax IR.Denote IR.Check IR.SoundOps IR.LayoutOps IR.LayoutSound IR.LayoutRule IR.Mesh.
Import JSyntax JDenote JCheck JSoundOps JLayout JLayoutSound JLayoutRule JMesh.

Module JMeshCheck.

Definition mfact := (nat * seq placement)%type.
Definition dmfact : mfact := (0, [::]).

Fixpoint pls_eqb (a b : seq placement) : bool :=
  match a, b with
  | [::], [::] => true
  | x :: a', y :: b' => placement_eqb x y && pls_eqb a' b'
  | _, _ => false
  end.

(** Every axis's placement is well formed on the shape it applies to. *)
Fixpoint mpl_ok (ms : seq nat) (s : shape) (pls : seq placement) : bool :=
  match ms, pls with
  | [::], [::] => true
  | p :: ms', pl :: pls' => pl_ok p s pl && mpl_ok ms' (local_shape p s pl) pls'
  | _, _ => false
  end.

Definition is_glocal (o : gop) : bool := if o is GO o then is_local o else true.

Definition gop_eqb (a b : gop) : bool :=
  match a, b with GO a, GO b => op_eqb a b | GL a, GL b => lop_eqb a b | _, _ => false end.

(** The one-axis rule of an op. *)
Definition grule (p : nat) (o : gop) (ss : seq shape) (pls : seq placement) (pl : placement) : bool :=
  match o with GO o => rule o ss pls pl | GL o => lrule p o ss pls pl || lrule_loc p o ss pls pl end.

(** The op a rank runs for logical op [o] when it holds the result with local shape [s]: a
    reshape / expand names its target shape, so the local one names the local shape. *)
Definition relocal (o : gop) (s : shape) : gop := if o is GL o then GL (lrelocal o s) else o.

(** The one-axis rule on every axis, with the operands' shapes local to the outer axes; [o] is
    the op at the outer axes' local shapes (the logical op at axis 0). *)
Fixpoint mrule (ms : seq nat) (o : gop) (ss : seq shape) (plss : seq (seq placement))
    (pls : seq placement) : bool :=
  match ms, pls with
  | [::], [::] => true
  | p :: ms', pl :: pls' =>
      let hs := map (head Replicate) plss in
      grule p o ss hs pl &&
      mrule ms' (relocal o (local_shape p (gop_shape o ss) pl))
            (map (fun x => local_shape p x.1 x.2) (zip ss hs)) (map behead plss) pls'
  | _, _ => false
  end.

Definition coll_in (cl : coll) : placement :=
  match cl with
  | CAllReduce r => Partial r | CAllGather d => Shard d | CReduceScatter _ => Partial RSum
  | CSliceRank _ _ => Replicate
  end.
Definition coll_out (cl : coll) : placement :=
  match cl with CReduceScatter d | CSliceRank d _ => Shard d | _ => Replicate end.

(** slice_block_to_shard: the block is the shard's size (the operand's local shape, over the axis size). *)
Definition coll_side (ms : seq nat) (s : shape) (cl : coll) (k : nat) (pls : seq placement) : bool :=
  if cl is CSliceRank d m then m == nth 0 (mlocal_shape ms s pls) d %/ nth 0 ms k else true.

(** Placements allowed on the axes inside the collective's axis. *)
Definition inner_ok (cl : coll) (pl : placement) : bool :=
  match pl, cl with
  | Replicate, _ => true
  | Shard _, CAllReduce _ => true
  | Shard e, CAllGather d | Shard e, CReduceScatter d | Shard e, CSliceRank d _ => e != d
  | Partial RMax, _ => false           (* max does not commute with a sum *)
  | Partial _, CAllReduce RMax => false
  | Partial _, _ => true               (* sums commute *)
  end.

Definition coll_ok (ms : seq nat) (s : shape) (cl : coll) (k : nat) (pls pls' : seq placement) : bool :=
  (k < size ms) && (size pls == size ms) &&
  placement_eqb (nth Replicate pls k) (coll_in cl) &&
  all (inner_ok cl) (drop k.+1 pls) &&
  pls_eqb pls' (set_nth Replicate pls k (coll_out cl)) &&
  mpl_ok ms s pls && mpl_ok ms s pls' && coll_side ms s cl k pls.

(** Shapes of the parallel program: the shape part of [mrun] (printer check). *)
Definition pnode_shape (ms : seq nat) (ss : seq shape) (n : pnode) : shape :=
  match n with
  | PLocal o a => gop_shape o (map (nth [::] ss) a)
  | PColl cl k a => coll_shape (nth 0 ms k) cl (nth [::] ss a)
  end.

Fixpoint mrun_s (ms : seq nat) (ss : seq shape) (ns : seq pnode) : seq shape :=
  match ns with
  | [::] => ss
  | n :: ns' => mrun_s ms (rcons ss (pnode_shape ms ss n)) ns'
  end.


Definition pargs (n : pnode) : seq nat := match n with PLocal _ a => a | PColl _ _ a => [:: a] end.

(** [vm_compute] evaluates both operands of [andb] / [orb] before calling them, so a chain
    [a && b] computes [b] even when [a] is false.  From here on they are the lazy [if] forms
    (convertible to [andb] / [orb]: the proofs read them with [andP] / [orP] unchanged). *)
Local Notation "a && b" := (if a then b else false) : bool_scope.
Local Notation "a || b" := (if a then true else b) : bool_scope.

(** [l < size s] without building [size s] (a unary number as long as the graph). *)
Fixpoint ltsz {T : Type} (l : nat) (s : seq T) : bool :=
  if s is _ :: s' then (if l is l'.+1 then ltsz l' s' else true) else false.

Lemma ltszE (T : Type) l (s : seq T) : ltsz l s = (l < size s).
Proof. by elim: s l => [|x s IH] [|l] //=; rewrite IH. Qed.

Lemma ltszP (T : Type) l (s : seq T) : ltsz l s -> l < size s.
Proof. by rewrite ltszE. Qed.

Section Checker.
Variable P : mplan.
Variable ls : seq shape.   (* the logical graph's shapes, [lrun_s]: [mcheck] computes them once *)
Let ms := mesh P.
Let ni := size (ml_inputs P).

(** x / p over axis [k]: x replicated on [k], p the size of axis [k] as a replicated scalar
    constant (a logical const node, possibly one the certificate appends): each rank's copy of x
    over p is one of p equal parts of a partial sum on [k] (a gradient-norm term that a later
    all_reduce over [k] must count once). *)
Definition dedup_ok (o : gop) (af : seq mfact) (f : mfact) : bool :=
  let: (l, pls) := f in
  match o, af with
  | GO Div, [:: (l1, pls1); (lk, plsk)] =>
      let lnk := nth (GNode (GO Add) [::]) (ml_nodes P) (lk - ni) in
      (l == l1) && (l1 < size ls) && (ni <= lk) && (lk < size ls) && (g_args lnk == [::]) &&
      (size pls1 == size ms) && pls_eqb plsk (nseq (size ms) Replicate) &&
      has (fun k => placement_eqb (nth Replicate pls1 k) Replicate && (0 < nth 0 ms k) &&
                    gop_eqb (g_op lnk) (GO (Const (false, bin_of_nat (nth 0 ms k), bin_of_nat 1) [::])) &&
                    pls_eqb pls (set_nth Replicate pls1 k (Partial RSum)))
          (iota 0 (size ms))
  | _, _ => false
  end.

(** ** Equal logical values.  A certificate may name auxiliary logical nodes (ZeRO's flat views of
    a gradient, a moment, a parameter: layout ops with no logical counterpart); [veq b a] says
    the value of [a] is the value of [b], for the shapes ZeRO's flattening takes. *)
Definition lnode (l : nat) : gnode := nth (GNode (GO Add) [::]) (ml_nodes P) (l - ni).
Definition arg0 (l : nat) : nat := head 0 (g_args (lnode l)).
Definition lsh (l : nat) : shape := nth [::] ls l.

(** [l] is a logical node computing [o] from [args], each computed before it. *)
Definition node_is (l : nat) (o : gop) (args : seq nat) : bool :=
  let n := lnode l in
  gop_eqb (g_op n) o && (g_args n == args) && (ni <= l) && ltsz l ls && all (fun a => a < l) args.

(** [a] = reshape(reshape(b, s1), shape of b), s1 of as many elements (a flat view of [b] and back). *)
Definition rr_back (b a : nat) : bool :=
  let a1 := arg0 a in
  node_is a (GL (Reshape (lsh b))) [:: a1] &&
  match g_op (lnode a1) with
  | GL (Reshape s1) => node_is a1 (GL (Reshape s1)) [:: b] && (prodn s1 == prodn (lsh b))
  | _ => false
  end.

(** [a] = permute(v, [1, 0]) with [v] a flat view and back of permute(b, [1, 0]), [b] 2-D. *)
Definition pp_back (b a : nat) : bool :=
  let a1 := arg0 a in
  let a3 := arg0 (arg0 a1) in
  node_is a (GL (Permute [:: 1; 0])) [:: a1] && rr_back a3 a1 &&
  node_is a3 (GL (Permute [:: 1; 0])) [:: b] && (size (lsh b) == 2).

(** [b] sums every dim of a 1-D or 2-D [d]; [a] sums dim 0 of [d] flattened (transposed first or not). *)
Definition sum_flat (b a : nat) : bool :=
  let a1 := arg0 a in
  let d := arg0 b in
  let sd := lsh d in
  node_is a (GO (Sum [:: 0])) [:: a1] && node_is b (GO (Sum (iota 0 (size sd)))) [:: d] &&
  ((size sd == 1) || (size sd == 2)) &&
  (node_is a1 (GL (Reshape [:: prodn sd])) [:: d] ||
   (size sd == 2) && node_is a1 (GL (Reshape [:: prodn sd])) [:: arg0 a1] &&
   node_is (arg0 a1) (GL (Permute [:: 1; 0])) [:: d]).

(** Each view is tried only when [a]'s op is the one it ends with (one lookup instead of a dozen). *)
Definition veq (b a : nat) : bool :=
  (a == b) ||
  match g_op (lnode a) with
  | GL (Reshape _) => rr_back b a
  | GL (Permute _) => pp_back b a
  | GO (Sum _) => sum_flat b a
  | _ => false
  end.

(** ** Elementwise ops commute with a layout op (every non-scalar operand has the result's shape). *)
(** The number of operands of an elementwise op (0: not one). *)
Definition ew_arity (o : gop) : nat :=
  match o with
  | GO Add | GO Sub | GO Mul | GO Div => 2
  | GO Neg | GO Square | GO (Scale _) | GO (Fn _) | GL (AddScalar _) | GL CastF => 1
  | _ => 0
  end.

(** A layout op that reads its input through a bijective index map at shape [s]. *)
Definition reix_ok (lo : lop) (s : shape) : bool :=
  match lo with
  | Reshape s' => prodn s' == prodn s
  | Permute ds => perm_ok ds s
  | _ => false
  end.

(** [l] is [o] of [xs], or a layout op [lo] of [l'] where each non-scalar [x] of [xs] is [lo] of an [x']
    of [l']'s shape and [l'] is (recursively) [o] of the [x']s: the elementwise op on the flat views. *)
Fixpoint comm_ok (k : nat) (o : gop) (l : nat) (xs : seq nat) : bool :=
  node_is l o xs ||
  match k, g_op (lnode l) with
  | k'.+1, GL lo =>
      let l' := arg0 l in
      let xs' := map (fun x => if lsh x == [::] then x else arg0 x) xs in
      node_is l (GL lo) [:: l'] && reix_ok lo (lsh l') && (lsh l' != [::]) &&
      all (fun x => (lsh x == [::]) || node_is x (GL lo) [:: arg0 x] && (lsh (arg0 x) == lsh l')) xs &&
      comm_ok k' o l' xs'
  | _, _ => false
  end.

Definition mderive (n : pnode) (af : seq mfact) (f : mfact) : bool :=
  let: (l, pls) := f in
  match n, af with
  | PColl cl k _, [:: (l1, pls1)] => (l == l1) && ltsz l ls && coll_ok ms (nth [::] ls l) cl k pls1 pls
  | PColl _ _ _, _ => false
  | PLocal o _, _ =>
      let ln := lnode l in
      is_glocal (g_op ln) && (ni <= l) && ltsz l ls &&
      gop_eqb (relocal (g_op ln) (mlocal_shape ms (nth [::] ls l) pls)) o &&
      (size (g_args ln) == size af) && all (fun ba => veq ba.1 ba.2) (zip (g_args ln) (map fst af)) &&
      all (fun a => a < l) (g_args ln) &&
      mrule ms (g_op ln) (map (nth [::] ls) (map fst af)) (map snd af) pls &&
      mpl_ok ms (nth [::] ls l) pls
      || (0 < ew_arity o) && (size af == ew_arity o) && ltsz l ls && comm_ok 4 o l (map fst af) &&
         mrule ms o (map (nth [::] ls) (map fst af)) (map snd af) pls && mpl_ok ms (nth [::] ls l) pls
      || dedup_ok o af f
  end.

Fixpoint mcheck_nodes (facts : seq mfact) (ns : seq pnode) (c : seq mfact) : bool :=
  match ns, c with
  | [::], [::] => true
  | n :: ns', f :: c' =>
      all (fun a => ltsz a facts) (pargs n) &&
      mderive n (map (nth dmfact facts) (pargs n)) f &&
      mcheck_nodes (rcons facts f) ns' c'
  | _, _ => false
  end.

Definition mcheck_output (facts : seq mfact) (o : nat * nat * seq placement) : bool :=
  let: (lo, po, pls) := o in
  (lo < size ls) && (po < size facts) &&
  ((nth dmfact facts po).1 == lo) && pls_eqb (nth dmfact facts po).2 pls.

End Checker.

(** [Mesh.bind_ok] with the lazy [||] / [&&] ([vm_compute] would otherwise walk the whole fuel
    [size ns] for every input, each step an [nth] into the graph). *)
Fixpoint layout_of_input_l (ni : nat) (ns : seq gnode) (k l : nat) : bool :=
  (l < ni) ||
  match k with
  | 0 => false
  | k'.+1 =>
      let n := nth (GNode (GO Add) [::]) ns (l - ni) in
      let a := head 0 (g_args n) in
      (l < ni + size ns) && (size (g_args n) == 1) && (a < l) &&
      match g_op n with GL (Reshape _) | GL (Permute _) => true | _ => false end &&
      layout_of_input_l ni ns k' a
  end.

Definition bind_ok_l (P : mplan) : bool :=
  all (fun b => layout_of_input_l (size (ml_inputs P)) (ml_nodes P) (size (ml_nodes P)) b.1) (mp_inputs P).

Lemma bind_ok_lE P : bind_ok_l P = bind_ok P.
Proof. by []. Qed.

(** Everything [mcheck] checks but [bind_ok]. *)
Definition mcheck_core (P : mplan) (c : seq mfact) : bool :=
  let ls := lrun_s (ml_inputs P) (ml_nodes P) in
  all (fun p => 0 < p) (mesh P) &&
  all (fun b => (b.1 < size ls) && mpl_ok (mesh P) (nth [::] ls b.1) b.2) (mp_inputs P) &&
  mcheck_nodes P ls (mp_inputs P) (mp_nodes P) c &&
  all (mcheck_output ls (mp_inputs P ++ c)) (mp_outputs P).

Definition mcheck (P : mplan) (c : seq mfact) : bool := bind_ok_l P && mcheck_core P c.

(** A certificate may name auxiliary logical values ([xs], appended to the logical graph: a
    constant the program uses and the logical graph never computes); the outputs still read the
    plan's own logical nodes, so the plan's meaning is unchanged ([MeshSound.mcheckx_sound]). *)
Definition with_lnodes (P : mplan) (xs : seq gnode) : mplan :=
  MPlan (mesh P) (ml_inputs P) (ml_nodes P ++ xs) (mp_inputs P) (mp_nodes P) (mp_outputs P).

Definition mcheckx (P : mplan) (xs : seq gnode) (c : seq mfact) : bool :=
  all (fun o => o.1.1 < size (ml_inputs P) + size (ml_nodes P)) (mp_outputs P) &&
  all (fun b => b.1 < size (ml_inputs P) + size (ml_nodes P)) (mp_inputs P) && bind_ok_l P &&
  mcheck_core (with_lnodes P xs) c.

End JMeshCheck.
