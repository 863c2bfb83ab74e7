"""The plan format (``plan.json``): schema, loader and semantic validation.

A plan pairs a logical (single-device) graph with parallel SPMD program(s) over a named
device mesh, and says where every logical input lives on the mesh and how every logical
output is read back, in DTensor's vocabulary (Replicate, Shard(d), Partial(sum|avg|max)),
optionally after a layout transform (reshape / permute / pad ...) of the logical tensor.

The schema is a pydantic model (``tvcert schema`` prints its JSON Schema); everything the
schema cannot say (names defined once, shapes agree, shard dims divide) is checked by
:func:`load_plan`, which raises :class:`PlanError` naming the JSON path and the problem.
"""
from __future__ import annotations

import hashlib
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Mapping, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError

from .graph import Graph, GraphError, Node, TensorDecl, int_bounds
from .kernel.concat_groups import layout_spec
from .kernel.index_domain import IndexDomainError, check_index_domains
from .ops import REGISTRY, AttrError, resolve_attrs
from .shapes import MAX_DIM, DimError, dim_value, rank_axes_in

PLAN_VERSION = 1
MAX_PLAN_BYTES = 256 * 1024 * 1024
MAX_RANKS_FOR_RUN = 4096


class PlanError(ValueError):
    """Bad input: ``path`` is a JSON path into the plan."""

    def __init__(self, path: str, msg: str):
        super().__init__(f"{path}: {msg}")
        self.path = path
        self.msg = msg


class IndexRangePlanError(PlanError):
    """A declared int range admits an index outside a table the logical graph reads (kernel/index_domain.py);
    the tracer reports it as UNKNOWN, a plan is bad input."""


# ============================================================== JSON schema (pydantic)
DimT = Union[int, str]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TensorSpec(_Strict):
    name: str = Field(description="tensor name, unique in its graph")
    shape: list[DimT] = Field(description="dims: integers or expressions over named dims")
    dtype: Literal["float", "int"] = "float"
    range: Optional[Union[DimT, list[DimT]]] = Field(
        None, description="int inputs: R (values in [0, R)) or [lo, hi] (values in [lo, hi); lo < 0 admits padding)")


class NodeSpec(_Strict):
    op: str = Field(description="op kind, e.g. matmul, add, all_reduce")
    name: Optional[str] = Field(None, description="output tensor (single-output ops)")
    outputs: Optional[list[str]] = Field(None, description="output tensors (multi-output ops)")
    inputs: list[str] = Field(default_factory=list)
    attrs: dict[str, Any] = Field(default_factory=dict)
    src: Optional[str] = Field(None, description="source location, e.g. model.py:42")
    module: Optional[str] = Field(None, description="path of the module that ran the op, e.g. "
                                                    "model.layers.0.mlp.down_proj (traced plans; for reports)")
    layer: Optional[str] = Field(None, description="repeated unit this op belongs to (e.g. 'layer3'): runs of ops "
                                                   "with one label are stages, derived once per canonical form")


class GraphSpec(_Strict):
    inputs: list[TensorSpec]
    nodes: list[NodeSpec]
    outputs: list[str]


class LoopBodySpec(_Strict):
    inputs: list[str] = Field(description="body inputs: the loop's carried inputs, then its read-only ones")
    nodes: list[NodeSpec]
    outputs: list[str] = Field(description="the carried values after one step, in the order of the carried inputs")


class ProgramSpec(GraphSpec):
    name: str = "main"
    stage: dict[str, int] = Field(default_factory=dict, description="mesh coordinates this program runs on, e.g. {'pp': 0}")


class LayoutStep(_Strict):
    op: str = Field(description="a layout op: reshape, view, permute, transpose, pad, flatten, squeeze, unsqueeze, slice, "
                               "concat_groups (kernel/concat_groups.py)")
    attrs: dict[str, Any] = Field(default_factory=dict)


class PlacementSpec(_Strict):
    local: str = Field(description="the rank-local tensor in the parallel program")
    program: Optional[str] = Field(None, description="program holding it (default: the only one)")
    placement: dict[str, str] = Field(default_factory=dict, description="per mesh axis: Replicate | Shard(d) | ZigzagShard(d) (load-balanced: rank r holds chunks r and 2p-1-r of 2p) | Partial(sum|avg|max); missing axes are Replicate")
    layout: list[LayoutStep] = Field(default_factory=list, description="layout transform applied to the logical tensor before placement")


class PlanSpec(_Strict):
    tvcert_plan: StrictInt = Field(description="plan format version (1)")
    name: str
    description: Optional[str] = None
    dims: dict[str, StrictInt] = Field(description="values of the named dims (full size)")
    run_dims: Optional[dict[str, StrictInt]] = Field(None, description="small values used to execute the plan (defaults to dims)")
    mesh: Union[list[tuple[str, DimT]], dict[str, DimT]] = Field(
        description="mesh axes in nesting order (outermost first) with sizes: [[axis, size], ...], or an object "
                    "whose key order is the nesting order")
    logical: GraphSpec
    parallel: list[ProgramSpec]
    inputs: dict[str, PlacementSpec] = Field(description="logical input -> where it lives on the mesh")
    outputs: dict[str, PlacementSpec] = Field(description="logical output -> where it is read back")


