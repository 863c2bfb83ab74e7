"""An equality step: 0-d factors (a global token count, not only a rational constant) move across homogeneous ops.

Real code averages a loss over the global count of real tokens, ``loss = s / n`` with
``n = all_reduce(sum(labels != -100))``: a 0-d tensor, one real number on every rank and at every index it is
broadcast to.  Autograd carries ``1/n`` (and DDP's ``p``) into the gradients through ``where``,
``log_softmax_backward``, ``matmul`` and the gradient all-reduce, while the logical graph divides at another op.
``scale_commutes_linear`` moves rational constants only; this step moves the value of any 0-d float expression
the same way (``Rules/ScalarFactor.v``: ``scalar_factor_commutes``).

Normal form: ``i = c * prod(num) / prod(den) * core``, c rational, ``num`` / ``den`` multisets of 0-d float
expressions, ``core`` of ``i``'s shape (a 0-d expression is all factors, core the scalar 1).  Factors are pulled
out only through ops whose flag says they are homogeneous in that operand (``homogeneous_in``, proved per op in
Rules/OpFlags.v: ``LINEAR_FIRST`` / ``MULTILINEAR`` of :mod:`.equality`, ``masked_fill`` with 0), ``mul`` (both
operands), the numerator and the divisor of ``div``, ``where`` with a zero branch, ``add`` / ``sub`` whose operands
carry the same factors.  Two expressions are equal when c agrees, the factors match one to one (proved equal) and
the cores are equal.  Nothing cancels, and a divisor is pulled out only when its own factors are all numerators, so
the divisors of a normal form are exactly the divisors of the expression: both sides divide by the same values.
A factor is 0-d by construction: a per-row or per-rank value is a tensor of its own shape, never a factor, and a
rank's local count is no logical expression at all (``partial_div`` asks for a replicated divisor).
"""
from __future__ import annotations

from fractions import Fraction
from typing import Callable

from ..ops import REGISTRY
from .expr import Exprs
from .smt import scalar_const

RULE = "scalar_factor_commutes"
STATEMENT = ("a 0-d factor (one real value) moves across an op homogeneous in its operand, a product, a division, a "
             "where with a zero branch and a shared add / sub; factors compared one to one, no divisor cancelled")

NF = tuple  # (c: Fraction, num: tuple[int, ...], den: tuple[int, ...], core: int)
ONE = Fraction(1)


def _frac(v) -> Fraction | None:
    return None if v is None or isinstance(v, bool) else Fraction(str(v))


def zero_branch(X: Exprs, z: int) -> bool:
    """A where branch that is the constant 0 (where(c, s x, 0) = s where(c, x, 0); any other value is affine)."""
    return _frac(scalar_const(X, z)) == 0


