(** * Shard / Partial lemmas for the ops of [LayoutOps.v], one mesh axis of [p] ranks.

    Each lemma reads: if the operand is [placed] so (and the boolean side
    condition, a function a checker runs with [vm_compute], holds), then the op
    applied on every rank to the local operand is [placed] so, and its local
    shape is the placement's local shape.  Most layout ops read their input
    through an index map ([reindex]); one generic lemma per placement does the
    work and each op only proves how its index map moves a shard. *)
From mathcomp Require Import all_ssreflect all_algebra.
From TVCert Require Import Semantics IR.Syntax IR.Denote IR.Lists IR.LayoutOps.
From Coq Require Import Lia FunctionalExtensionality.
Set Implicit Arguments.
Unset Strict Implicit.
Unset Printing Implicit Defensive.
Import GRing.Theory Num.Theory.
Import JSyntax JDenote JLists JLayout.
Local Notation index := seq.index.   (* not the index lists of Denote.v *)

Module JLayoutSound.

(** ** Side conditions (computable) *)
Definition shard_ok (p : nat) (s : seq nat) (d : nat) : bool :=
  (d < size s) && (nth 0 s d %/ p * p == nth 0 s d).

(** [ds] is a permutation of the dims of [s]. *)
Definition perm_ok (ds s : seq nat) : bool := (size ds == size s) && perm_eq ds (iota 0 (size s)).

(** [x[a:b]] along dim [d] is in range. *)
Definition slice_ok (s : seq nat) (d a b : nat) : bool := (d < size s) && (a <= b) && (b <= nth 0 s d).

(** A row-wise op along dim [d] of a tensor sharded on [e]: a nonempty other dim. *)
Definition rowwise_ok (s : seq nat) (d e : nat) : bool := (d < size s) && (0 < nth 0 s d) && (e != d).

(** Reducing dim [e] (nonempty) of a tensor sharded on [d <> e]. *)
Definition reduce_ok (s : seq nat) (e d : nat) : bool := (e < size s) && (0 < nth 0 s e) && (e != d).

(** torch.cat along [d] of operands sharded on [e <> d]: the shapes agree off [d]. *)
Definition concat_ok (p : nat) (ss : seq (seq nat)) (d e : nat) : bool :=
  let s0 := nth [::] ss 0 in
  (e != d) && (d < size s0) && shard_ok p s0 e &&
  all (fun s => (size s == size s0) && (set_nth 0 s d 0 == set_nth 0 s0 d 0)) ss.

(** torch.expand of [s] to [s'] keeping a shard on dim [d] of [s]: [s'] is a valid target
    (each dim of [s] is 1 or kept) and dim [d] is not broadcast. *)
