(** * Soundness of the mesh checker: [mcheck P c = true -> mplan_equiv P]. *)
From mathcomp Require Import all_ssreflect all_algebra.
From Coq Require Import FunctionalExtensionality.
From TVCert Require Import IR.Syntax IR.Denote IR.Check IR.Lists IR.SoundOps IR.LayoutOps IR.LayoutSound IR.LayoutRule IR.Mesh IR.MeshCheck IR.MeshFlat.
Set Implicit Arguments.
Unset Strict Implicit.
Unset Printing Implicit Defensive.
Import GRing.Theory Num.Theory.
Import JSyntax JDenote JCheck JLists JSoundOps JLayout JLayoutRule JMesh JMeshCheck JMeshFlat.

Module JMeshSound.
Local Open Scope ring_scope.

Lemma fin_choice (X : Type) (x0 : X) (Q : nat -> X -> Prop) n :
  (forall r, (r < n)%N -> exists x, Q r x) -> exists F : nat -> X, forall r, (r < n)%N -> Q r (F r).
Proof.
elim: n => [|n IH] H; first by exists (fun _ => x0).
have [F HF] : exists F : nat -> X, forall r, (r < n)%N -> Q r (F r).
  by apply: IH => r rn; apply: H; rewrite ltnS ltnW.
