(** * Values of ZeRO's flat views: the lemmas behind [MeshCheck.veq] and [MeshCheck.comm_ok]
    (a flat view reshaped back is the tensor, a sum over a flat view is the sum over every dim,
    an elementwise op commutes with a reshape / permute).  Not trusted: everything is proved. *)
From mathcomp Require Import all_ssreflect all_algebra.
From Coq Require Import FunctionalExtensionality.
From TVCert Require Import IR.Syntax IR.Denote IR.Check IR.Lists IR.SoundOps IR.LayoutOps IR.LayoutSound IR.LayoutRule IR.Mesh IR.MeshCheck.
Set Implicit Arguments.
Unset Strict Implicit.
Unset Printing Implicit Defensive.
Import GRing.Theory Num.Theory.
Import JSyntax JDenote JCheck JLists JSoundOps JLayout JLayoutSound JLayoutRule JMesh JMeshCheck.

Module JMeshFlat.

Section Gen.
Variable R : realFieldType.
Variable fn : nat -> R -> R.
Local Notation tensor := (tensor R).
Local Notation zero_t := (zero_t R).
Local Notation gop_val := (gop_val fn).
Local Notation lentry := (lentry R).

Section FlatViews.
Local Open Scope nat_scope.
Lemma nth1 (f : tensor) j : nth zero_t [:: f] 0 j = f j.
Proof. by []. Qed.
Lemma reshape_back sb s1 (t : tensor) : zmask sb t -> prodn s1 = prodn sb ->
  lop_val fn (Reshape sb) [:: s1] [:: lop_val fn (Reshape s1) [:: sb] [:: t]] = t.
Proof.
move=> zt hp; apply: functional_extensionality => i; rewrite /lop_val /mask /=.
case ii: (inb sb i); last by rewrite zt ?ii.
have fl : flat sb i < prodn s1 by rewrite hp; apply: flat_lt.
by rewrite nth1 inb_unflat // flat_unflat // unflat_flat.
Qed.

Lemma permute_back s (t : tensor) : size s = 2 -> zmask s t ->
  lop_val fn (Permute [:: 1; 0]) [:: map (nth 0 s) [:: 1; 0]] [:: lop_val fn (Permute [:: 1; 0]) [:: s] [:: t]] = t.
Proof.
case: s => [|x [|y [|]]] // _ zt; apply: functional_extensionality => i.
rewrite /lop_val /mask nth1.
rewrite /perm_idx; case: i => [|i0 [|i1 [|i2 i]]] /=; rewrite ?andbF ?andbT; try by rewrite zt //= ?andbF.
case: (boolP (i0 < x)) => h0; case: (boolP (i1 < y)) => h1 //=.
all: by rewrite zt //= ?(negbTE h0) ?(negbTE h1) ?andbF.
Qed.

Lemma sum_flat1 n (t : tensor) :
  op_val fn (Sum [:: 0]) [:: [:: n]] [:: t] =
  op_val fn (Sum [:: 0]) [:: [:: prodn [:: n]]] [:: lop_val fn (Reshape [:: prodn [:: n]]) [:: [:: n]] [:: t]].
Proof.
apply: functional_extensionality => i; rewrite /op_val /mask /=.
case: i => [|? ?] //=; rewrite /sum1 /= muln1; apply: sumR_ext => k kn.
by rewrite /ins_at /lop_val /mask /= kn muln1 addn0 divn1.
Qed.

Lemma sum_flat2 x y (t : tensor) :
  op_val fn (Sum [:: 0; 1]) [:: [:: x; y]] [:: t] =
  op_val fn (Sum [:: 0]) [:: [:: prodn [:: x; y]]] [:: lop_val fn (Reshape [:: prodn [:: x; y]]) [:: [:: x; y]] [:: t]].
Proof.
apply: functional_extensionality => i; rewrite /op_val /mask /=.
case: i => [|? ?] //=; rewrite /sum1 /= !muln1 mulnC sumR_blocks sumRE.
apply: eq_big_nat => r /andP [_ rx]; apply: sumR_ext => w wy.
have ry : r * y + w < y * x by exact: block_in.
rewrite /ins_at /lop_val /mask /= ry /= !muln1 addn0 divn1.
have y0 : 0 < y by move: wy; case: (y).
by rewrite divnMDl // divn_small // addn0 modnMDl modn_small.
Qed.

