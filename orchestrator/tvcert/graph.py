"""The tensor IR: a graph of op nodes over named tensors, in the spirit of torch.fx.

A :class:`Graph` is an ordered list of :class:`Node` s (each computes one or more named
tensors from named inputs) plus declared inputs and outputs.  Shapes are written as dim
expressions; :meth:`Graph.infer` binds them to numbers and runs every op's shape inference,
leaving results in ``node.meta`` the way fx analyses leave theirs.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from .ops import REGISTRY, AttrError, ShapeError, resolve_attrs
from .ops.collectives import axes_of
from .shapes import DimEnv, DimError, dim_value, rank_axes_in


def int_bounds(t: "TensorDecl", env: Mapping[str, int], path: str = "range") -> tuple[int, int]:
    """An int input's values lie in [lo, hi): its ``range`` is R (lo = 0, hi = R) or [lo, hi].  A negative lo
    admits padded labels (-100); values in (lo, 0) other than the ignore index are labels torch refuses, which
    the IR maps to some value on both sides alike, so a proof over [lo, hi) implies the claim on valid data.
    GraphError (bad input) unless lo < hi are integers (or dim expressions that bind to integers)."""
    r = t.range
    if isinstance(r, (list, tuple)):
        if len(r) != 2:
            raise GraphError(path, f"input {t.name!r}: range must be R or [lo, hi], got {r!r}")
        parts = list(r)
    else:
        parts = [0, r]
    try:
        lo, hi = (dim_value(x, env) for x in parts)
    except (DimError, ValueError, TypeError) as exc:
        raise GraphError(path, f"input {t.name!r}: range {r!r}: {exc}") from None
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in (lo, hi)) or lo >= hi:
        raise GraphError(path, f"input {t.name!r}: range {r!r} must give integers lo < hi (values in [lo, hi))")
    return int(lo), int(hi)


class GraphError(ValueError):
    """A graph is malformed; ``path`` locates the problem in the plan JSON."""

    def __init__(self, path: str, msg: str):
        super().__init__(f"{path}: {msg}")
        self.path = path
        self.msg = msg


@dataclass
class TensorDecl:
    name: str
    shape: list  # dim expressions
    dtype: str = "float"
    range: Any = None  # for int inputs: R (values in [0, R)) or [lo, hi] (values in [lo, hi)); see int_bounds


@dataclass
class Node:
    op: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)
    src: str | None = None
    path: str = ""  # JSON path of this node, for messages
    layer: str | None = None  # label of the repeated unit (layer) this op belongs to
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.outputs[0] if self.outputs else f"<{self.op}@{self.path}>"

    @property
    def spec(self):
        return REGISTRY[self.op]

    def __repr__(self) -> str:
        outs = ", ".join(self.outputs) or "()"
        return f"{outs} = {self.op}({', '.join(self.inputs)}){' ' + str(self.attrs) if self.attrs else ''}"


@dataclass
class Graph:
    name: str
    inputs: list[TensorDecl]
    nodes: list[Node]
    outputs: list[str]
    path: str = "$"
    stage: dict[str, int] = field(default_factory=dict)  # mesh coordinates this program runs on
    _producer_index: dict | None = field(default=None, repr=False, compare=False)

    def producers(self) -> dict[str, Node]:
        return {o: n for n in self.nodes for o in n.outputs}

    def producer_index(self) -> dict[str, tuple[int, Node]]:
        """tensor -> (index, node) of the op producing it; built once (graphs are not edited after loading)."""
        if self._producer_index is None:
            self._producer_index = {o: (i, n) for i, n in enumerate(self.nodes) for o in n.outputs}
        return self._producer_index

    def input_names(self) -> list[str]:
        return [t.name for t in self.inputs]

    def __str__(self) -> str:
        lines = [f"graph {self.name}({', '.join(t.name for t in self.inputs)}):"]
        lines += [f"  {n!r}" for n in self.nodes]
        lines.append(f"  return {', '.join(self.outputs)}")
        return "\n".join(lines)

    # ------------------------------------------------------------ structure checks
    def check_structure(self) -> None:
        """Names defined once, used after definition (so no cycles), ops known, arity right."""
        defined: dict[str, str] = {}
        for i, t in enumerate(self.inputs):
            p = f"{self.path}.inputs[{i}]"
            if t.name in defined:
                raise GraphError(p, f"tensor {t.name!r} is defined twice (first at {defined[t.name]})")
            defined[t.name] = p
        later = {o: n.path for n in self.nodes for o in n.outputs}
        for n in self.nodes:
            spec = REGISTRY.get(n.op)
            if spec is None:
                raise GraphError(f"{n.path}.op", f"unknown op {n.op!r}")
            lo, hi = spec.arity
            if len(n.inputs) < lo or (hi is not None and len(n.inputs) > hi):
                want = f"{lo}" if lo == hi else f"{lo}..{hi if hi is not None else 'n'}"
                raise GraphError(f"{n.path}.inputs", f"op {n.op!r} takes {want} inputs, got {len(n.inputs)}")
            for j, x in enumerate(n.inputs):
                if x not in defined:
                    if x in later:
                        cycle = self._cycle_through(x)
                        what = (f"a cycle: {' -> '.join(cycle)}" if cycle else "nodes out of order")
                        raise GraphError(f"{n.path}.inputs[{j}]",
                                         f"tensor {x!r} is used before it is defined at {later[x]} ({what})")
                    raise GraphError(f"{n.path}.inputs[{j}]", f"undefined tensor {x!r}")
            for o in n.outputs:
                if o in defined:
                    raise GraphError(n.path, f"tensor {o!r} is defined twice (first at {defined[o]})")
                defined[o] = n.path
        for j, o in enumerate(self.outputs):
            if o not in defined:
                raise GraphError(f"{self.path}.outputs[{j}]", f"undefined tensor {o!r}")

    def _cycle_through(self, tensor: str) -> list[str] | None:
        """The dependency cycle containing ``tensor``, if there is one (for the error message)."""
        import networkx as nx

        g = nx.DiGraph()
        for n in self.nodes:
            for o in n.outputs:
                for x in n.inputs:
                    g.add_edge(x, o)
        try:
            edges = nx.find_cycle(g, source=tensor)
        except (nx.NetworkXNoCycle, nx.NodeNotFound):
            return None
        return [u for u, _ in edges] + [edges[0][0]]

    # ------------------------------------------------------------ shape inference
    def infer(self, env: Mapping[str, int], mesh: Mapping[str, int] | None = None,
              key: str = "shape") -> dict[str, tuple[tuple[int, ...], str]]:
        """Bind dims, infer every tensor's (shape, dtype); store in ``node.meta[key]``.

        ``env`` maps dim names (and ``rank.<axis>`` coordinates) to ints; ``mesh`` gives the
        axis sizes that collectives need.
        """
        mesh = mesh or {}
        env = DimEnv(env)
        types: dict[str, tuple[tuple[int, ...], str]] = {}
        for i, t in enumerate(self.inputs):
            p = f"{self.path}.inputs[{i}].shape"
            if rank_axes_in(t.shape):  # (the loader would read it at rank 0 on every rank)
                raise GraphError(p, f"input {t.name!r} has a shape that mentions a rank coordinate; an SPMD program's "
                                    f"inputs have one shape on every rank")
            types[t.name] = (bind_shape(t.shape, env, p), t.dtype)
            if t.range is not None:
                int_bounds(t, env, f"{self.path}.inputs[{i}].range")
        for n in self.nodes:
            spec = REGISTRY[n.op]
            try:
                ra = resolve_attrs(spec, n.attrs, env)
            except AttrError as exc:
                raise GraphError(f"{n.path}.attrs", str(exc)) from None
            if spec.category == "collective":
                axes = axes_of(ra)
                if len(set(axes)) != len(axes):
                    raise GraphError(f"{n.path}.attrs.axis", f"collective names a mesh axis twice ({list(axes)}); its group "
                                                             f"is a set of axes, each named once")
                p = 1
                for a in axes:
                    if a not in mesh:
                        raise GraphError(f"{n.path}.attrs.axis",
                                         f"collective over axis {a!r}, which the mesh does not have (mesh axes: {sorted(mesh)})")
                    p *= mesh[a]
                ra["_p"] = p
            if spec.category == "p2p" and ra["axis"] not in mesh:
                raise GraphError(f"{n.path}.attrs.axis",
                                 f"{n.op} over axis {ra['axis']!r}, which the mesh does not have (mesh axes: {sorted(mesh)})")
            in_types = [types[x] for x in n.inputs]
            try:
                if n.op == "ring_loop":
                    shapes, dtypes = _infer_loop(n, ra, in_types, env, mesh, key)
                else:
                    shapes = spec.infer([t[0] for t in in_types], ra)
                    dtypes = spec.out_dtypes([t[1] for t in in_types], ra)
            except GraphError:
                raise
            except (ShapeError, AttrError, DimError, ValueError) as exc:
                desc = ", ".join(f"{x}:{list(t[0])}" for x, t in zip(n.inputs, in_types))
                raise GraphError(n.path, f"op {n.op!r} on ({desc}): {exc}") from None
            if len(shapes) != len(n.outputs):
                raise GraphError(f"{n.path}", f"op {n.op!r} produces {len(shapes)} outputs but the node names {len(n.outputs)}")
            for o, s, dt in zip(n.outputs, shapes, dtypes):
                if any(d < 0 for d in s):
                    raise GraphError(n.path, f"op {n.op!r} infers a negative size {list(s)} for {o!r}")
                types[o] = (tuple(s), dt)
            n.meta[key] = [types[o] for o in n.outputs]
            n.meta["attrs"] = ra
        return types


def loop_body(n: Node) -> Graph:
    """The body graph of a ring_loop node (parsed by the plan loader)."""
    body = n.meta.get("body")
    if body is None:
        raise GraphError(f"{n.path}.attrs.body", "ring_loop body was not parsed (build plans with tvcert.plan.load_plan)")
    return body


def _infer_loop(n: Node, ra, in_types, env, mesh, key):
    """A loop's outputs have its carried inputs' types, and one body step must preserve them."""
    body = loop_body(n)
    k = ra["carry"]
    if ra["axis"] not in mesh:
        raise GraphError(f"{n.path}.attrs.axis", f"ring_loop over axis {ra['axis']!r}, which the mesh does not have "
                                                 f"(mesh axes: {sorted(mesh)})")
    if not 1 <= k <= len(in_types):
        raise GraphError(f"{n.path}.attrs.carry", f"carry must be between 1 and the {len(in_types)} inputs, got {k}")
    if len(body.inputs) != len(in_types):
        raise GraphError(f"{n.path}.attrs.body.inputs", f"the body declares {len(body.inputs)} inputs, the loop passes "
                                                        f"{len(in_types)}")
    if len(body.outputs) != k:
        raise GraphError(f"{n.path}.attrs.body.outputs", f"the body returns {len(body.outputs)} values for {k} carried")
    for t, (shape, dt) in zip(body.inputs, in_types):
        t.shape, t.dtype = list(shape), dt
    n.meta[f"body_inputs@{key}"] = list(in_types)  # the body inputs' types at these dims (t.shape is the last run)
    btypes = body.infer(env, mesh, key)
    for j, (o, want) in enumerate(zip(body.outputs, in_types)):
        if btypes[o] != want:
            raise GraphError(f"{n.path}.attrs.body.outputs[{j}]",
                             f"one step turns carried {body.inputs[j].name!r} {list(want[0])} ({want[1]}) into {o!r} "
                             f"{list(btypes[o][0])} ({btypes[o][1]}): the carried type must not change")
    return [t[0] for t in in_types[:k]], [t[1] for t in in_types[:k]]


def bind_shape(shape: list, env: Mapping[str, int], path: str) -> tuple[int, ...]:
    if not isinstance(shape, list):
        raise GraphError(path, f"a shape must be a list, got {type(shape).__name__}")
    out = []
    for j, d in enumerate(shape):
        try:
            v = dim_value(d, env)
        except DimError as exc:
            raise GraphError(f"{path}[{j}]", str(exc)) from None
        if v < 0:
            raise GraphError(f"{path}[{j}]", f"size {d!r} evaluates to {v}, which is negative")
        out.append(v)
    return tuple(out)
