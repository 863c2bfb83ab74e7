(** * The one-axis placement rules of the stage-1 ops.

    [rule o ss pls pl] is plain computation on naturals and lists (the mesh checker
    [MeshCheck.mrule] runs it under [vm_compute] on every mesh axis): on a mesh axis,
    operands of logical shapes [ss] with placements [pls] give the result of [o] the
    placement [pl].  [SoundOps.rule_sound] proves every line.  Not trusted. *)
From mathcomp Require Import all_ssreflect.
From TVCert Require Import IR.Syntax IR.Denote.
Import JSyntax JDenote.

Module JCheck.

Definition is_rep (pl : placement) : bool := if pl is Replicate then true else false.
Definition is_psum (pl : placement) : bool := if pl is Partial RSum then true else false.

Definition shard_ok (p : nat) (s : shape) (d : nat) : bool :=
  (d < size s) && (nth 0 s d %/ p * p == nth 0 s d).
Definition pl_ok (p : nat) (s : shape) (pl : placement) : bool :=
  if pl is Shard d then shard_ok p s d else true.

(** Operand of shape [s] of a broadcasting op with output shape [so], output
    sharded on [d]: the operand is aligned on the right with the output, each of
    its dims is the output's or 1 (broadcast, torch's size-1 rule), and it either
    does not vary along dim [d] (lacks it or has size 1 there) and is replicated,
    or holds dim [d] whole and is sharded on it. *)
Definition bin_shard (so s : shape) (a : placement) (d : nat) : bool :=
  let off := size so - size s in
  (size s <= size so) &&
  all (fun k => (nth 0 s k == nth 0 so (off + k)) || (nth 0 s k == 1)) (iota 0 (size s)) &&
  match a with
  | Replicate => (d < off) || (nth 0 s (d - off) == 1)
  | Shard d' => (off <= d) && (d' == d - off) && (nth 0 s d' == nth 0 so d)
  | Partial _ => false
  end.

Definition mm_ok (ss : seq shape) : bool :=
  let s0 := nth [::] ss 0 in let s1 := nth [::] ss 1 in
  (size s0 == 2) && (size s1 == 2) && (nth 0 s0 1 == nth 0 s1 0).

Definition swapi (d0 d1 d : nat) : nat := if d == d0 then d1 else if d == d1 then d0 else d.

Definition sh (pl : placement) : option nat := if pl is Shard d then Some d else None.

(** The placement of a sum over the dims [es] (in that order) of an operand placed [pl]: a
    shard's dim is renumbered by each dim removed before it and becomes a partial sum when summed. *)
Definition sum_pl (es : seq nat) (pl : placement) : placement :=
  foldl (fun pl e => if pl is Shard d then (if e == d then Partial RSum else Shard (if e < d then d.-1 else d))
                     else pl) pl es.

Definition sum_in (pl : placement) : bool := is_psum pl || (sh pl != None).

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
      | Sum ds =>                                           (* sum of a shard or of a partial sum *)
          uniq ds && all (fun e => e < size s0) ds && sum_in a && placement_eqb pl (sum_pl (sum_order ds) a)
      | _ => false
      end
  | [:: a; b] =>
      match o with
      | Add | Sub =>
          (if sh pl is Some d then bin_shard so s0 a d && bin_shard so s1 b d else false)
          || (is_psum a && is_psum b && is_psum pl && (s0 == so) && (s1 == so))
      | Mul =>
          (if sh pl is Some d then bin_shard so s0 a d && bin_shard so s1 b d else false)
          || (is_psum a && is_rep b && is_psum pl)                   (* partial sum times a replicated *)
          || (is_rep a && is_psum b && is_psum pl)                   (* replicated times a partial sum *)
      | Div =>
          (if sh pl is Some d then bin_shard so s0 a d && bin_shard so s1 b d else false)
          || (is_psum a && is_rep b && is_psum pl)                   (* partial sum over a replicated *)
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

End JCheck.
