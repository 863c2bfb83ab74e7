"""ATen -> tvcert IR: the conversion table used by :mod:`tvcert.frontends.trace`.

Input is a ``torch.fx.GraphModule`` produced by ``make_fx`` (ATen ops, fake tensors in
``node.meta["val"]``).  Every ``call_function`` node is looked up in ``TABLE`` by its overload
name (``aten.mm.default``) and then its packet name (``aten.mm``); a handler emits zero or more IR
nodes (composite backward ops such as ``tanh_backward`` expand into several).  An op with no
handler raises :class:`Unconverted`, naming the op and its source line, so the caller can turn it
into an UNKNOWN-style verdict instead of crashing.

Conventions
-----------
* Views and copies that do not change values (``detach``, ``clone``, ``alias``, ``contiguous``,
  ``wait_tensor``, float->float ``_to_copy``) are aliases: no IR node, the fx node maps to its
  input's IR name.
* Python scalars in binary ops become ``scale`` / ``add_scalar`` or a 0-d ``const``.
* Integer attributes are recorded verbatim; :mod:`.trace` compares them across ranks and turns the
  ones that differ into ``rank.<axis>`` expressions (SPMD compression).
* Collectives (``_c10d_functional.*``) are mapped through ``axis_of_group(group_name) -> axis``,
  supplied by the tracer, which resolves the group to ranks and the ranks to mesh axes.
* In-place ops (``add_``, ``copy_``, ``index_put_``, ...) rebind the written fx node to the result,
  only when nothing can alias it (see ``_check_unaliased``).
* Complex tensors are carried as their real view ``[..., 2]`` and have their own table
  (``COMPLEX_TABLE``); an op touching a complex tensor is never converted as if it were real.
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

aten = torch.ops.aten


class Unconverted(Exception):
    """An op of the traced graph has no IR conversion (or a conversion precondition failed)."""

    def __init__(self, op: str, src: Optional[str], detail: str = ""):
        where = f" at {src}" if src else ""
        msg = f"no IR conversion for {op}{where}"
        if detail:
            msg += f": {detail}"
        super().__init__(msg)
        self.op = op
        self.src = src
        self.detail = detail


@dataclass
class IRNode:
    op: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)
    src: Optional[str] = None

    def to_json(self) -> dict:
        d: dict[str, Any] = {"op": self.op}
        if len(self.outputs) == 1:
            d["name"] = self.outputs[0]
        else:
            d["outputs"] = list(self.outputs)
        d["inputs"] = list(self.inputs)
        if self.attrs:
            d["attrs"] = dict(self.attrs)
        if self.src:
            d["src"] = self.src
        return d


def ir_dtype(t: Any) -> str:
    dt = getattr(t, "dtype", None)
    if dt is None:
        return "float" if isinstance(t, float) else "int"
    return "float" if dt.is_floating_point or dt.is_complex else "int"


def _shape(v: Any) -> list[int]:
    return [int(s) for s in v.shape]


class Converter:
    """Convert one fx graph.  ``names`` maps placeholders (in order) to IR input names."""

    def __init__(self, gm: torch.fx.GraphModule, input_names: list[str],
                 axis_of_group: Callable[[str], Any] | None = None,
                 src_of: Callable[[torch.fx.Node], Optional[str]] | None = None):
        self.gm = gm
        self.input_names = input_names
        self.axis_of_group = axis_of_group
        self.src_of = src_of or (lambda n: None)
        self.nodes: list[IRNode] = []
        self.env: dict[torch.fx.Node, Any] = {}
        self._n = 0
        self.cur: Optional[torch.fx.Node] = None
        self.cur_src: Optional[str] = None
        self.used_names: set[str] = set(input_names)
        self.replace: dict[torch.fx.Node, str] = {}  # fx nodes already computed by a fused pattern

    # ------------------------------------------------------------------ emit helpers
    def fresh(self, base: str) -> str:
        name = base
        while name in self.used_names:
            self._n += 1
            name = f"{base}_{self._n}"
        self.used_names.add(name)
        return name

    def emit(self, op: str, inputs: list[str], attrs: dict | None = None, base: str | None = None,
             n_out: int = 1) -> Any:
        b = base or (self.cur.name if self.cur is not None else op)
        outs = [self.fresh(b if n_out == 1 else f"{b}_{i}") for i in range(n_out)]
        self.nodes.append(IRNode(op, list(inputs), outs, dict(attrs or {}), self.cur_src))
        return outs[0] if n_out == 1 else outs

    def const(self, value: Any, shape: list[int] | tuple = (), dtype: str = "float") -> str:
        if isinstance(value, bool):
            value, dtype = int(value), "int"
        if isinstance(value, float):
            if math.isinf(value) or math.isnan(value):
                self.fail(f"constant {value} is not a finite real number")
            if value.is_integer() and abs(value) < 2 ** 53:
                value = int(value)
        attrs: dict[str, Any] = {"value": value}
        if shape:
            attrs["shape"] = [int(s) for s in shape]
        if dtype != "float":
            attrs["dtype"] = dtype
        return self.emit("const", [], attrs, base=f"{self.cur.name}_c" if self.cur is not None else "c")

    def fail(self, detail: str):
        raise Unconverted(str(self.cur.target) if self.cur is not None else "?", self.cur_src, detail)

    def val(self, a: Any) -> Any:
        """The fake tensor (or python value) of an argument."""
        if isinstance(a, torch.fx.Node):
            return a.meta.get("val")
        return a

    def ir(self, a: Any, like_dtype: str = "float") -> str:
        """IR name of a tensor argument; python scalars become 0-d consts."""
        if isinstance(a, torch.fx.Node):
            v = self.env.get(a)
            if v is None:
                self.fail(f"argument {a.name} has no IR value")
            if isinstance(v, (list, tuple)):
                self.fail(f"argument {a.name} is a tuple, expected a tensor")
            return v
        if isinstance(a, (int, float, bool)):
            return self.const(a, (), "int" if (isinstance(a, (int, bool)) and like_dtype == "int") else "float")
        self.fail(f"unsupported argument {a!r}")

    # ------------------------------------------------------------------ main loop
    def run(self) -> tuple[list[IRNode], list[Any]]:
        ph = [n for n in self.gm.graph.nodes if n.op == "placeholder"]
        if len(ph) != len(self.input_names):
            raise Unconverted("placeholder", None, f"graph has {len(ph)} inputs, expected {len(self.input_names)}")
        for n, name in zip(ph, self.input_names):
            self.env[n] = name
        outputs: list[Any] = []
        for n in self.gm.graph.nodes:
            if n.op == "placeholder":
                continue
            if n.op == "output":
                outputs = [self.env.get(a) if isinstance(a, torch.fx.Node) else a for a in _flat(n.args[0])]
                continue
            if n.op == "get_attr":
                self.cur = n
                self.cur_src = self.src_of(n)
                self.env[n] = self.tensor_constant(n)
                continue
            if n.op != "call_function":
                raise Unconverted(n.op, None, f"fx node kind {n.op!r} ({n.target}) is not supported")
            self.cur = n
            self.cur_src = self.src_of(n)
            self.env[n] = self.convert(n)
        self.cur = None
        return dce(self.nodes, outputs), outputs

    def tensor_constant(self, n: torch.fx.Node) -> str:
        """A tensor make_fx baked into the graph (``torch.tensor(0)`` in DTensor's vocab-parallel
        embedding, ...): a const when all its elements are equal, else unsupported."""
        try:
            v = getattr(self.gm, str(n.target))
        except AttributeError:
            self.fail(f"get_attr {n.target} names nothing")
        if not isinstance(v, torch.Tensor) or v.numel() == 0 or v.is_complex():
            self.fail(f"get_attr {n.target}: not a non-empty real tensor constant")
        flat = v.detach().reshape(-1)
        if not bool((flat == flat[0]).all()):
            self.fail(f"tensor constant {n.target} of shape {list(v.shape)} holds distinct values; pass it as an "
                      f"input (module buffers are inputs in tvcert.frontends.dtensor)")
        x = flat[0].item()
        return self.const(x, _shape(v), ir_dtype(v))

    def convert(self, n: torch.fx.Node) -> Any:
        if n in self.replace:
            return self.replace[n]
        t = n.target
        if t is operator.getitem:
            seq, i = n.args
            v = self.env.get(seq)
            if not isinstance(v, (list, tuple)):
                self.fail("getitem of a non-tuple")
            return v[i]
        table = COMPLEX_TABLE if _touches_complex(n) else TABLE
        h = table.get(str(t))
        if h is None:
            pk = getattr(t, "overloadpacket", None)
            h = table.get(str(pk)) if pk is not None else None
        if h is None:
            if table is COMPLEX_TABLE:
                raise Unconverted(str(t), self.cur_src, "an op on complex tensors without a conversion (complex "
                                  "tensors are carried as their real view [..., 2]; see COMPLEX_TABLE)")
            raise Unconverted(str(t), self.cur_src, "add a handler in tvcert/frontends/aten.py")
        return h(self, n, *n.args, **n.kwargs)


def dce(nodes: list[IRNode], outputs: list[Any]) -> list[IRNode]:
    """Drop IR nodes whose results nothing uses (e.g. the 3-D views a fused bmm no longer reads)."""
    live = {o for o in outputs if isinstance(o, str)}
    keep = []
    for nd in reversed(nodes):
        if any(o in live for o in nd.outputs) or nd.op in ("send", "recv"):
            keep.append(nd)
            live.update(nd.inputs)
    return list(reversed(keep))


def fuse_collectives(nodes: list[IRNode], outputs: list[Any], axis_size: Callable[[Any], int]) -> list[IRNode]:
    """Fold funcol's lowering of collectives along a dim d != 0 back into one IR collective.

    ``all_gather_tensor(x, d)`` traces as all_gather(dim 0) -> split(dim 0, p equal) -> concat(dim d);
    ``reduce_scatter_tensor(x, op, d)`` as split(dim d, p equal) -> concat(dim 0) -> reduce_scatter(dim 0).
    Both equal the collective along d (same values, exactly); the engine's rules speak of the latter."""
    prod = {o: nd for nd in nodes for o in nd.outputs}
    out = []
    for nd in nodes:
        if nd.op == "concat" and nd.inputs:
            sp = prod.get(nd.inputs[0])
            if (sp is not None and sp.op == "split" and sp.outputs == nd.inputs and sp.attrs.get("dim") == 0
                    and len(set(sp.attrs["sizes"])) == 1):
                ag = prod.get(sp.inputs[0])
                if (ag is not None and ag.op == "all_gather" and ag.attrs.get("dim") == 0
                        and axis_size(ag.attrs["axis"]) == len(sp.outputs)):
                    out.append(IRNode("all_gather", [ag.inputs[0]], nd.outputs,
                                      {"axis": ag.attrs["axis"], "dim": nd.attrs["dim"]}, ag.src or nd.src))
                    continue
        if nd.op == "reduce_scatter" and nd.attrs.get("dim") == 0:
            cat = prod.get(nd.inputs[0])
            if cat is not None and cat.op == "concat" and cat.attrs.get("dim") == 0 and cat.inputs:
                sp = prod.get(cat.inputs[0])
                if (sp is not None and sp.op == "split" and sp.outputs == cat.inputs and len(set(sp.attrs["sizes"])) == 1
                        and axis_size(nd.attrs["axis"]) == len(sp.outputs)):
                    out.append(IRNode("reduce_scatter", [sp.inputs[0]], nd.outputs,
                                      {**nd.attrs, "dim": sp.attrs["dim"]}, nd.src))
                    continue
        out.append(nd)
    return dce(out, outputs)


