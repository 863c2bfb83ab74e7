(** * Soundness of the placement rules of [Check.rule], op by op. *)
From mathcomp Require Import all_ssreflect all_algebra.
From Coq Require Import FunctionalExtensionality.
From TVCert Require Import Semantics IR.Syntax IR.Denote IR.Check IR.Lists.
Set Implicit Arguments.
Unset Strict Implicit.
Unset Printing Implicit Defensive.
Import GRing.Theory Num.Theory.
Import JSyntax JDenote JCheck JLists.

Module JSoundOps.
Local Open Scope ring_scope.

Definition is_local (o : op) : bool :=
  match o with AllReduce _ | AllGather _ => false | _ => true end.

Lemma op_shape_local p o ss : is_local o -> op_shape p o ss = op_shape 1 o ss.
Proof. by case: o. Qed.

Lemma size_local_shape p s pl : pl_ok p s pl -> size (local_shape p s pl) = size s.
Proof. by case: pl => //= d /andP [ds _]; rewrite size_set_nth_lt. Qed.

Section Ops.
Variable R : realFieldType.
Variable fn : nat -> R -> R.
Local Notation tensor := (tensor R).
Local Notation family := (family R).
Local Notation op_val := (op_val fn).
Local Notation lit := (lit R).
Local Notation zero_t := (zero_t R).

Definition zmask (s : shape) (t : tensor) : Prop := forall i, ~~ inb s i -> t i = 0.

Lemma sumRE n (F : nat -> R) : sumR n F = \sum_(0 <= k < n) F k.
Proof. by rewrite /sumR unlock /index_iota subn0. Qed.

