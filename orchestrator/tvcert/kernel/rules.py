"""The certified rules: how a placement fact flows through one op.

A *fact* says: on every rank, this local tensor is that rank's piece of logical expression
``expr`` under ``pl`` (one placement per mesh axis the program spans, in mesh order).
:func:`derive` is the only way to make a new fact from an op and its input facts.  It picks,
per mesh axis, the one rule whose premises match, checks that rule's side conditions on this
use (dims, divisibility, axis, block structure), and returns the conclusion together with
the rule ids it used.  Every rule id is bound to a Coq theorem in ``proofs/manifest.json``;
``RULES`` lists them with the statement each one relies on.

This module is part of the trusted base: the certificate checker replays certificates by
calling :func:`derive` again.  It must stay deterministic and free of search.

Multi-axis facts are handled one axis at a time (nested placements, mesh order = nesting
order, as in DTensor).  Rules that change the logical expression (not just the placement)
are allowed on at most one axis of a step, and only when no other axis of any operand is
Partial, which is the setting their theorems state.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Callable, Mapping, Sequence

from ..ops import REGISTRY
from ..ops.collectives import axes_of
from ..plan import Placement
from ..shapes import affine_in_rank, parse, rank_axes_in
from .broadcast import RULE as _BROADCAST_RULE, promote_broadcasts
from .expr import RESHAPE_LIKE, ExprError, Exprs
from .allreduce_mixed import RULE as _AR_MIXED_RULE, allreduce_mixed
from .allgather_layout import RULE as _AG_LAYOUT_RULE, STATEMENT as _AG_LAYOUT_STATEMENT, derive_allgather_other_dim
from .interleave import STATEMENTS as _INTERLEAVE_STATEMENTS, derive_concat as derive_interleaved_concat
from .interleave import derive_pad as derive_interleaved_pad, derive_slice as derive_interleaved_slice
from .interleave import derive_split as derive_interleaved_split
from .concat_groups import STATEMENTS as _GROUPED_STATEMENTS, derive_concat as derive_grouped_concat
from .concat_groups import derive_pad as derive_grouped_pad, derive_slice as derive_grouped_slice
from .concat_groups import derive_split as derive_grouped_split
from .int_range import RULE as _INT_RANGE_RULE, STATEMENT as _INT_RANGE_STATEMENT
from .pad_block import RULE as _PAD_BLOCK_RULE, STATEMENT as _PAD_BLOCK_STATEMENT, derive_pad_block, rank_dependent
from .slice_concat import RULE as _SLICE_CONCAT_RULE, STATEMENT as _SLICE_CONCAT_STATEMENT
from .scalar_factor import RULE as _SCALAR_FACTOR_RULE, STATEMENT as _SCALAR_FACTOR_STATEMENT
from .layout_map import RULE as _LAYOUT_MAP_RULE, STATEMENT as _LAYOUT_MAP_STATEMENT
from .int_range import abs_bound
from .reversed_blocks import STATEMENTS as _REVERSED_STATEMENTS, derive_slice as derive_reversed_slice
from .interleave_reshape import STATEMENTS as _IL_RESHAPE_STATEMENTS, derive_reshape as derive_interleave_reshape
from .microbatch import RULE as _MICROBATCH_RULE, STATEMENT as _MICROBATCH_STATEMENT
from .microbatch import derive_slice as derive_microbatch_slice, derive_split as derive_microbatch_split
from .microbatch import fused as microbatch_fused

R = Placement("R")


def S(d: int) -> Placement:
    return Placement("S", d)


def P(r: str = "sum") -> Placement:
    return Placement("P", reduce=r)


# rule id -> the statement it relies on (the Coq theorem's content, in words)
RULES: dict[str, str] = {
    "replicate_any": "any op applied to replicated operands gives the replicated result",
    "ew_unary_replicate": "a pointwise function of a replicated tensor is replicated",
    "ew_unary_shard": "a pointwise function commutes with Shard(d)",
    "ew_binary_replicate": "a pointwise function of replicated tensors is replicated",
    "ew_binary_shard": "a pointwise function of operands sharded on the same dim is sharded on it",
    "ew_binary_shard_broadcast": "a sharded operand combined pointwise with a replicated operand broadcast along the shard dim stays sharded",
    "partial_neg": "negation is linear: -Partial(E) = Partial(-E)",
    "partial_scale": "multiplying a Partial(sum|avg) by a replicated factor gives Partial of the product",
    "partial_div": "dividing a Partial(sum|avg) by a replicated value gives Partial of the quotient",
    "partial_add": "Partial(E) + Partial(F) = Partial(E + F)",
    "partial_sub": "Partial(E) - Partial(F) = Partial(E - F)",
    "partial_linear_map": "an additive map applied locally to Partial(sum|avg) gives Partial of the mapped value",
    "partial_plus_replicate_not_partial": "adding replicated F on every rank to Partial(sum) E gives Partial(sum) of E + p*F",
    "partial_avg_div_p_to_sum": "Partial(avg) E with every local divided by p is Partial(sum) E",
    "matmul_replicate": "matmul of replicated operands is replicated",
    "matmul_col_parallel": "Replicate x Shard(last) -> Shard(last)",
    "matmul_row_parallel": "Shard(contraction) x Shard(contraction) -> Partial(sum)",
    "matmul_batch_shard": "sharding a row / batch dim of one operand shards the same dim of the product",
    "matmul_partial_lhs": "Partial x Replicate -> Partial",
    "matmul_partial_rhs": "Replicate x Partial -> Partial",
    "einsum_shard_free_index": "sharding an output index in every operand that has it shards the output",
    "einsum_shard_contracted_index": "sharding a summed index in every operand that has it gives Partial(sum)",
    "einsum_partial_operand": "an einsum is linear in each operand: one Partial operand, others replicated -> Partial",
    "allreduce_sum_partial": "all_reduce(sum) of Partial(sum) is Replicate",
    "allreduce_avg_partial_avg": "all_reduce(avg) of Partial(avg) is Replicate",
    "allreduce_max_partial_max": "all_reduce(max) of Partial(max) is Replicate",
    "allreduce_avg_partial_sum": "all_reduce(avg) of Partial(sum) E is Replicate E/p",
    "allreduce_sum_replicate": "all_reduce(sum) of Replicate E is Replicate p*E",
    "allreduce_avg_replicate": "all_reduce(avg) of Replicate E is Replicate E",
    "allreduce_max_replicate": "all_reduce(max) of Replicate E is Replicate E",
    "allreduce_nested_axes": "an all_reduce over several axes equals all_reduces over each in turn",
    "allgather_shard": "all_gather along d of Shard(d) is Replicate",
    "reduce_scatter_partial": "reduce_scatter along d of Partial(sum) is Shard(d)",
    "reduce_scatter_replicate": "reduce_scatter(sum) along d of Replicate E is Shard(d) of p*E (avg: of E)",
    "reduce_scatter_avg_partial_sum": "reduce_scatter(avg) along d of Partial(sum) E is Shard(d) of E/p (a "
                                      "Partial(sum) on another axis is kept)",
    "reduce_scatter_avg_nested": "reduce_scatter(avg) over an inner axis of Partial(sum) E whose dim d an outer axis "
                                 "shards: Shard(d) over both, nested, of E/p (FSDP2 over a TP shard)",
    _AR_MIXED_RULE: "all_reduce(sum|avg) over two axes each Replicate, Partial(sum) or Partial(avg) (or over any "
                    "number of Replicate axes) is Replicate of E times prod(p over Replicate / Partial(avg) axes) "
                    "(sum) or E / prod(p over Partial(sum) axes) (avg)",
    "allreduce_avg_partial_sum_axes": "all_reduce(avg) over several axes of Partial(sum) on each is Replicate E / prod(p)",
    "partial_sum_as_avg": "an output fact Partial(sum) E reads as Partial(avg) E/p (and back), p > 0 (output matching)",
    "allgather_partial_sum": "summing an all_gather of Partial(sum) pieces over the gathered dim gives the sum of their "
                             "combination, Replicate over the gather's axis (pattern, kernel/gathered.py)",
    "allreduce_avg_partial_sum_nested": "all_reduce(avg) over one axis of Partial(sum) while other axes hold "
                                        "Partial(sum|avg) is Replicate there of E/p, the other Partials kept",
    "all_to_all_reshard": "all_to_all(split a, concat b) turns Shard(b) into Shard(a)",
    "broadcast_replicate": "broadcasting a replicated tensor leaves it replicated",
    "send_recv_preserves": "a received tensor equals the sent one, with its placement",
    "vocab_parallel_embedding": "masked local lookup of ids - rank*B in a vocab-sharded table (embedding rows, or the "
                                "target logit gathered per token) is Partial(sum) of the lookup",
    "ring_attention_online_softmax": "a ring_loop folding online-softmax merges over key blocks passed around the "
                                     "ring, divided by its normalizer, is softmax attention (pattern, kernel/ring.py)",
    "ring_attention_backward": "a ring_loop recomputing probabilities from the forward ring's final (m, l), accumulating dQ "
                               "locally and dK, dV travelling with their blocks, gives attention's gradients (pattern, "
                               "kernel/ring.py)",
    "ring_sigmoid_merge": "torch's unrolled ring: flash (out, lse) pairs of every key block merged as out - sigmoid(lse_b - "
                          "lse) * (out - out_b), lse - logsigmoid(lse - lse_b) give softmax attention (pattern, "
                          "kernel/ring_merge.py)",
    "ring_sigmoid_merge_backward": "torch's unrolled ring backward: P = exp(S - merged lse) per block, dQ summed locally "
                                   "and dK / dV travelling home hold every block's term once (pattern, "
                                   "kernel/ring_merge.py)",
    "ring_masked_merge": "torch's causal ring (per-rank programs): flash pairs of masked, skipped and partial key chunks "
                         "merged in sigmoid form, every rank's pairs the causal mask's exactly, give causal attention "
                         "(pattern, kernel/ring_causal.py)",
    "ring_masked_merge_backward": "torch's causal ring backward: masked probabilities from the merged lse, every "
                                  "gradient on its owner holding each causally visible chunk pair's term once "
                                  "(pattern, kernel/ring_causal.py)",
    "vocab_parallel_embedding_backward": "the masked gradient scattered at the local ids ids - rank*B is the rank's "
                                         "block of rows of the embedding gradient (Megatron's backward)",
    "vocab_parallel_embedding_clamped": "embedding at clamp(ids - rank*B, 0, B-1) in a vocab-sharded table times the "
                                        "in-block mask is Partial(sum) of the lookup (torchtitan's form)",
    "vocab_parallel_embedding_clamped_backward": "the gradient times the in-block mask scattered at clamp(ids - rank*B, "
                                                 "0, B-1) is the rank's block of rows of the embedding gradient "
                                                 "(torchtitan's backward)",
    "vocab_parallel_log_softmax": "(x - m) - log(all_reduce_sum(sum(exp(x - m)))) with m = all_reduce_max(amax(x)) on "
                                  "vocab-sharded logits is the rank's vocab block of log_softmax(x) (loss parallel)",
    "vocab_parallel_nll_loss": "the masked target pick at t' - rank*B (t' = where(l != ignore, l, 0)), all_reduce "
                               "summed, negated and zeroed at ignored labels is the logical nll "
                               "-sum(ls * one_hot(l)) (torchtitan's loss parallel)",
    "vocab_parallel_nll_backward": "(masked local one-hot of -1 at t' - rank*B + exp(ls)) * where(l != ignore, g, 0) "
                                   "is the rank's vocab block of log_softmax_backward(-one_hot(l) * g, ls)",
    _BROADCAST_RULE: "a replicated operand broadcast along a dim (its value independent of the index there) is, on "
                     "every rank, the block of its broadcast to the full size: Shard of the widened expression",
    "scale_common_factor": "an add / sub / concat of operands with different scalar factors is the first factor "
                           "times the op of the operands rescaled by their exact ratios (Normalise2.v)",
    "reduction_normal_form": "mean over dims = sum over them / element count; a sum of a sum = one sum over the union "
                             "of the dims; a scalar factor leaves a sum (NormaliseReductions.v)",
    "reduce_sum_sharded_dim": "summing over the sharded dim gives Partial(sum)",
    "reduce_mean_sharded_dim": "averaging over the evenly sharded dim gives Partial(avg)",
    "reduce_max_sharded_dim": "max over the sharded dim gives Partial(max)",
    "reduce_other_dim": "reducing over an unsharded dim keeps the shard",
    "softmax_other_dim": "softmax / log-softmax along an unsharded dim keeps the shard",
    "rowwise_shard": "an op computed independently for each index of a dim commutes with sharding that dim",
    "permute_shard": "permuting dims moves Shard(d) to Shard(perm^-1(d))",
    "reshape_shard_block": "a reshape keeps Shard when, on logical shapes, the sharded dim heads its row-major reshape group "
                           "(size-1 dims ahead add nothing) and the shard goes to the group's leading output dim",
    "slice_other_dim": "slicing an unsharded dim keeps the shard",
    "slice_block_to_shard": "rank r slicing block r of a replicated tensor yields Shard",
    "concat_other_dim": "concatenating along an unsharded dim keeps the shard",
    _PAD_BLOCK_RULE: _PAD_BLOCK_STATEMENT,
    _AG_LAYOUT_RULE: _AG_LAYOUT_STATEMENT,
    **_INTERLEAVE_STATEMENTS,
    **_GROUPED_STATEMENTS,
    _INT_RANGE_RULE: _INT_RANGE_STATEMENT,
    "scale_commutes_linear": "a scalar factor moves across any linear op",
    "layout_commutes_pointwise": "a reshape / permute of a pointwise op on same-shaped operands is the pointwise op of the reshaped operands; layouts compose",
    "elementwise_smt": "an elementwise region equal at one index for all inputs is equal everywhere (corrected shape reduction, identity dependency maps)",
    _SLICE_CONCAT_RULE: _SLICE_CONCAT_STATEMENT,
    _SCALAR_FACTOR_RULE: _SCALAR_FACTOR_STATEMENT,
    _LAYOUT_MAP_RULE: _LAYOUT_MAP_STATEMENT,
    **_REVERSED_STATEMENTS,
    **_IL_RESHAPE_STATEMENTS,
    _MICROBATCH_RULE: _MICROBATCH_STATEMENT,
    "congruence": "equal arguments give equal results",
    "stage_repeat": "a stage with the canonical form of a verified stage is verified, with its inputs substituted",
}


class RuleFailure(Exception):
    """No rule applies; the message says which premise or side condition failed."""


@dataclass(frozen=True)
class Fact:
    expr: int
    pl: tuple[Placement, ...]


@dataclass
class KCtx:
    """What rules may look at: the expression table, the program's axes and sizes, the dims."""

    exprs: Exprs
    axes: tuple[str, ...]
    sizes: Mapping[str, int]
    dims: Mapping[str, int]
    # (input shape, output shape) of the logical program's reshapes (setup.reshape_hints): which of several true
    # reshape facts to conclude, a completeness choice only (every candidate _reshape_targets admits is proved)
    hints: frozenset = frozenset()
    # int input name -> its values [lo, hi) (the plan contract, int_range.input_ranges): whether labels may hold
    # the ignore index, so whether a vocab-parallel loss pattern concludes the masked form (patterns._keeps_ignored)
    ranges: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    # logical expression id, or (head op, attrs, shape) -> the shapes the logical program reshapes that expression
    # (or one with that head) into (setup.logical_exprs): decides between true reshape readings before the shape-only
    # ``hints`` (one program can reshape a shape two ways: Megatron merges [sq, b, np, hn] into [sq, b*np, hn] for
    # q and k, and the context, a permute's result, into [sq, b, np*hn])
    reshape_into: Mapping[Any, frozenset] = field(default_factory=dict)
    # (sizes, groups) of the plan's concat_groups layouts: which parts a zero pad of a rank's part is read among
    # (concat_groups.derive_pad), a choice between true facts
    groupings: frozenset = frozenset()

    def reshaped_into(self, e: int) -> frozenset | None:
        """The shapes the logical program reshapes expression ``e`` into (else one with its head op), or None."""
        got = self.reshape_into.get(e)
        if got is None and self.reshape_into:
            x = self.exprs[e]
            got = self.reshape_into.get((x.op, x.attrs, tuple(x.shape)))
        return got

    def env0(self) -> dict[str, int]:
        """The dims with every rank coordinate at 0 (rank-independent attributes resolve the same anywhere)."""
        env = dict(self.dims)
        for a in self.axes:
            env[f"rank.{a}"] = 0
        return env


