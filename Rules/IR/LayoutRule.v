(** * The one-axis placement rules of the layout / reduction / row-wise ops, and their soundness.

    [lrule p o ss pls pl] plays for a [JLayout.lop] the part [Check.rule] plays for a stage-1
    op: the operands of logical shapes [ss] have placements [pls] on a mesh axis of [p] ranks,
    [pl] is the claimed placement of the result.  Each line is one lemma of [LayoutSound.v]
    and its side conditions are checked right there.  [lrule_sound] is stated exactly like
    [SoundOps.rule_sound], so the mesh checker applies it on every axis. *)
From mathcomp Require Import all_ssreflect all_algebra.
From Coq Require Import FunctionalExtensionality.
From TVCert Require Import IR.Syntax IR.Denote IR.Check IR.Lists IR.SoundOps IR.LayoutOps IR.LayoutSound.
Set Implicit Arguments.
Unset Strict Implicit.
Unset Printing Implicit Defensive.
Import GRing.Theory Num.Theory.
Import JSyntax JDenote JCheck JLists JSoundOps JLayout JLayoutSound.

Module JLayoutRule.

(** ** Decidable equality of layout ops (the checker compares the parallel op with the logical one) *)
Definition red_eqb (a b : red) : bool :=
  match a, b with RdSum, RdSum | RdMean, RdMean | RdMax, RdMax | RdMin, RdMin => true | _, _ => false end.

Definition cmp_eqb (a b : cmp) : bool :=
  match a, b with
  | CEq, CEq | CNe, CNe | CLt, CLt | CLe, CLe | CGt, CGt | CGe, CGe => true
  | _, _ => false
  end.

Definition lop_eqb (a b : lop) : bool :=
  match a, b with
  | Reshape s, Reshape s' | Expand s, Expand s' => s == s'
  | Permute ds, Permute ds' | Squeeze ds, Squeeze ds' => ds == ds'
  | Unsqueeze d, Unsqueeze d' | Concat d, Concat d' | SoftmaxBwd d, SoftmaxBwd d' => d == d'
  | Slice d x y, Slice d' x' y' => (d == d') && (x == x') && (y == y')
  | Reduce r ds k, Reduce r' ds' k' => red_eqb r r' && (ds == ds') && (k == k')
  | Minimum, Minimum | Maximum, Maximum | CastF, CastF | Where, Where => true
  | AddScalar c, AddScalar c' | MaskedFill c, MaskedFill c' => rat_lit_eqb c c'
  | Softmax d e, Softmax d' e' | LogSoftmaxBwd d e, LogSoftmaxBwd d' e' => (d == d') && (e == e')
  | LogSoftmax d e l, LogSoftmax d' e' l' => (d == d') && (e == e') && (l == l')
  | Einsum ts o, Einsum ts' o' => (ts == ts') && (o == o')
  | Iota n a st, Iota n' a' st' => (n == n') && (a == a') && (st == st')
  | Cmp c, Cmp c' => cmp_eqb c c'
  | OneHot n, OneHot n' => n == n'
  | _, _ => false
  end.

Lemma red_eqbP a b : red_eqb a b -> a = b.
Proof. by case: a; case: b. Qed.

Lemma cmp_eqbP a b : cmp_eqb a b -> a = b.
Proof. by case: a; case: b. Qed.

Ltac eqb_intro := repeat match goal with
  | |- is_true (_ && _) -> _ => case/andP
  | |- is_true (_ == _) -> _ => move/eqP->
  | |- is_true (red_eqb _ _) -> _ => move/red_eqbP->
  | |- is_true (cmp_eqb _ _) -> _ => move/cmp_eqbP->
  | |- is_true (rat_lit_eqb _ _) -> _ => move/rat_lit_eqbP->
  end.

Lemma lop_eqbP a b : lop_eqb a b -> a = b.
Proof.
by case: a => [?|?|?|?|?|? ? ?|?|? ? ?| | |?| |? ?|? ? ?|?|? ?|? ?| |?|? ? ?|?|?];
   case: b => [?|?|?|?|?|? ? ?|?|? ? ?| | |?| |? ?|? ? ?|?|? ?|? ?| |?|? ? ?|?|?] //=; eqb_intro.
