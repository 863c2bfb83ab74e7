(** * Load-balanced ("zig-zag") context parallelism.

    With a causal mask, query row [k] attends to keys [0 .. k], so the cost of
    a contiguous block of rows grows with its position: under plain [shard]
    the last rank does about [2p - 1] times the work of the first.  The
    zig-zag layout cuts the sequence dim of length [2*p*c] into [2p] chunks of
    [c] rows and gives rank [r] chunk [r] followed by chunk [2p - 1 - r]: every
    rank holds one early and one late chunk, so the causal work is balanced.

    Local row [i < 2c] of rank [r < p] is logical row [zz_index p c r i].  The
    layout is a permutation of the [p * (2 * c)] rows (it is [shard] with
    blocks [2c] up to the reindexing [zz_flat]), so every rule of plain
    sharding whose result does not depend on the order of the rows carries
    over: elementwise and row-wise ops keep the layout, reductions and
    contractions over the zig-zag dim give [Partial], and ring attention over
    zig-zag key blocks is softmax attention over all keys. *)
From mathcomp Require Import all_ssreflect all_algebra.
From TVCert Require Import Semantics Layout Composite Ring.
Set Implicit Arguments.
Unset Strict Implicit.
Unset Printing Implicit Defensive.
Import GRing.Theory Num.Theory.
Local Open Scope ring_scope.

(** ** The layout *)

(** Local row [i] of rank [r]: chunk [r] for [i < c], chunk [2p-1-r] after. *)
Definition zz_index (p c r i : nat) : nat :=
  if (i < c)%N then (r * c + i)%N else ((2 * p - 1 - r) * c + (i - c))%N.

(** Zig-zag shard of the leading dim (same shape as [shard]). *)
Definition shard_zigzag {I V : Type} (p c : nat) (E : nat -> I -> V)
  (L : nat -> nat -> I -> V) : Prop :=
  forall r i x, (r < p)%N -> (i < 2 * c)%N -> L r i x = E (zz_index p c r i) x.

(** The chunk (of size [c]) that holds local row [i] of rank [r]. *)
Definition zz_chunk (p c r i : nat) : nat :=
  if (i < c)%N then r else (2 * p - 1 - r)%N.

(** The zig-zag layout read as a flat permutation of [[0, p * (2 * c))]:
    row [k] of the concatenated local buffers (blocks of [2c]). *)
Definition zz_flat (p c k : nat) : nat :=
  zz_index p c (k %/ (2 * c)) (k %% (2 * c)).

(** ** Index arithmetic *)

(** A row in the second half of a local buffer is [c] past its offset. *)
Lemma zz_mod_hi (c i : nat) : (c <= i)%N -> (i < 2 * c)%N -> (i %% c = i - c)%N.
Proof.
move=> ci i2c; rewrite -{1}(subnK ci) modnDr modn_small //.
by rewrite ltn_subLR // addnn -mul2n.
Qed.

(** The second chunk of rank [r < p] is [p + (p - r - 1)], in [[p, 2p)]. *)
Lemma zz_second_chunk (p r : nat) : (r < p)%N -> (2 * p - 1 - r = p + (p - r.+1))%N.
Proof. by move=> rp; rewrite -subnDA add1n mul2n -addnn -addnBA. Qed.

(** Local row [i] of rank [r] is row [i mod c] of its chunk. *)
Lemma zz_index_chunk (p c r i : nat) : (i < 2 * c)%N ->
  zz_index p c r i = (zz_chunk p c r i * c + i %% c)%N.
Proof.
move=> i2c; rewrite /zz_index /zz_chunk.
by case: (ltnP i c) => [ic|ci]; [rewrite modn_small | rewrite zz_mod_hi].
Qed.

(** The chunk of a row is below [p] exactly for the first half of the buffer. *)
Lemma zz_chunk_lt_p (p c r i : nat) : (r < p)%N -> (zz_chunk p c r i < p)%N = (i < c)%N.
Proof.
move=> rp; rewrite /zz_chunk; case: (ltnP i c) => // _.
by rewrite zz_second_chunk // ltnNge leq_addr.
Qed.

(** Every chunk index is below [2p]. *)
Lemma zz_chunk_lt (p c r i : nat) : (r < p)%N -> (zz_chunk p c r i < 2 * p)%N.
Proof.
move=> rp; rewrite /zz_chunk; case: (ltnP i c) => _.
  by rewrite (leq_trans rp) // mul2n -addnn leq_addr.
by rewrite zz_second_chunk // mul2n -addnn ltn_add2l ltn_subrL (leq_ltn_trans (leq0n r) rp).
Qed.

(** Row [i < b] of block [k < n] lies below [n * b]. *)
Lemma block_lt (n b k i : nat) : (k < n)%N -> (i < b)%N -> (k * b + i < n * b)%N.
Proof.
move=> kn ib; rewrite (@leq_trans (k * b + b)) ?ltn_add2l //.
by rewrite -mulSnr leq_mul2r kn orbT.
Qed.

(** A local row of a rank is a logical row: [zz_index] stays below [p * (2 * c)]. *)
Lemma zz_index_lt (p c r i : nat) : (r < p)%N -> (i < 2 * c)%N ->
  (zz_index p c r i < p * (2 * c))%N.
