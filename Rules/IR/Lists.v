(** * Index-list lemmas used by [Sound.v] (not trusted: everything is proved). *)
From mathcomp Require Import all_ssreflect.
From TVCert Require Import IR.Syntax IR.Denote IR.Check.
From Coq Require Import Lia.
Set Implicit Arguments.
Unset Strict Implicit.
Unset Printing Implicit Defensive.
Import JSyntax JDenote JCheck.

Module JLists.

Ltac split_ifs :=
  repeat match goal with
  | |- context [if ?b then _ else _] => let H := fresh "H" in case: ifP => H
  end.

(** [lia] on ssreflect's boolean comparisons of naturals. *)
Ltac nat_lia :=
  repeat match goal with
  | H : (_ < _) = false |- _ => move/negbT in H
  | H : (_ < _) = true |- _ => move/ltP in H
  | H : (_ <= _) = true |- _ => move/leP in H
  | H : (_ == _) = true |- _ => move/eqP in H
  | H : (_ <= _) = false |- _ => move/negbT in H
  | H : (_ == _) = false |- _ => move/negbT in H
  | H : is_true (~~ (_ < _)) |- _ => rewrite -leqNgt in H
  | H : is_true (~~ (_ <= _)) |- _ => rewrite -ltnNge in H
  | H : is_true (_ < _) |- _ => move/ltP in H
  | H : is_true (_ <= _) |- _ => move/leP in H
  | H : is_true (_ != _) |- _ => move/eqP in H
  | H : is_true (_ == _) |- _ => move/eqP in H
  end;
  repeat match goal with
  | H : context [addn] |- _ => rewrite -plusE in H
  | H : context [subn] |- _ => rewrite -minusE in H
  | H : context [muln] |- _ => rewrite -multE in H
  | H : context [predn] |- _ => rewrite -subn1 -minusE in H
  end;
  lazymatch goal with
  | |- is_true (_ < _) => apply/ltP
  | |- is_true (_ <= _) => apply/leP
  | |- is_true (_ == _) => apply/eqP
  | |- _ => idtac
  end;
  rewrite -?subn1 -?plusE -?minusE -?multE; lia.

Lemma inbP (s i : seq nat) :
  reflect (size i = size s /\ forall k, k < size s -> nth 0 i k < nth 0 s k) (inb s i).
Proof.
elim: s i => [|n s IH] [|k i] /=.
- by constructor; split.
- by constructor; case.
- by constructor; case.
- apply: (iffP andP) => [[kn /IH [sz H]]|[[sz] H]].
    by split; [rewrite sz|case=> [|j] //=; rewrite ltnS => /H].
  split; first exact: (H 0).
  by apply/IH; split=> // j js; apply: (H j.+1).
Qed.

Lemma inb_size s i : inb s i -> size i = size s.
Proof. by case/inbP. Qed.

Lemma size_set_nth_lt (i : seq nat) d v : d < size i -> size (set_nth 0 i d v) = size i.
Proof. by move=> di; rewrite size_set_nth; apply/maxn_idPr. Qed.

Lemma nth_set_nth_lt (i : seq nat) d v k :
  nth 0 (set_nth 0 i d v) k = if k == d then v else nth 0 i k.
Proof. by rewrite nth_set_nth. Qed.

(** Shifting dim [d] of an index of a block of size [m] into block [r] of [p]. *)
Lemma inb_shift p s d m r i :
  d < size s -> m * p = nth 0 s d -> r < p ->
  inb (set_nth 0 s d m) i -> inb s (shift d (r * m) i).
Proof.
move=> ds mp rp /inbP [sz H]; apply/inbP.
have ss : size (set_nth 0 s d m) = size s by rewrite size_set_nth_lt.
rewrite ss in sz H; rewrite /shift size_set_nth_lt ?sz //; split=> // k ks.
rewrite nth_set_nth_lt; have := H k ks; rewrite nth_set_nth_lt.
case: eqP => [-> id|_ //]; rewrite -mp.
apply: (leq_trans (n := r * m + m)); first by rewrite ltn_add2l.
by rewrite -mulSnr [m * p]mulnC leq_mul2r rp orbT.
Qed.

Lemma inb_set_nth s i d v : d < size s -> v < nth 0 s d -> inb s i -> inb s (set_nth 0 i d v).
Proof.
move=> ds vs /inbP [sz H]; apply/inbP; rewrite size_set_nth_lt ?sz //; split=> // k ks.
by rewrite nth_set_nth_lt; case: eqP => [->|_]; [|apply: H].
Qed.

Lemma set_nth_nth_same (i : seq nat) d : d < size i -> set_nth 0 i d (nth 0 i d) = i.
Proof.
move=> di; apply: (@eq_from_nth _ 0); first by rewrite size_set_nth_lt.
by move=> k _; rewrite nth_set_nth_lt; case: eqP => [->|].
Qed.

Lemma set_nth_twice (i : seq nat) d v w : set_nth 0 (set_nth 0 i d v) d w = set_nth 0 i d w.
Proof.
apply: (@eq_from_nth _ 0); first by rewrite !size_set_nth maxnA maxnn.
by move=> k _; rewrite !nth_set_nth_lt; case: eqP.
Qed.

(** drop and set_nth *)
Lemma drop_set_nth (i : seq nat) k d v : k <= d ->
  drop k (set_nth 0 i d v) = set_nth 0 (drop k i) (d - k) v.
Proof.
elim: k i d => [|k IH] i d kd; first by rewrite !drop0 subn0.
case: i => [|x i]; case: d kd => [|d] //= kd; rewrite subSS.
  have := IH [::] d kd; have -> : drop k [::] = [::] :> seq nat by case: k {IH kd}.
  by rewrite set_nth_nil => <-.
exact: IH.
Qed.

Lemma drop_set_nth_lt (i : seq nat) k d v : d < k -> d < size i ->
  drop k (set_nth 0 i d v) = drop k i.
Proof.
elim: k i d => [|k IH] i d //= dk.
by case: i => [|x i]; case: d dk => [|d] //= dk di; apply: IH.
Qed.

Lemma nth_drop0 (i : seq nat) k d : nth 0 (drop k i) d = nth 0 i (k + d).
Proof. by rewrite nth_drop. Qed.

Lemma inb_drop s i k : inb s i -> inb (drop k s) (drop k i).
Proof.
move=> /inbP [sz H]; apply/inbP; rewrite !size_drop sz; split=> // j js.
by rewrite !nth_drop; apply: H; rewrite -ltn_subRL.
Qed.

Lemma size_bc_rev a b : size (bc_rev a b) = maxn (size a) (size b).
Proof.
by elim: a b => [|x a IH] [|y b] //=; rewrite ?max0n ?maxn0 ?IH ?maxnSS.
Qed.

Lemma bc_rev_take (l : seq nat) n m : bc_rev (take n l) (take m l) = take (maxn n m) l.
Proof.
elim: l n m => [|x l IH] [|n] [|m] //=; try by rewrite take0 //= ?maxn0 ?max0n.
by rewrite IH maxnSS; case: eqP => [->|].
Qed.

Lemma rev_drop_take (o : seq nat) k : rev (drop k o) = take (size o - k) (rev o).
Proof.
have -> : rev o = rev (drop k o) ++ rev (take k o) by rewrite -rev_cat cat_take_drop.
by rewrite take_size_cat // size_rev size_drop.
Qed.

(** Broadcasting of two trailing parts of [o], one of them all of [o]. *)
Lemma bshape_suffix (o a b : shape) :
  a = drop (size o - size a) o -> b = drop (size o - size b) o ->
  maxn (size a) (size b) = size o -> bshape a b = o.
Proof.
move=> ha hb hm.
have sa : size a <= size o by rewrite -hm leq_maxl.
have sb : size b <= size o by rewrite -hm leq_maxr.
rewrite /bshape {1}ha {1}hb !rev_drop_take bc_rev_take !subKn //.
by rewrite hm -(size_rev o) take_size revK.
Qed.

Lemma size_bshape a b : size (bshape a b) = maxn (size a) (size b).
Proof. by rewrite /bshape size_rev size_bc_rev !size_rev. Qed.

(** swap *)
Lemma size_swap d0 d1 (s : seq nat) : d0 < size s -> d1 < size s -> size (swap d0 d1 s) = size s.
Proof. by move=> h0 h1; rewrite /swap !size_set_nth_lt // size_set_nth_lt. Qed.

Lemma nth_swap d0 d1 (s : seq nat) k :
  nth 0 (swap d0 d1 s) k = nth 0 s (swapi d0 d1 k).
Proof.
rewrite /swap /swapi !nth_set_nth /=.
repeat case: (_ =P _) => //=; rewrite ?nth_set_nth /=; repeat case: (_ =P _) => //=; congruence.
Qed.

Lemma swapi_lt d0 d1 k n : d0 < n -> d1 < n -> k < n -> swapi d0 d1 k < n.
Proof. by rewrite /swapi => *; do 2 case: eqP => // _. Qed.

Lemma swapiK d0 d1 k : swapi d0 d1 (swapi d0 d1 k) = k.
Proof.
rewrite /swapi; case: (k =P d0) => [->|k0]; first by rewrite eqxx; case: eqP.
case: (k =P d1) => [->|k1]; first by rewrite eqxx.
by rewrite (introF eqP k0) (introF eqP k1).
Qed.

Lemma swapi_eq d0 d1 k d : (swapi d0 d1 k == d) = (k == swapi d0 d1 d).
Proof.
apply/eqP/eqP => [<-|->]; by rewrite swapiK.
Qed.

Lemma inb_swap d0 d1 s i : d0 < size s -> d1 < size s -> inb (swap d0 d1 s) i -> inb s (swap d0 d1 i).
Proof.
move=> h0 h1 /inbP [sz H]; rewrite size_swap // in sz H; apply/inbP.
rewrite size_swap ?sz //; split=> // k ks.
rewrite nth_swap; have := H (swapi d0 d1 k) (swapi_lt h0 h1 ks).
by rewrite nth_swap swapiK.
Qed.

Lemma swap_set_nth d0 d1 (s : seq nat) d v : d0 < size s -> d1 < size s -> d < size s ->
  swap d0 d1 (set_nth 0 s d v) = set_nth 0 (swap d0 d1 s) (swapi d0 d1 d) v.
Proof.
move=> h0 h1 hd; apply: (@eq_from_nth _ 0).
  by rewrite size_swap ?size_set_nth_lt // ?size_swap // ?swapi_lt.
move=> k; rewrite size_swap ?size_set_nth_lt // => ks.
rewrite [in RHS]nth_set_nth_lt [in RHS]nth_swap [in LHS]nth_swap [in LHS]nth_set_nth_lt.
by rewrite swapi_eq.
Qed.

(** rem_at / ins_at *)
Lemma size_rem_at e (s : seq nat) : e < size s -> size (rem_at e s) = (size s).-1.
Proof.
move=> es; rewrite /rem_at size_cat size_take es size_drop.
rewrite subnS; case: (size s) es => // n en /=.
by rewrite subSn // /= subnKC.
Qed.

Lemma nth_rem_at e (s : seq nat) k : e < size s ->
  nth 0 (rem_at e s) k = nth 0 s (if k < e then k else k.+1).
Proof.
move=> es; rewrite /rem_at nth_cat size_take es.
case: ifP => ke; first by rewrite nth_take.
by rewrite nth_drop addSn subnKC // leqNgt ke.
Qed.

Lemma size_ins_at e t (i : seq nat) : e <= size i -> size (ins_at e t i) = (size i).+1.
Proof.
move=> ei; rewrite /ins_at size_cat /= size_take size_drop addnS.
by case: ltngtP ei => // [h _|-> _]; rewrite ?subnKC ?subnn ?addn0 // ltnW.
Qed.

Lemma nth_ins_at e t (i : seq nat) k : e <= size i ->
  nth 0 (ins_at e t i) k = if k < e then nth 0 i k else if k == e then t else nth 0 i k.-1.
Proof.
move=> ei; rewrite /ins_at nth_cat size_take.
have -> : (if e < size i then e else size i) = e by case: ltngtP ei => // ->.
case: ltngtP => [ke|ek|->]; first by rewrite nth_take.
- by case: k ek => // k ek; rewrite subSn //= nth_drop subnKC.
- by rewrite subnn.
Qed.

Lemma inb_rem_ins s i e t : e < size s -> t < nth 0 s e -> inb (rem_at e s) i -> inb s (ins_at e t i).
Proof.
move=> es ts /inbP [sz H]; rewrite size_rem_at // in sz H; apply/inbP.
have ei : e <= size i by rewrite sz -ltnS prednK // (leq_ltn_trans _ es).
rewrite size_ins_at // sz prednK ?(leq_ltn_trans _ es) //; split=> // k ks.
rewrite nth_ins_at //; case: (ltnP k e) => ke.
  by have := H k; rewrite nth_rem_at // ke; apply; rewrite -ltnS prednK ?(leq_ltn_trans _ es) // (ltn_trans ke es).
case: (k =P e) => [->//|kne].
have k0 : 0 < k by case: k ke kne {ks} => //; rewrite leqn0 => /eqP->.
have := H k.-1; rewrite nth_rem_at //.
have -> : (k.-1 < e) = false.
  by apply/negbTE; rewrite -leqNgt -ltnS prednK // ltn_neqAle eq_sym (introF eqP kne).
by rewrite prednK //; apply; rewrite -ltnS prednK // (leq_ltn_trans _ es).
Qed.

Lemma map_zip_inb (a j : seq nat) :
  inb a j -> map (fun x => if x.1 == 1 then 0 else x.2) (zip a j) = j.
Proof.
elim: a j => [|n a IH] [|x j] //= /andP [xn /IH ->].
by case: (n =P 1) xn => [->|//]; rewrite ltnS leqn0 => /eqP ->.
Qed.

Lemma proj_drop (a o : seq nat) (i : seq nat) :
  inb o i -> a = drop (size o - size a) o -> proj a o i = drop (size o - size a) i.
Proof.
move=> oi ha; rewrite /proj; apply: map_zip_inb.
by rewrite {1}ha; apply: inb_drop.
Qed.

Lemma inb2 a b i : inb [:: a; b] i -> i = [:: nth 0 i 0; nth 0 i 1].
Proof. by case: i => [|x [|y [|z i]]] //=; rewrite ?andbF //; move=> h; discriminate h. Qed.

Lemma swap_shift d0 d1 d off (i : seq nat) : d0 < size i -> d1 < size i -> d < size i ->
  swap d0 d1 (shift (swapi d0 d1 d) off i) = shift d off (swap d0 d1 i).
Proof.
move=> h0 h1 hd; rewrite /shift swap_set_nth ?swapi_lt // swapiK.
by rewrite nth_swap.
Qed.

Lemma rem_at_set_nth e d (s : seq nat) v : e != d -> e < size s -> d < size s ->
  rem_at e (set_nth 0 s d v) = set_nth 0 (rem_at e s) (if e < d then d.-1 else d) v.
Proof.
move=> ed es ds.
have es' : e < size (set_nth 0 s d v) by rewrite size_set_nth_lt.
have d'lt : (if e < d then d.-1 else d) < size (rem_at e s).
  by rewrite size_rem_at //; case: ifP => h; nat_lia.
apply: (@eq_from_nth _ 0); first by rewrite size_set_nth_lt // !size_rem_at // size_set_nth_lt.
move=> k _; rewrite nth_rem_at // nth_set_nth_lt !nth_set_nth_lt nth_rem_at //.
congr (if _ then _ else _).
by apply/eqP/eqP; case: (ltnP k e) => h1; case: ifP => h2 h; nat_lia.
Qed.

Lemma rem_at_set_nth_same d (s : seq nat) v : d < size s ->
  rem_at d (set_nth 0 s d v) = rem_at d s.
Proof.
move=> ds; apply: (@eq_from_nth _ 0); first by rewrite !size_rem_at ?size_set_nth_lt.
move=> k _; rewrite !nth_rem_at ?size_set_nth_lt // nth_set_nth_lt.
by case: ltnP => kd; case: eqP => // h; nat_lia.
Qed.

Lemma nth_rem_at_shift e d (s : seq nat) : e != d -> e < size s ->
  nth 0 (rem_at e s) (if e < d then d.-1 else d) = nth 0 s d.
Proof.
move=> ed es; rewrite nth_rem_at //; congr nth.
by case: (ltnP e d) => h1; case: ifP => h2; nat_lia.
Qed.

Lemma ins_shift e t d off (i : seq nat) : e != d -> e <= size i -> (if e < d then d.-1 else d) < size i ->
  ins_at e t (shift (if e < d then d.-1 else d) off i) = shift d off (ins_at e t i).
Proof.
move=> ed ei di; set d' := (if e < d then d.-1 else d) in di *.
have ei' : e <= size (shift d' off i) by rewrite /shift size_set_nth_lt.
have dd : d < (size i).+1 by move: di; rewrite /d'; case: ifP => h1 h2; nat_lia.
apply: (@eq_from_nth _ 0).
  by rewrite /shift size_ins_at // size_set_nth_lt // size_set_nth_lt ?size_ins_at.
move=> k _; rewrite nth_ins_at // /shift !nth_set_nth_lt nth_ins_at // !nth_ins_at //.
rewrite /d' in di *; case: (ltnP e d) => h1; split_ifs;
  first [ reflexivity | (exfalso; nat_lia) | (repeat f_equal; nat_lia) ].
Qed.

Lemma shift_ins_same d off t (i : seq nat) : d <= size i ->
  shift d off (ins_at d t i) = ins_at d (off + t) i.
Proof.
move=> di; apply: (@eq_from_nth _ 0).
  by rewrite /shift size_set_nth_lt !size_ins_at.
move=> k _; rewrite /shift nth_set_nth_lt !nth_ins_at //.
by case: (k =P d) => [->|kd]; rewrite ?ltnn ?eqxx //.
Qed.

(** ** Broadcast shapes dim by dim: [xt a n j] is dim [j] of [a] padded on the left to [n] dims with 1s. *)
Definition xt (a : seq nat) (n j : nat) : nat := if j < n - size a then 1 else nth 0 a (j - (n - size a)).

Lemma nth_bc_rev (a b : seq nat) k :
  nth 0 (bc_rev a b) k =
  if k < size a then (if k < size b then (if nth 0 a k == 1 then nth 0 b k else nth 0 a k) else nth 0 a k)
  else nth 0 b k.
Proof.
elim: a b k => [|x a IH] [|y b] [|k] //=.
- by case: ifP => // /negbT; rewrite -leqNgt => h; rewrite !nth_default.
- by rewrite IH.
Qed.

Lemma nth_rev_pad (a : seq nat) n j : size a <= n -> n - size a <= j -> j < n ->
  nth 0 (rev a) (n - j.+1) = nth 0 a (j - (n - size a)).
Proof.
move=> la ja jn; rewrite nth_rev; last by nat_lia.
by congr nth; nat_lia.
Qed.

Lemma nth_bshape (a b : seq nat) j : j < maxn (size a) (size b) ->
  let n := maxn (size a) (size b) in
  nth 0 (bshape a b) j = if xt a n j == 1 then xt b n j else xt a n j.
Proof.
move=> jn; set n := maxn (size a) (size b) in jn *; rewrite /bshape nth_rev; last by rewrite size_bc_rev !size_rev.
rewrite size_bc_rev !size_rev -/n nth_bc_rev !size_rev.
have la : size a <= n by rewrite leq_maxl.
have lb : size b <= n by rewrite leq_maxr.
rewrite /xt.
have ea : (n - j.+1 < size a) = ~~ (j < n - size a) by rewrite -leqNgt; apply/idP/idP => h; nat_lia.
have eb : (n - j.+1 < size b) = ~~ (j < n - size b) by rewrite -leqNgt; apply/idP/idP => h; nat_lia.
rewrite ea eb.
case: (ltnP j (n - size a)) => ja; case: (ltnP j (n - size b)) => jb /=.
- exfalso; have : (n == size a) || (n == size b) by rewrite /n /maxn; case: ifP; rewrite eqxx ?orbT.
  by case/orP => /eqP e; [move: ja | move: jb]; rewrite e subnn.
- by rewrite nth_rev_pad.
- by rewrite nth_rev_pad //; case: ifP => // /eqP ->.
- by rewrite !nth_rev_pad.
Qed.

(** [a] and [b] broadcast to [o] when each dim of each is [o]'s or 1 and one of them is [o]'s. *)
Lemma bshape_compat (a b o : seq nat) :
  maxn (size a) (size b) = size o ->
  (forall j, j < size o ->
     let x := xt a (size o) j in let y := xt b (size o) j in
     [/\ (x == nth 0 o j) || (x == 1), (y == nth 0 o j) || (y == 1) & (x == nth 0 o j) || (y == nth 0 o j)]) ->
  bshape a b = o.
Proof.
move=> hm H; apply: (@eq_from_nth _ 0); first by rewrite size_bshape.
move=> j; rewrite size_bshape hm => jo; rewrite nth_bshape ?hm //.
have [/orP hx /orP hy /orP he] := H j jo.
case: ifP => x1.
  case: hy => [/eqP //|/eqP y1]; rewrite y1.
  by case: he => /eqP <- //; move/eqP: x1.
by case: hx => [/eqP //|]; rewrite x1.
Qed.

Lemma size_proj a o i : size i = size o -> size a <= size o -> size (proj a o i) = size a.
Proof. by move=> io ao; rewrite /proj size_map size_zip size_drop io subKn // (minn_idPl (leqnn _)). Qed.

Lemma nth_proj a o i k : size i = size o -> size a <= size o -> k < size a ->
  nth 0 (proj a o i) k = if nth 0 a k == 1 then 0 else nth 0 i (size o - size a + k).
Proof.
move=> io ao ka; rewrite /proj (nth_map (0, 0)); last by rewrite size_zip size_drop io subKn // (minn_idPl (leqnn _)).
by rewrite nth_zip ?size_drop ?io ?subKn //= nth_drop.
Qed.

(** ** Removing a dim after inserting one *)
Lemma size_ins_at_any e t (i : seq nat) : size (ins_at e t i) = (size i).+1.
Proof. by rewrite /ins_at size_cat /= size_take size_drop; case: ltnP => h; nat_lia. Qed.

Lemma rem_ins_at e t (i : seq nat) : e <= size i -> rem_at e (ins_at e t i) = i.
Proof.
move=> ei; have st : size (take e i) = e by rewrite size_take; case: ltnP => // h; apply/eqP; rewrite eqn_leq h ei.
rewrite /rem_at /ins_at (take_size_cat _ st) drop_cat st ltnNge leqnSn /= subSnn /= drop0.
exact: cat_take_drop.
Qed.

Lemma inb_rem_at e s j : e < size s -> inb s j -> inb (rem_at e s) (rem_at e j).
Proof.
move=> es /inbP [sz H]; apply/inbP; have ej : e < size j by rewrite sz.
rewrite !size_rem_at // sz; split=> // k ks.
rewrite !nth_rem_at //; case: ifP => ke; apply: H; first by nat_lia.
by move: ks; rewrite -ltnS prednK //; nat_lia.
Qed.

Lemma inb_ins_rem e t s i : e < size s -> inb s (ins_at e t i) -> inb (rem_at e s) i.
Proof.
move=> es ii; have sz := inb_size ii; rewrite size_ins_at_any in sz.
have ei : e <= size i by rewrite -ltnS sz.
by rewrite -(rem_ins_at t ei); apply: inb_rem_at.
Qed.

End JLists.
