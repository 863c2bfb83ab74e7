"""The op specification interface and registry.

Every op kind is defined in exactly one class: its attributes, shape inference, index-level
semantics (``eval``, used by the reference interpreter) and dependency map (``deps``, used by
shape-reduction checks).  Analyses look ops up by name in ``REGISTRY``.

Conventions
-----------
* Shapes passed to ``infer``/``eval``/``deps`` are concrete tuples of ints; attributes are
  already resolved (dim expressions evaluated) by :func:`resolve_attrs`.
* ``eval`` works on numpy arrays.  In float mode they are float64 (int64 for index tensors);
  in exact mode they are object arrays of ``fractions.Fraction`` (and ints), and every
  nonlinear scalar function goes through ``ctx.fn(name, array)`` so the interpreter can replace
  it by a deterministic pseudo-random table.  Never call ``np.exp`` etc. directly.
* Collectives are not evaluated by ``eval``: the interpreter calls ``simulate`` with the inputs
  of every rank in one group.
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Callable, ClassVar, Mapping, Sequence

import numpy as np

from ..shapes import DimError, dim_value

Shape = tuple[int, ...]


class ShapeError(ValueError):
    """Shape inference failed; the message says which input and which dim."""


class AttrError(ValueError):
    """An attribute is missing, unknown or of the wrong type."""


# ---------------------------------------------------------------- attributes
# Attribute kinds:
#   "int"    plain integer (e.g. a tensor dim index; negative counts from the end)
#   "ints"   list of plain integers
#   "dim"    size/offset expression (int or string over dims and rank.<axis>)
#   "dims"   list of such expressions
#   "num"    number (int/float) or "dim" expression string (evaluated to int)
#   "str"    string; "strs" list of strings; "bool"; "any" JSON value
#   "tensor" a "num" or a nested list of "num"s (a tensor literal, e.g. const's value)
ATTR_KINDS = {"int", "ints", "dim", "dims", "num", "str", "strs", "bool", "any", "tensor"}


@dataclass(frozen=True)
class Attr:
    kind: str
    required: bool = True
    default: Any = None
    choices: tuple | None = None


def resolve_attrs(spec: "OpSpec", attrs: Mapping[str, Any], env: Mapping[str, int]) -> dict:
    """Check attribute names/types and evaluate dim expressions against ``env``."""
    out: dict[str, Any] = {}
    for key in attrs:
        if key not in spec.attrs:
            known = ", ".join(sorted(spec.attrs)) or "none"
            raise AttrError(f"unknown attribute {key!r} for op {spec.name!r} (known: {known})")
    for key, a in spec.attrs.items():
        if key not in attrs:
            if a.required:
                raise AttrError(f"op {spec.name!r} needs attribute {key!r}")
            out[key] = a.default
            continue
        out[key] = _resolve_one(spec.name, key, a, attrs[key], env)
    return out


def concrete_attrs(op: str, attrs: Mapping[str, Any]) -> dict:
    """Attributes of an expression node (already concrete: no dim names) as ``eval`` takes them: lists as tuples,
    the defaults filled in (the prover's expression tables and the conformance runner evaluate through this)."""
    spec = REGISTRY[op]
    out = dict(attrs)
    for k, a in spec.attrs.items():
        if k in out and isinstance(out[k], list) and a.kind in ("ints", "dims", "strs"):
            out[k] = tuple(out[k])
        if k not in out and not a.required:
            out[k] = a.default
    return out


def _resolve_one(op: str, key: str, a: Attr, v: Any, env: Mapping[str, int]) -> Any:
    where = f"attribute {key!r} of op {op!r}"
    try:
        if a.kind == "int":
            if type(v) is not int:
                raise AttrError(f"{where} must be an integer, got {v!r}")
            return v
        if a.kind == "ints":
            if not isinstance(v, list) or any(type(x) is not int for x in v):
                raise AttrError(f"{where} must be a list of integers, got {v!r}")
            return tuple(v)
        if a.kind == "dim":
            return dim_value(v, env)
        if a.kind == "dims":
            if not isinstance(v, list):
                raise AttrError(f"{where} must be a list of dims, got {v!r}")
            out = tuple(dim_value(x, env) for x in v)
            if op in ("reshape", "view") and key == "shape":
                for x, got in zip(v, out):
                    if not isinstance(x, int) and got < 0:  # only the literal -1 means "inferred"
                        raise AttrError(f"{where}: dim expression {str(x)[:80]!r} evaluates to {got}, a negative size "
                                        f"(only the literal -1 asks for an inferred size)")
            return out
        if a.kind == "num":
            if isinstance(v, bool):
                raise AttrError(f"{where} must be a number, got {v!r}")
            if isinstance(v, (int, float)):
                return v
            if isinstance(v, str):
                return dim_value(v, env)
            raise AttrError(f"{where} must be a number, got {v!r}")
        if a.kind == "tensor":
            return _resolve_tensor(where, v, env)
        if a.kind == "str":
            if not isinstance(v, str):
                raise AttrError(f"{where} must be a string, got {v!r}")
            if a.choices and v not in a.choices:
                raise AttrError(f"{where} must be one of {list(a.choices)}, got {v!r}")
            return v
        if a.kind == "axes":
            if isinstance(v, str) and v:
                return v
            if isinstance(v, list) and v and all(isinstance(x, str) and x for x in v):
                return tuple(v)
            raise AttrError(f"{where} must be a mesh axis name or a non-empty list of names, got {v!r}")
        if a.kind == "strs":
            if not isinstance(v, list) or any(not isinstance(x, str) for x in v):
                raise AttrError(f"{where} must be a list of strings, got {v!r}")
            return tuple(v)
        if a.kind == "bool":
            if not isinstance(v, bool):
                raise AttrError(f"{where} must be true or false, got {v!r}")
            return v
        return v
    except DimError as exc:
        raise AttrError(f"{where}: {exc}") from None


MAX_TENSOR_NESTING = 32  # a tensor literal nested deeper than any real tensor's rank is bad input


def _resolve_tensor(where: str, v: Any, env: Mapping[str, int], depth: int = 0) -> Any:
    """A number, a dim expression, or a nested list of them (resolved element by element)."""
    if isinstance(v, list):
        if depth >= MAX_TENSOR_NESTING:
            raise AttrError(f"{where} is a tensor literal nested more than {MAX_TENSOR_NESTING} levels deep")
        return [_resolve_tensor(where, x, env, depth + 1) for x in v]
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise AttrError(f"{where} must be a number or a nested list of numbers, got {v!r}")
    return dim_value(v, env) if isinstance(v, str) else v


# ---------------------------------------------------------------- dependency maps
@dataclass(frozen=True)
class AxisDep:
    """How one dim of an input index is computed from the output index.

    kind "affine": in_idx = const + sum(coef * out_idx[k] for k, coef in terms)
    kind "all":    every index of the dim is read (a reduction / contraction range)
    kind "data":   the index comes from data (gather); not affine
    kind "other":  a known but non-affine map (e.g. reshape's div/mod)
    """

    kind: str
    terms: tuple[tuple[int, int], ...] = ()
    const: int = 0


@dataclass(frozen=True)
class InputDep:
    """The dependency map of one input: one AxisDep per input dim."""

    axes: tuple[AxisDep, ...]

    @property
    def affine(self) -> bool:
        return all(a.kind in ("affine", "all") for a in self.axes)


def identity_dep(in_shape: Shape, out_shape: Shape) -> InputDep:
    """Broadcasting elementwise read: input dim i aligned to output dim from the right."""
    off = len(out_shape) - len(in_shape)
    axes = []
    for i, n in enumerate(in_shape):
        if n == 1 and out_shape[off + i] != 1:
            axes.append(AxisDep("affine", (), 0))
        else:
            axes.append(AxisDep("affine", ((off + i, 1),), 0))
    return InputDep(tuple(axes))


# ---------------------------------------------------------------- eval context
class TablesNeeded(Exception):
    """An exact run that must not use function tables reached a nonlinear function."""


class Ctx:
    """Evaluation context: float64 or exact arithmetic with function tables."""

    def __init__(self, exact: bool = False, seed: int = 0, no_tables: bool = False):
        self.exact = exact
        self.seed = seed
        self.no_tables = no_tables  # exact mode: stop at the first nonlinear function instead of tabling it

    # nonlinear scalar functions -------------------------------------------------
    _FLOAT_FNS: ClassVar[dict[str, Callable]] = {
        "exp": np.exp,
        "log": np.log,
        "sqrt": np.sqrt,
        "rsqrt": lambda x: 1.0 / np.sqrt(x),
        "tanh": np.tanh,
        "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
        "erf": None,  # filled lazily (math.erf vectorized)
        "sin": np.sin,
        "cos": np.cos,
    }

    def fn(self, name: str, x: np.ndarray) -> np.ndarray:
        if not self.exact:
            if name == "erf":
                import math

                return np.vectorize(math.erf, otypes=[np.float64])(x)
            f = self._FLOAT_FNS.get(name)
            if f is None:
                raise ValueError(f"no float semantics for function {name!r}")
            with np.errstate(all="ignore"):
                return f(x)
        if self.no_tables:
            raise TablesNeeded(name)
        return np.vectorize(lambda v: table_value(name, v, self.seed), otypes=[object])(x)

    def const(self, v: Any) -> Any:
        """A scalar constant in this context's number type."""
        if self.exact:  # a float literal is the decimal it is written as (0.1 is 1/10), as in SMT and the prover
            return v if isinstance(v, Fraction) else Fraction(str(v)) if isinstance(v, float) else Fraction(v)
        return float(v)

    def zeros(self, shape: Shape) -> np.ndarray:
        if self.exact:
            out = np.empty(shape, dtype=object)
            out.fill(Fraction(0))
            return out
        return np.zeros(shape, dtype=np.float64)

    def full(self, shape: Shape, v: Any) -> np.ndarray:
        if self.exact:
            out = np.empty(shape, dtype=object)
            out.fill(self.const(v))
            return out
        return np.full(shape, float(v), dtype=np.float64)

    def asarray(self, x: Any) -> np.ndarray:
        if self.exact:
            a = np.asarray(x, dtype=object)
            return np.vectorize(self.const, otypes=[object])(a) if a.size else a
        return np.asarray(x, dtype=np.float64)


def table_value(name: str, v: Any, seed: int) -> Fraction:
    """A fixed pseudo-random rational for f(v): exact, deterministic, and discriminating.

    Equal arguments give equal values (so f stays a function) and distinct arguments almost
    surely give distinct values, which is what an uninterpreted function needs.
    """
    import hashlib

    q = Fraction(v)
    h = hashlib.sha256(f"{name}|{seed}|{q.numerator}/{q.denominator}".encode()).digest()
    n = int.from_bytes(h[:4], "little")
    val = Fraction(n % 2000 + 1, 997)  # positive, so log/rsqrt/divide stay defined
    if name in ("tanh", "sin", "cos", "erf"):
        val -= Fraction(1)  # allow signs where the real function has them
    return val


# ---------------------------------------------------------------- op base class
class OpSpec:
    """Base of every op kind.  Subclasses set the class attributes and override methods."""

    name: ClassVar[str] = ""
    category: ClassVar[str] = ""  # elementwise | linalg | reduce | layout | index | nn | source | collective | p2p
    attrs: ClassVar[dict[str, Attr]] = {}
    arity: ClassVar[tuple[int, int | None]] = (1, 1)  # (min, max); max None = unbounded
    linear: ClassVar[bool] = False  # additive jointly in its data inputs (index inputs fixed), whatever the attributes
    doc: ClassVar[str] = ""

    # Algebraic flags are mathematical claims the kernel relies on: each one is proved for that op in
    # Rules/OpFlags.v (the theorems listed for the op in ``OPFLAGS`` of tvcert.proofkit).  They are functions
    # of the (resolved) attributes, since e.g. a cast is linear only into a float dtype.
    def linear_in(self, attrs: Mapping[str, Any]) -> tuple[int, ...]:
        """The inputs in which the op is additive (and sends 0 to 0) while the other inputs stay fixed:
        what ``partial_linear_map`` needs of an op applied to one Partial operand and replicated others."""
        return ()

    def homogeneous_in(self, attrs: Mapping[str, Any]) -> tuple[int, ...]:
        """The inputs i with op(.., c*x_i, ..) = c*op(.., x_i, ..) for every rational c (the other inputs
        fixed): what ``scale_commutes_linear`` needs to move a scalar factor across the op."""
        return self.linear_in(attrs)

    def n_outputs(self, attrs: Mapping[str, Any]) -> int:
        return 1

    def infer(self, shapes: Sequence[Shape], attrs: Mapping[str, Any]) -> list[Shape]:
        raise NotImplementedError

    def eval(self, xs: Sequence[np.ndarray], attrs: Mapping[str, Any], ctx: Ctx) -> list[np.ndarray]:
        raise NotImplementedError

    def deps(self, shapes: Sequence[Shape], attrs: Mapping[str, Any]) -> list[InputDep]:
        """Dependency map of each input for output 0 (default: every element read)."""
        return [InputDep(tuple(AxisDep("all") for _ in s)) for s in shapes]

    # the dtype of each output: "float" or "int"
    def out_dtypes(self, in_dtypes: Sequence[str], attrs: Mapping[str, Any]) -> list[str]:
        return [in_dtypes[0] if in_dtypes else "float"] * self.n_outputs(attrs)


REGISTRY: dict[str, OpSpec] = {}


def register(cls: type[OpSpec]) -> type[OpSpec]:
    assert cls.name and cls.name not in REGISTRY, cls.name
    REGISTRY[cls.name] = cls()
    return cls


def get_op(name: str) -> OpSpec:
    try:
        return REGISTRY[name]
    except KeyError:
        raise AttrError(f"unknown op {name!r}") from None


# ---------------------------------------------------------------- small helpers
def norm_dim(d: int, rank: int, what: str = "dim") -> int:
    if not -rank <= d < max(rank, 1):
        raise ShapeError(f"{what} {d} is out of range for a tensor of rank {rank}")
    return d % rank if rank else 0


def broadcast_shapes(*shapes: Shape) -> Shape:
    n = max(len(s) for s in shapes)
    out = []
    for i in range(n):
        size = 1
        for s in shapes:
            j = i - (n - len(s))
            if j < 0:
                continue
            if s[j] == 1:
                continue
            if size not in (1, s[j]):
                raise ShapeError(f"shapes {[list(x) for x in shapes]} do not broadcast at dim {i}")
            size = s[j]
        out.append(size)
    return tuple(out)
