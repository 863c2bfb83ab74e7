(** * tvcert IR: layout, reduction and row-wise ops (trusted definitions).

    Each constructor of [lop] is one PyTorch op; [lop_shape] is its output shape
    and [lop_val] its value, written as plainly as [Denote.op_val] (same
    conventions: a tensor is a function on index lists, every result is masked to
    its shape, [fn] interprets the uninterpreted pointwise functions, and an op
    that needs exp / log names the [fn] index it uses).  Attributes are the
    resolved ones: dims are non-negative, a reshape / expand target has no -1.
    The values must match [ops/layout.py], [ops/reduce.py], [ops/nn.py],
    [ops/linalg.py] and [ops/elementwise.py] exactly;
    [tests/test_coq_denotation.py] checks that on random rational tensors.

    Integer and boolean tensors (token ids, [iota], comparison results, masks) are
    values of the same field: the integer [n] is [n%:R], true / false are 1 / 0.  One
    domain keeps every rule and the plan semantics unchanged, and every op denoted
    here is exact on integers so embedded (arange, comparisons, one_hot, masks, casts
    to float, layout ops); a theorem over all field values holds in particular at
    integer inputs.  The ops that are not exact on them (integer division,
    truncating casts to int, overflow) have no constructor: the emitter refuses
    them on integer tensors. *)
From mathcomp Require Import all_ssreflect all_algebra.
From TVCert Require Import IR.Syntax IR.Denote.
Set Implicit Arguments.
Unset Strict Implicit.
Unset Printing Implicit Defensive.
Import GRing.Theory Num.Theory.
Import JSyntax JDenote.

Module JLayout.

(** The combination a reduction applies along a dim. *)
Inductive red := RdSum | RdMean | RdMax | RdMin.

(** The comparison of [Cmp]: x = y, x <> y, x < y, x <= y, x > y, x >= y. *)
Inductive cmp := CEq | CNe | CLt | CLe | CGt | CGe.

Inductive lop :=
| Reshape (s : seq nat)          (* torch.reshape / view / flatten, row-major, to shape s *)
| Permute (ds : seq nat)         (* torch.permute: output dim j is input dim nth ds j *)
| Unsqueeze (d : nat)            (* torch.unsqueeze(x, d) *)
| Squeeze (ds : seq nat)         (* torch.squeeze(x, ds), each dim of ds of size 1 *)
| Expand (s : seq nat)           (* torch.expand(x, s): size-1 dims broadcast, new leading dims *)
| Slice (d a b : nat)            (* x[a:b] along dim d (step 1, 0 <= a <= b <= size) *)
| Concat (d : nat)               (* torch.cat(xs, d) *)
| Reduce (r : red) (ds : seq nat) (keep : bool)
                                 (* torch.sum / mean / amax / amin over dims ds, keepdim *)
| Minimum | Maximum              (* torch.minimum / torch.maximum, broadcasting *)
| AddScalar (c : rat_lit)        (* x + c *)
| CastF                          (* x.to(float): the identity on reals *)
| Softmax (d ex : nat)           (* torch.softmax(x, d), exp = fn ex *)
| LogSoftmax (d ex lg : nat)     (* torch.log_softmax(x, d), exp = fn ex, log = fn lg *)
| SoftmaxBwd (d : nat)           (* softmax backward (grad, out) along d *)
| LogSoftmaxBwd (d ex : nat)     (* log_softmax backward (grad, out) along d *)
| Einsum (ts : seq (seq nat)) (out : seq nat)
                                 (* torch.einsum, letters numbered: operand k has letters
                                    nth ts k, the output letters out *)
| Where                          (* torch.where(c, a, b): a where c <> 0 else b, broadcasting *)
| MaskedFill (c : rat_lit)       (* x.masked_fill(m <> 0, c), broadcasting *)
| Iota (n a st : nat)            (* torch.arange(a, a + n * st, st): [a, a + st, ...], n entries *)
| Cmp (c : cmp)                  (* torch.eq / ne / lt / le / gt / ge: 1 where true, else 0, broadcasting *)
| OneHot (n : nat).              (* F.one_hot(x, n): [..., n], 1 where the last index is x, else 0 *)