def _flat(x):
    if isinstance(x, (list, tuple)):
        for y in x:
            yield from _flat(y)
    else:
        yield x


# ====================================================================== the table
TABLE: dict[str, Callable[..., Any]] = {}


def reg(*names: str):
    def deco(fn):
        for nm in names:
            TABLE[nm] = fn
        return fn
    return deco


def _out(c: Converter, n: torch.fx.Node):
    return n.meta.get("val")


# -------------------------------------------------------------- aliases
@reg("aten.detach", "aten.clone", "aten.alias", "aten.contiguous", "aten.lift_fresh_copy",
     "_c10d_functional.wait_tensor", "aten.view_as", "aten.lift_fresh", "aten.positive")
def _alias(c, n, x, *a, **k):
    return c.ir(x)


@reg("aten._to_copy", "aten.to", "aten._to_copy.default")
def _to_copy(c, n, x, *a, **k):
    src, dst = ir_dtype(c.val(x)), ir_dtype(_out(c, n))
    if src == dst:
        return c.ir(x)
    return c.emit("cast", [c.ir(x)], {"dtype": dst})


# -------------------------------------------------------------- linear algebra
_VIEWS = ("aten.view", "aten._unsafe_view", "aten.reshape")


def _pk(node) -> str:
    t = node.target
    return str(getattr(t, "overloadpacket", t))


