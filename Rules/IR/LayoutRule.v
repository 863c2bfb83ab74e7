(** * The one-axis placement rules of the layout / reduction / row-wise ops, and their soundness.

    [lrule p o ss pls pl] plays for a [JLayout.lop] the part [Check.rule] plays for a stage-1
    op: the operands of logical shapes [ss] have placements [pls] on a mesh axis of [p] ranks,
    [pl] is the claimed placement of the result.  Each line is one lemma of [LayoutSound.v]
    and its side conditions are checked right there.  [lrule_sound] is stated exactly like
    [SoundOps.rule_sound], so the mesh checker applies it on every axis. *)
From mathcomp Require Import all_ssreflect all_algebra.
From Coq Require Import FunctionalExtensionality ArithRing.
From TVCert Require Import Semantics IR.Syntax IR.Denote IR.Check IR.Lists IR.SoundOps IR.LayoutOps IR.LayoutSound.
Set Implicit Arguments.
Unset Strict Implicit.
Unset Printing Implicit Defensive.
Import GRing.Theory Num.Theory.
Import JSyntax JDenote JCheck JLists JSoundOps JLayout JLayoutSound.
Local Notation index := seq.index.   (* not the index lists of Denote.v *)

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

(** ** einsum of operands sharded on a free letter [l] (batch / column parallel) *)
Definition ein_pl (l : nat) (t : seq nat) : placement := if l \in t then Shard (index l t) else Replicate.

(** Every operand's dims are its letters' sizes (as [lsize] reads them). *)
Definition ein_sizes_ok (ts : seq (seq nat)) (ss : seq (seq nat)) : bool :=
  (size ts == size ss) &&
  all (fun k => let t := nth [::] ts k in let s := nth [::] ss k in
                (size t == size s) && all (fun j => nth 0 s j == lsize ts ss (nth 0 t j)) (iota 0 (size t)))
      (iota 0 (size ts)).

Fixpoint pls_eq (a b : seq placement) : bool :=
  match a, b with
  | [::], [::] => true
  | x :: a', y :: b' => placement_eqb x y && pls_eq a' b'
  | _, _ => false
  end.

(** The free letter [nth 0 out q] is held on its own dim by every operand that has it, the others replicated. *)
Definition ein_free_ok (ts : seq (seq nat)) (out : seq nat) (ss : seq (seq nat)) (pls : seq placement) (q : nat) : bool :=
  let l := nth 0 out q in
  (q < size out) && uniq out && all uniq ts && has (fun t => l \in t) ts && ein_sizes_ok ts ss &&
  pls_eq pls (map (ein_pl l) ts).


