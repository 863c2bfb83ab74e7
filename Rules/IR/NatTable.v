(** * Shared unary literals for the checker (not trusted).

    A plan's ids are [nat]s; the printer writes a large one as [Pos.to_nat p] (binary until it
    runs).  Under [vm_compute] every such literal becomes its own chain of [S] cells, so a plan
    with n ids in the thousands holds about n^2 / 2 cells (16 GB at 32 llama layers).
    [fast_nat k] reads the same numbers from a table of the first [k] built by [S] from the
    previous one, so the chains share their tails: the table holds k cells and a literal is one
    lookup ([PositiveMap.find], logarithmic).  [fast_natE] proves it is [Pos.to_nat], so a plan
    written over [fast_nat k] is the plan written over [Pos.to_nat]. *)
From mathcomp Require Import all_ssreflect.
From Coq Require Import BinPos PArith FMapPositive FunctionalExtensionality.

Module JNatTable.

(** Binds [p], [p + 1], ... ([n] of them) to [m], [m + 1], ...: each value [S] of the last. *)
Fixpoint pos_table (n : nat) (p : positive) (m : nat) (t : PositiveMap.t nat) : PositiveMap.t nat :=
  match n with
  | 0 => t
  | n'.+1 => pos_table n' (Pos.succ p) m.+1 (PositiveMap.add p m t)
  end.

Definition fast_nat (k : nat) : positive -> nat :=
  let t := pos_table k 1 1 (PositiveMap.empty nat) in
  fun p => if PositiveMap.find p t is Some m then m else Pos.to_nat p.

(** Every binding of the table is [q |-> Pos.to_nat q]. *)
Definition table_ok (t : PositiveMap.t nat) : Prop :=
  forall q m, PositiveMap.find q t = Some m -> m = Pos.to_nat q.

Lemma table_ok_add t p : table_ok t -> table_ok (PositiveMap.add p (Pos.to_nat p) t).
Proof.
move=> ok q m; case: (Pos.eq_dec q p) => [->|ne].
  by rewrite PositiveMap.gss => -[<-].
by rewrite PositiveMap.gso //; apply: ok.
Qed.

Lemma pos_table_ok n p t : table_ok t -> table_ok (pos_table n p (Pos.to_nat p) t).
Proof.
elim: n p t => [|n IH] p t ok //=.
by rewrite -Pos2Nat.inj_succ; apply/IH/table_ok_add.
Qed.

Lemma fast_natE k : fast_nat k = Pos.to_nat.
Proof.
apply: functional_extensionality => p; rewrite /fast_nat.
case E: (PositiveMap.find _ _) => [m|] //.
have ok : table_ok (PositiveMap.empty nat) by move=> q m'; rewrite PositiveMap.gempty.
exact: (pos_table_ok k xH (PositiveMap.empty nat) ok p m E).
Qed.

End JNatTable.