def _lift(c, node, batch: list[int]) -> Optional[str]:
    """IR name of the batch-shaped tensor a 3-D bmm operand was flattened from, or None.

    torch.matmul on rank >= 3 operands decomposes into expand -> view [prod(batch), m, k] -> bmm
    -> view back; merging a sharded head dim into the batch dim has no placement (its shards are
    not contiguous), so the pattern is folded back into one batched ``matmul``.  Operands may be
    transposed in their last two dims after flattening (autograd's bmm backward)."""
    if not isinstance(node, torch.fx.Node) or node.op != "call_function":
        return None
    pk = _pk(node)
    v = node.meta.get("val")
    if v is None or len(v.shape) != 3:
        return None
    if pk in _VIEWS:
        src = node.args[0]
        sv = src.meta.get("val") if isinstance(src, torch.fx.Node) else None
        while sv is not None and _pk(src) == "aten.expand" and list(sv.shape) == list(src.args[0].meta["val"].shape):
            src = src.args[0]
            sv = src.meta.get("val")
        if sv is not None and list(sv.shape) == list(batch) + [int(v.shape[1]), int(v.shape[2])]:
            return c.ir(src)
        return None
    if pk == "aten.transpose" and sorted(int(d) % 3 for d in node.args[1:3]) == [1, 2]:
        inner = _lift(c, node.args[0], batch)
        if inner is None:
            return None
        r = len(batch) + 2
        return c.emit("transpose", [inner], {"dim0": r - 2, "dim1": r - 1}, base=f"{node.name}_b")
    if pk == "aten.expand" and list(v.shape) == list(node.args[0].meta["val"].shape):
        return _lift(c, node.args[0], batch)
    return None


@reg("aten.mm", "aten.matmul")
def _mm(c, n, a, b):
    return c.emit("matmul", [c.ir(a), c.ir(b)])


@reg("aten.bmm")
def _bmm(c, n, a, b):
    users = list(n.users)
    if len(users) == 1 and _pk(users[0]) in _VIEWS:
        u = users[0]
        ushape = [int(s) for s in u.meta["val"].shape]
        out = [int(s) for s in n.meta["val"].shape]
        if len(ushape) > 3 and ushape[-2:] == out[-2:] and math.prod(ushape[:-2]) == out[0]:
            batch = ushape[:-2]
            la, lb = _lift(c, a, batch), _lift(c, b, batch)
            if la is not None and lb is not None:
                c.replace[u] = c.emit("matmul", [la, lb], base=u.name)
                return c.ir(a)  # placeholder: the 3-D result has no other user
    return c.emit("matmul", [c.ir(a), c.ir(b)])


@reg("aten.addmm")
def _addmm(c, n, bias, a, b, beta=1, alpha=1, **k):
    if beta != 1 or alpha != 1:
        c.fail("addmm with beta/alpha != 1")
    m = c.emit("matmul", [c.ir(a), c.ir(b)], base=f"{n.name}_mm")
    return c.emit("add", [m, c.ir(bias)])


@reg("aten.einsum")
def _einsum(c, n, eq, ops):
    return c.emit("einsum", [c.ir(x) for x in ops], {"equation": eq})


# -------------------------------------------------------------- elementwise
def _binary(op: str, scalar_op: Callable | None = None):
    def h(c, n, a, b, alpha=1, **k):
        if alpha != 1:
            if op not in ("add", "sub") or isinstance(b, (int, float)):
                c.fail(f"alpha={alpha}")
            b = c.emit("scale", [c.ir(b)], {"value": alpha}, base=f"{n.name}_alpha")
            return c.emit(op, [c.ir(a), b])
        if isinstance(b, (int, float)) and not isinstance(a, (int, float)) and scalar_op is not None:
            return scalar_op(c, n, c.ir(a), b)
        dt = ir_dtype(_out(c, n))
        ia = c.ir(a, dt) if not isinstance(a, str) else a
        ib = c.ir(b, dt) if not isinstance(b, str) else b
        return c.emit(op, [ia, ib])
    return h


def _scalar_add(sign):
    def f(c, n, x, s):
        v = sign * s
        if v == 0 and ir_dtype(_out(c, n)) == "float":
            # integer offsets stay even when 0: a vocab shard's "ids - rank*V/tp" is 0 on rank 0 only,
            # and every rank must trace the same ops to compress to SPMD form
            return x
        return c.emit("add_scalar", [x], {"value": v})
    return f


def _scalar_mul(c, n, x, s):
    if s == 1:
        return x
    return c.emit("scale", [x], {"value": s})


def _scalar_div(c, n, x, s):
    if s == 1:
        return x
    return c.emit("div", [x, c.const(s)])


reg("aten.add")(_binary("add", _scalar_add(1)))
reg("aten.sub")(_binary("sub", _scalar_add(-1)))
reg("aten.mul")(_binary("mul", _scalar_mul))
reg("aten.div")(_binary("div", _scalar_div))
reg("aten.maximum")(_binary("maximum"))
reg("aten.minimum")(_binary("minimum"))
for _cmp in ("eq", "ne", "lt", "le", "gt", "ge"):
    reg(f"aten.{_cmp}")(_binary(_cmp))
reg("aten.logical_and")(_binary("logical_and"))
reg("aten.logical_or")(_binary("logical_or"))
reg("aten.bitwise_and")(_binary("logical_and"))
reg("aten.bitwise_or")(_binary("logical_or"))


@reg("aten.clamp")
def _clamp(c, n, x, min=None, max=None):
    """clamp(x, lo, hi) = minimum(maximum(x, lo), hi) (torch applies the lower bound first)."""
    dt = ir_dtype(_out(c, n))
    if ir_dtype(c.val(x)) != dt:
        c.fail("clamp changing the dtype class")
    out = c.ir(x)
    for op, bound in (("maximum", min), ("minimum", max)):
        if bound is None:
            continue
        if isinstance(bound, float) and dt == "int":
            c.fail("clamp of an int tensor with a float bound")
        out = c.emit(op, [out, c.ir(bound, dt)], base=f"{n.name}_{op[:3]}")
    return out


@reg("aten.topk")
def _topk(c, n, x, k, dim=-1, largest=True, sorted=True):
    """The k largest along dim, descending.  torch leaves the order of ties (and with ``sorted=False``
    the order of the k results) unspecified; the IR op's order -- descending, lower index first on
    ties -- is one of the orders torch may return."""
    if not largest:
        c.fail("topk with largest=False")
    d = int(dim) % len(_shape(c.val(x)))
    return c.emit("topk", [c.ir(x)], {"k": int(k), "dim": d}, n_out=2)


@reg("aten.rsub")
def _rsub(c, n, a, b, alpha=1):
    if alpha != 1:
        c.fail("rsub with alpha")
    return c.emit("sub", [c.ir(b), c.ir(a)])


for _u, _ir in (("neg", "neg"), ("exp", "exp"), ("log", "log"), ("sqrt", "sqrt"), ("rsqrt", "rsqrt"),
                ("tanh", "tanh"), ("sigmoid", "sigmoid"), ("silu", "silu"), ("relu", "relu"),
                ("abs", "abs"), ("reciprocal", "reciprocal"), ("sin", "sin"), ("cos", "cos"),
                ("logical_not", "logical_not"), ("bitwise_not", "logical_not")):
    reg(f"aten.{_u}")(lambda c, n, x, _ir=_ir: c.emit(_ir, [c.ir(x)]))


@reg("aten.gelu")
def _gelu(c, n, x, approximate="none"):
    return c.emit("gelu", [c.ir(x)], {"approximate": approximate})