def json_schema() -> dict:
    s = PlanSpec.model_json_schema()
    s["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    s["$id"] = "https://tvcert.dev/schema/plan-v1.json"
    return s


# ============================================================== placements
@dataclass(frozen=True)
class Placement:
    """One mesh axis's placement.  ``Z`` is the load-balanced ("zig-zag") shard used for causal context
    parallelism: dim ``dim`` is cut into 2p chunks and rank r holds chunk r followed by chunk 2p-1-r
    (Coq: Zigzag.shard_zigzag).  It is a kind of its own so that no Shard rule applies to it by accident:
    the kernel admits it only through the rules proved for it (kernel/zigzag.py)."""

    kind: str  # "R" | "S" | "P" | "Z"
    dim: int = -1  # for S and Z
    reduce: str = ""  # for P: sum | avg | max

    def __str__(self) -> str:
        if self.kind == "R":
            return "Replicate"
        if self.kind == "S":
            return f"Shard({self.dim})"
        if self.kind == "Z":
            return f"ZigzagShard({self.dim})"
        return f"Partial({self.reduce})"


REPLICATE = Placement("R")
_PLACEMENT_RE = re.compile(r"^\s*(Replicate|R|Shard|S|Partial|P|ZigzagShard|Z)\s*(?:\(\s*([A-Za-z0-9_\-]*)\s*\))?\s*$")


def parse_placement(text: str) -> Placement:
    m = _PLACEMENT_RE.match(text) if isinstance(text, str) else None
    if not m:
        raise ValueError(f"placement {text!r} is not Replicate, Shard(d), ZigzagShard(d) or Partial(sum|avg|max)")
    kind, arg = m.group(1)[0], m.group(2)
    if kind == "R":
        if arg:
            raise ValueError(f"Replicate takes no argument, got {text!r}")
        return REPLICATE
    if kind == "S":
        if arg is None or not re.fullmatch(r"-?\d+", arg):
            raise ValueError(f"Shard needs an integer dim, got {text!r}")
        return Placement("S", int(arg))
    if kind == "Z":
        if arg is None or not re.fullmatch(r"-?\d+", arg):
            raise ValueError(f"ZigzagShard needs an integer dim, got {text!r}")
        return Placement("Z", int(arg))
    arg = arg or "sum"
    if arg not in ("sum", "avg", "max"):
        raise ValueError(f"Partial reduction must be sum, avg or max, got {arg!r}")
    return Placement("P", reduce=arg)


LAYOUT_OPS = {"reshape", "view", "permute", "transpose", "pad", "flatten", "squeeze", "unsqueeze", "slice",
              "concat_groups"}  # the last a macro over registered ops: kernel/concat_groups.py


@dataclass
class Binding:
    """A logical tensor bound to a rank-local tensor of one program."""

    logical: str
    program: str
    local: str
    placement: dict[str, Placement]  # every mesh axis the program spans -> placement
    layout: list[tuple[str, dict]]  # (op, raw attrs)
    path: str


# ============================================================== loaded plan
@dataclass
class Plan:
    name: str
    dims: dict[str, int]
    run_dims: dict[str, int]
    mesh_spec: dict[str, Any]
    logical: Graph
    programs: dict[str, Graph]
    inputs: dict[str, Binding]
    outputs: dict[str, Binding]
    raw: dict = field(repr=False, default_factory=dict)
    description: str | None = None
    checked: set = field(default_factory=set)  # dims instantiations already shape-checked
    p2p: dict = field(default_factory=dict)  # (program, recv node) -> (program, send node): see pair_messages

    def mesh(self, dims: Mapping[str, int] | None = None) -> dict[str, int]:
        d = self.dims if dims is None else dims
        return {a: dim_value(s, d) for a, s in self.mesh_spec.items()}

    def program_axes(self, prog: str) -> list[str]:
        """Mesh axes a program's ranks vary over (those not fixed by its stage)."""
        g = self.programs[prog]
        return [a for a in self.mesh_spec if a not in g.stage]

    def digest(self) -> str:
        return plan_digest(self.raw)


def canonical_json(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def normalize_raw(raw: dict) -> dict:
    """The plan with its mesh as an ordered list of [axis, size] pairs.

    Mesh order is meaning (nesting order of shards), and JSON object key order is not, so the
    canonical form (hashed, embedded in certificates) spells the mesh as a list.
    """
    mesh = raw.get("mesh")
    if isinstance(mesh, dict):
        raw = dict(raw)
        raw["mesh"] = [[a, s] for a, s in mesh.items()]
    return raw


def plan_digest(raw: dict) -> str:
    return "sha256:" + hashlib.sha256(canonical_json(normalize_raw(raw))).hexdigest()


def _pyd_path(loc: tuple) -> str:
    out = "$"
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def read_json_file(path: str | Path, what: str = "plan", limit: int = MAX_PLAN_BYTES) -> str:
    """The text of a plan or certificate file, read without ever blocking or reading without bound.

    Only a regular file (or ``-``: stdin) is read: a FIFO, a device (``/dev/zero``), a directory or a socket is
    refused, and the size limit is checked before reading and enforced while reading (a file that grows)."""
    import os
    import stat as stat_

    if str(path) == "-":
        data = sys.stdin.buffer.read(limit + 1)
    else:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # opening a FIFO does not wait for a writer
        except OSError as exc:
            raise PlanError("$", f"cannot read {what} {_short(path)}: {exc.strerror or exc}") from None
        try:
            st = os.fstat(fd)
            if not stat_.S_ISREG(st.st_mode):
                kind = ("a directory" if stat_.S_ISDIR(st.st_mode) else "a FIFO" if stat_.S_ISFIFO(st.st_mode) else
                        "a device" if stat_.S_ISCHR(st.st_mode) or stat_.S_ISBLK(st.st_mode) else
                        "a socket" if stat_.S_ISSOCK(st.st_mode) else "not a regular file")
                raise PlanError("$", f"{_short(path)} is {kind}: a {what} must be a regular file (or - for stdin)")
            if st.st_size > limit:
                raise PlanError("$", f"{_short(path)} is {st.st_size} bytes, larger than the {limit}-byte limit")
            with os.fdopen(fd, "rb", closefd=False) as f:
                data = f.read(limit + 1)
        except OSError as exc:
            raise PlanError("$", f"cannot read {what} {_short(path)}: {exc.strerror or exc}") from None
        finally:
            os.close(fd)
    if len(data) > limit:
        raise PlanError("$", f"{_short(path)} is larger than the {limit}-byte limit")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PlanError("$", f"{_short(path)} is not UTF-8 text (byte {exc.start}: {exc.reason})") from None


def read_plan_json(path: str | Path) -> dict:
    return parse_plan_text(read_json_file(path, "plan"))


MAX_INT = 2 ** 63  # every integer of a plan or certificate lies in (-2^63, 2^63): sizes, indices, attrs
MAX_MESSAGE = 900  # characters of a bad value quoted in a message
MAX_JSON_DEPTH = 20000  # nesting of a plan or certificate document (the Python recursion limit while parsing)


def _short(v: Any, n: int = 120) -> str:
    """``v`` for a message: at most ``n`` characters, lone surrogates escaped (a message must print)."""
    s = v if isinstance(v, str) else str(v)
    if len(s) > n:
        s = s[:n] + f"... ({len(s)} characters)"
    return s.encode("utf-8", "backslashreplace").decode("utf-8")


class _BadLiteral:
    """Parse-time stand-in for a literal tvcert refuses (found afterwards by :func:`_find_bad_literal`)."""

    def __init__(self, why: str):
        self.why = why


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _find_bad_literal(raw: Any, surrogates: bool) -> tuple[str, str] | None:
    """(JSON path, problem) of the first refused literal in document order, or None."""
    stack = [(raw, "$")]
    while stack:
        v, p = stack.pop()
        if isinstance(v, _BadLiteral):
            return p, v.why
        if isinstance(v, str):
            if surrogates and any("\ud800" <= ch <= "\udfff" for ch in v):
                return p, f"the string {_short(v, 60)!r} holds a lone UTF-16 surrogate, which is not a character"
        elif isinstance(v, dict):
            items = []
            for k, x in v.items():
                if surrogates and any("\ud800" <= ch <= "\udfff" for ch in k):
                    return p, f"the key {_short(k, 60)!r} holds a lone UTF-16 surrogate, which is not a character"
                items.append((x, f"{p}.{_short(k, 60)}"))
            stack.extend(reversed(items))
        elif isinstance(v, list):
            stack.extend(reversed([(x, f"{p}[{i}]") for i, x in enumerate(v)]))
    return None


def json_path_at(text: str, pos: int) -> str:
    """The JSON path of the value being read at character ``pos`` of ``text`` (for a parse error's message)."""
    stack: list[list] = []  # ["o", key, expecting_key] | ["a", index]
    i, n = 0, min(pos, len(text), 64 * 1024 * 1024)
    while i < n:
        c = text[i]
        if c == '"':
            j = i + 1
            while j < len(text) and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            if stack and stack[-1][0] == "o" and stack[-1][2]:
                stack[-1][1], stack[-1][2] = text[i + 1:j], False
            i = j + 1
            continue
        if c == "{":
            stack.append(["o", None, True])
        elif c == "[":
            stack.append(["a", 0])
        elif c in "}]":
            if stack:
                stack.pop()
        elif c == "," and stack:
            if stack[-1][0] == "o":
                stack[-1][2] = True
            else:
                stack[-1][1] += 1
        i += 1
    out = "$"
    for e in stack[:64]:
        if e[0] == "a":
            out += f"[{e[1]}]"
        elif e[1] is not None:
            out += f".{_short(e[1], 60)}"
    return out + ("..." if len(stack) > 64 else "")


def parse_json_text(text: str, what: str = "plan") -> Any:
    """Parse ``text``, refusing what is not a number or a string over the reals: NaN / Infinity tokens and
    overflowing floats (``1e999``), integers outside (-2^63, 2^63), lone surrogates; errors name the JSON path."""
    bad = []

    def on_int(s: str):
        if len(s) > 20 or not -MAX_INT < int(s) < MAX_INT:
            bad.append(1)
            return _BadLiteral(f"the integer {_short(s, 40)} is outside the 64-bit range (-2^63, 2^63)")
        return int(s)

    def on_float(s: str):
        v = float(s)
        if v in (float("inf"), float("-inf")):
            bad.append(1)
            return _BadLiteral(f"{_short(s, 40)} overflows to infinity: {what}s are read over the reals")
        return v

    def on_constant(s: str):
        bad.append(1)
        return _BadLiteral(f"{s} is not a finite number: {what}s are read over the reals (use a large finite value, "
                           f"e.g. -1e9 for a mask fill)")

    old_limit = sys.getrecursionlimit()
    try:  # the depth a JSON document may have, also on tvcert.deep's big-stack thread (recursion limit 2e6)
        sys.setrecursionlimit(min(old_limit, MAX_JSON_DEPTH))
    except RecursionError:
        pass
    try:
        raw = json.loads(text, parse_int=on_int, parse_float=on_float, parse_constant=on_constant)
    except json.JSONDecodeError as exc:
        raise PlanError(json_path_at(text, exc.pos),
                        f"malformed JSON at line {exc.lineno} column {exc.colno} (not valid JSON): {exc.msg}") from None
    except RecursionError:
        raise PlanError("$", f"JSON nested too deeply (more than about {MAX_JSON_DEPTH} levels)") from None
    finally:
        sys.setrecursionlimit(old_limit)
    surrogates = _SURROGATE_ESCAPE.search(text) is not None
    if bad or surrogates:
        found = _find_bad_literal(raw, surrogates)
        if found is not None:
            raise PlanError(*found)
    return raw


def parse_plan_text(text: str) -> dict:
    raw = parse_json_text(text, "plan")
    if not isinstance(raw, dict):
        raise PlanError("$", f"a plan must be a JSON object, got {type(raw).__name__}")
    return raw


def load_plan(src: str | Path | dict, check_run_dims: bool = True) -> Plan:
    """Load and validate a plan from a path or an already-parsed dict.

    ``check_run_dims=False`` defers the shape check at the small run dims to the first run
    (verification of a large plan does not need it unless it searches for a counterexample).
    """
    if isinstance(src, dict):
        raw = src
        _reject_non_finite(raw, attrs_only=True)
    else:
        raw = read_plan_json(src)  # (its parser refuses NaN / Infinity tokens)
    if raw.get("tvcert_plan") is not None and (type(raw.get("tvcert_plan")) is not int or raw["tvcert_plan"] != PLAN_VERSION):
        raise PlanError("$.tvcert_plan", f"plan format version {raw['tvcert_plan']!r} is not supported (expected {PLAN_VERSION})")
    try:
        spec = PlanSpec.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise PlanError(_pyd_path(err["loc"]), err["msg"]) from None
    except RecursionError:
        raise PlanError("$", "plan nested too deeply") from None
    try:
        return _build(spec, raw, check_run_dims)
    except GraphError as exc:
        raise PlanError(exc.path, exc.msg) from None


def _graph(g: GraphSpec, name: str, path: str, stage: dict[str, int] | None = None) -> Graph:
    nodes = []
    for i, n in enumerate(g.nodes):
        p = f"{path}.nodes[{i}]"
        if (n.name is None) == (n.outputs is None):
            if n.op in REGISTRY and REGISTRY[n.op].n_outputs({}) == 0 and n.name is None and n.outputs is None:
                outs: list[str] = []
            else:
                raise GraphError(p, "a node needs exactly one of 'name' (one output) or 'outputs' (several)")
        else:
            outs = [n.name] if n.name is not None else list(n.outputs or [])
        node = Node(op=n.op, inputs=list(n.inputs), outputs=outs, attrs=dict(n.attrs), src=n.src, path=p,
                    layer=n.layer)
        if n.op == "ring_loop":
            node.meta["body"] = _loop_body(node)
        if n.module:
            node.meta["module"] = n.module
        nodes.append(node)
    inputs = [TensorDecl(t.name, list(t.shape), t.dtype, t.range) for t in g.inputs]
    gr = Graph(name=name, inputs=inputs, nodes=nodes, outputs=list(g.outputs), path=path, stage=dict(stage or {}))
    gr.check_structure()
    return gr


def _loop_body(node: Node) -> Graph:
    """Parse a ring_loop's body into a graph (its inputs' shapes are bound by Graph.infer)."""
    path = f"{node.path}.attrs.body"
    if "body" not in node.attrs:
        raise GraphError(f"{node.path}.attrs", "op 'ring_loop' needs attribute 'body' (the loop's graph)")
    raw = node.attrs["body"]
    try:
        body = LoopBodySpec.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise GraphError(path + _pyd_path(err["loc"])[1:], err["msg"]) from None
    for i, b in enumerate(body.nodes):
        if b.op in ("ring_loop", "send", "recv"):
            raise GraphError(f"{path}.nodes[{i}].op", f"a loop body cannot contain {b.op!r}")
    spec = GraphSpec(inputs=[TensorSpec(name=x, shape=[]) for x in body.inputs], nodes=body.nodes, outputs=body.outputs)
    g = _graph(spec, f"{node.path}.body", path)
    for b in g.nodes:
        if _node_mentions_rank(b):
            raise GraphError(f"{b.path}.attrs", "attributes inside a loop body cannot depend on rank coordinates "
                                                "(pass rank-dependent values in as loop inputs)")
    return g


def _build(spec: PlanSpec, raw: dict, check_run_dims: bool = True) -> Plan:
    dims = dict(spec.dims)
    for k, v in dims.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k) or k == "rank":
            raise PlanError(f"$.dims.{k}", f"{k!r} is not a valid dim name")
        if v <= 0 or v > MAX_DIM:
            raise PlanError(f"$.dims.{k}", f"size {v} must be a positive integer below 2^62")
    run_dims = dict(dims)
    if spec.run_dims:
        for k, v in spec.run_dims.items():
            if k not in dims:
                raise PlanError(f"$.run_dims.{k}", f"{k!r} is not one of the plan's dims")
            if v <= 0 or v > MAX_DIM:
                raise PlanError(f"$.run_dims.{k}", f"size {v} must be a positive integer")
            run_dims[k] = v
    pairs = list(spec.mesh.items()) if isinstance(spec.mesh, dict) else [tuple(x) for x in spec.mesh]
    mesh_spec = dict(pairs)
    if len(mesh_spec) != len(pairs):
        raise PlanError("$.mesh", "a mesh axis is named twice")
    if not mesh_spec:
        raise PlanError("$.mesh", "the mesh needs at least one axis")
    for a, s in mesh_spec.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", a):
            raise PlanError(f"$.mesh.{a}", f"{a!r} is not a valid axis name")
        for which, d in (("dims", dims), ("run_dims", run_dims)):
            try:
                v = dim_value(s, d)
            except DimError as exc:
                raise PlanError(f"$.mesh.{a}", str(exc)) from None
            if v <= 0:
                raise PlanError(f"$.mesh.{a}", f"axis size {v} (with {which}) must be positive")
    logical = _graph(spec.logical, "logical", "$.logical")
    for n in logical.nodes:
        if REGISTRY[n.op].category in ("collective", "p2p", "loop"):
            raise PlanError(f"{n.path}.op", f"the logical (single-device) graph cannot contain {n.op!r}")
    programs: dict[str, Graph] = {}
    if not spec.parallel:
        raise PlanError("$.parallel", "the plan needs at least one parallel program")
    for i, p in enumerate(spec.parallel):
        path = f"$.parallel[{i}]"
        if p.name in programs:
            raise PlanError(f"{path}.name", f"program name {p.name!r} is used twice")
        for a in p.stage:
            if a not in mesh_spec:
                raise PlanError(f"{path}.stage.{a}", f"stage axis {a!r} is not a mesh axis")
        programs[p.name] = _graph(p, p.name, path, p.stage)
    plan = Plan(spec.name, dims, run_dims, mesh_spec, logical, programs, {}, {}, normalize_raw(raw), spec.description)
    in_names = {p: set(g.input_names()) for p, g in programs.items()}
    all_names = {p: set(g.producers()) | in_names[p] for p, g in programs.items()}
    plan.inputs = _bindings(plan, spec.inputs, "inputs", set(logical.input_names()), in_names.__getitem__)
    plan.outputs = _bindings(plan, spec.outputs, "outputs", set(logical.outputs), all_names.__getitem__)
    for name in logical.input_names():
        if name not in plan.inputs:
            raise PlanError("$.inputs", f"logical input {name!r} has no placement")
    for name in logical.outputs:
        if name not in plan.outputs:
            raise PlanError("$.outputs", f"logical output {name!r} has no placement")
    bound_locals: dict[tuple[str, str], str] = {}
    for name, b in plan.inputs.items():
        other = bound_locals.setdefault((b.program, b.local), name)
        if other != name:
            raise PlanError(f"{b.path}.local", f"local tensor {b.local!r} of program {b.program!r} is already bound to "
                                               f"logical input {other!r}: one local tensor cannot hold two logical inputs")
    for pname, g in programs.items():
        for i, t in enumerate(g.inputs):
            if (pname, t.name) not in bound_locals:
                raise PlanError(f"{g.path}.inputs[{i}]", f"local input {t.name!r} is not bound to any logical input in $.inputs")
    check_shapes(plan, dims, "dims")
    plan.checked = {"dims"}
    if run_dims != dims and check_run_dims:
        check_shapes(plan, run_dims, "run_dims")
        plan.checked.add("run_dims")
    plan.p2p = pair_messages(plan)
    return plan


def _bindings(plan: Plan, specs: Mapping[str, PlacementSpec], field_: str, allowed: set[str], locals_of) -> dict[str, Binding]:
    out = {}
    for name, b in specs.items():
        path = f"$.{field_}.{name}"
        if name not in allowed:
            raise PlanError(path, f"{name!r} is not a logical {field_[:-1]}")
        prog = b.program
        if prog is None:
            if len(plan.programs) != 1:
                raise PlanError(f"{path}.program", "the plan has several programs: name the one holding this tensor")
            prog = next(iter(plan.programs))
        if prog not in plan.programs:
            raise PlanError(f"{path}.program", f"unknown program {prog!r}")
        if b.local not in locals_of(prog):
            raise PlanError(f"{path}.local", f"program {prog!r} has no tensor {b.local!r}")
        axes = plan.program_axes(prog)
        pl: dict[str, Placement] = {}
        for a, text in b.placement.items():
            if a not in plan.mesh_spec:
                raise PlanError(f"{path}.placement.{a}", f"{a!r} is not a mesh axis (mesh axes: {list(plan.mesh_spec)})")
            if a not in axes:
                raise PlanError(f"{path}.placement.{a}", f"program {prog!r} is pinned to one coordinate of axis {a!r}")
            try:
                pl[a] = parse_placement(text)
            except ValueError as exc:
                raise PlanError(f"{path}.placement.{a}", str(exc)) from None
        placement = {a: pl.get(a, REPLICATE) for a in axes}
        _check_partials_commute(placement, path)
        layout = []
        for j, st in enumerate(b.layout):
            if st.op not in LAYOUT_OPS:
                raise PlanError(f"{path}.layout[{j}].op", f"{st.op!r} is not a layout op (allowed: {sorted(LAYOUT_OPS)})")
            layout.append((st.op, dict(st.attrs)))
        out[name] = Binding(name, prog, b.local, placement, layout, path)
    return out


def layout_shape(b: Binding, shape: tuple[int, ...], env: Mapping[str, int]) -> tuple[int, ...]:
    for j, (op, attrs) in enumerate(b.layout):
        spec = layout_spec(op)
        try:
            ra = resolve_attrs(spec, attrs, env)
            shape = spec.infer([shape], ra)[0]
        except (AttrError, ValueError) as exc:
            raise PlanError(f"{b.path}.layout[{j}]", str(exc)) from None
    return shape


def _check_partials_commute(placement: Mapping[str, Placement], path: str) -> None:
    """Partial(max) on one axis and Partial(sum|avg) on another do not commute (a sum of maxima is not a
    maximum of sums), and the kernel reduces placements axis by axis in any order: such a binding is refused."""
    maxes = [a for a, p in placement.items() if p.kind == "P" and p.reduce == "max"]
    sums = [a for a, p in placement.items() if p.kind == "P" and p.reduce != "max"]
    if maxes and sums:
        order = list(placement)
        inner, outer = (maxes[0], sums[0]) if order.index(maxes[0]) > order.index(sums[0]) else (sums[0], maxes[0])
        raise PlanError(f"{path}.placement.{inner}",
                        f"{placement[inner]} on axis {inner!r} nested in {placement[outer]} on axis {outer!r}: sum and "
                        f"max do not commute, so the value depends on the order of reduction; Partial(max) can only "
                        f"be combined with Replicate, Shard or Partial(max) on the other axes")


def _check_layout_reads_all(b: Binding, shape: tuple[int, ...], env: Mapping[str, int], which: str) -> None:
    """An output is compared through its layout, so the layout must carry every element of the logical
    output: every layout op but slice is injective (pads are non-negative); a slice must keep its whole dim."""
    for j, (op, attrs) in enumerate(b.layout):
        spec = layout_spec(op)
        ra = resolve_attrs(spec, attrs, env)
        out = spec.infer([shape], ra)[0]
        if op == "slice":
            d = ra["dim"] % len(shape)
            if ra["start"] != 0 or ra["end"] != shape[d] or ra["step"] != 1:
                raise PlanError(f"{b.path}.layout[{j}]",
                                f"the output layout slices dim {d} of {b.logical!r} to [{ra['start']}:{ra['end']}:"
                                f"{ra['step']}] of {shape[d]} (with {which}): the plan would be compared on part of the "
                                f"logical output only; an output layout must read back every element")
        shape = out


def _reject_non_finite(raw: Any, path: str = "$", attrs_only: bool = False) -> None:
    """NaN and Infinity are not real numbers: tvcert's semantics is the reals, so a plan holding one is refused.

    ``attrs_only``: look only where the schema admits arbitrary numbers, the ``attrs`` of nodes and layout
    steps (every other number is a StrictInt or a dim); a big generated plan is mostly names and shapes."""
    if attrs_only and isinstance(raw, dict):
        places = []
        for key in ("logical", "parallel"):
            graphs = raw.get(key)
            graphs = [(f"$.{key}", graphs)] if isinstance(graphs, dict) else \
                [(f"$.{key}[{i}]", g) for i, g in enumerate(graphs)] if isinstance(graphs, list) else []
            for gp, g in graphs:
                nodes = g.get("nodes") if isinstance(g, dict) else None
                for j, n in enumerate(nodes if isinstance(nodes, list) else []):
                    if isinstance(n, dict) and "attrs" in n:
                        places.append((n["attrs"], f"{gp}.nodes[{j}].attrs"))
        for key in ("inputs", "outputs"):
            bs = raw.get(key)
            for name, b in (bs.items() if isinstance(bs, dict) else []):
                steps = b.get("layout") if isinstance(b, dict) else None
                for j, st in enumerate(steps if isinstance(steps, list) else []):
                    if isinstance(st, dict) and "attrs" in st:
                        places.append((st["attrs"], f"$.{key}.{name}.layout[{j}].attrs"))
        try:  # one pass of the C encoder over every attrs; the slow walk only to name the place
            json.dumps([v for v, _ in places], allow_nan=False, check_circular=False)
        except ValueError:
            for v, p in places:
                _reject_non_finite(v, p)
        return
    stack = [(raw, path)]
    while stack:
        v, p = stack.pop()
        if isinstance(v, float):
            if v != v or v in (float("inf"), float("-inf")):
                raise PlanError(p, f"{v} is not a finite number: plans are read over the reals (use a large finite "
                                   f"value, e.g. -1e9 for a mask fill)")
        elif isinstance(v, dict):
            stack.extend(reversed([(x, f"{p}.{k}") for k, x in v.items()]))  # reported in document order
        elif isinstance(v, list):
            stack.extend(reversed([(x, f"{p}[{i}]") for i, x in enumerate(v)]))


def local_shape(b: Binding, shape: tuple[int, ...], mesh: Mapping[str, int]) -> tuple[int, ...]:
    """The shape a rank holds of a (laid-out) logical tensor under ``b.placement``."""
    s = list(shape)
    for a, pl in b.placement.items():
        if pl.kind in ("S", "Z"):
            if not -len(s) <= pl.dim < len(s):
                raise PlanError(f"{b.path}.placement.{a}", f"{pl} but the tensor has rank {len(s)}")
            d = pl.dim % len(s)
            chunks = mesh[a] * (2 if pl.kind == "Z" else 1)
            if s[d] % chunks:
                raise PlanError(f"{b.path}.placement.{a}",
                                f"dim {d} of size {s[d]} is not divisible by {'2 x ' if pl.kind == 'Z' else ''}"
                                f"mesh axis {a!r} of size {mesh[a]}")
            s[d] //= mesh[a]
    return tuple(s)


def check_shapes(plan: Plan, dims: Mapping[str, int], which: str) -> None:
    """Infer every shape at ``dims`` and check that bindings agree with declared local shapes."""
    mesh = plan.mesh(dims)
    try:
        ltypes = plan.logical.infer(dims, mesh, key=f"shape@{which}")
        ranges = {t.name: int_bounds(t, dims) for t in plan.logical.inputs if t.dtype == "int" and t.range is not None}
        check_index_domains(plan.logical, ranges, dims, ltypes)
    except GraphError as exc:
        raise PlanError(exc.path, f"{exc.msg} (with {which})") from None
    except IndexDomainError as exc:
        raise IndexRangePlanError(exc.path, f"{exc.msg} (with {which})") from None
    ptypes = {}
    for pname, g in plan.programs.items():
        env = dict(dims)
        for a in plan.program_axes(pname):
            env[f"rank.{a}"] = 0
        for a, c in g.stage.items():
            if not 0 <= c < mesh[a]:
                raise PlanError(f"{g.path}.stage.{a}", f"coordinate {c} is outside axis {a!r} of size {mesh[a]}")
            env[f"rank.{a}"] = c
        try:
            ptypes[pname] = g.infer(env, mesh, key=f"shape@{which}")
        except GraphError as exc:
            raise PlanError(exc.path, f"{exc.msg} (with {which})") from None
        _check_rank_independent(plan, pname, g, env, mesh, ptypes[pname], which)
    for group, names in (("inputs", plan.logical.input_names()), ("outputs", plan.logical.outputs)):
        for name in names:
            b = getattr(plan, group)[name]
            lshape, ldt = ltypes[name]
            shape = layout_shape(b, lshape, dims)
            if group == "outputs":
                _check_layout_reads_all(b, lshape, dims, which)
            want = local_shape(b, shape, mesh)
            have, pdt = ptypes[b.program][b.local]
            if tuple(have) != tuple(want):
                raise PlanError(f"{b.path}.local",
                                f"local tensor {b.local!r} has shape {list(have)} but placing logical {name!r} {list(lshape)} "
                                f"as {fmt_placement(b.placement)} gives {list(want)} (with {which})")
            if ldt != pdt:
                raise PlanError(f"{b.path}.local", f"dtype mismatch: logical {name!r} is {ldt}, local {b.local!r} is {pdt}")


def _check_rank_independent(plan, pname, g: Graph, env0, mesh, types, which) -> None:
    """SPMD programs need rank-independent shapes.  Only ops whose attributes mention a rank
    coordinate can make a shape depend on the rank (shape inference is a function of input
    shapes and attributes), so those ops are re-inferred at the last coordinate of every axis."""
    env = dict(env0)
    for a in plan.program_axes(pname):
        env[f"rank.{a}"] = mesh[a] - 1
    for n in g.nodes:
        if not _node_mentions_rank(n):
            continue
        spec = REGISTRY[n.op]
        try:
            ra = resolve_attrs(spec, n.attrs, env)
            if spec.category == "collective":
                ra["_p"] = 1
                for a in ([ra["axis"]] if isinstance(ra["axis"], str) else ra["axis"]):
                    ra["_p"] *= mesh.get(a, 1)
            out = spec.infer([types[x][0] for x in n.inputs], ra)
        except (AttrError, ValueError) as exc:
            raise PlanError(n.path, f"{exc} (at the last rank coordinates, with {which})") from None
        for o, shp in zip(n.outputs, out):
            if tuple(shp) != tuple(types[o][0]):
                raise PlanError(n.path, f"the shape of {o!r} differs between ranks ({list(types[o][0])} vs {list(shp)}, "
                                        f"with {which}); SPMD programs need rank-independent shapes")


def _node_mentions_rank(n) -> bool:
    """Whether any attribute mentions a rank coordinate, at any nesting level."""
    return bool(rank_axes_in(n.attrs))


def fmt_placement(pl: Mapping[str, Placement]) -> str:
    return "{" + ", ".join(f"{a}: {p}" for a, p in pl.items()) + "}"


# ============================================================== send / recv: one pairing for everyone
def message_key(plan: Plan, program: str, n: Node, which: str = "dims") -> tuple:
    """The message a send or recv node carries: (tag, sender's stage, receiver's stage), stages being the full
    pinned coordinates of the two programs (sorted (axis, coordinate) pairs).  Every rank of the sending
    program sends to the rank with the same coordinates on the unpinned axes, so on ranks this is the
    message (tag, sender rank, receiver rank) of the interpreter.  Raises PlanError naming the attribute."""
    g = plan.programs[program]
    dims = plan.dims if which == "dims" else plan.run_dims
    axis = n.attrs.get("axis")
    if axis not in g.stage:
        raise PlanError(f"{n.path}.attrs.axis", f"{n.op} over axis {axis!r}, but program {program!r} is not pinned to a "
                                                 f"stage of that axis (set $.parallel[..].stage.{axis}); send/recv move "
                                                 f"tensors between programs pinned on their axis")
    peer = "to" if n.op == "send" else "src"
    v = n.attrs.get(peer)
    if rank_axes_in(v):
        raise PlanError(f"{n.path}.attrs.{peer}", f"{peer} {v!r} depends on the rank; a {n.op} names a fixed stage")
    try:
        c = dim_value(v, dims)
    except DimError as exc:
        raise PlanError(f"{n.path}.attrs.{peer}", str(exc)) from None
    size = plan.mesh(dims)[axis]
    if not 0 <= c < size:
        raise PlanError(f"{n.path}.attrs.{peer}", f"coordinate {c} is outside axis {axis!r} of size {size} (with {which})")
    tag = n.attrs.get("tag")
    if not isinstance(tag, str):
        raise PlanError(f"{n.path}.attrs.tag", f"a {n.op} needs a string tag, got {tag!r}")
    here = dict(g.stage)
    there = dict(g.stage)
    there[axis] = c
    a, b = (here, there) if n.op == "send" else (there, here)
    return (tag, tuple(sorted(a.items())), tuple(sorted(b.items())))


def _show_key(key: tuple) -> str:
    tag, a, b = key
    return f"tag {tag!r} from stage {dict(a)} to stage {dict(b)}"


def pair_messages(plan: Plan) -> dict[tuple[str, int], tuple[str, int]]:
    """The one pairing of recvs with sends that the engine, the certificate checker and the interpreter all
    use: recv (program, node index) -> send (program, node index).

    A plan is accepted only if its sends and recvs pair one-to-one per message key (:func:`message_key`),
    the key is the same at dims and run_dims, each recv declares the shape and dtype of the tensor sent to
    it, and the programs, interleaved at recv, can run every op (no recv waits forever).  Otherwise
    PlanError naming the node's attribute."""
    sends: dict[tuple, tuple[str, int]] = {}
    recvs: dict[tuple, tuple[str, int]] = {}
    for p, g in plan.programs.items():
        for i, n in enumerate(g.nodes):
            if n.op not in ("send", "recv"):
                continue
            key = message_key(plan, p, n)
            if plan.run_dims != plan.dims and message_key(plan, p, n, "run_dims") != key:
                peer = "to" if n.op == "send" else "src"
                raise PlanError(f"{n.path}.attrs.{peer}", f"the {n.op}'s peer differs between dims and run_dims; the "
                                                          f"stage a message goes to cannot depend on the sizes")
            seen = sends if n.op == "send" else recvs
            if key in seen:
                q, j = seen[key]
                raise PlanError(f"{n.path}.attrs.tag",
                                f"{plan.programs[q].nodes[j].path} already {n.op}s {_show_key(key)}; every message "
                                f"(tag, source stage, destination stage) must be sent once and received once")
            seen[key] = (p, i)
    for key, (p, i) in recvs.items():
        if key not in sends:
            raise PlanError(f"{plan.programs[p].nodes[i].path}.attrs.tag", f"no send carries {_show_key(key)}")
    for key, (p, i) in sends.items():
        if key not in recvs:
            raise PlanError(f"{plan.programs[p].nodes[i].path}.attrs.tag", f"no recv receives {_show_key(key)}")
    pairs = {recvs[k]: sends[k] for k in recvs}
    for which in sorted(plan.checked):
        _check_message_types(plan, pairs, f"shape@{which}", which)
    _check_no_deadlock(plan, pairs)
    return pairs


def _check_message_types(plan: Plan, pairs, key: str, which: str) -> None:
    types: dict[str, dict[str, tuple]] = {}
    for p, g in plan.programs.items():
        t: dict[str, tuple] = {}
        for n in g.nodes:
            if key in n.meta:
                t.update(zip(n.outputs, n.meta[key]))
        types[p] = t
    for (rp, ri), (sp, si) in pairs.items():
        r, s = plan.programs[rp].nodes[ri], plan.programs[sp].nodes[si]
        sent = types[sp].get(s.inputs[0])
        if sent is None:  # a program input: its declared type
            dims = plan.dims if which == "dims" else plan.run_dims
            decl = next((d for d in plan.programs[sp].inputs if d.name == s.inputs[0]), None)
            if decl is None or key not in r.meta:
                continue
            try:
                sent = (tuple(dim_value(x, dims) for x in decl.shape), decl.dtype)
            except DimError:
                continue
        got = r.meta.get(key, [None])[0]
        if got is None:
            continue
        if tuple(got[0]) != tuple(sent[0]):
            raise PlanError(f"{r.path}.attrs.shape", f"the recv declares shape {list(got[0])}, but {s.path} sends "
                                                     f"{s.inputs[0]!r} of local shape {list(sent[0])} (with {which})")
        if got[1] != sent[1]:
            raise PlanError(f"{r.path}.attrs.dtype", f"the recv declares dtype {got[1]}, but {s.path} sends "
                                                     f"{s.inputs[0]!r} of dtype {sent[1]}")


def _check_no_deadlock(plan: Plan, pairs) -> None:
    """Run the programs' control flow the way the interpreter does (each program in order, waiting at a recv
    until its paired send has run); every op must be reached."""
    pc = {p: 0 for p in plan.programs}
    ran: set[tuple[str, int]] = set()
    progressed = True
    while progressed:
        progressed = False
        for p, g in plan.programs.items():
            while pc[p] < len(g.nodes):
                n = g.nodes[pc[p]]
                if n.op == "recv" and pairs[(p, pc[p])] not in ran:
                    break
                ran.add((p, pc[p]))
                pc[p] += 1
                progressed = True
    for p, g in plan.programs.items():
        if pc[p] < len(g.nodes):
            n = g.nodes[pc[p]]
            sp, si = pairs[(p, pc[p])]
            raise PlanError(f"{n.path}.attrs.tag", f"deadlock: this recv waits for {plan.programs[sp].nodes[si].path}, "
                                                   f"which can never run (programs wait for each other)")