class ScalarFactors:
    """The memoized normal forms of one expression table (``linear_first`` / ``multilinear``: the op sets of
    :mod:`.equality` whose homogeneity flags the step may use)."""

    def __init__(self, X: Exprs, linear_first: frozenset, multilinear: frozenset) -> None:
        self.X, self.linear_first, self.multilinear = X, linear_first, multilinear
        self.one = X.mk("const", {"value": 1, "shape": (), "dtype": "float"}, [])
        self.memo: dict[int, NF] = {}

    def trivial(self, i: int) -> bool:
        f = self.nf(i)
        return f == (ONE, (), (), i) or f == (ONE, (i,), (), self.one)

    def nf(self, i: int) -> NF:
        got = self.memo.get(i)
        if got is None:
            self.memo[i] = (ONE, (), (), i)  # cycle guard (expressions are acyclic)
            got = self.memo[i] = self._scalar(i, self._pull(i))
        return got

    # ------------------------------------------------------------------ building the normal form
    def _scalar(self, i: int, f: NF) -> NF:
        """A 0-d expression: its core joins the factors (the scalar 1 stays), a constant core joins c."""
        X = self.X
        c, num, den, core = f
        if X[i].shape != () or X[i].dtype != "float" or core == self.one:
            return f
        k = _frac(scalar_const(X, core))
        if k is not None:
            return (c * k, num, den, self.one)
        return (c, tuple(sorted(num + (core,))), den, self.one)

    def _pull(self, i: int) -> NF:
        X = self.X
        e = X[i]
        ident = (ONE, (), (), i)
        if e.dtype != "float" or not e.args and e.op != "const":
            return ident
        at = e.attr_dict()
        if e.op == "const":
            v = _frac(scalar_const(X, i))
            if v is None or v == 1 or e.shape == ():
                return ident
            return (v, (), (), X.mk("const", {**at, "value": 1}, []))
        if e.op == "scale":
            c, n, d, k = self.nf(e.args[0])
            return (c * Fraction(str(at["value"])), n, d, k)
        if e.op == "neg":
            c, n, d, k = self.nf(e.args[0])
            return (-c, n, d, k)
        if e.op == "mul" and len(e.args) == 2:
            (ca, na, da, ka), (cb, nb, db, kb) = self._operand(e.args[0]), self._operand(e.args[1])
            core = ka if kb == self.one else kb if ka == self.one else X.mk("mul", at, [ka, kb])
            return self._made(i, (ca * cb, na + nb, da + db, core))
        if e.op == "div" and len(e.args) == 2:
            (ca, na, da, ka), (cb, nb, db, kb) = self._operand(e.args[0]), self._operand(e.args[1])
            if cb == 0 or db:  # a divisor with divisors of its own: pulling them up would drop a domain condition
                return ident
            core = ka if kb == self.one else X.mk("div", at, [ka, kb])
            return self._made(i, (ca / cb, na, da + nb, core))
        if e.op == "where" and len(e.args) == 3:
            m, a, b = e.args
            for j, z in ((1, b), (2, a)):
                if zero_branch(X, z) and X[e.args[j]].dtype == "float":
                    c, n, d, k = self.nf(e.args[j])
                    args = [m, k, z] if j == 1 else [m, z, k]
                    return self._made(i, (c, n, d, X.mk("where", at, args)))
            return ident
        if e.op in self.linear_first or e.op == "masked_fill":
            if 0 not in REGISTRY[e.op].homogeneous_in(at) or X[e.args[0]].dtype != "float" or e.op == "cast":
                return ident
            c, n, d, k = self.nf(e.args[0])  # a 0-d operand: the op of the scalar 1 (an expand of it, ...)
            return self._made(i, (c, n, d, X.mk(e.op, at, [k, *e.args[1:]])))
        if e.op in self.multilinear and all(j in REGISTRY[e.op].homogeneous_in(at) for j in range(len(e.args))):
            c, n, d, ks = ONE, (), (), []
            for a in e.args:
                ca, na, da, ka = self.nf(a)
                c, n, d = c * ca, n + na, d + da
                ks.append(ka)
            return self._made(i, (c, n, d, X.mk(e.op, at, ks)))
        if e.op in ("add", "sub") and len(e.args) >= 2 and all(X[a].shape == e.shape for a in e.args):
            fs = [self.nf(a) for a in e.args]
            if len({f[:3] for f in fs}) == 1 and fs[0][0] != 0:
                c, n, d, _ = fs[0]
                return self._made(i, (c, n, d, X.mk(e.op, at, [f[3] for f in fs])))
        return ident

    def _operand(self, j: int) -> NF:
        """An operand of mul / div: a 0-d int (a count, true division) is a factor like a float one."""
        X = self.X
        if X[j].dtype != "int" or X[j].shape != ():
            return self.nf(j)
        k = _frac(scalar_const(X, j))
        return (k, (), (), self.one) if k is not None else (ONE, (j,), (), self.one)

    def _made(self, i: int, f: NF) -> NF:
        c, n, d, k = f
        if c == 1 and not n and not d and k == i:
            return (ONE, (), (), i)
        return (c, tuple(sorted(n)), tuple(sorted(d)), k)


def _match(xs: tuple, ys: tuple, equal: Callable[[int, int], bool]) -> bool:
    """Every factor of xs proved equal to a distinct factor of ys (identical ids first)."""
    if len(xs) != len(ys):
        return False
    rest = list(ys)
    for x in xs:
        j = next((k for k, y in enumerate(rest) if y == x), None)
        if j is None:
            j = next((k for k, y in enumerate(rest) if equal(x, y)), None)
        if j is None:
            return False
        rest.pop(j)
    return True


def factored_equal(sf: ScalarFactors, a: int, b: int, equal: Callable[[int, int], bool]) -> bool:
    """a = b by their normal forms (False: not proved)."""
    if sf.trivial(a) and sf.trivial(b):
        return False
    (ca, na, da, ka), (cb, nb, db, kb) = sf.nf(a), sf.nf(b)
    if ca != cb or len(na) != len(nb) or len(da) != len(db):
        return False
    return _match(na, nb, equal) and _match(da, db, equal) and equal(ka, kb)