@reg("aten.pow")
def _pow(c, n, x, e):
    if not isinstance(e, (int, float)):
        c.fail("pow with a tensor exponent")
    if e == 1:
        return c.ir(x)
    if e == 2:
        return c.emit("square", [c.ir(x)])
    return c.emit("pow", [c.ir(x)], {"exponent": e})


@reg("aten.tanh_backward")
def _tanh_bwd(c, n, g, y):
    sq = c.emit("square", [c.ir(y)], base=f"{n.name}_ysq")
    d = c.emit("sub", [c.const(1), sq], base=f"{n.name}_d")
    return c.emit("mul", [c.ir(g), d])


@reg("aten.sigmoid_backward")
def _sigmoid_bwd(c, n, g, y):
    one_minus = c.emit("sub", [c.const(1), c.ir(y)], base=f"{n.name}_1my")
    d = c.emit("mul", [c.ir(y), one_minus], base=f"{n.name}_d")
    return c.emit("mul", [c.ir(g), d])


@reg("aten.silu_backward")
def _silu_bwd(c, n, g, x):
    # d/dx x*s(x) = s + x*s*(1-s) = s * (1 + x*(1-s))
    s = c.emit("sigmoid", [c.ir(x)], base=f"{n.name}_s")
    oms = c.emit("sub", [c.const(1), s], base=f"{n.name}_1ms")
    xo = c.emit("mul", [c.ir(x), oms], base=f"{n.name}_xo")
    t = c.emit("add_scalar", [xo], {"value": 1}, base=f"{n.name}_t")
    d = c.emit("mul", [s, t], base=f"{n.name}_d")
    return c.emit("mul", [c.ir(g), d])


@reg("aten.threshold_backward")
def _thr_bwd(c, n, g, x, thr):
    cond = c.emit("gt", [c.ir(x), c.const(thr)], base=f"{n.name}_gt")
    return c.emit("where", [cond, c.ir(g), c.const(0)])


@reg("aten.where")
def _where(c, n, cond, a, b):
    dt = ir_dtype(_out(c, n))
    return c.emit("where", [c.ir(cond, "int"), c.ir(a, dt), c.ir(b, dt)])


@reg("aten.masked_fill")
def _masked_fill(c, n, x, mask, value):
    if isinstance(value, torch.fx.Node):
        c.fail("masked_fill with a tensor value")
    if isinstance(value, float) and (math.isinf(value) or math.isnan(value)):
        c.fail(f"masked_fill value {value} is not a finite real; use a large finite negative number")
    return c.emit("masked_fill", [c.ir(x), c.ir(mask, "int")], {"value": value})


# -------------------------------------------------------------- reductions
def _dims(c, x, dims):
    r = len(c.val(x).shape)
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(r))
    if isinstance(dims, int):
        dims = [dims]
    return [int(d) % max(r, 1) for d in dims]


def _reduction(op):
    def h(c, n, x, dims=None, keepdim=False, *a, dtype=None, **k):
        if isinstance(dims, torch.dtype):  # sum.default(x, dtype)
            dims = None
        ds = _dims(c, x, dims)
        if not ds:
            return c.ir(x)
        return c.emit(op, [c.ir(x)], {"dims": ds, "keepdim": bool(keepdim)})
    return h


reg("aten.sum")(_reduction("sum"))
reg("aten.mean")(_reduction("mean"))
reg("aten.amax")(_reduction("amax"))
reg("aten.amin")(_reduction("amin"))


# -------------------------------------------------------------- softmax family / losses
@reg("aten._softmax")
def _softmax(c, n, x, dim, half=False):
    return c.emit("softmax", [c.ir(x)], {"dim": int(dim)})


@reg("aten._safe_softmax")
def _safe_softmax(c, n, x, dim, dtype=None):
    """SDPA's math backend: softmax, except that rows which are entirely -inf give 0 instead of NaN.
    IR values are finite (no constant can be infinite), so no row is entirely -inf: softmax."""
    if dtype is not None and ir_dtype(_out(c, n)) != "float":
        c.fail(f"_safe_softmax to dtype {dtype}")
    return c.emit("softmax", [c.ir(x)], {"dim": int(dim) % len(_shape(c.val(x)))})


@reg("aten._log_softmax")
def _log_softmax(c, n, x, dim, half=False):
    return c.emit("log_softmax", [c.ir(x)], {"dim": int(dim)})


@reg("aten._softmax_backward_data")
def _softmax_bwd(c, n, g, out, dim, dtype=None):
    return c.emit("softmax_backward", [c.ir(g), c.ir(out)], {"dim": int(dim)})


@reg("aten._log_softmax_backward_data")
def _log_softmax_bwd(c, n, g, out, dim, dtype=None):
    return c.emit("log_softmax_backward", [c.ir(g), c.ir(out)], {"dim": int(dim)})


def _nll_common(c, n, x, target, weight, reduction, ignore_index):
    if weight is not None:
        c.fail("nll_loss with class weights")
    xv = c.val(x)
    if len(xv.shape) != 2:
        c.fail(f"nll_loss on input of rank {len(xv.shape)} (only [N, C])")
    return int(xv.shape[0]), int(xv.shape[1])


@reg("aten.nll_loss_forward")
def _nll_fwd(c, n, x, target, weight, reduction, ignore_index):
    N, C = _nll_common(c, n, x, target, weight, reduction, ignore_index)
    oh = c.emit("one_hot", [c.ir(target, "int")], {"num_classes": C}, base=f"{n.name}_oh")
    picked = c.emit("mul", [c.ir(x), oh], base=f"{n.name}_picked")
    row = c.emit("sum", [picked], {"dims": [1]}, base=f"{n.name}_row")
    neg = c.emit("neg", [row], base=f"{n.name}_neg")
    if reduction == 0:
        loss = neg
    elif reduction == 1:
        loss = c.emit("mean", [neg], {"dims": [0]}, base=f"{n.name}_loss")
    else:
        loss = c.emit("sum", [neg], {"dims": [0]}, base=f"{n.name}_loss")
    total = c.const(float(N) if reduction == 1 else float(N))
    return (loss, total)


@reg("aten.nll_loss_backward")
def _nll_bwd(c, n, g, x, target, weight, reduction, ignore_index, total_weight):
    N, C = _nll_common(c, n, x, target, weight, reduction, ignore_index)
    oh = c.emit("one_hot", [c.ir(target, "int")], {"num_classes": C}, base=f"{n.name}_oh")
    noh = c.emit("neg", [oh], base=f"{n.name}_noh")
    gi = c.ir(g)
    if reduction == 0:
        gi = c.emit("unsqueeze", [gi], {"dim": 1}, base=f"{n.name}_g")
    out = c.emit("mul", [noh, gi], base=f"{n.name}_m" if reduction == 1 else None)
    if reduction == 1:
        out = c.emit("div", [out, c.const(N)])
    return out


# -------------------------------------------------------------- layout
@reg("aten.t")
def _t(c, n, x):
    if len(c.val(x).shape) < 2:
        return c.ir(x)
    return c.emit("transpose", [c.ir(x)], {"dim0": 0, "dim1": 1})


