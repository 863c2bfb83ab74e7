"""SMT obligations for elementwise regions, and the solvers that discharge them.

An *elementwise region* is the part of an expression reachable from its root through
elementwise ops.  Everything below it (matmuls, reductions, inputs, ...) is a *leaf*.  At
every output index both sides read each leaf at the same (broadcast) position, so the
dependency maps of the two sides agree (argument map = identity on leaves) and, with one
variable per distinct leaf, the witness index gathers pairwise distinct inputs: exactly the
hypotheses of the corrected shape-reduction theorem (``shape_reduction_corrected`` in
Rules/).  The scalar identity "left = right for all real leaf values" is then asked of an
SMT solver over the reals, with nonlinear functions uninterpreted.

The SMT-LIB2 text is generated here as a string, deterministically, so the certificate
checker can regenerate it and compare before re-solving with z3 and/or cvc5.
"""
from __future__ import annotations

import os
import weakref
from fractions import Fraction
from typing import Callable, Mapping

from ..ops import REGISTRY
from .expr import Exprs

UF = {"exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "erf", "sin", "cos"}
ENCODABLE = UF | {"neg", "add", "sub", "mul", "div", "scale", "add_scalar", "square", "reciprocal", "pow", "abs",
                  "relu", "maximum", "minimum", "where", "masked_fill", "eq", "ne", "lt", "le", "gt", "ge",
                  "logical_and", "logical_or", "logical_not", "cast", "silu", "gelu"}


def is_region_op(exprs: Exprs, i: int) -> bool:
    e = exprs[i]
    return e.op in ENCODABLE and REGISTRY[e.op].category == "elementwise"


def num(v) -> str:
    q = Fraction(str(v)) if isinstance(v, float) else Fraction(v)
    s = f"{abs(q.numerator)}.0" if q.denominator == 1 else f"(/ {abs(q.numerator)}.0 {q.denominator}.0)"
    return f"(- {s})" if q < 0 else s


def scalar_const(exprs: Exprs, i: int):
    """The value of a constant with one value everywhere (broadcast fill), else None."""
    e = exprs[i]
    if e.op != "const":
        return None
    v = e.attr_dict().get("value")
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return v


def region_leaves(exprs: Exprs, root: int) -> list[int]:
    """Leaves of the elementwise region under ``root``, in first-visit order."""
    out: list[int] = []
    seen: set[int] = set()

    def walk(i: int) -> None:
        if i in seen:
            return
        seen.add(i)
        if is_region_op(exprs, i):
            for a in exprs[i].args:
                walk(a)
        elif scalar_const(exprs, i) is None:
            out.append(i)

    walk(root)
    return out


# ------------------------------------------------------------------ signs (checked premises about leaves)
POS, NONNEG = 2, 1  # sign facts: > 0, >= 0 (None: nothing known)
_SIGN_MEMO: "weakref.WeakKeyDictionary[Exprs, dict[int, tuple]]" = weakref.WeakKeyDictionary()
_SIGN_DEPTH = 200
_SIGN_KEEP = {"reshape", "permute", "expand", "slice", "flip", "sum", "mean", "amax", "amin", "concat"}
# (ops whose every value is a value, or a sum / mean / maximum over a non-empty set of values, of their arguments)


def sign(exprs: Exprs, i: int, depth: int = 0) -> int | None:
    """A sign every element of expression ``i`` is proved to have, from its structure: exp, sigmoid and
    softmax are positive, squares / abs / relu non-negative, sums, means, maxima and contractions of
    positive (non-negative) values positive (non-negative: dims are never empty), and so on.  This is what
    lets a division by a softmax normalizer (a sum of exp) be proved defined: a checked premise, not an
    assumption.  None when nothing is known."""
    memo = _SIGN_MEMO.setdefault(exprs, {})
    e = exprs[i]
    got = memo.get(i)
    if got is not None and got[0] is e:
        return got[1]
    if depth > _SIGN_DEPTH:
        return None
    r = _sign(exprs, e, depth + 1)
    memo[i] = (e, r)
    return r


def _sign(X: Exprs, e, depth: int) -> int | None:
    def sg(j: int) -> int | None:
        return sign(X, j, depth)

    def of(v) -> int | None:
        if isinstance(v, list):
            got = [of(x) for x in v]
            return min(got) if got and None not in got else None
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return None
        q = Fraction(str(v)) if isinstance(v, float) else Fraction(v)
        return POS if q > 0 else NONNEG if q == 0 else None

    def both(a, b):
        return None if a is None or b is None else min(a, b)

    op, at = e.op, e.attr_dict()
    args = e.args
    if any(0 in X[a].shape for a in args):
        return None  # a reduction over an empty dim is 0, not positive
    if op == "cast":
        x = sg(args[0])
        return x if at.get("dtype", "float") == "float" else (NONNEG if x is not None else None)
    if op == "const":
        return of(at.get("value"))
    if op in ("exp", "sigmoid", "softmax", "rsqrt"):
        return POS
    if op in ("abs", "relu", "sqrt"):
        return POS if op != "relu" and sg(args[0]) == POS else NONNEG
    if op == "square":
        return POS if sg(args[0]) == POS else NONNEG
    if op == "pow":
        x = Fraction(str(at.get("exponent")))
        base = sg(args[0])
        if base == POS:
            return POS
        if x.denominator == 1 and x.numerator % 2 == 0:
            return NONNEG
        return NONNEG if base == NONNEG and x > 0 else None
    if op in ("triu", "tril"):
        return NONNEG if sg(args[0]) is not None else None  # zeros outside the triangle
    if op in _SIGN_KEEP and args:
        got = [sg(a) for a in args] if op == "concat" else [sg(args[0])]
        return None if None in got else min(got)
    if op == "pad":
        return both(sg(args[0]), of(at.get("value", 0)))
    if op in ("scale", "add_scalar"):
        c, x = of(at.get("value")), sg(args[0])
        if op == "scale":
            return both(c, x)
        return None if c is None or x is None else (POS if POS in (c, x) else NONNEG)
    if op in ("add", "maximum") and len(args) == 2:
        a, b = sg(args[0]), sg(args[1])
        if op == "maximum" and POS in (a, b):
            return POS
        if op == "maximum" and NONNEG in (a, b):
            return NONNEG
        return None if a is None or b is None else (POS if POS in (a, b) else NONNEG)
    if op in ("mul", "div", "minimum", "matmul", "einsum") and args:
        got = [sg(a) for a in args]
        if None in got:
            return None
        if op == "div" and got[1] != POS:
            return None
        return min(got)
    if op == "reciprocal":
        return POS if sg(args[0]) == POS else None
    if op == "where" and len(args) == 3:
        return both(sg(args[1]), sg(args[2]))
    if op == "masked_fill" and args:
        return both(sg(args[0]), of(at.get("value")))
    return None


def encode_equality(exprs: Exprs, a: int, b: int, leaf_var: Mapping[int, str], domain: bool = True) -> str:
    """SMT-LIB2 text asserting that regions a and b differ or that one of their ops leaves its domain;
    unsat means they are equal and every op of both is defined (see the module docstring)."""
    defs: list[str] = []
    names: dict[int, str] = {}
    fns: set[str] = set()
    need: list[str] = []  # conditions every partial op of both sides needs (divisor nonzero ...)
    ranges: list[str] = []  # properties of the real functions applied (exp > 0 ...)

    def term(i: int) -> str:
        if i in names:
            return names[i]
        c = scalar_const(exprs, i)
        if c is not None:
            return num(c)
        if not is_region_op(exprs, i):
            return leaf_var[i]
        e = exprs[i]
        args = [term(x) for x in e.args]
        at = e.attr_dict()
        t = _op_term(e.op, args, at, fns)
        name = f"t{len(defs)}"
        defs.append(f"(define-fun {name} () Real {t})")
        names[i] = name
        need.extend(_domain(e.op, args, at) if domain else [])
        ranges.extend(_range(e.op, name))
        return name

    ta, tb = term(a), term(b)
    lines = ["(set-logic QF_UFNRA)"]
    leaf_of: dict[str, int] = {}
    for leaf, v in leaf_var.items():
        leaf_of.setdefault(v, leaf)
    for v in sorted(set(leaf_var.values()), key=lambda s: int(s[1:])):
        lines.append(f"(declare-fun {v} () Real)")
    for f in sorted(fns):
        lines.append(f"(declare-fun {f} (Real) Real)")
    lines += defs
    for v in sorted(leaf_of, key=lambda s: int(s[1:])):  # signs proved of the leaves (checked premises)
        sgn = sign(exprs, leaf_of[v])
        if sgn is not None:
            lines.append(f"(assert ({'>' if sgn == POS else '>='} {v} 0.0))")
    lines += [f"(assert {r})" for r in ranges]
    ok = f"(= {ta} {tb})" if not need else "(and " + " ".join(dict.fromkeys(need)) + f" (= {ta} {tb}))"
    lines.append(f"(assert (not {ok}))")
    lines.append("(check-sat)")
    return "\n".join(lines) + "\n"


def _domain(op: str, x: list[str], at: Mapping) -> list[str]:
    """What op needs of its arguments to be defined over the reals: a division by zero, a log of a non-positive
    number, ... is undefined (not 0 as in Coq's total division, not NaN as in IEEE): an equality is proved only
    where both sides are defined."""
    if op == "div":
        return [f"(not (= {x[1]} 0.0))"]
    if op == "reciprocal":
        return [f"(not (= {x[0]} 0.0))"]
    if op in ("log", "rsqrt"):
        return [f"(> {x[0]} 0.0)"]
    if op == "sqrt":
        return [f"(>= {x[0]} 0.0)"]
    if op == "pow":
        e = Fraction(str(at["exponent"]))
        if e.denominator == 1:
            return [] if e >= 0 else [f"(not (= {x[0]} 0.0))"]
        return [f"(>= {x[0]} 0.0)"] if e > 0 else [f"(> {x[0]} 0.0)"]
    return []


def _range(op: str, t: str) -> list[str]:
    """Facts about the value of a real function (premises of real analysis, not assumptions about the plan)."""
    if op in ("exp", "rsqrt"):
        return [f"(> {t} 0.0)"]
    if op == "sqrt":
        return [f"(>= {t} 0.0)"]
    if op == "sigmoid":
        return [f"(> {t} 0.0)", f"(< {t} 1.0)"]
    return []


def _op_term(op: str, x: list[str], at: Mapping, fns: set[str]) -> str:
    def uf(name: str, arg: str) -> str:
        fns.add(f"f_{name}")
        return f"(f_{name} {arg})"

    def b(t: str) -> str:  # boolean of a 0/1 real
        return f"(not (= {t} 0.0))"

    if op in UF:
        return uf(op, x[0])
    if op == "neg":
        return f"(- {x[0]})"
    if op in ("add", "sub", "mul"):
        return f"({ {'add': '+', 'sub': '-', 'mul': '*'}[op]} {x[0]} {x[1]})"
    if op == "div":
        return f"(/ {x[0]} {x[1]})"
    if op == "scale":
        return f"(* {num(at['value'])} {x[0]})"
    if op == "add_scalar":
        return f"(+ {x[0]} {num(at['value'])})"
    if op == "square":
        return f"(* {x[0]} {x[0]})"
    if op == "reciprocal":
        return f"(/ 1.0 {x[0]})"
    if op == "pow":
        e = Fraction(str(at["exponent"]))
        if e.denominator == 1 and 0 <= e.numerator <= 8:
            return "(* " + " ".join([x[0]] * e.numerator) + " 1.0)" if e.numerator else "1.0"
        if e == Fraction(1, 2):
            return uf("sqrt", x[0])
        if e == Fraction(-1, 2):
            return uf("rsqrt", x[0])
        return uf(f"pow_{e.numerator}_{e.denominator}".replace("-", "m"), x[0])
    if op == "abs":
        return f"(ite (>= {x[0]} 0.0) {x[0]} (- {x[0]}))"
    if op == "relu":
        return f"(ite (> {x[0]} 0.0) {x[0]} 0.0)"
    if op == "maximum":
        return f"(ite (>= {x[0]} {x[1]}) {x[0]} {x[1]})"
    if op == "minimum":
        return f"(ite (<= {x[0]} {x[1]}) {x[0]} {x[1]})"
    if op == "where":
        return f"(ite {b(x[0])} {x[1]} {x[2]})"
    if op == "masked_fill":
        return f"(ite {b(x[1])} {num(at['value'])} {x[0]})"
    if op in ("eq", "ne", "lt", "le", "gt", "ge"):
        rel = {"eq": "=", "ne": "distinct", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}[op]
        return f"(ite ({rel} {x[0]} {x[1]}) 1.0 0.0)"
    if op == "logical_and":
        return f"(ite (and {b(x[0])} {b(x[1])}) 1.0 0.0)"
    if op == "logical_or":
        return f"(ite (or {b(x[0])} {b(x[1])}) 1.0 0.0)"
    if op == "logical_not":
        return f"(ite {b(x[0])} 0.0 1.0)"
    if op == "cast":
        return x[0] if at.get("dtype", "float") == "float" else uf("cast_int", x[0])
    if op == "silu":
        return f"(* {x[0]} {uf('sigmoid', x[0])})"
    if op == "gelu":
        return uf("gelu_" + at.get("approximate", "none"), x[0])
    raise ValueError(f"no SMT encoding for {op}")


# ------------------------------------------------------------------ solvers
# Solver budgets: an obligation is answered within these or it is "unknown" (never proved, so never VERIFIED).
# The limit that decides is z3's rlimit (resource units: deterministic, ~1e6 per CPU second on the obligations and
# pigeonhole instances measured, so 2e7 is about 20 s of an idle machine's CPU); the wall-clock timeout is only a hang
# guard, far above it, so that a loaded machine does not turn a proof into "unknown".  cvc5 (a cross-check, not the
# default solver) keeps a wall limit: its resource units are not calibrated here.
SMT_RLIMIT = int(float(os.environ.get("TVCERT_SMT_RLIMIT", 2e7)))  # z3 resource units per obligation
SMT_TIMEOUT_MS = int(float(os.environ.get("TVCERT_SMT_TIMEOUT_MS", 300_000)))  # per obligation, wall clock: hang guard
CVC5_TIMEOUT_MS = 10000  # per obligation, wall clock
SMT_MEMORY_MB = 1024  # z3's memory cap (memory_max_size)
SMT_MAX_TEXT = 8 * 1024 * 1024  # characters of one obligation; a larger one is not sent to a solver


def solve_z3(text: str, timeout_ms: int = SMT_TIMEOUT_MS) -> str:
    import z3

    if len(text) > SMT_MAX_TEXT:
        return "unknown"
    z3.set_param("memory_max_size", SMT_MEMORY_MB)
    s = z3.Solver()
    s.set("timeout", timeout_ms)
    s.set("rlimit", SMT_RLIMIT)
    s.from_string(text)
    try:
        r = str(s.check())
    except z3.Z3Exception:  # out of memory / resources inside z3: no answer
        return "unknown"
    return r if r in ("sat", "unsat") else "unknown"


def solve_cvc5(text: str, timeout_ms: int = CVC5_TIMEOUT_MS) -> str:
    import cvc5

    if len(text) > SMT_MAX_TEXT:
        return "unknown"

    tm = cvc5.TermManager()
    s = cvc5.Solver(tm)
    s.setOption("tlimit-per", str(timeout_ms))
    sm = cvc5.SymbolManager(tm)
    p = cvc5.InputParser(s, sm)
    p.setStringInput(cvc5.InputLanguage.SMT_LIB_2_6, text, "obligation")
    answer = "unknown"
    while True:
        cmd = p.nextCommand()
        if cmd.isNull():
            break
        out = cmd.invoke(s, sm)
        if out and out.strip() in ("sat", "unsat", "unknown"):
            answer = out.strip()
    return answer


SOLVERS: dict[str, Callable[[str], str]] = {"z3": solve_z3, "cvc5": solve_cvc5}


# ------------------------------------------------------------------ int64 (the solver's reals do not wrap)
INT64 = (-(1 << 63), (1 << 63) - 1)
_INT_ARITH = {"add", "sub", "mul", "neg", "scale", "add_scalar", "square", "pow", "abs"}
_INT_BOOL = {"eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_not"}


def int_overflow(X: Exprs, roots, interval) -> str | None:
    """Why an int op of the regions under ``roots`` may leave int64, or None.  Int tensors are int64 (the
    interpreter's and the hardware's: ``x * 2**62 >= 0`` is false at x = 2), while the obligation reads them as
    reals, where no sum or product wraps; so an obligation is sent only when every int add / sub / mul / neg /
    scale / add_scalar / square / pow / abs of its regions is bounded inside int64, from its leaves' intervals
    (``interval(i)``: a declared input range, else None = unbounded) and its constants."""
    memo: dict[int, tuple[int, int] | None] = {}

    def iv(i: int):
        if i in memo:
            return memo[i]
        memo[i] = None
        e = X[i]
        r = None
        c = scalar_const(X, i)
        if c is not None:
            r = (int(c), int(c)) if isinstance(c, int) else None
        elif not is_region_op(X, i):
            r = interval(i)
        else:
            at = e.attr_dict()
            xs = [iv(a) for a in e.args]
            if e.op in _INT_BOOL:
                r = (0, 1)
            elif e.dtype != "int" or any(x is None for x in xs):
                r = None
            elif e.op in ("add", "sub"):
                (a, b), (c2, d) = xs
                r = (a + c2, b + d) if e.op == "add" else (a - d, b - c2)
            elif e.op == "mul":
                (a, b), (c2, d) = xs
                ps = [a * c2, a * d, b * c2, b * d]
                r = (min(ps), max(ps))
            elif e.op == "neg":
                r = (-xs[0][1], -xs[0][0])
            elif e.op in ("scale", "add_scalar"):
                v = at.get("value")
                if isinstance(v, int) and not isinstance(v, bool):
                    ps = [x * v for x in xs[0]] if e.op == "scale" else [x + v for x in xs[0]]
                    r = (min(ps), max(ps))
            elif e.op in ("square", "abs", "pow"):
                a, b = xs[0]
                m = max(abs(a), abs(b))
                k = 2 if e.op == "square" else 1 if e.op == "abs" else at.get("exponent")
                if isinstance(k, int) and not isinstance(k, bool) and 0 <= k <= 64:
                    r = (0 if k % 2 == 0 else -m ** k, m ** k)
            elif e.op in ("where", "masked_fill", "maximum", "minimum", "relu", "cast") and xs:
                vals = list(xs[1:] if e.op == "where" else xs[:1])
                if e.op == "masked_fill":
                    v = at.get("value")
                    vals.append((int(v), int(v)) if isinstance(v, (int, float)) and float(v).is_integer() else None)
                elif e.op in ("maximum", "minimum"):
                    vals = xs
                elif e.op == "relu":
                    vals.append((0, 0))
                if None not in vals and vals:
                    r = (min(v[0] for v in vals), max(v[1] for v in vals))
        memo[i] = r
        return r

    seen: set[int] = set()
    stack = list(roots)
    while stack:
        i = stack.pop()
        if i in seen or not is_region_op(X, i):
            continue
        seen.add(i)
        stack.extend(X[i].args)
        e = X[i]
        if e.dtype == "int" and e.op in _INT_ARITH:
            r = iv(i)
            if r is None or r[0] < INT64[0] or r[1] > INT64[1]:
                return (f"{X.show(i, 2)} is int64 arithmetic not proved to stay inside int64 "
                        f"({'no bound on an operand' if r is None else f'values up to [{r[0]}, {r[1]}]'}): "
                        f"int64 wraps where the solver's reals do not")
    return None