@dataclass
class Derivation:
    facts: list[Fact]
    rules: list[str]  # one rule id per axis (or per step for collectives), in axis order


def fmt_pl(axes: Sequence[str], pl: Sequence[Placement]) -> str:
    return "{" + ", ".join(f"{a}: {p}" for a, p in zip(axes, pl)) + "}"


def local_shape(shape: Sequence[int], axes: Sequence[str], pl: Sequence[Placement], sizes: Mapping[str, int]) -> tuple[int, ...] | None:
    s = list(shape)
    for a, p in zip(axes, pl):
        if p.kind in ("S", "Z"):
            if not 0 <= p.dim < len(s) or s[p.dim] % (sizes[a] * (2 if p.kind == "Z" else 1)):
                return None
            s[p.dim] //= sizes[a]
    return tuple(s)


def shard_factor(axes: Sequence[str], pl: Sequence[Placement], dim: int, sizes: Mapping[str, int]) -> int:
    f = 1
    for a, p in zip(axes, pl):
        if p.kind == "S" and p.dim == dim:
            f *= sizes[a]
    return f


def conclude(kc: KCtx, expr: int, per_axis: Sequence[tuple[Placement, str]], local: Sequence[int]) -> Derivation:
    """A one-output conclusion of a multi-op rule, checked against the op's local shape as :func:`derive`
    checks single-op rules."""
    pl = tuple(p for p, _ in per_axis)
    if local_shape(kc.exprs[expr].shape, kc.axes, pl, kc.sizes) != tuple(local):
        raise RuleFailure(f"the concluded placement does not give the op's local shape {list(local)}")
    return Derivation([Fact(expr, pl)], [r for _, r in per_axis])