Proof.
move=> rp i2c; have c0 : (0 < c)%N by case: c i2c => //; rewrite muln0.
rewrite zz_index_chunk // mulnCA mulnA; exact: block_lt (zz_chunk_lt c i rp) (ltn_pmod i c0).
Qed.

(** Distinct local rows (of the same or of different ranks) are distinct
    logical rows. *)
Lemma zz_index_inj (p c r r' i i' : nat) :
  (r < p)%N -> (r' < p)%N -> (i < 2 * c)%N -> (i' < 2 * c)%N ->
  zz_index p c r i = zz_index p c r' i' -> r = r' /\ i = i'.
Proof.
move=> rp r'p i2c i'2c; have c0 : (0 < c)%N by case: c i2c {i'2c} => //; rewrite muln0.
rewrite !zz_index_chunk // => e.
have ech : zz_chunk p c r i = zz_chunk p c r' i'.
  by move: (congr1 (divn^~ c) e); rewrite /= !block_div ?ltn_pmod.
have emod : (i %% c = i' %% c)%N.
  by move: (congr1 (modn^~ c) e); rewrite /= !block_mod ?ltn_pmod.
have elt : (i < c)%N = (i' < c)%N by rewrite -(zz_chunk_lt_p c i rp) ech zz_chunk_lt_p.
move: ech; rewrite /zz_chunk -elt; case: (ltnP i c) => [ic | ci] ech.
  by split=> //; rewrite -(modn_small ic) emod modn_small // -elt.
have ci' : (c <= i')%N by rewrite leqNgt -elt -leqNgt.
rewrite !zz_second_chunk // in ech; move/addnI: ech => ech.
split; last by rewrite -(subnK ci) -(subnK ci') -!zz_mod_hi // emod.
by apply: succn_inj; rewrite -(subKn rp) -(subKn r'p) ech.
Qed.

(** ** The flat permutation [zz_flat] *)

(** Row [i] of block [r] of the concatenated local buffers is local row [i]
    of rank [r]. *)
Lemma zz_flat_block (p c r i : nat) : (i < 2 * c)%N ->
  zz_flat p c (r * (2 * c) + i) = zz_index p c r i.
Proof.
move=> i2c; have c0 : (0 < 2 * c)%N by rewrite (leq_ltn_trans (leq0n i)).
by rewrite /zz_flat block_div ?block_mod.
Qed.

(** [zz_flat] maps [[0, p * (2 * c))] into itself. *)
Lemma zz_flat_lt (p c k : nat) : (k < p * (2 * c))%N -> (zz_flat p c k < p * (2 * c))%N.
Proof.
move=> kn; have c0 : (0 < 2 * c)%N by case: (2 * c)%N kn => //; rewrite muln0.
by apply: zz_index_lt; [apply: block_rank_lt kn | apply: ltn_pmod].
Qed.

(** [zz_flat] is injective on [[0, p * (2 * c))]. *)
Lemma zz_flat_inj (p c k k' : nat) : (k < p * (2 * c))%N -> (k' < p * (2 * c))%N ->
  zz_flat p c k = zz_flat p c k' -> k = k'.
Proof.
move=> kn k'n; have c0 : (0 < 2 * c)%N by case: (2 * c)%N kn => //; rewrite muln0.
case/zz_index_inj; rewrite ?block_rank_lt ?ltn_pmod // => ediv emod.
by rewrite (divn_eq k (2 * c)) ediv emod -divn_eq.
Qed.

(** [zz_flat] is onto [[0, p * (2 * c))] (an injection of a finite set into
    itself). *)
Lemma zz_flat_onto (p c k : nat) : (k < p * (2 * c))%N ->
  exists2 k', (k' < p * (2 * c))%N & zz_flat p c k' = k.
Proof.
move=> kn; pose h (j : 'I_(p * (2 * c))) : 'I_(p * (2 * c)) :=
  Ordinal (zz_flat_lt (ltn_ord j)).
have h_inj : injective h.
  by move=> j j' /(congr1 val) /= /zz_flat_inj e; apply/val_inj/e.
have [g _ hg] := injF_bij h_inj.
exists (val (g (Ordinal kn))); first exact: ltn_ord.
by have /(congr1 val) := hg (Ordinal kn).
Qed.

(** Every logical row is held by some rank: [zz_index] is onto. *)
Lemma zz_index_onto (p c k : nat) : (k < p * (2 * c))%N ->
  exists r i, [/\ (r < p)%N, (i < 2 * c)%N & zz_index p c r i = k].
Proof.
move=> kn; have c0 : (0 < 2 * c)%N by case: (2 * c)%N kn => //; rewrite muln0.
have [k' k'n <-] := zz_flat_onto kn.
by exists (k' %/ (2 * c))%N, (k' %% (2 * c))%N; rewrite ?block_rank_lt ?ltn_pmod.
Qed.

(** ** Sums (and any commutative monoid) over the zig-zag layout *)

(** Combining every rank's local rows, for any commutative monoid, is
    combining all [p * (2 * c)] logical rows. *)
Lemma big_zigzag {V : Type} {idx : V} (op : Monoid.com_law idx) (p c : nat)
  (F : nat -> V) :
  \big[op/idx]_(0 <= r < p) \big[op/idx]_(0 <= i < 2 * c) F (zz_index p c r i) =
  \big[op/idx]_(0 <= k < p * (2 * c)) F k.
Proof.
rewrite -(big_reindex_inj op F (@zz_flat_lt p c) (@zz_flat_inj p c)) big_blocks.
by apply: eq_big_nat => r _; apply: eq_big_nat => i /andP[_ i2c]; rewrite zz_flat_block.
Qed.

(** The sum over every rank's local rows is the sum over all logical rows. *)
Lemma sum_zigzag {R : zmodType} (p c : nat) (F : nat -> R) :
  \sum_(0 <= r < p) \sum_(0 <= i < 2 * c) F (zz_index p c r i) =
  \sum_(0 <= k < p * (2 * c)) F k.
Proof. exact: (big_zigzag (GRing.add_comoid R)). Qed.

(** ** Elementwise and row-wise ops keep the zig-zag layout *)

(** A unary elementwise op keeps the zig-zag layout. *)
Theorem zigzag_ew_unary {I V W : Type} (f : V -> W) (p c : nat)
  (E : nat -> I -> V) (L : nat -> nat -> I -> V) :
  shard_zigzag p c E L ->
  shard_zigzag p c (fun k x => f (E k x)) (fun r i x => f (L r i x)).
Proof. by move=> h r i x rp ic; rewrite h. Qed.

(** A binary elementwise op on two zig-zag operands gives a zig-zag result. *)
Theorem zigzag_ew_binary {I U V W : Type} (f : U -> V -> W) (p c : nat)
  (E1 : nat -> I -> U) (L1 : nat -> nat -> I -> U)
  (E2 : nat -> I -> V) (L2 : nat -> nat -> I -> V) :
  shard_zigzag p c E1 L1 -> shard_zigzag p c E2 L2 ->
  shard_zigzag p c (fun k x => f (E1 k x) (E2 k x)) (fun r i x => f (L1 r i x) (L2 r i x)).
Proof. by move=> h1 h2 r i x rp ic; rewrite h1 ?h2. Qed.

(** A zig-zag operand combined with a replicated operand broadcast along the
    zig-zag dim gives a zig-zag result. *)
Theorem zigzag_ew_binary_broadcast {I U V W : Type} (f : U -> V -> W) (p c : nat)
  (E1 : nat -> I -> U) (L1 : nat -> nat -> I -> U) (B : I -> V) (LB : nat -> I -> V) :
  shard_zigzag p c E1 L1 -> replicate p B LB ->
  shard_zigzag p c (fun k x => f (E1 k x) (B x)) (fun r i x => f (L1 r i x) (LB r x)).
Proof. by move=> h1 h2 r i x rp ic; rewrite h1 ?h2. Qed.

(** A row op [g] respects pointwise equality of its row (every op that is a
    function of the row's values does; with function extensionality every
    [g] does, cf. [AnyOp.op_ext]). *)
Definition row_ext {I V J W : Type} (g : (I -> V) -> J -> W) : Prop :=
  forall u u', (forall x, u x = u' x) -> forall y, g u y = g u' y.

(** An op applied independently to every row of the zig-zag dim (a row-wise
    op along other dims, an embedding lookup of zig-zag ids, a matmul with the
    zig-zag dim as a row / batch dim, a softmax over another dim) keeps the
    zig-zag layout. *)
Theorem zigzag_rowwise {I V J W : Type} (g : (I -> V) -> J -> W) (p c : nat)
  (E : nat -> I -> V) (L : nat -> nat -> I -> V) :
  row_ext g -> shard_zigzag p c E L ->
  shard_zigzag p c (fun k => g (E k)) (fun r i => g (L r i)).
Proof. by move=> ext h r i y rp ic; apply: ext => x; apply: h. Qed.

(** A two-operand op [g] respects pointwise equality of both rows. *)
Definition row_ext2 {I1 V1 I2 V2 J W : Type} (g : (I1 -> V1) -> (I2 -> V2) -> J -> W) : Prop :=
  forall u u' w w', (forall x, u x = u' x) -> (forall x, w x = w' x) -> forall y, g u w y = g u' w' y.

(** A two-operand op applied independently to every row of a dim both
    operands are zig-zag sharded on (a matmul / einsum with that dim free in
    both, a concatenation along another dim) keeps the zig-zag layout; a
    replicated operand is the case of a row constant along the dim. *)
Theorem zigzag_rowwise2 {I1 V1 I2 V2 J W : Type} (g : (I1 -> V1) -> (I2 -> V2) -> J -> W)
  (p c : nat) (E1 : nat -> I1 -> V1) (L1 : nat -> nat -> I1 -> V1)
  (E2 : nat -> I2 -> V2) (L2 : nat -> nat -> I2 -> V2) :
  row_ext2 g -> shard_zigzag p c E1 L1 -> shard_zigzag p c E2 L2 ->
  shard_zigzag p c (fun k => g (E1 k) (E2 k)) (fun r i => g (L1 r i) (L2 r i)).
Proof. by move=> ext h1 h2 r i y rp ic; apply: ext => x; [apply: h1 | apply: h2]. Qed.

(** A row constant along the zig-zag dim is zig-zag sharded by every rank
    holding it (the replicated operand of [zigzag_rowwise2]). *)
Lemma zigzag_const_row {I V : Type} (p c : nat) (F : I -> V) :
  shard_zigzag p c (fun _ => F) (fun _ _ => F).
Proof. by []. Qed.

(** ** Reductions and contractions over the zig-zag dim give [Partial] *)

(** Reducing the zig-zag dim with any commutative monoid gives [Partial(op)]. *)
Lemma zigzag_reduce_op {I V : Type} {idx : V} (op : Monoid.com_law idx) (p c : nat)
  (E : nat -> I -> V) (L : nat -> nat -> I -> V) :
  shard_zigzag p c E L ->
  partial_op op p (fun x => \big[op/idx]_(0 <= k < p * (2 * c)) E k x)
                  (fun r x => \big[op/idx]_(0 <= i < 2 * c) L r i x).
Proof.
move=> h x; rewrite -big_zigzag; apply: eq_big_nat => r /andP[_ rp].
by apply: eq_big_nat => i /andP[_ ic]; rewrite h.
Qed.

(** Sum over the zig-zag dim gives [Partial(sum)]. *)
Theorem zigzag_reduce_sum {I : Type} {R : zmodType} (p c : nat)
  (E : nat -> I -> R) (L : nat -> nat -> I -> R) :
  shard_zigzag p c E L ->
  partial_sum p (fun x => \sum_(0 <= k < p * (2 * c)) E k x)
                (fun r x => \sum_(0 <= i < 2 * c) L r i x).
Proof. exact: (zigzag_reduce_op (GRing.add_comoid R)). Qed.

(** Join (max) over the zig-zag dim in a lattice with bottom gives
    [Partial(max)]. *)
Lemma zigzag_reduce_max_lattice {I : Type} {disp : unit} {T : bLatticeType disp}
  (p c : nat) (E : nat -> I -> T) (L : nat -> nat -> I -> T) :
  shard_zigzag p c E L ->
  partial_max p (fun x => \big[Order.join/Order.bottom]_(0 <= k < p * (2 * c)) E k x)
                (fun r x => \big[Order.join/Order.bottom]_(0 <= i < 2 * c) L r i x).
Proof. exact: (zigzag_reduce_op Order.BLatticeTheory.join_comoid). Qed.

(** Max over the zig-zag dim in a totally ordered field ([p, c > 0]) gives
    [Partial(max)]. *)
Lemma zigzag_reduce_max_real {I : Type} {R : realDomainType} (p c : nat)
  (E : nat -> I -> R) (L : nat -> nat -> I -> R) :
  (0 < p)%N -> (0 < c)%N -> shard_zigzag p c E L ->
  partial_max_real p (fun x => max_upto (fun k => E k x) (p * (2 * c)))
                     (fun r x => max_upto (fun i => L r i x) (2 * c)).
Proof.
move=> p0 c0 h x; have c20 : (0 < 2 * c)%N by rewrite muln_gt0.
symmetry; apply: max_upto_unique => [|k kn|].
- by rewrite muln_gt0 p0.
- have [r [i [rp ic <-]]] := zz_index_onto kn; rewrite -h //.
  apply: (Order.POrderTheory.le_trans (max_upto_ub (fun i => L r i x) ic)).
  exact: (max_upto_ub (fun r => max_upto (fun i => L r i x) (2 * c)) rp).
- have [r rp ->] := max_upto_attained (fun r => max_upto (fun i => L r i x) (2 * c)) p0.
  have [i ic ->] := max_upto_attained (fun i => L r i x) c20.
  by exists (zz_index p c r i); rewrite ?zz_index_lt ?h.
Qed.

(** Max over the zig-zag dim gives [Partial(max)]: for a lattice with a
    bottom (join), and for a totally ordered field with [p, c > 0] (the two
    forms of [reduce_max_sharded_dim]). *)
Theorem zigzag_reduce_max :
  (forall (I : Type) (disp : unit) (T : bLatticeType disp) (p c : nat)
     (E : nat -> I -> T) (L : nat -> nat -> I -> T),
   shard_zigzag p c E L ->
   partial_max p (fun x => \big[Order.join/Order.bottom]_(0 <= k < p * (2 * c)) E k x)
                 (fun r x => \big[Order.join/Order.bottom]_(0 <= i < 2 * c) L r i x)) /\
  (forall (I : Type) (R : realDomainType) (p c : nat)
     (E : nat -> I -> R) (L : nat -> nat -> I -> R),
   (0 < p)%N -> (0 < c)%N -> shard_zigzag p c E L ->
   partial_max_real p (fun x => max_upto (fun k => E k x) (p * (2 * c)))
                      (fun r x => max_upto (fun i => L r i x) (2 * c))).
Proof.
split=> [I disp T p c E L|I R p c E L]; first exact: zigzag_reduce_max_lattice.
exact: zigzag_reduce_max_real.
Qed.

(** Mean over the zig-zag dim: the local means are a [Partial(avg)] of the
    global mean. *)
Theorem zigzag_reduce_mean {I : Type} {R : fieldType} (p c : nat)
  (E : nat -> I -> R) (L : nat -> nat -> I -> R) :
  shard_zigzag p c E L ->
  partial_avg p (fun x => ((p * (2 * c))%N%:R)^-1 * \sum_(0 <= k < p * (2 * c)) E k x)
                (fun r x => ((2 * c)%N%:R)^-1 * \sum_(0 <= i < 2 * c) L r i x).
Proof.
move=> h x; rewrite -mulr_sumr (zigzag_reduce_sum h) [(p * _)%:R]natrM invfM.
by rewrite mulrA.
Qed.

(** Contracting two operands over their common zig-zag dim (matmul / einsum
    with the zig-zag dim contracted) gives [Partial(sum)]. *)
Theorem zigzag_contraction {I J : Type} {R : ringType} (p c : nat)
  (A : nat -> I -> R) (LA : nat -> nat -> I -> R)
  (B : nat -> J -> R) (LB : nat -> nat -> J -> R) :
  shard_zigzag p c A LA -> shard_zigzag p c B LB ->
  partial_sum p (fun xy : I * J => \sum_(0 <= k < p * (2 * c)) A k xy.1 * B k xy.2)
                (fun r xy => \sum_(0 <= i < 2 * c) LA r i xy.1 * LB r i xy.2).
Proof.
move=> hA hB [x y] /=; rewrite -sum_zigzag; apply: eq_big_nat => r /andP[_ rp].
by apply: eq_big_nat => i /andP[_ ic]; rewrite hA ?hB.
Qed.

(** ** Producing the layout *)

(** Rank [r] concatenating slices [[r*c, r*c+c)] and
    [[(2p-1-r)*c, (2p-1-r)*c+c)] of its replica of [X] holds the zig-zag
    shard of [X]. *)
Theorem zigzag_from_slices {I V : Type} (p c : nat) (X : nat -> I -> V)
  (LX : nat -> nat -> I -> V) :
  replicate p X LX ->
  shard_zigzag p c X (fun r => concat c (fun i => LX r (r * c + i)%N)
                                        (fun i => LX r ((2 * p - 1 - r) * c + i)%N)).
Proof. by move=> h r i x rp ic; rewrite /concat /zz_index; case: ifP; rewrite h. Qed.

(** ** Ring attention over zig-zag key blocks.
    Rank [r] holds the keys (and values) of chunks [r] and [2p-1-r]; in the
    ring it ships them as one block of [2c] keys.  Read as a flat sequence of
    [p] blocks of [2c], the keys are [s (zz_flat p c k)]: block [r] is exactly
    rank [r]'s zig-zag keys ([zz_flat_block]).  Since [zz_flat] permutes the
    keys, every fact of [Ring.v] about [p] blocks of size [b] carries over
    with [b = 2c]. *)

(** A sum over all keys read through [zz_flat] is the sum over all keys. *)
Lemma sum_zz_flat {R : zmodType} (p c : nat) (F : nat -> R) :
  \sum_(0 <= k < p * (2 * c)) F (zz_flat p c k) = \sum_(0 <= k < p * (2 * c)) F k.
Proof. exact: (big_reindex_inj (GRing.add_comoid R) F (@zz_flat_lt p c) (@zz_flat_inj p c)). Qed.

(** Softmax attention over the keys in zig-zag order is softmax attention
    over the keys in their logical order (any [exp]). *)
Lemma softmax_attention_zigzag {R : realFieldType} (exp : R -> R) (p c : nat)
  (s v : nat -> R) :
  softmax_attention exp (p * (2 * c)) (fun k => s (zz_flat p c k)) (fun k => v (zz_flat p c k))
  = softmax_attention exp (p * (2 * c)) s v.
Proof.
by rewrite /softmax_attention (sum_zz_flat p c (fun k => exp (s k) * v k))
  (sum_zz_flat p c (fun k => exp (s k))).
Qed.

Section ZigzagRingAttention.
Variable R : realFieldType.
Variable exp : R -> R.
Hypothesis expD : forall a c, exp (a + c) = exp a * exp c.
Hypothesis exp_pos : forall a, 0 < exp a.

(** Ring attention on rank [r] over the zig-zag key blocks (block size [2c],
    block [(r + p - t) mod p] at step [t], zero initial sum and accumulator,
    any references): after [p] steps [acc / l] is softmax attention over all
    [p * (2 * c)] keys. *)
Lemma ring_attention_zigzag_output (p c r : nat) (s v : nat -> R) (refs : nat -> R)
  (x0 : ring_state R) :
  ring_lsum x0 = 0 -> ring_acc x0 = 0 ->
  let x := ring_fold exp (2 * c) (fun k => s (zz_flat p c k)) (fun k => v (zz_flat p c k))
             (fun t => ((r + p - t) %% p)%N) refs x0 p in
  ring_acc x / ring_lsum x = softmax_attention exp (p * (2 * c)) s v.
Proof.
move=> l0 a0 /=; rewrite (ring_attention_online_softmax expD exp_pos) //.
exact: softmax_attention_zigzag.
Qed.

(** The probabilities recomputed from the final state of the zig-zag ring are
    the softmax probabilities over all [p * (2 * c)] keys. *)
Lemma ring_attention_zigzag_probabilities (p c r : nat) (s v : nat -> R)
  (refs : nat -> R) (x0 : ring_state R) :
  ring_lsum x0 = 0 ->
  let x := ring_fold exp (2 * c) (fun k => s (zz_flat p c k)) (fun k => v (zz_flat p c k))
             (fun t => ((r + p - t) %% p)%N) refs x0 p in
  forall k, exp (s (zz_flat p c k) - ring_ref x) / ring_lsum x =
            exp (s (zz_flat p c k)) / \sum_(0 <= k' < p * (2 * c)) exp (s k').
Proof.
move=> l0 x k; rewrite /x (ring_probabilities expD exp_pos) //.
by rewrite (sum_zz_flat p c (fun k' => exp (s k'))).
Qed.
End ZigzagRingAttention.

(** Ring attention with zig-zag blocks: (a) softmax attention over the keys
    in zig-zag order is softmax attention over all keys; (b) the ring fold of
    rank [r] over the zig-zag key blocks gives softmax attention over all
    keys; (c) the probabilities recomputed from its final state are the
    softmax probabilities over all keys; (d) a sum over the query rows of all
    ranks in zig-zag order is the sum over all query rows. *)
Theorem ring_attention_zigzag :
  (forall (R : realFieldType) (exp : R -> R) (p c : nat) (s v : nat -> R),
     softmax_attention exp (p * (2 * c)) (fun k => s (zz_flat p c k))
                       (fun k => v (zz_flat p c k))
     = softmax_attention exp (p * (2 * c)) s v) /\
  (forall (R : realFieldType) (exp : R -> R),
     (forall a c, exp (a + c) = exp a * exp c) ->
     (forall a, 0 < exp a) ->
     forall (p c r : nat) (s v : nat -> R) (refs : nat -> R) (x0 : ring_state R),
     ring_lsum x0 = 0 -> ring_acc x0 = 0 ->
     let x := ring_fold exp (2 * c) (fun k => s (zz_flat p c k))
                (fun k => v (zz_flat p c k)) (fun t => ((r + p - t) %% p)%N) refs x0 p in
     ring_acc x / ring_lsum x = softmax_attention exp (p * (2 * c)) s v) /\
  (forall (R : realFieldType) (exp : R -> R),
     (forall a c, exp (a + c) = exp a * exp c) ->
     (forall a, 0 < exp a) ->
     forall (p c r : nat) (s v : nat -> R) (refs : nat -> R) (x0 : ring_state R),
     ring_lsum x0 = 0 ->
     let x := ring_fold exp (2 * c) (fun k => s (zz_flat p c k))
                (fun k => v (zz_flat p c k)) (fun t => ((r + p - t) %% p)%N) refs x0 p in
     forall k, exp (s (zz_flat p c k) - ring_ref x) / ring_lsum x =
               exp (s (zz_flat p c k)) / \sum_(0 <= k' < p * (2 * c)) exp (s k')) /\
  (forall (G : zmodType) (p c : nat) (F : nat -> G),
     \sum_(0 <= r < p) \sum_(0 <= i < 2 * c) F (zz_index p c r i) =
     \sum_(0 <= q < p * (2 * c)) F q).
Proof.
split; first exact: @softmax_attention_zigzag.
split; first exact: ring_attention_zigzag_output.
split; first exact: ring_attention_zigzag_probabilities.
exact: @sum_zigzag.
Qed.

(** ** Reshapes that merge (or split) a trailing dim into the zig-zag dim.
    Merging a trailing dim of size [m] into the zig-zag dim (row-major, logical
    row [K] is [(K / m, K mod m)]) keeps the zig-zag layout with chunk size
    [c * m]; splitting it back off gives chunk size [c]. *)

(** A row below [c * m] is one whose quotient by [m] is below [c]. *)
Lemma ltn_div_mul (m c i : nat) : (0 < m)%N -> (i %/ m < c)%N = (i < c * m)%N.
Proof. exact: ltn_divLR. Qed.

(** Past [c * m], the merged row minus [c * m] splits as (quotient [- c], rest). *)
Lemma sub_mul_divn (m c i : nat) : (c * m <= i)%N ->
  (i - c * m = (i %/ m - c) * m + i %% m)%N.
Proof.
move=> cmi; have cm : (c * m <= i %/ m * m)%N.
  by case: m cmi => [|m] cmi; [rewrite !muln0 | rewrite leq_mul2r /= leq_divRL].
by rewrite mulnBl addnC addnBA // addnC -divn_eq.
Qed.

(** Zig-zag with chunk [c * m] is zig-zag with chunk [c] on the row quotient,
    scaled by [m], plus the remainder. *)
Lemma zz_index_merge (p c m r i : nat) :
  (0 < m)%N -> (r < p)%N -> (i < 2 * (c * m))%N ->
  zz_index p (c * m) r i = (zz_index p c r (i %/ m) * m + i %% m)%N.
Proof.
move=> m0 _ _; rewrite /zz_index ltn_div_mul //; case: ltnP => [_|cmi].
  by rewrite mulnDl -addnA -divn_eq mulnA.
by rewrite mulnDl -addnA -sub_mul_divn // mulnA.
Qed.

(** Local row [i < 2 * (c * m)] of the merged buffer is row [i / m < 2 * c]
    of the unmerged one. *)
Lemma merged_row_div_lt (c m i : nat) : (0 < m)%N -> (i < 2 * (c * m))%N ->
  (i %/ m < 2 * c)%N.
Proof. by move=> m0 im; rewrite ltn_divLR // -mulnA. Qed.

(** Merging a trailing dim of size [m] into a zig-zag dim with chunk [c]
    gives a zig-zag dim with chunk [c * m]. *)
Theorem zigzag_merge_rows {I V : Type} (p c m : nat) (E : nat -> nat -> I -> V)
  (L : nat -> nat -> nat -> I -> V) :
  (0 < m)%N ->
  (forall r i j x, (r < p)%N -> (i < 2 * c)%N -> (j < m)%N ->
     L r i j x = E (zz_index p c r i) j x) ->
  shard_zigzag p (c * m) (fun K x => E (K %/ m)%N (K %% m)%N x)
                         (fun r K x => L r (K %/ m)%N (K %% m)%N x).
Proof.
move=> m0 h r k x rp km; rewrite h ?ltn_pmod ?merged_row_div_lt //.
by rewrite zz_index_merge // block_div ?block_mod ?ltn_pmod.
Qed.

(** Splitting a trailing dim of size [m] off a zig-zag dim with chunk
    [c * m]: row [(i, j)] of the local buffer read as [[rows, m]] is row
    [(zz_index p c r i, j)], i.e. the rows keep the zig-zag layout with
    chunk [c]. *)
Theorem zigzag_split_rows {I V : Type} (p c m : nat) (F : nat -> I -> V)
  (LF : nat -> nat -> I -> V) :
  (0 < m)%N -> shard_zigzag p (c * m) F LF ->
  forall r i j x, (r < p)%N -> (i < 2 * c)%N -> (j < m)%N ->
  LF r (i * m + j)%N x = F (zz_index p c r i * m + j)%N x.
Proof.
move=> m0 h r i j x rp ic jm; have im : (i * m + j < 2 * (c * m))%N.
  by rewrite mulnA block_lt.
by rewrite h // zz_index_merge // block_div ?block_mod.
Qed.

(** Reshape of the zig-zag dim: merging a trailing dim of size [m] into it
    gives chunk [c * m], and splitting it off a chunk-[c * m] dim gives
    chunk [c] on the rows. *)
Theorem zigzag_reshape :
  (forall (I V : Type) (p c m : nat) (E : nat -> nat -> I -> V)
     (L : nat -> nat -> nat -> I -> V),
   (0 < m)%N ->
   (forall r i j x, (r < p)%N -> (i < 2 * c)%N -> (j < m)%N ->
      L r i j x = E (zz_index p c r i) j x) ->
   shard_zigzag p (c * m) (fun K x => E (K %/ m)%N (K %% m)%N x)
                          (fun r K x => L r (K %/ m)%N (K %% m)%N x)) /\
  (forall (I V : Type) (p c m : nat) (F : nat -> I -> V) (LF : nat -> nat -> I -> V),
   (0 < m)%N -> shard_zigzag p (c * m) F LF ->
   forall r i j x, (r < p)%N -> (i < 2 * c)%N -> (j < m)%N ->
   LF r (i * m + j)%N x = F (zz_index p c r i * m + j)%N x).
Proof. by split=> I V p c m; [exact: zigzag_merge_rows | exact: zigzag_split_rows]. Qed.

(** ** Restoring natural order after an all-gather, and reduce-scatter in
    zig-zag order.
    An all-gather concatenates the ranks' local buffers: gathered row [k'] is
    local row [k' mod 2c] of rank [k' / 2c].  Natural row [k] is read back
    from gathered row [unzz_index p c k]. *)

(** Gathered row holding natural row [k]: chunk [k / c] is the first chunk of
    rank [k / c] if below [p], else the second chunk of rank [2p-1-k/c]. *)
Definition unzz_index (p c k : nat) : nat :=
  if (k < p * c)%N then (k %/ c * (2 * c) + k %% c)%N
  else ((2 * p - 1 - k %/ c) * (2 * c) + c + k %% c)%N.

(** Rank holding natural row [k] in the zig-zag layout. *)
Definition unzz_rank (p c k : nat) : nat :=
  if (k < p * c)%N then (k %/ c)%N else (2 * p - 1 - k %/ c)%N.

(** Local row holding natural row [k] on rank [unzz_rank p c k]. *)
Definition unzz_row (p c k : nat) : nat :=
  if (k < p * c)%N then (k %% c)%N else (c + k %% c)%N.

(** [unzz_index] is row [unzz_row] of block [unzz_rank] (blocks of [2c]). *)
Lemma unzz_index_split (p c k : nat) :
  unzz_index p c k = (unzz_rank p c k * (2 * c) + unzz_row p c k)%N.
Proof. by rewrite /unzz_index /unzz_rank /unzz_row; case: ifP => // _; rewrite addnA. Qed.

(** The local row [unzz_row] is below [2c]. *)
Lemma unzz_row_lt (p c k : nat) : (0 < c)%N -> (unzz_row p c k < 2 * c)%N.
Proof.
move=> c0; rewrite /unzz_row mul2n -addnn.
by case: ifP => _; [rewrite (leq_trans (ltn_pmod k c0)) ?leq_addr | rewrite ltn_add2l ltn_pmod].
Qed.

(** The chunk [k / c] of a row [k < p * (2 * c)] is below [2p]. *)
Lemma unzz_chunk_lt (p c k : nat) : (0 < c)%N -> (k < p * (2 * c))%N ->
  (k %/ c < 2 * p)%N.
Proof. by move=> c0 kn; rewrite ltn_divLR // -mulnA mulnCA. Qed.

(** The rank [unzz_rank] is below [p]. *)
Lemma unzz_rank_lt (p c k : nat) : (0 < c)%N -> (k < p * (2 * c))%N ->
  (unzz_rank p c k < p)%N.
Proof.
move=> c0 kn; rewrite /unzz_rank; case: (ltnP k (p * c)) => [kpc|pck]; first by rewrite ltn_divLR.
have pk : (p <= k %/ c)%N by rewrite leq_divRL.
rewrite -subnDA ltn_subLR ?add1n ?unzz_chunk_lt //.
by rewrite mul2n -addnn ltn_add2r ltnS.
Qed.

(** Row [unzz_row] of rank [unzz_rank] is natural row [k]. *)
Lemma zz_index_unzz_split (p c k : nat) : (0 < c)%N -> (k < p * (2 * c))%N ->
  zz_index p c (unzz_rank p c k) (unzz_row p c k) = k.
Proof.
move=> c0 kn; have q2p := unzz_chunk_lt c0 kn.
rewrite /zz_index /unzz_rank /unzz_row; case: (ltnP k (p * c)) => _.
  by rewrite ltn_pmod // -divn_eq.
rewrite ltnNge leq_addr /= addKn subKn -?divn_eq //.
by rewrite subn1 -ltnS prednK // (leq_ltn_trans (leq0n _) q2p).
Qed.

(** Gathered row [unzz_index p c k] lies in the block of a rank [< p]. *)
Lemma unzz_index_rank (p c k : nat) : (0 < c)%N -> (k < p * (2 * c))%N ->
  ((unzz_index p c k) %/ (2 * c) < p)%N.
Proof.
move=> c0 kn; rewrite unzz_index_split block_div ?unzz_row_lt ?muln_gt0 //.
exact: unzz_rank_lt.
Qed.

(** Gathered row [unzz_index p c k], read as (rank, local row), is natural row [k]. *)
Lemma zz_index_unzz (p c k : nat) : (0 < c)%N -> (k < p * (2 * c))%N ->
  zz_index p c ((unzz_index p c k) %/ (2 * c)) ((unzz_index p c k) %% (2 * c)) = k.
Proof.
move=> c0 kn; rewrite unzz_index_split block_div ?block_mod ?unzz_row_lt ?muln_gt0 //.
exact: zz_index_unzz_split.
Qed.

(** All-gather of a zig-zag shard, read at gathered row [unzz_index p c k],
    is logical row [k] on every rank: the result is [Replicate] of [E]. *)
Theorem zigzag_all_gather_natural {I V : Type} (p c : nat) (E : nat -> I -> V)
  (L : nat -> nat -> I -> V) :
  (0 < c)%N -> shard_zigzag p c E L ->
  forall k x, (k < p * (2 * c))%N ->
  L ((unzz_index p c k) %/ (2 * c))%N ((unzz_index p c k) %% (2 * c))%N x = E k x.
Proof.
move=> c0 h k x kn; rewrite h ?unzz_index_rank ?ltn_pmod ?muln_gt0 //.
by rewrite zz_index_unzz.
Qed.

(** Reduce-scatter (blocks of [2c]) of partial sums of [F] laid out in
    zig-zag order gives rank [r] block [r]: the zig-zag shard of [F]. *)
Theorem zigzag_reduce_scatter_order {I : Type} {R : zmodType} (p c : nat)
  (F : nat -> I -> R) (Pl : nat -> nat -> I -> R) :
  (forall k' x, (k' < p * (2 * c))%N ->
     \sum_(0 <= s < p) Pl s k' x = F (zz_flat p c k') x) ->
  shard_zigzag p c F (fun r i x => \sum_(0 <= s < p) Pl s (r * (2 * c) + i)%N x).