@reg("aten.transpose")
def _transpose(c, n, x, d0, d1):
    return c.emit("transpose", [c.ir(x)], {"dim0": int(d0), "dim1": int(d1)})


@reg("aten.permute")
def _permute(c, n, x, dims):
    return c.emit("permute", [c.ir(x)], {"dims": [int(d) for d in dims]})


@reg("aten.flip")
def _flip(c, n, x, dims):
    return c.emit("flip", [c.ir(x)], {"dims": [int(d) for d in dims]})


@reg("aten.view", "aten._unsafe_view", "aten.reshape")
def _view(c, n, x, shape):
    out = _shape(_out(c, n))
    if out == _shape(c.val(x)):
        return c.ir(x)
    return c.emit("reshape", [c.ir(x)], {"shape": out})


_BROADCASTING = {"aten.add", "aten.sub", "aten.mul", "aten.div", "aten.where", "aten.maximum", "aten.minimum",
                 "aten.eq", "aten.ne", "aten.lt", "aten.le", "aten.gt", "aten.ge"}


def _bshape(*shapes):
    n = max(len(s) for s in shapes)
    out = []
    for i in range(n):
        vals = [s[i - (n - len(s))] for s in shapes if i - (n - len(s)) >= 0]
        big = [v for v in vals if v != 1]
        out.append(big[0] if big else 1)
    return out


def _expand_redundant(n) -> bool:
    """expand(x) feeding only broadcasting elementwise ops that broadcast x to the same result anyway.

    Dropping such an expand is exact, and matters: on a rank, ``expand(scalar, local_shape)`` names
    the local shard shape, which no placement of a replicated operand explains."""
    x = n.args[0]
    if not isinstance(x, torch.fx.Node) or not n.users:
        return False
    xs = _shape(x.meta["val"])
    for u in n.users:
        if u.op != "call_function" or _pk(u) not in _BROADCASTING:
            return False
        shapes = [_shape(a.meta["val"]) if (a is not n and isinstance(a, torch.fx.Node)) else (xs if a is n else [])
                  for a in u.args]
        if _bshape(*shapes) != _shape(u.meta["val"]):
            return False
    return True


@reg("aten.expand")
def _expand(c, n, x, shape, implicit=False):
    out = _shape(_out(c, n))
    if out == _shape(c.val(x)) or _expand_redundant(n):
        return c.ir(x)
    return c.emit("expand", [c.ir(x)], {"shape": out})


@reg("aten.unsqueeze")
def _unsqueeze(c, n, x, dim):
    return c.emit("unsqueeze", [c.ir(x)], {"dim": int(dim) % (len(c.val(x).shape) + 1)})


@reg("aten.squeeze")
def _squeeze(c, n, x, dims=None):
    shp = _shape(c.val(x))
    if dims is None:
        ds = [i for i, s in enumerate(shp) if s == 1]
    else:
        ds = [int(d) % len(shp) for d in (dims if isinstance(dims, (list, tuple)) else [dims])]
        ds = [d for d in ds if shp[d] == 1]
    if not ds:
        return c.ir(x)
    return c.emit("squeeze", [c.ir(x)], {"dims": ds})


@reg("aten.slice")
def _slice(c, n, x, dim=0, start=None, end=None, step=1):
    shp = _shape(c.val(x))
    d = int(dim) % len(shp)
    size = shp[d]
    s = 0 if start is None else int(start)
    e = size if end is None else int(end)
    if s < 0:
        s += size
    if e < 0:
        e += size
    s, e = max(0, min(s, size)), max(0, min(e, size))
    e = max(e, s)
    if s == 0 and e == size and step == 1:
        return c.ir(x)
    attrs = {"dim": d, "start": s, "end": e}
    if step != 1:
        attrs["step"] = int(step)
    return c.emit("slice", [c.ir(x)], attrs)


@reg("aten.slice_backward")
def _slice_backward(c, n, g, input_sizes, dim, start, end, step):
    if step != 1:
        c.fail("slice_backward with step != 1")
    sizes = [int(x) for x in input_sizes]
    d = int(dim) % len(sizes)
    gs = _shape(c.val(g))
    s = int(start) if start is not None else 0
    s = s + sizes[d] if s < 0 else s
    s = max(0, min(s, sizes[d]))
    pads = []
    for i in range(len(sizes)):
        pads += [s, sizes[d] - s - gs[d]] if i == d else [0, 0]
    if not any(pads):
        return c.ir(g)
    return c.emit("pad", [c.ir(g)], {"pads": pads})


@reg("aten.select_backward")
def _select_backward(c, n, g, input_sizes, dim, index):
    sizes = [int(x) for x in input_sizes]
    d = int(dim) % len(sizes)
    i = int(index) % sizes[d]
    u = c.emit("unsqueeze", [c.ir(g)], {"dim": d}, base=f"{n.name}_u")
    pads = []
    for j in range(len(sizes)):
        pads += [i, sizes[d] - i - 1] if j == d else [0, 0]
    return c.emit("pad", [u], {"pads": pads})


@reg("aten.select")
def _select(c, n, x, dim, index):
    shp = _shape(c.val(x))
    d = int(dim) % len(shp)
    i = int(index) % shp[d]
    s = c.emit("slice", [c.ir(x)], {"dim": d, "start": i, "end": i + 1}, base=f"{n.name}_sl")
    return c.emit("squeeze", [s], {"dims": [d]})


@reg("aten.cat")
def _cat(c, n, xs, dim=0):
    xs = [x for x in xs if not (isinstance(x, torch.fx.Node) and 0 in _shape(c.val(x)))]
    r = len(_shape(_out(c, n)))
    if len(xs) == 1:
        return c.ir(xs[0])
    return c.emit("concat", [c.ir(x) for x in xs], {"dim": int(dim) % r})


@reg("aten.split", "aten.split_with_sizes")
def _split(c, n, x, sizes, dim=0):
    outs = _out(c, n)
    shp = _shape(c.val(x))
    d = int(dim) % len(shp)
    szs = [int(o.shape[d]) for o in outs]
    if len(szs) == 1:
        return [c.ir(x)]
    # Only one piece read (DTensor's Replicate -> Shard takes this rank's chunk): a slice, so that the
    # rank-dependent choice of piece becomes a rank-dependent offset (affine in the mesh coordinates).
    live = sorted({u.args[1] for u in n.users if u.target is operator.getitem and u.users})
    if len(live) == 1 and all(u.target is operator.getitem for u in n.users):
        i = int(live[0])
        start = sum(szs[:i])
        out: list = [None] * len(szs)
        out[i] = c.emit("slice", [c.ir(x)], {"dim": d, "start": start, "end": start + szs[i]})
        return out
    return c.emit("split", [c.ir(x)], {"dim": d, "sizes": szs}, n_out=len(szs))


@reg("aten.triu")
def _triu(c, n, x, diagonal=0):
    return c.emit("triu", [c.ir(x)], {"diagonal": int(diagonal)})