# ====================================================================== entry point
def derive(kc: KCtx, op: str, ra: Mapping[str, Any], raw: Mapping[str, Any], facts: Sequence[Fact],
           local_out: Sequence[tuple[int, ...]]) -> Derivation:
    """Conclude the output fact(s) of ``op`` from the input facts, or raise RuleFailure.

    ``ra`` are the op's attributes resolved at full dims (rank coordinates 0), ``raw`` the
    attributes as written (for rank-dependent offsets), ``local_out`` the inferred local
    shapes of the outputs, against which every conclusion is checked.
    """
    spec = REGISTRY.get(op)
    if spec is None:
        raise RuleFailure(f"unknown op {op!r}")
    fam = _family(op, spec.category)
    if fam is None:
        raise RuleFailure(f"no rule covers op {op!r}")
    for f in facts:
        if len(f.pl) != len(kc.axes):
            raise RuleFailure("input fact does not cover the program's axes")
    _check_rank_free(op, raw, kc)
    zax = zigzag_axes(facts)
    try:
        d = derive_zigzag(kc, op, ra, raw, list(facts), fam, zax) if zax else fam(kc, op, ra, raw, list(facts))
    except ExprError as exc:
        raise RuleFailure(f"the concluded logical expression is ill-formed: {exc}") from None
    if len(d.facts) != len(local_out):
        raise RuleFailure(f"{op}: rule gives {len(d.facts)} outputs, the op has {len(local_out)}")
    _int_pieces_to_float(kc, op, facts, d.facts)
    for f, ls in zip(d.facts, local_out):
        e = kc.exprs[f.expr]
        want = local_shape(e.shape, kc.axes, f.pl, kc.sizes)
        if want != tuple(ls):
            raise RuleFailure(f"{op}: concluded {fmt_pl(kc.axes, f.pl)} of a {list(e.shape)} tensor, which gives local "
                              f"shape {list(want) if want else '(not divisible)'}, but the op's local shape is {list(ls)}")
    return d


def _int_pieces_to_float(kc: KCtx, op: str, facts: Sequence[Fact], out: Sequence[Fact]) -> None:
    """An int tensor's pieces (a Partial, or a shard reduced into one) read as reals must not wrap: int64 sums
    do (the pieces of sum(x) over x in [0, 2**62) each fit, their all_reduce wraps, so cast(all_reduce(s)) is not
    all_reduce(cast(s))).  A float conclusion Partial on an axis where an int operand is not Replicate needs the
    operand's values, times its element count and the mesh size, bounded inside int64 (int_range.abs_bound)."""
    from math import prod

    X = kc.exprs
    for fo in out:
        if X[fo.expr].dtype != "float":
            continue
        for ai, q in enumerate(fo.pl):
            if q.kind != "P":
                continue
            for f in facts:
                if X[f.expr].dtype != "int" or f.pl[ai].kind == "R":
                    continue
                b = abs_bound(X, f.expr, kc.ranges)
                total = 1
                for s in kc.sizes.values():
                    total *= s
                if b is None or b * max(1, prod(X[f.expr].shape)) * total >= 1 << 63:
                    raise RuleFailure(f"{op}: an int operand {f.pl[ai]} on axis {kc.axes[ai]!r} read as reals "
                                      f"({X.show(f.expr, 2)}) is not bounded inside int64, where int sums wrap")


def _check_rank_free(op: str, raw: Mapping[str, Any], kc: KCtx) -> None:
    """Only a slice's bounds and a pad's pads may depend on the rank (checked exactly by slice_block_to_shard and
    pad_block_to_partial); every other attribute must be rank-free at every nesting level (a literal
    ``[["rank.tp"]]`` is not rank 0's value)."""
    for k, v in raw.items():
        if op == "slice" and k in ("start", "end") or op == "pad" and k == "pads":  # checked exactly by their rules
            continue
        axes = rank_axes_in(v)
        if axes:
            raise RuleFailure(f"attribute {k!r} of {op} depends on the rank (rank.{sorted(axes)[0]}); no rule "
                              f"covers a rank-dependent {k!r}")


def _names(text: str) -> frozenset[str]:
    try:
        return parse(text).names()
    except ValueError:
        return frozenset()


def _family(op: str, category: str) -> Callable | None:
    if op in ("matmul",):
        return _matmul
    if op == "einsum":
        return _einsum
    if op in ("sum", "mean", "amax", "amin"):
        return _reduce
    if op in ROWWISE:
        return _rowwise
    if op in ("permute", "transpose") or op in RESHAPE_LIKE:
        return _layout
    if op in ("slice", "split"):
        return _slice
    if op == "concat":
        return _concat
    if op in ("const", "iota"):
        return _source
    if op == "embedding_backward":
        return _embedding_backward
    if category == "elementwise":
        return _elementwise
    if category == "collective":
        return _collective
    if op in ("gather", "index_select", "scatter_add", "index_add"):
        return _replicated_only
    return None


def _combine(kc: KCtx, per_axis: list[tuple[Placement, str]], expr: int) -> Derivation:
    return Derivation([Fact(expr, tuple(p for p, _ in per_axis))], [r for _, r in per_axis])


# ====================================================================== elementwise
def _elementwise(kc, op, ra, raw, facts):
    X = kc.exprs
    facts, promoted = promote_broadcasts(kc, facts) if len(facts) > 1 else (facts, [])  # kernel/broadcast.py
    shapes = [X[f.expr].shape for f in facts]
    n = max((len(s) for s in shapes), default=0)
    unary = len(facts) == 1
    spec = REGISTRY[op]
    base_expr = X.mk(op, ra, [f.expr for f in facts])
    out_shape = X[base_expr].shape
    per_axis: list[tuple[Placement, str]] = []
    change: tuple[int, str, int] | None = None  # (axis index, rule, new expr)
    for ai, a in enumerate(kc.axes):
        pls = [f.pl[ai] for f in facts]
        kinds = {p.kind for p in pls}
        if kinds == {"R"}:
            per_axis.append((R, "ew_unary_replicate" if unary else "ew_binary_replicate"))
            continue
        if "P" in kinds:
            res = _ew_partial(kc, op, ra, facts, ai, a, pls, spec)
            if len(res) == 3:
                if change is not None:
                    raise RuleFailure(f"{op}: expression-changing rules on two axes at once")
                change = (ai, res[1], res[2])
                per_axis.append((res[0], res[1]))
            else:
                per_axis.append(res)
            continue
        # Shard on this axis: all sharded operands agree on one output dim
        target = None
        for f, p, s in zip(facts, pls, shapes):
            if p.kind != "S":
                continue
            D = p.dim + (n - len(s))
            if target is None:
                target = D
            elif target != D:
                raise RuleFailure(f"{op} on axis {a!r}: operands are sharded on different dims ({fmt_pl(kc.axes, f.pl)})")
            if s[p.dim] != out_shape[D]:
                raise RuleFailure(f"{op} on axis {a!r}: a sharded operand is broadcast along its shard dim {p.dim}")
        assert target is not None
        bcast = False
        for p, s in zip(pls, shapes):
            if p.kind == "R":
                j = target - (n - len(s))
                if j >= 0 and s[j] != 1:
                    raise RuleFailure(f"{op} on axis {a!r}: operand sharded on dim {target} is combined with a replicated "
                                      f"operand that is not broadcast along that dim (size {s[j]}), so ranks would pair "
                                      f"mismatched blocks")
                bcast = True
        rule = "ew_unary_shard" if unary else ("ew_binary_shard_broadcast" if bcast else "ew_binary_shard")
        per_axis.append((S(target), rule))
    expr = base_expr
    if change is not None:
        ai = change[0]
        for aj, a in enumerate(kc.axes):
            if aj != ai and any(f.pl[aj].kind == "P" for f in facts):
                raise RuleFailure(f"{op}: {change[1]} on axis {kc.axes[ai]!r} needs no Partial operand on other axes")
        expr = change[2]
    d = _combine(kc, per_axis, expr)
    d.rules.extend(promoted)
    return d


def _ew_partial(kc, op, ra, facts, ai, a, pls, spec):
    """Partial operands on one axis: linear cases only."""
    X = kc.exprs
    p_axis = kc.sizes[a]
    parts = [i for i, p in enumerate(pls) if p.kind == "P"]
    reps = [i for i, p in enumerate(pls) if p.kind == "R"]
    if len(parts) + len(reps) != len(pls):
        raise RuleFailure(f"{op} on axis {a!r}: mixes Partial and Shard operands")
    red = {pls[i].reduce for i in parts}
    if len(red) != 1:
        raise RuleFailure(f"{op} on axis {a!r}: operands are Partial with different reductions")
    r = red.pop()
    if r == "max":
        raise RuleFailure(f"{op} on axis {a!r}: Partial(max) only passes through all_reduce(max)")
    if len(facts) == 1:
        # special: Partial(avg) divided by the axis size is Partial(sum) of the same value
        if op == "scale" and r == "avg" and Fraction(str(ra["value"])) == Fraction(1, p_axis):
            return (P("sum"), "partial_avg_div_p_to_sum", facts[0].expr)
        if 0 in spec.linear_in(ra):  # the op's own flag, proved in Rules/OpFlags.v
            rule = {"neg": "partial_neg", "scale": "partial_scale"}.get(op, "partial_linear_map")
            return (P(r), rule)
        raise RuleFailure(f"{op} is not linear, so it does not commute with Partial({r}) on axis {a!r}")
    if op in ("add", "sub") and len(parts) == 2 and facts[0].pl[ai] == facts[1].pl[ai]:
        if X[facts[0].expr].shape != X[facts[1].expr].shape:
            raise RuleFailure(f"{op} on axis {a!r}: Partial operands of different shapes")
        return (P(r), "partial_add" if op == "add" else "partial_sub")
    if op in ("add", "sub") and len(parts) == 1 and r == "sum":
        # sum over ranks of (E_r + F) = E + p*F: the expression changes
        i, j = parts[0], reps[0]
        pf = X.mk("scale", {"value": p_axis}, [facts[j].expr])
        args = [facts[i].expr, pf] if i == 0 else [pf, facts[i].expr]
        return (P("sum"), "partial_plus_replicate_not_partial", X.mk(op, ra, args))
    if op == "mul" and len(parts) == 1:
        return (P(r), "partial_scale")
    if op == "div" and parts == [0]:
        if r == "avg" and _is_const_value(X, facts[1].expr, p_axis):
            return (P("sum"), "partial_avg_div_p_to_sum", facts[0].expr)
        return (P(r), "partial_div")
    if op == "masked_fill" and parts == [0] and Fraction(str(ra["value"])) == 0 and 0 in spec.linear_in(ra):
        return (P(r), "partial_linear_map")
    if op == "where" and parts == [1] and _is_const_value(X, facts[2].expr, 0):
        return (P(r), "partial_linear_map")
    raise RuleFailure(f"{op} on axis {a!r}: no rule for operands {[str(p) for p in pls]} "
                      f"(only linear combinations of Partial values stay Partial)")


