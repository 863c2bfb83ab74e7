(** * tvcert IR: the stage-1 ops and the placements as plain data.

    This file, [Denote.v], [LayoutOps.v] and [Mesh.v] are the trusted definitions
    of the Coq judge: a reader who accepts them (and Coq) can accept every
    [plan_verified] theorem the emitter writes.  Sizes are concrete naturals: a
    theorem is about the plan at its declared dims.  Plans themselves are
    [Mesh.mplan]. *)
From mathcomp Require Import all_ssreflect.
From Coq Require Import BinNat.

Module JSyntax.

(** A rational constant: (negative?, numerator, denominator) in binary ([N]: a float's exact
    decimal has a 16-digit numerator, far too large for a unary [nat] under [vm_compute]); the
    emitter writes den > 0. *)
Definition rat_lit := (bool * N * N)%type.

(** The reduction of a [Partial] placement or of an all_reduce. *)
Inductive reduce_op := RSum | RAvg | RMax.

(** DTensor placements on the mesh axis. *)
Inductive placement :=
| Replicate                   (* every rank holds the whole tensor *)
| Shard (d : nat)             (* rank r holds block r of dim d (torch.chunk) *)
| Partial (r : reduce_op).    (* reducing the ranks' tensors gives the tensor *)

(** The covered ops; each is denoted in [Denote.v]. *)
Inductive op :=
| Add | Sub | Mul              (* torch.add / torch.sub / torch.mul, broadcasting *)
| Div                          (* torch.div (true division), broadcasting; x / 0 = 0 in a field *)
| Neg | Square                 (* torch.neg, torch.square *)
| Scale (c : rat_lit)          (* x * c *)
| Fn (f : nat)                 (* an uninterpreted pointwise function (tanh, exp, relu, ...) *)
| Const (c : rat_lit) (s : seq nat)   (* torch.full(s, c) *)
| MM                           (* torch.mm: [m,k] @ [k,n] *)
| Sum (ds : seq nat)           (* torch.sum(x, ds), keepdim=False *)
| Transpose (d0 d1 : nat)      (* torch.transpose(x, d0, d1) *)
| AllReduce (r : reduce_op)    (* collectives of stage 1; on a mesh they are [Mesh.PColl] *)
| AllGather (d : nat).         (* nodes, and the checker refuses these two in a [PLocal] *)

(** ** Decidable equality (used by the checker) *)
Definition reduce_op_eqb (a b : reduce_op) : bool :=
  match a, b with RSum, RSum | RAvg, RAvg | RMax, RMax => true | _, _ => false end.

Definition placement_eqb (a b : placement) : bool :=
  match a, b with
  | Replicate, Replicate => true
  | Shard d, Shard e => d == e
  | Partial r, Partial q => reduce_op_eqb r q
  | _, _ => false
  end.

Definition rat_lit_eqb (a b : rat_lit) : bool :=
  let: (s, n, d) := a in let: (s', n', d') := b in (s == s') && N.eqb n n' && N.eqb d d'.

Definition op_eqb (a b : op) : bool :=
  match a, b with
  | Add, Add | Sub, Sub | Mul, Mul | Div, Div | Neg, Neg | Square, Square | MM, MM => true
  | Scale c, Scale c' => rat_lit_eqb c c'
  | Fn f, Fn g => f == g
  | Const c s, Const c' s' => rat_lit_eqb c c' && (s == s')
  | Sum ds, Sum ds' => ds == ds'
  | Transpose a0 a1, Transpose b0 b1 => (a0 == b0) && (a1 == b1)
  | AllReduce r, AllReduce q => reduce_op_eqb r q
  | AllGather d, AllGather e => d == e
  | _, _ => false
  end.

Lemma reduce_op_eqbP a b : reduce_op_eqb a b -> a = b.
Proof. by case: a; case: b. Qed.

Lemma placement_eqbP a b : placement_eqb a b -> a = b.
Proof.
case: a => [|d|r]; case: b => [|e|q] //=; first by move/eqP->.
by move/reduce_op_eqbP->.
Qed.

Lemma rat_lit_eqbP a b : rat_lit_eqb a b -> a = b.
Proof.
case: a => [[s n] d]; case: b => [[s' n'] d'] /= /andP [/andP [/eqP -> /BinNat.N.eqb_eq ->] /BinNat.N.eqb_eq ->].
by [].
Qed.

Lemma op_eqbP a b : op_eqb a b -> a = b.
Proof.
case: a; case: b => //=; try by [];
  try (by move=> *; match goal with H : is_true (_ == _) |- _ => by rewrite (eqP H) end).
- by move=> c c' /rat_lit_eqbP->.
- by move=> c s c' s' /andP[/rat_lit_eqbP-> /eqP->].
- by move=> a0 a1 b0 b1 /andP[/eqP-> /eqP->].
- by move=> r q /reduce_op_eqbP->.
Qed.

End JSyntax.