have [x Hx] := H n (ltnSn n).
exists (fun r => if r == n then x else F r) => r; rewrite ltnS leq_eqVlt.
by case: eqP => [-> //|_] /= rn; apply: HF.
Qed.

Lemma pls_eqbP a b : pls_eqb a b -> a = b.
Proof. by elim: a b => [|x a IH] [|y b] //= /andP [/placement_eqbP -> /IH ->]. Qed.

Section Gen.
Variable R : realFieldType.
Variable fn : nat -> R -> R.
Local Notation tensor := (tensor R).
Local Notation family := (family R).
Local Notation mfamily := (mfamily R).
Local Notation zero_t := (zero_t R).
Local Notation gop_val := (gop_val fn).
Local Notation mplaced := (@mplaced R).

Lemma placed_ext p s pl (T T' : tensor) (M : family) :
  (forall i, inb s i -> T i = T' i) -> placed p s pl T M -> placed p s pl T' M.
Proof.
move=> E; case: pl => [|d|[]] /=.
- by move=> H r i rp ii; rewrite H // E.
- move=> [ds dv H]; split=> // r i rp ii; rewrite H // E //; exact: (@inb_shift p).
- by move=> H i ii; rewrite H // E.
- by move=> H i ii; rewrite H // E.
- by move=> H i ii; rewrite -E //; exact: H.
Qed.

Lemma mplaced_ext ms s pls (T T' : tensor) (L : mfamily) :
  (forall i, inb s i -> T i = T' i) -> mplaced ms s pls T L -> mplaced ms s pls T' L.
Proof.
case: ms pls => [|p ms] [|pl pls] //= E.
- by move=> H i ii; rewrite H // E.
- by case=> M [H1 H2]; exists M; split=> //; exact: placed_ext H1.
Qed.

Lemma mplaced_Lext ms s pls (T : tensor) (L L' : mfamily) :
  (forall c i, inb (mlocal_shape ms s pls) i -> L c i = L' c i) ->
  mplaced ms s pls T L -> mplaced ms s pls T L'.
Proof.
elim: ms s pls T L L' => [|p ms IH] s [|pl pls] T L L' E //=.
- by move=> H i ii; rewrite -E ?H.
- case=> M [H1 H2]; exists M; split=> // r rp.
  by apply: (IH _ _ _ (fun c => L (r :: c))) => [c i ii|]; [apply: E | apply: H2].
Qed.

(** ** Dividing by a replicated positive constant (the tp-size const of a gradient-norm term) *)
Lemma placed_scale p s pl (T : tensor) (M : family) c : 0 < c -> placed p s pl T M ->
  placed p s pl (fun i => T i * c) (fun r i => M r i * c).
Proof.
move=> c0; case: pl => [|d|[]] /=.
- by move=> H r i rp ii; rewrite H.
- by move=> [ds dv H]; split=> // r i rp ii; rewrite H.
- by move=> H i ii; rewrite -mulr_suml H.
- by move=> H i ii; rewrite -mulr_suml mulrA H.
- move=> H i ii; have [H1 [r rp H2]] := H i ii; split; last by exists r; rewrite ?H2.
  by move=> r' rp'; rewrite ler_pmul2r // H1.
Qed.

Lemma mplaced_divc ms s pls (A : tensor) (Lx Ly : mfamily) v : 0 < v ->
  mplaced ms s pls A Lx -> mplaced ms [::] (nseq (size ms) Replicate) (fun _ => v) Ly ->
  mplaced ms s pls (fun i => A i / v) (fun c i => Lx c i / Ly c [::]).
Proof.
move=> v0; elim: ms s pls A Lx Ly => [|p ms IH] s [|pl pls] A Lx Ly //=.
- by move=> Hx Hy i ii; rewrite Hx // Hy.
- case=> M [H1 H2] [N [Hn1 Hn2]].
  exists (fun r i => M r i / v); split; first by apply: placed_scale; rewrite ?invr_gt0.
  move=> r rp; apply: (IH _ _ (M r) (fun c => Lx (r :: c)) (fun c => Ly (r :: c))); first exact: H2.
  by apply: mplaced_ext (Hn2 r rp) => i; case: i => //= _; rewrite (Hn1 r [::] rp).
Qed.

(** A value replicated on axis [k], divided there by the axis size, is a partial sum on [k]. *)
Lemma mplaced_dedup ms k s pls (T : tensor) (Lx Ly : mfamily) :
  (k < size ms)%N -> (0 < nth 0%N ms k)%N -> nth Replicate pls k = Replicate ->
  mplaced ms s pls T Lx -> mplaced ms [::] (nseq (size ms) Replicate) (fun _ => (nth 0%N ms k)%:R) Ly ->
  mplaced ms s (set_nth Replicate pls k (Partial RSum)) T (fun c i => Lx c i / Ly c [::]).
Proof.
elim: ms k s pls T Lx Ly => [|p ms IH] k s [|pl pls] T Lx Ly //=; try by [rewrite ltn0 | move=> _ _ _ []].
case: k => [|k] /= kms p0 hpl.
- move=> [M [H1 H2]] [N [Hn1 Hn2]]; rewrite hpl in H1 H2 *.
  have pv : 0 < p%:R :> R by rewrite ltr0n.
  exists (fun r i => M r i / p%:R); split.
    move=> i ii /=; rewrite -mulr_suml.
    rewrite (eq_big_nat _ _ (F2 := fun _ => T i)); last by move=> r /andP [_ rp]; rewrite H1.
    by rewrite sumr_const_nat subn0 -[T i *+ p]mulr_natr mulfK // pnatr_eq0 -lt0n.
  move=> r rp; apply: (@mplaced_divc _ _ _ (fun i => M r i) (fun c => Lx (r :: c)) (fun c => Ly (r :: c))) => //;
    first exact: H2.
  by apply: mplaced_ext (Hn2 r rp) => i; case: i => //= _; rewrite (Hn1 r [::] rp).
- move=> [M [H1 H2]] [N [Hn1 Hn2]].
  exists M; split => // r rp; apply: (IH _ _ _ (M r) (fun c => Lx (r :: c)) (fun c => Ly (r :: c))) => //;
    first exact: H2.
  by apply: mplaced_ext (Hn2 r rp) => i; case: i => //= _; rewrite (Hn1 r [::] rp).
Qed.

Lemma mlocal_shape_partial ms k s pls : (k < size pls)%N -> nth Replicate pls k = Replicate ->
  mlocal_shape ms s (set_nth Replicate pls k (Partial RSum)) = mlocal_shape ms s pls.
Proof.
elim: ms k s pls => [|p ms IH] k s [|pl pls] //=; try by rewrite ltn0.
by case: k => [|k] /= kp; [move=> -> | move=> h; rewrite IH].
Qed.

Lemma mpl_ok_partial ms k s pls : (k < size pls)%N -> nth Replicate pls k = Replicate ->
  mpl_ok ms s (set_nth Replicate pls k (Partial RSum)) = mpl_ok ms s pls.
Proof.
elim: ms k s pls => [|p ms IH] k s [|pl pls] //=; try by rewrite ltn0.
all: case: k => [|k] /= kp h //; first [by rewrite h | by rewrite IH].
Qed.

(** What the invariant knows about an operand under nested placements. *)
Definition marg_ok ms (s : shape) pls (T : tensor) (ps : shape) (L : mfamily) : Prop :=
  [/\ mplaced ms s pls T L, ps = mlocal_shape ms s pls, mpl_ok ms s pls, zmask s T & forall c, zmask ps (L c)].


(** The head axis's witness can be taken 0 outside the local shape. *)
Lemma mplaced_cons p ms s pl pls (T : tensor) (L : mfamily) :
  zmask s T -> pl_ok p s pl -> mplaced (p :: ms) s (pl :: pls) T L ->
  exists M : family, [/\ placed p s pl T M, forall r, zmask (local_shape p s pl) (M r) &
    forall r, (r < p)%N -> mplaced ms (local_shape p s pl) pls (M r) (fun c => L (r :: c))].
Proof.
move=> zT ok [M [H1 H2]]; exists (fun r => mask (local_shape p s pl) (M r)); split.
- by rewrite -(zmask_mask zT); apply: placed_mask.
- by move=> r i /negbTE ni; rewrite /mask ni.
- by move=> r rp; apply: mplaced_ext (H2 r rp) => i ii; rewrite /mask ii.
Qed.

Lemma relocal_id o ss : relocal o (gop_shape o ss) = o.
Proof. by case: o => // o; rewrite /= lrelocal_id. Qed.

Lemma relocal_twice o s s' : relocal (relocal o s) s' = relocal o s'.
Proof. by case: o => // o; rewrite /= lrelocal_twice. Qed.

Lemma relocal_glocal o s : is_glocal (relocal o s) = is_glocal o.
Proof. by case: o. Qed.

(** One axis: [Check.rule_sound] for a stage-1 op, [LayoutRule.lrule_sound] /
    [LayoutRule.lrule_loc_sound] for a layout op; the ranks run the op at their local shape. *)
Lemma grule_sound p o ss pls pl Ts pss Ls :
  is_glocal o -> size ss = size pls -> size Ts = size pls -> size pss = size pls -> size Ls = size pls ->
  (forall k, (k < size pls)%N ->
     arg_ok p (nth [::] ss k) (nth Replicate pls k) (nth zero_t Ts k) (nth [::] pss k)
            (nth (fun _ => zero_t) Ls k)) ->
  grule p o ss pls pl -> pl_ok p (gop_shape o ss) pl ->
  let o' := relocal o (local_shape p (gop_shape o ss) pl) in
  gop_shape o' pss = local_shape p (gop_shape o ss) pl /\
  placed p (gop_shape o ss) pl (gop_val o ss Ts) (fun r => gop_val o' pss (map (fun L => L r) Ls)).
Proof.
case: o => [o|o] /= loc hss hTs hps hLs A.
- exact: (@rule_sound R fn p o ss pls pl Ts pss Ls loc).
- case/orP => [ru|ru] ok.
    rewrite (lrule_relocal ru); exact: (@lrule_sound R fn p o ss pls pl Ts pss Ls hss hTs hps hLs A ru ok).
  exact: (@lrule_loc_sound R fn p o ss pls pl Ts pss Ls hss hTs hps hLs A ru ok).
Qed.

Lemma gop_val_masked o ss ts i : ~~ inb (gop_shape o ss) i -> gop_val o ss ts i = 0.
Proof. by case: o => o ni; rewrite /= ?/op_val ?/lop_val /mask ifN. Qed.

Lemma mrule_sound ms o ss plss pls Ts pss Ls :
  is_glocal o -> all (fun p => 0 < p)%N ms ->
  size ss = size plss -> size Ts = size plss -> size pss = size plss -> size Ls = size plss ->
  (forall k, (k < size plss)%N ->
     marg_ok ms (nth [::] ss k) (nth [::] plss k) (nth zero_t Ts k) (nth [::] pss k)
             (nth (fun _ => zero_t) Ls k)) ->
  mrule ms o ss plss pls -> mpl_ok ms (gop_shape o ss) pls ->
  let o' := relocal o (mlocal_shape ms (gop_shape o ss) pls) in
  gop_shape o' pss = mlocal_shape ms (gop_shape o ss) pls /\
  mplaced ms (gop_shape o ss) pls (gop_val o ss Ts) (fun c => gop_val o' pss (map (fun L => L c) Ls)).
Proof.
elim: ms o ss plss pls Ts pss Ls => [|p ms IH] o ss plss [|pl pls] Ts pss Ls //= loc p0 hss hTs hps hLs A.
- move=> _ _; rewrite relocal_id.
  have ep : pss = ss.
    apply: (@eq_from_nth _ [::]) => [|k]; first by rewrite hss hps.
    rewrite hps => kp; have [H e _ _ _] := A k kp.
    by move: H e; case: (nth [::] plss k) => //= _ ->.
  have eT : map (fun L => L [::]) Ls = Ts.
    apply: (@eq_from_nth _ zero_t) => [|k]; first by rewrite size_map hLs hTs.
    rewrite size_map hLs => kp; rewrite (nth_map (fun _ => zero_t)) ?hLs //.
    have [H e _ mT mL] := A k kp; move: H e mL; case: (nth [::] plss k) => //= H e mL.
    apply: functional_extensionality => i; case si: (inb (nth [::] ss k) i); first exact: H.
    by rewrite mT ?si // (mL [::]) ?e ?si.
  by split; [rewrite ep | move=> i ii; rewrite ep eT].
- case/andP: p0 => p0 p0s; case/andP => ru mr; case/andP => okpl okr.
  set n := size plss.
  pose Q := fun k (M : family) =>
      let s := nth [::] ss k in let a := head Replicate (nth [::] plss k) in
      [/\ nth [::] plss k = a :: behead (nth [::] plss k), placed p s a (nth zero_t Ts k) M,
          forall r, zmask (local_shape p s a) (M r) &
          forall r, (r < p)%N -> mplaced ms (local_shape p s a) (behead (nth [::] plss k)) (M r)
                                  (fun c => nth (fun _ => zero_t) Ls k (r :: c))].
  have [F HF] : exists F : nat -> family, forall k, (k < n)%N -> Q k (F k).
    apply: (@fin_choice family (fun _ => zero_t) Q) => k kn; rewrite /Q /=.
    have [H e ok zT zL] := A k kn.
    move: H e ok; case: (nth [::] plss k) => //= a rest H e /andP [oka okr'].
    by have [M [? ? ?]] := mplaced_cons zT oka H; exists M; split.
  set hs := map (head Replicate) plss.
  set ss' := map (fun x => local_shape p x.1 x.2) (zip ss hs).
  set Gs := mkseq F n.
  have szhs : size hs = n by rewrite size_map.
  have szss' : size ss' = n by rewrite size_map size_zip hss szhs minnn.
  have nss' : forall k, (k < n)%N -> nth [::] ss' k = local_shape p (nth [::] ss k) (nth Replicate hs k).
    move=> k kn; rewrite (nth_map ([::], Replicate)) ?size_zip ?hss ?szhs ?minnn //.
    by rewrite nth_zip ?hss ?szhs.
  have nhs : forall k, (k < n)%N -> nth Replicate hs k = head Replicate (nth [::] plss k).
    by move=> k kn; rewrite (nth_map [::]).
  have Aarg : forall k, (k < size hs)%N ->
      arg_ok p (nth [::] ss k) (nth Replicate hs k) (nth zero_t Ts k) (nth [::] ss' k)
             (nth (fun _ => zero_t) Gs k).
    move=> k; rewrite szhs => kn; have /= [e1 e2 e3 e4] := HF k kn.
    have [_ _ /= ok zT _] := A k kn; move: ok; rewrite e1 /= => /andP [oka _].
    by rewrite /Gs nth_mkseq // nss' // nhs //; split.
  have z1 : size ss = size hs by rewrite szhs.
  have z2 : size Ts = size hs by rewrite szhs.
  have z3 : size ss' = size hs by rewrite szhs.
  have z4 : size Gs = size hs by rewrite size_mkseq szhs.
  have [sh1 pl1] := grule_sound loc z1 z2 z3 z4 Aarg ru okpl.
  set o1 := relocal o (local_shape p (gop_shape o ss) pl) in sh1 pl1 mr.
  have eo1 : relocal o1 (mlocal_shape ms (gop_shape o1 ss') pls) =
            relocal o (mlocal_shape ms (local_shape p (gop_shape o ss) pl) pls) by rewrite sh1 relocal_twice.
  rewrite -eo1.
  have IHr : forall r, (r < p)%N ->
      gop_shape (relocal o1 (mlocal_shape ms (gop_shape o1 ss') pls)) pss = mlocal_shape ms (gop_shape o1 ss') pls /\
      mplaced ms (gop_shape o1 ss') pls (gop_val o1 ss' (map (fun G => G r) Gs))
        (fun c => gop_val (relocal o1 (mlocal_shape ms (gop_shape o1 ss') pls)) pss
                    (map (fun L => L c) (map (fun L c => L (r :: c)) Ls))).
    move=> r rp; apply: (IH o1 ss' (map behead plss) pls (map (fun G => G r) Gs) pss (map (fun L c => L (r :: c)) Ls)) => //; rewrite ?relocal_glocal //; rewrite ?size_map ?size_iota ?size_mkseq ?size_zip ?hss ?szhs ?minnn ?hTs ?hps ?hLs //; last by rewrite sh1.
    move=> k kn.
    have /= [e1 e2 e3 e4] := HF k kn; have [_ eps /= ok _ zL] := A k kn.
    move: ok eps; rewrite e1 /= => /andP [_ okr'] eps.
    rewrite (nth_map [::]) // (nth_map (fun _ => zero_t)) ?size_mkseq // nth_mkseq //.
    rewrite (nth_map (fun _ => zero_t)) ?hLs // nss' // nhs //.
    by split; [exact: e4 | by [] | by [] | exact: e3 | move=> c; apply: zL].
  have [r0 r0p] : exists r, (r < p)%N by exists 0%N.
  have [esh _] := IHr r0 r0p.
  split; first by rewrite esh sh1.
  exists (fun r => gop_val o1 ss' (map (fun G => G r) Gs)); split => // r rp.
  have [_ H] := IHr r rp; rewrite -sh1.
  by apply: mplaced_Lext H => c i _; rewrite -map_comp.
Qed.

(** ** Collectives commute with the axes inside theirs *)
Section Inner.
Variable p : nat.                        (* size of the collective's axis *)
Variable Kern : (nat -> tensor) -> tensor.
Variable tr : shape -> shape.            (* the collective's effect on a shape *)
Variable good : shape -> bool.
Variable okd : nat -> bool.              (* dims an inner Shard may split *)
Variable lin : bool.                     (* an inner Partial(sum|avg) is allowed: [Kern] is linear *)
Hypothesis K_ext : forall s (M M' : nat -> tensor), good s ->
  (forall r, (r < p)%N -> forall j, inb s j -> M r j = M' r j) -> forall i, inb (tr s) i -> Kern M i = Kern M' i.
Hypothesis K_shift : forall (M : nat -> tensor) e off i, okd e ->
  Kern (fun r j => M r (shift e off j)) i = Kern M (shift e off i).
Hypothesis K_sum : lin -> forall q (W : nat -> family) i,
  Kern (fun r j => \sum_(0 <= r' < q) W r r' j) i = \sum_(0 <= r' < q) Kern (fun r => W r r') i.
Hypothesis K_scale : lin -> forall c (M : nat -> tensor) i, Kern (fun r j => c * M r j) i = c * Kern M i.
Hypothesis T_loc : forall q s e, okd e -> good s -> shard_ok q s e ->
  local_shape q (tr s) (Shard e) = tr (local_shape q s (Shard e)).
Hypothesis T_ok : forall q s e, okd e -> good s -> shard_ok q s e -> shard_ok q (tr s) e.
Hypothesis T_nth : forall s e, okd e -> good s -> nth 0%N (tr s) e = nth 0%N s e.
Hypothesis G_loc : forall q s e, okd e -> good s -> shard_ok q s e -> good (local_shape q s (Shard e)).

Definition inner_pl (pl : placement) : bool :=
  match pl with Replicate => true | Shard e => okd e | Partial RMax => false | Partial _ => lin end.

Lemma inner_shape ms s pls : good s -> all inner_pl pls -> mpl_ok ms s pls ->
  mlocal_shape ms (tr s) pls = tr (mlocal_shape ms s pls).
Proof.
elim: ms s pls => [|q ms IH] s [|pl pls] //; cbn [mlocal_shape mpl_ok all] => gs /andP [ipl ipls] /andP [okpl okr].
case: pl ipl okpl okr => [|e|r] // oke oks okr; [exact: IH | | exact: IH].
by rewrite T_loc //; apply: IH => //; apply: G_loc.
Qed.

Lemma inner_comm ms s pls (M : nat -> tensor) (L : nat -> mfamily) :
  good s -> all inner_pl pls -> mpl_ok ms s pls ->
  (forall r, (r < p)%N -> mplaced ms s pls (M r) (L r)) ->
  mplaced ms (tr s) pls (Kern M) (fun c => Kern (fun r => L r c)).
Proof.
elim: ms s pls M L => [|q ms IH] s [|pl pls] M L //.
- by move=> gs _ _ H i ii; apply: K_ext ii => // r rp j jj; apply: H.
- cbn [mlocal_shape mpl_ok all mplaced] => gs /andP [ipl ipls] /andP [okpl okr] H.
  have [W HW] := @fin_choice family (fun _ => zero_t)
    (fun r W => placed q s pl (M r) W /\ forall r', (r' < q)%N ->
       mplaced ms (local_shape q s pl) pls (W r') (fun c => L r (r' :: c))) p H.
  clear H.
  exists (fun r' => Kern (fun r => W r r')); split.
  + case: pl ipl okpl okr HW => [|e|rr] // oke oks okr HW.
      by move=> r' i r'q ii; apply: K_ext ii => // r rp j jj; have [P1 _] := HW r rp; apply: P1.
    have := T_ok oke gs oks; rewrite /shard_ok => /andP [es /eqP dv].
    split => // r' i r'q; rewrite T_loc // => ii; rewrite T_nth //.
    rewrite -K_shift //; apply: K_ext ii; first exact: G_loc.
    move=> r rp j jj; have [[_ _ P1] _] := HW r rp; exact: P1.
    case: rr oke oks {okr} HW => // hl _ HW i ii /=.
      rewrite -K_sum //; apply: K_ext ii => // r rp j jj; have [P1 _] := HW r rp; exact: P1.
    rewrite -K_sum // -K_scale //; apply: K_ext ii => // r rp j jj; have [P1 _] := HW r rp; exact: P1.
  + move=> r' r'q; case: pl ipl okpl okr HW => [|e|rr] // oke oks okr HW.
    * by apply: IH => // r rp; have [_ P2] := HW r rp; apply: P2.
    * rewrite T_loc //; apply: IH => //; first exact: G_loc.
      by move=> r rp; have [_ P2] := HW r rp; apply: P2.
    * by apply: IH => // r rp; have [_ P2] := HW r rp; apply: P2.
Qed.
End Inner.

(** ** Index lemmas for the collectives *)
Lemma set_set_nth_comm (l : seq nat) a b x y : a != b ->
  set_nth 0%N (set_nth 0%N l a x) b y = set_nth 0%N (set_nth 0%N l b y) a x.
Proof.
move=> ab; apply: (@eq_from_nth _ 0%N) => [|k _]; first by rewrite !size_set_nth maxnCA.
rewrite nth_set_nth /= [in RHS]nth_set_nth /= !nth_set_nth /=.
case: (k =P a) => [ka|_]; case: (k =P b) => [kb|_] //.
by move: ab; rewrite -ka kb eqxx.
Qed.

Lemma nth_shift_other e d off (i : seq nat) : e != d -> nth 0%N (shift e off i) d = nth 0%N i d.
Proof. by move=> ed; rewrite /shift nth_set_nth /= eq_sym (negbTE ed). Qed.

Lemma shift_set_comm e d off v (i : seq nat) : e != d ->
  shift e off (set_nth 0%N i d v) = set_nth 0%N (shift e off i) d v.
Proof.
move=> ed; have de : d != e by rewrite eq_sym.
by rewrite /shift nth_set_nth /= (negbTE ed) set_set_nth_comm.
Qed.

Lemma shift_shift_comm e d a b (i : seq nat) : e != d -> shift e a (shift d b i) = shift d b (shift e a i).
Proof.
move=> ed; have de : d != e by rewrite eq_sym.
by rewrite /shift !nth_set_nth /= (negbTE ed) (negbTE de) set_set_nth_comm.
Qed.

Lemma inb_set_shape s d x w (i : seq nat) : (d < size s)%N -> (w < nth 0%N s d)%N ->
  inb (set_nth 0%N s d x) i -> inb s (set_nth 0%N i d w).
Proof.
move=> ds ws /inbP [sz H]; rewrite size_set_nth_lt // in sz H; apply/inbP.
rewrite size_set_nth_lt ?sz //; split=> // k ks; rewrite nth_set_nth /=.
by case: eqP => [->|kd] //; have := H k ks; rewrite nth_set_nth /= (introF eqP kd).
Qed.

Lemma sumR_ext n (F F' : nat -> R) : (forall r, (r < n)%N -> F r = F' r) -> sumR n F = sumR n F'.
Proof. by move=> E; rewrite !sumRE; apply: eq_big_nat => r /andP [_ rn]; apply: E. Qed.

Lemma foldr_ext (g : R -> R -> R) (F F' : nat -> R) x l :
  (forall r, r \in l -> F r = F' r) -> foldr (fun r m => g (F r) m) x l = foldr (fun r m => g (F' r) m) x l.
Proof. by elim: l => //= a l IH E; rewrite E ?mem_head // IH // => r rl; apply: E; rewrite in_cons rl orbT. Qed.

Lemma foldr_max_le (F : nat -> R) x t l : (forall r, r \in l -> F r <= t) -> x <= t ->
  foldr (fun r m => Num.max (F r) m) x l <= t.
Proof.
elim: l => //= a l IH H xt; rewrite Order.TotalTheory.le_maxl H ?mem_head //= IH // => r rl.
by apply: H; rewrite in_cons rl orbT.
Qed.

Lemma foldr_max_ge (F : nat -> R) x l : x <= foldr (fun r m => Num.max (F r) m) x l /\
  forall r, r \in l -> F r <= foldr (fun r m => Num.max (F r) m) x l.
Proof.
elim: l => [|a l [IH1 IH2]] /=; first by split.
split; first by rewrite Order.TotalTheory.le_maxr IH1 orbT.
move=> r; rewrite in_cons => /orP [/eqP ->|rl]; first by rewrite Order.TotalTheory.le_maxr Order.POrderTheory.lexx.
by rewrite Order.TotalTheory.le_maxr IH2 ?orbT.
Qed.

(** The result of a collective at axis 0 for the rank with coordinate [r'] there,
    [M r] being the tensor of the rank with [r] there instead: the body of [coll_step]. *)
Definition ckern (p : nat) (cl : coll) (sb : shape) (r' : nat) (M : nat -> tensor) : tensor :=
  match cl with
  | CAllReduce RSum => fun i => sumR p (fun r => M r i)
  | CAllReduce RAvg => fun i => p%:R^-1 * sumR p (fun r => M r i)
  | CAllReduce RMax => fun i => foldr (fun r m => Num.max (M r i) m) (M 0%N i) (iota 0 p)
  | CAllGather d => let m := nth 0%N sb d in
      fun i => M (nth 0%N i d %/ m)%N (set_nth 0%N i d (nth 0%N i d %% m)%N)
  | CReduceScatter d => let m := (nth 0%N sb d %/ p)%N in
      fun i => sumR p (fun r => M r (shift d (r' * m) i))
  | CSliceRank d m => fun i => M r' (shift d (r' * m) i)
  end.

Lemma coll_step_eq ms cl k sb (f : mfamily) c : (k < size c)%N ->
  coll_step ms cl k sb f c =
  mask (coll_shape (nth 0%N ms k) cl sb) (ckern (nth 0%N ms k) cl sb (nth 0%N c k) (fun r => f (set_nth 0%N c k r))).
Proof. by move=> kc; case: cl => [[]|d|d|d m] //=; rewrite set_nth_nth_same. Qed.

(** [mplaced] only reads the ranks' tensors at coordinates with one entry per axis. *)
Lemma mplaced_Lext_sz ms s pls (T : tensor) (L L' : mfamily) :
  (forall c i, size c = size ms -> inb (mlocal_shape ms s pls) i -> L c i = L' c i) ->
  mplaced ms s pls T L -> mplaced ms s pls T L'.
Proof.
elim: ms s pls T L L' => [|p ms IH] s [|pl pls] T L L' E //=.
- by move=> H i ii; rewrite -E ?H.
- case=> M [H1 H2]; exists M; split=> // r rp.
  apply: (IH _ _ _ (fun c => L (r :: c))) => [c i sz ii|]; last exact: H2.
  by apply: E => //=; rewrite sz.
Qed.

(** The shape transformer of all_gather / reduce_scatter and its side conditions. *)
Section TrSet.
Variables (d : nat) (v : nat -> nat) (m0 : nat).
Definition trs (x : shape) : shape := set_nth 0%N x d (v (nth 0%N x d)).
Definition goods (x : shape) : bool := (d < size x)%N && (nth 0%N x d == m0).

Lemma trs_loc q s e : e != d -> goods s -> shard_ok q s e ->
  local_shape q (trs s) (Shard e) = trs (local_shape q s (Shard e)).
Proof.
move=> ed _ _; have de : d != e by rewrite eq_sym.
by rewrite /trs /local_shape !nth_set_nth /= (negbTE ed) (negbTE de) set_set_nth_comm.
Qed.

Lemma trs_ok q s e : e != d -> goods s -> shard_ok q s e -> shard_ok q (trs s) e.
Proof.
move=> ed /andP [ds _] /andP [es dv].
by rewrite /shard_ok /trs size_set_nth_lt // es nth_set_nth /= (negbTE ed).
Qed.

Lemma trs_nth s e : e != d -> goods s -> nth 0%N (trs s) e = nth 0%N s e.
Proof. by move=> ed _; rewrite /trs nth_set_nth /= (negbTE ed). Qed.

Lemma goods_loc q s e : e != d -> goods s -> shard_ok q s e -> goods (local_shape q s (Shard e)).
Proof.
move=> ed /andP [ds dm] /andP [es _]; have de : d != e by rewrite eq_sym.
by rewrite /goods /local_shape size_set_nth_lt // ds nth_set_nth /= (negbTE de).
Qed.
End TrSet.

Lemma nth_mlocal_other d ms s pls : all (inner_pl (fun e => e != d) true) pls -> mpl_ok ms s pls ->
  nth 0%N (mlocal_shape ms s pls) d = nth 0%N s d.
Proof.
elim: ms s pls => [|q ms IH] s [|pl pls] //; cbn [mlocal_shape mpl_ok all] => /andP [ipl ipls] /andP [okpl okr].
rewrite IH //; case: pl ipl {okpl okr} => //= e ed.
by rewrite nth_set_nth /= eq_sym (negbTE ed).
Qed.

Definition cokd (cl : coll) : nat -> bool :=
  match cl with
  | CAllReduce _ => fun _ => true
  | CAllGather d | CReduceScatter d | CSliceRank d _ => fun e => e != d
  end.

Definition clin (cl : coll) : bool := if cl is CAllReduce RMax then false else true.

Lemma inner_okE cl pls : all (inner_ok cl) pls -> all (inner_pl (cokd cl) (clin cl)) pls.
Proof.
by case: cl => [[]|d|d|d m]; elim: pls => //= pl pls IH /andP [h /IH ->]; case: pl h => // -[].
Qed.

(** *** all_reduce: a pointwise combination of the ranks *)
Lemma ar_ext p rr sb r' s (M M' : nat -> tensor) : (0 < p)%N ->
  (forall r, (r < p)%N -> forall j, inb s j -> M r j = M' r j) ->
  forall i, inb s i -> ckern p (CAllReduce rr) sb r' M i = ckern p (CAllReduce rr) sb r' M' i.
Proof.
move=> p0 E i ii; case: rr => /=.
- by apply: sumR_ext => r rp; apply: E.
- by congr (_ * _); apply: sumR_ext => r rp; apply: E.
- rewrite E //; apply: foldr_ext => r; rewrite mem_iota add0n => /andP [_ rp]; exact: E.
Qed.

Lemma ar_val p rr sb r' s (T : tensor) (M : family) : (0 < p)%N -> placed p s (Partial rr) T M ->
  forall i, inb s i -> ckern p (CAllReduce rr) sb r' M i = T i.
Proof.
move=> p0; case: rr => /= H i ii; first by rewrite sumRE H.
- by rewrite sumRE H.
have [le [r rp eq]] := H i ii.
have [ge1 ge2] := foldr_max_ge (fun r => M r i) (M 0%N i) (iota 0 p).
apply: Order.POrderTheory.le_anti; apply/andP; split.
  apply: foldr_max_le; last exact: le.
  by move=> k; rewrite mem_iota add0n => /andP [_ kp]; apply: le.
by rewrite -eq; apply: ge2; rewrite mem_iota add0n.
Qed.

Lemma ar_shift p rr sb r' (M : nat -> tensor) e off i :
  ckern p (CAllReduce rr) sb r' (fun r j => M r (shift e off j)) i = ckern p (CAllReduce rr) sb r' M (shift e off i).
Proof. by case: rr. Qed.

(** *** all_gather along [d]: the rank is read off the index *)
Lemma ag_ext p d sb r' s (M M' : nat -> tensor) : goods d (nth 0%N sb d) s ->
  (forall r, (r < p)%N -> forall j, inb s j -> M r j = M' r j) ->
  forall i, inb (trs d (fun x => x * p)%N s) i -> ckern p (CAllGather d) sb r' M i = ckern p (CAllGather d) sb r' M' i.
Proof.
move=> /andP [ds /eqP sm] E i ii /=; set m := nth 0%N sb d.
have [sz Hi] := inbP _ _ ii; rewrite /trs size_set_nth_lt // in sz Hi.
have := Hi d ds; rewrite nth_set_nth /= eqxx sm -/m => idm.
have m0 : (0 < m)%N by rewrite lt0n; apply/eqP => m0; rewrite m0 mul0n in idm.
apply: E; first by rewrite ltn_divLR // mulnC.
apply: (inb_set_shape (x := (nth 0%N s d * p)%N)) => //; first by rewrite sm ltn_mod.
Qed.

Lemma ag_shift p d sb r' (M : nat -> tensor) e off i : e != d ->
  ckern p (CAllGather d) sb r' (fun r j => M r (shift e off j)) i = ckern p (CAllGather d) sb r' M (shift e off i).
Proof. by move=> ed /=; rewrite nth_shift_other // shift_set_comm. Qed.

(** *** reduce_scatter along [d]: rank [r'] sums block [r'] *)
Lemma rs_ext p d sb r' s (M M' : nat -> tensor) : (r' < p)%N -> (nth 0%N sb d %/ p * p = nth 0%N sb d)%N ->
  goods d (nth 0%N sb d) s ->
  (forall r, (r < p)%N -> forall j, inb s j -> M r j = M' r j) ->
  forall i, inb (trs d (fun x => x %/ p)%N s) i -> ckern p (CReduceScatter d) sb r' M i = ckern p (CReduceScatter d) sb r' M' i.
Proof.
move=> r'p dv /andP [ds /eqP sm] E i ii /=; apply: sumR_ext => r rp; apply: E => //.
by apply: (@inb_shift p) => //; [rewrite sm | move: ii; rewrite /trs sm].
Qed.

Lemma rs_shift p d sb r' (M : nat -> tensor) e off i : e != d ->
  ckern p (CReduceScatter d) sb r' (fun r j => M r (shift e off j)) i = ckern p (CReduceScatter d) sb r' M (shift e off i).
Proof. by move=> ed /=; apply: sumR_ext => r _; rewrite shift_shift_comm. Qed.

(** *** The collectives other than max are linear *)
Lemma ar_sum p rr sb r' : clin (CAllReduce rr) -> forall q (W : nat -> family) i,
  ckern p (CAllReduce rr) sb r' (fun r j => \sum_(0 <= t < q) W r t j) i =
  \sum_(0 <= t < q) ckern p (CAllReduce rr) sb r' (fun r => W r t) i.
Proof.
case: rr => // _ q W i /=; rewrite sumRE exchange_big ?mulr_sumr; apply: eq_bigr => t _; by rewrite sumRE.
Qed.

Lemma ar_scale p rr sb r' : clin (CAllReduce rr) -> forall c (M : nat -> tensor) i,
  ckern p (CAllReduce rr) sb r' (fun r j => c * M r j) i = c * ckern p (CAllReduce rr) sb r' M i.
Proof. by case: rr => // _ c M i /=; rewrite !sumRE -mulr_sumr // mulrCA. Qed.

Lemma ag_sum p d sb r' : true -> forall q (W : nat -> family) i,
  ckern p (CAllGather d) sb r' (fun r j => \sum_(0 <= t < q) W r t j) i =
  \sum_(0 <= t < q) ckern p (CAllGather d) sb r' (fun r => W r t) i.
Proof. by []. Qed.

Lemma ag_scale p d sb r' : true -> forall c (M : nat -> tensor) i,
  ckern p (CAllGather d) sb r' (fun r j => c * M r j) i = c * ckern p (CAllGather d) sb r' M i.
Proof. by []. Qed.

Lemma rs_sum p d sb r' : true -> forall q (W : nat -> family) i,
  ckern p (CReduceScatter d) sb r' (fun r j => \sum_(0 <= t < q) W r t j) i =
  \sum_(0 <= t < q) ckern p (CReduceScatter d) sb r' (fun r => W r t) i.
Proof. move=> _ q W i /=; rewrite sumRE exchange_big; apply: eq_bigr => t _; by rewrite sumRE. Qed.

Lemma rs_scale p d sb r' : true -> forall c (M : nat -> tensor) i,
  ckern p (CReduceScatter d) sb r' (fun r j => c * M r j) i = c * ckern p (CReduceScatter d) sb r' M i.
Proof. by move=> _ c M i /=; rewrite !sumRE -mulr_sumr. Qed.

(** *** A collective over the outermost axis *)
Lemma coll_head p ms s cl pls (T : tensor) (L : mfamily) :
  (0 < p)%N -> all (inner_ok cl) pls ->
  mpl_ok (p :: ms) s (coll_in cl :: pls) -> mpl_ok (p :: ms) s (coll_out cl :: pls) ->
  coll_side (p :: ms) s cl 0 (coll_in cl :: pls) ->
  mplaced (p :: ms) s (coll_in cl :: pls) T L ->
  let sb := mlocal_shape (p :: ms) s (coll_in cl :: pls) in
  mlocal_shape (p :: ms) s (coll_out cl :: pls) = coll_shape p cl sb /\
  mplaced (p :: ms) s (coll_out cl :: pls) T
    (fun c => ckern p cl sb (nth 0%N c 0) (fun r => L (set_nth 0%N c 0 r))).
Proof.
move=> p0 iok ok ok' side H sb; have ipl := inner_okE iok.
move: ok ok' H; rewrite /sb; clear sb.
case: cl iok ipl side => [rr|d|d|d m] iok ipl side; cbn [mlocal_shape mpl_ok mplaced coll_in coll_out] => /andP [ok1 okr] /andP [ok1' okr'] [M [HM Hin]].
- split => //; exists (fun _ => T); split => // r' r'p.
  have C := @inner_comm p (ckern p (CAllReduce rr) (mlocal_shape ms s pls) r') id predT (cokd (CAllReduce rr)) (clin (CAllReduce rr))
    (fun s M M' _ E => @ar_ext p rr _ r' s M M' p0 E) (fun M e off i _ => @ar_shift p rr _ r' M e off i)
    (@ar_sum p rr _ r') (@ar_scale p rr _ r')
    (fun _ _ _ _ _ _ => erefl) (fun _ _ _ _ _ h => h) (fun _ _ _ _ => erefl) (fun _ _ _ _ _ _ => isT)
    ms s pls M (fun r c => L (r :: c)) isT ipl okr Hin.
  by apply: mplaced_ext C => i ii; apply: ar_val HM i ii.
- have [ds dv] : (d < size s)%N /\ (nth 0%N s d %/ p * p = nth 0%N s d)%N by case/andP: ok1 => -> /eqP.
  set s1 := local_shape p s (Shard d) in okr Hin *.
  have ns1 : nth 0%N (mlocal_shape ms s1 pls) d = nth 0%N s1 d by apply: nth_mlocal_other.
  set m := nth 0%N (mlocal_shape ms s1 pls) d.
  have g1 : goods d m s1.
    by apply/andP; split; [rewrite /s1 /local_shape size_set_nth_lt | rewrite /m ns1].
  have ts1 : trs d (fun x => x * p)%N s1 = s.
    by rewrite /trs /s1 /local_shape set_nth_twice nth_set_nth_lt eqxx dv set_nth_nth_same.
  have Sh := @inner_shape (trs d (fun x => x * p)%N) (goods d m) (cokd (CAllGather d)) (clin (CAllGather d))
    (@trs_loc d _ m) (@goods_loc d m) ms s1 pls g1 ipl okr.
  split; first by rewrite -{1}ts1 Sh.
  exists (fun _ => T); split => // r' r'p.
  have C := @inner_comm p (ckern p (CAllGather d) (mlocal_shape ms s1 pls) r') (trs d (fun x => x * p)%N)
    (goods d m) (cokd (CAllGather d)) (clin (CAllGather d))
    (fun s M M' g E => @ag_ext p d _ r' s M M' g E) (fun M e off i ed => @ag_shift p d _ r' M e off i ed)
    (@ag_sum p d _ r') (@ag_scale p d _ r')
    (@trs_loc d _ m) (@trs_ok d _ m) (@trs_nth d _ m) (@goods_loc d m)
    ms s1 pls M (fun r c => L (r :: c)) g1 ipl okr Hin.
  rewrite ts1 in C; apply: mplaced_ext C => i ii /=.
  case: HM => _ _ HM; rewrite -/m.
  have [sz Hi] := inbP _ _ ii.
  have mm : m = (nth 0%N s d %/ p)%N by rewrite /m ns1 /s1 /local_shape nth_set_nth_lt eqxx.
  have idm : (nth 0%N i d < m * p)%N by rewrite mm dv; apply: Hi.
  have m0 : (0 < m)%N by rewrite lt0n; apply/eqP => m0; rewrite m0 mul0n in idm.
  rewrite HM.
  + rewrite /shift set_nth_twice nth_set_nth_lt eqxx -mm.
    by rewrite -divn_eq set_nth_nth_same ?sz.
  + by rewrite ltn_divLR // mulnC.
  + apply: (inb_set_shape (x := nth 0%N s d)).
    * by rewrite /local_shape size_set_nth_lt.
    * by rewrite /local_shape nth_set_nth_lt eqxx -mm ltn_mod.
    * by rewrite /local_shape set_nth_twice set_nth_nth_same.
- have [ds dv] : (d < size s)%N /\ (nth 0%N s d %/ p * p = nth 0%N s d)%N by case/andP: ok1' => -> /eqP.
  have ns : nth 0%N (mlocal_shape ms s pls) d = nth 0%N s d by apply: nth_mlocal_other.
  set N := nth 0%N (mlocal_shape ms s pls) d.
  have g1 : goods d N s by apply/andP; split; [| rewrite /N ns].
  have Sh := @inner_shape (trs d (fun x => x %/ p)%N) (goods d N) (cokd (CReduceScatter d)) (clin (CReduceScatter d))
    (@trs_loc d _ N) (@goods_loc d N) ms s pls g1 ipl okr.
  split; first exact: Sh.
  exists (fun r' i => T (shift d (r' * (nth 0%N s d %/ p)) i)); split => // r' r'p.
  have dvN : (N %/ p * p = N)%N by rewrite /N ns.
  have C := @inner_comm p (ckern p (CReduceScatter d) (mlocal_shape ms s pls) r') (trs d (fun x => x %/ p)%N)
    (goods d N) (cokd (CReduceScatter d)) (clin (CReduceScatter d))
    (fun s M M' g E => @rs_ext p d _ r' s M M' r'p dvN g E) (fun M e off i ed => @rs_shift p d _ r' M e off i ed)
    (@rs_sum p d _ r') (@rs_scale p d _ r')
    (@trs_loc d _ N) (@trs_ok d _ N) (@trs_nth d _ N) (@goods_loc d N)
    ms s pls M (fun r c => L (r :: c)) g1 ipl okr Hin.
  apply: mplaced_ext C => i ii /=; rewrite sumRE HM /N ns //.
  by apply: (@inb_shift p).
- (* slice_block_to_shard: rank r' keeps block r' of its replicated tensor *)
  have /eqP {}side : (m == nth 0%N (mlocal_shape ms s pls) d %/ p)%N := side.
  have [ds dv] : (d < size s)%N /\ (nth 0%N s d %/ p * p = nth 0%N s d)%N by case/andP: ok1' => -> /eqP.
  have ns : nth 0%N (mlocal_shape ms s pls) d = nth 0%N s d by apply: nth_mlocal_other.
  have hm : m = (nth 0%N s d %/ p)%N by rewrite side ns.
  set m0 := nth 0%N s d.
  have g1 : goods d m0 s by apply/andP; split.
  have tls : trs d (fun _ => m) s = local_shape p s (Shard d) by rewrite /trs /local_shape hm.
  have Sh := @inner_shape (trs d (fun _ => m)) (goods d m0) (cokd (CSliceRank d m)) (clin (CSliceRank d m))
    (@trs_loc d _ m0) (@goods_loc d m0) ms s pls g1 ipl okr.
  split; first by rewrite -tls Sh.
  exists (fun r' i => T (shift d (r' * m) i)); split.
    by split => // r' i r'p ii; rewrite hm.
  move=> r' r'p.
  have Kx : forall s' (M1 M2 : nat -> tensor), goods d m0 s' ->
      (forall r, (r < p)%N -> forall j, inb s' j -> M1 r j = M2 r j) ->
      forall i, inb (trs d (fun _ => m) s') i ->
      ckern p (CSliceRank d m) (mlocal_shape ms s pls) r' M1 i = ckern p (CSliceRank d m) (mlocal_shape ms s pls) r' M2 i.
    move=> s' M1 M2 /andP [ds' /eqP sm] E i ii /=; apply: E => //.
    by apply: (@inb_shift p) => //; rewrite sm hm dv.
  have Ks : forall (M1 : nat -> tensor) e off i, cokd (CSliceRank d m) e ->
      ckern p (CSliceRank d m) (mlocal_shape ms s pls) r' (fun r j => M1 r (shift e off j)) i =
      ckern p (CSliceRank d m) (mlocal_shape ms s pls) r' M1 (shift e off i).
    by move=> M1 e off i /= ed; rewrite shift_shift_comm.
  have C := @inner_comm p (ckern p (CSliceRank d m) (mlocal_shape ms s pls) r') (trs d (fun _ => m))
    (goods d m0) (cokd (CSliceRank d m)) (clin (CSliceRank d m))
    Kx Ks (fun _ _ _ _ => erefl) (fun _ _ _ _ => erefl)
    (@trs_loc d _ m0) (@trs_ok d _ m0) (@trs_nth d _ m0) (@goods_loc d m0)
    ms s pls M (fun r c => L (r :: c)) g1 ipl okr Hin.
  rewrite tls in C; apply: mplaced_ext C => i ii /=.
  by apply: HM => //; rewrite hm; exact: (@inb_shift p).
Qed.

(** *** A collective over any axis: the outer axes keep their witnesses *)
Lemma coll_sound k ms s pls (T : tensor) (L : mfamily) cl :
  all (fun p => 0 < p)%N ms -> (k < size ms)%N -> nth Replicate pls k = coll_in cl ->
  all (inner_ok cl) (drop k.+1 pls) ->
  mpl_ok ms s pls -> mpl_ok ms s (set_nth Replicate pls k (coll_out cl)) ->
  coll_side ms s cl k pls ->
  mplaced ms s pls T L ->
  mlocal_shape ms s (set_nth Replicate pls k (coll_out cl)) = coll_shape (nth 0%N ms k) cl (mlocal_shape ms s pls) /\
  mplaced ms s (set_nth Replicate pls k (coll_out cl)) T
    (fun c => ckern (nth 0%N ms k) cl (mlocal_shape ms s pls) (nth 0%N c k) (fun r => L (set_nth 0%N c k r))).
Proof.
elim: k ms s pls T L => [|k IH] [|p ms] s [|pl pls] T L //.
- cbn [all nth drop set_nth] => /andP [p0 _] _ hpl iok ok ok' side H; subst pl.
  by rewrite drop0 in iok; have := coll_head p0 iok ok ok' side H.
- cbn [all nth drop set_nth size mpl_ok mplaced] => /andP [p0 ps0] kms hpl iok /andP [ok1 okr] /andP [ok1' okr'] side [M [HM Hin]].
  have IHr : forall r, (r < p)%N -> _ :=
    fun r rp => IH ms (local_shape p s pl) pls (M r) (fun c => L (r :: c)) ps0 kms hpl iok okr okr' side (Hin r rp).
  split; first by case: (IHr 0%N p0).
  by exists M; split => // r rp; case: (IHr r rp).
Qed.

(** ** The invariant: every fact of the checker holds *)
Local Notation mentry := (mentry R).
Local Notation mdflt := (mdflt R).

Lemma size_mrun ms env ns : size (mrun fn ms env ns) = (size env + size ns)%N.
Proof.
elim: ns env => [|n ns IH] env /=; first by rewrite addn0.
by rewrite IH size_rcons addSnnS.
Qed.

Lemma mnth_fst (env : seq mentry) a : nth [::] (map fst env) a = (nth mdflt env a).1.
Proof.
case: (ltnP a (size env)) => h; first by rewrite (nth_map mdflt).
by rewrite !nth_default ?size_map.
Qed.

Lemma mrun_shapes ms env ns : map fst (mrun fn ms env ns) = mrun_s ms (map fst env) ns.
Proof.
elim: ns env => [|n ns IH] env //=; rewrite IH map_rcons; congr (mrun_s _ (rcons _ _) _).
case: n => [o a|cl k x] /=.
  by rewrite -map_comp; congr (gop_shape _ _); apply: eq_map => b /=; rewrite mnth_fst.
by rewrite mnth_fst.
Qed.

(** ** The logical evaluator *)
Local Notation lentry := (lentry R).
Local Notation ldflt := (ldflt R).
Local Notation lrun := (lrun fn).
Local Notation lrun_node := (lrun_node fn).

Lemma size_lrun env ns : size (lrun env ns) = (size env + size ns)%N.
Proof.
elim: ns env => [|n ns IH] env /=; first by rewrite addn0.
by rewrite IH size_rcons addSnnS.
Qed.

Lemma lrun_prefix env ns k : (k < size env)%N -> nth ldflt (lrun env ns) k = nth ldflt env k.
Proof.
elim: ns env => [|n ns IH] env //= ke.
by rewrite IH ?size_rcons ?(ltn_trans ke) // nth_rcons ke.
Qed.

Lemma lrun_cat env ns1 ns2 : lrun env (ns1 ++ ns2) = lrun (lrun env ns1) ns2.
Proof. by elim: ns1 env => [|n ns IH] env //=. Qed.

Lemma lrun_node_at env ns j : (j < size ns)%N ->
  nth ldflt (lrun env ns) (size env + j) = lrun_node (lrun env (take j ns)) (nth (GNode (GO Add) [::]) ns j).
Proof.
move=> js; rewrite -{1}(cat_take_drop j ns) lrun_cat (drop_nth (GNode (GO Add) [::])) //=.
have sz : size (lrun env (take j ns)) = (size env + j)%N by rewrite size_lrun size_take js.
by rewrite lrun_prefix ?size_rcons ?sz // -sz nth_rcons ltnn eqxx.
Qed.

Lemma lrun_node_ext E E' n :
  (forall a, a \in g_args n -> nth ldflt E a = nth ldflt E' a) -> lrun_node E n = lrun_node E' n.
Proof.
move=> H; rewrite /JMesh.lrun_node.
by have -> : [seq nth ldflt E a | a <- g_args n] = [seq nth ldflt E' a | a <- g_args n] by apply/eq_in_map.
Qed.

Lemma lnth_fst (env : seq lentry) a : nth [::] (map fst env) a = (nth ldflt env a).1.
Proof.
case: (ltnP a (size env)) => h; first by rewrite (nth_map ldflt).
by rewrite !nth_default ?size_map.
Qed.

Lemma lrun_shapes env ns : map fst (lrun env ns) = lrun_s (map fst env) ns.
Proof.
elim: ns env => [|n ns IH] env //=; rewrite IH map_rcons; congr (lrun_s (rcons _ _) _).
by rewrite /JMesh.lrun_node /= -map_comp; congr (gop_shape _ _); apply: eq_map => a /=; rewrite lnth_fst.
Qed.


Section Plan.
Variable P : mplan.
Variable X : seq tensor.
Let ms := mesh P.
Let ni := size (ml_inputs P).
Let le := lrun (ml_init P X) (ml_nodes P).
Let ls := lrun_s (ml_inputs P) (ml_nodes P).

Lemma ml_init_shapes : map fst (ml_init P X) = ml_inputs P.
Proof.
apply: (@eq_from_nth _ [::]); first by rewrite size_map size_mkseq.
by move=> k; rewrite size_map size_mkseq => kn; rewrite (nth_map ldflt) ?size_mkseq // nth_mkseq.
Qed.

Lemma mls_le k : nth [::] ls k = (nth ldflt le k).1.
Proof. by rewrite /ls -ml_init_shapes -lrun_shapes lnth_fst. Qed.

Lemma msize_ls : size ls = size le.
Proof. by rewrite /ls -ml_init_shapes -lrun_shapes size_map. Qed.

(** A logical node is its op applied to the logical values of its operands. *)
Lemma mle_node l : (ni <= l)%N -> (l < size le)%N ->
  let ln := nth (GNode (GO Add) [::]) (ml_nodes P) (l - ni) in
  all (fun a => a < l)%N (g_args ln) ->
  nth ldflt le l = lrun_node le ln.
Proof.
move=> nl ll ln al.
have sz : size (ml_init P X) = ni by rewrite size_mkseq.
have jl : (l - ni < size (ml_nodes P))%N by move: ll; rewrite /le size_lrun sz ltn_subLR.
rewrite -{1}(subnKC nl) -{1}sz lrun_node_at //.
apply: lrun_node_ext => a aa; have /= al' := allP al a aa.
rewrite /le -{2}(cat_take_drop (l - ni) (ml_nodes P)) lrun_cat [in RHS]lrun_prefix //.
by rewrite size_lrun size_take jl sz subnKC.
Qed.


Lemma gop_eqbP a b : gop_eqb a b -> a = b.
Proof. by case: a => a; case: b => b //=; [move/op_eqbP -> | move/lop_eqbP ->]. Qed.

(** ** Equal logical values ([MeshCheck.veq]) and elementwise ops on flat views ([MeshCheck.comm_ok]) *)
Lemma node_is_sound l o args : node_is P ls l o args -> nth ldflt le l = lrun_node le (GNode o args).
Proof.
rewrite /node_is /lnode => /andP [/andP [/andP [/andP [/gop_eqbP eo /eqP ea] nl] /ltszP ll] al].
have ll' : (l < size le)%N by rewrite -msize_ls.
have hm : nth ldflt le l = lrun_node le (nth (GNode (GO Add) [::]) (ml_nodes P) (l - ni)).
  by apply: mle_node => //; rewrite ea.
by rewrite hm; case: (nth _ (ml_nodes P) (l - ni)) eo ea => o' a' /= -> ->.
Qed.

Lemma le_zmask k : zmask (nth ldflt le k).1 (nth ldflt le k).2.
Proof.
have sz : size (ml_init P X) = ni by rewrite size_mkseq.
case: (ltnP k ni) => kn.
  by rewrite /le lrun_prefix ?sz // /ml_init nth_mkseq // => i /= ii; rewrite /mask (negbTE ii).
case: (ltnP k (size le)) => kl; last by rewrite nth_default.
have jl : (k - ni < size (ml_nodes P))%N by move: kl; rewrite /le size_lrun sz ltn_subLR.
by rewrite /le -(subnKC kn) -{1 3}sz lrun_node_at // => i; apply: gop_val_masked.
Qed.

Lemma lsh_le k : lsh ls k = (nth ldflt le k).1.
Proof. exact: mls_le. Qed.

Lemma rr_back_sound b a : rr_back P ls b a -> nth ldflt le a = nth ldflt le b.
Proof.
rewrite /rr_back => /andP [ha]; case E: (g_op (lnode P (arg0 P a))) => [?|[s1|||||||||||||||||||||]] //.
case/andP=> h1 /eqP hp.
rewrite (node_is_sound ha) /JMesh.lrun_node /= (node_is_sound h1) /JMesh.lrun_node /= lsh_le.
rewrite lsh_le in hp.
case: (nth ldflt le b) hp (@le_zmask b) => sb vb /= hp zb.
by rewrite reshape_back.
Qed.

Lemma pp_back_sound b a : pp_back P ls b a -> nth ldflt le a = nth ldflt le b.
Proof.
rewrite /pp_back => /andP [/andP [/andP [ha hr] h3] /eqP s2].
rewrite (node_is_sound ha) /JMesh.lrun_node /= (rr_back_sound hr) (node_is_sound h3) /JMesh.lrun_node /=.
rewrite lsh_le in s2.
case: (nth ldflt le b) s2 (@le_zmask b) => sb vb /= s2 zb.
rewrite permute_back //; congr (_, _).
by case: sb s2 {zb} => [|x [|y [|]]].
Qed.

Lemma sum_flat_sound b a : sum_flat P ls b a -> nth ldflt le a = nth ldflt le b.
Proof.
rewrite /sum_flat !lsh_le => /andP [/andP [/andP [ha hb] hsz] hc].
rewrite (node_is_sound ha) (node_is_sound hb) /JMesh.lrun_node /=.
move: hb hsz hc; set d := arg0 P b; set a1 := arg0 P a => hb hsz hc.
case/orP: hc => [h1 | /andP [/andP [s2 h1] h2]].
- rewrite (node_is_sound h1) /JMesh.lrun_node /=.
  case: (nth ldflt le d) hsz => sd vd /=.
  case: sd => [|x [|y [|]]] //= _.
  + by rewrite -sum_flat1.
  + by rewrite -sum_flat2.
- rewrite (node_is_sound h1) /JMesh.lrun_node /= (node_is_sound h2) /JMesh.lrun_node /=.
  case: (nth ldflt le d) s2 => sd vd /= s2.
  case: sd s2 => [|x [|y [|]]] //= _.
  by rewrite -sum_flat2t.
Qed.

Lemma veq_sound b a : veq P ls b a -> nth ldflt le a = nth ldflt le b.
Proof.
rewrite /veq => /orP [/eqP -> //|].
case: (g_op (lnode P a)) => -[] //= *; by [apply: rr_back_sound | apply: pp_back_sound | apply: sum_flat_sound].
Qed.

Lemma veq_map (bs as_ : seq nat) : size bs = size as_ -> all (fun ba => veq P ls ba.1 ba.2) (zip bs as_) ->
  map (nth ldflt le) bs = map (nth ldflt le) as_.
Proof.
elim: bs as_ => [|b bs IH] [|a as_] //= [sz] /andP [h H].
by rewrite (veq_sound h) (IH as_).
Qed.

Lemma comm_sound k o l xs : (0 < ew_arity o)%N -> size xs = ew_arity o ->
  comm_ok P ls k o l xs -> nth ldflt le l = lrun_node le (GNode o xs).
Proof.
elim: k l xs => [|k IH] l xs ar sz /=.
  by case H: (node_is _ _ _ _ _) => // _; apply: node_is_sound H.
case/orP => [/node_is_sound //|].
case E: (g_op (lnode P l)) => [//|lo].
move=> /andP [/andP [/andP [/andP [hl rk] ns] hall] hc].
move: hl rk ns hc; set l' := arg0 P l => hl rk ns hc.
set f := fun x => if lsh ls x == [::] then x else arg0 P x.
have sz' : size (map f xs) = ew_arity o by rewrite size_map.
have IHl := IH l' (map f xs) ar sz' hc.
rewrite (node_is_sound hl) /JMesh.lrun_node /= IHl /JMesh.lrun_node /=.
rewrite lsh_le IHl /= in rk ns.
set es := map (nth ldflt le) (map f xs).
set s := gop_shape o (map fst es) in rk ns *.
have M : map (nth ldflt le) xs = map (ew_e fn lo s) es.
  rewrite /es -!map_comp; apply/eq_in_map => x xin /=.
  have := allP hall x xin; rewrite /f; case: ifP => [h0 _ | h0 /andP [hx /eqP hs]].
    by rewrite /ew_e /ew_sh /ew_t -lsh_le h0 lsh_le; case: (nth ldflt le x).
  rewrite (node_is_sound hx) /JMesh.lrun_node /=.
  have hs' : (nth ldflt le (arg0 P x)).1 = s by rewrite -lsh_le hs lsh_le IHl.
  by rewrite /ew_e /ew_sh /ew_t hs' (negbTE ns).
have hall' : all (fun e => (e.1 == [::]) || (e.1 == s)) es.
  rewrite /es !all_map; apply/allP => x xin /=; have := allP hall x xin.
  rewrite /f; case: ifP => [h0 _|_ /andP [_ /eqP h]]; first by rewrite -lsh_le h0.
  by rewrite -lsh_le h lsh_le IHl eqxx orbT.
have sz'' : size es = ew_arity o by rewrite /es size_map.
have [E1 E2] := @ew_gop R fn lo o s es sz'' ar rk ns erefl hall'.
by rewrite M E1 E2.
Qed.

Definition mfact_ok (f : mfact) (e : mentry) : Prop :=
  (f.1 < size le)%N /\
  marg_ok ms (nth ldflt le f.1).1 f.2 (nth ldflt le f.1).2 e.1 e.2.

Definition minv (fs : seq mfact) (E : seq mentry) : Prop :=
  size fs = size E /\ forall k, (k < size fs)%N -> mfact_ok (nth dmfact fs k) (nth mdflt E k).

Lemma mlocal_sound fs E o args o' l pls :
  minv fs E -> all (fun p => 0 < p)%N ms ->
  all (fun a => a < size fs)%N args ->
  let af := map (nth dmfact fs) args in
  is_glocal o' -> (l < size ls)%N ->
  nth ldflt le l = lrun_node le (GNode o' (map fst af)) ->
  relocal o' (mlocal_shape ms (nth [::] ls l) pls) = o ->
  mrule ms o' (map (nth [::] ls) (map fst af)) (map snd af) pls ->
  mpl_ok ms (nth [::] ls l) pls ->
  mfact_ok (l, pls) (mrun_node fn ms E (PLocal o args)).
Proof.
move=> [szf I] p0 aa af loc ll hl eo ru ok.
have ll' : (l < size le)%N by rewrite -msize_ls.
have szaf : size af = size args by rewrite size_map.
have Iarg : forall k, (k < size args)%N -> mfact_ok (nth dmfact af k) (nth mdflt E (nth 0%N args k)).
  move=> k ka; rewrite (nth_map 0%N) //; apply: I; exact: (allP aa _ (mem_nth 0%N ka)).
set lo := o' in loc eo ru hl.
set lids := map fst af in ru hl *.
set lss := map (nth [::] ls) lids in ru *.
have elss : map fst (map (nth ldflt le) lids) = lss.
  by rewrite -map_comp /lss; apply: eq_map => a /=; rewrite mls_le.
set Ts := map (fun a => (nth ldflt le a).2) lids.
set pss := map (fun a => (nth mdflt E a).1) args.
set Ls := map (fun a => (nth mdflt E a).2) args.
have hpl : nth [::] ls l = gop_shape lo lss by rewrite mls_le hl /JMesh.lrun_node /= elss.
rewrite hpl in ok eo.
have A : forall k, (k < size (map snd af))%N ->
    marg_ok ms (nth [::] lss k) (nth [::] (map snd af) k) (nth zero_t Ts k) (nth [::] pss k)
            (nth (fun _ => zero_t) Ls k).
  move=> k; rewrite size_map szaf => kp.
  have [_ F] := Iarg k kp.
  rewrite /lss /Ts /pss /Ls /lids.
  by rewrite !(nth_map 0%N) ?size_map ?szaf // !(nth_map dmfact) ?szaf // mls_le.
have z1 : size lss = size (map snd af) by rewrite !size_map.
have z2 : size Ts = size (map snd af) by rewrite !size_map.
have z3 : size pss = size (map snd af) by rewrite !size_map.
have z4 : size Ls = size (map snd af) by rewrite !size_map.
have [hsh hpd] := mrule_sound loc p0 z1 z2 z3 z4 A ru ok.
rewrite eo in hsh hpd.
split => //.
have hle : nth ldflt le l = (gop_shape lo lss, gop_val lo lss Ts).
  by rewrite hl /JMesh.lrun_node elss /Ts -!map_comp.
have hrn : mrun_node fn ms E (PLocal o args) = (gop_shape o pss, fun c => gop_val o pss (map (fun L => L c) Ls)).
  rewrite /mrun_node /pss /Ls; congr (_, _); first by rewrite -map_comp.
  by apply: functional_extensionality => c; rewrite -!map_comp.
rewrite hrn hle /=; split => //.
- by move=> i ni'; rewrite gop_val_masked.
- by move=> c i ni'; rewrite gop_val_masked.
Qed.

Lemma mcoll_sound fs E cl k x l pls :
  minv fs E -> all (fun p => 0 < p)%N ms -> (x < size fs)%N ->
  mderive P ls (PColl cl k x) [:: nth dmfact fs x] (l, pls) ->
  mfact_ok (l, pls) (mrun_node fn ms E (PColl cl k x)).
Proof.
move=> [szf I] p0 xs; have := I x xs; rewrite /mderive.
case: (nth dmfact fs x) => l1 pls1 [ll [H e ok mT mL]] /andP [/andP [/eqP el _] C]; subst l1.
move: C; rewrite /coll_ok => /andP [/andP [/andP [/andP [/andP [/andP [/andP [kms _] /placement_eqbP hin] iok] /pls_eqbP ep] ok1] ok2] side].
rewrite -/ms in kms hin iok ep ok1 ok2 side.
rewrite ep in ok2 *; rewrite mls_le in ok1 ok2 side.
have [sh pl] := coll_sound p0 kms hin iok ok1 ok2 side H.
split => //; rewrite /mrun_node /=; split => //.
- by apply: (mplaced_Lext_sz _ pl) => c i szc ii; rewrite coll_step_eq ?szc // /mask e -sh ii.
- by rewrite e sh.
- by move=> c i ni'; rewrite /coll_step /mask /= ifN.
Qed.


Lemma mlocal_nil_rep ms' : mlocal_shape ms' [::] (nseq (size ms') Replicate) = [::].
Proof. by elim: ms' => //= p ms' IH. Qed.

Lemma bshape_nil s : bshape s [::] = s.
Proof. by rewrite /bshape /= (_ : bc_rev (rev s) [::] = rev s) ?revK //; case: (rev s). Qed.

Lemma mdedup_sound fs E o args f :
  minv fs E -> all (fun a => a < size fs)%N args ->
  dedup_ok P ls o (map (nth dmfact fs) args) f ->
  mfact_ok f (mrun_node fn ms E (PLocal o args)).
Proof.
move=> [szf I] aa; case: f => l pls; rewrite /dedup_ok.
case: o => // -[] //; case: args aa => [|x [|y [|? ?]]] //=; try by move=> _; case: (nth dmfact fs x).
  2: by move=> _; case: (nth dmfact fs x); case: (nth dmfact fs y).
move=> /andP [xs /andP [ys _]].
case Ex: (nth dmfact fs x) => [l1 pls1]; case Ey: (nth dmfact fs y) => [lk plsk].
move=> /andP [/andP [/andP [/andP [/andP [/andP [/andP [/eqP -> l1s] nlk] lks] /eqP nargs] /eqP szp] /pls_eqbP eplsk] Hk].
case/hasP: Hk => k; rewrite mem_iota add0n => /andP [_ kms].
move=> /andP [/andP [/andP [/placement_eqbP hk p0] /gop_eqbP eop] /pls_eqbP ->].
have := I x xs; rewrite Ex /= => -[l1e [Hx ex okx zTx zLx]].
have := I y ys; rewrite Ey /= => -[lke [Hy ey oky zTy zLy]].
set lnk := nth (GNode (GO Add) [::]) (ml_nodes P) (lk - ni) in nargs eop.
have hlk : nth ldflt le lk = lrun_node le lnk by apply: mle_node; rewrite ?nargs // -msize_ls.
rewrite hlk /JMesh.lrun_node nargs eop /= in Hy ey.
rewrite eplsk mlocal_nil_rep in ey.
rewrite eplsk in Hy.
set pk := nth 0%N ms k in p0 eop Hy.
have Hy' : mplaced ms [::] (nseq (size ms) Replicate) (fun _ => pk%:R) (nth mdflt E y).2.
  apply: mplaced_ext Hy => i; case: i => //= _.
  by rewrite /op_val /mask /lit bin_of_natK /= mul1r divr1.
have kp : (k < size pls1)%N by rewrite szp.
have HD := mplaced_dedup kms p0 hk Hx Hy'.
split => //; split.
- apply: mplaced_Lext HD => c i; rewrite mlocal_shape_partial // -ex => ii.
  rewrite /mrun_node /= /op_val /= ey bshape_nil /mask ii.
  have p1 : proj (nth mdflt E x).1 (nth mdflt E x).1 i = i by rewrite (proj_drop ii) ?subnn ?drop0.
  have p2 : proj [::] (nth mdflt E x).1 i = [::] by rewrite /proj; case: (drop _ i).
  by rewrite p1 p2.
- by rewrite /= ey bshape_nil mlocal_shape_partial.
- by rewrite mpl_ok_partial.
- exact: zTx.
- by move=> c i ni'; rewrite /mrun_node /= /op_val /mask ifN.
Qed.

Lemma ew_glocal o : (0 < ew_arity o)%N -> is_glocal o /\ forall s, relocal o s = o.
Proof. by case: o => [[]|[]]. Qed.

Lemma mderive_sound fs E n f :
  minv fs E -> all (fun p => 0 < p)%N ms ->
  all (fun a => a < size fs)%N (pargs n) ->
  mderive P ls n (map (nth dmfact fs) (pargs n)) f ->
  mfact_ok f (mrun_node fn ms E n).
Proof.
move=> I p0 aa; case: f => l pls; case: n aa => [o args|cl k x] aa.
- rewrite /mderive; case/orP => [/orP [|]|dd]; last exact: (mdedup_sound I aa dd).
  + move=> /andP [/andP [/andP [/andP [/andP [/andP [/andP [/andP [loc nl] /ltszP ll] /gop_eqbP eo] /eqP sz] hv] al] ru] ok].
    have ll' : (l < size le)%N by rewrite -msize_ls.
    have sz' : size (g_args (lnode P l)) = size (map fst (map (nth dmfact fs) args)) by rewrite size_map.
    apply: (mlocal_sound I p0 aa loc ll _ eo ru ok).
    rewrite (mle_node nl ll' al) /JMesh.lrun_node /= (veq_map sz' hv).
    by [].
  + move=> /andP [/andP [/andP [/andP [/andP [ar /eqP sz] /ltszP ll] hc] ru] ok].
    have [loc rel] := ew_glocal ar.
    have sz' : size (map fst (map (nth dmfact fs) args)) = ew_arity o by move: sz; rewrite /= !size_map.
    exact: (mlocal_sound I p0 aa loc ll (comm_sound ar sz' hc) (rel _) ru ok).
- by move: aa => /= /andP [xs _]; apply: mcoll_sound.
Qed.

Lemma mcheck_nodes_sound ns fs E c :
  minv fs E -> all (fun p => 0 < p)%N ms -> mcheck_nodes P ls fs ns c -> minv (fs ++ c) (mrun fn ms E ns).
Proof.
elim: ns fs E c => [|n ns IH] fs E [|f c] //=; first by rewrite cats0.
move=> I p0 /andP [/andP [aa dv] rest]; move: aa; rewrite (eq_all (fun a => ltszE _ a fs)) => aa.
have F := mderive_sound I p0 aa dv.
have I' : minv (rcons fs f) (rcons E (mrun_node fn ms E n)).
  case: I => sz I; split; first by rewrite !size_rcons sz.
  move=> k; rewrite size_rcons ltnS leq_eqVlt => /orP [/eqP ->|kf].
    by rewrite !nth_rcons -sz ltnn eqxx.
  by rewrite !nth_rcons kf -sz kf; apply: I.
by rewrite -cat_rcons; apply: IH.
Qed.

Lemma minit_inv (L : seq mfamily) :
  (forall j, (j < size (mp_inputs P))%N ->
     let b := nth (0%N, [::]) (mp_inputs P) j in
     mplaced ms (nth ldflt le b.1).1 b.2 (nth ldflt le b.1).2 (nth (fun _ => zero_t) L j)) ->
  all (fun b => (b.1 < size ls)%N && mpl_ok ms (nth [::] ls b.1) b.2) (mp_inputs P) ->
  minv (mp_inputs P) (mp_init P L).
Proof.
move=> HL ok; split; first by rewrite size_mkseq.
move=> k kp; have /andP [li okb] := all_nthP (0%N, [::]) ok k kp.
have /= Hk := HL k kp.
rewrite /mp_init nth_mkseq // -/ls.
case: (nth _ (mp_inputs P) k) li okb Hk => l pls /= li okb Hk.
split; first by rewrite -msize_ls.
rewrite -mls_le in Hk *; split => //.
- apply: (mplaced_Lext (L := nth (fun _ => zero_t) L k)) Hk => c i ii.
  by rewrite /= /mask ifT.
- by rewrite /= mls_le; apply: le_zmask.
- by move=> c i ni'; rewrite /= /mask ifN.
Qed.

End Plan.
End Gen.

Lemma mcheck_sound_at (R : realFieldType) (fn : nat -> R -> R) P c : mcheck_core P c -> mequiv_at fn P.
Proof.
move=> C X L le HL pe lo po pls Hin.
move: C; rewrite /mcheck_core => /andP [/andP [/andP [p0 okin] cn] cout].
have I0 := minit_inv HL okin.
have [_ I1] := mcheck_nodes_sound I0 p0 cn.
have /= := all_In cout Hin.
move=> /andP [/andP [/andP [lo_ok po_ok] /eqP e1] /pls_eqbP e2].
have [_ [H -> _ _ _]] := I1 po po_ok.
by rewrite e1 e2 in H *.
Qed.

(** The soundness theorem of the mesh checker. *)
Theorem mcheck_sound (P : mplan) (c : seq mfact) : mcheck P c = true -> mplan_equiv P.
Proof.
case/andP => B C; split; last by move=> R fn; apply: mcheck_sound_at C.
by rewrite -bind_ok_lE.
Qed.

Lemma mequiv_with_lnodes (R : realFieldType) (fn : nat -> R -> R) P xs :
  all (fun o => o.1.1 < size (ml_inputs P) + size (ml_nodes P))%N (mp_outputs P) ->
  all (fun b => b.1 < size (ml_inputs P) + size (ml_nodes P))%N (mp_inputs P) ->
  mequiv_at fn (with_lnodes P xs) -> mequiv_at fn P.
Proof.
move=> ok oki H X L /= HL lo po pls Hin.
have sz : size (lrun fn (ml_init P X) (ml_nodes P)) = (size (ml_inputs P) + size (ml_nodes P))%N.
  by rewrite size_lrun size_mkseq.
have pre : forall k, (k < size (ml_inputs P) + size (ml_nodes P))%N ->
    nth (ldflt R) (lrun fn (ml_init P X) (ml_nodes P ++ xs)) k = nth (ldflt R) (lrun fn (ml_init P X) (ml_nodes P)) k.
  by move=> k kn; rewrite lrun_cat lrun_prefix // sz.
have shp : forall k, (k < size (ml_inputs P) + size (ml_nodes P))%N ->
    nth [::] (lrun_s (ml_inputs P) (ml_nodes P ++ xs)) k = nth [::] (lrun_s (ml_inputs P) (ml_nodes P)) k.
  move=> k kn; have e := @ml_init_shapes R P X.
  by rewrite -e -!(@lrun_shapes R fn) !lnth_fst pre.
have mi : mp_init (with_lnodes P xs) L = mp_init P L.
  apply/eq_in_map => j; rewrite mem_iota add0n => /andP [_ jn] /=.
  by rewrite shp //; apply: (all_nthP (0%N, [::]) oki).
have lo' : (lo < size (ml_inputs P) + size (ml_nodes P))%N by have /= := all_In ok Hin.
have HL' : forall j, (j < size (mp_inputs P))%N ->
    let b := nth (0%N, [::]) (mp_inputs P) j in
    mplaced (mesh P) (nth (ldflt R) (lrun fn (ml_init P X) (ml_nodes P ++ xs)) b.1).1 b.2
      (nth (ldflt R) (lrun fn (ml_init P X) (ml_nodes P ++ xs)) b.1).2 (nth (fun _ => zero_t R) L j).
  move=> j jn /=; rewrite pre; first exact: HL.
  by apply: (all_nthP (0%N, [::]) oki).
have := H X L HL' lo po pls Hin; rewrite /= mi.
by rewrite !pre.
Qed.

Theorem mcheckx_sound (P : mplan) xs (c : seq mfact) : mcheckx P xs c = true -> mplan_equiv P.
Proof.
case/andP => /andP [/andP [ok oki] bk] C; split; first by rewrite -bind_ok_lE.
move=> R fn; apply: (mequiv_with_lnodes ok oki).
exact: mcheck_sound_at C.
Qed.

End JMeshSound.
