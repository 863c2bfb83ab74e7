"""A multi-op rule: all_gather of partial statistics followed by a sum over the gathered dim.

Code that combines per-rank statistics (loss sums, token counts, squared norms) often gathers them instead of
all_reduce-ing them: ``torch.stack(per_rank).sum(0)`` after ``all_gather_tensor(local.unsqueeze(0), 0)``.
The gathered tensor itself is no piece of a logical tensor (it is the list of the ranks' pieces), so no fact
is concluded at the all_gather; the sum over the gathered dim is the combination of the pieces
(``CollectivesReal.allgather_partial_sum``): with the gathered input Partial(sum) E over the gather's axis,
``sum(all_gather_d(L), D)`` with ``d`` in ``D`` is ``sum(E, D)`` on every rank of that axis.

Side conditions, checked here: the all_gather runs over exactly one axis of the program, with rank-free
attributes, on a tensor whose fact is Partial(sum) on that axis; the sum's dims include the gathered dim; on
every other axis the gathered tensor is Replicate or Shard (which then reduces as ``_reduce`` does: a shard of
a summed dim gives Partial(sum), another shard moves with the removed dims); no Partial on another axis.
"""
from __future__ import annotations

from typing import Mapping

from ..graph import Graph
from .producers import ProducersBefore, out_shape, producer, rank_free_attrs, single_axis
from .rules import Fact, KCtx, P, R, RuleFailure, S, conclude

RULE = "allgather_partial_sum"


def allgather_partial_sum(g: Graph, index: int, facts: Mapping[str, Fact], kc: KCtx):
    """Match ``sum(all_gather(t), dims)`` ending at node ``index``; returns the derivation and matched nodes."""
    n = g.nodes[index]
    if n.op != "sum" or len(n.inputs) != 1:
        raise RuleFailure("not a sum")
    producers = ProducersBefore(g, index)
    got = producers.get(n.inputs[0])
    ag = producer(producers, n.inputs[0])
    if ag is None or ag.op != "all_gather" or got is None:
        raise RuleFailure("the summed tensor is not an all_gather")
    a = single_axis(ag)
    if a is None or a not in kc.axes:
        raise RuleFailure("the all_gather does not run over exactly one axis of the program")
    tf = facts.get(ag.inputs[0])
    if tf is None:
        raise RuleFailure("the gathered tensor has no fact")
    ai = kc.axes.index(a)
    if tf.pl[ai] != P("sum"):
        raise RuleFailure(f"the gathered tensor is {tf.pl[ai]} over {a!r}, not Partial(sum)")
    X = kc.exprs
    shape = X[tf.expr].shape
    if not shape:
        raise RuleFailure("all_gather of a rank-0 tensor")
    gat = rank_free_attrs(ag, kc)
    sat = rank_free_attrs(n, kc)
    d = gat["dim"] % len(shape)
    dims = sorted({x % len(shape) for x in sat["dims"]})
    keep = bool(sat.get("keepdim", False))
    if d not in dims:
        raise RuleFailure(f"the sum over dims {dims} does not include the gathered dim {d}")
    expr = X.mk("sum", {"dims": tuple(dims), "keepdim": keep}, [tf.expr])
    per_axis = []
    for j, (b, q) in enumerate(zip(kc.axes, tf.pl)):
        if j == ai:
            per_axis.append((R, RULE))
        elif q.kind == "R":
            per_axis.append((R, "replicate_any"))
        elif q.kind == "S" and q.dim in dims:
            per_axis.append((P("sum"), "reduce_sum_sharded_dim"))
        elif q.kind == "S":
            per_axis.append((S(q.dim if keep else q.dim - sum(1 for x in dims if x < q.dim)), "reduce_other_dim"))
        else:
            raise RuleFailure(f"the gathered tensor is {q} on axis {b!r}: only Replicate or Shard are covered")
    return conclude(kc, expr, per_axis, out_shape(n)), [got[0], index]