(** ** Shapes (plain computation) *)
Definition prodn (s : seq nat) : nat := foldr muln 1 s.

(** Row-major offset of index [i] in shape [s], and the index at an offset. *)
Fixpoint flat (s : seq nat) (i : seq nat) : nat :=
  match s, i with
  | _ :: s', k :: i' => k * prodn s' + flat s' i'
  | _, _ => 0
  end.
Fixpoint unflat (s : seq nat) (x : nat) : seq nat :=
  match s with
  | [::] => [::]
  | _ :: s' => x %/ prodn s' :: unflat s' (x %% prodn s')
  end.

(** Input index of permute's output index [i]: input dim [k] is output dim [index k ds]. *)
Definition perm_idx (ds : seq nat) (i : seq nat) : seq nat :=
  map (fun k => nth 0 i (seq.index k ds)) (iota 0 (size ds)).

(** The dims of [s] squeeze keeps, and the input index of squeeze's output index [i]. *)
Definition keep_dims (ds : seq nat) (s : seq nat) : seq nat :=
  [seq k <- iota 0 (size s) | k \notin ds].
Fixpoint sq_idx (ds : seq nat) (k : nat) (s : seq nat) (i : seq nat) : seq nat :=
  match s with
  | [::] => [::]
  | _ :: s' => if k \in ds then 0 :: sq_idx ds k.+1 s' i
               else head 0 i :: sq_idx ds k.+1 s' (behead i)
  end.

(** Shape after reducing [ds]: removed (largest first) or kept as size 1. *)
Definition red_shape (keep : bool) (ds : seq nat) (s : seq nat) : seq nat :=
  if keep then foldl (fun s e => set_nth 0 s e 1) s ds else sum_shape ds s.

(** Einsum: the letters, the size of a letter (from its first operand), the contracted letters. *)
Definition letters (ts : seq (seq nat)) : seq nat := undup (flatten ts).
Definition lsize (ts : seq (seq nat)) (ss : seq (seq nat)) (l : nat) : nat :=
  let k := find (fun t => l \in t) ts in nth 0 (nth [::] ss k) (seq.index l (nth [::] ts k)).
Definition contracted (ts : seq (seq nat)) (out : seq nat) : seq nat :=
  [seq l <- letters ts | l \notin out].

Definition lop_shape (o : lop) (ss : seq (seq nat)) : seq nat :=
  let s0 := nth [::] ss 0 in
  let s1 := nth [::] ss 1 in
  match o with
  | Reshape s | Expand s => s
  | Permute ds => map (nth 0 s0) ds
  | Unsqueeze d => ins_at d 1 s0
  | Squeeze ds => map (nth 0 s0) (keep_dims ds s0)
  | Slice d a b => set_nth 0 s0 d (b - a)
  | Concat d => set_nth 0 s0 d (sumn (map (fun s => nth 0 s d) ss))
  | Reduce _ ds keep => red_shape keep ds s0
  | Minimum | Maximum | MaskedFill _ => bshape s0 s1
  | Where => bshape (bshape s0 s1) (nth [::] ss 2)
  | AddScalar _ | CastF | Softmax _ _ | LogSoftmax _ _ _ | SoftmaxBwd _ | LogSoftmaxBwd _ _ => s0
  | Einsum ts out => map (lsize ts ss) out
  | Iota n _ _ => [:: n]
  | Cmp _ => bshape s0 s1
  | OneHot n => rcons s0 n
  end.

Local Open Scope ring_scope.

Section Values.
Variable R : realFieldType.
Variable fn : nat -> R -> R.
Local Notation tensor := (tensor R).

(** ** Combining along one dim *)
Definition maxR (n : nat) (F : nat -> R) : R := foldr (fun k m => Num.max (F k) m) (F 0%N) (iota 0 n).
Definition minR (n : nat) (F : nat -> R) : R := foldr (fun k m => Num.min (F k) m) (F 0%N) (iota 0 n).

Definition comb (r : red) : nat -> (nat -> R) -> R :=
  match r with RdSum | RdMean => @sumR R | RdMax => maxR | RdMin => minR end.

(** Reduce dim [e] of a tensor of shape [s] with [c]: the output index [i] reads the
    input along dim [e] at [k] (dim [e] kept as size 1, or removed). *)
Definition red1 (c : nat -> (nat -> R) -> R) (keep : bool) (s : seq nat) (e : nat) (t : tensor) : tensor :=
  fun i => c (nth 0%N s e) (fun k => t (if keep then set_nth 0%N i e k else ins_at e k i)).
Fixpoint red_many (c : nat -> (nat -> R) -> R) (keep : bool) (ds : seq nat) (s : seq nat) (t : tensor)
  : tensor :=
  match ds with
  | [::] => t
  | e :: ds' => red_many c keep ds' (if keep then set_nth 0%N s e 1%N else rem_at e s) (red1 c keep s e t)
  end.

(** Reduction over [ds] (largest dim first); mean divides the sum by the number of reduced elements. *)
Definition reduce (r : red) (ds : seq nat) (keep : bool) (s : seq nat) (t : tensor) : tensor :=
  let v := red_many (comb r) keep (sum_order ds) s t in
  if r is RdMean then fun i => v i / (prodn (map (nth 0%N s) ds))%:R else v.

(** ** Softmax family along dim [d]: [row t i] is the row of [t] through index [i]. *)
Definition row (d : nat) (t : tensor) (i : seq nat) : nat -> R := fun j => t (set_nth 0%N i d j).

(** exp(x - m) with m the row maximum, and the row sum of that. *)
Definition sm_exp (ex n : nat) (x : nat -> R) (j : nat) : R := fn ex (x j - maxR n x).
Definition sm_sum (ex n : nat) (x : nat -> R) : R := sumR n (sm_exp ex n x).

Definition softmax (d ex : nat) (s : seq nat) (t : tensor) : tensor :=
  fun i => let n := nth 0%N s d in let x := row d t i in
           sm_exp ex n x (nth 0%N i d) / sm_sum ex n x.
Definition log_softmax (d ex lg : nat) (s : seq nat) (t : tensor) : tensor :=
  fun i => let n := nth 0%N s d in let x := row d t i in
           (x (nth 0%N i d) - maxR n x) - fn lg (sm_sum ex n x).
(** out * (g - sum(g * out, d)) *)
Definition softmax_bwd (d : nat) (s : seq nat) (g o : tensor) : tensor :=
  fun i => o i * (g i - sumR (nth 0%N s d) (fun j => row d g i j * row d o i j)).
(** g - exp(out) * sum(g, d) *)
Definition log_softmax_bwd (d ex : nat) (s : seq nat) (g o : tensor) : tensor :=
  fun i => g i - fn ex (o i) * sumR (nth 0%N s d) (row d g i).

(** ** Integers and booleans are the field's [n%:R] and 0 / 1 (see the header). *)
Definition b01 (b : bool) : R := if b then 1 else 0.
Definition cmpR (c : cmp) (x y : R) : bool :=
  match c with
  | CEq => x == y | CNe => x != y | CLt => x < y | CLe => x <= y | CGt => y < x | CGe => y <= x
  end.

(** ** Concatenation along [d]: the first operand whose block holds the index. *)
Fixpoint cat (d : nat) (ss : seq (seq nat)) (ts : seq tensor) (i : seq nat) : R :=
  match ss, ts with
  | s :: ss', t :: ts' =>
      let n := nth 0%N s d in
      if (nth 0%N i d < n)%N then t i else cat d ss' ts' (set_nth 0%N i d (nth 0%N i d - n)%N)
  | _, _ => 0
  end.

(** ** Einsum: sum over the contracted letters [ls] (with their sizes) of [F env],
    [env] giving each letter its value. *)
Fixpoint sum_env (ls : seq (nat * nat)) (F : (nat -> nat) -> R) (env : nat -> nat) : R :=
  match ls with
  | [::] => F env
  | (l, n) :: ls' => sumR n (fun v => sum_env ls' F (fun x => if x == l then v else env x))
  end.
Definition einsum (ts : seq (seq nat)) (out : seq nat) (ss : seq (seq nat)) (xs : seq tensor) : tensor :=
  fun i => sum_env [seq (l, lsize ts ss l) | l <- contracted ts out]
             (fun env => foldr (fun k acc => nth (zero_t R) xs k (map env (nth [::] ts k)) * acc) 1
                           (iota 0 (size ts)))
             (fun l => nth 0%N i (seq.index l out)).

Definition lop_val (o : lop) (ss : seq (seq nat)) (ts : seq tensor) : tensor :=
  let s0 := nth [::] ss 0 in
  let s1 := nth [::] ss 1 in
  let s2 := nth [::] ss 2 in
  let t0 := nth (zero_t R) ts 0 in
  let t1 := nth (zero_t R) ts 1 in
  let t2 := nth (zero_t R) ts 2 in
  let so := lop_shape o ss in
  mask so (match o with
  | Reshape s => fun i => t0 (unflat s0 (flat s i))                  (* torch.reshape *)
  | Permute ds => fun i => t0 (perm_idx ds i)                        (* torch.permute *)
  | Unsqueeze d => fun i => t0 (rem_at d i)                          (* torch.unsqueeze *)
  | Squeeze ds => fun i => t0 (sq_idx ds 0 s0 i)                     (* torch.squeeze *)
  | Expand s => fun i => t0 (proj s0 s i)                            (* torch.expand *)
  | Slice d a _ => fun i => t0 (shift d a i)                         (* x[a:b] on dim d *)
  | Concat d => cat d ss ts                                          (* torch.cat *)
  | Reduce r ds keep => reduce r ds keep s0 t0                       (* torch.sum/mean/amax/amin *)
  | Minimum => fun i => Num.min (t0 (proj s0 so i)) (t1 (proj s1 so i))   (* torch.minimum *)
  | Maximum => fun i => Num.max (t0 (proj s0 so i)) (t1 (proj s1 so i))   (* torch.maximum *)
  | AddScalar c => fun i => t0 i + lit R c                           (* x + c *)
  | CastF => t0                                                      (* x.float() *)
  | Softmax d ex => softmax d ex s0 t0                               (* torch.softmax *)
  | LogSoftmax d ex lg => log_softmax d ex lg s0 t0                  (* torch.log_softmax *)
  | SoftmaxBwd d => softmax_bwd d s0 t0 t1                           (* softmax backward *)
  | LogSoftmaxBwd d ex => log_softmax_bwd d ex s0 t0 t1              (* log_softmax backward *)
  | Einsum ts' out => einsum ts' out ss ts                           (* torch.einsum *)
  | Where => fun i => if t0 (proj s0 so i) != 0 then t1 (proj s1 so i) else t2 (proj s2 so i)
                                                                     (* torch.where *)
  | MaskedFill c => fun i => if t1 (proj s1 so i) != 0 then lit R c else t0 (proj s0 so i)
                                                                     (* masked_fill *)
  | Iota _ a st => fun i => (a + st * nth 0%N i 0)%:R                (* torch.arange *)
  | Cmp c => fun i => b01 (cmpR c (t0 (proj s0 so i)) (t1 (proj s1 so i)))  (* torch.gt ... *)
  | OneHot _ => fun i => b01 (t0 (take (size s0) i) == (nth 0%N i (size s0))%:R)  (* F.one_hot *)
  end).

End Values.

End JLayout.