@reg("aten.tril")
def _tril(c, n, x, diagonal=0):
    return c.emit("tril", [c.ir(x)], {"diagonal": int(diagonal)})


# -------------------------------------------------------------- sources
def _fill(value_of):
    def h(c, n, *a, **k):
        out = _out(c, n)
        v = value_of(a, k)
        dt = ir_dtype(out)
        if dt == "int":
            v = int(v)
        return c.const(v, _shape(out), dt)
    return h


reg("aten.ones_like", "aten.ones", "aten.new_ones")(_fill(lambda a, k: 1))
reg("aten.zeros_like", "aten.zeros", "aten.new_zeros")(_fill(lambda a, k: 0))
reg("aten.full")(_fill(lambda a, k: a[1]))
reg("aten.full_like", "aten.new_full")(_fill(lambda a, k: a[1]))
reg("aten.scalar_tensor")(_fill(lambda a, k: a[0]))


@reg("aten.arange")
def _arange(c, n, *a, **k):
    nums = [x for x in a if isinstance(x, (int, float))]
    start, end, step = (0, nums[0], 1) if len(nums) == 1 else (nums[0], nums[1], nums[2] if len(nums) > 2 else 1)
    if not all(isinstance(v, int) for v in (start, end, step)):
        c.fail("arange with non-integer bounds")
    size = int(_out(c, n).shape[0])
    return c.emit("iota", [], {"size": size, "start": start, "step": step, "dtype": ir_dtype(_out(c, n))})


# -------------------------------------------------------------- indexing
@reg("aten.embedding")
def _embedding(c, n, w, ids, padding_idx=-1, scale_grad=False, sparse=False):
    return c.emit("embedding", [c.ir(w), c.ir(ids, "int")])


@reg("aten.embedding_dense_backward")
def _embedding_bwd(c, n, g, ids, num_weights, padding_idx=-1, scale_grad=False):
    if padding_idx not in (-1, None):
        c.fail("embedding backward with padding_idx")
    return c.emit("embedding_backward", [c.ir(g), c.ir(ids, "int")], {"num_weights": int(num_weights)})


@reg("aten.gather")
def _gather(c, n, x, dim, index, sparse_grad=False):
    return c.emit("gather", [c.ir(x), c.ir(index, "int")], {"dim": int(dim)})


@reg("aten.index_select")
def _index_select(c, n, x, dim, index):
    return c.emit("index_select", [c.ir(x), c.ir(index, "int")], {"dim": int(dim)})


@reg("aten.scatter_add")
def _scatter_add(c, n, x, dim, index, src):
    return c.emit("scatter_add", [c.ir(x), c.ir(index, "int"), c.ir(src)], {"dim": int(dim)})


@reg("aten.index_add")
def _index_add(c, n, x, dim, index, src, alpha=1):
    if alpha != 1:
        c.fail("index_add with alpha")
    return c.emit("index_add", [c.ir(x), c.ir(index, "int"), c.ir(src)], {"dim": int(dim)})


@reg("aten.empty", "aten.empty_strided", "aten.empty_like", "aten.new_empty")
def _empty(c, n, *a, **k):
    """Uninitialised memory has no value; only an unused one (``torch.empty(shape, device="meta").stride()``
    in transformers' TP layers) or one that is only ever the destination of ``copy_`` (a collective's
    output buffer) is accepted, and it produces nothing."""
    if any(not (_pk(u) == "aten.copy_" and u.args[0] is n and n not in u.args[1:]) for u in n.users):
        c.fail("uninitialised tensor (torch.empty) whose contents are read")
    return None


_VIEW_OPS = {"view", "_unsafe_view", "reshape", "slice", "select", "transpose", "t", "permute", "expand",
             "unsqueeze", "squeeze", "alias", "detach", "as_strided", "view_as", "split", "split_with_sizes",
             "narrow", "diagonal", "unflatten", "flatten", "chunk", "unbind"}


@reg("aten.index_put_", "aten.index_put")
def _index_put(c, n, x, indices, values, accumulate=False):
    """``x[mask] = v`` with a boolean mask over the leading dims and a one-element ``v`` (DTensor's
    vocab-parallel embedding zeroes out-of-shard ids and rows this way): ``where(mask, v, x)``.

    The in-place form rebinds ``x`` to the result for the nodes after it; that is only sound when
    nothing aliases ``x``: ``x`` must be produced by a non-view op and have no users before this node."""
    if accumulate:
        c.fail("index_put with accumulate=True")
    idx = list(indices)
    if len(idx) == 2 and all(isinstance(i, torch.fx.Node) for i in idx):
        return _index_put_rows(c, n, x, idx, values)
    if len(idx) != 1 or not isinstance(idx[0], torch.fx.Node) or c.val(idx[0]).dtype != torch.bool:
        c.fail("index_put with other than one boolean mask index")
    xv, mv, vv = c.val(x), c.val(idx[0]), c.val(values)
    if not isinstance(x, torch.fx.Node) or _shape(mv) != _shape(xv)[:len(mv.shape)]:
        c.fail(f"index_put mask of shape {_shape(mv)} is not a prefix of the target's shape {_shape(xv)}")
    if isinstance(values, torch.fx.Node) and (vv is None or vv.numel() != 1):
        c.fail("index_put with a values tensor of more than one element")
    inplace = str(n.target).startswith("aten.index_put_")
    if inplace:
        _check_unaliased(c, n, x, "index_put")
    m = c.ir(idx[0], "int")
    for _ in range(len(xv.shape) - len(mv.shape)):
        m = c.emit("unsqueeze", [m], {"dim": len(c.val(idx[0]).shape) + _}, base=f"{n.name}_m")
    dt = ir_dtype(xv)
    v = c.ir(values, dt)
    if isinstance(values, torch.fx.Node) and len(vv.shape):
        v = c.emit("reshape", [v], {"shape": []}, base=f"{n.name}_v")
    out = c.emit("where", [m, v, c.ir(x, dt)])
    if inplace:
        c.env[x] = out
    return out