def _is_const_value(X: Exprs, e: int, v) -> bool:
    ex = X[e]
    if ex.op != "const" or ex.shape != ():
        return False
    val = ex.attr_dict().get("value")
    return isinstance(val, (int, float)) and Fraction(str(val)) == Fraction(v)


# ====================================================================== matmul / einsum
def _matmul(kc, op, ra, raw, facts):
    X = kc.exprs
    sa, sb = X[facts[0].expr].shape, X[facts[1].expr].shape
    expr = X.mk("matmul", {}, [facts[0].expr, facts[1].expr])
    if len(sa) < 2 or len(sb) < 2:
        return _matvec(kc, facts, sa, sb, expr)
    out = X[expr].shape
    nb = len(out) - 2
    per_axis = []
    for ai, a in enumerate(kc.axes):
        pa, pb = facts[0].pl[ai], facts[1].pl[ai]
        common = _matmul_replicated_or_partial(pa, pb)
        if common:
            per_axis.append(common)
        elif pa.kind == "S" and pb.kind == "S" and pa.dim == len(sa) - 1 and pb.dim == len(sb) - 2:
            per_axis.append((P("sum"), "matmul_row_parallel"))
        elif pa.kind == "S" and pb.kind == "R" and pa.dim == len(sa) - 2:
            per_axis.append((S(nb), "matmul_batch_shard"))
        elif pa.kind == "R" and pb.kind == "S" and pb.dim == len(sb) - 1:
            per_axis.append((S(nb + 1), "matmul_col_parallel"))
        elif "S" in (pa.kind, pb.kind) and all(p.kind in ("S", "R") for p in (pa, pb)):
            per_axis.append((_matmul_batch(a, sa, sb, pa, pb, nb), "matmul_batch_shard"))
        else:
            raise RuleFailure(f"matmul on axis {a!r}: no rule for {pa} x {pb}")
    return _combine(kc, per_axis, expr)


def _matmul_replicated_or_partial(pa: Placement, pb: Placement) -> tuple[Placement, str] | None:
    """The placement cases a matmul shares with every operand rank: R x R, P x R, R x P."""
    if pa.kind == "R" and pb.kind == "R":
        return R, "matmul_replicate"
    if pa.kind == "P" and pb.kind == "R" and pa.reduce in ("sum", "avg"):
        return pa, "matmul_partial_lhs"
    if pa.kind == "R" and pb.kind == "P" and pb.reduce in ("sum", "avg"):
        return pb, "matmul_partial_rhs"
    return None


def _matvec(kc, facts, sa, sb, expr):
    """matmul with a rank-1 operand: matrix-vector (sb rank 1) or vector-matrix (sa rank 1), no batch dims."""
    if len(sa) + len(sb) != 3:
        raise RuleFailure("matmul with rank-1 operands and batch dims: no rule")
    per_axis = []
    for ai, a in enumerate(kc.axes):
        pa, pb = facts[0].pl[ai], facts[1].pl[ai]
        common = _matmul_replicated_or_partial(pa, pb)
        if common:
            per_axis.append(common)
        elif len(sb) == 1 and pa == S(0) and pb.kind == "R":
            per_axis.append((S(0), "matmul_batch_shard"))
        elif len(sb) == 1 and pa == S(1) and pb == S(0):
            per_axis.append((P("sum"), "matmul_row_parallel"))
        elif len(sa) == 1 and pa.kind == "R" and pb == S(1):
            per_axis.append((S(0), "matmul_col_parallel"))
        elif len(sa) == 1 and pa == S(0) and pb == S(0):
            per_axis.append((P("sum"), "matmul_row_parallel"))
        else:
            raise RuleFailure(f"matmul on axis {a!r}: no rule for {pa} x {pb} with a rank-1 operand")
    return _combine(kc, per_axis, expr)


def _matmul_batch(a, sa, sb, pa, pb, nb):
    """Both operands sharded on the same (aligned) batch dim, or one sharded and the other broadcast."""
    def out_dim(p, s):
        if p.kind != "S" or p.dim >= len(s) - 2:
            return None
        return p.dim + (nb - (len(s) - 2))

    da, db = out_dim(pa, sa), out_dim(pb, sb)
    for p, d, s in ((pa, da, sa), (pb, db, sb)):
        if p.kind == "S" and d is None:
            raise RuleFailure(f"matmul on axis {a!r}: no rule for {pa} x {pb}")
    D = da if da is not None else db
    if da is not None and db is not None and da != db:
        raise RuleFailure(f"matmul on axis {a!r}: operands sharded on different batch dims")
    for p, d, s in ((pa, da, sa), (pb, db, sb)):
        if p.kind == "R":
            j = D - (nb - (len(s) - 2))
            if j >= 0 and s[j] != 1:
                raise RuleFailure(f"matmul on axis {a!r}: batch dim {D} is sharded in one operand and replicated "
                                  f"(not broadcast) in the other")
    return S(D)


def _einsum(kc, op, ra, raw, facts):
    X = kc.exprs
    from ..ops.linalg import parse_equation

    try:  # the op's own reading of the equation (an implicit output is the letters used once, sorted)
        ins, rhs, _ = parse_equation(ra["equation"], [X[f.expr].shape for f in facts])
    except ValueError as exc:
        raise RuleFailure(f"einsum: {exc}") from None
    expr = X.mk("einsum", ra, [f.expr for f in facts])
    per_axis = []
    for ai, a in enumerate(kc.axes):
        pls = [f.pl[ai] for f in facts]
        kinds = [p.kind for p in pls]
        if all(k == "R" for k in kinds):
            per_axis.append((R, "replicate_any"))
            continue
        if "P" in kinds:
            pi = [i for i, k in enumerate(kinds) if k == "P"]
            if len(pi) == 1 and all(k in ("R", "P") for k in kinds) and pls[pi[0]].reduce in ("sum", "avg"):
                per_axis.append((pls[pi[0]], "einsum_partial_operand"))
                continue
            raise RuleFailure(f"einsum on axis {a!r}: no rule for {[str(p) for p in pls]}")
        letters = {ins[i][p.dim] for i, p in enumerate(pls) if p.kind == "S"}
        if len(letters) != 1:
            raise RuleFailure(f"einsum on axis {a!r}: operands sharded on different indices {sorted(letters)}")
        l = letters.pop()
        for i, (term, p) in enumerate(zip(ins, pls)):
            if term.count(l) > 1:
                raise RuleFailure(f"einsum on axis {a!r}: sharded index {l!r} repeats in operand {i}")
            if l in term and not (p.kind == "S" and term[p.dim] == l):
                raise RuleFailure(f"einsum on axis {a!r}: operand {i} has index {l!r} but is not sharded on it")
            if l not in term and p.kind != "R":
                raise RuleFailure(f"einsum on axis {a!r}: operand {i} lacks index {l!r} but is not replicated")
        if l in rhs:
            per_axis.append((S(rhs.index(l)), "einsum_shard_free_index"))
        else:
            per_axis.append((P("sum"), "einsum_shard_contracted_index"))
    return _combine(kc, per_axis, expr)


def _embedding_backward(kc, op, ra, raw, facts):
    """grad [..., H], ids [...]: sum over tokens of one_hot(ids)^T grad."""
    X = kc.exprs
    expr = X.mk(op, ra, [f.expr for f in facts])
    rank = len(X[facts[0].expr].shape)
    per_axis = []
    for ai, a in enumerate(kc.axes):
        pg, pi = facts[0].pl[ai], facts[1].pl[ai]
        got = embedding_backward_axis(pg, pi, rank)
        if got is None:
            raise RuleFailure(f"embedding_backward on axis {a!r}: no rule for grad {pg}, ids {pi}")
        per_axis.append(got)
    return _combine(kc, per_axis, expr)