Lemma sum_flat2t x y (t : tensor) :
  op_val fn (Sum [:: 0; 1]) [:: [:: x; y]] [:: t] =
  op_val fn (Sum [:: 0]) [:: [:: prodn [:: x; y]]]
    [:: lop_val fn (Reshape [:: prodn [:: x; y]]) [:: [:: y; x]] [:: lop_val fn (Permute [:: 1; 0]) [:: [:: x; y]] [:: t]]].
Proof.
apply: functional_extensionality => i; rewrite /op_val /mask /=.
case: i => [|? ?] //=; rewrite /sum1 /= !muln1 sumR_exchange sumR_blocks sumRE.
apply: eq_big_nat => r /andP [_ ry]; apply: sumR_ext => w wx.
have rx : r * x + w < x * y by exact: block_in.
rewrite /ins_at /lop_val /mask /= rx /= !muln1 addn0 divn1.
have x0 : 0 < x by move: wx; case: (x).
by rewrite divnMDl // divn_small // addn0 modnMDl modn_small // /perm_idx /= nth1 /= ry wx.

Qed.

(** A layout op that reads its input through an index map onto the input's shape. *)
Lemma reix_map lo s : reix_ok lo s ->
  exists g, (forall t, lop_val fn lo [:: s] [:: t] = mask (lop_shape lo [:: s]) (fun i => t (g i))) /\
            forall i, inb (lop_shape lo [:: s]) i -> inb s (g i).
Proof.
case: lo => //= [s'|ds] ok.
- exists (fun i => unflat s (flat s' i)); split => // i ii.
  by apply: inb_unflat; rewrite -(eqP ok); apply: flat_lt.
- exists (perm_idx ds); split => // i ii; apply/inbP.
  have sz := perm_size ok; rewrite size_perm_idx sz; split=> // k ks.
  have ksd : k < size ds by rewrite sz.
  rewrite (nth_perm_idx _ ksd).
  case/inbP: ii => szi Hi; have := Hi (seq.index k ds).
  rewrite size_map sz => /(_ (perm_index_lt ok ks)).
  by rewrite (nth_map 0) ?(perm_nth_index ok) // sz perm_index_lt.
Qed.

Lemma proj_same s i : inb s i -> proj s s i = i.
Proof. by move=> ii; rewrite (proj_drop ii) ?subnn ?drop0. Qed.

Lemma proj_nil s i : proj [::] s i = [::].
Proof. by rewrite /proj; case: (drop _ i). Qed.

Lemma bshape_nil_r s : bshape s [::] = s.
Proof. by rewrite /bshape /= (_ : bc_rev (rev s) [::] = rev s) ?revK //; case: (rev s). Qed.

Lemma bshape_nil_l s : bshape [::] s = s.
Proof. by rewrite /bshape /= revK. Qed.

Lemma bc_rev_same s : bc_rev s s = s.
Proof. by elim: s => //= x s ->; case: ifP => // /eqP ->. Qed.

Lemma bshape_same s : bshape s s = s.
Proof. by rewrite /bshape bc_rev_same revK. Qed.

(** The operand shape [x] of an elementwise op on the flat views. *)
Definition ew_sh (lo : lop) (s x : shape) : shape := if x == [::] then x else lop_shape lo [:: s].
Definition ew_t (lo : lop) (s x : shape) (t : tensor) : tensor := if x == [::] then t else lop_val fn lo [:: s] [:: t].

Lemma ew_bin (bop : R -> R -> R) lo s s0 s1 (t0 t1 : tensor) :
  reix_ok lo s -> s != [::] -> (s0 == [::]) || (s0 == s) -> (s1 == [::]) || (s1 == s) -> bshape s0 s1 = s ->
  bshape (ew_sh lo s s0) (ew_sh lo s s1) = lop_shape lo [:: s] /\
  lop_val fn lo [:: s] [:: mask s (fun i => bop (t0 (proj s0 s i)) (t1 (proj s1 s i)))] =
  mask (lop_shape lo [:: s]) (fun i => bop (ew_t lo s s0 t0 (proj (ew_sh lo s s0) (lop_shape lo [:: s]) i))
                                            (ew_t lo s s1 t1 (proj (ew_sh lo s s1) (lop_shape lo [:: s]) i))).
Proof.
move=> ok ns h0 h1 hb; have [g [Hg Hi]] := reix_map ok; rewrite /ew_sh /ew_t.
have nsf : (s == [::]) = false by apply/negbTE.
case/orP: h0 => /eqP e0; case/orP: h1 => /eqP e1; subst s0 s1.
- by move: ns; rewrite -hb.
all: rewrite ?eqxx ?nsf ?bshape_nil_r ?bshape_nil_l ?bshape_same; split => //.
all: rewrite !Hg; apply: functional_extensionality => i; rewrite /mask; case ii: (inb _ i) => //.
all: by rewrite Hi // ?proj_nil ?proj_same ?Hi ?ii.
Qed.

Lemma ew_un (uop : R -> R) lo s (t : tensor) : reix_ok lo s ->
  lop_val fn lo [:: s] [:: mask s (fun i => uop (t i))] =
  mask (lop_shape lo [:: s]) (fun i => uop (lop_val fn lo [:: s] [:: t] i)).
Proof.
move=> ok; have [g [Hg Hi]] := reix_map ok; rewrite !Hg.
by apply: functional_extensionality => i; rewrite /mask; case ii: (inb _ i) => //; rewrite Hi.
Qed.

Definition ew_e (lo : lop) (s : shape) (e : lentry) : lentry := (ew_sh lo s e.1, ew_t lo s e.1 e.2).

Lemma ew_bin_form o : ew_arity o = 2 -> exists bop : R -> R -> R, forall s0 s1 (t0 t1 : tensor),
  gop_shape o [:: s0; s1] = bshape s0 s1 /\
  gop_val o [:: s0; s1] [:: t0; t1] = mask (bshape s0 s1) (fun i => bop (t0 (proj s0 (bshape s0 s1) i)) (t1 (proj s1 (bshape s0 s1) i))).
Proof.
case: o => [[]|[]] //= => [_|_|_|_]; [exists +%R | exists (fun a b => a - b)%R | exists *%R | exists (fun a b => a / b)%R]; by [].
Qed.

Lemma ew_un_form o : ew_arity o = 1 -> exists uop : R -> R, forall s0 (t0 : tensor),
  gop_shape o [:: s0] = s0 /\ gop_val o [:: s0] [:: t0] = mask s0 (fun i => uop (t0 i)).
Proof.
case: o => [[]|[]] //= => [_|_|c _|f _|c _|_]; [exists (fun a => - a)%R | exists (fun a => a * a)%R
  | exists (fun a => a * lit R c)%R | exists (fn f) | exists (fun a => a + lit R c)%R | exists id]; by [].
Qed.

(** An elementwise op on operands of the result's shape (or scalars) commutes with a layout op. *)
Lemma ew_gop lo o s (es : seq lentry) :
  size es = ew_arity o -> 0 < ew_arity o -> reix_ok lo s -> s != [::] -> gop_shape o (map fst es) = s ->
  all (fun e => (e.1 == [::]) || (e.1 == s)) es ->
  let es' := map (ew_e lo s) es in
  gop_shape o (map fst es') = lop_shape lo [:: s] /\
  lop_val fn lo [:: s] [:: gop_val o (map fst es) (map snd es)] = gop_val o (map fst es') (map snd es').
Proof.
move=> sz ar ok ns hs hall /=.
case E: (ew_arity o) sz ar => [|[|[|k]]] sz ar //.
- have [uop U] := ew_un_form E.
  case: es sz hall hs => [|[s0 t0] [|]] //= _ hall hs.
  have [U1 U2] := U s0 t0; rewrite U1 in hs; subst s0.
  rewrite /ew_sh /ew_t /= (negbTE ns).
  have [V1 V2] := U (lop_shape lo [:: s]) (lop_val fn lo [:: s] [:: t0]).
  by split => //; rewrite U2 V2; apply: ew_un.
- have [bop B] := ew_bin_form E.
  case: es sz hall hs => [|[s0 t0] [|[s1 t1] [|]]] //= _ hall hs.
  have [B1 B2] := B s0 s1 t0 t1; rewrite B1 in hs.
  case/and3P: hall => h0 h1 _.
  have [e1 e2] := ew_bin bop t0 t1 ok ns h0 h1 hs.
  have [C1 C2] := B (ew_sh lo s s0) (ew_sh lo s s1) (ew_t lo s s0 t0) (ew_t lo s s1 t1).
  split; first by rewrite C1. by rewrite B2 C2 e1 hs.
- by move: E; case: o {hs} => [[]|[]].
Qed.
End FlatViews.

End Gen.
End JMeshFlat.
