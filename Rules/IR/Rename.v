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
From TVCert Require Import IR.Syntax IR.Denote IR.LayoutOps IR.Mesh IR.MeshCheck.
Set Implicit Arguments.
Unset Strict Implicit.
Unset Printing Implicit Defensive.
Import JSyntax JDenote JLayout JMesh JMeshCheck.

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

End JRename.