def _index_put_rows(c, n, x, idx, values):
    """``x[arange(N), j] = v`` on a 2-D ``x`` [N, C] (one element per row, e.g. the target column of a
    cross-entropy gradient): ``where(one_hot(j, C), v[:, None], x)``.  Exact because the row index is
    literally ``arange(N)`` (every row written once); the one_hot conversion checks 0 <= j < C."""
    rows, cols = idx
    xv, rv, jv, vv = c.val(x), c.val(rows), c.val(cols), c.val(values)
    N = _shape(xv)[0] if len(_shape(xv)) == 2 else None
    is_arange = (_pk(rows) == "aten.arange" and _shape(rv) == [N]
                 and [a for a in rows.args if not isinstance(a, torch.device)] in ([N], [0, N], [0, N, 1]))
    if N is None or not is_arange or _shape(jv) != [N] or jv.dtype.is_floating_point:
        c.fail("index_put with two indices other than x[arange(N), j] on a 2-D x")
    if str(n.target).startswith("aten.index_put_"):
        _check_unaliased(c, n, x, "index_put")
    dt = ir_dtype(xv)
    v = c.ir(values, dt)
    if isinstance(values, torch.fx.Node):
        vs = _shape(vv)
        if vs == [N]:
            v = c.emit("unsqueeze", [v], {"dim": 1}, base=f"{n.name}_v")
        elif vv.numel() == 1 and vs:
            v = c.emit("reshape", [v], {"shape": []}, base=f"{n.name}_v")
        elif vs:
            c.fail(f"index_put values of shape {vs} for {N} rows")
    oh = c.emit("one_hot", [c.ir(cols, "int")], {"num_classes": _shape(xv)[1]}, base=f"{n.name}_oh")
    out = c.emit("where", [oh, v, c.ir(x, dt)])
    if str(n.target).startswith("aten.index_put_"):
        c.env[x] = out
    return out


def _check_unaliased(c, n, x, what: str) -> None:
    """An in-place write to ``x`` is converted by rebinding ``x`` to the result for the nodes after it;
    that is only sound when nothing aliases ``x``: ``x`` must be produced by a non-view op and no view of
    it may be taken before this node (ops that merely *read* ``x`` before the write read the old value,
    as the graph says; make_fx records later reads against the write's result)."""
    def packet(m):
        t = m.target if isinstance(m, torch.fx.Node) and m.op == "call_function" else None
        return getattr(getattr(t, "overloadpacket", None), "__name__", str(t)), t

    pname, prod = packet(x)
    order = {m: i for i, m in enumerate(c.gm.graph.nodes)}
    if prod is None or pname in _VIEW_OPS or any(
            order[u] < order[n] and (packet(u)[0] in _VIEW_OPS or packet(u)[1] is None) for u in x.users if u is not n):
        c.fail(f"in-place {what} on a tensor that may be aliased (a view, an input, or viewed before the write)")


def _inplace(packet: str):
    """``x.op_(...)``: the out-of-place conversion, then ``x`` is rebound to the result."""
    def h(c, n, x, *a, **k):
        _check_unaliased(c, n, x, packet)
        if ir_dtype(c.val(x)) != ir_dtype(_out(c, n)):
            c.fail("an in-place op changing the dtype class")
        base = TABLE[packet]
        out = base(c, n, x, *a, **k)
        c.env[x] = out
        return out
    return h


for _ip in ("add", "sub", "mul", "div"):
    reg(f"aten.{_ip}_")(_inplace(f"aten.{_ip}"))


@reg("aten.copy_")
def _copy_(c, n, dst, src, non_blocking=False):
    """``dst.copy_(src)`` (how a collective's result lands in its output buffer): ``dst`` is rebound to
    ``src`` broadcast to ``dst``'s shape and cast to its dtype class."""
    _check_unaliased(c, n, dst, "copy_")
    dv, sv = c.val(dst), c.val(src)
    out = c.ir(src, ir_dtype(dv))
    if isinstance(src, torch.fx.Node):
        if ir_dtype(sv) != ir_dtype(dv):
            out = c.emit("cast", [out], {"dtype": ir_dtype(dv)}, base=f"{n.name}_cast")
        if _shape(sv) != _shape(dv):
            out = c.emit("expand", [out], {"shape": _shape(dv)})
    elif _shape(dv):
        out = c.emit("expand", [out], {"shape": _shape(dv)})
    c.env[dst] = out
    return out


# -------------------------------------------------------------- collectives
@reg("c10d.allreduce_", "c10d.allgather_", "c10d._allgather_base_", "c10d.reduce_scatter_",
     "c10d._reduce_scatter_base_", "c10d.alltoall_", "c10d.broadcast_")
def _inplace_c10d(c, n, *a, **k):
    c.fail("classic in-place collective (torch.distributed.all_reduce & co.): its result aliases its input and "
           "its group is an opaque object; use torch.distributed._functional_collectives (funcol.all_reduce ...)")


_REDUCE = {"sum": "sum", "avg": "avg", "max": "max", "SUM": "sum", "AVG": "avg", "MAX": "max"}


def _axis(c, group):
    if c.axis_of_group is None:
        c.fail("a collective in a graph traced without a mesh")
    try:
        return c.axis_of_group(group)
    except KeyError as exc:
        c.fail(f"process group {group!r} does not match a set of mesh axes: {exc}")


def _red(c, op):
    r = _REDUCE.get(str(op))
    if r is None:
        c.fail(f"reduce op {op!r} (only sum, avg, max)")
    return r


@reg("_c10d_functional.all_reduce")
def _all_reduce(c, n, x, op, group):
    # NOTE: a 0-d all_reduce (the loss) is emitted as is; the reference interpreter's exact mode
    # crashes on it (collectives._reduce returns a bare Fraction for 0-d object arrays), see the
    # front-end notes.  Reshaping to [1] and back would hide the loss from the engine's matcher.
    attrs = {"axis": _axis(c, group), "reduce": _red(c, op)}
    return c.emit("all_reduce", [c.ir(x)], attrs)


@reg("_c10d_functional.all_gather_into_tensor", "_c10d_functional_autograd.all_gather_into_tensor")
def _all_gather(c, n, x, group_size, group):
    return c.emit("all_gather", [c.ir(x)], {"axis": _axis(c, group), "dim": 0})


@reg("_c10d_functional.reduce_scatter_tensor", "_c10d_functional_autograd.reduce_scatter_tensor")
def _reduce_scatter(c, n, x, op, group_size, group):
    return c.emit("reduce_scatter", [c.ir(x)], {"axis": _axis(c, group), "dim": 0, "reduce": _red(c, op)})


@reg("_c10d_functional.all_to_all_single", "_c10d_functional_autograd.all_to_all_single")
def _all_to_all(c, n, x, out_splits, in_splits, group):
    shp = _shape(c.val(x))
    for sp in (out_splits, in_splits):
        if sp and len(set(int(s) for s in sp)) > 1:
            c.fail(f"all_to_all_single with uneven splits {list(sp)}")
    return c.emit("all_to_all", [c.ir(x)], {"axis": _axis(c, group), "split_dim": 0, "concat_dim": 0}) \
        if len(shp) else c.fail("all_to_all of a scalar")


@reg("_c10d_functional.broadcast")
def _broadcast(c, n, x, src, group):
    return c.emit("broadcast", [c.ir(x)], {"axis": _axis(c, group), "root": int(src)})


# -------------------------------------------------------------- spmd_types local conversions
# ``spmd_types`` (torchtitan's default SPMD backend) registers its communication-free type conversions as
# custom ops; ``rank`` is this rank's index in the group, a python int, so the offsets differ per rank and
# SPMD compression turns them into ``rank.<axis>`` expressions.
def _spmd_chunk(c, x, world_size, split_dim, rank):
    shp = _shape(c.val(x))
    d = int(split_dim) % len(shp)
    if shp[d] % int(world_size):
        c.fail(f"uneven split of size {shp[d]} over {world_size} ranks")
    return d, shp[d] // int(world_size), int(rank)


