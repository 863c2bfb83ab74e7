(** * tvcert IR, stage 1: the checker.

    [check P c] is plain computation on naturals and lists (run it with
    [vm_compute]).  The certificate [c] gives, for every node of the parallel
    program in order, a fact [(l, pl)]: "on every rank this node holds the piece,
    under placement [pl], of the logical node [l]".  The facts of the parallel
    inputs are their declared bindings.  Each fact is accepted only if [derive]
    accepts it from the facts of the node's operands:
    - a collective turns the operand's fact into another placement of the same
      logical tensor (all_reduce(sum): Partial(sum) -> Replicate; all_gather(d):
      Shard(d) -> Replicate);
    - a local op must be the op of logical node [l] applied to exactly the
      logical operands of its inputs' facts (congruence), and [rule] must accept
      the placements and shapes. *)
From mathcomp Require Import all_ssreflect.
From TVCert Require Import IR.Syntax IR.Denote.
Import JSyntax JDenote.

Module JCheck.

Definition fact := (nat * placement)%type.
Definition dfact : fact := (0, Replicate).

Definition is_rep (pl : placement) : bool := if pl is Replicate then true else false.
Definition is_psum (pl : placement) : bool := if pl is Partial RSum then true else false.

(** Shapes of every logical node: the shape part of [run]. *)
Fixpoint run_s (p : nat) (ss : seq shape) (ns : seq node) : seq shape :=
  match ns with
  | [::] => ss
  | n :: ns' => run_s p (rcons ss (op_shape p (n_op n) (map (nth [::] ss) (n_args n)))) ns'
  end.

Definition shard_ok (p : nat) (s : shape) (d : nat) : bool :=
  (d < size s) && (nth 0 s d %/ p * p == nth 0 s d).
Definition pl_ok (p : nat) (s : shape) (pl : placement) : bool :=
  if pl is Shard d then shard_ok p s d else true.

(** Operand of shape [s] of a broadcasting op with output shape [so], output
    sharded on [d]: the operand is the trailing part of the output shape and
    either lacks dim [d] (and is replicated) or is sharded on it. *)
Definition bin_shard (so s : shape) (a : placement) (d : nat) : bool :=
  let off := size so - size s in
  (size s <= size so) && (s == drop off so) &&
  match a with
  | Replicate => d < off
  | Shard d' => (off <= d) && (d' == d - off)
  | Partial _ => false
  end.

Definition mm_ok (ss : seq shape) : bool :=
  let s0 := nth [::] ss 0 in let s1 := nth [::] ss 1 in
  (size s0 == 2) && (size s1 == 2) && (nth 0 s0 1 == nth 0 s1 0).

Definition swapi (d0 d1 d : nat) : nat := if d == d0 then d1 else if d == d1 then d0 else d.

Definition sh (pl : placement) : option nat := if pl is Shard d then Some d else None.

(** Placement rules for a local op [o] whose logical operands have shapes [ss]
    and whose local operands have placements [pls]; [pl] is the claimed result.
    Each line names the rule. *)
Definition rule (o : op) (ss : seq shape) (pls : seq placement) (pl : placement) : bool :=
  let so := op_shape 1 o ss in
  let s0 := nth [::] ss 0 in
  let s1 := nth [::] ss 1 in
  if all is_rep pls then is_rep pl else                    (* congruence on every rank *)
  match pls with
  | [:: a] =>
      match o with
      | Neg | Scale _ =>
          ((sh a != None) && (sh pl == sh a))               (* pointwise op of a shard *)
          || (is_psum a && is_psum pl)                      (* linear op of a partial sum *)
      | Square | Fn _ => (sh a != None) && (sh pl == sh a)   (* pointwise op of a shard *)
      | Transpose d0 d1 =>                                  (* transpose of a shard *)
          (d0 < size s0) && (d1 < size s0) &&
          (if sh a is Some d then sh pl == Some (swapi d0 d1 d) else false)
      | Sum [:: e] =>
          if sh a is Some d then
            if e == d then is_psum pl                       (* sum over the sharded dim *)
            else (e < size s0) && (sh pl == Some (if e < d then d.-1 else d))  (* other dim *)
          else false
      | _ => false
      end
  | [:: a; b] =>
      match o with
      | Add | Sub =>
          (if sh pl is Some d then bin_shard so s0 a d && bin_shard so s1 b d else false)
          || (is_psum a && is_psum b && is_psum pl && (s0 == so) && (s1 == so))
      | Mul | Div => if sh pl is Some d then bin_shard so s0 a d && bin_shard so s1 b d else false
      | MM => mm_ok ss &&
          ((is_rep a && (sh b == Some 1) && (sh pl == Some 1))        (* column parallel *)
           || ((sh a == Some 0) && is_rep b && (sh pl == Some 0))     (* rows of the lhs *)
           || ((sh a == Some 1) && (sh b == Some 0) && is_psum pl)    (* row parallel *)
           || (is_psum a && is_rep b && is_psum pl)                   (* partial @ replicated *)
           || (is_rep a && is_psum b && is_psum pl))                  (* replicated @ partial *)
      | _ => false
      end
  | _ => false
  end.

Section Checker.
Variable P : plan.
Let p := mesh_size P.
Let ni := size (l_inputs P).
Let ls := run_s 1 (l_inputs P) (l_nodes P).

Definition derive (n : node) (af : seq fact) (c : fact) : bool :=
  let: (l, pl) := c in
  match n_op n, af with
  | AllReduce RSum, [:: (l1, Partial RSum)] => (l == l1) && is_rep pl
  | AllGather d, [:: (l1, Shard d')] => (l == l1) && (d == d') && is_rep pl
  | AllReduce _, _ | AllGather _, _ => false
  | o, _ =>
      let ln := nth (Node Add [::]) (l_nodes P) (l - ni) in
      (ni <= l) && (l < size ls) && op_eqb (n_op ln) o &&
      (n_args ln == map fst af) && all (fun a => a < l) (n_args ln) &&
      rule o (map (nth [::] ls) (map fst af)) (map snd af) pl
  end && pl_ok p (nth [::] ls l) pl.

Fixpoint check_nodes (facts : seq fact) (ns : seq node) (c : seq fact) : bool :=
  match ns, c with
  | [::], [::] => true
  | n :: ns', f :: c' =>
      all (fun a => a < size facts) (n_args n) &&
      derive n (map (nth dfact facts) (n_args n)) f &&
      check_nodes (rcons facts f) ns' c'
  | _, _ => false
  end.

Definition check_output (facts : seq fact) (o : nat * nat * placement) : bool :=
  let: (lo, po, pl) := o in
  (lo < size ls) && (po < size facts) &&
  ((nth dfact facts po).1 == lo) && placement_eqb (nth dfact facts po).2 pl.

Definition check (c : seq fact) : bool :=
  (0 < p) &&
  all (fun b => (b.1 < ni) && pl_ok p (nth [::] (l_inputs P) b.1) b.2) (p_inputs P) &&
  check_nodes (p_inputs P) (p_nodes P) c &&
  all (check_output (p_inputs P ++ c)) (p_outputs P).

End Checker.

End JCheck.
