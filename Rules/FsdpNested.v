(** * reduce_scatter(avg) inside an outer shard (FSDP2 over a TP shard).

    FSDP2 shards a parameter that TP already shards on dim [d] inside TP's
    blocks ([_StridedShard]): the outer (tp) axis of [q] ranks holds block
    [o] (of [p * b] rows) of the gradient [E] as partial sums over the inner
    (dp) axis of [p] ranks.  FSDP2's reduce-scatter with [ReduceOp.AVG] over
    dp leaves rank [(o, r)] (flattened [o * p + r]) block [r] of that block,
    divided by [p]: block [o * p + r] of [E / p], i.e. [Shard(d)] over both
    axes, nested.  Second conjunct: a [Partial(sum)] on a third axis [t]
    (HSDP's replicate axis) is kept. *)
From mathcomp Require Import all_ssreflect all_algebra.
From TVCert Require Import Semantics.
Set Implicit Arguments.
Unset Strict Implicit.
Unset Printing Implicit Defensive.
Import GRing.Theory.
Local Open Scope ring_scope.

Lemma nested_block (q p b r i : nat) :
  (r < q * p)%N -> (i < b)%N ->
  [/\ (r %/ p < q)%N, (r %% p * b + i < p * b)%N &
      (r %/ p * (p * b) + (r %% p * b + i) = r * b + i)%N].
Proof.
move=> rqp ib.
have p0 : (0 < p)%N by case: p rqp => [|//]; rewrite muln0.
split; first by rewrite ltn_divLR // mulnC.
  apply: (@leq_trans ((r %% p).+1 * b)); first by rewrite mulSn addnC ltn_add2r.
  by rewrite leq_mul2r ltn_pmod ?orbT.
by rewrite [in RHS](divn_eq r p) mulnDl -mulnA addnA [(p * b)%N]mulnC.
Qed.

Theorem reduce_scatter_avg_nested :
  (forall (I : Type) (R : fieldType) (q p b : nat) (E : nat -> I -> R) (L : nat -> nat -> nat -> I -> R),
   (forall o k x, (o < q)%N -> (k < p * b)%N -> \sum_(0 <= s < p) L o s k x = E (o * (p * b) + k)%N x) ->
   shard (q * p) b (fun k x => E k x / p%:R)
     (fun r i x => (p%:R)^-1 * reduce_scatter p b (L (r %/ p)%N) (r %% p)%N i x)) /\
  (forall (I : Type) (R : fieldType) (pa q p b : nat) (E : nat -> I -> R)
     (L : nat -> nat -> nat -> nat -> I -> R),
   (forall o k x, (o < q)%N -> (k < p * b)%N ->
      \sum_(0 <= t < pa) \sum_(0 <= s < p) L t o s k x = E (o * (p * b) + k)%N x) ->
   forall r i x, (r < q * p)%N -> (i < b)%N ->
     \sum_(0 <= t < pa) (p%:R)^-1 * reduce_scatter p b (L t (r %/ p)%N) (r %% p)%N i x
       = E (r * b + i)%N x / p%:R).
Proof.
split=> [I R q p b E L h r i x rqp ib|I R pa q p b E L h r i x rqp ib];
  have [oq kpb e] := nested_block rqp ib.
  by rewrite /reduce_scatter h // e mulrC.
by rewrite -big_distrr /= /reduce_scatter h // e mulrC.
Qed.