(** What the checker knows about an operand: its fact holds, its local shape is
    the placement's, the placement is well formed, and both sides are masked. *)
Definition arg_ok p (s : shape) (pl : placement) (T : tensor) (ps : shape) (L : family) : Prop :=
  [/\ placed p s pl T L, ps = local_shape p s pl, pl_ok p s pl, zmask s T & forall r, zmask ps (L r)].

Lemma rep_fun p s T (L : family) r :
  placed p s Replicate T L -> zmask s T -> zmask s (L r) -> (r < p)%N -> L r = T.
Proof.
move=> H mT mL rp; apply: functional_extensionality => i.
case si: (inb s i); first exact: (H r i rp si).
by rewrite mT ?si // mL ?si.
Qed.

Lemma shard_inb p s d r i : (d < size s)%N -> (nth 0%N s d %/ p * p)%N = nth 0%N s d -> (r < p)%N ->
  inb (local_shape p s (Shard d)) i -> inb s (shift d (r * (nth 0%N s d %/ p)%N) i).
Proof. by move=> ds dv rp; apply: (@inb_shift p). Qed.

(** ** Pointwise unary ops *)
Definition ufun (o : op) : option (R -> R) :=
  match o with
  | Neg => Some (fun x => - x)
  | Square => Some (fun x => x * x)
  | Scale c => Some (fun x => x * lit c)
  | Fn f => Some (fn f)
  | _ => None
  end.

Lemma op_val_unary o g s ss t ts : ufun o = Some g ->
  op_val o (s :: ss) (t :: ts) = mask s (fun i => g (t i)).
Proof. by case: o => //= [||c|f] [<-]. Qed.

Lemma unary_shard p (g : R -> R) s d T (L : family) :
  arg_ok p s (Shard d) T (local_shape p s (Shard d)) L ->
  placed p s (Shard d) (mask s (fun i => g (T i)))
         (fun r => mask (local_shape p s (Shard d)) (fun i => g (L r i))).
Proof.
move=> [[ds dv H] _ _ _ _]; split => // r i rp ii.
by rewrite /mask ii shard_inb // (H r i rp ii).
Qed.

(** ** Broadcasting binary ops *)
Definition bfun (o : op) : option (R -> R -> R) :=
  match o with
  | Add => Some (fun x y => x + y)
  | Sub => Some (fun x y => x - y)
  | Mul => Some (fun x y => x * y)
  | Div => Some (fun x y => x / y)
  | _ => None
  end.

Lemma op_val_binary o g s0 s1 ss t0 t1 ts : bfun o = Some g ->
  op_val o [:: s0, s1 & ss] [:: t0, t1 & ts] =
  mask (bshape s0 s1) (fun i => g (t0 (proj s0 (bshape s0 s1) i)) (t1 (proj s1 (bshape s0 s1) i))).
Proof. by case: o => //= -[<-]. Qed.

Lemma mem_iota_lt' k n : (k < n)%N -> k \in iota 0 n.
Proof. by rewrite mem_iota add0n. Qed.

(** A [bin_shard] operand dim by dim: each dim (padded on the left with 1s) is the output's or 1. *)
Lemma bin_xt so s a d j : bin_shard so s a d -> (j < size so)%N ->
  (xt s (size so) j == nth 0%N so j) || (xt s (size so) j == 1%N).
Proof.
move=> /andP [/andP [sz /allP Ak] _] jo; rewrite /xt; case: ltnP => h; first by rewrite eqxx orbT.
have k : (j - (size so - size s) < size s)%N by nat_lia.
by have := Ak _ (mem_iota_lt' k); rewrite (_ : size so - size s + (j - (size so - size s)) = j)%N //; nat_lia.
Qed.

(** One operand of a broadcasting op whose output is sharded on [d]: its local shape dim by
    dim (dim [d] is the shard size when it is sharded, 1 when it broadcasts along [d]) and the
    entry a rank reads from it. *)
Lemma bin_arg p so d s a T ps (L : family) :
  (d < size so)%N -> (nth 0%N so d %/ p * p)%N = nth 0%N so d -> bin_shard so s a d -> arg_ok p s a T ps L ->
  let m := (nth 0%N so d %/ p)%N in
  let so' := set_nth 0%N so d m in
  [/\ size ps = size s, (size s <= size so)%N,
      forall j, (j < size so)%N ->
        xt ps (size so) j = if j == d then (if a is Shard _ then m else 1%N) else xt s (size so) j
    & forall r i, (r < p)%N -> inb so' i -> L r (proj ps so' i) = T (proj s so (shift d (r * m) i))].
Proof.
move=> dso dv b [H hps hok mT mL] m so'.
move: (b) => /andP [/andP [sz /allP Ak] ha].
set off := (size so - size s)%N in ha.
have szps : size ps = size s by rewrite hps size_local_shape.
have szo : size so' = size so by rewrite size_set_nth_lt.
have Ak' : forall k, (k < size s)%N -> (nth 0%N s k == nth 0%N so (off + k)) || (nth 0%N s k == 1%N).
  by move=> k ks; apply: Ak; rewrite mem_iota_lt'.
split => //.
- move=> j jo; rewrite /xt szps -/off.
  case: a ha H hps hok {b} => [|d'|q] //= ha H hps hok.
  + rewrite hps; case: (j =P d) => [->|_] //; case: ltnP => // h.
    by case/orP: ha => [|/eqP //]; rewrite ltnNge h.
  + case/andP: ha => [/andP [od /eqP ed'] /eqP hn].
    rewrite hps /local_shape; case: (j =P d) => [->|jd].
      by rewrite ltnNge od /= nth_set_nth_lt -ed' eqxx hn.
    case: ltnP => // h; rewrite nth_set_nth_lt ed'.
    by have -> : (j - off == d - off)%N = false by apply/negbTE/eqP => e; apply: jd; (try unfold off in * ); nat_lia.
- move=> r i rp ii.
  have szi : size i = size so by rewrite (inb_size ii) szo.
  have si : inb so (shift d (r * m) i) by apply: (@inb_shift p).
  have szsh : size (shift d (r * m) i) = size so by rewrite /shift size_set_nth_lt // szi.
  case/inbP: ii => _ Hi; rewrite szo in Hi.
  case: a ha H hps hok {b} => [|d'|q] //= ha H hps hok.
  + (* replicated: the rank reads the operand where the logical op does *)
    have e : proj s so' i = proj s so (shift d (r * m) i).
      apply: (@eq_from_nth _ 0%N); first by rewrite !size_proj ?szsh ?szi ?szo.
      move=> k; rewrite size_proj ?szi ?szo // => ks.
      rewrite !nth_proj ?szsh ?szi ?szo // -/off; case: ifP => // s1.
      rewrite /shift nth_set_nth_lt; case: eqP => // ek; exfalso.
      case/orP: ha => [h|/eqP h]; first by (try unfold off in * ); nat_lia.
      rewrite -ek (_ : (off + k - off = k)%N) in h; last by (try unfold off in * ); nat_lia.
      by rewrite h in s1.
    rewrite hps e; apply: H => //; rewrite -e; apply/inbP; rewrite size_proj ?szi ?szo //; split=> // k ks.
    rewrite nth_proj ?szi ?szo // -/off; case: ifP => [/eqP -> //|s1].
    have := Hi (off + k)%N; rewrite /so' nth_set_nth_lt.
    have ok : (off + k < size so)%N by (try unfold off in * ); nat_lia.
    case: ((off + k)%N =P d) => [ek|_].
      case/orP: ha => [h|/eqP h]; first by exfalso; (try unfold off in * ); nat_lia.
      by rewrite -ek (_ : (off + k - off = k)%N) in h; [rewrite h in s1|(try unfold off in * ); nat_lia].
    by move=> /(_ ok); have /orP [/eqP ->|] := Ak' k ks; [|rewrite s1].
  + (* sharded on [d - off] *)
    case/andP: ha => [/andP [od /eqP ed'] /eqP hn].
    have hm : (nth 0%N s d' %/ p)%N = m by rewrite hn.
    case: H => d's dv' H.
    have ps1 : forall k, (k < size s)%N -> nth 0%N ps k = if k == d' then m else nth 0%N s k.
      by move=> k ks; rewrite hps /local_shape nth_set_nth_lt hm.
    have ipj : inb ps (proj ps so' i).
      apply/inbP; rewrite size_proj ?szi ?szo ?szps //; split=> // k ks.
      rewrite nth_proj ?szi ?szo ?szps // ?szps -/off; case: ifP => [/eqP -> //|s1].
      have ok : (off + k < size so)%N by (try unfold off in * ); nat_lia.
      have := Hi (off + k)%N ok; rewrite /so' nth_set_nth_lt ps1 //.
      case: ((off + k)%N =P d) => [ek|nek].
        by rewrite (_ : k = d') ?eqxx //; (try unfold off in * ); nat_lia.
      have -> : (k == d') = false by apply/negbTE/eqP => e; apply: nek; (try unfold off in * ); nat_lia.
      move: s1; rewrite ps1 //; have -> : (k == d') = false by apply/negbTE/eqP => e; apply: nek; (try unfold off in * ); nat_lia.
      by have /orP [/eqP ->|->] := Ak' k ks.
    rewrite (H r _ rp); last by rewrite -hps.
    rewrite hm; f_equal.
    have szp : size (proj ps so' i) = size s by rewrite size_proj ?szi ?szo ?szps.
    have szq : size (proj s so (shift d (r * m) i)) = size s by rewrite size_proj ?szsh.
    apply: (@eq_from_nth _ 0%N); first by rewrite /shift size_set_nth_lt szp ?szq.
    move=> k; rewrite /shift size_set_nth_lt szp // => ks.
    rewrite -/(shift d (r * m) i) nth_set_nth_lt !nth_proj ?szsh ?szi ?szo ?szps // ?szps -/off.
    rewrite ps1 // /shift nth_set_nth_lt.
    case: (k =P d') => [ek|nek].
      rewrite ek (_ : off + d' = d)%N ?eqxx; last by (try unfold off in * ); nat_lia.
      case: ifP => m1; case: ifP => s1 //.
      * have p1 : p = 1%N by move/eqP: s1; rewrite hn -dv -/m (eqP m1) mul1n.
        by rewrite p1 in rp; case: r rp {si szsh szq}.
      * have i0 : nth 0%N i d = 0%N.
          by have := Hi d dso; rewrite /so' nth_set_nth_lt eqxx (eqP m1); case: (nth _ _ _).
        by rewrite i0 addn0.
      * exfalso; move/eqP: s1; rewrite hn -dv -/m => /eqP; rewrite muln_eq1 => /andP [/eqP h _].
        by rewrite h eqxx in m1.
    have -> : (off + k == d)%N = false by apply/negbTE/eqP => e; apply: nek; (try unfold off in * ); nat_lia.
    by rewrite ps1 // (introF eqP nek).
Qed.

Lemma binary_shard p (g : R -> R -> R) so d s0 s1 a0 a1 T0 T1 ps0 ps1 (L0 L1 : family) :
  so = bshape s0 s1 -> pl_ok p so (Shard d) ->
  bin_shard so s0 a0 d -> bin_shard so s1 a1 d ->
  arg_ok p s0 a0 T0 ps0 L0 -> arg_ok p s1 a1 T1 ps1 L1 ->
  bshape ps0 ps1 = local_shape p so (Shard d) /\
  placed p so (Shard d)
    (mask so (fun i => g (T0 (proj s0 so i)) (T1 (proj s1 so i))))
    (fun r => mask (bshape ps0 ps1)
                (fun i => g (L0 r (proj ps0 (bshape ps0 ps1) i)) (L1 r (proj ps1 (bshape ps0 ps1) i)))).
Proof.
move=> hso /andP [dso /eqP dv] b0 b1 A0 A1.
set m := (nth 0%N so d %/ p)%N; set so' := set_nth 0%N so d m.
have szo : size so' = size so by rewrite size_set_nth_lt.
have [sz0 le0 x0 v0] := bin_arg dso dv b0 A0.
have [sz1 le1 x1 v1] := bin_arg dso dv b1 A1.
have hmax : maxn (size s0) (size s1) = size so by rewrite hso size_bshape.
have hb : bshape ps0 ps1 = so'.
  apply: bshape_compat; first by rewrite szo sz0 sz1.
  move=> j; rewrite szo => jo; rewrite x0 // x1 //.
  have hj : nth 0%N so j = if xt s0 (size so) j == 1%N then xt s1 (size so) j else xt s0 (size so) j.
    by rewrite {1}hso nth_bshape ?hmax // hmax.
  have c0 := bin_xt b0 jo; have c1 := bin_xt b1 jo.
  rewrite /so' nth_set_nth_lt; case: (j =P d) => [ej|_].
    rewrite ej in hj c0 c1.
    case: a0 b0 A0 {x0 v0} => [|d0|q0] b0 A0; case: a1 b1 A1 {x1 v1} => [|d1|q1] b1 A1;
      rewrite ?eqxx ?orbT //; try by case/andP: b0 => _; case/andP: b1 => _.
    (* both operands broadcast along [d]: dim [d] of the output is 1, so the shard size is 1 *)
    have e0 : xt s0 (size so) d = 1%N.
      move: b0 => /andP [_ /orP [h|/eqP h]]; rewrite /xt; case: ifP => // hd; first [by rewrite hd in h | exact h].
    have e1 : xt s1 (size so) d = 1%N.
      move: b1 => /andP [_ /orP [h|/eqP h]]; rewrite /xt; case: ifP => // hd; first [by rewrite hd in h | exact h].
    have hd : nth 0%N so d = 1%N by rewrite hj e0 e1 eqxx.
    have m1 : m = 1%N by move: dv; rewrite -/m hd => /eqP; rewrite muln_eq1 => /andP [/eqP].
    by rewrite m1 eqxx.
  split; [exact: c0 | exact: c1 |].
  by case: (xt s0 (size so) j =P 1%N) hj => [e|_] ->; rewrite eqxx ?orbT.
split; first by rewrite hb.
split => // r i rp ii; rewrite hb; rewrite /= -/m -/so' in ii.
have si : inb so (shift d (r * m) i) by apply: (@inb_shift p).
by rewrite /mask ii si (v0 r i rp ii) (v1 r i rp ii).
Qed.

(** ** torch.mm *)
Lemma op_val_mm s0 s1 ss t0 t1 ts :
  op_val MM [:: s0, s1 & ss] [:: t0, t1 & ts] =
  mask [:: nth 0%N s0 0; nth 0%N s1 1]
    (fun i => \sum_(0 <= k < nth 0%N s0 1) t0 [:: nth 0%N i 0; k] * t1 [:: k; nth 0%N i 1]).
Proof. by congr (mask _ _); apply: functional_extensionality => i; rewrite sumRE. Qed.

Lemma inb2P a b i0 i1 : inb [:: a; b] [:: i0; i1] = (i0 < a)%N && (i1 < b)%N.
Proof. by rewrite /= andbT. Qed.

Lemma mm_col p a k n T0 T1 ps0 ps1 (L0 L1 : family) :
  arg_ok p [:: a; k] Replicate T0 ps0 L0 -> arg_ok p [:: k; n] (Shard 1) T1 ps1 L1 ->
  pl_ok p [:: a; n] (Shard 1) ->
  op_shape 1 MM [:: ps0; ps1] = local_shape p [:: a; n] (Shard 1) /\
  placed p [:: a; n] (Shard 1) (op_val MM [:: [:: a; k]; [:: k; n]] [:: T0; T1])
    (fun r => op_val MM [:: ps0; ps1] [:: L0 r; L1 r]).
Proof.
move=> [H0 -> _ _ _] [[_ _ H1] -> _ _ _] /andP [_ /eqP dv].
split=> //; split=> // r [|i0 [|i1 [|? ?]]] rp //=; rewrite ?andbF // andbT => /andP [i0a ii1].
rewrite !op_val_mm /mask /shift /= i0a ii1 /=.
have -> : (r * (n %/ p) + i1 < n)%N.
  move: dv => /= dv; rewrite -{2}dv (leq_trans (n := r * (n %/ p) + n %/ p)) //; first by rewrite ltn_add2l.
  by rewrite -mulSnr mulnC leq_mul2l rp orbT.
apply: eq_big_nat => t /andP [_ tk].
rewrite H0 ?inb2P ?i0a ?tk //; congr (_ * _).
by rewrite (H1 r [:: t; i1]) // /= tk ii1.
Qed.

Lemma block_lt p m r j : (r < p)%N -> (j < m)%N -> (r * m + j < m * p)%N.
Proof.
move=> rp jm; rewrite (leq_trans (n := r * m + m)) //; first by rewrite ltn_add2l.
by rewrite -mulSnr mulnC leq_mul2l rp orbT.
Qed.

Lemma mm_rows p a k n T0 T1 ps0 ps1 (L0 L1 : family) :
  arg_ok p [:: a; k] (Shard 0) T0 ps0 L0 -> arg_ok p [:: k; n] Replicate T1 ps1 L1 ->
  pl_ok p [:: a; n] (Shard 0) ->
  op_shape 1 MM [:: ps0; ps1] = local_shape p [:: a; n] (Shard 0) /\
  placed p [:: a; n] (Shard 0) (op_val MM [:: [:: a; k]; [:: k; n]] [:: T0; T1])
    (fun r => op_val MM [:: ps0; ps1] [:: L0 r; L1 r]).
Proof.
move=> [[_ _ H0] -> _ _ _] [H1 -> _ _ _] /andP [_ /eqP dv].
split=> //; split=> // r [|i0 [|i1 [|? ?]]] rp //=; rewrite ?andbF // andbT => /andP [i0a ii1].
rewrite !op_val_mm /mask /shift /= i0a ii1 andbT.
move: dv => /= dv; rewrite -{2}dv block_lt //.
apply: eq_big_nat => t /andP [_ tk].
rewrite (H1 r [:: t; i1]) ?inb2P ?ii1 ?tk //; congr (_ * _).
by rewrite (H0 r [:: i0; t]) // /= tk i0a.
Qed.

Lemma mm_row_partial p a k n T0 T1 ps0 ps1 (L0 L1 : family) :
  arg_ok p [:: a; k] (Shard 1) T0 ps0 L0 -> arg_ok p [:: k; n] (Shard 0) T1 ps1 L1 ->
  op_shape 1 MM [:: ps0; ps1] = local_shape p [:: a; n] (Partial RSum) /\
  placed p [:: a; n] (Partial RSum) (op_val MM [:: [:: a; k]; [:: k; n]] [:: T0; T1])
    (fun r => op_val MM [:: ps0; ps1] [:: L0 r; L1 r]).
Proof.
move=> [[_ dv H0] -> _ _ _] [[_ _ H1] -> _ _ _].
split=> // [[|i0 [|i1 [|? ?]]]] //=; rewrite ?andbF // andbT => /andP [i0a ii1].
rewrite !op_val_mm /mask /= i0a ii1 /=.
move: dv => /= dv; rewrite -{3}dv mulnC sum_blocks.
apply: eq_big_nat => r /andP [_ rp]; rewrite op_val_mm /mask /= i0a ii1 /=.
apply: eq_big_nat => t /andP [_ tk].
by rewrite (H0 r [:: i0; t]) ?inb2P ?i0a ?tk // (H1 r [:: t; i1]) ?inb2P ?ii1 ?tk // /shift /= ?addn0.
Qed.

(** A Partial(sum) times a replicated matrix (either side) is a Partial(sum). *)
Lemma mm_partial_l p a k n T0 T1 ps0 ps1 (L0 L1 : family) :
  arg_ok p [:: a; k] (Partial RSum) T0 ps0 L0 -> arg_ok p [:: k; n] Replicate T1 ps1 L1 ->
  op_shape 1 MM [:: ps0; ps1] = local_shape p [:: a; n] (Partial RSum) /\
  placed p [:: a; n] (Partial RSum) (op_val MM [:: [:: a; k]; [:: k; n]] [:: T0; T1])
    (fun r => op_val MM [:: ps0; ps1] [:: L0 r; L1 r]).
Proof.
move=> [H0 -> _ _ _] [H1 -> _ _ _].
split=> // [[|i0 [|i1 [|? ?]]]] //=; rewrite ?andbF // andbT => /andP [i0a ii1].
rewrite op_val_mm /mask /= i0a ii1 /=.
transitivity (\sum_(0 <= r < p) \sum_(0 <= t < k) L0 r [:: i0; t] * T1 [:: t; i1]).
  apply: eq_big_nat => r /andP [_ rp]; rewrite op_val_mm /mask /= i0a ii1 /=.
  by apply: eq_big_nat => t /andP [_ tk]; rewrite H1 ?inb2P ?tk.
rewrite exchange_big /=; apply: eq_big_nat => t /andP [_ tk].
by rewrite -mulr_suml H0 ?inb2P ?i0a ?tk.
Qed.

Lemma mm_partial_r p a k n T0 T1 ps0 ps1 (L0 L1 : family) :
  arg_ok p [:: a; k] Replicate T0 ps0 L0 -> arg_ok p [:: k; n] (Partial RSum) T1 ps1 L1 ->
  op_shape 1 MM [:: ps0; ps1] = local_shape p [:: a; n] (Partial RSum) /\
  placed p [:: a; n] (Partial RSum) (op_val MM [:: [:: a; k]; [:: k; n]] [:: T0; T1])
    (fun r => op_val MM [:: ps0; ps1] [:: L0 r; L1 r]).
Proof.
move=> [H0 -> _ _ _] [H1 -> _ _ _].
split=> // [[|i0 [|i1 [|? ?]]]] //=; rewrite ?andbF // andbT => /andP [i0a ii1].
rewrite op_val_mm /mask /= i0a ii1 /=.
transitivity (\sum_(0 <= r < p) \sum_(0 <= t < k) T0 [:: i0; t] * L1 r [:: t; i1]).
  apply: eq_big_nat => r /andP [_ rp]; rewrite op_val_mm /mask /= i0a ii1 /=.
  by apply: eq_big_nat => t /andP [_ tk]; rewrite H0 ?inb2P ?i0a ?tk.
rewrite exchange_big /=; apply: eq_big_nat => t /andP [_ tk].
by rewrite -mulr_sumr H1 ?inb2P ?ii1 ?tk.
Qed.

(** ** torch.transpose *)
Lemma transpose_shard p d0 d1 s d T ps (L : family) :
  (d0 < size s)%N -> (d1 < size s)%N ->
  arg_ok p s (Shard d) T ps L ->
  op_shape 1 (Transpose d0 d1) [:: ps] = local_shape p (swap d0 d1 s) (Shard (swapi d0 d1 d)) /\
  placed p (swap d0 d1 s) (Shard (swapi d0 d1 d)) (op_val (Transpose d0 d1) [:: s] [:: T])
    (fun r => op_val (Transpose d0 d1) [:: ps] [:: L r]).
Proof.
move=> h0 h1 [[ds dv H] -> _ _ _].
have hn : nth 0%N (swap d0 d1 s) (swapi d0 d1 d) = nth 0%N s d by rewrite nth_swap swapiK.
have hsz : size (swap d0 d1 s) = size s by rewrite size_swap.
have sd : (swapi d0 d1 d < size (swap d0 d1 s))%N by rewrite hsz swapi_lt.
split; first by rewrite /= swap_set_nth // hn.
split; [done|by rewrite hn|] => r i rp ii.
rewrite /op_val /= /mask.
have ls : local_shape p s (Shard d) = set_nth 0%N s d (nth 0%N s d %/ p)%N by [].
have ii' : inb (swap d0 d1 (set_nth 0%N s d (nth 0%N s d %/ p)%N)) i.
  by rewrite swap_set_nth // -hn.
rewrite ii' /=.
have szi : size i = size s by rewrite (inb_size ii) size_set_nth_lt // hsz.
have si : inb (swap d0 d1 s) (shift (swapi d0 d1 d) (r * (nth 0%N s d %/ p)%N) i).
  by apply: (@inb_shift p); rewrite ?hn // -hn; move: ii; rewrite /= hn.
rewrite hn si H //; last by apply: inb_swap; rewrite ?size_set_nth_lt.
by rewrite -hn swap_shift ?szi // hn.
Qed.

(** ** torch.sum over one dim *)
Lemma sum_order1 e : sum_order [:: e] = [:: e].
Proof. by []. Qed.

Lemma op_val_sum1 e s ss t ts :
  op_val (Sum [:: e]) (s :: ss) (t :: ts) = mask (rem_at e s) (sum1 s e t).
Proof. by []. Qed.

Lemma sum_shard_other p e s d T ps (L : family) :
  (e < size s)%N -> e != d ->
  arg_ok p s (Shard d) T ps L ->
  let d' := if (e < d)%N then d.-1 else d in
  op_shape 1 (Sum [:: e]) [:: ps] = local_shape p (rem_at e s) (Shard d') /\
  placed p (rem_at e s) (Shard d') (op_val (Sum [:: e]) [:: s] [:: T])
    (fun r => op_val (Sum [:: e]) [:: ps] [:: L r]).
Proof.
move=> es ed [[ds dv H] -> _ _ _] d'.
have hn : nth 0%N (rem_at e s) d' = nth 0%N s d by rewrite nth_rem_at_shift.
have hls : rem_at e (set_nth 0%N s d (nth 0%N s d %/ p)%N) = set_nth 0%N (rem_at e s) d' (nth 0%N s d %/ p)%N.
  by rewrite rem_at_set_nth.
have d'lt : (d' < size (rem_at e s))%N.
  by rewrite size_rem_at // /d'; case: ifP => h; nat_lia.
split; first by rewrite /= /sum_shape /= hls hn.
split; [done|by rewrite hn|] => r i rp ii.
rewrite !op_val_sum1 /mask.
move: ii; rewrite /= hn -hls => ii; rewrite ii.
have szi : size i = (size s).-1 by rewrite (inb_size ii) size_rem_at ?size_set_nth_lt.
have si : inb (rem_at e s) (shift d' (r * (nth 0%N s d %/ p)%N) i).
  by apply: (@inb_shift p); rewrite ?hn //; rewrite hls in ii.
rewrite si /sum1 !sumRE.
have hne : nth 0%N (set_nth 0%N s d (nth 0%N s d %/ p)%N) e = nth 0%N s e.
  by rewrite nth_set_nth_lt (negbTE ed).
rewrite hne; apply: eq_big_nat => t /andP [_ te].
have ei : (e <= size i)%N by rewrite szi; nat_lia.
rewrite H //; first by rewrite ins_shift // szi; move: d'lt; rewrite size_rem_at.
apply: inb_rem_ins; rewrite ?size_set_nth_lt ?hne //.
Qed.

Lemma sum_shard_same p d s T ps (L : family) :
  arg_ok p s (Shard d) T ps L ->
  op_shape 1 (Sum [:: d]) [:: ps] = local_shape p (rem_at d s) (Partial RSum) /\
  placed p (rem_at d s) (Partial RSum) (op_val (Sum [:: d]) [:: s] [:: T])
    (fun r => op_val (Sum [:: d]) [:: ps] [:: L r]).
Proof.
move=> [[ds dv H] -> _ _ _].
have hls : rem_at d (set_nth 0%N s d (nth 0%N s d %/ p)%N) = rem_at d s by rewrite rem_at_set_nth_same.
split; first by rewrite /= /sum_shape /= hls.
move=> i ii /=; rewrite op_val_sum1 /mask ii /sum1 sumRE.
have szi : size i = (size s).-1 by rewrite (inb_size ii) size_rem_at.
have di : (d <= size i)%N by rewrite szi; nat_lia.
rewrite -[in RHS]dv [in RHS]mulnC sum_blocks.
apply: eq_big_nat => r /andP [_ rp]; rewrite op_val_sum1 /mask hls ii /sum1 sumRE nth_set_nth_lt eqxx.
apply: eq_big_nat => t /andP [_ tm].
rewrite H //; first by rewrite shift_ins_same.
by apply: inb_rem_ins; rewrite ?size_set_nth_lt ?nth_set_nth_lt ?eqxx // rem_at_set_nth_same.
Qed.

(** ** torch.sum over several dims: one dim at a time, largest first ([sum_order]) *)
Lemma zmask_mask s (T : tensor) : zmask s T -> mask s T = T.
Proof.
move=> z; apply: functional_extensionality => i; rewrite /mask.
by case: ifP => // /negbT /z ->.
Qed.

Lemma zmask_sum1 s e T : (e < size s)%N -> zmask s T -> zmask (rem_at e s) (sum1 s e T).
Proof.
move=> es z i ni; rewrite /sum1 sumRE big1_seq // => k _; apply: z.
by apply/negP => /(@inb_ins_rem e k s i es); apply/negP.
Qed.

Lemma sum1_partial p s e T (L : family) : (e < size s)%N ->
  placed p s (Partial RSum) T L ->
  placed p (rem_at e s) (Partial RSum) (sum1 s e T) (fun r => sum1 s e (L r)).
Proof.
move=> es H i ii /=; under eq_bigr do rewrite /sum1 sumRE.
rewrite /sum1 sumRE exchange_big /=; apply: eq_big_nat => k /andP [_ kn].
by apply: H; apply: inb_rem_ins.
Qed.

Lemma sum_many_sound p es : forall s pl T (L : family),
  sorted geq es -> uniq es -> all (fun e => e < size s)%N es -> sum_in pl ->
  placed p s pl T L -> pl_ok p s pl -> zmask s T -> (forall r, zmask (local_shape p s pl) (L r)) ->
  let so := foldl (fun s e => rem_at e s) s es in
  let pl' := sum_pl es pl in
  [/\ foldl (fun s e => rem_at e s) (local_shape p s pl) es = local_shape p so pl',
      placed p so pl' (sum_many es s T) (fun r => sum_many es (local_shape p s pl) (L r)),
      pl_ok p so pl', zmask so (sum_many es s T) &
      forall r, zmask (local_shape p so pl') (sum_many es (local_shape p s pl) (L r))].
Proof.
elim: es => [|e es IH] s pl T L //= srt /andP [ne ues] /andP [es0 ess] spl H ok zT zL.
have srt' : sorted geq es := path_sorted srt.
have le : all (fun x => x <= e)%N es.
  have tr : transitive geq by move=> a b c h1 h2; exact: (leq_trans h2 h1).
  exact: (order_path_min tr srt).
have ess' : all (fun x => x < size (rem_at e s))%N es.
  apply/allP => x xe; rewrite size_rem_at //.
  have xle := allP le x xe; have xne : x != e by apply: contraNneq ne => <-.
  by move: (allP ess x xe) => xs; nat_lia.
case: pl spl H ok zL => [|d|[]] //= _ H ok zL.
- (* Shard d *)
  have A : arg_ok p s (Shard d) T (local_shape p s (Shard d)) L by [].
  case: (e =P d) => [ed|/eqP ed].
  + subst e; have [sh1 pl1] := sum_shard_same A.
    have e1 : op_val (Sum [:: d]) [:: s] [:: T] = sum1 s d T by rewrite op_val_sum1 zmask_mask //; apply: zmask_sum1.
    have hl : rem_at d (local_shape p s (Shard d)) = rem_at d s by rewrite rem_at_set_nth_same.
    have szl : size (local_shape p s (Shard d)) = size s by rewrite size_local_shape.
    have zl1 : forall r, zmask (rem_at d s) (sum1 (local_shape p s (Shard d)) d (L r)).
      by move=> r; rewrite -hl; apply: zmask_sum1; rewrite ?szl.
    have e2 : forall r, op_val (Sum [:: d]) [:: local_shape p s (Shard d)] [:: L r] =
                       sum1 (local_shape p s (Shard d)) d (L r).
      by move=> r; rewrite op_val_sum1 zmask_mask //; apply: zmask_sum1; rewrite ?szl.
    rewrite e1 (functional_extensionality _ _ e2) in pl1.
    have [c1 c2 c3 c4 c5] := IH (rem_at d s) (Partial RSum) _ _ srt' ues ess' isT pl1 isT (zmask_sum1 es0 zT) zl1.
    by rewrite hl; split.
  + have [sh1 pl1] := sum_shard_other es0 ed A.
    set d' := if (e < d)%N then d.-1 else d in sh1 pl1 *.
    have hls : rem_at e (local_shape p s (Shard d)) = local_shape p (rem_at e s) (Shard d') by rewrite -sh1.
    have e1 : op_val (Sum [:: e]) [:: s] [:: T] = sum1 s e T by rewrite op_val_sum1 zmask_mask //; apply: zmask_sum1.
    have szl : size (local_shape p s (Shard d)) = size s by rewrite size_local_shape.
    have zl1 : forall r, zmask (local_shape p (rem_at e s) (Shard d')) (sum1 (local_shape p s (Shard d)) e (L r)).
      by move=> r; rewrite -hls; apply: zmask_sum1; rewrite ?szl.
    have e2 : forall r, op_val (Sum [:: e]) [:: local_shape p s (Shard d)] [:: L r] =
                       sum1 (local_shape p s (Shard d)) e (L r).
      by move=> r; rewrite op_val_sum1 zmask_mask //; apply: zmask_sum1; rewrite ?szl.
    rewrite e1 (functional_extensionality _ _ e2) in pl1.
    have ok1 : pl_ok p (rem_at e s) (Shard d') by case: pl1 => d'l dv _; rewrite /= /shard_ok d'l dv eqxx.
    have [c1 c2 c3 c4 c5] := IH (rem_at e s) (Shard d') _ _ srt' ues ess' isT pl1 ok1 (zmask_sum1 es0 zT) zl1.
    by rewrite hls; split.
- (* Partial(sum) *)
  have pl1 := sum1_partial es0 H.
  have [c1 c2 c3 c4 c5] := IH (rem_at e s) (Partial RSum) _ _ srt' ues ess' isT pl1 isT (zmask_sum1 es0 zT)
                            (fun r => zmask_sum1 es0 (zL r)).
  by split.
Qed.

(** ** Linear ops on Partial(sum) *)
Lemma unary_partial p o g s T ps (L : family) :
  ufun o = Some g -> (o = Neg \/ exists c, o = Scale c) ->
  arg_ok p s (Partial RSum) T ps L ->
  op_shape 1 o [:: ps] = local_shape p (op_shape 1 o [:: s]) (Partial RSum) /\
  placed p (op_shape 1 o [:: s]) (Partial RSum) (op_val o [:: s] [:: T])
    (fun r => op_val o [:: ps] [:: L r]).
Proof.
move=> hg ho [H -> _ _ _].
have hs : op_shape 1 o [:: s] = s by case: ho => [->|[c ->]].
rewrite hs; split=> // i ii; rewrite (@op_val_unary o g _ _ _ _ hg).
under eq_bigr do rewrite (@op_val_unary o g _ _ _ _ hg) /mask ii.
rewrite /mask ii -(H i ii).
case: ho hg => [->|[c ->]] [<-]; first by rewrite sumrN.
by rewrite mulr_suml.
Qed.

Lemma binary_partial p o g s0 s1 T0 T1 ps0 ps1 (L0 L1 : family) :
  bfun o = Some g -> (o = Add \/ o = Sub) ->
  s0 = op_shape 1 o [:: s0; s1] -> s1 = op_shape 1 o [:: s0; s1] ->
  arg_ok p s0 (Partial RSum) T0 ps0 L0 -> arg_ok p s1 (Partial RSum) T1 ps1 L1 ->
  op_shape 1 o [:: ps0; ps1] = local_shape p (op_shape 1 o [:: s0; s1]) (Partial RSum) /\
  placed p (op_shape 1 o [:: s0; s1]) (Partial RSum) (op_val o [:: s0; s1] [:: T0; T1])
    (fun r => op_val o [:: ps0; ps1] [:: L0 r; L1 r]).
Proof.
move=> hg ho e0 e1 [H0 -> _ _ _] [H1 -> _ _ _].
have hb : op_shape 1 o [:: s0; s1] = bshape s0 s1 by case: ho => ->.
rewrite hb in e0 e1 *; split=> // i ii.
have pr : forall s, s = bshape s0 s1 -> proj s (bshape s0 s1) i = i.
  by move=> s es; rewrite (proj_drop ii) -es ?subnn ?drop0.
rewrite (@op_val_binary o g _ _ _ _ _ _ hg).
under eq_bigr do rewrite (@op_val_binary o g _ _ _ _ _ _ hg) /mask ii.
rewrite /local_shape /mask ii !pr //.
have i0 : inb s0 i by rewrite {1}e0.
have i1 : inb s1 i by rewrite {1}e1.
rewrite -(H0 i i0) -(H1 i i1).
case: ho hg => -> [<-]; first by rewrite big_split.
by rewrite sumrB.
Qed.

(** A Partial(sum) times (or over) a replicated operand, broadcasting: each rank scales its
    partial sum by the same factor.  Out-of-bounds reads are 0 on both sides ([zmask]). *)
Lemma binary_partial_rep p (g : R -> R -> R) s0 s1 T0 T1 ps0 ps1 (L0 L1 : family) :
  (forall (x : nat -> R) y, g (\sum_(0 <= r < p) x r) y = \sum_(0 <= r < p) g (x r) y) ->
  arg_ok p s0 (Partial RSum) T0 ps0 L0 -> arg_ok p s1 Replicate T1 ps1 L1 ->
  bshape ps0 ps1 = bshape s0 s1 /\
  placed p (bshape s0 s1) (Partial RSum)
    (mask (bshape s0 s1) (fun i => g (T0 (proj s0 (bshape s0 s1) i)) (T1 (proj s1 (bshape s0 s1) i))))
    (fun r => mask (bshape ps0 ps1)
                (fun i => g (L0 r (proj ps0 (bshape ps0 ps1) i)) (L1 r (proj ps1 (bshape ps0 ps1) i)))).
Proof.
move=> lin [H0 -> _ z0 zL0] [H1 -> _ z1 zL1] /=; split => // i ii.
set so := bshape s0 s1 in ii *; set j0 := proj s0 so i; set j1 := proj s1 so i.
have e0 : \sum_(0 <= r < p) L0 r j0 = T0 j0.
  case sj: (inb s0 j0); first exact: H0.
  have nj : ~~ inb s0 j0 by rewrite sj.
  by rewrite (z0 _ nj); apply: big1_seq => q _; apply: zL0.
have e1 : forall q, (q < p)%N -> L1 q = T1 by move=> q qp; exact: (rep_fun H1 z1 (zL1 q) qp).
rewrite /mask ii -e0 lin; apply: eq_big_nat => r /andP [_ rp].
by rewrite (e1 r rp).
Qed.

Lemma binary_rep_partial p (g : R -> R -> R) s0 s1 T0 T1 ps0 ps1 (L0 L1 : family) :
  (forall x (y : nat -> R), g x (\sum_(0 <= r < p) y r) = \sum_(0 <= r < p) g x (y r)) ->
  arg_ok p s0 Replicate T0 ps0 L0 -> arg_ok p s1 (Partial RSum) T1 ps1 L1 ->
  bshape ps0 ps1 = bshape s0 s1 /\
  placed p (bshape s0 s1) (Partial RSum)
    (mask (bshape s0 s1) (fun i => g (T0 (proj s0 (bshape s0 s1) i)) (T1 (proj s1 (bshape s0 s1) i))))
    (fun r => mask (bshape ps0 ps1)
                (fun i => g (L0 r (proj ps0 (bshape ps0 ps1) i)) (L1 r (proj ps1 (bshape ps0 ps1) i)))).
Proof.
move=> lin [H0 -> _ z0 zL0] [H1 -> _ z1 zL1] /=; split => // i ii.
set so := bshape s0 s1 in ii *; set j0 := proj s0 so i; set j1 := proj s1 so i.
have e1 : \sum_(0 <= r < p) L1 r j1 = T1 j1.
  case sj: (inb s1 j1); first exact: H1.
  have nj : ~~ inb s1 j1 by rewrite sj.
  by rewrite (z1 _ nj); apply: big1_seq => q _; apply: zL1.
have e0 : forall q, (q < p)%N -> L0 q = T0 by move=> q qp; exact: (rep_fun H0 z0 (zL0 q) qp).
rewrite /mask ii -e1 lin; apply: eq_big_nat => r /andP [_ rp].
by rewrite (e0 r rp).
Qed.

(** ** All rules of [Check.rule] *)
Lemma shP a d : sh a = Some d -> a = Shard d.
Proof. by case: a => //= ? [->]. Qed.

Lemma is_psumP a : is_psum a -> a = Partial RSum.
Proof. by case: a => // [[]]. Qed.

Lemma is_repP a : is_rep a -> a = Replicate.
Proof. by case: a. Qed.

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

Lemma rule_sound p o ss pls pl Ts pss Ls :
  is_local o -> size ss = size pls -> size Ts = size pls -> size pss = size pls ->
  size Ls = size pls ->
  (forall k, (k < size pls)%N ->
     arg_ok p (nth [::] ss k) (nth Replicate pls k) (nth zero_t Ts k) (nth [::] pss k)
            (nth (fun _ => zero_t) Ls k)) ->
  rule o ss pls pl -> pl_ok p (op_shape 1 o ss) pl ->
  op_shape 1 o pss = local_shape p (op_shape 1 o ss) pl /\
  placed p (op_shape 1 o ss) pl (op_val o ss Ts) (fun r => op_val o pss (map (fun L => L r) Ls)).
Proof.
move=> loc hss hTs hps hLs A; rewrite /rule; case: ifP => [allr|nallr].
  by move=> rp _; exact: (@all_rep_sound p (op_shape 1 o) (op_val o) ss pls pl Ts pss Ls hss hTs hps hLs A allr rp).
case: pls A hss hTs hps hLs nallr => [|a [|b [|c pls']]] A hss hTs hps hLs nallr //.
- case: ss hss A => [|s0 [|]] // _ A; case: Ts hTs A => [|T0 [|]] // _ A.
  case: pss hps A => [|ps0 [|]] // _ A; case: Ls hLs A => [|L0 [|]] // _ A.
  have A0 := A 0%N isT; rewrite /= in A0 *; clear A.
  have [_ e0 _ _ _] := A0.
  case: o loc => [| | | | | |c|f|c' s'| |ds|d0 d1|rr|dd] // _.
  + case/orP => [/andP [ha /eqP hpl]|/andP [/is_psumP ha /is_psumP hpl]] ok.
      case ha': (sh a) ha => [d|] // _; rewrite ha' in hpl.
      rewrite (shP ha') (shP hpl) in A0 e0 *.
      rewrite !(@op_val_unary Neg _ _ _ _ _ erefl) e0.
      by split=> //; apply: (@unary_shard p (fun x => - x)); rewrite -e0.
    rewrite ha hpl in A0 e0 *.
    by apply: (@unary_partial p Neg _ _ _ _ _ erefl) => //; left.
  + case/andP => ha /eqP hpl ok.
    case ha': (sh a) ha => [d|] // _; rewrite ha' in hpl.
    rewrite (shP ha') (shP hpl) in A0 e0 *.
    rewrite !(@op_val_unary Square _ _ _ _ _ erefl) e0.
    by split=> //; apply: (@unary_shard p (fun x => x * x)); rewrite -e0.
  + case/orP => [/andP [ha /eqP hpl]|/andP [/is_psumP ha /is_psumP hpl]] ok.
      case ha': (sh a) ha => [d|] // _; rewrite ha' in hpl.
      rewrite (shP ha') (shP hpl) in A0 e0 *.
      rewrite !(@op_val_unary (Scale c) _ _ _ _ _ erefl) e0.
      by split=> //; apply: (@unary_shard p (fun x => x * lit c)); rewrite -e0.
    rewrite ha hpl in A0 e0 *.
    by apply: (@unary_partial p (Scale c) _ _ _ _ _ erefl) => //; right; eexists.
  + case/andP => ha /eqP hpl ok.
    case ha': (sh a) ha => [d|] // _; rewrite ha' in hpl.
    rewrite (shP ha') (shP hpl) in A0 e0 *.
    rewrite !(@op_val_unary (Fn f) _ _ _ _ _ erefl) e0.
    by split=> //; apply: (@unary_shard p (fn f)); rewrite -e0.
  + move=> /andP [/andP [/andP [uds alld] sin] /placement_eqbP ->] _.
    have [H e0' okp zT zL] := A0; rewrite e0' in zL *.
    have gt : total geq by move=> x y; rewrite orbC leq_total.
    have srt : sorted geq (sum_order ds) := sort_sorted gt ds.
    have us : uniq (sum_order ds) by rewrite sort_uniq.
    have als : all (fun e => e < size s0)%N (sum_order ds) by rewrite /sum_order (perm_all _ (permEl (perm_sort _ _))).
    have [c1 c2 c3 c4 c5] := sum_many_sound srt us als sin H okp zT zL.
    rewrite /op_shape /sum_shape c1; split => //.
    rewrite /op_val /op_shape /sum_shape c1 zmask_mask //.
    rewrite /=; set so := foldl _ s0 (sum_order ds).
    have -> : (fun r => mask (local_shape p so (sum_pl (sum_order ds) a)) (sum_many (sum_order ds) (local_shape p s0 a) (L0 r)))
            = (fun r => sum_many (sum_order ds) (local_shape p s0 a) (L0 r)).
      by apply: functional_extensionality => r; exact: zmask_mask (c5 r).
    exact: c2.
  + case/andP => [/andP [h0 h1]]; case ha: (sh a) => [d|] // /eqP hpl ok.
    rewrite (shP ha) (shP hpl) in A0 e0 *.
    exact: transpose_shard A0.
- case: ss hss A => [|s0 [|s1 [|]]] // _ A; case: Ts hTs A => [|T0 [|T1 [|]]] // _ A.
  case: pss hps A => [|ps0 [|ps1 [|]]] // _ A; case: Ls hLs A => [|L0 [|L1 [|]]] // _ A.
  have A0 := A 0%N isT; have A1 := A 1%N isT; rewrite /= in A0 A1 *; clear A.
  case: o loc => [| | | | | |c|f|c' s'| |ds|d0 d1|rr|dd] // _.
  + case/orP => [|].
      case hpl: (sh pl) => [d|] // /andP [b0 b1] ok; rewrite (shP hpl) in ok *.
      rewrite !(@op_val_binary Add (fun x y => x + y)) //.
      exact: (@binary_shard p (fun x y => x + y) _ d s0 s1 a b T0 T1 ps0 ps1 L0 L1 erefl ok b0 b1 A0 A1).
    move=> /andP [/andP [/andP [/andP [/is_psumP ha /is_psumP hb] /is_psumP hpl] /eqP e0] /eqP e1] _.
    rewrite ha hb hpl in A0 A1 *.
    by apply: (@binary_partial p Add (fun x y => x + y)) => //; left.
  + case/orP => [|].
      case hpl: (sh pl) => [d|] // /andP [b0 b1] ok; rewrite (shP hpl) in ok *.
      rewrite !(@op_val_binary Sub (fun x y => x - y)) //.
      exact: (@binary_shard p (fun x y => x - y) _ d s0 s1 a b T0 T1 ps0 ps1 L0 L1 erefl ok b0 b1 A0 A1).
    move=> /andP [/andP [/andP [/andP [/is_psumP ha /is_psumP hb] /is_psumP hpl] /eqP e0] /eqP e1] _.
    rewrite ha hb hpl in A0 A1 *.
    by apply: (@binary_partial p Sub (fun x y => x - y)) => //; right.
  + case/orP => [/orP [|]|].
    * case hpl: (sh pl) => [d|] // /andP [b0 b1] ok; rewrite (shP hpl) in ok *.
      rewrite !(@op_val_binary Mul (fun x y => x * y)) //.
      exact: (@binary_shard p (fun x y => x * y) _ d s0 s1 a b T0 T1 ps0 ps1 L0 L1 erefl ok b0 b1 A0 A1).
    * move=> /andP [/andP [/is_psumP ha /is_repP hb] /is_psumP hpl] _; rewrite ha hb hpl in A0 A1 *.
      rewrite !(@op_val_binary Mul (fun x y => x * y)) //.
      by apply: (@binary_partial_rep p (fun x y => x * y)) => // x y; rewrite mulr_suml.
    * move=> /andP [/andP [/is_repP ha /is_psumP hb] /is_psumP hpl] _; rewrite ha hb hpl in A0 A1 *.
      rewrite !(@op_val_binary Mul (fun x y => x * y)) //.
      by apply: (@binary_rep_partial p (fun x y => x * y)) => // x y; rewrite mulr_sumr.
  + (* div *) case/orP => [|].
    * case hpl: (sh pl) => [d|] // /andP [b0 b1] ok; rewrite (shP hpl) in ok *.
      rewrite !(@op_val_binary Div (fun x y => x / y)) //.
      exact: (@binary_shard p (fun x y => x / y) _ d s0 s1 a b T0 T1 ps0 ps1 L0 L1 erefl ok b0 b1 A0 A1).
    * move=> /andP [/andP [/is_psumP ha /is_repP hb] /is_psumP hpl] _; rewrite ha hb hpl in A0 A1 *.
      rewrite !(@op_val_binary Div (fun x y => x / y)) //.
      by apply: (@binary_partial_rep p (fun x y => x / y)) => // x y; rewrite mulr_suml.
  + rewrite /mm_ok /=; case/andP => /andP [/andP [z0 z1] /eqP k01].
    case: s0 z0 A0 k01 => [|a0 [|k0 [|]]] // _ A0 k01.
    case: s1 z1 A1 k01 => [|k1 [|n1 [|]]] // _ A1 /= k01; rewrite -k01 in A1 *.
    case/orP => [/orP [/orP [/orP [|]|]|]|].
    * move=> /andP [/andP [/is_repP ha hb] hpl] ok.
      move: hb hpl; case hb: (sh b) => [[|[|?]]|] // _; case hpl: (sh pl) => [[|[|?]]|] // _.
      rewrite ha (shP hb) (shP hpl) in A0 A1 ok *; exact: mm_col.
    * move=> /andP [/andP [ha /is_repP hb] hpl] ok.
      move: ha hpl; case ha: (sh a) => [[|?]|] // _; case hpl: (sh pl) => [[|?]|] // _.
      rewrite hb (shP ha) (shP hpl) in A0 A1 ok *; exact: mm_rows.
    * move=> /andP [/andP [ha hb] /is_psumP hpl] ok.
      move: ha hb; case ha: (sh a) => [[|[|?]]|] // _; case hb: (sh b) => [[|?]|] // _.
      rewrite hpl (shP ha) (shP hb) in A0 A1 ok *; exact: mm_row_partial.
    * move=> /andP [/andP [/is_psumP ha /is_repP hb] /is_psumP hpl] _.
      rewrite ha hb hpl in A0 A1 *; exact: mm_partial_l.
    * move=> /andP [/andP [/is_repP ha /is_psumP hb] /is_psumP hpl] _.
      rewrite ha hb hpl in A0 A1 *; exact: mm_partial_r.
Qed.

(** The placement relation only reads in-bounds entries (the evaluators mask every tensor). *)
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

End Ops.

Lemma all_In {T : Type} (a : pred T) s x : all a s -> List.In x s -> a x.
Proof. by elim: s => //= y s IH /andP [ay As] [<-|]; last exact: IH. Qed.

End JSoundOps.