def embedding_backward_axis(pg: Placement, pi: Placement, grad_rank: int) -> tuple[Placement, str] | None:
    """One axis of ``embedding_backward(grad, ids)`` (a sum over tokens of one_hot(ids)ᵀ grad)."""
    if pg.kind == "R" and pi.kind == "R":
        return R, "replicate_any"
    if pg.kind == "P" and pi.kind == "R" and pg.reduce in ("sum", "avg"):
        return pg, "partial_linear_map"
    if pg.kind == "S" and pi.kind == "S" and pg.dim == pi.dim and pg.dim < grad_rank - 1:
        return P("sum"), "einsum_shard_contracted_index"
    if pg.kind == "Z" and pg == pi and pg.dim < grad_rank - 1:  # tokens in load-balanced chunks: still a sum
        return P("sum"), "zigzag_contraction"
    if pg.kind == "S" and pg.dim == grad_rank - 1 and pi.kind == "R":
        return S(1), "einsum_shard_free_index"
    return None


# ====================================================================== reductions
def _reduce(kc, op, ra, raw, facts):
    X = kc.exprs
    shape = X[facts[0].expr].shape
    dims = sorted({d % len(shape) for d in ra["dims"]}) if shape else []
    attrs = {"dims": tuple(dims), "keepdim": bool(ra["keepdim"])}
    expr = X.mk(op, attrs, [facts[0].expr])
    per_axis = []
    for ai, a in enumerate(kc.axes):
        p = facts[0].pl[ai]
        if p.kind == "R":
            per_axis.append((R, "replicate_any"))
        elif p.kind == "S" and p.dim not in dims:
            nd = p.dim if attrs["keepdim"] else p.dim - sum(1 for d in dims if d < p.dim)
            per_axis.append((S(nd), "reduce_other_dim"))
        elif p.kind == "S":
            r = {"sum": ("sum", "reduce_sum_sharded_dim"), "mean": ("avg", "reduce_mean_sharded_dim"),
                 "amax": ("max", "reduce_max_sharded_dim")}.get(op)
            if r is None:
                raise RuleFailure(f"{op} over the sharded dim {p.dim} on axis {a!r}: no rule")
            per_axis.append((P(r[0]), r[1]))
        elif p.kind == "P" and op in ("sum", "mean") and p.reduce in ("sum", "avg") and 0 in REGISTRY[op].linear_in(ra):
            per_axis.append((p, "partial_linear_map"))
        else:
            raise RuleFailure(f"{op} of {p} on axis {a!r}: no rule")
    return _combine(kc, per_axis, expr)


# ====================================================================== row-wise ops
def _rw_softmax(ra, shapes):
    d = ra["dim"] % len(shapes[0])
    # not linear: softmax(0) = 1/n <> 0 (OpFlags.softmax_not_additive), so no Partial passes through
    return [{i: i for i in range(len(shapes[0])) if i != d}] * len(shapes), "softmax_other_dim", []


def _rw_softmax_bwd(ra, shapes):
    d = ra["dim"] % len(shapes[0])
    m = {i: i for i in range(len(shapes[0])) if i != d}
    return [m, m], "softmax_other_dim", [0]  # linear in grad_out


def _rw_ce(ra, shapes):
    n = len(shapes[0])
    m = {i: i for i in range(n - 1)}
    return [m, m], "rowwise_shard", []


def _rw_ce_bwd(ra, shapes):
    n = len(shapes[1])
    m = {i: i for i in range(n - 1)}
    g = m if len(shapes[0]) == n - 1 else {}
    return [g, m, m], "rowwise_shard", []


def _rw_one_hot(ra, shapes):
    return [{i: i for i in range(len(shapes[0]))}], "rowwise_shard", []


def _rw_topk(ra, shapes):
    d = ra["dim"] % len(shapes[0])
    return [{i: i for i in range(len(shapes[0])) if i != d}], "rowwise_shard", []


def _rw_embedding(ra, shapes):
    nid = len(shapes[1])
    return [{1: nid}, {i: i for i in range(nid)}], "rowwise_shard", []


def _rw_index_select(ra, shapes):
    """index_select(T, d, idx): row i along d is T's row idx[i]; T's other dims pass through (T sharded on d: no)."""
    n = len(shapes[0])
    d = ra["dim"] % n
    return [{i: i for i in range(n) if i != d}, {0: d}], "rowwise_shard", []


def _rw_tri(ra, shapes):
    n = len(shapes[0])
    return [{i: i for i in range(n - 2)}], "rowwise_shard", [0]


def _rw_flip(ra, shapes):
    n = len(shapes[0])
    flipped = {d % n for d in ra["dims"]}
    return [{i: i for i in range(n) if i not in flipped}], "rowwise_shard", [0]


def _rw_pad(ra, shapes):
    pads = ra["pads"]
    n = len(shapes[0])
    m = {i: i for i in range(n) if 2 * i + 1 >= len(pads) or (pads[2 * i] == 0 and pads[2 * i + 1] == 0)}
    return [m], "rowwise_shard", [0] if ra.get("value", 0) == 0 else []


ROWWISE: dict[str, Callable] = {
    "softmax": _rw_softmax, "log_softmax": _rw_softmax,
    "softmax_backward": _rw_softmax_bwd, "log_softmax_backward": _rw_softmax_bwd,
    "cross_entropy": _rw_ce, "cross_entropy_backward": _rw_ce_bwd, "one_hot": _rw_one_hot,
    "topk": _rw_topk, "embedding": _rw_embedding, "index_select": _rw_index_select, "triu": _rw_tri, "tril": _rw_tri,
    "pad": _rw_pad, "flip": _rw_flip, "expand": None,
}


def _rowwise(kc, op, ra, raw, facts):
    """Ops computed independently along some dims: a shard on such a dim passes through."""
    X = kc.exprs
    shapes = [X[f.expr].shape for f in facts]
    if op == "expand":
        return _expand(kc, ra, facts[0])
    if op == "pad" and rank_dependent(raw):  # kernel/pad_block.py
        return derive_pad_block(kc, ra, raw, facts[0], RuleFailure)
    if op == "pad" and any(q.kind == "S" and (ra["pads"][2 * q.dim] or ra["pads"][2 * q.dim + 1]) for q in facts[0].pl):
        got = derive_grouped_pad(kc, ra, facts[0], RuleFailure)  # a part of a declared concat_groups layout
        return got or derive_interleaved_pad(kc, ra, facts[0], RuleFailure)  # a part's slice_backward (interleave.py)
    maps, rule, linear_in = ROWWISE[op](ra, shapes)
    linear_in = [i for i in linear_in if i in REGISTRY[op].linear_in(ra)]  # only where the op's flag (OpFlags.v) says so
    attrs = dict(ra)
    multi = REGISTRY[op].n_outputs(ra) > 1
    exprs = X.mk_multi(op, attrs, [f.expr for f in facts]) if multi else [X.mk(op, attrs, [f.expr for f in facts])]
    red = ra.get("reduction")
    per_axis = []
    for ai, a in enumerate(kc.axes):
        pls = [f.pl[ai] for f in facts]
        if all(p.kind == "R" for p in pls):
            per_axis.append((R, "replicate_any"))
            continue
        if any(p.kind == "P" for p in pls):
            pi = [i for i, p in enumerate(pls) if p.kind == "P"]
            if (len(pi) == 1 and pi[0] in linear_in and pls[pi[0]].reduce in ("sum", "avg")
                    and all(p.kind == "R" for i, p in enumerate(pls) if i != pi[0])):
                per_axis.append((pls[pi[0]], "partial_linear_map"))
                continue
            raise RuleFailure(f"{op} on axis {a!r}: no rule for {[str(p) for p in pls]}")
        outd = set()
        for i, p in enumerate(pls):
            if p.kind == "S":
                if p.dim not in maps[i]:
                    raise RuleFailure(f"{op} on axis {a!r}: operand {i} is sharded on dim {p.dim}, along which {op} "
                                      f"does not act independently")
                outd.add(maps[i][p.dim])
        if len(outd) != 1:
            raise RuleFailure(f"{op} on axis {a!r}: operands sharded on different dims")
        D = outd.pop()
        for i, p in enumerate(pls):
            inv = {v: k for k, v in maps[i].items()}
            if p.kind == "R" and D in inv and shapes[i][inv[D]] != 1:
                raise RuleFailure(f"{op} on axis {a!r}: operand {i} is replicated but has the sharded dim {D}")
        if op in ("cross_entropy",) and red in ("sum", "mean"):
            per_axis.append((P("sum" if red == "sum" else "avg"),
                             "reduce_sum_sharded_dim" if red == "sum" else "reduce_mean_sharded_dim"))
            continue
        if op == "cross_entropy_backward" and red == "mean":
            raise RuleFailure("cross_entropy_backward(mean) with sharded rows: each rank divides by its local count")
        per_axis.append((S(D), rule))
    facts_out = [Fact(e, tuple(p for p, _ in per_axis)) for e in exprs]
    return Derivation(facts_out, [r for _, r in per_axis])


