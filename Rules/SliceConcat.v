(** * A slice of a concatenation that is exactly one operand's rows is that operand
    ([kernel/slice_concat.py], equality step [slice_concat_operand]).

    Tensors along the concatenated dim are [nat -> I -> V] (the other dims in [I], as in [Layout.concat]);
    [concatn ns As] concatenates operands [As] of sizes [ns] along that dim.  The slice [start = n_1 + .. +
    n_(k-1)], [end = start + n_k], step 1, read at row [i < n_k] is row [start + i] of the concat, and the
    theorem says that is row [i] of operand [k].  The falsifier below shows the side condition is needed: an
    offset one row off reads the neighbouring operand. *)
From mathcomp Require Import all_ssreflect.
Set Implicit Arguments.
Unset Strict Implicit.
Unset Printing Implicit Defensive.

Fixpoint concatn {I V : Type} (d : nat -> I -> V) (ns : seq nat) (As : seq (nat -> I -> V)) : nat -> I -> V :=
  match ns, As with
  | n :: ns', A :: As' => fun k x => if k < n then A k x else concatn d ns' As' (k - n) x
  | _, _ => d
  end.

Theorem slice_concat_operand {I V : Type} (d : nat -> I -> V) (ns : seq nat) (As : seq (nat -> I -> V))
  (k i : nat) (x : I) :
  size As = size ns -> k < size ns -> i < nth 0 ns k ->
  concatn d ns As (sumn (take k ns) + i) x = nth d As k i x.
Proof.
elim: ns As k => [|n ns IH] [|A As] k //= [hs]; case: k => [|k] /= kl il.
  by rewrite add0n il.
rewrite -addnA ltnNge leq_addr /= addKn.
exact: IH.
Qed.

(** The bounds matter: one row further on, the slice starts in the next operand. *)
Lemma slice_concat_offset_matters :
  let A := fun (k : nat) (_ : unit) => 0 in
  let B := fun (k : nat) (_ : unit) => 1 in
  concatn (fun _ _ => 2) [:: 2; 2] [:: A; B] (sumn (take 0 [:: 2; 2]) + 1 + 1) tt <> nth A [:: A; B] 0 1 tt.
Proof. by []. Qed.
