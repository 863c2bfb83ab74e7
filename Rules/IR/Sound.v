(** * Soundness of the Coq judge: [check P c = true -> plan_equiv P]. *)
From mathcomp Require Import all_ssreflect all_algebra.
From TVCert Require Import Semantics IR.Syntax IR.Denote IR.Check IR.Lists IR.SoundOps.
Set Implicit Arguments.
Unset Strict Implicit.
Unset Printing Implicit Defensive.
Import GRing.Theory Num.Theory.
Import JSyntax JDenote JCheck JLists JSoundOps.

Module JSound.
Local Open Scope ring_scope.

Section Sound.
Variable R : realFieldType.
Variable fn : nat -> R -> R.
Local Notation tensor := (tensor R).
Local Notation family := (family R).
Local Notation entry := (entry R).
Local Notation dflt := (dflt R).
Local Notation zero_t := (zero_t R).
Local Notation run := (run fn).
Local Notation run_node := (run_node fn).
Local Notation op_val := (op_val fn).

(** ** The evaluator *)
Lemma size_run p env ns : size (run p env ns) = (size env + size ns)%N.
Proof.
elim: ns env => [|n ns IH] env /=; first by rewrite addn0.
by rewrite IH size_rcons addSnnS.
Qed.

Lemma run_prefix p env ns k : (k < size env)%N -> nth dflt (run p env ns) k = nth dflt env k.
Proof.
elim: ns env => [|n ns IH] env //= ke.
by rewrite IH ?size_rcons ?(ltn_trans ke) // nth_rcons ke.
Qed.

Lemma run_cat p env ns1 ns2 : run p env (ns1 ++ ns2) = run p (run p env ns1) ns2.
Proof. by elim: ns1 env => [|n ns IH] env //=. Qed.

Lemma run_node_at p env ns j : (j < size ns)%N ->
  nth dflt (run p env ns) (size env + j) =
  run_node p (run p env (take j ns)) (nth (Node Add [::]) ns j).
Proof.
move=> js; rewrite -{1}(cat_take_drop j ns) run_cat (drop_nth (Node Add [::])) //=.
have sz : size (run p env (take j ns)) = (size env + j)%N by rewrite size_run size_take js.
by rewrite run_prefix ?size_rcons ?sz // -sz nth_rcons ltnn eqxx.
Qed.