def _expand(kc, ra, f):
    """expand keeps a shard on a dim it does not broadcast; the logical target keeps that dim's full size."""
    X = kc.exprs
    s = X[f.expr].shape
    loc = local_shape(s, kc.axes, f.pl, kc.sizes)
    out = list(ra["shape"])
    off = len(out) - len(s)
    full = list(out)
    for i in range(len(s)):
        if out[i + off] == -1 or (out[i + off] == loc[i] and loc[i] != s[i]):
            full[i + off] = s[i]
    expr = X.mk("expand", {"shape": tuple(full)}, [f.expr])
    per_axis = []
    for ai, a in enumerate(kc.axes):
        p = f.pl[ai]
        if p.kind == "R":
            per_axis.append((R, "replicate_any"))
        elif p.kind == "P" and p.reduce in ("sum", "avg") and 0 in REGISTRY["expand"].linear_in(ra):
            per_axis.append((p, "partial_linear_map"))
        elif p.kind == "S" and full[p.dim + off] == s[p.dim] and s[p.dim] != 1:
            per_axis.append((S(p.dim + off), "rowwise_shard"))
        else:
            raise RuleFailure(f"expand on axis {a!r}: no rule for {p}")
    return _combine(kc, per_axis, expr)


# ====================================================================== layout
def _layout(kc, op, ra, raw, facts):
    X = kc.exprs
    f = facts[0]
    shape = X[f.expr].shape
    if op in ("permute", "transpose"):
        if op == "transpose":
            perm = list(range(len(shape)))
            d0, d1 = ra["dim0"] % len(shape), ra["dim1"] % len(shape)
            perm[d0], perm[d1] = perm[d1], perm[d0]
        else:
            perm = [d % len(shape) for d in ra["dims"]]
        expr = X.mk("permute", {"dims": tuple(perm)}, [f.expr])
        per_axis = []
        for ai, a in enumerate(kc.axes):
            p = f.pl[ai]
            if p.kind == "S":
                per_axis.append((S(perm.index(p.dim)), "permute_shard"))
            elif p.kind == "P" and p.reduce in ("sum", "avg") and 0 in REGISTRY[op].linear_in(ra):  # additive (OpFlags.v)
                per_axis.append((p, "partial_linear_map"))
            elif p.kind == "R":
                per_axis.append((R, "replicate_any"))
            else:
                raise RuleFailure(f"{op} of {p} on axis {a!r}: no rule")
        return _combine(kc, per_axis, expr)
    # reshape family: the local op's output shape tells the intended logical shape
    spec = REGISTRY[op]
    local_in = local_shape(shape, kc.axes, f.pl, kc.sizes)
    local_out = spec.infer([local_in], ra)[0]
    if op not in ("unsqueeze", "squeeze", "flatten"):  # across an interleaved shard (Megatron's batch x heads)
        got = derive_interleave_reshape(kc, f, shape, local_in, local_out)
        if got is not None:
            return got
    sharded = sorted({p.dim for p in f.pl if p.kind == "S"})
    facs = {d: shard_factor(kc.axes, f.pl, d, kc.sizes) for d in sharded}
    if op in ("unsqueeze", "squeeze", "flatten"):
        try:
            intended = list(spec.infer([shape], ra)[0])
        except ValueError:
            intended = None
    else:
        intended = _intended_shape(kc, raw, shape)
    into = kc.reshaped_into(f.expr)  # what the logical program reshapes this expression into, else any of its shape
    mapping = _reshape_targets(shape, local_out, facs, intended,
                               frozenset((tuple(shape), t) for t in into) if into else kc.hints)
    out_logical = list(local_out)
    for d, e in mapping.items():
        out_logical[e] *= facs[d]
    expr = X.mk("reshape", {"shape": tuple(out_logical)}, [f.expr])
    per_axis = []
    for ai, a in enumerate(kc.axes):
        p = f.pl[ai]
        if p.kind == "S":
            per_axis.append((S(mapping[p.dim]), "reshape_shard_block"))
        elif p.kind == "P" and p.reduce in ("sum", "avg") and 0 in REGISTRY[op].linear_in(ra):  # additive (OpFlags.v)
            per_axis.append((p, "partial_linear_map"))
        elif p.kind == "R":
            per_axis.append((R, "replicate_any"))
        else:
            raise RuleFailure(f"{op} of {p} on axis {a!r}: no rule")
    return _combine(kc, per_axis, expr)


def _intended_shape(kc, raw, logical_in) -> list[int] | None:
    """The reshape target as written, evaluated with every mesh axis at size 1 (the logical view).

    Used only to choose among assignments that are all valid; None when it cannot be read.
    """
    shp = raw.get("shape")
    if not isinstance(shp, list):
        return None
    env = dict(kc.dims)
    for a in kc.axes:
        env[a] = 1
    try:
        vals = [v if isinstance(v, int) else parse(v).eval(env) for v in shp]
    except (ValueError, KeyError):
        return None
    if vals.count(-1) == 1:
        known = _prod([v for v in vals if v != -1])
        if known:
            vals[vals.index(-1)] = _prod(logical_in) // known
    return vals


def _reshape_targets(logical_in, local_out, facs: dict[int, int], intended=None, hints=frozenset()) -> dict[int, int]:
    """Which output dim carries each sharded input dim (reshape_shard_block's side condition).

    A candidate assignment scales those output dims back by their shard factors; on the
    logical shapes, each sharded dim must head its reshape group (after size-1 dims) and its
    output dim must head the same group's outputs, so shards are the same contiguous blocks
    on both sides (LayoutReal.reshape_shard_rowmajor).  Everything is read on logical shapes.

    Several assignments can qualify only when size-1 local dims precede the target in its
    group: local [.., 1, HD] from a shard holding one head is logical [.., p, HD] Shard on the
    heads, or [.., 1, p*HD] Shard on the last dim (and local [S, 1, 3H/p] from [S, 3H/p] is
    [S, 1, 3H], batch 1, or [S, p, 3H/p]).  Each is a true fact (the theorem holds for every
    qualifying one), so the choice decides completeness, never soundness: the written logical
    target when the attrs give one (``intended``), else a reshape the logical program does of this
    expression, or from this shape (``hints``, KCtx.reshaped_into), else the earliest output dims (a
    size-1 local dim heading the group is the rank's 1/p of it: one head, one sample, one row).
    """
    import itertools

    ds = sorted(facs)
    found = []
    for es in itertools.product(range(len(local_out)), repeat=len(ds)):
        if len(set(es)) != len(es):
            continue
        cand = list(local_out)
        for d, e in zip(ds, es):
            cand[e] *= facs[d]
        if _prod(cand) != _prod(logical_in):
            continue
        groups = _groups(list(logical_in), cand)
        ok = True
        for d, e in zip(ds, es):
            ga, gb = next(((ga, gb) for ga, gb in groups if d in ga), ([], []))
            lead_in = [x for x in ga if logical_in[x] != 1 or x == d]  # size-1 dims ahead add nothing (flat_unit)
            lead_out = [y for y in gb if cand[y] != 1 or y == e]
            if not (lead_in and lead_in[0] == d and lead_out and lead_out[0] == e):
                ok = False
                break
        if ok:
            found.append((dict(zip(ds, es)), cand))
    if len(found) > 1 and intended is not None and any(x[1] == list(intended) for x in found):
        found = [x for x in found if x[1] == list(intended)]
    if len(found) > 1 and any((tuple(logical_in), tuple(x[1])) in hints for x in found):
        found = [x for x in found if (tuple(logical_in), tuple(x[1])) in hints]
    if found:
        found = [min(found, key=lambda x: tuple(x[0][d] for d in ds))]
    if len(found) != 1:
        raise RuleFailure(f"reshape of a tensor sharded on dims {ds}: a sharded dim does not lead its reshape group "
                          f"with the group's leading output dim keeping the shard, so shards are not contiguous blocks "
                          f"of the result")
    return found[0][0]


def _prod(xs) -> int:
    out = 1
    for x in xs:
        out *= x
    return out


def _groups(a: Sequence[int], b: Sequence[int]) -> list[tuple[list[int], list[int]]]:
    """Split two shapes of equal element count into minimal groups with equal products."""
    out = []
    i = j = 0
    while i < len(a) or j < len(b):
        ga, gb = [], []
        pa = pb = 1
        if i < len(a):
            ga.append(i); pa *= a[i]; i += 1
        if j < len(b):
            gb.append(j); pb *= b[j]; j += 1
        while pa != pb:
            if pa < pb and i < len(a):
                ga.append(i); pa *= a[i]; i += 1
            elif pb < pa and j < len(b):
                gb.append(j); pb *= b[j]; j += 1
            else:
                break
        out.append((ga, gb))
    return out


def _slice(kc, op, ra, raw, facts):
    X = kc.exprs
    f = facts[0]
    shape = X[f.expr].shape
    dim = ra["dim"] % len(shape)
    if op == "slice":
        rank_axes = set(rank_axes_in([raw.get("start"), raw.get("end")]))
        if rank_axes:
            return _slice_block(kc, ra, raw, f, dim, rank_axes)
    multi = op == "split"
    if any(q.kind == "S" and q.dim == dim for q in f.pl):  # a fused tensor's parts (kernel/interleave.py)
        got = (derive_grouped_split if multi else derive_grouped_slice)(kc, ra, f, dim, RuleFailure)  # unequal parts
        if got is not None:  # (kernel/concat_groups.py)
            return got
        if not microbatch_fused(kc, f, dim):  # no fused tensor: micro-batches of a data-parallel shard (microbatch.py)
            return (derive_microbatch_split if multi else derive_microbatch_slice)(kc, ra, f, dim, RuleFailure)
        return (derive_interleaved_split if multi else derive_interleaved_slice)(kc, ra, f, dim, RuleFailure)
    exprs = X.mk_multi(op, ra, [f.expr]) if multi else [X.mk(op, ra, [f.expr])]
    per_axis = []
    for ai, a in enumerate(kc.axes):
        p = f.pl[ai]
        if p.kind == "S" and p.dim != dim:
            per_axis.append((p, "slice_other_dim"))
        elif p.kind == "P" and p.reduce in ("sum", "avg") and 0 in REGISTRY[op].linear_in(ra):  # additive (OpFlags.v)
            per_axis.append((p, "partial_linear_map"))
        elif p.kind == "R":
            per_axis.append((R, "replicate_any"))
        else:
            raise RuleFailure(f"{op} along dim {dim}, which is sharded on axis {a!r}: no rule")
    return Derivation([Fact(e, tuple(p for p, _ in per_axis)) for e in exprs], [r for _, r in per_axis])