Qed.

(** ** Index lists under unsqueeze *)
Lemma size_ins_at d x (s : seq nat) : d <= size s -> size (ins_at d x s) = (size s).+1.
Proof. by move=> ds; rewrite /ins_at size_cat /= size_take size_drop; case: ltngtP ds => // h _; rewrite ?addnS ?subnKC // ?h ?subnn ?addn0 // ltnW. Qed.

Lemma nth_ins_at d x (s : seq nat) k : d <= size s ->
  nth 0 (ins_at d x s) k = if k < d then nth 0 s k else if k == d then x else nth 0 s k.-1.
Proof.
move=> ds; rewrite /ins_at nth_cat size_take.
have -> : (if d < size s then d else size s) = d by case: ltngtP ds => // -> .
case: ltnP => kd; first by rewrite nth_take.
rewrite -[k - d]/(k - d); case: (k =P d) => [->|kd']; first by rewrite subnn.
have : d < k by rewrite ltn_neqAle eq_sym; apply/andP; split=> //; apply/eqP.
move=> dk; rewrite (_ : k - d = (k.-1 - d).+1) /=; last by rewrite -subSn; [rewrite prednK // (leq_ltn_trans _ dk) | rewrite -ltnS prednK // (leq_ltn_trans _ dk)].
by rewrite nth_drop subnKC // -ltnS prednK // (leq_ltn_trans _ dk).
Qed.

Lemma size_rem_at d (i : seq nat) : d < size i -> size (rem_at d i) = (size i).-1.
Proof. move=> di; rewrite /rem_at size_cat size_take size_drop di; nat_lia. Qed.

Lemma nth_rem_at d (i : seq nat) k : d < size i ->
  nth 0 (rem_at d i) k = if k < d then nth 0 i k else nth 0 i k.+1.
Proof.
move=> di; rewrite /rem_at nth_cat size_take di; case: ltnP => kd; first by rewrite nth_take.
by rewrite nth_drop; congr nth; nat_lia.
Qed.

Lemma inb_rem_ins d (s i : seq nat) : d <= size s -> inb (ins_at d 1 s) i -> inb s (rem_at d i).
Proof.
move=> ds /inbP [sz H]; rewrite size_ins_at // in sz H; apply/inbP.
have di : d < size i by rewrite sz ltnS.
rewrite size_rem_at // sz /=; split=> // k ks.
rewrite nth_rem_at //; case: ifP => kd.
  by have := H k (ltn_trans ks (ltnSn _)); rewrite nth_ins_at // kd.
have h1 : (k.+1 < d) = false by apply/negbTE; rewrite -leqNgt; nat_lia.
have h2 : (k.+1 == d) = false by apply/negbTE; apply/eqP; nat_lia.
by have := H k.+1 ks; rewrite nth_ins_at // h1 h2.
Qed.

(** Where a shard on dim [e] goes when a dim is inserted at [d]. *)
Definition unsq_dim (d e : nat) : nat := if e < d then e else e.+1.

(** ** The rules *)
Definition is_some {A : Type} (x : option A) : bool := if x is Some _ then true else false.

(** One-operand ops and the softmax backward pair (every line but concat and min / max). *)
Definition lrule_one (p : nat) (o : lop) (ss : seq shape) (pls : seq placement) (pl : placement) : bool :=
  let s0 := nth [::] ss 0 in
  match pls with
  | [:: Shard d] =>
      match o with
      | Permute ds => perm_ok ds s0 && (sh pl == Some (seq.index d ds))        (* permute_shard *)
      | Unsqueeze u => (u <= size s0) && (sh pl == Some (unsq_dim u d))        (* unsqueeze_shard *)
      | Slice e a b => slice_ok s0 e a b && (d != e) && (sh pl == Some d)       (* slice_other_dim *)
      | Softmax e _ | LogSoftmax e _ _ => rowwise_ok s0 e d && (sh pl == Some d) (* softmax_other_dim *)
      | Reduce r [:: e] keep =>
          if e == d then                                                        (* reduce_*_sharded_dim *)
            match r with
            | RdSum => placement_eqb pl (Partial RSum)
            | RdMean => placement_eqb pl (Partial RAvg) && (0 < p)
            | RdMax => placement_eqb pl (Partial RMax) && (0 < nth 0 s0 d %/ p)
            | RdMin => false
            end
          else reduce_ok s0 e d && (sh pl == Some (rdim keep e d))              (* reduce_other_dim *)
      | AddScalar _ | CastF => sh pl == Some d                                  (* pointwise op of a shard *)
      | OneHot _ => (d < size s0) && (sh pl == Some d)                         (* one_hot_shard *)
      | _ => false
      end
  | [:: Partial rd] =>                                                          (* layout_partial_linear_map *)
      is_some (reindex_op o) && sum_like rd && placement_eqb pl (Partial rd)
  | [:: Shard d; Shard d'] =>
      match o with
      | SoftmaxBwd e | LogSoftmaxBwd e _ =>                                     (* softmax_bwd_other_dim *)
          (d == d') && rowwise_ok s0 e d && (nth [::] ss 1 == s0) && (sh pl == Some d)
      | _ => false
      end
  | _ => false
  end.

Definition lrule (p : nat) (o : lop) (ss : seq shape) (pls : seq placement) (pl : placement) : bool :=
  if all is_rep pls then is_rep pl else                       (* congruence on every rank *)
  match o with
  | Concat e =>                                               (* concat_other_dim *)
      if sh (head Replicate pls) is Some d then
        (size ss == size pls) && all (fun a => sh a == Some d) pls && concat_ok p ss e d && (sh pl == Some d)
      else false
  | Minimum | Maximum | MaskedFill _ | Cmp _ =>               (* pointwise op of shards, broadcasting *)
      match pls, sh pl with
      | [:: a; b], Some d =>
          bin_shard (lop_shape o ss) (nth [::] ss 0) a d && bin_shard (lop_shape o ss) (nth [::] ss 1) b d
      | _, _ => false
      end
  | _ => lrule_one p o ss pls pl
  end.

Section Sound.
Variable R : realFieldType.
Variable fn : nat -> R -> R.
Local Notation tensor := (tensor R).
Local Notation family := (family R).
Local Notation zero_t := (zero_t R).

(** Congruence: every operand replicated, any op computed on every rank is replicated. *)
Lemma all_rep_sound p (S : seq shape -> shape) (V : seq shape -> seq tensor -> tensor) ss pls pl Ts pss Ls :
  size ss = size pls -> size Ts = size pls -> size pss = size pls -> size Ls = size pls ->
  (forall k, (k < size pls)%N ->
     arg_ok p (nth [::] ss k) (nth Replicate pls k) (nth zero_t Ts k) (nth [::] pss k)
            (nth (fun _ => zero_t) Ls k)) ->
  all is_rep pls -> is_rep pl ->
  S pss = local_shape p (S ss) pl /\ placed p (S ss) pl (V ss Ts) (fun r => V pss (map (fun L => L r) Ls)).
Proof.
move=> hss hTs hps hLs A allr; case: pl => // _.
have rk : forall k, (k < size pls)%N -> nth Replicate pls k = Replicate.
  by move=> k kp; have := all_nthP Replicate allr k kp; case: (nth Replicate pls k).
have ep : pss = ss.
  apply: (@eq_from_nth _ [::]) => [|k]; first by rewrite hss hps.
  by rewrite hps => kp; have [_ -> _ _ _] := A k kp; rewrite rk.
have eT : forall r, (r < p)%N -> map (fun L => L r) Ls = Ts.
  move=> r rp; apply: (@eq_from_nth _ zero_t) => [|k]; first by rewrite size_map hLs hTs.
  rewrite size_map hLs => kp; rewrite (nth_map (fun _ => zero_t)) ?hLs //.
  have [H e _ mT mL] := A k kp; move: H e mL; rewrite rk // => H e mL.
  by apply: (rep_fun H mT) => //; move: (mL r); rewrite e.
by split; [rewrite ep | move=> r i rp ii; rewrite ep eT].
Qed.

Lemma shP' a d : (sh a == Some d) -> a = Shard d.
Proof. by case: a => //= ? /eqP [->]. Qed.

(** unsqueeze of a shard: the shard follows its dim ([reindex_shard]). *)

Lemma unsq_shape d e (s : seq nat) v : d <= size s -> e < size s ->
  ins_at d 1 (set_nth 0 s e v) = set_nth 0 (ins_at d 1 s) (unsq_dim d e) v.
Proof.
move=> ds es; apply: (@eq_from_nth _ 0).
  by rewrite size_ins_at ?size_set_nth_lt ?size_ins_at //; rewrite /unsq_dim; case: ifP => _; nat_lia.
move=> k _; rewrite nth_ins_at ?size_set_nth_lt // !nth_set_nth_lt nth_ins_at // /unsq_dim.
by repeat case: ifP => //; move=> *; exfalso; nat_lia.
Qed.

Lemma unsq_nth d e (s : seq nat) : d <= size s -> nth 0 (ins_at d 1 s) (unsq_dim d e) = nth 0 s e.
Proof.
move=> ds; rewrite /unsq_dim; case: ifP => ed; rewrite nth_ins_at // ?ed //.
have -> : (e.+1 < d) = false by apply/negbTE; rewrite -leqNgt; nat_lia.
by have -> : (e.+1 == d) = false by apply/negbTE; apply/eqP; nat_lia.
Qed.

Lemma unsq_shift d e off (i : seq nat) : d < size i -> unsq_dim d e < size i ->
  shift e off (rem_at d i) = rem_at d (shift (unsq_dim d e) off i).
Proof.
move=> di ei; rewrite /shift.
have sz : size (set_nth 0 i (unsq_dim d e) (off + nth 0 i (unsq_dim d e))) = size i by rewrite size_set_nth_lt.
have er : nth 0 (rem_at d i) e = nth 0 i (unsq_dim d e).
  by rewrite nth_rem_at // /unsq_dim; case: ifP.
have erl : e < size (rem_at d i) by rewrite size_rem_at //; move: ei; rewrite /unsq_dim; case: ifP => ed h; nat_lia.
apply: (@eq_from_nth _ 0).
  by rewrite size_set_nth_lt // size_rem_at // size_rem_at sz.
move=> k _; rewrite er nth_set_nth_lt !nth_rem_at ?sz // !nth_set_nth_lt /unsq_dim.
by repeat case: ifP => //; move=> *; exfalso; nat_lia.
Qed.

Lemma unsqueeze_shard p d s e T (L : family) :
  d <= size s -> placed p s (Shard e) T L ->
  lop_shape (Unsqueeze d) [:: local_shape p s (Shard e)] = local_shape p (ins_at d 1 s) (Shard (unsq_dim d e)) /\
  placed p (ins_at d 1 s) (Shard (unsq_dim d e)) (lop_val fn (Unsqueeze d) [:: s] [:: T])
    (fun r => lop_val fn (Unsqueeze d) [:: local_shape p s (Shard e)] [:: L r]).
Proof.
move=> ds H; have [es _ _] := H.
have shp : lop_shape (Unsqueeze d) [:: local_shape p s (Shard e)] = local_shape p (ins_at d 1 s) (Shard (unsq_dim d e)).
  by rewrite /= unsq_nth // unsq_shape.
split => //.
have -> : lop_val fn (Unsqueeze d) [:: s] [:: T] = reindex (ins_at d 1 s) (rem_at d) T by [].
have -> : (fun r => lop_val fn (Unsqueeze d) [:: local_shape p s (Shard e)] [:: L r]) =
          (fun r => reindex (local_shape p (ins_at d 1 s) (Shard (unsq_dim d e))) (rem_at d) (L r)).
  by apply: functional_extensionality => r; rewrite -shp.
have szs : size (ins_at d 1 s) = (size s).+1 by rewrite size_ins_at.
apply: (reindex_shard H); first by rewrite szs /unsq_dim; case: ifP => _; nat_lia.
  exact: unsq_nth.
move=> r i rp ii.
have szi : size i = (size s).+1 by rewrite (inb_size ii) /local_shape size_set_nth_lt ?szs; [|rewrite /unsq_dim; case: ifP => _; nat_lia].
split.
  apply: inb_rem_ins; first by rewrite /local_shape size_set_nth_lt.
  by move: ii; rewrite /local_shape unsq_nth // -unsq_shape.
apply: unsq_shift; first by rewrite szi ltnS.
by rewrite szi /unsq_dim; case: ifP => ed; nat_lia.
Qed.

(** one_hot of a shard on an operand dim: the new last dim is whole on every rank. *)
Lemma set_nth_rcons (s : seq nat) n d v : d < size s ->
  set_nth 0 (rcons s n) d v = rcons (set_nth 0 s d v) n.
Proof.
move=> ds; have ds' : d < size (rcons s n) by rewrite size_rcons ltnS ltnW.
apply: (@eq_from_nth _ 0); first by rewrite size_set_nth_lt // !size_rcons size_set_nth_lt.
move=> k; rewrite size_set_nth_lt // => ks.
rewrite nth_set_nth_lt !nth_rcons size_set_nth_lt // nth_set_nth_lt.
case: (k =P d) => [->|_] //; by rewrite ds.
Qed.

Lemma inb_rcons_take (s : seq nat) n i : inb (rcons s n) i -> inb s (take (size s) i).
Proof. by elim: s i => [|x s IH] [|k i] //= /andP [-> /IH ->]. Qed.

Lemma take_shift k d off (i : seq nat) : d < k -> d < size i -> take k (shift d off i) = shift d off (take k i).
Proof.
move=> dk di; have dt : d < size (take k i) by rewrite size_take; case: ifP.
apply: (@eq_from_nth _ 0); first by rewrite /shift size_set_nth_lt // !size_take size_set_nth_lt.
move=> j; rewrite /shift size_take size_set_nth_lt // => js.
have jk : j < k by case: (ltnP k (size i)) js => h js //; exact: leq_trans js h.
by rewrite nth_take // !nth_set_nth_lt !nth_take.
Qed.

Lemma one_hot_shard p n s d T (L : family) :
  d < size s -> placed p s (Shard d) T L ->
  lop_shape (OneHot n) [:: local_shape p s (Shard d)] = local_shape p (rcons s n) (Shard d) /\
  placed p (rcons s n) (Shard d) (lop_val fn (OneHot n) [:: s] [:: T])
    (fun r => lop_val fn (OneHot n) [:: local_shape p s (Shard d)] [:: L r]).
Proof.
move=> ds [_ dv H].
have nd : nth 0 (rcons s n) d = nth 0 s d by rewrite nth_rcons ds.
have shp : rcons (local_shape p s (Shard d)) n = local_shape p (rcons s n) (Shard d) by rewrite /= nd set_nth_rcons.
split=> //; split; [by rewrite size_rcons ltnS ltnW | by rewrite nd |].
move=> r i rp ii.
have szl : size (local_shape p s (Shard d)) = size s by rewrite /= size_set_nth_lt.
have ii' : inb (rcons (local_shape p s (Shard d)) n) i by rewrite shp.
have si : inb (rcons s n) (shift d (r * (nth 0 (rcons s n) d %/ p)) i).
  apply: (@inb_shift p) => //; [by rewrite size_rcons ltnS ltnW | by rewrite nd].
have szi : size i = (size s).+1 by rewrite (inb_size ii') size_rcons szl.
rewrite /lop_val /lop_shape /= /mask ii' si.
rewrite nd szl take_shift ?szi //; last by rewrite ltnW.
have it : inb (local_shape p s (Shard d)) (take (size s) i) by have := inb_rcons_take ii'; rewrite szl.
rewrite (H r (take (size s) i) rp it).
have sd : (size s == d) = false by apply/eqP => e; rewrite e ltnn in ds.
by rewrite /shift nth_set_nth_lt sd.
Qed.

Lemma lrule_one_sound p o ss pls pl Ts pss Ls :
  size ss = size pls -> size Ts = size pls -> size pss = size pls -> size Ls = size pls ->
  (forall k, (k < size pls)%N ->
     arg_ok p (nth [::] ss k) (nth Replicate pls k) (nth zero_t Ts k) (nth [::] pss k)
            (nth (fun _ => zero_t) Ls k)) ->
  all is_rep pls = false -> lrule_one p o ss pls pl ->
  pl_ok p (lop_shape o ss) pl ->
  lop_shape o pss = local_shape p (lop_shape o ss) pl /\
  placed p (lop_shape o ss) pl (lop_val fn o ss Ts) (fun r => lop_val fn o pss (map (fun L => L r) Ls)).
Proof.
move=> hss hTs hps hLs A nallr; rewrite /lrule_one.
case: pls A hss hTs hps hLs nallr => [|a [|b [|c pls']]] A hss hTs hps hLs nallr //.
- case: ss hss A => [|s0 [|]] // _ A; case: Ts hTs A => [|T0 [|]] // _ A.
  case: pss hps A => [|ps0 [|]] // _ A; case: Ls hLs A => [|L0 [|]] // _ A.
  have A0 := A 0%N isT; rewrite /= in A0 *; clear A.
  have [H e0 okp mT mL] := A0; rewrite e0 in mL *.
  case: a A0 H e0 okp mL nallr => [|d|rd] A0 H e0 okp mL nallr //.
  + case: o => [s'|ds|d'|ds|s'|e a b|e|r ds keep| | |c| |e ex|e ex lg|e|e ex|ts out| |c|n a st|c|n] //.
    * by move=> /andP [ok /shP' ->] _; exact: (permute_shard fn ok H).
    * by move=> /andP [ok /shP' ->] _; exact: (unsqueeze_shard ok H).
    * by move=> /andP [/andP [ok de] /shP' ->] _; exact: (slice_other_dim fn ok de H).
    * case: ds => [|e [|? ?]] //; case: (e =P d) => [->|/eqP ed].
        case: r => //.
        - by move=> /placement_eqbP -> _; exact: (reduce_sum_sharded_dim fn keep H).
        - by move=> /andP [/placement_eqbP -> p0] _; exact: (reduce_mean_sharded_dim fn keep H p0).
        - by move=> /andP [/placement_eqbP -> m0] _; exact: (reduce_max_sharded_dim fn keep H m0).
      by move=> /andP [ok /shP' ->] _; exact: (reduce_other_dim fn r keep ok H).
    * move=> /shP' -> _; split => //.
      by have := @unary_shard R p (fun x => (x + lit R c)%R) s0 d T0 L0; rewrite -e0; apply.
    * move=> /shP' -> _; split => //.
      by have := @unary_shard R p (fun x => x) s0 d T0 L0; rewrite -e0; apply.
    * by move=> /andP [ok /shP' ->] _; exact: (softmax_other_dim fn ex ok H).
    * by move=> /andP [ok /shP' ->] _; exact: (log_softmax_other_dim fn ex lg ok H).
    * by move=> /andP [ok /shP' ->] _; exact: (one_hot_shard n ok H).
  + move=> /andP [/andP [hs sl] /placement_eqbP ->] _.
    case Hr: (reindex_op o) hs => [g|] // _.
    by split => //; exact: (layout_partial_linear_map fn Hr sl mT mL H).
- case: ss hss A => [|s0 [|s1 [|]]] // _ A; case: Ts hTs A => [|T0 [|T1 [|]]] // _ A.
  case: pss hps A => [|ps0 [|ps1 [|]]] // _ A; case: Ls hLs A => [|L0 [|L1 [|]]] // _ A.
  have A0 := A 0%N isT; have A1 := A 1%N isT; rewrite /= in A0 A1 *; clear A.
  have [H0 e0 _ _ _] := A0; have [H1 e1 _ _ _] := A1; clear A0 A1.
  case: a b H0 H1 e0 e1 nallr => [|d|rd] [|d'|rd'] H0 H1 e0 e1 nallr //.
  case: o => [s'|ds|d''|ds|s'|e a b|e|r ds keep| | |c| |e ex|e ex lg|e|e ex|ts out| |c|n a st|c|n] //.
  + move=> /andP [/andP [/andP [/eqP dd ok] /eqP s10] /shP' ->] _; subst d' s1 ps0 ps1.
    exact: (softmax_bwd_other_dim fn ok H0 H1).
  + move=> /andP [/andP [/andP [/eqP dd ok] /eqP s10] /shP' ->] _; subst d' s1 ps0 ps1.
    exact: (log_softmax_bwd_other_dim fn ex ok H0 H1).
- by case: a {A nallr hss hTs hps hLs} => // ?; case: b.
Qed.


Lemma lrule_sound p o ss pls pl Ts pss Ls :
  size ss = size pls -> size Ts = size pls -> size pss = size pls -> size Ls = size pls ->
  (forall k, (k < size pls)%N ->
     arg_ok p (nth [::] ss k) (nth Replicate pls k) (nth zero_t Ts k) (nth [::] pss k)
            (nth (fun _ => zero_t) Ls k)) ->
  lrule p o ss pls pl ->
  pl_ok p (lop_shape o ss) pl ->
  lop_shape o pss = local_shape p (lop_shape o ss) pl /\
  placed p (lop_shape o ss) pl (lop_val fn o ss Ts) (fun r => lop_val fn o pss (map (fun L => L r) Ls)).
Proof.
move=> hss hTs hps hLs A; rewrite /lrule; case: ifP => [allr|nallr].
  by move=> rp _; exact: (@all_rep_sound p (lop_shape o) (lop_val fn o) ss pls pl Ts pss Ls hss hTs hps hLs A allr rp).
case Eo: o => [s'|ds|d|ds|s'|e a b|e|r ds keep| | |c| |e ex|e ex lg|e|e ex|ts out| |c|n a st|c|n];
  try (by rewrite -Eo; apply: lrule_one_sound; rewrite ?Eo).
- (* concat_other_dim *)
  case Hh: (sh (head Replicate pls)) => [d|] //.
  move=> /andP [/andP [/andP [/eqP szs allS] ok] /shP' ->] _.
  have rk : forall k, (k < size pls)%N -> nth Replicate pls k = Shard d.
    by move=> k kp; apply: shP'; exact: (all_nthP Replicate allS k kp).
  have ep : pss = map (fun s => local_shape p s (Shard d)) ss.
    apply: (@eq_from_nth _ [::]) => [|k]; first by rewrite size_map hss hps.
    rewrite hps => kp; rewrite (nth_map [::]) ?hss //.
    by have [_ -> _ _ _] := A k kp; rewrite rk.
  have Pl : forall k, (k < size ss)%N ->
      placed p (nth [::] ss k) (Shard d) (nth zero_t Ts k) (nth (fun _ => zero_t) Ls k).
    by move=> k; rewrite hss => kp; have [H _ _ _ _] := A k kp; rewrite rk in H.
  have hT : size Ts = size ss by rewrite hTs hss.
  have hL : size Ls = size ss by rewrite hLs hss.
  by rewrite ep; exact: (concat_other_dim fn ok hT hL Pl).
all: case: pls A hss hTs hps hLs nallr => [|a [|b [|? ?]]] A hss hTs hps hLs nallr //;
  case hpl: (sh pl) => [d|] //; move=> /andP [b0 b1] ok; rewrite (shP hpl) in ok *;
  case: ss hss A b0 b1 ok => [|s0 [|s1 [|]]] // _ A b0 b1 ok; case: Ts hTs A => [|T0 [|T1 [|]]] // _ A;
  case: pss hps A => [|ps0 [|ps1 [|]]] // _ A; case: Ls hLs A => [|L0 [|L1 [|]]] // _ A;
  have A0 := A 0%N isT; have A1 := A 1%N isT; rewrite /= in A0 A1 *.
- (* minimum of shards: SoundOps.binary_shard *)
  exact: (@binary_shard R p (fun x y => Num.min x y) _ d s0 s1 a b T0 T1 ps0 ps1 L0 L1 erefl ok b0 b1 A0 A1).
- (* maximum *)
  exact: (@binary_shard R p (fun x y => Num.max x y) _ d s0 s1 a b T0 T1 ps0 ps1 L0 L1 erefl ok b0 b1 A0 A1).
- (* masked_fill *)
  exact: (@binary_shard R p (fun x y : R => if y != 0%R then lit R c else x) _ d s0 s1 a b T0 T1 ps0 ps1 L0 L1
            erefl ok b0 b1 A0 A1).
- (* comparisons *)
  exact: (@binary_shard R p (fun x y => b01 R (cmpR c x y)) _ d s0 s1 a b T0 T1 ps0 ps1 L0 L1
            erefl ok b0 b1 A0 A1).
Qed.

End Sound.
End JLayoutRule.