Definition expand_ok (s s' : seq nat) (d : nat) : bool :=
  let off := size s' - size s in
  (size s <= size s') && (d < size s) && (nth 0 s d != 1) &&
  all (fun k => (nth 0 s k == 1) || (nth 0 s' (off + k) == nth 0 s k)) (iota 0 (size s)).

(** A reduction a local linear map commutes with (not max). *)
Definition sum_like (r : reduce_op) : bool := if r is RMax then false else true.

(** ** Index lemmas *)
Lemma size_perm_idx ds i : size (perm_idx ds i) = size ds.
Proof. by rewrite /perm_idx size_map size_iota. Qed.

Lemma nth_perm_idx ds i k : k < size ds -> nth 0 (perm_idx ds i) k = nth 0 i (index k ds).
Proof. by move=> kd; rewrite /perm_idx (nth_map 0) ?size_iota // nth_iota. Qed.

Section Perm.
Variables (ds s : seq nat).
Hypothesis ok : perm_ok ds s.

Lemma perm_size : size ds = size s.
Proof. by case/andP: ok => /eqP. Qed.

Lemma perm_mem k : (k \in ds) = (k < size s).
Proof. by case/andP: ok => _ /perm_mem ->; rewrite mem_iota. Qed.

Lemma perm_uniq' : uniq ds.
Proof. by case/andP: ok => _ /perm_uniq ->; apply: iota_uniq. Qed.

Lemma perm_index_lt k : k < size s -> index k ds < size s.
Proof. by move=> ks; rewrite -perm_size index_mem perm_mem. Qed.

Lemma perm_nth_index k : k < size s -> nth 0 ds (index k ds) = k.
Proof. by move=> ks; rewrite nth_index // perm_mem. Qed.

Lemma perm_index_eq k d : k < size s -> d < size s -> (index k ds == index d ds) = (k == d).
Proof.
move=> ks dsz; apply/eqP/eqP => [e|-> //].
by rewrite -(perm_nth_index ks) -(perm_nth_index dsz) e.
Qed.

Lemma perm_nth_eq k d : k < size s -> d < size s -> (nth 0 ds k == d) = (k == index d ds).
Proof.
move=> ks dsz; apply/eqP/eqP => [<-|->]; last exact: perm_nth_index.
by rewrite index_uniq ?perm_uniq' ?perm_size.
Qed.
End Perm.

Lemma set_nth_comm (l : seq nat) d e x y : d != e -> d < size l -> e < size l ->
  set_nth 0 (set_nth 0 l d x) e y = set_nth 0 (set_nth 0 l e y) d x.
Proof.
move=> de dl el; apply: (@eq_from_nth _ 0); first by rewrite !size_set_nth_lt ?size_set_nth_lt.
move=> k _; rewrite !nth_set_nth_lt.
by case: (k =P e) => [ke|]; case: (k =P d) => [kd|] //; rewrite -kd -ke eqxx in de.
Qed.

Lemma shift_comm (i : seq nat) d e a b : d != e -> d < size i -> e < size i ->
  shift d a (shift e b i) = shift e b (shift d a i).
Proof.
move=> de di ei; rewrite /shift !nth_set_nth_lt (negbTE de) eq_sym (negbTE de).
by rewrite set_nth_comm // eq_sym.
Qed.

(** One reduced dim: the input index of output index [i] at [k], the output shape, where dim [d] goes. *)
Definition sel (keep : bool) (e k : nat) (i : seq nat) : seq nat :=
  if keep then set_nth 0 i e k else ins_at e k i.
Definition rshape (keep : bool) (e : nat) (s : seq nat) : seq nat :=
  if keep then set_nth 0 s e 1 else rem_at e s.
Definition rdim (keep : bool) (e d : nat) : nat := if keep then d else if e < d then d.-1 else d.

Lemma inb_set_nth1 s e k i : e < size s -> k < nth 0 s e -> inb (set_nth 0 s e 1) i -> inb s (set_nth 0 i e k).
Proof.
move=> es ks /inbP [sz H]; rewrite size_set_nth_lt // in sz H; apply/inbP.
rewrite size_set_nth_lt ?sz //; split=> // j js; rewrite nth_set_nth_lt.
by have := H j js; rewrite nth_set_nth_lt; case: (j =P e) => [->|].
Qed.

Lemma rshape_local p keep e d s : e != d -> e < size s -> d < size s ->
  rshape keep e (set_nth 0 s d (nth 0 s d %/ p)) =
  set_nth 0 (rshape keep e s) (rdim keep e d) (nth 0 s d %/ p).
Proof.
move=> ed es ds; case: keep => /=; last exact: rem_at_set_nth.
by rewrite set_nth_comm // eq_sym.
Qed.

Lemma rdim_lt keep e d s : e != d -> e < size s -> d < size s -> rdim keep e d < size (rshape keep e s).
Proof.
move=> ed es ds; case: keep => /=; first by rewrite size_set_nth_lt.
by rewrite size_rem_at //; case: ifP => h; nat_lia.
Qed.

Lemma nth_rdim keep e d s : e != d -> e < size s -> nth 0 (rshape keep e s) (rdim keep e d) = nth 0 s d.
Proof. by move=> ed es; case: keep => /=; [rewrite nth_set_nth_lt eq_sym (negbTE ed)|apply: nth_rem_at_shift]. Qed.

Local Open Scope ring_scope.

Section Values.
Variable R : realFieldType.
Variable fn : nat -> R -> R.
Local Notation tensor := (tensor R).
Local Notation family := (family R).

(** ** The generic lemmas: an op that reads its input through an index map *)
Definition reindex (so : seq nat) (g : seq nat -> seq nat) (t : tensor) : tensor :=
  mask so (fun i => t (g i)).

(** Shard: the local index map [gl], followed by the input's shift, is the
    output's shift followed by the logical index map [g]. *)
Lemma reindex_shard p s so d d' (g gl : seq nat -> seq nat) (T : tensor) (L : family) :
  placed p s (Shard d) T L ->
  (d' < size so)%N -> nth 0%N so d' = nth 0%N s d ->
  (forall r i, (r < p)%N -> inb (local_shape p so (Shard d')) i ->
     inb (local_shape p s (Shard d)) (gl i) /\
     shift d (r * (nth 0%N s d %/ p)) (gl i) = g (shift d' (r * (nth 0%N s d %/ p)) i)) ->
  placed p so (Shard d') (reindex so g T)
    (fun r => reindex (local_shape p so (Shard d')) gl (L r)).
Proof.
move=> [ds dv H] d'so hn Hg; split=> //; first by rewrite hn.
move=> r i rp ii; rewrite /reindex /mask ii.
have [ii' e] := Hg r i rp ii.
rewrite H // e hn.
have -> // : inb so (shift d' (r * (nth 0%N s d %/ p)) i).
apply: (@inb_shift p) => //; first by rewrite hn.
by move: ii; rewrite /= hn.
Qed.

(** Partial(sum) and Partial(avg): any index map commutes with the sum over ranks. *)
Lemma reindex_partial p s so rd (g : seq nat -> seq nat) (T : tensor) (L : family) :
  sum_like rd ->
  (forall i, inb so i -> inb s (g i)) ->
  placed p s (Partial rd) T L ->
  placed p so (Partial rd) (reindex so g T) (fun r => reindex so g (L r)).
Proof.
case: rd => //= _ Hg H i ii; rewrite /reindex /mask ii.
- by rewrite -H ?Hg //; apply: eq_bigr => r _; rewrite ii.
- by rewrite -H ?Hg //; congr (_ * _); apply: eq_bigr => r _; rewrite ii.
Qed.

(** Replicate: trivially. *)
Lemma reindex_replicate p s so (g : seq nat -> seq nat) (T : tensor) (L : family) :
  (forall i, inb so i -> inb s (g i)) ->
  placed p s Replicate T L -> placed p so Replicate (reindex so g T) (fun r => reindex so g (L r)).
Proof. by move=> Hg H r i rp ii; rewrite /reindex /mask ii H ?Hg. Qed.

(** ** permute_shard: [x.permute(ds)] of [Shard d] is [Shard (index d ds)]. *)
Lemma lop_val_permute ds s t : lop_val fn (Permute ds) [:: s] [:: t] = reindex (lop_shape (Permute ds) [:: s]) (perm_idx ds) t.
Proof. by []. Qed.

Lemma permute_local_shape p ds s d : perm_ok ds s -> (d < size s)%N ->
  lop_shape (Permute ds) [:: local_shape p s (Shard d)] =
  local_shape p (map (nth 0%N s) ds) (Shard (index d ds)).
Proof.
move=> ok ds'; apply: (@eq_from_nth _ 0%N).
  by rewrite /= size_map size_set_nth_lt ?size_map // (perm_size ok) perm_index_lt.
move=> k; rewrite /= size_map => kd.
have ks : (k < size s)%N by rewrite -(perm_size ok).
rewrite (nth_map 0%N) // !nth_set_nth_lt (nth_map 0%N) //; last by rewrite (perm_size ok) perm_index_lt.
have -> := perm_nth_eq ok ks ds'.
by rewrite (perm_nth_index ok ds') (nth_map 0%N).
Qed.

Lemma permute_shard p ds s d T (L : family) :
  perm_ok ds s -> placed p s (Shard d) T L ->
  let so := map (nth 0%N s) ds in
  lop_shape (Permute ds) [:: local_shape p s (Shard d)] = local_shape p so (Shard (index d ds)) /\
  placed p so (Shard (index d ds)) (lop_val fn (Permute ds) [:: s] [:: T])
    (fun r => lop_val fn (Permute ds) [:: local_shape p s (Shard d)] [:: L r]).
Proof.
move=> ok H so; have [dsz _ _] := H.
have sz : size so = size s by rewrite size_map (perm_size ok).
have di : (index d ds < size so)%N by rewrite sz perm_index_lt.
have hn : nth 0%N so (index d ds) = nth 0%N s d.
  by rewrite /so (nth_map 0%N) ?(perm_nth_index ok) // (perm_size ok) perm_index_lt.
split; first exact: permute_local_shape.
rewrite lop_val_permute.
have -> : (fun r => lop_val fn (Permute ds) [:: local_shape p s (Shard d)] [:: L r]) =
          (fun r => reindex (local_shape p so (Shard (index d ds))) (perm_idx ds) (L r)).
  by apply: functional_extensionality => r; rewrite lop_val_permute permute_local_shape.
apply: (@reindex_shard p s so d (index d ds) (perm_idx ds) (perm_idx ds) T L H di hn) => r i rp ii.
have szi : size i = size s by rewrite (inb_size ii) /local_shape size_set_nth_lt // sz.
split.
  apply/inbP; rewrite size_perm_idx /local_shape size_set_nth_lt ?(perm_size ok) //; split=> // k ks.
  have ksd : (k < size ds)%N by rewrite (perm_size ok).
  rewrite (nth_perm_idx _ ksd) nth_set_nth_lt.
  case/inbP: ii => _ Hi; have := Hi (index k ds).
  rewrite /local_shape size_set_nth_lt // sz => /(_ (perm_index_lt ok ks)).
  rewrite nth_set_nth_lt (perm_index_eq ok) // hn.
  by rewrite /so (nth_map 0%N) ?(perm_nth_index ok) // (perm_size ok) perm_index_lt.
apply: (@eq_from_nth _ 0%N).
  by rewrite /shift size_set_nth_lt ?size_perm_idx ?(perm_size ok) // size_perm_idx size_set_nth_lt // szi -sz.
move=> k; rewrite /shift size_set_nth_lt ?size_perm_idx ?(perm_size ok) // => ks.
by rewrite nth_set_nth_lt !nth_perm_idx ?(perm_size ok) // nth_set_nth_lt (perm_index_eq ok).
Qed.

(** ** slice_other_dim: [x[a:b]] along [d] of [Shard e], [e <> d], is [Shard e]. *)
Lemma lop_val_slice d a b s t :
  lop_val fn (Slice d a b) [:: s] [:: t] = reindex (lop_shape (Slice d a b) [:: s]) (shift d a) t.
Proof. by []. Qed.

Lemma slice_local_shape p d a b s e : e != d -> (d < size s)%N -> (e < size s)%N ->
  lop_shape (Slice d a b) [:: local_shape p s (Shard e)] =
  local_shape p (lop_shape (Slice d a b) [:: s]) (Shard e).
Proof.
move=> ed ds es; rewrite /= nth_set_nth_lt (negbTE ed) set_nth_comm // eq_sym.
Qed.

Lemma slice_other_dim p d a b s e T (L : family) :
  slice_ok s d a b -> e != d -> placed p s (Shard e) T L ->
  let so := lop_shape (Slice d a b) [:: s] in
  lop_shape (Slice d a b) [:: local_shape p s (Shard e)] = local_shape p so (Shard e) /\
  placed p so (Shard e) (lop_val fn (Slice d a b) [:: s] [:: T])
    (fun r => lop_val fn (Slice d a b) [:: local_shape p s (Shard e)] [:: L r]).
Proof.
move=> /andP [/andP [ds ab] bs] ed H so; have [es _ _] := H.
have sz : size so = size s by rewrite /so /= size_set_nth_lt.
have eso : (e < size so)%N by rewrite sz.
have hn : nth 0%N so e = nth 0%N s e by rewrite /so /= nth_set_nth_lt (negbTE ed).
split; first exact: slice_local_shape.
rewrite lop_val_slice.
have -> : (fun r => lop_val fn (Slice d a b) [:: local_shape p s (Shard e)] [:: L r]) =
          (fun r => reindex (local_shape p so (Shard e)) (shift d a) (L r)).
  by apply: functional_extensionality => r; rewrite lop_val_slice slice_local_shape.
apply: (@reindex_shard p s so e e (shift d a) (shift d a) T L H eso hn) => r i rp ii.
have szi : size i = size s by rewrite (inb_size ii) /local_shape size_set_nth_lt // sz.
split; last by rewrite shift_comm // ?szi // eq_sym.
case/inbP: ii => _ Hi; apply/inbP.
rewrite /shift /local_shape !size_set_nth_lt ?szi //; split=> // k ks.
have := Hi k; rewrite /local_shape size_set_nth_lt // sz => /(_ ks).
rewrite hn /so /= !nth_set_nth_lt.
case: (k =P e) => [->|ke]; first by rewrite (negbTE ed).
case: (k =P d) => [->|//] h.
by apply: (leq_trans _ bs); rewrite -(subnKC ab) ltn_add2l.
Qed.

(** ** slice_block_to_shard: rank [r] slicing block [r] ([r*m .. r*m+m), [m*p = size])
    of dim [d] of a replicated tensor holds [Shard d]. *)
Lemma slice_block_to_shard p d s T (L : family) :
  shard_ok p s d -> placed p s Replicate T L ->
  let m := (nth 0%N s d %/ p)%N in
  (forall r, lop_shape (Slice d (r * m) (r * m + m)) [:: s] = local_shape p s (Shard d)) /\
  placed p s (Shard d) T (fun r => lop_val fn (Slice d (r * m) (r * m + m)) [:: s] [:: L r]).
Proof.
move=> /andP [ds /eqP dv] H m; split=> [r|]; first by rewrite /= addKn.
split=> // r i rp ii.
rewrite /lop_val /mask /= addKn; move: ii; rewrite /= => ii; rewrite ii H //.
by apply: (@inb_shift p).
Qed.

(** ** Row-wise ops along [d] of operands sharded on another dim [e] *)
Lemma foldr_in_ext (B : Type) (f g : nat -> B -> B) (z : B) (l : seq nat) :
  (forall k b, k \in l -> f k b = g k b) -> foldr f z l = foldr g z l.
Proof.
elim: l => //= a l IH H; rewrite H ?mem_head // IH // => k b kl.
by apply: H; rewrite in_cons kl orbT.
Qed.

Lemma sumR_ext n (F G : nat -> R) : (forall k, (k < n)%N -> F k = G k) -> sumR n F = sumR n G.
Proof. by move=> H; apply: foldr_in_ext => k b; rewrite mem_iota => /andP [_ kn]; rewrite H. Qed.

Lemma maxR_ext n (F G : nat -> R) : (0 < n)%N -> (forall k, (k < n)%N -> F k = G k) -> maxR n F = maxR n G.
Proof.
move=> n0 H; rewrite /maxR H //; apply: foldr_in_ext => k b.
by rewrite mem_iota => /andP [_ kn]; rewrite H.
Qed.

(** [F] only reads its rows at [0 .. n-1] and is only read there. *)
Definition row_ext (n : nat) (F : (nat -> R) -> (nat -> R) -> nat -> R) : Prop :=
  forall x y x' y', (forall j, (j < n)%N -> x j = x' j /\ y j = y' j) ->
  forall j, (j < n)%N -> F x y j = F x' y' j.

Definition along (s : seq nat) (d : nat) (F : (nat -> R) -> (nat -> R) -> nat -> R) (t u : tensor) : tensor :=
  mask s (fun i => F (row d t i) (row d u i) (nth 0%N i d)).

Lemma shift_set_nth e d off j (i : seq nat) : e != d -> (e < size i)%N -> (d < size i)%N ->
  shift e off (set_nth 0%N i d j) = set_nth 0%N (shift e off i) d j.
Proof.
move=> ed ei di; rewrite /shift nth_set_nth_lt (negbTE ed) set_nth_comm ?size_set_nth_lt //.
by rewrite eq_sym.
Qed.

Lemma along_shard p s d e F T U (LT LU : family) :
  rowwise_ok s d e -> row_ext (nth 0%N s d) F ->
  placed p s (Shard e) T LT -> placed p s (Shard e) U LU ->
  placed p s (Shard e) (along s d F T U)
    (fun r => along (local_shape p s (Shard e)) d F (LT r) (LU r)).
Proof.
move=> /andP [/andP [ds n0] ed] Fx [es dv HT] [_ _ HU]; split=> // r i rp ii.
set m := (nth 0%N s e %/ p)%N.
have szi : size i = size s by rewrite (inb_size ii) /local_shape size_set_nth_lt.
have hnd : nth 0%N (local_shape p s (Shard e)) d = nth 0%N s d by rewrite /= nth_set_nth_lt eq_sym (negbTE ed).
rewrite /along /mask ii (@inb_shift p) //.
have -> : nth 0%N (shift e (r * m) i) d = nth 0%N i d by rewrite /shift nth_set_nth_lt eq_sym (negbTE ed).
apply: Fx => [j jn|]; last first.
  by case/inbP: ii => _ /(_ d); rewrite -hnd; apply; rewrite /local_shape size_set_nth_lt.
have ij : inb (local_shape p s (Shard e)) (set_nth 0%N i d j).
  by apply: inb_set_nth; rewrite ?hnd // /local_shape size_set_nth_lt.
by rewrite /row HT // HU // !shift_set_nth ?szi.
Qed.

Lemma sm_exp_ext ex n (x x' : nat -> R) : (0 < n)%N -> (forall j, (j < n)%N -> x j = x' j) ->
  forall j, (j < n)%N -> sm_exp fn ex n x j = sm_exp fn ex n x' j.
Proof. by move=> n0 H j jn; rewrite /sm_exp H // (maxR_ext n0 H). Qed.

Lemma sm_sum_ext ex n (x x' : nat -> R) : (0 < n)%N -> (forall j, (j < n)%N -> x j = x' j) ->
  sm_sum fn ex n x = sm_sum fn ex n x'.
Proof. by move=> n0 H; apply: sumR_ext; apply: sm_exp_ext. Qed.

(** The row-wise ops as [along], with the row length of the logical shape. *)
Definition sm_row ex n : (nat -> R) -> (nat -> R) -> nat -> R :=
  fun x _ j => sm_exp fn ex n x j / sm_sum fn ex n x.
Definition lsm_row ex lg n : (nat -> R) -> (nat -> R) -> nat -> R :=
  fun x _ j => (x j - maxR n x) - fn lg (sm_sum fn ex n x).

Lemma row_ext_sm ex n : (0 < n)%N -> row_ext n (sm_row ex n).
Proof.
move=> n0 x y x' y' H j jn; have Hx : forall j, (j < n)%N -> x j = x' j by move=> k /H [].
by rewrite /sm_row (sm_exp_ext _ n0 Hx) // (sm_sum_ext _ n0 Hx).
Qed.

Lemma row_ext_lsm ex lg n : (0 < n)%N -> row_ext n (lsm_row ex lg n).
Proof.
move=> n0 x y x' y' H j jn; have Hx : forall j, (j < n)%N -> x j = x' j by move=> k /H [].
by rewrite /lsm_row Hx // (maxR_ext n0 Hx) (sm_sum_ext _ n0 Hx).
Qed.

Lemma local_nth_other p s e d : e != d -> nth 0%N (local_shape p s (Shard e)) d = nth 0%N s d.
Proof. by move=> ed; rewrite /= nth_set_nth_lt eq_sym (negbTE ed). Qed.

(** softmax_other_dim: softmax along [d] of [Shard e], [e <> d], is [Shard e]. *)
Lemma softmax_other_dim p d ex s e T (L : family) :
  rowwise_ok s d e -> placed p s (Shard e) T L ->
  lop_shape (Softmax d ex) [:: local_shape p s (Shard e)] = local_shape p s (Shard e) /\
  placed p s (Shard e) (lop_val fn (Softmax d ex) [:: s] [:: T])
    (fun r => lop_val fn (Softmax d ex) [:: local_shape p s (Shard e)] [:: L r]).
Proof.
move=> ok H; split=> //; have /andP [/andP [_ n0] ed] := ok.
have -> : (fun r => lop_val fn (Softmax d ex) [:: local_shape p s (Shard e)] [:: L r]) =
          (fun r => along (local_shape p s (Shard e)) d (sm_row ex (nth 0%N s d)) (L r) (L r)).
  by apply: functional_extensionality => r; rewrite /lop_val /= -(local_nth_other p s ed).
exact: (along_shard ok (row_ext_sm ex n0) H H).
Qed.

(** softmax_other_dim for log_softmax. *)
Lemma log_softmax_other_dim p d ex lg s e T (L : family) :
  rowwise_ok s d e -> placed p s (Shard e) T L ->
  lop_shape (LogSoftmax d ex lg) [:: local_shape p s (Shard e)] = local_shape p s (Shard e) /\
  placed p s (Shard e) (lop_val fn (LogSoftmax d ex lg) [:: s] [:: T])
    (fun r => lop_val fn (LogSoftmax d ex lg) [:: local_shape p s (Shard e)] [:: L r]).
Proof.
move=> ok H; split=> //; have /andP [/andP [_ n0] ed] := ok.
have -> : (fun r => lop_val fn (LogSoftmax d ex lg) [:: local_shape p s (Shard e)] [:: L r]) =
          (fun r => along (local_shape p s (Shard e)) d (lsm_row ex lg (nth 0%N s d)) (L r) (L r)).
  by apply: functional_extensionality => r; rewrite /lop_val /= -(local_nth_other p s ed).
exact: (along_shard ok (row_ext_lsm ex lg n0) H H).
Qed.

(** The backward ops read [g] and [out] at the index itself: the row at [nth i d]. *)
Lemma along_eq s d F t u (f : tensor) : (d < size s)%N ->
  (forall i, inb s i -> f i = F (row d t i) (row d u i) (nth 0%N i d)) -> mask s f = along s d F t u.
Proof.
move=> ds H; apply: functional_extensionality => i; rewrite /along /mask.
by case si: (inb s i) => //; rewrite H.
Qed.

Lemma row_at d (t : tensor) (i : seq nat) : (d < size i)%N -> row d t i (nth 0%N i d) = t i.
Proof. by move=> di; rewrite /row set_nth_nth_same. Qed.

Definition sbw_row n : (nat -> R) -> (nat -> R) -> nat -> R :=
  fun x y j => y j * (x j - sumR n (fun k => x k * y k)).
Definition lsbw_row ex n : (nat -> R) -> (nat -> R) -> nat -> R :=
  fun x y j => x j - fn ex (y j) * sumR n x.

Lemma row_ext_sbw n : row_ext n (sbw_row n).
Proof.
move=> x y x' y' H j jn; rewrite /sbw_row; have [-> ->] := H j jn.
by congr (_ * (_ - _)); apply: sumR_ext => k kn; have [-> ->] := H k kn.
Qed.

Lemma row_ext_lsbw ex n : row_ext n (lsbw_row ex n).
Proof.
move=> x y x' y' H j jn; rewrite /lsbw_row; have [-> ->] := H j jn.
by congr (_ - _ * _); apply: sumR_ext => k kn; have [-> _] := H k kn.
Qed.

Lemma lop_val_sbw d s g o : (d < size s)%N ->
  lop_val fn (SoftmaxBwd d) [:: s; s] [:: g; o] = along s d (sbw_row (nth 0%N s d)) g o.
Proof.
move=> ds; apply: along_eq => // i ii; have di : (d < size i)%N by rewrite (inb_size ii).
by rewrite /= /softmax_bwd /sbw_row !row_at.
Qed.

Lemma lop_val_lsbw d ex s g o : (d < size s)%N ->
  lop_val fn (LogSoftmaxBwd d ex) [:: s; s] [:: g; o] = along s d (lsbw_row ex (nth 0%N s d)) g o.
Proof.
move=> ds; apply: along_eq => // i ii; have di : (d < size i)%N by rewrite (inb_size ii).
by rewrite /= /log_softmax_bwd /lsbw_row !row_at.
Qed.

(** softmax_other_dim for softmax_backward(grad, out), both [Shard e]. *)
Lemma softmax_bwd_other_dim p d s e G O (LG LO : family) :
  rowwise_ok s d e -> placed p s (Shard e) G LG -> placed p s (Shard e) O LO ->
  let ls := local_shape p s (Shard e) in
  lop_shape (SoftmaxBwd d) [:: ls; ls] = ls /\
  placed p s (Shard e) (lop_val fn (SoftmaxBwd d) [:: s; s] [:: G; O])
    (fun r => lop_val fn (SoftmaxBwd d) [:: ls; ls] [:: LG r; LO r]).
Proof.
move=> ok HG HO ls; split=> //; have /andP [/andP [ds _] ed] := ok.
have [es _ _] := HG.
have dls : (d < size ls)%N by rewrite /ls /local_shape size_set_nth_lt.
rewrite lop_val_sbw //.
have -> : (fun r => lop_val fn (SoftmaxBwd d) [:: ls; ls] [:: LG r; LO r]) =
          (fun r => along ls d (sbw_row (nth 0%N s d)) (LG r) (LO r)).
  by apply: functional_extensionality => r; rewrite lop_val_sbw // local_nth_other.
rewrite /ls.
exact: (along_shard ok (@row_ext_sbw (nth 0%N s d)) HG HO).
Qed.

(** softmax_other_dim for log_softmax_backward(grad, out), both [Shard e]. *)
Lemma log_softmax_bwd_other_dim p d ex s e G O (LG LO : family) :
  rowwise_ok s d e -> placed p s (Shard e) G LG -> placed p s (Shard e) O LO ->
  let ls := local_shape p s (Shard e) in
  lop_shape (LogSoftmaxBwd d ex) [:: ls; ls] = ls /\
  placed p s (Shard e) (lop_val fn (LogSoftmaxBwd d ex) [:: s; s] [:: G; O])
    (fun r => lop_val fn (LogSoftmaxBwd d ex) [:: ls; ls] [:: LG r; LO r]).
Proof.
move=> ok HG HO ls; split=> //; have /andP [/andP [ds _] ed] := ok.
have [es _ _] := HG.
have dls : (d < size ls)%N by rewrite /ls /local_shape size_set_nth_lt.
rewrite lop_val_lsbw //.
have -> : (fun r => lop_val fn (LogSoftmaxBwd d ex) [:: ls; ls] [:: LG r; LO r]) =
          (fun r => along ls d (lsbw_row ex (nth 0%N s d)) (LG r) (LO r)).
  by apply: functional_extensionality => r; rewrite lop_val_lsbw // local_nth_other.
rewrite /ls; exact: (along_shard ok (@row_ext_lsbw ex (nth 0%N s d)) HG HO).
Qed.

(** ** Reductions over one dim *)
Lemma fiber_shard p s e d (H : (nat -> R) -> R) (keep : bool) T (L : family) :
  e != d -> (e < size s)%N -> (forall x y, (forall k, (k < nth 0%N s e)%N -> x k = y k) -> H x = H y) ->
  placed p s (Shard d) T L ->
  placed p (rshape keep e s) (Shard (rdim keep e d))
    (mask (rshape keep e s) (fun i => H (fun k => T (sel keep e k i))))
    (fun r => mask (rshape keep e (local_shape p s (Shard d))) (fun i => H (fun k => L r (sel keep e k i)))).
Proof.
move=> ed es Hx [ds dv HT].
have hn := nth_rdim keep ed es; have dlt := rdim_lt keep ed es ds.
split=> //; first by rewrite hn.
move=> r i rp ii; rewrite /mask /local_shape rshape_local // -hn.
move: (ii); rewrite /local_shape => ii'; rewrite ii'.
rewrite (@inb_shift p) //; last by rewrite hn.
have szi : size i = size (rshape keep e s).
  by rewrite (inb_size ii) /local_shape size_set_nth_lt.
apply: Hx => k kn; rewrite hn in ii' *.
have hne : nth 0%N (set_nth 0%N s d (nth 0%N s d %/ p)%N) e = nth 0%N s e by rewrite nth_set_nth_lt (negbTE ed).
rewrite HT //.
  congr T; clear ii; case: keep ii' szi dlt {hn} => /= ii' szi dlt.
    by rewrite shift_set_nth ?szi ?size_set_nth_lt // eq_sym.
  rewrite ins_shift // szi ?size_rem_at //; first by rewrite -ltnS prednK // (leq_ltn_trans _ es).
  by move: dlt; rewrite size_rem_at.
clear ii; case: keep ii' szi {hn} dlt => /= ii' szi dlt.
  apply: inb_set_nth1; rewrite ?size_set_nth_lt ?hne //.
  by rewrite set_nth_comm // eq_sym.
apply: inb_rem_ins; rewrite ?size_set_nth_lt ?hne // rem_at_set_nth //.
Qed.

Lemma minR_ext n (F G : nat -> R) : (0 < n)%N -> (forall k, (k < n)%N -> F k = G k) -> minR n F = minR n G.
Proof.
move=> n0 H; rewrite /minR H //; apply: foldr_in_ext => k b.
by rewrite mem_iota => /andP [_ kn]; rewrite H.
Qed.

Lemma comb_ext r n (x y : nat -> R) : (0 < n)%N -> (forall k, (k < n)%N -> x k = y k) ->
  comb r n x = comb r n y.
Proof. by case: r => /= n0 H; [apply: sumR_ext|apply: sumR_ext|apply: maxR_ext|apply: minR_ext]. Qed.

(** What one reduced dim does to a row: combine, and for a mean divide by its length. *)
Definition post (r : red) (n : nat) (v : R) : R := if r is RdMean then v / (n * 1)%:R else v.

Lemma lop_val_reduce1 r e keep s t :
  lop_val fn (Reduce r [:: e] keep) [:: s] [:: t] =
  mask (rshape keep e s) (fun i => post r (nth 0%N s e) (comb r (nth 0%N s e) (fun k => t (sel keep e k i)))).
Proof. by case: r; case: keep. Qed.

(** reduce_other_dim: sum / mean / amax / amin over [e] of [Shard d], [e <> d], is [Shard] of
    where [d] goes ([d], or [d - 1] when [e < d] and the dim is removed). *)
Lemma reduce_other_dim p r e keep s d T (L : family) :
  reduce_ok s e d -> placed p s (Shard d) T L ->
  let so := rshape keep e s in
  lop_shape (Reduce r [:: e] keep) [:: local_shape p s (Shard d)] = local_shape p so (Shard (rdim keep e d)) /\
  placed p so (Shard (rdim keep e d)) (lop_val fn (Reduce r [:: e] keep) [:: s] [:: T])
    (fun r' => lop_val fn (Reduce r [:: e] keep) [:: local_shape p s (Shard d)] [:: L r']).
Proof.
move=> /andP [/andP [es n0] ed] H so; have [ds _ _] := H.
have hne : nth 0%N (local_shape p s (Shard d)) e = nth 0%N s e by rewrite /= nth_set_nth_lt (negbTE ed).
split.
  have -> : forall ls, lop_shape (Reduce r [:: e] keep) [:: ls] = rshape keep e ls by clear so; case: keep.
  by rewrite /= rshape_local // /so (nth_rdim keep ed es).
rewrite lop_val_reduce1.
have -> : (fun r' => lop_val fn (Reduce r [:: e] keep) [:: local_shape p s (Shard d)] [:: L r']) =
  (fun r' => mask (rshape keep e (local_shape p s (Shard d)))
     (fun i => post r (nth 0%N s e) (comb r (nth 0%N s e) (fun k => L r' (sel keep e k i))))).
  by apply: functional_extensionality => r'; rewrite lop_val_reduce1 hne.
apply: (@fiber_shard p s e d (fun x => post r (nth 0%N s e) (comb r (nth 0%N s e) x))) => // x y hxy.
by rewrite (comb_ext r n0 hxy).
Qed.

(** ** partial_linear_map for the layout ops that read their input through an index map *)
Definition reindex_op (o : lop) : option (seq nat -> seq nat -> seq nat) :=
  match o with
  | Reshape s' => Some (fun s0 i => unflat s0 (flat s' i))
  | Permute ds => Some (fun _ => perm_idx ds)
  | Unsqueeze d => Some (fun _ => rem_at d)
  | Squeeze ds => Some (fun s0 => sq_idx ds 0 s0)
  | Expand s' => Some (fun s0 => proj s0 s')
  | Slice d a _ => Some (fun _ => shift d a)
  | CastF => Some (fun _ i => i)
  | _ => None
  end.

Lemma lop_val_reindex o g s t : reindex_op o = Some g ->
  lop_val fn o [:: s] [:: t] = reindex (lop_shape o [:: s]) (g s) t.
Proof. by case: o => //= [s'|ds|d|ds|s'|d a b|] [<-]. Qed.

(** [t] is 0 outside shape [s] (every evaluated tensor is). *)
Definition vanish (s : seq nat) (t : tensor) : Prop := forall i, ~~ inb s i -> t i = 0.

Lemma reindex_partial_vanish p s so rd (g : seq nat -> seq nat) (T : tensor) (L : family) :
  sum_like rd -> vanish s T -> (forall r, vanish s (L r)) ->
  placed p s (Partial rd) T L ->
  placed p so (Partial rd) (reindex so g T) (fun r => reindex so g (L r)).
Proof.
move=> sl vT vL; case: rd sl => // _ H i ii; rewrite /reindex /mask ii.
- case sj: (inb s (g i)); first exact: H.
  by rewrite vT ?sj // big1 // => r _; rewrite vL ?sj.
- case sj: (inb s (g i)); first exact: H.
  by rewrite vT ?sj // big1 ?mulr0 // => r _; rewrite vL ?sj.
Qed.

Lemma layout_partial_linear_map p o g s rd T (L : family) :
  reindex_op o = Some g -> sum_like rd -> vanish s T -> (forall r, vanish s (L r)) ->
  placed p s (Partial rd) T L ->
  placed p (lop_shape o [:: s]) (Partial rd) (lop_val fn o [:: s] [:: T]) (fun r => lop_val fn o [:: s] [:: L r]).
Proof.
move=> ho sl vT vL H; rewrite (lop_val_reindex _ _ ho).
have -> : (fun r => lop_val fn o [:: s] [:: L r]) = (fun r => reindex (lop_shape o [:: s]) (g s) (L r)).
  by apply: functional_extensionality => r; rewrite (lop_val_reindex _ _ ho).
exact: (@reindex_partial_vanish p s (lop_shape o [:: s]) rd (g s) T L sl vT vL H).
Qed.

(** ** concat_other_dim *)
Definition agree_off (d : nat) (q s : seq nat) : Prop := size s = size q /\ forall j, j != d -> nth 0%N s j = nth 0%N q j.

Lemma cat_shard p d e q (ss : seq (seq nat)) (Ts : seq tensor) (Ls : seq family) r i :
  e != d -> (e < size q)%N -> (d < size q)%N -> (r < p)%N ->
  size Ts = size ss -> size Ls = size ss ->
  (forall s, s \in ss -> agree_off d q s) ->
  (forall k, (k < size ss)%N -> placed p (nth [::] ss k) (Shard e) (nth (zero_t R) Ts k) (nth (fun _ => zero_t R) Ls k)) ->
  size i = size q -> (forall j, (j < size q)%N -> j != d -> (nth 0%N i j < nth 0%N (local_shape p q (Shard e)) j)%N) ->
  (nth 0%N i d < sumn (map (fun s => nth 0%N s d) ss))%N ->
  cat d (map (fun s => local_shape p s (Shard e)) ss) (map (fun L => L r) Ls) i =
  cat d ss Ts (shift e (r * (nth 0%N q e %/ p)) i).
Proof.
move=> ed eq dq rp; elim: ss Ts Ls i => [|s ss IH] [|T Ts] [|L Ls] i //= [hT] [hL] Ag Pl si Hi id.
have [ss' Hs] := Ag s (mem_head _ _).
have hnd : nth 0%N (local_shape p s (Shard e)) d = nth 0%N s d by rewrite local_nth_other.
have hsd : nth 0%N (shift e (r * (nth 0%N q e %/ p)) i) d = nth 0%N i d.
  by rewrite /shift nth_set_nth_lt eq_sym (negbTE ed).
rewrite hnd hsd; case: ifP => ids.
  have [es dv HL] := Pl 0%N isT; rewrite /= in es dv HL.
  rewrite HL //; first by rewrite Hs.
  apply/inbP; rewrite size_set_nth_lt // ss' -si; split=> // j js.
  have jq : (j < size q)%N by rewrite -si.
  rewrite nth_set_nth_lt; case: (j =P e) => [->|je].
    by have := Hi e eq ed; rewrite nth_set_nth_lt eqxx Hs.
  case: (j =P d) => [->//|jd].
  by have := Hi j jq (introN eqP jd); rewrite nth_set_nth_lt (introF eqP je) Hs //; apply/eqP.
rewrite -shift_set_nth ?si //; apply: IH => //.
- by move=> s' s'in; apply: Ag; rewrite in_cons s'in orbT.
- by move=> k ks; apply: (Pl k.+1).
- by rewrite size_set_nth_lt // si.
- by move=> j jq jd; rewrite nth_set_nth_lt (negbTE jd); apply: Hi.
- by rewrite nth_set_nth_lt eqxx -(ltn_add2l (nth 0%N s d)) subnKC // leqNgt ids.
Qed.

Lemma concat_local_shape p d e (ss : seq (seq nat)) : e != d -> (e < size (nth [::] ss 0))%N ->
  (d < size (nth [::] ss 0))%N ->
  lop_shape (Concat d) (map (fun s => local_shape p s (Shard e)) ss) =
  local_shape p (lop_shape (Concat d) ss) (Shard e).
Proof.
move=> ed es ds; case: ss es ds => [|s0 ss] //= es ds.
rewrite -map_comp; under eq_map do rewrite /= nth_set_nth_lt eq_sym (negbTE ed).
rewrite set_nth_comm ?size_set_nth_lt // ?nth_set_nth_lt 1?eq_sym ?(negbTE ed) //.
Qed.

(** concat_other_dim: torch.cat along [d] of operands all [Shard e], [e <> d], is [Shard e]. *)
Lemma concat_other_dim p d e (ss : seq (seq nat)) (Ts : seq tensor) (Ls : seq family) :
  concat_ok p ss d e -> size Ts = size ss -> size Ls = size ss ->
  (forall k, (k < size ss)%N -> placed p (nth [::] ss k) (Shard e) (nth (zero_t R) Ts k) (nth (fun _ => zero_t R) Ls k)) ->
  let lss := map (fun s => local_shape p s (Shard e)) ss in
  lop_shape (Concat d) lss = local_shape p (lop_shape (Concat d) ss) (Shard e) /\
  placed p (lop_shape (Concat d) ss) (Shard e) (lop_val fn (Concat d) ss Ts)
    (fun r => lop_val fn (Concat d) lss (map (fun L => L r) Ls)).
Proof.
move=> /andP [/andP [/andP [ed ds] /andP [es /eqP dv]] Aok] hT hL Pl lss.
set q := nth [::] ss 0 in ds es dv Aok.
have Ag : forall s, s \in ss -> agree_off d q s.
  move=> s /(allP Aok) /andP [/eqP sz /eqP e0]; split=> // j jd.
  by have := congr1 (fun l => nth 0%N l j) e0; rewrite /= !nth_set_nth_lt (negbTE jd).
have shp := concat_local_shape p ed es ds.
split=> //.
set so := lop_shape (Concat d) ss.
have sz : size so = size q by rewrite /so /= size_set_nth_lt.
have hne : nth 0%N so e = nth 0%N q e by rewrite /so /= nth_set_nth_lt (negbTE ed).
split; [by rewrite sz | by rewrite hne | move=> r i rp ii].
have isx : inb so (shift e (r * (nth 0%N so e %/ p)) i).
  by apply: (@inb_shift p) => //; rewrite ?sz ?hne.
rewrite /lop_val shp /mask ii -/so isx.
  rewrite hne; apply: cat_shard => //.
  - by rewrite (inb_size ii) /local_shape size_set_nth_lt ?sz.
  - move=> j jq jd; case/inbP: ii => _ /(_ j); rewrite /local_shape size_set_nth_lt ?sz //.
    move=> /(_ jq); rewrite /local_shape hne !nth_set_nth_lt.
    by case: (j =P e) => // _; rewrite (negbTE jd).
  - case/inbP: ii => _ /(_ d); rewrite /local_shape size_set_nth_lt ?sz //.
    by move=> /(_ ds); rewrite nth_set_nth_lt eq_sym (negbTE ed) /so /= nth_set_nth_lt eqxx.
Qed.

(** ** reduce_sum_sharded_dim / reduce_mean_sharded_dim: sum (mean) over the sharded dim
    is Partial(sum) (Partial(avg)) of the logical sum (mean). *)
Lemma sumR_big n (F : nat -> R) : sumR n F = \sum_(0 <= k < n) F k.
Proof. by rewrite /sumR unlock /index_iota subn0. Qed.

Lemma rshape_same p keep d s : (d < size s)%N ->
  rshape keep d (local_shape p s (Shard d)) = rshape keep d s.
Proof. by move=> ds; case: keep => /=; [rewrite set_nth_twice|rewrite rem_at_set_nth_same]. Qed.

Lemma sel_block p keep d s (T : tensor) (L : family) r i k :
  placed p s (Shard d) T L -> (r < p)%N -> inb (rshape keep d s) i -> (k < nth 0%N s d %/ p)%N ->
  L r (sel keep d k i) = T (sel keep d (r * (nth 0%N s d %/ p) + k) i).
Proof.
move=> [ds dv H] rp ii km; have szi := inb_size ii.
have hm : nth 0%N (local_shape p s (Shard d)) d = (nth 0%N s d %/ p)%N by rewrite /= nth_set_nth_lt eqxx.
rewrite H //; last first.
  case: keep ii {szi} => /= ii.
    by apply: inb_set_nth1; rewrite ?size_set_nth_lt ?hm // set_nth_twice.
  by apply: inb_rem_ins; rewrite ?size_set_nth_lt ?hm // rem_at_set_nth_same.
congr T; case: keep ii szi => /= ii szi.
  by rewrite /shift set_nth_twice nth_set_nth_lt eqxx.
by rewrite shift_ins_same // szi size_rem_at //; rewrite -ltnS prednK // (leq_ltn_trans _ ds).
Qed.

Lemma reduce_sum_sharded_dim p keep d s T (L : family) :
  placed p s (Shard d) T L ->
  lop_shape (Reduce RdSum [:: d] keep) [:: local_shape p s (Shard d)] = rshape keep d s /\
  placed p (rshape keep d s) (Partial RSum) (lop_val fn (Reduce RdSum [:: d] keep) [:: s] [:: T])
    (fun r => lop_val fn (Reduce RdSum [:: d] keep) [:: local_shape p s (Shard d)] [:: L r]).
Proof.
move=> H; have [ds dv _] := H.
have hm : nth 0%N (local_shape p s (Shard d)) d = (nth 0%N s d %/ p)%N by rewrite /= nth_set_nth_lt eqxx.
split; first by rewrite -(rshape_same p keep ds); case: keep.
move=> i ii; rewrite lop_val_reduce1 /mask ii.
under eq_bigr do rewrite lop_val_reduce1 /mask (rshape_same p keep ds) ii.
rewrite /= hm sumR_big.
rewrite -[in RHS]dv mulnC sum_blocks; apply: eq_big_nat => r /andP [_ rp].
rewrite sumR_big; apply: eq_big_nat => k /andP [_ km].
exact: sel_block.
Qed.

Lemma reduce_mean_sharded_dim p keep d s T (L : family) :
  placed p s (Shard d) T L -> (0 < p)%N ->
  lop_shape (Reduce RdMean [:: d] keep) [:: local_shape p s (Shard d)] = rshape keep d s /\
  placed p (rshape keep d s) (Partial RAvg) (lop_val fn (Reduce RdMean [:: d] keep) [:: s] [:: T])
    (fun r => lop_val fn (Reduce RdMean [:: d] keep) [:: local_shape p s (Shard d)] [:: L r]).
Proof.
move=> H p0; have [ds dv _] := H.
have hm : nth 0%N (local_shape p s (Shard d)) d = (nth 0%N s d %/ p)%N by rewrite /= nth_set_nth_lt eqxx.
split; first by rewrite -(rshape_same p keep ds); case: keep.
move=> i ii; rewrite lop_val_reduce1 /mask ii.
under eq_bigr do rewrite lop_val_reduce1 /mask (rshape_same p keep ds) ii.
rewrite /= hm.
rewrite -mulr_suml -[in RHS]dv !muln1 natrM invfM mulrCA [_^-1 * _^-1]mulrC; congr (_ * _).
rewrite sumR_big mulnC sum_blocks; apply: eq_big_nat => r /andP [_ rp].
rewrite sumR_big; apply: eq_big_nat => k /andP [_ km].
exact: sel_block.
Qed.

(** ** reduce_max_sharded_dim: amax over the sharded dim is Partial(max) of the logical amax. *)
Lemma maxR_ge n (F : nat -> R) k : (k < n)%N -> F k <= maxR n F.
Proof.
move=> kn; have kin : k \in iota 0 n by rewrite mem_iota add0n.
rewrite /maxR; elim: (iota 0 n) kin => //= a l IH; rewrite in_cons => /orP [/eqP ->|kl].
  by rewrite Order.TotalTheory.le_maxr Order.POrderTheory.lexx.
by rewrite Order.TotalTheory.le_maxr IH ?orbT.
Qed.

Lemma maxR_in n (F : nat -> R) : (0 < n)%N -> exists2 k, (k < n)%N & maxR n F = F k.
Proof.
move=> n0; rewrite /maxR.
have : forall l, (forall k, k \in l -> (k < n)%N) ->
  exists2 k, (k < n)%N & foldr (fun k m => Num.max (F k) m) (F 0%N) l = F k.
  elim=> [|a l IH] H /=; first by exists 0%N.
  have [k kn ->] : exists2 k, (k < n)%N & foldr (fun k m => Num.max (F k) m) (F 0%N) l = F k.
    by apply: IH => k kl; apply: H; rewrite in_cons kl orbT.
  rewrite /Order.max; case: ifP => _; [by exists k | exists a => //; apply: H; exact: mem_head].
by apply => k; rewrite mem_iota add0n => /andP [].
Qed.

Lemma block_in p m r k : (r < p)%N -> (k < m)%N -> (r * m + k < m * p)%N.
Proof.
move=> rp km; apply: (@leq_trans (r * m + m)); first by rewrite ltn_add2l.
by rewrite -mulSnr mulnC leq_mul2l rp orbT.
Qed.

Lemma maxR_block p m (G : nat -> R) r : (0 < m)%N -> (r < p)%N ->
  maxR m (fun k => G (r * m + k)%N) <= maxR (m * p) G.
Proof.
move=> m0 rp; have [k km ->] := maxR_in (fun k => G (r * m + k)%N) m0.
exact: maxR_ge (block_in rp km).
Qed.

Lemma reduce_max_sharded_dim p keep d s T (L : family) :
  placed p s (Shard d) T L -> (0 < nth 0%N s d %/ p)%N ->
  lop_shape (Reduce RdMax [:: d] keep) [:: local_shape p s (Shard d)] = rshape keep d s /\
  placed p (rshape keep d s) (Partial RMax) (lop_val fn (Reduce RdMax [:: d] keep) [:: s] [:: T])
    (fun r => lop_val fn (Reduce RdMax [:: d] keep) [:: local_shape p s (Shard d)] [:: L r]).
Proof.
move=> H m0; have [ds dv _] := H; set m := (nth 0%N s d %/ p)%N in m0 dv.
have hm : nth 0%N (local_shape p s (Shard d)) d = m by rewrite /= nth_set_nth_lt eqxx.
split; first by rewrite -(rshape_same p keep ds); case: keep.
move=> i ii.
have loc0 : forall r, lop_val fn (Reduce RdMax [:: d] keep) [:: local_shape p s (Shard d)] [:: L r] i =
                      maxR m (fun k => L r (sel keep d k i)).
  by move=> r; rewrite lop_val_reduce1 /mask rshape_same // ii /= hm.
rewrite lop_val_reduce1 /mask ii /= -[in maxR (nth 0%N s d)]dv.
set G := fun k => T (sel keep d k i).
have loc : forall r, (r < p)%N -> maxR m (fun k => L r (sel keep d k i)) = maxR m (fun k => G (r * m + k)%N).
  by move=> r rp; apply: maxR_ext => // k km; rewrite /G (sel_block H rp ii km).
split=> [r rp|]; first by rewrite loc0 loc // maxR_block.
have pp : (0 < p)%N by move: m0; rewrite /m; case: (p) => //; rewrite divn0.
have p0 : (0 < m * p)%N by rewrite muln_gt0 m0 pp.
have [j jmp hj] := maxR_in G p0.
have jp : (j %/ m < p)%N by rewrite ltn_divLR // mulnC.
exists (j %/ m)%N => //; rewrite loc0 loc //; apply/eqP; rewrite Order.POrderTheory.eq_le maxR_block // hj /=.
have -> : G j = G (j %/ m * m + j %% m)%N by rewrite -divn_eq.
exact: (maxR_ge (fun k => G (j %/ m * m + k)%N) (ltn_pmod j m0)).
Qed.

(** ** rowwise_shard for expand: a shard on a dim expand does not broadcast passes through
    (the local op expands to the local target, dim [d + off] of size [m]). *)
Lemma expand_shard p s s' d T (L : family) :
  expand_ok s s' d -> placed p s (Shard d) T L ->
  let off := (size s' - size s)%N in
  let m := (nth 0%N s d %/ p)%N in
  let ls' := set_nth 0%N s' (off + d) m in
  lop_shape (Expand ls') [:: local_shape p s (Shard d)] = local_shape p s' (Shard (off + d)) /\
  placed p s' (Shard (off + d)) (lop_val fn (Expand s') [:: s] [:: T])
    (fun r => lop_val fn (Expand ls') [:: local_shape p s (Shard d)] [:: L r]).
Proof.
move=> /andP [/andP [/andP [ss' ds] d1] /allP Ak] H off m ls'.
have [_ dv HT] := H.
have od : (off + d < size s')%N by rewrite /off -ltn_subRL subnBA // addnC addnK.
have Ak' : forall k, (k < size s)%N -> (nth 0%N s k == 1%N) || (nth 0%N s' (off + k) == nth 0%N s k).
  by move=> k ks; apply: Ak; rewrite mem_iota add0n ks.
have hn : nth 0%N s' (off + d) = nth 0%N s d.
  by have /orP [/eqP h|/eqP //] := Ak' d ds; rewrite h eqxx in d1.
have ls : ls' = local_shape p s' (Shard (off + d)) by rewrite /ls' /= hn.
split=> //.
have -> : (fun r => lop_val fn (Expand ls') [:: local_shape p s (Shard d)] [:: L r]) =
          (fun r => reindex (local_shape p s' (Shard (off + d))) (proj (local_shape p s (Shard d)) ls') (L r)).
  by apply: functional_extensionality => r; rewrite ls.
apply: (@reindex_shard p s s' d (off + d) (proj s s') (proj (local_shape p s (Shard d)) ls') T L H od hn).
move=> r i rp ii.
have szs : size (local_shape p s (Shard d)) = size s by rewrite /= size_set_nth_lt.
have szo : size ls' = size s' by rewrite /ls' size_set_nth_lt.
have szi : size i = size s' by rewrite (inb_size ii) /= size_set_nth_lt.
have sli : size (shift (off + d) (r * m) i) = size s' by rewrite /shift size_set_nth_lt // szi.
have Hi := ii; case/inbP: Hi => _ Hi.
split.
  apply/inbP; rewrite size_proj ?szi ?szo ?szs //; split=> // k ks.
  rewrite nth_proj ?szi ?szo ?szs //.
  rewrite -/off.
  case: ifP => [/eqP ->//|k1]; have := Hi (off + k)%N; rewrite /local_shape size_set_nth_lt //.
  have oks : (off + k < size s')%N by rewrite /off -ltn_subRL subnBA // addnC addnK.
  move=> /(_ oks); rewrite !nth_set_nth_lt eqn_add2l.
  case: (k =P d) => [->|kd].
    by rewrite hn.
  move: k1; rewrite /= nth_set_nth_lt (introF eqP kd) => k1.
  by have /orP [/eqP h|/eqP ->] := Ak' k ks; [rewrite h eqxx in k1|].
apply: (@eq_from_nth _ 0%N).
  by rewrite /shift size_set_nth_lt ?size_proj ?szi ?szo ?szs ?sli // size_proj ?szi ?szo ?szs.
move=> k; rewrite /shift size_set_nth_lt ?size_proj ?szi ?szo ?szs // => ks.
rewrite -/(shift (off + d) (r * m) i) nth_set_nth_lt !nth_proj ?szi ?szo ?szs ?sli // -/off.
rewrite /shift nth_set_nth_lt eqn_add2l.
case: (k =P d) => [->|kd]; last by rewrite /= nth_set_nth_lt (introF eqP kd).
rewrite (negbTE d1) /= nth_set_nth_lt eqxx.
case: ifP => // /eqP m1; congr addn.
by have := Hi (off + d)%N; rewrite /local_shape size_set_nth_lt // nth_set_nth_lt eqxx hn m1 => /(_ od); case: (nth _ _ _).
Qed.

End Values.

End JLayoutSound.