def _slice_block(kc, ra, raw, f, dim, rank_axes):
    """slice_block_to_shard: start = rank.a * L, end = start + L, L = size / p, from a replicated tensor."""
    if len(rank_axes) != 1:
        raise RuleFailure(f"slice bounds depend on several rank axes {sorted(rank_axes)}")
    a = rank_axes.pop()
    if a not in kc.axes:
        raise RuleFailure(f"slice bounds depend on rank.{a}, but the program does not span axis {a!r}")
    ai = kc.axes.index(a)
    size = kc.exprs[f.expr].shape[dim]
    p = kc.sizes[a]
    if ra["step"] != 1:
        raise RuleFailure("rank-dependent slice with step != 1")
    for aj in range(ai + 1, len(kc.axes)):
        q = f.pl[aj]
        if q.kind == "S" and q.dim == dim:
            raise RuleFailure(f"slice_block_to_shard over {a!r}: dim {dim} is already sharded on the inner axis {kc.axes[aj]!r}")
    outer = shard_factor(kc.axes[:ai], f.pl[:ai], dim, kc.sizes)
    local = size // outer
    env = dict(kc.dims)
    for b in kc.axes:
        env[f"rank.{b}"] = 0
    st = affine_in_rank(raw["start"], env, a)
    en = affine_in_rank(raw.get("end"), env, a) if isinstance(raw.get("end"), (str, int)) else None
    if st is None or en is None:
        raise RuleFailure("slice bounds are not affine in the rank coordinate")
    if local % p:
        raise RuleFailure(f"slice_block_to_shard: local dim {dim} of size {local} is not divisible by axis {a!r} of size {p}")
    L = local // p
    if st == ((p - 1) * L, -L) and en == (p * L, -L) and p > 1:  # block p-1-r (kernel/reversed_blocks.py)
        return derive_reversed_slice(kc, f, dim, ai, outer, RuleFailure)
    if st != (0, L) or en != (L, L):
        raise RuleFailure(f"slice_block_to_shard: rank r takes [{st[0]}+{st[1]}r, {en[0]}+{en[1]}r) of dim {dim}, "
                          f"not block r = [{L}r, {L}r+{L}) of a size-{local} dim split {p} ways")
    if f.pl[ai].kind != "R":
        raise RuleFailure(f"slice_block_to_shard needs a replicated input on axis {a!r}, got {f.pl[ai]}")
    for aj, b in enumerate(kc.axes):
        q = f.pl[aj]
        if aj != ai and q.kind == "P":
            raise RuleFailure(f"slice_block_to_shard: axis {b!r} holds {q} on the same tensor")
    per_axis = [(f.pl[aj], "replicate_any" if f.pl[aj].kind == "R" else "slice_other_dim") for aj in range(len(kc.axes))]
    per_axis[ai] = (S(dim), "slice_block_to_shard")
    return _combine(kc, per_axis, f.expr)


def _concat(kc, op, ra, raw, facts):
    X = kc.exprs
    shape = X[facts[0].expr].shape
    dim = ra["dim"] % len(shape)
    if any(q.kind == "S" and q.dim == dim for f in facts for q in f.pl):  # parts of a fused tensor (interleave.py)
        if len({X[f.expr].shape for f in facts}) > 1:  # parts of unequal sizes (kernel/concat_groups.py)
            return derive_grouped_concat(kc, facts, dim, RuleFailure)
        return derive_interleaved_concat(kc, facts, dim, RuleFailure)
    expr = X.mk("concat", {"dim": dim}, [f.expr for f in facts])
    per_axis = []
    for ai, a in enumerate(kc.axes):
        pls = {f.pl[ai] for f in facts}
        if len(pls) != 1:
            raise RuleFailure(f"concat on axis {a!r}: operands placed differently {sorted(map(str, pls))}")
        p = pls.pop()
        if p.kind == "R":
            per_axis.append((R, "replicate_any"))
        elif p.kind == "S" and p.dim != dim:
            per_axis.append((p, "concat_other_dim"))
        elif p.kind == "P" and p.reduce in ("sum", "avg") and REGISTRY[op].linear:  # jointly additive (OpFlags.concat_linear)
            per_axis.append((p, "partial_linear_map"))
        else:
            raise RuleFailure(f"concat along dim {dim} of operands placed {p} on axis {a!r}: no rule")
    return _combine(kc, per_axis, expr)


def _source(kc, op, ra, raw, facts):
    return _combine(kc, [(R, "replicate_any") for _ in kc.axes], kc.exprs.mk(op, ra, []))


def _replicated_only(kc, op, ra, raw, facts):
    for ai, a in enumerate(kc.axes):
        if any(f.pl[ai].kind != "R" for f in facts):
            raise RuleFailure(f"{op} on axis {a!r}: only replicated operands are covered")
    return _combine(kc, [(R, "replicate_any") for _ in kc.axes], kc.exprs.mk(op, ra, [f.expr for f in facts]))


# ====================================================================== collectives
def _reduce_scatter_avg(kc, f, i, d, pl, shape):
    """reduce_scatter(avg) over axis ``i`` of Partial(sum) E: Shard(d) of E / p.  Every other axis is Replicate,
    shards another dim, or holds Partial(sum) (kept: the averaging is linear); Partial(avg|max) there is refused.
    An axis outside ``i`` may shard d too (rule reduce_scatter_avg_nested: the scatter splits each of its blocks,
    FSDP2's ``_StridedShard`` of a TP shard); an inner axis sharding d is refused."""
    for j, q in enumerate(pl):
        if j != i and q.kind == "P" and q.reduce != "sum":
            raise RuleFailure(f"reduce_scatter(avg) of Partial(sum) with {q} on {kc.axes[j]!r}: no rule")
        if j != i and q.kind not in ("R", "P", "S"):
            raise RuleFailure(f"reduce_scatter(avg) of Partial(sum) with {q} on {kc.axes[j]!r}: no rule")
    if any(pl[j].kind == "S" and pl[j].dim == d for j in range(i + 1, len(pl))):
        raise RuleFailure(f"reduce_scatter over {kc.axes[i]!r}: dim {d} is already sharded on an inner axis")
    p = kc.sizes[kc.axes[i]]
    outer = shard_factor(kc.axes, pl, d, kc.sizes)  # axes outside i sharding d: FSDP2 over TP's Shard(d)
    if shape[d] % (p * outer):
        raise RuleFailure(f"reduce_scatter: dim {d} of size {shape[d]} does not split evenly")
    pl = list(pl)
    pl[i] = S(d)
    c = kc.exprs.mk("const", {"value": p, "shape": (), "dtype": "float"}, [])
    return Derivation([Fact(kc.exprs.mk("div", {}, [f.expr, c]), tuple(pl))],
                      ["reduce_scatter_avg_partial_sum"] + (["reduce_scatter_avg_nested"] if outer > 1 else []))