Lemma run_node_ext p E E' n :
  (forall a, a \in n_args n -> nth dflt E a = nth dflt E' a) -> run_node p E n = run_node p E' n.
Proof.
move=> H; rewrite /run_node.
by have -> : [seq nth dflt E a | a <- n_args n] = [seq nth dflt E' a | a <- n_args n]
  by apply/eq_in_map.
Qed.

Definition env_masked (env : seq entry) : Prop :=
  forall k r i, ~~ inb (nth dflt env k).1 i -> (nth dflt env k).2 r i = 0.

Lemma step_masked p o ss fs r i : ~~ inb (op_shape p o ss) i -> step fn p o ss fs r i = 0.
Proof.
case: o => [| | | | | |c|f|c s| |ds|d0 d1|[]|d] ni;
  by rewrite /step ?/op_val /mask ifN.
Qed.

Lemma run_node_masked p E n r i : ~~ inb (run_node p E n).1 i -> (run_node p E n).2 r i = 0.
Proof. exact: step_masked. Qed.

Lemma run_masked p env ns : env_masked env -> env_masked (run p env ns).
Proof.
elim: ns env => [|n ns IH] env //= M; apply: IH => k r i.
rewrite nth_rcons; case: ltnP => _; first exact: M.
case: eqP => _; first exact: run_node_masked.
by [].
Qed.

Lemma nth_fst (env : seq entry) a : nth [::] (map fst env) a = (nth dflt env a).1.
Proof.
case: (ltnP a (size env)) => h; first by rewrite (nth_map dflt).
by rewrite !nth_default ?size_map.
Qed.

Lemma run_shapes p env ns : map fst (run p env ns) = run_s p (map fst env) ns.
Proof.
elim: ns env => [|n ns IH] env //=; rewrite IH map_rcons; congr (run_s _ (rcons _ _) _).
by rewrite /run_node /= -map_comp; congr (op_shape _ _ _); apply: eq_map => a /=; rewrite nth_fst.
Qed.

Lemma all_In {T : Type} (a : pred T) s x : all a s -> List.In x s -> a x.
Proof. by elim: s => //= y s IH /andP [ay As] [<-|]; last exact: IH. Qed.

(** ** The invariant: every fact of the checker holds *)
Section Plan.
Variable P : plan.
Variable X : seq tensor.
Let p := mesh_size P.
Let ni := size (l_inputs P).
Let le := run 1 (l_init P X) (l_nodes P).
Let ls := run_s 1 (l_inputs P) (l_nodes P).

Lemma l_init_shapes : map fst (l_init P X) = l_inputs P.
Proof.
apply: (@eq_from_nth _ [::]); first by rewrite size_map size_mkseq.
by move=> k; rewrite size_map size_mkseq => kn; rewrite (nth_map dflt) ?size_mkseq // nth_mkseq.
Qed.

Lemma ls_le k : nth [::] ls k = (nth dflt le k).1.
Proof. by rewrite /ls -l_init_shapes -run_shapes nth_fst. Qed.

Lemma size_ls : size ls = size le.
Proof. by rewrite /ls -l_init_shapes -run_shapes size_map. Qed.

Lemma le_masked : env_masked le.
Proof.
apply: run_masked => k r i; case: (ltnP k (size (l_init P X))) => h.
  have hk : (k < ni)%N by move: h; rewrite /l_init size_mkseq.
  by rewrite /l_init nth_mkseq //= /mask => /negbTE ->.
by rewrite nth_default.
Qed.

Definition fact_ok (f : fact) (e : entry) : Prop :=
  (f.1 < size le)%N /\
  arg_ok p (nth dflt le f.1).1 f.2 ((nth dflt le f.1).2 0%N) e.1 e.2.

Definition inv (fs : seq fact) (E : seq entry) : Prop :=
  size fs = size E /\ forall k, (k < size fs)%N -> fact_ok (nth dfact fs k) (nth dflt E k).

(** A logical node is its op applied to the logical values of its operands. *)
Lemma le_node l : (ni <= l)%N -> (l < size le)%N ->
  let ln := nth (Node Add [::]) (l_nodes P) (l - ni) in
  all (fun a => a < l)%N (n_args ln) ->
  nth dflt le l = run_node 1 le ln.
Proof.
move=> nl ll ln al.
have sz : size (l_init P X) = ni by rewrite size_mkseq.
have jl : (l - ni < size (l_nodes P))%N by move: ll; rewrite /le size_run sz ltn_subLR.
rewrite -{1}(subnKC nl) -{1}sz run_node_at //.
apply: run_node_ext => a aa; have /= al' := allP al a aa.
rewrite /le -{2}(cat_take_drop (l - ni) (l_nodes P)) run_cat [in RHS]run_prefix //.
by rewrite size_run size_take jl sz subnKC.
Qed.

Lemma step_local q o ss fs : is_local o ->
  step fn q o ss fs = fun r => op_val o ss (map (fun f => f r) fs).
Proof. by case: o => // [] []. Qed.

Lemma local_sound fs E n l pl :
  inv fs E -> is_local (n_op n) ->
  all (fun a => a < size fs)%N (n_args n) ->
  let af := map (nth dfact fs) (n_args n) in
  let ln := nth (Node Add [::]) (l_nodes P) (l - ni) in
  (ni <= l)%N -> (l < size ls)%N -> n_op ln = n_op n -> n_args ln = map fst af ->
  all (fun a => a < l)%N (n_args ln) ->
  rule (n_op n) (map (nth [::] ls) (map fst af)) (map snd af) pl ->
  pl_ok p (nth [::] ls l) pl ->
  fact_ok (l, pl) (run_node p E n).
Proof.
move=> [szf I] loc aa af ln nl ll eo ea al ru ok.
have ll' : (l < size le)%N by rewrite -size_ls.
have hl := le_node nl ll' al; rewrite -/ln in hl.
set args := n_args n in aa af ea ru *.
set lids := map fst af in ea ru *.
have szaf : size af = size args by rewrite size_map.
have Iarg : forall k, (k < size args)%N -> fact_ok (nth dfact af k) (nth dflt E (nth 0%N args k)).
  move=> k ka; rewrite (nth_map 0%N) //; apply: I; exact: (allP aa _ (mem_nth 0%N ka)).
set lss := map (nth [::] ls) lids in ru *.
have elss : map fst (map (nth dflt le) (n_args ln)) = lss.
  by rewrite ea -map_comp /lss; apply: eq_map => a /=; rewrite ls_le.
set Ts := map (fun a => (nth dflt le a).2 0%N) lids.
set pss := map (fun a => (nth dflt E a).1) args.
set Ls := map (fun a => (nth dflt E a).2) args.
have hpl : nth [::] ls l = op_shape 1 (n_op n) lss by rewrite ls_le hl /run_node /= elss eo.
rewrite hpl in ok.
have A : forall k, (k < size (map snd af))%N ->
    arg_ok p (nth [::] lss k) (nth Replicate (map snd af) k) (nth zero_t Ts k) (nth [::] pss k)
           (nth (fun _ => zero_t) Ls k).
  move=> k; rewrite size_map szaf => kp.
  have [_ F] := Iarg k kp.
  rewrite /lss /Ts /pss /Ls /lids.
  by rewrite !(nth_map 0%N) ?size_map ?szaf // !(nth_map dfact) ?szaf // ls_le.
have z1 : size lss = size (map snd af) by rewrite !size_map.
have z2 : size Ts = size (map snd af) by rewrite !size_map.
have z3 : size pss = size (map snd af) by rewrite !size_map.
have z4 : size Ls = size (map snd af) by rewrite !size_map.
have [hsh hpd] := @rule_sound R fn p (n_op n) lss (map snd af) pl Ts pss Ls loc z1 z2 z3 z4 A ru ok.
split => //.
have hle : nth dflt le l = (op_shape 1 (n_op n) lss, step fn 1 (n_op n) lss (map snd (map (nth dflt le) (n_args ln)))).
  by rewrite hl /run_node elss eo.
have hv : (nth dflt le l).2 0%N = op_val (n_op n) lss Ts.
  rewrite hle /= step_local // -!map_comp; congr (op_val _ _ _).
  by rewrite ea /Ts /lids.
have hrn : run_node p E n = (op_shape 1 (n_op n) pss, fun r => op_val (n_op n) pss (map (fun L => L r) Ls)).
  rewrite /run_node op_shape_local // step_local // -!map_comp.
  by congr (_, fun r => op_val _ _ _); rewrite -map_comp.
rewrite hrn hv hle /=; split => //.
- by move=> i ni'; rewrite /op_val /mask ifN.
- by move=> r i ni'; rewrite /op_val /mask ifN.
Qed.

Lemma collective_sound fs E n l pl :
  inv fs E -> (0 < p)%N -> all (fun a => a < size fs)%N (n_args n) ->
  ~~ is_local (n_op n) ->
  derive P n (map (nth dfact fs) (n_args n)) (l, pl) ->
  fact_ok (l, pl) (run_node p E n).
Proof.
move=> [szf I] p0 aa; rewrite /derive /run_node.
case: (n_op n) => // [[]|d] _ //; case: (n_args n) aa => [|a [|? ?]] //= /andP [ak _];
  have [ll [H -> ok mT mL]] := I a ak; case: (nth dfact fs a) ll H ok mT mL => l1 [|d1|[]] //= ll H ok mT mL.
- case/andP => /andP [/eqP -> rep] _; have -> : pl = Replicate by case: pl rep.
  split=> //; split => //.
  + by move=> r i rp /= ii; rewrite /mask ii sumRE H.
  + by move=> r i /= ni'; rewrite /mask ifN.
- case/andP => /andP [/andP [/eqP -> /eqP ed] rep] _; have -> : pl = Replicate by case: pl rep.
  subst d1.
  case: H => ds dv H; set s := (nth dflt le l1).1 in ds dv H ok mT mL *.
  set m := (nth 0%N s d %/ p)%N in dv H mL *.
  have hs : set_nth 0%N (set_nth 0%N s d m) d (nth 0%N (set_nth 0%N s d m) d * p)%N = s.
    by rewrite set_nth_twice nth_set_nth_lt eqxx dv set_nth_nth_same.
  split=> //; split => //; first last.
  + by move=> r i /= ni'; rewrite /mask ifN.
  move=> r i rp /= ii; rewrite /mask hs ii nth_set_nth_lt eqxx.
  have szi : size i = size s by rewrite (inb_size ii).
  have [_ Hi] := inbP _ _ ii.
  have idm : (nth 0%N i d < m * p)%N by rewrite dv; apply: Hi.
  have m0 : (0 < m)%N by rewrite lt0n; apply/eqP => m0; rewrite m0 mul0n in idm.
  rewrite H.
  + rewrite /shift set_nth_twice nth_set_nth_lt eqxx.
    by rewrite -divn_eq set_nth_nth_same ?szi.
  + by rewrite ltn_divLR // mulnC.
  + apply/inbP; rewrite !size_set_nth_lt ?szi //; split=> // k ks.
    rewrite !nth_set_nth_lt; case: eqP => _; first by rewrite ltn_mod.
    exact: Hi.
Qed.

Lemma derive_sound fs E n f :
  inv fs E -> (0 < p)%N ->
  all (fun a => a < size fs)%N (n_args n) ->
  derive P n (map (nth dfact fs) (n_args n)) f ->
  fact_ok f (run_node p E n).
Proof.
move=> I p0 aa; case: f => l pl.
case loc: (is_local (n_op n)); last by apply: collective_sound => //; rewrite loc.
rewrite /derive; move: loc; case hop: (n_op n) => // loc.
all: move=> /andP [/andP [/andP [/andP [/andP [/andP [nl ll] /op_eqbP eo] /eqP ea] al] ru] ok];
  by apply: (local_sound I); rewrite ?hop.
Qed.

Lemma check_nodes_sound ns fs E c :
  inv fs E -> (0 < p)%N -> check_nodes P fs ns c -> inv (fs ++ c) (run p E ns).
Proof.
elim: ns fs E c => [|n ns IH] fs E [|f c] //=; first by rewrite cats0.
move=> I p0 /andP [/andP [aa dv] rest].
have F := derive_sound I p0 aa dv.
have I' : inv (rcons fs f) (rcons E (run_node p E n)).
  case: I => sz I; split; first by rewrite !size_rcons sz.
  move=> k; rewrite size_rcons ltnS leq_eqVlt => /orP [/eqP ->|kf].
    by rewrite !nth_rcons -sz ltnn eqxx.
  by rewrite !nth_rcons kf -sz kf; apply: I.
by rewrite -cat_rcons; apply: IH.
Qed.

Lemma placed_mask q s pl T (L : family) : pl_ok q s pl -> placed q s pl T L ->
  placed q s pl (mask s T) (fun r => mask (local_shape q s pl) (L r)).
Proof.
case: pl => [|d|[]] /=.
- by move=> _ H r i rp ii; rewrite /mask /local_shape ii H.
- move=> _ [ds dv H]; split=> // r i rp ii.
  have si := @inb_shift q s d _ r i ds dv rp ii.
  by rewrite /mask /local_shape ii si H.
- by move=> _ H i ii; rewrite /mask ii -(H i ii); apply: eq_bigr => r _.
- by move=> _ H i ii; rewrite /mask ii -(H i ii); congr (_ * _); apply: eq_bigr => r _.
- by move=> _ H i ii; rewrite /mask /local_shape ii; exact: H.
Qed.

Lemma init_inv (L : seq family) :
  (forall j, (j < size (p_inputs P))%N ->
     let b := nth (0%N, Replicate) (p_inputs P) j in
     placed p (nth [::] (l_inputs P) b.1) b.2 (nth zero_t X b.1) (nth (fun _ => zero_t) L j)) ->
  all (fun b => (b.1 < ni)%N && pl_ok p (nth [::] (l_inputs P) b.1) b.2) (p_inputs P) ->
  inv (p_inputs P) (p_init P L).
Proof.
move=> HL ok; split; first by rewrite size_mkseq.
move=> k kp; have /andP [li okb] := all_nthP (0%N, Replicate) ok k kp.
have /= Hk := HL k kp.
rewrite /p_init nth_mkseq //.
case: (nth _ (p_inputs P) k) li okb Hk => l pl /= li okb Hk.
have szi : size (l_init P X) = ni by rewrite size_mkseq.
have hle : nth dflt le l = (nth [::] (l_inputs P) l, fun _ => mask (nth [::] (l_inputs P) l) (nth zero_t X l)).
  by rewrite /le run_prefix ?szi // /l_init nth_mkseq.
split; first by rewrite /le size_run szi (leq_trans li) ?leq_addr.
rewrite hle /=; split => //.
- exact: placed_mask.
- by move=> i ni'; rewrite /mask ifN.
- by move=> r i ni'; rewrite /mask ifN.
Qed.

End Plan.
End Sound.

Lemma check_sound_at (R : realFieldType) (fn : nat -> R -> R) P c : check P c -> equiv_at fn P.
Proof.
move=> C X L HL le pe lo po pl Hin.
move: C; rewrite /check => /andP [/andP [/andP [p0 okin] cn] cout].
have I0 := init_inv fn HL okin.
have [_ I1] := check_nodes_sound I0 p0 cn.
have /= := all_In cout Hin.
move=> /andP [/andP [/andP [lo_ok po_ok] /eqP e1] /placement_eqbP e2].
have [_ [H -> _ _ _]] := I1 po po_ok.
by rewrite e1 e2 in H *.
Qed.

(** The soundness theorem of the Coq judge. *)
Theorem check_sound (P : plan) (c : seq fact) : check P c = true -> plan_equiv P.
Proof. by move=> C R fn; apply: check_sound_at C. Qed.

End JSound.
