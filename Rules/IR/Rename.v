(** * tvcert IR: renaming node ids, the substitution lemmas of stage memoization (issue 14).

    Plans are flat node lists; a node names its operands by id (position in the environment,
    inputs first).  The [L] layers of a model are [L] copies of one stage that differ only in
    the ids they read.  A renaming [f : nat -> nat] maps a stage's ids to an instance's ids:
    [rename_g f] / [rename_p f] apply it to a logical / parallel node's operands.

    Everything is proved once for a generic evaluator [run step] (each node appends [step env n]
    to the environment) whose [step] reads the environment only at the node's operands
    ([step_local]); [lrun] and [mrun] are instances ([lrunE], [mrunE]).

    - [agree f e' e]: the template's environment [e'] is the instance's [e] read through [f]
      (id [a] of [e'] is id [f a] of [e]).  [pull f e k] is the canonical such [e'] ("[e o f]").
    - [run_rename]: if [e'] agrees with [e] through [f], and [f] sends the segment's own ids
      ([size e' + j]) to the instance's ([size e + j]), then running the renamed segment from [e]
      agrees with running the template from [e']; [run_rename_at]: node [j] of the instance has
      the value of node [j] of the template.  Stated for [lrun] ([lrun_rename_at]) and for
      [mrun] on every mesh ([mrun_rename_at]): the renamed program's meaning is the renamed
      meaning.
    - [instance_ok]: a boolean check ([vm_compute]) that a stretch of a node list is the template
      renamed ([gnode_eqb], [pnode_eqb]); [lrun_instance_at] / [mrun_instance_at]: in a whole node
      list, node [j] of a checked instance has the value of node [j] of the template.
    - [mcheck_nodes_cat]: the checker runs a node list piece by piece (prefix, stage, rest).
    - [mcheck_nodes_rename]: the checker's per-node work [mderive] ignores the parallel node's
      operand ids ([mderive_rename_p]), so a certificate segment [c] accepted for a parallel
      template from facts [facts'] is accepted for the renamed instance from any [facts] that
      agree with [facts'] through [f].

    How the memoized checker will use them (design for the next session).  A certificate lists
    the distinct stages (a parallel template [ns], its facts [c], the facts [facts'] of the values
    it reads) and the stage instances, each as (start, renaming table of the stage's inputs).  The
    checker checks each stage once with [mcheck_nodes], then each instance by (a) equality of the
    instance's node list with [map (rename_p f) ns] (boolean, [pnode] has decidable equality via
    [gop_eqb]), (b) [agree] for the stage's inputs (a table lookup per input: the facts the instance
    reads are the template's), and transports the facts with [mcheck_nodes_rename] instead of
    re-running [mderive] per node.  What is left (not proved here): the logical side of the
    renaming.  A layer's facts name different *logical* ids, so [c] itself must be renamed by a
    logical renaming [g]; that needs [mderive P ls n (map (rename_f g) af) (rename_f g fact) =
    mderive P ls n af fact] when the logical graph is renamed consistently ([lnode (g l) =
    rename_g g (lnode l)], [ls (g l) = ls l], [g] monotone on the stage so [a < l] and [ni <= l]
    are kept) -- [veq], [comm_ok], [dedup_ok] walk the logical graph by id, so each needs its own
    invariance lemma.  With that, [lrun_rename_at] carries the logical values across instances,
    and [mcheck_sound] applies to the expanded plan unchanged (the memoized checker computes the
    same boolean as [mcheck] on the expanded certificate). *)
From mathcomp Require Import all_ssreflect all_algebra.
From TVCert Require Import IR.Syntax IR.Denote IR.LayoutOps IR.LayoutRule IR.Mesh IR.MeshCheck.
Set Implicit Arguments.
Unset Strict Implicit.
Unset Printing Implicit Defensive.
Import JSyntax JDenote JLayout JLayoutRule JMesh JMeshCheck.

Module JRename.

(** ** A generic evaluator over a flat node list *)
Section Run.
Variables (T N : Type) (d : T).
Variable step : seq T -> N -> T.       (* the value of a node in an environment *)
Variable args : N -> seq nat.          (* the ids a node reads *)
Variable ren : (nat -> nat) -> N -> N. (* a node with its operand ids renamed *)

Fixpoint run (e : seq T) (ns : seq N) : seq T :=
  match ns with
  | [::] => e
  | n :: ns' => run (rcons e (step e n)) ns'
  end.

Lemma size_run e ns : size (run e ns) = size e + size ns.
Proof. by elim: ns e => [|n ns IH] e /=; rewrite ?addn0 // IH size_rcons addSnnS. Qed.

(** Each node reads only ids before it ([k] values precede the segment). *)
Fixpoint scoped (k : nat) (ns : seq N) : bool :=
  match ns with
  | [::] => true
  | n :: ns' => all (fun a => a < k) (args n) && scoped k.+1 ns'
  end.

(** The template environment [e'] is the instance's [e] read through [f]. *)
Definition agree (f : nat -> nat) (e' e : seq T) : Prop :=
  forall a, a < size e' -> f a < size e /\ nth d e' a = nth d e (f a).

(** [e o f] on the ids [0 .. k-1]. *)
Definition pull (f : nat -> nat) (e : seq T) (k : nat) : seq T :=
  map (fun a => nth d e (f a)) (iota 0 k).

Lemma agree_pull f e k : (forall a, a < k -> f a < size e) -> agree f (pull f e k) e.
Proof.
move=> Hf a; rewrite size_map size_iota => lt; split; first exact: Hf.
by rewrite (nth_map 0) ?size_iota // nth_iota.
Qed.

(** [f] sends the segment's own ids to the instance's. *)
Definition shifts (f : nat -> nat) (k m n : nat) : Prop := forall j, j < n -> f (k + j) = m + j.

Lemma agree_rcons f e' e x : agree f e' e -> f (size e') = size e -> agree f (rcons e' x) (rcons e x).
Proof.
move=> H Hf a; rewrite size_rcons ltnS leq_eqVlt => /orP [/eqP ->|lt].
  by rewrite Hf size_rcons ltnSn !nth_rcons !ltnn !eqxx.
have [lt' eq] := H a lt.
by rewrite size_rcons ltnS ltnW // !nth_rcons lt lt'.
Qed.

Lemma shifts_behead f k m n : shifts f k m n.+1 -> shifts f k.+1 m.+1 n.
Proof. by move=> H j lt; rewrite !addSnnS; apply: H. Qed.

Lemma shifts_head f k m n : shifts f k m n.+1 -> f k = m.
Proof. by move/(_ 0 isT); rewrite !addn0. Qed.

(** [step] reads the environment only at the node's operands. *)
Hypothesis step_local : forall f e' e n,
  (forall a, a \in args n -> nth d e (f a) = nth d e' a) -> step e (ren f n) = step e' n.

Lemma step_rename f e' e n :
  agree f e' e -> all (fun a => a < size e') (args n) -> step e (ren f n) = step e' n.
Proof. by move=> H Hn; apply: step_local => a /(allP Hn) /H []. Qed.

(** The renamed segment run from [e] agrees with the template run from [e']. *)
Lemma run_rename f e' e ns :
  agree f e' e -> scoped (size e') ns -> shifts f (size e') (size e) (size ns) ->
  agree f (run e' ns) (run e (map (ren f) ns)).
Proof.
elim: ns e' e => [|n ns IH] e' e //= H /andP [Hn Hs] Hf.
rewrite (step_rename H Hn); apply: IH; rewrite ?size_rcons //; last exact: shifts_behead.
by apply: agree_rcons => //; apply: shifts_head Hf.
Qed.

(** Node [j] of the instance has the value of node [j] of the template. *)
Lemma run_rename_at f e' e ns j :
  agree f e' e -> scoped (size e') ns -> shifts f (size e') (size e) (size ns) -> j < size ns ->
  nth d (run e (map (ren f) ns)) (size e + j) = nth d (run e' ns) (size e' + j).
Proof.
move=> H Hs Hf lt; have H' := run_rename H Hs Hf; rewrite /agree in H'.
have [|_ ->] := H' (size e' + j); first by rewrite size_run ltn_add2l.
by rewrite Hf.
Qed.

(** ** Instances inside a larger node list *)
Lemma run_cat e xs ys : run e (xs ++ ys) = run (run e xs) ys.
Proof. by elim: xs e => [|x xs IH] e //=. Qed.

(** A value once computed stays: later nodes only append. *)
Lemma nth_run_prefix e ns i : i < size e -> nth d (run e ns) i = nth d e i.
Proof.
elim: ns e => [|n ns IH] e //= lt.
by rewrite IH ?size_rcons 1?ltnW // nth_rcons lt.
Qed.

(** Node [j] of an instance placed after [pre] (and before [post]) in a node list has the
    value of node [j] of the template. *)
Lemma run_instance_at f e' e pre tmpl post j :
  agree f e' (run e pre) -> scoped (size e') tmpl ->
  shifts f (size e') (size e + size pre) (size tmpl) -> j < size tmpl ->
  nth d (run e (pre ++ map (ren f) tmpl ++ post)) (size e + size pre + j) =
  nth d (run e' tmpl) (size e' + j).
Proof.
move=> H Hs Hf lt; rewrite !run_cat nth_run_prefix; last first.
  by rewrite !size_run size_map ltn_add2l.
by rewrite -(size_run e pre); apply: run_rename_at; rewrite ?size_run.
Qed.

End Run.

(** ** Renaming a node's operands *)
Definition rename_g (f : nat -> nat) (n : gnode) : gnode := GNode (g_op n) (map f (g_args n)).

Definition rename_p (f : nat -> nat) (n : pnode) : pnode :=
  match n with
  | PLocal o a => PLocal o (map f a)
  | PColl cl k a => PColl cl k (f a)
  end.

Lemma pargs_rename_p f n : pargs (rename_p f n) = map f (pargs n).
Proof. by case: n. Qed.

(** ** Checking that a stretch of a node list is an instance (boolean, for [vm_compute]) *)
Lemma gop_eqb_eq a b : gop_eqb a b -> a = b.
Proof. by case: a => a; case: b => b //=; [move/op_eqbP -> | move/lop_eqbP ->]. Qed.

Definition gnode_eqb (a b : gnode) : bool := gop_eqb (g_op a) (g_op b) && (g_args a == g_args b).

Lemma gnode_eqb_eq a b : gnode_eqb a b -> a = b.
Proof. by case: a => o a; case: b => o' a' /andP [/= /gop_eqb_eq -> /eqP ->]. Qed.

Definition coll_eqb (a b : coll) : bool :=
  match a, b with
  | CAllReduce r, CAllReduce q => reduce_op_eqb r q
  | CAllGather d, CAllGather e | CReduceScatter d, CReduceScatter e => d == e
  | CSliceRank d m, CSliceRank e n => (d == e) && (m == n)
  | _, _ => false
  end.

Lemma coll_eqb_eq a b : coll_eqb a b -> a = b.
Proof.
case: a => [r|d|d|d m]; case: b => [q|e|e|e n] //=; first by move/reduce_op_eqbP ->.
- by move/eqP ->.
- by move/eqP ->.
by move=> /andP [/eqP -> /eqP ->].
Qed.

Definition pnode_eqb (a b : pnode) : bool :=
  match a, b with
  | PLocal o a, PLocal o' a' => gop_eqb o o' && (a == a')
  | PColl c k x, PColl c' k' x' => coll_eqb c c' && (k == k') && (x == x')
  | _, _ => false
  end.

Lemma pnode_eqb_eq a b : pnode_eqb a b -> a = b.
Proof.
case: a => [o a|c k x]; case: b => [o' a'|c' k' x'] //=.
  by move=> /andP [/gop_eqb_eq -> /eqP ->].
by move=> /andP [/andP [/coll_eqb_eq -> /eqP ->] /eqP ->].
Qed.

Fixpoint all2b {A : Type} (eqb : A -> A -> bool) (xs ys : seq A) : bool :=
  match xs, ys with
  | [::], [::] => true
  | x :: xs', y :: ys' => eqb x y && all2b eqb xs' ys'
  | _, _ => false
  end.

Lemma all2b_eq {A : Type} (eqb : A -> A -> bool) :
  (forall a b, eqb a b -> a = b) -> forall xs ys, all2b eqb xs ys -> xs = ys.
Proof.
move=> E; elim=> [|x xs IH] [|y ys] //= /andP [/E -> /IH ->] //.
Qed.

(** The [size tmpl] nodes of [ns] from [start] are the template renamed by [f]. *)
Definition instance_ok {A : Type} (eqb : A -> A -> bool) (ren : (nat -> nat) -> A -> A)
    (ns : seq A) (start : nat) (f : nat -> nat) (tmpl : seq A) : bool :=
  all2b eqb (take (size tmpl) (drop start ns)) (map (ren f) tmpl).

Lemma instance_okP {A : Type} (eqb : A -> A -> bool) ren ns start f (tmpl : seq A) :
  (forall a b, eqb a b -> a = b) -> instance_ok eqb ren ns start f tmpl ->
  ns = take start ns ++ map (ren f) tmpl ++ drop (start + size tmpl) ns.
Proof.
move=> E /(all2b_eq E) H.
by rewrite -H addnC -drop_drop cat_take_drop cat_take_drop.
Qed.

Lemma instance_ok_start {A : Type} (eqb : A -> A -> bool) ren ns start f (tmpl : seq A) :
  instance_ok eqb ren ns start f tmpl -> 0 < size tmpl -> size (take start ns) = start.
Proof.
move=> I pos; rewrite size_take; case: ltnP => // le; move: I pos.
by case: tmpl => // t tmpl; rewrite /instance_ok drop_oversize.
Qed.

Section Values.
Variable R : realFieldType.
Variable fn : nat -> R -> R.

(** ** The logical graph *)
Lemma lrunE env ns : lrun fn env ns = run (@lrun_node R fn) env ns.
Proof. by elim: ns env => [|n ns IH] env //=; rewrite IH. Qed.

Lemma lrun_node_local f e' e n :
  (forall a, a \in g_args n -> nth (ldflt R) e (f a) = nth (ldflt R) e' a) ->
  lrun_node fn e (rename_g f n) = lrun_node fn e' n.
Proof.
move=> H; rewrite /lrun_node /=.
have -> : map (nth (ldflt R) e) (map f (g_args n)) = map (nth (ldflt R) e') (g_args n).
  by rewrite -map_comp; apply/eq_in_map => a /H.
by [].
Qed.

(** The renamed logical segment computes, node by node, the template's values. *)
Lemma lrun_rename_at f e' e ns j :
  agree (ldflt R) f e' e -> scoped g_args (size e') ns -> shifts f (size e') (size e) (size ns) ->
  j < size ns ->
  nth (ldflt R) (lrun fn e (map (rename_g f) ns)) (size e + j) = nth (ldflt R) (lrun fn e' ns) (size e' + j).
Proof. by rewrite !lrunE; apply: run_rename_at; apply: lrun_node_local. Qed.

(** The same, from [e o f]: the denotation of a renamed segment is the renamed denotation. *)
Lemma lrun_rename_pull f e ns k j :
  (forall a, a < k -> f a < size e) -> scoped g_args k ns -> shifts f k (size e) (size ns) ->
  j < size ns ->
  nth (ldflt R) (lrun fn e (map (rename_g f) ns)) (size e + j) =
  nth (ldflt R) (lrun fn (pull (ldflt R) f e k) ns) (k + j).
Proof.
move=> Hf Hs Hsh lt.
have Hk : size (pull (ldflt R) f e k) = k by rewrite size_map size_iota.
have := @lrun_rename_at f (pull (ldflt R) f e k) e ns j; rewrite Hk; apply => //.
exact: agree_pull.
Qed.

(** A stretch of the logical graph checked to be an instance computes the template's values. *)
Lemma lrun_instance_at f e' e ns start tmpl j :
  instance_ok gnode_eqb rename_g ns start f tmpl ->
  agree (ldflt R) f e' (lrun fn e (take start ns)) -> scoped g_args (size e') tmpl ->
  shifts f (size e') (size e + start) (size tmpl) -> j < size tmpl ->
  nth (ldflt R) (lrun fn e ns) (size e + start + j) = nth (ldflt R) (lrun fn e' tmpl) (size e' + j).
Proof.
move=> I H Hs Hf lt; have Hst := instance_ok_start I (leq_ltn_trans (leq0n j) lt).
rewrite (instance_okP gnode_eqb_eq I) !lrunE.
have -> : size e + start + j = size e + size (take start ns) + j by rewrite Hst.
apply: (run_instance_at (@lrun_node_local)) => //; rewrite ?Hst -?lrunE //.
Qed.

(** ** The parallel program, on every rank of every mesh *)
Lemma mrunE ms env ns : mrun fn ms env ns = run (mrun_node fn ms) env ns.
Proof. by elim: ns env => [|n ns IH] env //=; rewrite IH. Qed.

Lemma mrun_node_local ms f e' e n :
  (forall a, a \in pargs n -> nth (mdflt R) e (f a) = nth (mdflt R) e' a) ->
  mrun_node fn ms e (rename_p f n) = mrun_node fn ms e' n.
Proof.
case: n => [o a|cl k x] /= H; last by rewrite H // mem_seq1.
have -> : map (nth (mdflt R) e) (map f a) = map (nth (mdflt R) e') a.
  by rewrite -map_comp; apply/eq_in_map => x /H.
by [].
Qed.

Lemma mrun_rename_at ms f e' e ns j :
  agree (mdflt R) f e' e -> scoped pargs (size e') ns -> shifts f (size e') (size e) (size ns) ->
  j < size ns ->
  nth (mdflt R) (mrun fn ms e (map (rename_p f) ns)) (size e + j) =
  nth (mdflt R) (mrun fn ms e' ns) (size e' + j).
Proof. by rewrite !mrunE; apply: run_rename_at; apply: mrun_node_local. Qed.

Lemma mrun_instance_at ms f e' e ns start tmpl j :
  instance_ok pnode_eqb rename_p ns start f tmpl ->
  agree (mdflt R) f e' (mrun fn ms e (take start ns)) -> scoped pargs (size e') tmpl ->
  shifts f (size e') (size e + start) (size tmpl) -> j < size tmpl ->
  nth (mdflt R) (mrun fn ms e ns) (size e + start + j) = nth (mdflt R) (mrun fn ms e' tmpl) (size e' + j).
Proof.
move=> I H Hs Hf lt; have Hst := instance_ok_start I (leq_ltn_trans (leq0n j) lt).
rewrite (instance_okP pnode_eqb_eq I) !mrunE.
have -> : size e + start + j = size e + size (take start ns) + j by rewrite Hst.
apply: (run_instance_at (@mrun_node_local ms)) => //; rewrite ?Hst -?mrunE //.
Qed.

End Values.

(** ** The checker: a parallel renaming transports an accepted certificate segment *)
Lemma mderive_rename_p P ls f n : mderive P ls (rename_p f n) = mderive P ls n.
Proof. by case: n. Qed.

Lemma mcheck_nodes_rename P ls f facts' facts ns c :
  agree dmfact f facts' facts -> shifts f (size facts') (size facts) (size ns) ->
  mcheck_nodes P ls facts' ns c -> mcheck_nodes P ls facts (map (rename_p f) ns) c.
Proof.
elim: ns facts' facts c => [|n ns IH] facts' facts [|fc c] //= H Hf.
move=> /andP [/andP [Hr Hd] Hc].
have Hin a : a \in pargs n -> a < size facts' by move/(allP Hr); rewrite ltszE.
have Hnth : map (nth dmfact facts) (pargs (rename_p f n)) = map (nth dmfact facts') (pargs n).
  by rewrite pargs_rename_p -map_comp; apply/eq_in_map => a /Hin /H [] _ ->.
apply/andP; split; first (apply/andP; split).
- by rewrite pargs_rename_p all_map; apply/allP => a /Hin /H [] lt _; rewrite /= ltszE.
- by rewrite mderive_rename_p Hnth.
- apply: IH Hc; last by rewrite !size_rcons; exact: shifts_behead.
  by apply: agree_rcons => //; apply: shifts_head Hf.
Qed.

(** The checker runs a node list piece by piece: the prefix, then each stage from the facts so far. *)
Lemma mcheck_nodes_cat P ls facts xs ys cx cy : size xs = size cx ->
  mcheck_nodes P ls facts (xs ++ ys) (cx ++ cy) =
  mcheck_nodes P ls facts xs cx && mcheck_nodes P ls (facts ++ cx) ys cy.
Proof.
elim: xs cx facts => [|x xs IH] [|fc cx] facts //=; first by rewrite cats0.
case=> Hs; rewrite IH // cat_rcons.
by case: (all _ _); case: (mderive _ _ _ _ _).
Qed.

(** ** The logical side of a renaming (first brick; the rest is in the header) *)
Section Logical.
Variables (P : mplan) (ls : seq shape) (g : nat -> nat).
Let ni := size (ml_inputs P).

(** [g] is a graph morphism at logical id [l]: it keeps [l]'s shape and keeps it in the graph;
    if [l] is a node, [g l] is a node of the same op on the renamed operands, each before it. *)
Definition lmorph_at (l : nat) : Prop :=
  [/\ lsh ls (g l) = lsh ls l, l < size ls -> g l < size ls &
      ni <= l -> [/\ ni <= g l, lnode P (g l) = rename_g g (lnode P l) &
                     forall a, a \in g_args (lnode P l) -> a < l -> g a < g l]].

Lemma node_is_args l o args : node_is P ls l o args -> g_args (lnode P l) = args /\ ni <= l.
Proof. by move=> /andP [/andP [/andP [/andP [_ /eqP ->] ->]]]. Qed.

Lemma node_is_rename l o args :
  lmorph_at l -> node_is P ls l o args -> node_is P ls (g l) o (map g args).
Proof.
case=> _ Hsz Hn; rewrite /node_is.
move=> /andP [/andP [/andP [/andP [Ho /eqP Ha] Hni]]]; rewrite !ltszE => /Hsz -> Hall.
have [Hni' Hln Hlt] := Hn Hni.
rewrite Hln /= Ho Ha eqxx (Hni' : size (ml_inputs P) <= g l) /= all_map; apply/allP => a Hin /=.
by apply: Hlt; [rewrite Ha | apply: (allP Hall)].
Qed.

Lemma arg0_rename l x : lmorph_at l -> ni <= l -> g_args (lnode P l) = [:: x] -> arg0 P (g l) = g x.
Proof. by case=> _ _ Hn /Hn [_ Hl _] Ha; rewrite /arg0 Hl /= Ha. Qed.

Lemma g_op_rename l : lmorph_at l -> ni <= l -> g_op (lnode P (g l)) = g_op (lnode P l).
Proof. by case=> _ _ Hn /Hn [_ -> _]. Qed.

(** [rr_back b a] names [a]'s chain: [a] and its operand are nodes, of one operand each. *)
Lemma rr_back_args b a : rr_back P ls b a ->
  [/\ g_args (lnode P a) = [:: arg0 P a], ni <= a, g_args (lnode P (arg0 P a)) = [:: b] & ni <= arg0 P a].
Proof.
move=> /andP [/node_is_args [Ea Hni]]; case: (g_op (lnode P (arg0 P a))) => [//|[] //] s1.
by move=> /andP [/node_is_args [Ea1 Hni1] _].
Qed.

Lemma rr_back_rename b a : (forall l, l \in [:: a; arg0 P a; b] -> lmorph_at l) ->
  rr_back P ls b a -> rr_back P ls (g b) (g a).
Proof.
move=> M; have Ma := M a (mem_head _ _).
have Ma1 : lmorph_at (arg0 P a) by apply: M; rewrite !inE eqxx !orbT.
have [Hb _ _] : lmorph_at b by apply: M; rewrite !inE eqxx !orbT.
move=> H; have [Ea Hni Ea1 Hni1] := rr_back_args H; move: H.
rewrite /rr_back (arg0_rename Ma Hni Ea) (g_op_rename Ma1 Hni1) Hb => /andP [Ha].
move: (node_is_rename Ma Ha) => /= -> /=.
case: (g_op (lnode P (arg0 P a))) => [//|[] //] s1 /andP [H1 Hp].
by move: (node_is_rename Ma1 H1) => /= ->.
Qed.

Lemma pp_back_rename b a :
  (forall l, l \in [:: a; arg0 P a; arg0 P (arg0 P a); arg0 P (arg0 P (arg0 P a)); b] -> lmorph_at l) ->
  pp_back P ls b a -> pp_back P ls (g b) (g a).
Proof.
move=> M; have Ma := M a (mem_head _ _).
have Ma1 : lmorph_at (arg0 P a) by apply: M; rewrite !inE eqxx !orbT.
have Ma2 : lmorph_at (arg0 P (arg0 P a)) by apply: M; rewrite !inE eqxx !orbT.
have Ma3 : lmorph_at (arg0 P (arg0 P (arg0 P a))) by apply: M; rewrite !inE eqxx !orbT.
have [Hb _ _] : lmorph_at b by apply: M; rewrite !inE eqxx !orbT.
rewrite /pp_back => /andP [/andP [/andP [Ha Hrr] H3] Hs].
have [Ea Hni] := node_is_args Ha.
have [Ea1 Hni1 Ea2 Hni2] := rr_back_args Hrr.
rewrite (arg0_rename Ma Hni Ea) (arg0_rename Ma1 Hni1 Ea1) (arg0_rename Ma2 Hni2 Ea2) Hb Hs.
move: (node_is_rename Ma Ha) (node_is_rename Ma3 H3) => /= -> ->.
rewrite rr_back_rename // => l; rewrite !inE => /or3P [] /eqP ->; by [].
Qed.

Lemma sum_flat_rename b a :
  (forall l, l \in [:: a; arg0 P a; arg0 P (arg0 P a); b; arg0 P b] -> lmorph_at l) ->
  sum_flat P ls b a -> sum_flat P ls (g b) (g a).
Proof.
move=> M; have Ma := M a (mem_head _ _).
have Ma1 : lmorph_at (arg0 P a) by apply: M; rewrite !inE eqxx !orbT.
have Ma2 : lmorph_at (arg0 P (arg0 P a)) by apply: M; rewrite !inE eqxx !orbT.
have Mb : lmorph_at b by apply: M; rewrite !inE eqxx !orbT.
have Md : lmorph_at (arg0 P b) by apply: M; rewrite !inE eqxx !orbT.
have [Hd _ _] := Md.
rewrite /sum_flat => /andP [/andP [/andP [Ha Hb] Hsz] Hor].
have [Ea Hni] := node_is_args Ha; have [Eb Hnib] := node_is_args Hb.
rewrite (arg0_rename Ma Hni Ea) (arg0_rename Mb Hnib Eb) Hd Hsz.
move: (node_is_rename Ma Ha) (node_is_rename Mb Hb) => /= -> -> /=.
case/orP: Hor => [H1|/andP [/andP [H2 H1] H3]].
  by move: (node_is_rename Ma1 H1) => /= ->.
have [Ea1 Hni1] := node_is_args H1.
rewrite (arg0_rename Ma1 Hni1 Ea1).
move: (node_is_rename Ma1 H1) (node_is_rename Ma2 H3) => /= -> ->.
by rewrite H2; case: (node_is _ _ _ _ _).
Qed.

(** The ids [veq b a] reads. *)
Definition veq_touched (b a : nat) : seq nat :=
  [:: a; arg0 P a; arg0 P (arg0 P a); arg0 P (arg0 P (arg0 P a)); b; arg0 P b].

Lemma veq_ni b a : match g_op (lnode P a) with
  | GL (Reshape _) => rr_back P ls b a | GL (Permute _) => pp_back P ls b a
  | GO (Sum _) => sum_flat P ls b a | _ => false end -> ni <= a.
Proof.
case: (g_op (lnode P a)) => [[]|[]] //= x.
- by move=> /andP [/andP [/andP [/node_is_args [_ Hn] _] _] _].
- by case/rr_back_args.
by move=> /andP [/andP [/andP [/node_is_args [_ Hn] _] _] _].
Qed.

(** A logical renaming that is a graph morphism at the ids [veq] reads keeps an equality of
    logical values. *)
Lemma veq_rename b a : (forall l, l \in veq_touched b a -> lmorph_at l) ->
  veq P ls b a -> veq P ls (g b) (g a).
Proof.
move=> M; have Ma : lmorph_at a by apply: M; rewrite !inE eqxx.
rewrite /veq => /orP [/eqP -> | H]; first by rewrite eqxx.
apply/orP; right; move: H (veq_ni H) => H Hni; rewrite (g_op_rename Ma Hni); move: H.
case: (g_op (lnode P a)) => [[]|[]] // * /=;
  [apply: sum_flat_rename | apply: rr_back_rename | apply: pp_back_rename] => // l Hl;
  apply: M; rewrite /veq_touched; move: Hl; rewrite !inE;
  do ![case/orP=> [/eqP->|]]; try move/eqP->; by rewrite ?eqxx ?orbT.
Qed.

(** The ids [comm_ok k o l xs] reads. *)
Definition step_arg (x : nat) : nat := if lsh ls x == [::] then x else arg0 P x.

Fixpoint comm_touched (k l : nat) (xs : seq nat) : seq nat :=
  l :: xs ++ match k with
             | 0 => [::]
             | k'.+1 => arg0 P l :: map (arg0 P) xs ++ comm_touched k' (arg0 P l) (map step_arg xs)
             end.

Lemma comm_ok_rename k o l xs : (forall y, y \in comm_touched k l xs -> lmorph_at y) ->
  comm_ok P ls k o l xs -> comm_ok P ls k o (g l) (map g xs).
Proof.
elim: k l xs => [|k IH] l xs M.
  have Ml : lmorph_at l by apply: M; rewrite mem_head.
  by move=> /= /orP [H|//]; rewrite (node_is_rename Ml H).
have Ml : lmorph_at l by apply: M; rewrite mem_head.
have Mxs x : x \in xs -> lmorph_at x by move=> Hx; apply: M; rewrite /= inE mem_cat Hx orbT.
have Ml' : lmorph_at (arg0 P l) by apply: M; rewrite /= inE mem_cat inE eqxx !orbT.
have Mxs' x : x \in xs -> lmorph_at (arg0 P x).
  by move=> Hx; apply: M; rewrite /= inE mem_cat inE mem_cat (map_f (arg0 P) Hx) !orbT.
move=> /= /orP [H|]; first by rewrite (node_is_rename Ml H).
case E: (g_op (lnode P l)) => [//|lo] /andP [/andP [/andP [/andP [Hl Hre] Hne] Hall] Hc].
have [El Hni] := node_is_args Hl.
have [Hsh' _ _] := Ml'.
have Hstep : map step_arg (map g xs) = map g (map step_arg xs).
  rewrite -!map_comp; apply/eq_in_map => x Hx /=; rewrite /step_arg.
  have [Hshx _ _] := Mxs x Hx; rewrite Hshx; case: ifP => // Hx0.
  move: (allP Hall x Hx); rewrite Hx0 /= => /andP [Hx1 _].
  by have [Ex Hnix] := node_is_args Hx1; rewrite (arg0_rename (Mxs x Hx) Hnix Ex).
move: (node_is_rename Ml Hl) => /= Hl'.
rewrite (g_op_rename Ml Hni) E (arg0_rename Ml Hni El) Hsh' Hre Hne Hl' /=.
apply/orP; right; apply/andP; split.
  rewrite all_map; apply/allP => x Hx /=; have [Hshx _ _] := Mxs x Hx; rewrite Hshx.
  move: (allP Hall x Hx); case: (lsh ls x == [::]) => //= /andP [Hx1 Hx2].
  have [Ex Hnix] := node_is_args Hx1; have [Hshx' _ _] := Mxs' x Hx.
  rewrite (arg0_rename (Mxs x Hx) Hnix Ex) Hshx' Hx2.
  by move: (node_is_rename (Mxs x Hx) Hx1) => /= ->.
move: (IH (arg0 P l) (map step_arg xs)); rewrite -Hstep /step_arg; apply => //.
by move=> y Hy; apply: M; rewrite /= inE mem_cat inE mem_cat /step_arg Hy !orbT.
Qed.

End Logical.

End JRename.