@reg("spmd_types.replicate_to_varying")
def _spmd_r2v(c, n, x, world_size, split_dim, rank, stack):
    """This rank's chunk of a replicated tensor: ``chunk(x, ws, d)[rank]`` (``stack``: ``x.select(d, rank)``)."""
    if stack:
        return _select(c, n, x, split_dim, rank)
    d, k, r = _spmd_chunk(c, x, world_size, split_dim, rank)
    return c.emit("slice", [c.ir(x)], {"dim": d, "start": r * k, "end": r * k + k})


@reg("spmd_types.varying_to_partial")
def _spmd_v2p(c, n, x, world_size, split_dim, rank, stack):
    """Zeros with ``x`` at this rank's block along ``d`` (``stack``: at index ``rank`` of a new dim ``d``)."""
    shp = _shape(c.val(x))
    ws, r = int(world_size), int(rank)
    src = c.ir(x)
    if stack:
        d = int(split_dim) % (len(shp) + 1)
        src = c.emit("unsqueeze", [src], {"dim": d}, base=f"{n.name}_u")
        k = 1
    else:
        d, k = int(split_dim) % len(shp), shp[int(split_dim) % len(shp)]
    pads = []
    for i in range(len(_shape(_out(c, n)))):
        pads += [r * k, (ws - r - 1) * k] if i == d else [0, 0]
    return c.emit("pad", [src], {"pads": pads})


# -------------------------------------------------------------- complex tensors
# A complex tensor of shape S is carried as its real view, a float tensor of shape S + [2] (real, imaginary
# parts), exactly what ``torch.view_as_real`` returns.  ``view_as_complex`` / ``view_as_real`` are then
# aliases, and the few ops complex RoPE (torchtitan ``ComplexRoPE``, Meta's Llama reference) applies to
# complex values are written out on the two parts with real IR ops.  An op that reads or produces a complex
# tensor and is not in this table is unsupported (never converted as if the tensor were real).
COMPLEX_TABLE: dict[str, Callable[..., Any]] = {}


def _is_complex(v: Any) -> bool:
    dt = getattr(v, "dtype", None)
    return dt is not None and dt.is_complex


def _touches_complex(n: torch.fx.Node) -> bool:
    if any(_is_complex(o) for o in _flat(n.meta.get("val"))):
        return True
    return any(isinstance(a, torch.fx.Node) and _is_complex(a.meta.get("val")) for a in _flat(list(n.args)))


def creg(*names: str):
    def deco(fn):
        for nm in names:
            COMPLEX_TABLE[nm] = fn
        return fn
    return deco


@creg("aten.view_as_complex", "aten.view_as_real")
def _c_view_as(c, n, x):
    return c.ir(x)


@creg("aten.clone", "aten.alias", "aten.detach", "aten.contiguous", "aten.resolve_conj", "aten._to_copy")
def _c_alias(c, n, x, *a, **k):
    v, out = c.val(x), _out(c, n)
    if v.dtype != out.dtype:
        c.fail(f"dtype change {v.dtype} -> {out.dtype} of a complex value")
    return c.ir(x)


def _c_parts(c, x, base):
    """(real, imaginary) of a complex operand, each [..., 1]; a real tensor operand is (x[..., None], None)."""
    v = c.val(x)
    if not isinstance(x, torch.fx.Node):
        c.fail("a python scalar operand of a complex op")
    if not _is_complex(v):
        return c.emit("unsqueeze", [c.ir(x)], {"dim": len(_shape(v))}, base=f"{base}_u"), None
    r = len(_shape(v))
    re = c.emit("slice", [c.ir(x)], {"dim": r, "start": 0, "end": 1}, base=f"{base}_re")
    im = c.emit("slice", [c.ir(x)], {"dim": r, "start": 1, "end": 2}, base=f"{base}_im")
    return re, im


@creg("aten._conj", "aten.conj", "aten.conj_physical")
def _c_conj(c, n, x):
    re, im = _c_parts(c, x, n.name)
    if im is None:
        c.fail("conj of a real tensor")
    nim = c.emit("neg", [im], base=f"{n.name}_nim")
    return c.emit("concat", [re, nim], {"dim": len(_shape(c.val(x)))})


@creg("aten.mul")
def _c_mul(c, n, a, b):
    """(ar + i ai)(br + i bi) = (ar br - ai bi) + i (ar bi + ai br); a real operand scales both parts."""
    if not isinstance(a, torch.fx.Node) or not isinstance(b, torch.fx.Node):
        s = b if isinstance(a, torch.fx.Node) else a
        x = a if isinstance(a, torch.fx.Node) else b
        if isinstance(s, complex) or not isinstance(s, (int, float)):
            c.fail(f"complex scalar factor {s!r}")
        return c.emit("scale", [c.ir(x)], {"value": s})
    ar, ai = _c_parts(c, a, f"{n.name}_a")
    br, bi = _c_parts(c, b, f"{n.name}_b")
    out_rank = len(_shape(_out(c, n)))
    if ai is None or bi is None:  # real * complex: the real factor [..., 1] broadcasts over both parts
        z, r = (b, ar) if ai is None else (a, br)
        return c.emit("mul", [c.ir(z), r])
    rr = c.emit("mul", [ar, br], base=f"{n.name}_rr")
    ii = c.emit("mul", [ai, bi], base=f"{n.name}_ii")
    ri = c.emit("mul", [ar, bi], base=f"{n.name}_ri")
    ir_ = c.emit("mul", [ai, br], base=f"{n.name}_ir")
    re = c.emit("sub", [rr, ii], base=f"{n.name}_re")
    im = c.emit("add", [ri, ir_], base=f"{n.name}_im")
    return c.emit("concat", [re, im], {"dim": out_rank})


@creg("aten.view", "aten._unsafe_view", "aten.reshape")
def _c_view(c, n, x, shape):
    out = _shape(_out(c, n))
    if out == _shape(c.val(x)):
        return c.ir(x)
    return c.emit("reshape", [c.ir(x)], {"shape": out + [2]})


@creg("aten.slice")
def _c_slice(c, n, x, dim=0, start=None, end=None, step=1):
    # leading dims of the real view are the complex tensor's dims: the real slice applies as is
    return _slice(c, n, x, int(dim) % len(_shape(c.val(x))), start, end, step)


@creg("aten.unsqueeze")
def _c_unsqueeze(c, n, x, dim):
    return _unsqueeze(c, n, x, dim)


@creg("aten.expand")
def _c_expand(c, n, x, shape, implicit=False):
    out = _shape(_out(c, n))
    if out == _shape(c.val(x)):
        return c.ir(x)
    return c.emit("expand", [c.ir(x)], {"shape": out + [2]})