def _collective(kc, op, ra, raw, facts):
    f = facts[0]
    axes = list(axes_of(ra))
    for a in axes:
        if a not in kc.axes:
            raise RuleFailure(f"{op} over axis {a!r}, which this program does not span")
    if len(set(axes)) != len(axes):
        # the group is the set of ranks the axes span (an axis named twice is still p ranks), while the
        # multi-axis rules multiply one factor per name: p^2 for p (found by tests/test_redteam_new_rules.py)
        raise RuleFailure(f"{op} names an axis twice in {axes}: no rule")
    idx = [kc.axes.index(a) for a in axes]
    pl = list(f.pl)
    rules: list[str] = []
    shape = kc.exprs[f.expr].shape
    if op in ("all_reduce", "reduce_scatter"):
        _no_mixed_partial_inside(kc, op, pl, idx)
        if ra.get("reduce") == "avg" and kc.exprs[f.expr].dtype == "int":
            # the sum of int64 pieces wraps (4 * 2**62 is 0), so its mean is not E, and a mean of ints is no int
            raise RuleFailure(f"{op}(avg) of an int tensor: no rule (int64 sums wrap; the mean of ints is no int)")
    if op == "all_reduce":
        r = ra["reduce"]
        want = {"sum": "sum", "avg": "avg", "max": "max"}[r]
        if all(pl[i].kind == "R" for i in idx) and len(idx) == 1:
            # every rank of the group holds E: sum gives p*E, avg and max give E
            if r == "sum":  # p in E's dtype: an int p * E is int64 arithmetic (it wraps), not a real product
                c = kc.exprs.mk("const", {"value": kc.sizes[axes[0]], "shape": (), "dtype": kc.exprs[f.expr].dtype}, [])
                return Derivation([Fact(kc.exprs.mk("mul", {}, [f.expr, c]), tuple(pl))], ["allreduce_sum_replicate"])
            return Derivation([Fact(f.expr, tuple(pl))], [f"allreduce_{r}_replicate"])
        if r == "avg" and len(idx) > 1 and all(pl[i] == P("sum") for i in idx):
            # mean over the flattened group of partial sums on every axis of it: E / prod(p) (CollectivesReal.v)
            if any(q.kind == "P" for j, q in enumerate(pl) if j not in idx):
                raise RuleFailure("all_reduce(avg) over several axes of Partial(sum) with Partial on another axis: no rule")
            n = 1
            for i in idx:
                pl[i] = R
                n *= kc.sizes[kc.axes[i]]
            c = kc.exprs.mk("const", {"value": n, "shape": (), "dtype": "float"}, [])
            return Derivation([Fact(kc.exprs.mk("div", {}, [f.expr, c]), tuple(pl))], ["allreduce_avg_partial_sum_axes"])
        if r == "avg" and len(idx) == 1 and pl[idx[0]] == P("sum"):
            # mean over ranks of partial sums: (1/p) * E, the expression changes
            others = [q for j, q in enumerate(pl) if j != idx[0] and q.kind == "P"]
            if any(q.reduce not in ("sum", "avg") for q in others):
                raise RuleFailure("all_reduce(avg) of Partial(sum) with Partial(max) on another axis: no rule")
            pl[idx[0]] = R
            c = kc.exprs.mk("const", {"value": kc.sizes[axes[0]], "shape": (), "dtype": "float"}, [])
            e = kc.exprs.mk("div", {}, [f.expr, c])
            # other axes Partial(sum|avg): the averaging is linear, they stay (CollectivesReal.v)
            return Derivation([Fact(e, tuple(pl))], ["allreduce_avg_partial_sum_nested" if others
                                                     else "allreduce_avg_partial_sum"])
        mixed = None if all(pl[i] == P(want) for i in idx) else allreduce_mixed(kc, r, idx, pl, f.expr)
        if mixed is not None:  # Replicate / Partial(sum) / Partial(avg) mixed over the group (kernel/allreduce_mixed.py)
            return Derivation([Fact(*mixed)], [_AR_MIXED_RULE])
        for i in idx:
            if pl[i].kind != "P" or pl[i].reduce != want:
                raise RuleFailure(f"all_reduce({r}) over {kc.axes[i]!r} needs Partial({want}) there, got {pl[i]}")
            pl[i] = R
        rules.append({"sum": "allreduce_sum_partial", "avg": "allreduce_avg_partial_avg",
                      "max": "allreduce_max_partial_max"}[r])
        if len(idx) > 1:
            rules.append("allreduce_nested_axes")
    elif len(idx) != 1:
        raise RuleFailure(f"{op} over several axes at once: no rule")
    elif op == "all_gather":
        i = idx[0]
        d = ra["dim"] % len(shape)
        if pl[i].kind == "S" and pl[i].dim != d:  # blocks stacked along another dim: a layout (kernel/allgather_layout.py)
            e, pls = derive_allgather_other_dim(kc, f, i, d, RuleFailure)
            return Derivation([Fact(e, pls)], [_AG_LAYOUT_RULE])
        if pl[i] != S(d):
            raise RuleFailure(f"all_gather along dim {d} over {axes[0]!r} needs Shard({d}) there, got {pl[i]}")
        if any(pl[j].kind == "S" and pl[j].dim == d for j in range(i + 1, len(pl))):
            raise RuleFailure(f"all_gather over {axes[0]!r}: dim {d} is also sharded on an inner axis")
        pl[i] = R
        rules.append("allgather_shard")
    elif op == "reduce_scatter":
        i = idx[0]
        d = ra["dim"] % len(shape)
        if pl[i] == R and ra["reduce"] in ("sum", "avg"):
            # every rank of the group holds E: rank r keeps block r of p*E (sum) or of E (avg) (CollectivesReal.v)
            if any(pl[j].kind == "S" and pl[j].dim == d for j in range(i + 1, len(pl))):
                raise RuleFailure(f"reduce_scatter over {axes[0]!r}: dim {d} is already sharded on an inner axis")
            if any(q.kind == "P" for q in pl):
                raise RuleFailure(f"reduce_scatter of a replicated tensor with Partial on another axis: no rule")
            if shape[d] % (kc.sizes[axes[0]] * shard_factor(kc.axes, pl, d, kc.sizes)):
                raise RuleFailure(f"reduce_scatter: dim {d} of size {shape[d]} does not split evenly")
            pl[i] = S(d)
            e = f.expr
            if ra["reduce"] == "sum":  # p in E's dtype (an int sum wraps)
                c = kc.exprs.mk("const", {"value": kc.sizes[axes[0]], "shape": (), "dtype": kc.exprs[f.expr].dtype}, [])
                e = kc.exprs.mk("mul", {}, [f.expr, c])
            return Derivation([Fact(e, tuple(pl))], ["reduce_scatter_replicate"])
        if ra["reduce"] == "avg" and pl[i] == P("sum"):  # FSDP2's gradient reduce-scatter (FsdpCollectives.v)
            return _reduce_scatter_avg(kc, f, i, d, pl, shape)
        if ra["reduce"] != "sum" or pl[i] != P("sum"):
            raise RuleFailure(f"reduce_scatter({ra['reduce']}) over {axes[0]!r} needs sum of Partial(sum), got {pl[i]}")
        if any(pl[j].kind == "S" and pl[j].dim == d for j in range(i + 1, len(pl))):
            raise RuleFailure(f"reduce_scatter over {axes[0]!r}: dim {d} is already sharded on an inner axis")
        if shape[d] % (kc.sizes[axes[0]] * shard_factor(kc.axes, pl, d, kc.sizes)):
            raise RuleFailure(f"reduce_scatter: dim {d} of size {shape[d]} does not split evenly")
        pl[i] = S(d)
        rules.append("reduce_scatter_partial")
    elif op == "all_to_all":
        i = idx[0]
        sd, cd = ra["split_dim"] % len(shape), ra["concat_dim"] % len(shape)
        if pl[i] != S(cd) or sd == cd:
            raise RuleFailure(f"all_to_all(split {sd}, concat {cd}) over {axes[0]!r} needs Shard({cd}) there, got {pl[i]}")
        for j, q in enumerate(pl):
            if j == i:
                continue
            # an outer axis may shard the concat dim (the all_to_all then acts inside its block: nested shards);
            # anything else touching these dims, or a Partial, is not covered
            nested_ok = q.kind == "S" and q.dim == cd and j < i
            if q.kind == "P" or (q.kind == "S" and q.dim in (sd, cd) and not nested_ok):
                raise RuleFailure(f"all_to_all over {axes[0]!r}: {kc.axes[j]!r} holds {q}, which this rule does not cover "
                                  f"(only an outer axis sharding the concat dim {cd} is)")
        pl[i] = S(sd)
        rules.append("all_to_all_reshard")
    elif op == "broadcast":
        i = idx[0]
        if pl[i].kind != "R":
            raise RuleFailure(f"broadcast over {axes[0]!r} of a {pl[i]} tensor: only replicated tensors are covered")
        rules.append("broadcast_replicate")
    else:
        raise RuleFailure(f"no rule for collective {op!r}")
    return Derivation([Fact(f.expr, tuple(pl))], rules)


def _no_mixed_partial_inside(kc, op, pl, idx) -> None:
    """Reducing over an axis combines the pieces that the axes nested inside it hold; if one of those is Partial
    with a reduction that does not commute with this one (max against sum / avg), the result is not the
    combination of the inner partials: E = sum_e max_d L[e,d] but all_reduce(sum over e) leaves
    max_d sum_e L[e,d] (found by tvcert.conform)."""
    kinds = {i: ("max" if pl[i].reduce == "max" else "lin") for i in idx if pl[i].kind == "P"}
    for i, k in kinds.items():
        for j in range(i + 1, len(pl)):
            q = pl[j]
            if j not in idx and q.kind == "P" and ("max" if q.reduce == "max" else "lin") != k:
                raise RuleFailure(f"{op} over {kc.axes[i]!r} of {pl[i]} while the inner axis {kc.axes[j]!r} holds {q}: "
                                  f"the two reductions do not commute")


from .zigzag import RULES as _ZIGZAG_RULES, derive_zigzag, zigzag_axes  # noqa: E402  (zigzag reuses these rules)

RULES.update(_ZIGZAG_RULES)

from .prefix_scan import STATEMENTS as _PREFIX_SCAN_STATEMENTS  # noqa: E402  (a pattern)

RULES.update(_PREFIX_SCAN_STATEMENTS)

from .zigzag_index import RULE as _ZZ_INDEX_RULE, STATEMENT as _ZZ_INDEX_STATEMENT  # noqa: E402  (a pattern)

RULES[_ZZ_INDEX_RULE] = _ZZ_INDEX_STATEMENT

from .iota_block import RULE as _IOTA_BLOCK_RULE, STATEMENT as _IOTA_BLOCK_STATEMENT  # noqa: E402  (a pattern)

RULES[_IOTA_BLOCK_RULE] = _IOTA_BLOCK_STATEMENT

from .vocab_pick import STATEMENTS as _VOCAB_PICK_STATEMENTS  # noqa: E402  (a pattern)

RULES.update(_VOCAB_PICK_STATEMENTS)