Proof. by move=> h r i x rp ic; rewrite h ?block_lt // zz_flat_block. Qed.

(** All-gather then reading gathered row [unzz_index p c k] restores natural
    order ([Replicate]); reduce-scatter of partial sums in zig-zag order
    gives the zig-zag shard. *)
Theorem zigzag_all_gather_reorder :
  (forall (I V : Type) (p c : nat) (E : nat -> I -> V) (L : nat -> nat -> I -> V),
   (0 < c)%N -> shard_zigzag p c E L ->
   forall k x, (k < p * (2 * c))%N ->
   L ((unzz_index p c k) %/ (2 * c))%N ((unzz_index p c k) %% (2 * c))%N x = E k x) /\
  (forall (I : Type) (R : zmodType) (p c : nat) (F : nat -> I -> R)
     (Pl : nat -> nat -> I -> R),
   (forall k' x, (k' < p * (2 * c))%N ->
      \sum_(0 <= s < p) Pl s k' x = F (zz_flat p c k') x) ->
   shard_zigzag p c F (fun r i x => \sum_(0 <= s < p) Pl s (r * (2 * c) + i)%N x)).
Proof.
split=> [I V p c E L|I R p c F Pl]; first exact: zigzag_all_gather_natural.
exact: zigzag_reduce_scatter_order.
Qed.
