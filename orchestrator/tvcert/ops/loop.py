"""``ring_loop``: a loop whose trip count is the size of a mesh axis.

Ring algorithms (ring attention, ring all-reduce) repeat one step once per rank of an axis,
passing blocks to the next rank with ``ppermute``.  Unrolled, a plan would grow with the axis
size; as a loop it does not.  The body is a small graph (attribute ``body``)::

    {"inputs": [carried..., invariant...], "nodes": [...], "outputs": [new carried...]}

The first ``carry`` loop inputs are carried (the body's outputs replace them after each step);
the rest are read-only.  The loop's outputs are the carried values after ``size(axis)`` steps.
The body may use collectives (its ranks run in lock step) but not send/recv or nested loops.
Shape inference, the interpreter and the engine treat the body through :func:`loop_body`,
which the plan loader fills in.
"""
from __future__ import annotations

from .base import Attr, OpSpec, register


@register
class RingLoop(OpSpec):
    name = "ring_loop"
    category = "loop"
    arity = (1, None)
    attrs = {"axis": Attr("str"), "carry": Attr("int"), "body": Attr("any")}
    doc = "repeat the body graph size(axis) times, threading the first `carry` inputs through it"

    def n_outputs(self, attrs):
        c = attrs.get("carry", 1)
        return c if isinstance(c, int) and c >= 1 else 1

    def infer(self, shapes, attrs):  # the graph infers loops (it needs the body); see Graph.infer
        raise ValueError("ring_loop shapes come from its body (Graph.infer)")

    def out_dtypes(self, in_dtypes, attrs):
        return list(in_dtypes[: attrs["carry"]])
