(** * Chains of layout ops compared by their index maps
    ([kernel/layout_map.py], equality step [layout_map_equal]).

    A reshape, permute, expand, slice or flip reads its operand through an index map ([EqSteps.reindexed]:
    output index [j] reads input index [pi j]; a reshape through the row-major flat index).  A chain of them
    reads its base through the composition of the maps, and two chains whose composed maps agree at every
    index, over bases that agree at every index, agree at every index.  The engine computes both composed maps
    at every index by running the chain's ops on the array of the base's flat indices, and compares them
    elementwise: the hypotheses below, checked exhaustively.  This is how two spellings of one head-merge
    through different unit dims (one attention head per rank) are identified. *)
From mathcomp Require Import all_ssreflect.
From TVCert Require Import EqSteps.
Set Implicit Arguments.
Unset Strict Implicit.
Unset Printing Implicit Defensive.

Theorem layout_map_equal {I J K V : Type} :
  (* a layout op of a layout op reads through the composed map *)
  (forall (p : J -> I) (q : K -> J) (x : I -> V) (k : K),
     reindexed q (reindexed p x) k = reindexed (fun k => p (q k)) x k) /\
  (* a tensor is the identity reindexing of itself (a side that is no chain) *)
  (forall (x : I -> V) (i : I), x i = reindexed id x i) /\
  (* equal maps at every index over equal bases give equal tensors *)
  (forall (p q : J -> I) (x y : I -> V),
     (forall j, p j = q j) -> (forall i, x i = y i) -> forall j, reindexed p x j = reindexed q y j).
Proof.
split; first by [].
split; first by [].
by move=> p q x y pq xy j; rewrite /reindexed pq xy.
Qed.