(** A contracted letter [l] sharded on every operand holding it (the others replicated): the
    ranks' einsums are partial sums of the einsum. *)
Definition ein_contr_ok (ts : seq (seq nat)) (out : seq nat) (ss : seq (seq nat)) (pls : seq placement) (l : nat) : bool :=
  (l \notin out) && has (fun t => l \in t) ts && all uniq ts && ein_sizes_ok ts ss &&
  pls_eq pls (map (ein_pl l) ts).

(** The letter of the first sharded operand (the candidate for [ein_contr_ok]). *)
Definition ein_letter (ts : seq (seq nat)) (pls : seq placement) : nat :=
  let k := find (fun pl => sh pl != None) pls in
  if sh (nth Replicate pls k) is Some d then nth 0 (nth [::] ts k) d else 0.

Lemma pls_eqP a b : pls_eq a b -> a = b.
Proof. by elim: a b => [|x a IH] [|y b] //= /andP [/placement_eqbP -> /IH ->]. Qed.

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
  | Einsum ts out =>                            (* einsum_free_letter / einsum_contracted_letter *)
      if sh pl is Some q then ein_free_ok ts out ss pls q
      else placement_eqb pl (Partial RSum) && ein_contr_ok ts out ss pls (ein_letter ts pls)
  | _ => lrule_one p o ss pls pl
  end.

Section Sound.
Variable R : realFieldType.
Variable fn : nat -> R -> R.
Local Notation tensor := (tensor R).
Local Notation family := (family R).
Local Notation zero_t := (zero_t R).

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


(** einsum_free_letter / einsum_contracted_letter. *)
Definition erel (l off : nat) (e e' : nat -> nat) : Prop := e' l = (off + e l)%N /\ forall x, x != l -> e' x = e x.

Lemma sum_env_rel l off m (CL : seq (nat * nat)) (F G : (nat -> nat) -> R) e e' :
  l \notin map fst CL ->
  (forall e e', erel l off e e' -> (e l < m)%N -> F e = G e') ->
  erel l off e e' -> (e l < m)%N -> sum_env CL F e = sum_env CL G e'.
Proof.
elim: CL e e' => [|[x n] CL IH] e e' /=; first by move=> _ H; apply: H.
rewrite in_cons negb_or => /andP [lx lCL] H [el ex] elm.
apply: sumR_ext => v _; apply: IH => //.
  split; first by rewrite /= (negbTE lx).
  by move=> y yl /=; case: (y =P x) => // _; apply: ex.
by rewrite /= (negbTE lx).
Qed.

(** map of two related environments over a term: the free letter's position is shifted. *)
Lemma map_erel l off e e' (t : seq nat) : uniq t -> erel l off e e' ->
  map e' t = if l \in t then shift (index l t) off (map e t) else map e t.
Proof.
move=> ut [el ex]; case: ifP => lt.
  apply: (@eq_from_nth _ 0); first by rewrite /shift size_set_nth_lt ?size_map // index_mem.
  move=> j; rewrite size_map => jt; rewrite /shift nth_set_nth_lt !(nth_map 0) //; last by rewrite index_mem.
  rewrite nth_index //; case: (j =P index l t) => [->|jl]; first by rewrite nth_index.
  apply: ex; apply/eqP => e1; apply: jl; rewrite -e1 index_uniq //.
apply/eq_in_map => x xt; apply: ex; apply/eqP => e1; by rewrite -e1 xt in lt.
Qed.

Lemma inb_unshift s d m off (i : seq nat) : (d < size s)%N -> size i = size s ->
  inb s (shift d off i) -> (nth 0 i d < m)%N -> inb (set_nth 0 s d m) i.
Proof.
move=> ds szi /inbP [_ H] im; apply/inbP; rewrite size_set_nth_lt //; split=> // j js.
rewrite nth_set_nth_lt; case: (j =P d) => [->//|jd].
by have := H j js; rewrite /shift nth_set_nth_lt (introF eqP jd).
Qed.

Lemma shard_read p s d T (L : family) r idx :
  placed p s (Shard d) T L -> zmask s T -> zmask (local_shape p s (Shard d)) (L r) -> (r < p)%N ->
  size idx = size s -> (nth 0 idx d < nth 0 s d %/ p)%N -> L r idx = T (shift d (r * (nth 0 s d %/ p)) idx).
Proof.
move=> [ds dv H] mT mL rp sz im.
case ii: (inb (local_shape p s (Shard d)) idx); first exact: H.
rewrite mL ?ii // mT //; apply/negP => si; move/negP: ii; apply; exact: inb_unshift si im.
Qed.


(** The operands' product under related environments: each operand with [l] is read in its block. *)
Lemma ein_F_rel p ts ss pls l Ts pss Ls r e e' :
  size ss = size pls -> size Ts = size pls -> size pss = size pls -> size Ls = size pls ->
  (forall k, (k < size pls)%N ->
     arg_ok p (nth [::] ss k) (nth Replicate pls k) (nth zero_t Ts k) (nth [::] pss k)
            (nth (fun _ => zero_t) Ls k)) ->
  all uniq ts -> ein_sizes_ok ts ss -> pls = map (ein_pl l) ts -> (r < p)%N ->
  erel l (r * (lsize ts ss l %/ p)) e e' -> (e l < lsize ts ss l %/ p)%N ->
  foldr (fun k acc => (nth zero_t (map (fun L => L r) Ls) k (map e (nth [::] ts k)) * acc)%R) 1%R (iota 0 (size ts)) =
  foldr (fun k acc => (nth zero_t Ts k (map e' (nth [::] ts k)) * acc)%R) 1%R (iota 0 (size ts)).
Proof.
move=> hss hTs hps hLs A uts /andP [/eqP szts sk] epl rp ee' elm.
have szp : size pls = size ts by rewrite epl size_map.
apply: foldr_in_ext => k acc; rewrite mem_iota add0n => /andP [_ kt].
have kp : (k < size pls)%N by rewrite szp.
have pk : nth Replicate pls k = ein_pl l (nth [::] ts k) by rewrite epl (nth_map [::]).
rewrite (nth_map (fun _ => zero_t)) ?hLs //; congr (_ * _)%R.
have [H hp okp mT mL] := A k kp.
have ut : uniq (nth [::] ts k) by apply: (allP uts); rewrite mem_nth.
rewrite (map_erel ut ee').
move: H hp okp mT mL; rewrite pk /ein_pl.
have := allP sk k; rewrite mem_iota add0n kt => /(_ isT) /andP [/eqP szk /allP hsz].
case: ifP => lt H hp okp mT mL.
  have il : (index l (nth [::] ts k) < size (nth [::] ts k))%N by rewrite index_mem.
  have hn : nth 0 (nth [::] ss k) (index l (nth [::] ts k)) = lsize ts ss l.
    by apply/eqP; rewrite -{2}(nth_index 0 lt); apply: hsz; rewrite mem_iota.
  have mL' : zmask (local_shape p (nth [::] ss k) (Shard (index l (nth [::] ts k)))) (nth (fun _ => zero_t) Ls k r).
    by rewrite -hp; apply: mL.
  have := @shard_read p _ _ _ _ r (map e (nth [::] ts k)) H mT mL' rp.
  by rewrite size_map szk hn (nth_map 0) // nth_index // => /(_ erefl elm).
have mL' : zmask (nth [::] ss k) (nth (fun _ => zero_t) Ls k r) by have := mL r; rewrite hp.
by rewrite (rep_fun H mT mL' rp).
Qed.

(** The letter sizes of the local operands. *)
Lemma lsize_local p ts ss pss l x : size ss = size ts -> size pss = size ts -> has (fun t => l \in t) ts ->
  (forall k, (k < size ts)%N -> nth [::] pss k = local_shape p (nth [::] ss k) (ein_pl l (nth [::] ts k))) ->
  (forall k, (k < size ts)%N -> size (nth [::] ts k) = size (nth [::] ss k)) ->
  lsize ts pss x = if x == l then (lsize ts ss l %/ p)%N else lsize ts ss x.
Proof.
move=> szts hps hl hpk sk'; rewrite /lsize.
case: (ltnP (find (fun t => x \in t) ts) (size ts)) => kt.
  set k := find _ ts in kt *.
  have xk : x \in nth [::] ts k.
    by apply: (nth_find [::] (a := fun t => x \in t)); rewrite has_find; exact: kt.
  rewrite hpk // /ein_pl.
  case: ifP => lt.
    have il : (index l (nth [::] ts k) < size (nth [::] ss k))%N by rewrite -sk' // index_mem.
    rewrite /local_shape nth_set_nth_lt.
    case: (x =P l) => [xl|xl]; first by rewrite xl eqxx -xl.
    have -> : (index x (nth [::] ts k) == index l (nth [::] ts k)) = false.
      apply/negbTE/eqP => e; apply: xl.
      by rewrite -(nth_index 0 xk) e nth_index.
    done.
  case: (x =P l) => [xl|//]; by rewrite xl lt in xk.
have hx : ~~ has (fun t => x \in t) ts by rewrite has_find -leqNgt.
case: (x =P l) => [xl|_]; first by rewrite xl hl in hx.
rewrite (@nth_default _ [::] pss) ?(@nth_default _ [::] ss) ?nth_nil //; first by rewrite szts.
by rewrite hps.
Qed.

(** The local size of every letter: [l]'s divided by [p], the others unchanged (both einsum rules). *)
Lemma ein_lsize_local p ts ss pls l Ts pss Ls :
  size pss = size pls ->
  (forall k, (k < size pls)%N ->
     arg_ok p (nth [::] ss k) (nth Replicate pls k) (nth zero_t Ts k) (nth [::] pss k)
            (nth (fun _ => zero_t) Ls k)) ->
  ein_sizes_ok ts ss -> pls = [seq ein_pl l t | t <- ts] -> has (fun t => l \in t) ts ->
  forall x, lsize ts pss x = if x == l then (lsize ts ss l %/ p)%N else lsize ts ss x.
Proof.
move=> hps A sok epl hl x.
move: (sok) => /andP [/eqP szts sk].
have szp : size pls = size ts by rewrite epl size_map.
have hpk : forall k, (k < size ts)%N -> nth [::] pss k = local_shape p (nth [::] ss k) (ein_pl l (nth [::] ts k)).
  move=> k kt; have kp : (k < size pls)%N by rewrite szp.
  by have [_ -> _ _ _] := A k kp; rewrite epl (nth_map [::]).
have sk' : forall k, (k < size ts)%N -> size (nth [::] ts k) = size (nth [::] ss k).
  by move=> k kt; have := allP sk k; rewrite mem_iota add0n kt => /(_ isT) /andP [/eqP].
exact: (@lsize_local p ts ss pss l x (esym szts) (etrans hps szp) hl hpk sk').
Qed.

Lemma einsum_free p ts out ss pls q Ts pss Ls :
  size ss = size pls -> size Ts = size pls -> size pss = size pls -> size Ls = size pls ->
  (forall k, (k < size pls)%N ->
     arg_ok p (nth [::] ss k) (nth Replicate pls k) (nth zero_t Ts k) (nth [::] pss k)
            (nth (fun _ => zero_t) Ls k)) ->
  ein_free_ok ts out ss pls q ->
  pl_ok p (lop_shape (Einsum ts out) ss) (Shard q) ->
  lop_shape (Einsum ts out) pss = local_shape p (lop_shape (Einsum ts out) ss) (Shard q) /\
  placed p (lop_shape (Einsum ts out) ss) (Shard q) (lop_val fn (Einsum ts out) ss Ts)
    (fun r => lop_val fn (Einsum ts out) pss (map (fun L => L r) Ls)).
Proof.
move=> hss hTs hps hLs A.
rewrite /ein_free_ok => /andP [/andP [/andP [/andP [/andP [qo uo] uts] hl] sok] /pls_eqP epl] plok.
set l := nth 0 out q in hl epl.
move: (sok) => /andP [/eqP szts sk].
have hls := @ein_lsize_local p ts ss pls l Ts pss Ls hps A sok epl hl.
set so := lop_shape (Einsum ts out) ss.
have szso : size so = size out by rewrite /so /= size_map.
have hnso : forall j, (j < size out)%N -> nth 0 so j = lsize ts ss (nth 0 out j).
  by move=> j jo; rewrite /so /= (nth_map 0).
set m := (nth 0 so q %/ p)%N.
have hm : m = (lsize ts ss l %/ p)%N by rewrite /m hnso.
have hshape : lop_shape (Einsum ts out) pss = local_shape p so (Shard q).
  rewrite /local_shape /=; apply: (@eq_from_nth _ 0).
    by rewrite size_set_nth_lt ?size_map // -/so szso.
  move=> j; rewrite size_map => jo; rewrite (nth_map 0) // hls nth_set_nth_lt -/so (nth_map 0) //.
  have -> : (nth 0 out j == l) = (j == q) by rewrite /l nth_uniq.
  by case: (j =P q) => _ //; rewrite hnso.
split => //.
move: plok => /andP [qso /eqP dv].
split => // r i rp ii.
have szi : size i = size out by rewrite (inb_size ii) /= size_set_nth_lt // szso.
have si : inb so (shift q (r * m) i) by apply: (@inb_shift p) => //; rewrite /m.
have iq : (nth 0 i q < m)%N.
  by case/inbP: ii => _ /(_ q); rewrite /= size_set_nth_lt // nth_set_nth_lt eqxx; apply.
rewrite /lop_val -/so hshape /mask ii si /einsum.
have hcl : [seq (x, lsize ts pss x) | x <- contracted ts out] = [seq (x, lsize ts ss x) | x <- contracted ts out].
  apply/eq_in_map => x; rewrite mem_filter => /andP [xo _]; rewrite hls.
  by case: (x =P l) => // xl; rewrite xl /l mem_nth in xo.
rewrite hcl.
apply: (@sum_env_rel l (r * m) m).
- rewrite -map_comp map_id_in //; rewrite /contracted mem_filter negb_and negbK /l mem_nth //.
- by move=> e e' ee' elm; rewrite hm in ee' elm; apply: (ein_F_rel hss hTs hps hLs A uts sok epl rp ee' elm).
- split; first by rewrite /shift nth_set_nth_lt /l index_uniq // eqxx // szi -hm.
  move=> x xl; rewrite /shift nth_set_nth_lt.
  case: (index x out =P q) => // e; exfalso; move/eqP: xl; apply.
  have xo : (index x out < size out)%N by rewrite e.
  by rewrite -(nth_index 0 (x := x) (s := out)) ?e // -index_mem.
- by rewrite /l index_uniq.
Qed.

Lemma sumR_exchange n n' (F : nat -> nat -> R) :
  sumR n (fun v => sumR n' (fun w => F v w)) = sumR n' (fun w => sumR n (fun v => F v w)).
Proof.
rewrite sumRE; under eq_bigr do rewrite sumRE.
by rewrite exchange_big sumRE; apply: eq_bigr => w _; rewrite sumRE.
Qed.

(** The sum over letter [l] taken outermost. *)
Lemma sum_env_pull (c : seq nat) (sz : nat -> nat) (F : (nat -> nat) -> R) env l : l \in c ->
  sum_env [seq (x, sz x) | x <- c] F env =
  sumR (sz l) (fun v => sum_env [seq (x, sz x) | x <- rem l c] F (fun y => if y == l then v else env y)).
Proof.
elim: c env => [|x c IH] env //; rewrite in_cons /=.
case: (x =P l) => [-> _|xl /=]; first by [].
case: eqP => [e|_ lc]; first by case: xl.
transitivity (sumR (sz x) (fun v => sumR (sz l) (fun w => sum_env [seq (x0, sz x0) | x0 <- rem l c] F
   (fun y => if y == l then w else if y == x then v else env y)))).
  by apply: sumR_ext => v _; rewrite IH.
rewrite sumR_exchange; apply: sumR_ext => w _; apply: sumR_ext => v _.
congr sum_env; apply: functional_extensionality => y.
by case: (y =P l) => [->|//]; rewrite (introF eqP (nesym xl)).
Qed.

Lemma sumR_blocks p m (G : nat -> R) : sumR (m * p) G = (\sum_(0 <= r < p) sumR m (fun w => G (r * m + w)%N))%R.
Proof. by rewrite sumRE mulnC sum_blocks; apply: eq_big_nat => r _; rewrite sumRE. Qed.

Lemma einsum_contr p ts out ss pls l Ts pss Ls :
  size ss = size pls -> size Ts = size pls -> size pss = size pls -> size Ls = size pls ->
  (forall k, (k < size pls)%N ->
     arg_ok p (nth [::] ss k) (nth Replicate pls k) (nth zero_t Ts k) (nth [::] pss k)
            (nth (fun _ => zero_t) Ls k)) ->
  ein_contr_ok ts out ss pls l ->
  lop_shape (Einsum ts out) pss = lop_shape (Einsum ts out) ss /\
  placed p (lop_shape (Einsum ts out) ss) (Partial RSum) (lop_val fn (Einsum ts out) ss Ts)
    (fun r => lop_val fn (Einsum ts out) pss (map (fun L => L r) Ls)).
Proof.
move=> hss hTs hps hLs A.
rewrite /ein_contr_ok => /andP [/andP [/andP [/andP [lo hl] uts] sok] /pls_eqP epl].
move: (sok) => /andP [/eqP szts sk].
have szp : size pls = size ts by rewrite epl size_map.
have hls := @ein_lsize_local p ts ss pls l Ts pss Ls hps A sok epl hl.
have hshape : lop_shape (Einsum ts out) pss = lop_shape (Einsum ts out) ss.
  apply/eq_in_map => x xo; rewrite hls; case: (x =P l) => // xl.
  by rewrite -xl xo in lo.
split => //.
(* l's size is m * p, from an operand holding it *)
set m := (lsize ts ss l %/ p)%N.
have hmp : (m * p)%N = lsize ts ss l.
  set k := find (fun t => l \in t) ts.
  have kt : (k < size ts)%N by rewrite -has_find.
  have lk : l \in nth [::] ts k by apply: (nth_find [::] (a := fun t => l \in t)).
  have kp : (k < size pls)%N by rewrite szp.
  have [H _ _ _ _] := A k kp; move: H; rewrite epl (nth_map [::]) // /ein_pl lk => -[_ dv _].
  have := allP sk k; rewrite mem_iota add0n kt => /(_ isT) /andP [_ /allP hsz].
  have hn : nth 0 (nth [::] ss k) (index l (nth [::] ts k)) = lsize ts ss l.
    by apply/eqP; rewrite -{2}(nth_index 0 lk); apply: hsz; rewrite mem_iota add0n index_mem.
  by rewrite /m -hn.
set c := contracted ts out.
have uc : uniq c by rewrite /c /contracted filter_uniq // undup_uniq.
have lc : l \in c.
  rewrite /c /contracted mem_filter lo mem_undup; case/hasP: hl => t tts lt.
  by apply/flattenP; exists t.
move=> i ii.
set F := fun (xs : seq tensor) env => foldr (fun k acc => (nth zero_t xs k (map env (nth [::] ts k)) * acc)%R) 1%R
                                             (iota 0 (size ts)).
have Eloc : forall r, lop_val fn (Einsum ts out) pss (map (fun L => L r) Ls) i =
    sum_env [seq (x, lsize ts pss x) | x <- c] (F (map (fun L => L r) Ls)) (fun x => nth 0 i (index x out)).
  by move=> r; rewrite /lop_val hshape /mask ii.
have Elog : lop_val fn (Einsum ts out) ss Ts i =
    sum_env [seq (x, lsize ts ss x) | x <- c] (F Ts) (fun x => nth 0 i (index x out)).
  by rewrite /lop_val /mask ii.
rewrite Elog (sum_env_pull _ _ _ lc) -hmp sumR_blocks.
apply: eq_big_nat => r /andP [_ rp]; rewrite Eloc.
have hsz : [seq (x, lsize ts pss x) | x <- c] = [seq (x, if x == l then m else lsize ts ss x) | x <- c].
  by apply/eq_in_map => x _; rewrite hls.
rewrite hsz (sum_env_pull _ _ _ lc) eqxx.
have hrem : [seq (x, if x == l then m else lsize ts ss x) | x <- rem l c] = [seq (x, lsize ts ss x) | x <- rem l c].
  apply/eq_in_map => x xr; case: (x =P l) => // xl.
  by rewrite xl mem_rem_uniqF in xr.
rewrite hrem; apply: sumR_ext => w wm.
apply: (@sum_env_rel l (r * m) m).
- by rewrite -map_comp map_id_in // mem_rem_uniqF.
- by move=> e e' ee' elm; apply: (ein_F_rel hss hTs hps hLs A uts sok epl rp ee' elm).
- split; first by rewrite /= !eqxx addnC.
  by move=> x xl /=; rewrite (negbTE xl).
- by rewrite /= eqxx.
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
  by move=> rp _; exact: (@all_rep_sound R p (lop_shape o) (lop_val fn o) ss pls pl Ts pss Ls hss hTs hps hLs A allr rp).
case Eo: o => [s'|ds|d|ds|s'|e a b|e|r ds keep| | |c| |e ex|e ex lg|e|e ex|ts out| |c|n a st|c|n];
  try (by rewrite -Eo; apply: lrule_one_sound; rewrite ?Eo);
  try (case hq: (sh pl) => [q|];
       [move=> C ok; rewrite (shP hq) in ok *; by apply: (einsum_free hss hTs hps hLs A C ok)
       |move=> /andP [/placement_eqbP -> C] _; by apply: (einsum_contr hss hTs hps hLs A C)]).
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
(** ** Ops whose attribute is their result's shape (reshape, expand): the op a rank runs names
    the local shape.  [lrule_loc] holds the rules where that local shape differs from the
    logical one (a Shard result); [lrule_loc_sound] is stated with the relocated local op. *)
Definition lrelocal (o : lop) (s : seq nat) : lop :=
  match o with Reshape _ => Reshape s | Expand _ => Expand s | _ => o end.

Lemma lrelocal_id o ss : lrelocal o (lop_shape o ss) = o.
Proof. by case: o. Qed.

Lemma lrelocal_twice o s s' : lrelocal (lrelocal o s) s' = lrelocal o s'.
Proof. by case: o. Qed.

Lemma lrule_relocal p o ss pls pl : lrule p o ss pls pl ->
  lrelocal o (local_shape p (lop_shape o ss) pl) = o.
Proof.
case: pl => [|d|r] /=; try by rewrite lrelocal_id.
case: o => //= [s|s]; rewrite /lrule /=; case: ifP => //= _;
  by case: pls => [|[|?|?] [|[|?|?] [|? ?]]] //=; rewrite ?andbF => // ?.
Qed.

(** Row-major offsets ([flat] / [unflat] of [LayoutOps.v]). *)
Ltac nring := rewrite -?multE -?plusE; ring.

Lemma prodn_cat (a b : seq nat) : prodn (a ++ b) = prodn a * prodn b.
Proof. by elim: a => [|x a IH] /=; rewrite ?mul1n // IH mulnA. Qed.

Lemma prodn_split (s : seq nat) d : prodn s = prodn (take d s) * prodn (drop d s).
Proof. by rewrite -prodn_cat cat_take_drop. Qed.

Lemma prodn_drop (s : seq nat) d : d < size s -> prodn (drop d s) = nth 0 s d * prodn (drop d.+1 s).
Proof. by move=> ds; rewrite (drop_nth 0 ds). Qed.

Lemma size_unflat s x : size (unflat s x) = size s.
Proof. by elim: s x => [|n s IH] x //=; rewrite IH. Qed.

Lemma flat_lt s i : inb s i -> flat s i < prodn s.
Proof.
elim: s i => [|n s IH] [|k i] //= /andP [kn /IH fl].
apply: (@leq_trans ((k.+1) * prodn s)); first by rewrite mulSn addnC ltn_add2r.
by rewrite leq_mul2r kn orbT.
Qed.

Lemma unflat_flat s i : inb s i -> unflat s (flat s i) = i.
Proof.
elim: s i => [|n s IH] [|k i] //= /andP [kn ii].
have fl := flat_lt ii; have P0 : 0 < prodn s by case: (prodn s) fl.
by rewrite divnMDl // divn_small // addn0 modnMDl modn_small // IH.
Qed.

Lemma inb_unflat s x : x < prodn s -> inb s (unflat s x).
Proof.
elim: s x => [|n s IH] x //=.
move=> xl; have P0 : 0 < prodn s by case: (prodn s) xl => //; rewrite muln0 ltn0.
by rewrite ltn_divLR // xl IH // ltn_pmod.
Qed.

Lemma flat_unflat s x : x < prodn s -> flat s (unflat s x) = x.
Proof.
elim: s x => [|n s IH] x //=; first by case: x.
move=> xl; have P0 : 0 < prodn s by case: (prodn s) xl => //; rewrite muln0 ltn0.
by rewrite IH ?ltn_pmod // -divn_eq.
Qed.

Lemma flat_split s (i : seq nat) d : size i = size s ->
  flat s i = flat (take d s) (take d i) * prodn (drop d s) + flat (drop d s) (drop d i).
Proof.
elim: d s i => [|d IH] s i sz; first by rewrite !take0 !drop0 /= mul0n.
case: s i sz => [|n s] [|k i] //= [sz].
rewrite (IH s i sz) [prodn s](prodn_split s d); nring.
Qed.


Lemma take_set_nth_same (i : seq nat) d v : d < size i -> take d (set_nth 0 i d v) = take d i.
Proof. by elim: d i => [|d IH] [|x i] //= di; rewrite ?take0 // IH. Qed.

Lemma drop_set_nth_same (s : seq nat) d v : d < size s -> drop d (set_nth 0 s d v) = v :: drop d.+1 s.
Proof. by move=> ds; rewrite drop_set_nth // subnn (drop_nth 0 ds). Qed.

Lemma flat_shift s d off (i : seq nat) : d < size s -> size i = size s ->
  flat s (shift d off i) = flat s i + off * prodn (drop d.+1 s).
Proof.
move=> ds sz; have di : d < size i by rewrite sz.
rewrite (flat_split d) ?size_set_nth_lt // [flat s i](flat_split d) //.
rewrite /shift take_set_nth_same // drop_set_nth_same // (drop_nth 0 ds) (drop_nth 0 di) /=; nring.
Qed.

(** Row-major offsets of one index in two shapes that differ only in dim [d]: the block of the
    dims up to [d] is scaled, the offset inside it is kept. *)
Lemma flat_block s d n m (i : seq nat) : d < size s -> inb (set_nth 0 s d m) i ->
  let C := prodn (drop d.+1 s) in
  flat (set_nth 0 s d n) i = flat (set_nth 0 s d m) i %/ (m * C) * (n * C) + flat (set_nth 0 s d m) i %% (m * C).
Proof.
move=> ds ii C.
have sz : size i = size s by rewrite (inb_size ii) size_set_nth_lt.
have di : d < size i by rewrite sz.
have hsplit : forall k, flat (set_nth 0 s d k) i =
    flat (take d s) (take d i) * (k * C) + (nth 0 i d * C + flat (drop d.+1 s) (drop d.+1 i)).
  move=> k; rewrite (flat_split d) ?size_set_nth_lt // take_set_nth_same // drop_set_nth_same //.
  by rewrite (drop_nth 0 di).
have Fi : flat (drop d.+1 s) (drop d.+1 i) < C.
  apply: flat_lt; have := inb_drop d.+1 ii; rewrite drop_set_nth_lt //.
have im : nth 0 i d < m by case/inbP: ii => _ /(_ d); rewrite size_set_nth_lt // nth_set_nth_lt eqxx; apply.
have lt : nth 0 i d * C + flat (drop d.+1 s) (drop d.+1 i) < m * C.
  apply: (@leq_trans ((nth 0 i d).+1 * C)); first by rewrite mulSn addnC ltn_add2r.
  by rewrite leq_mul2r im orbT.
have mC : 0 < m * C by case: (m * C) lt.
rewrite !hsplit divnMDl // divn_small // addn0 modnMDl modn_small //.
Qed.

Lemma prodn_set_nth s d v : d < size s ->
  prodn (set_nth 0 s d v) = prodn (take d s) * (v * prodn (drop d.+1 s)).
Proof. by move=> ds; rewrite (prodn_split _ d) take_set_nth_same ?drop_set_nth_same ?size_set_nth_lt. Qed.

(** reshape_shard's side condition: both shards divide, the element counts agree, and the
    dims before [d] and before [e] hold as many elements. *)
Definition resh_ok (p : nat) (s s' : seq nat) (d e : nat) : bool :=
  shard_ok p s d && shard_ok p s' e && (prodn s == prodn s') && (prodn (take d s) == prodn (take e s')).

Definition lrule_loc (p : nat) (o : lop) (ss : seq shape) (pls : seq placement) (pl : placement) : bool :=
  let s0 := nth [::] ss 0 in
  match o, pls, pl with
  | Reshape s', [:: Shard d], Shard e => resh_ok p s0 s' d e                        (* reshape_shard *)
  | Expand s', [:: Shard d], Shard e => expand_ok s0 s' d && (e == size s' - size s0 + d)  (* expand_shard *)
  | _, _, _ => false
  end.

Section SoundLoc.
Variable R : realFieldType.
Variable fn : nat -> R -> R.
Local Notation tensor := (tensor R).
Local Notation family := (family R).
Local Notation zero_t := (zero_t R).

(** A row-major reshape of a tensor sharded on dim [d] is sharded on dim [e] when the dims
    before [d] and before [e] hold as many elements: each rank's block is a run of whole rows. *)
Lemma reshape_shard p s s' d e T (L : family) :
  resh_ok p s s' d e -> placed p s (Shard d) T L ->
  placed p s' (Shard e) (lop_val fn (Reshape s') [:: s] [:: T])
    (fun r => lop_val fn (Reshape (local_shape p s' (Shard e))) [:: local_shape p s (Shard d)] [:: L r]).
Proof.
move=> /andP [/andP [/andP [/andP [ds /eqP dv] /andP [es /eqP ev]] /eqP hP] /eqP hA] [_ _ H].
split => // r i rp ii.
set m := nth 0 s d %/ p in dv H; set m' := nth 0 s' e %/ p in ev ii *.
set ls := set_nth 0 s d m; set ls' := set_nth 0 s' e m'.
set C := prodn (drop d.+1 s); set C' := prodn (drop e.+1 s').
have si : inb s' (shift e (r * m') i) by apply: (@inb_shift p).
rewrite /lop_val /mask /= -/ls' ii si.
set X := flat ls' i.
have hX : X < prodn ls' by apply: flat_lt.
have p0 : 0 < p by move: rp; case: (p).
have hls : prodn ls = prodn (take d s) * (m * C) by rewrite prodn_set_nth.
have hls' : prodn ls' = prodn (take e s') * (m' * C') by rewrite prodn_set_nth.
have hps : prodn s = prodn (take d s) * (m * C) * p.
  by rewrite (prodn_split s d) (drop_nth 0 ds) /= -dv -/C; nring.
have hps' : prodn s' = prodn (take e s') * (m' * C') * p.
  by rewrite (prodn_split s' e) (drop_nth 0 es) /= -ev -/C'; nring.
have eq1 : prodn ls = prodn ls'.
  by apply/eqP; rewrite -(eqn_pmul2r p0) hls hls' -hps -hps' hP.
have A0 : 0 < prodn (take e s') by move: hX; rewrite hls'; case: (prodn (take e s')).
have mC : m * C = m' * C' by apply/eqP; rewrite -(eqn_pmul2l A0) -hls' -hA -hls eq1.
have hX' : X < prodn ls by rewrite eq1.
set u := unflat ls X.
have iu : inb ls u by apply: inb_unflat.
have fu : flat ls u = X by apply: flat_unflat.
have szu : size u = size s by rewrite size_unflat size_set_nth_lt.
rewrite -/ls in H; rewrite (H r u rp iu); congr T.
have iv : inb s (shift d (r * m) u) by apply: (@inb_shift p).
rewrite -(unflat_flat iv); congr unflat.
rewrite flat_shift // [flat s u](_ : _ = X %/ (m * C) * (nth 0 s d * C) + X %% (m * C)); last first.
  by rewrite -fu -(@flat_block s d (nth 0 s d) m u ds iu) set_nth_nth_same.
rewrite flat_shift ?(inb_size ii) ?size_set_nth_lt //.
rewrite [flat s' i](_ : _ = X %/ (m' * C') * (nth 0 s' e * C') + X %% (m' * C')); last first.
  by rewrite -(@flat_block s' e (nth 0 s' e) m' i es ii) set_nth_nth_same.
rewrite -/C -/C' -dv -ev mC.
have -> : m * p * C = m' * C' * p by rewrite -mC; nring.
by rewrite -[r * m * C]mulnA mC; nring.
Qed.
Lemma lrule_loc_sound p o ss pls pl Ts pss Ls :
  size ss = size pls -> size Ts = size pls -> size pss = size pls -> size Ls = size pls ->
  (forall k, (k < size pls)%N ->
     arg_ok p (nth [::] ss k) (nth Replicate pls k) (nth zero_t Ts k) (nth [::] pss k)
            (nth (fun _ => zero_t) Ls k)) ->
  lrule_loc p o ss pls pl ->
  pl_ok p (lop_shape o ss) pl ->
  let o' := lrelocal o (local_shape p (lop_shape o ss) pl) in
  lop_shape o' pss = local_shape p (lop_shape o ss) pl /\
  placed p (lop_shape o ss) pl (lop_val fn o ss Ts) (fun r => lop_val fn o' pss (map (fun L => L r) Ls)).
Proof.
move=> hss hTs hps hLs A; rewrite /lrule_loc.
case: o => // s'; case: pls A hss hTs hps hLs => [|[|d|?] [|? ?]] // A hss hTs hps hLs; case: pl => // e;
  case: ss hss A => [|s0 [|]] // _ A; case: Ts hTs A => [|T0 [|]] // _ A;
  case: pss hps A => [|ps0 [|]] // _ A; case: Ls hLs A => [|L0 [|]] // _ A;
  have [H e0 _ _ _] := A 0%N isT; move: e0 => /= e0; rewrite /= e0 => C _.
- by split => //; exact: (@reshape_shard p s0 s' d e T0 L0 C H).
- case/andP: C => ok /eqP ->.
  have [e1 Hp] := @expand_shard R fn p s0 s' d T0 L0 ok H.
  by move: e1 => /= e1; rewrite e1 in Hp.
Qed.

End SoundLoc.
End JLayoutRule.
