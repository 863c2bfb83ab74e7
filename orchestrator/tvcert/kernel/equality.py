"""Deciding that two logical expressions denote the same tensor.

Nine certified steps, tried in order, each sound on its own:

* ``congruence``: same op, same attributes, pairwise-equal arguments;
* ``scale_commutes_linear``: pull rational scalar factors out through linear ops
  (matmul, einsum, reductions, layout ops, ...) and compare factors and cores;
* ``scale_common_factor``: an add / sub / concat of operands with different factors is the first factor times
  the op of the operands rescaled by their ratios (:func:`.reductions.common_factor`);
* ``reduction_normal_form``: sums and means spelled one way (:mod:`.reductions`: a mean is the sum over
  its dims divided by their element count; a sum of a sum is one sum over the union of the dims; a scalar
  factor leaves the sum), then compared by the other steps;
* ``slice_concat_operand``: a slice of a concat along its dim that is exactly operand k's rows is operand k
  (:mod:`.slice_concat`: Megatron's coalesced gradient all-reduce);
* ``interleave_commutes``: one side a fused tensor's interleave of G, the other pulled to an interleave of Y
  through ops that read the dim index by index (:mod:`.interleave`), and Y = G;
* ``layout_map_equal``: two chains of reshape / permute / expand / slice / flip reading the same index of equal
  bases at every index (:mod:`.layout_map`: one head per rank);
* ``scalar_factor_commutes``: 0-d factors (a global token count) pulled out the same way, compared one to one
  (:mod:`.scalar_factor`);
* ``elementwise_smt``: an elementwise region, with every non-elementwise subterm as a leaf,
  checked by an SMT solver over the reals (see :mod:`.smt` for why one index suffices).

Everything proved is recorded in ``obligations`` so a certificate can replay the solver calls.
A ``False`` answer means "not proved", never "proved different".
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Callable

from ..ops import REGISTRY
from .expr import Exprs
from .interleave import EQ_RULE as INTERLEAVE_EQ, interleaved_equal
from .concat_groups import EQ_RULE as GROUPED_EQ, grouped_equal
from .int_range import RULE as INT_RANGE, const_value, interval as int_interval
from .layout_map import RULE as LAYOUT_MAP, layout_map_equal
from .reductions import COMMON_FACTOR, common_factor, reduction_normal_form
from .reversed_blocks import EQ_RULE as REVERSED_EQ, reversed_equal
from .scalar_factor import RULE as SCALAR_FACTOR, ScalarFactors, factored_equal
from .slice_concat import RULE as SLICE_CONCAT, slice_operand
from .smt import encode_equality, int_overflow, is_region_op, region_leaves, scalar_const, solve_z3

# ops a scalar factor of their first argument moves across, when the op's own flag says it is homogeneous in
# that argument for these attributes (``homogeneous_in``, proved per op in Rules/OpFlags.v): a cast only into
# float (and only integer factors, its operand being an int tensor), a pad only with value 0
LINEAR_FIRST = {"reshape", "permute", "slice", "sum", "mean", "expand", "triu", "tril", "cast", "pad",
                "embedding_backward", "softmax_backward", "log_softmax_backward"}
MULTILINEAR = {"matmul", "einsum"}


def _homogeneous_first(op: str, attrs: dict, c: Fraction) -> bool:
    if 0 not in REGISTRY[op].homogeneous_in(attrs):
        return False
    return op != "cast" or c.denominator == 1
MAX_SMT_LEAVES = 64
# Solver CPU seconds one prover may spend in all (TVCERT_SMT_TOTAL_SECONDS).  A wrong plan fails its obligations,
# and every failure below a leaf comparison is another solver call: Gemma 2 with a doubled all_reduce spent 565 s
# matching its outputs (553 failing calls in its first 171 s of solver time).  Past the budget an obligation is
# not proved (False: never "proved different").
SMT_TOTAL_SECONDS = float(os.environ.get("TVCERT_SMT_TOTAL_SECONDS", "60"))


@dataclass
class Obligation:
    lhs: int
    rhs: int
    smt: str
    answer: str
    leaf_vars: list[tuple[int, str]] = field(default_factory=list)  # the reduction witness


@dataclass
class Prover:
    exprs: Exprs
    solve: Callable[[str], str] = solve_z3
    obligations: list[Obligation] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    used: set[str] = field(default_factory=set)  # equality rules that contributed
    explain_domain: bool = True  # on a failed obligation, say whether only the domain conditions failed
    smt_budget: float = field(default_factory=lambda: SMT_TOTAL_SECONDS)  # solver seconds in all
    smt_seconds: float = 0.0
    ranges: dict = field(default_factory=dict)  # int input name -> (lo, hi), values in [lo, hi) (the plan contract)

    def __post_init__(self) -> None:
        self._memo: dict[tuple[int, int], bool] = {}
        self._norm: dict[int, tuple[Fraction, int]] = {}
        self._lnorm: dict[int, int] = {}
        self._rnorm: dict[int, int] = {}
        self._sf: ScalarFactors | None = None
        self._lmap: dict = {}  # layout_map.index_map per expression

    # ------------------------------------------------------------------ public
    def equal(self, a: int, b: int) -> bool:
        if a == b:
            return True
        key = (a, b) if a < b else (b, a)
        got = self._memo.get(key)
        if got is not None:
            return got
        self._memo[key] = False  # cycle guard (expressions are acyclic; this only bounds work)
        res = self._equal(a, b)
        self._memo[key] = res
        return res

    # ------------------------------------------------------------------ steps
    def _equal(self, a: int, b: int) -> bool:
        X = self.exprs
        ea, eb = X[a], X[b]
        if ea.shape != eb.shape or ea.dtype != eb.dtype:  # a float tensor is never equal to an int tensor
            return False
        if (ea.op == eb.op and ea.attrs == eb.attrs and len(ea.args) == len(eb.args) and ea.op != "input"
                and all(self.equal(x, y) for x, y in zip(ea.args, eb.args))):
            self.used.add("congruence")
            return True
        sa, sb = slice_operand(X, a), slice_operand(X, b)  # a slice that is one operand of a concat
        if (sa, sb) != (None, None) and self.equal(a if sa is None else sa, b if sb is None else sb):
            self.used.add(SLICE_CONCAT)
            return True
        ca, na = self.norm(a)
        cb, nb = self.norm(b)
        if (na, ca) != (a, 1) or (nb, cb) != (b, 1):
            if ca == cb and self.equal(na, nb):
                self.used.add("scale_commutes_linear")
                return True
        la, lb = self.lnorm(a), self.lnorm(b)
        if (la, lb) != (a, b) and self.equal(la, lb):
            self.used.add("layout_commutes_pointwise")
            return True
        ra, rb = self.rnorm(a), self.rnorm(b)
        if (ra, rb) != (a, b) and self.equal(ra, rb):
            self.used.add("reduction_normal_form")
            return True
        if interleaved_equal(X, a, b, self.equal) or interleaved_equal(X, b, a, self.equal):
            self.used.add(INTERLEAVE_EQ)
            return True
        if grouped_equal(X, a, b, self.equal) or grouped_equal(X, b, a, self.equal):  # unequal parts
            self.used.add(GROUPED_EQ)
            return True
        if layout_map_equal(X, a, b, self.equal, self._lmap):  # layout chains reading the same index everywhere
            self.used.add(LAYOUT_MAP)
            return True
        if reversed_equal(X, a, b, self.equal, self._lmap):  # rank-reversed blocks (reversed_blocks.py)
            self.used.update((REVERSED_EQ, LAYOUT_MAP))
            return True
        if factored_equal(self.scalar_factors(), a, b, self.equal):  # 0-d factors such as 1 / global count
            self.used.add(SCALAR_FACTOR)
            return True
        if is_region_op(X, a) or is_region_op(X, b):
            return self._smt(a, b)
        return False

    def scalar_factors(self) -> ScalarFactors:
        if self._sf is None:
            self._sf = ScalarFactors(self.exprs, frozenset(LINEAR_FIRST), frozenset(MULTILINEAR))
        return self._sf

    def _solve(self, text: str) -> str:
        t = time.process_time()  # CPU (z3 runs in this process), not wall: the budget must not depend on the load
        try:
            return self.solve(text)
        finally:
            self.smt_seconds += time.process_time() - t

    def _pull(self, i: int) -> tuple[int, tuple]:
        """(core, layouts) with i = layouts(core) and the same layouts applied to every pointwise leaf."""
        X = self.exprs
        e = X[i]
        if e.op in ("reshape", "permute"):
            core, sig = self._pull(e.args[0])
            return core, sig + ((e.op, e.attrs, X[e.args[0]].shape),)
        if is_region_op(X, i) and e.args and all(X[a].shape in (e.shape, ()) for a in e.args):
            pulled = [(a, None) if X[a].shape == () else self._pull(a) for a in e.args]
            sigs = {sig for _, sig in pulled if sig is not None}
            if len(sigs) == 1 and () not in sigs:
                return X.mk(e.op, e.attr_dict(), [c for c, _ in pulled]), sigs.pop()
        return i, ()

    def lnorm(self, i: int) -> int:
        """Push reshape / permute through pointwise ops and compose them (index bijections commute with pointwise maps)."""
        got = self._lnorm.get(i)
        if got is not None:
            return got
        self._lnorm[i] = i
        res = self._push_layout(i)
        self._lnorm[i] = res
        return res

    def _push_layout(self, i: int) -> int:
        X = self.exprs
        e = X[i]
        if e.op in ("sum", "mean", "amax", "amin") and not e.attr_dict().get("keepdim") and e.shape == ():
            # a full reduction does not see a layout applied uniformly to its whole pointwise argument
            core, sig = self._pull(e.args[0])
            if sig:
                n = len(X[core].shape)
                return X.mk(e.op, {"dims": tuple(range(n)), "keepdim": False}, [core])
            return i
        if e.op not in ("reshape", "permute"):
            return i
        at = e.attr_dict()
        inner = self.lnorm(e.args[0])
        x = X[inner]
        if x.op == e.op == "permute":
            p_in, p_out = x.attr_dict()["dims"], at["dims"]
            return X.mk("permute", {"dims": tuple(p_in[d] for d in p_out)}, [x.args[0]])
        if x.op == e.op == "reshape":
            return X.mk("reshape", at, [x.args[0]])
        if is_region_op(X, inner) and x.args and all(X[a].shape in (x.shape, ()) for a in x.args):
            args = [a if X[a].shape == () else self.lnorm(X.mk(e.op, at, [a])) for a in x.args]
            return X.mk(x.op, x.attr_dict(), args)
        if inner != e.args[0]:
            return X.mk(e.op, at, [inner])
        return i

    def rnorm(self, i: int) -> int:
        """The reduction normal form of ``i`` (memoized; ``i`` itself when it has none)."""
        got = self._rnorm.get(i)
        if got is None:
            got = self._rnorm[i] = reduction_normal_form(self.exprs, i, self.rnorm, self.norm)
        return got

    def norm(self, i: int) -> tuple[Fraction, int]:
        """(c, core) with i = c * core, the scalar pulled out through linear ops."""
        got = self._norm.get(i)
        if got is not None:
            return got
        self._norm[i] = (Fraction(1), i)
        # no factor leaves an int tensor: x * 2**62 is 2**62 * x only modulo 2**64 (int64 wraps), which a later
        # division, cast or comparison tells apart (x * 2**62 / 2**62 is not x at x = 2)
        res = (Fraction(1), i) if self.exprs[i].dtype == "int" else self._normalize(i)
        self._norm[i] = res
        return res

    def _normalize(self, i: int) -> tuple[Fraction, int]:
        X = self.exprs
        e = X[i]
        one = Fraction(1)
        at = e.attr_dict()
        if e.op == "scale":
            c, core = self.norm(e.args[0])
            return c * Fraction(str(at["value"])), core
        if e.op == "neg":
            c, core = self.norm(e.args[0])
            return -c, core
        if e.op == "const" and e.shape != () and isinstance(at.get("value"), (int, float)) and at["value"] != 1 \
                and at.get("dtype", "float") == "float":
            return Fraction(str(at["value"])), X.mk("const", {**at, "value": 1}, [])
        if e.op in ("mul", "div") and len(e.args) == 2:
            k, counted = scalar_const(X, e.args[1]), False
            if k is None and self.ranges and X[e.args[1]].shape == ():  # a count of in-range labels (int_range.py)
                k = const_value(X, e.args[1], self.ranges)
                counted = k is not None
            if k is not None and X[e.args[1]].shape == () and X[e.args[0]].shape == e.shape:
                c, core = self.norm(e.args[0])
                k = Fraction(str(k))
                if e.op == "div" and k == 0:
                    return one, i
                if counted:
                    self.used.add(INT_RANGE)
                return (c * k if e.op == "mul" else c / k), core
            k = scalar_const(X, e.args[0])
            if e.op == "mul" and k is not None and X[e.args[0]].shape == () and X[e.args[1]].shape == e.shape:
                c, core = self.norm(e.args[1])
                return c * Fraction(str(k)), core
            (ca, a), (cb, b) = self.norm(e.args[0]), self.norm(e.args[1])
            if (ca, a) == (one, e.args[0]) and (cb, b) == (one, e.args[1]):
                return one, i
            if e.op == "mul":  # bilinear: (ca A) * (cb B) = (ca cb) (A * B)
                return ca * cb, X.mk("mul", at, [a, b])
            if cb != 0:  # (ca A) / (cb B) = (ca / cb) (A / B)
                return ca / cb, X.mk("div", at, [a, b])
            return one, i
        if e.op in LINEAR_FIRST and e.args:
            c, core = self.norm(e.args[0])
            if core == e.args[0] and c == 1:
                return one, i
            if not _homogeneous_first(e.op, at, c):
                return one, i
            return c, X.mk(e.op, at, [core, *e.args[1:]])
        if e.op in MULTILINEAR and all(k in REGISTRY[e.op].homogeneous_in(at) for k in range(len(e.args))):
            cs, cores = one, []
            for x in e.args:
                c, core = self.norm(x)
                cs *= c
                cores.append(core)
            if cs == 1 and cores == list(e.args):
                return one, i
            return cs, X.mk(e.op, at, cores)
        if e.op in ("add", "sub") and all(X[x].shape == e.shape for x in e.args):
            ns = [self.norm(x) for x in e.args]
            if len({c for c, _ in ns}) == 1 and ns[0][0] != 1:
                return ns[0][0], X.mk(e.op, at, [core for _, core in ns])
        got = common_factor(X, i, self.norm)  # different factors: the first moves out, the ratios stay inside
        if got is not None:
            self.used.add(COMMON_FACTOR)
            return got
        return one, i

    def _smt(self, a: int, b: int) -> bool:
        if self.smt_seconds >= self.smt_budget:
            msg = (f"SMT time budget spent ({self.smt_seconds:.0f} s of solver time; TVCERT_SMT_TOTAL_SECONDS): "
                   f"further elementwise obligations are not proved")
            if msg not in self.failures[-1:]:
                self.failures.append(msg)
            return False
        X = self.exprs
        la, lb = region_leaves(X, a), region_leaves(X, b)
        if len(la) + len(lb) > MAX_SMT_LEAVES:
            self.failures.append(f"elementwise region too large for SMT ({len(la) + len(lb)} leaves)")
            return False
        wraps = int_overflow(X, (a, b), lambda i: int_interval(X, i, self.ranges))
        if wraps is not None:
            self.failures.append(wraps)
            return False
        reps: list[int] = []
        var: dict[int, str] = {}
        for leaf in la + lb:
            if leaf in var:
                continue
            for r in reps:
                if X[r].shape == X[leaf].shape and X[r].dtype == X[leaf].dtype and self.equal(r, leaf):
                    var[leaf] = var[r]
                    break
            else:
                reps.append(leaf)
                var[leaf] = f"v{leaf}"
        text = encode_equality(X, a, b, var)
        answer = self._solve(text)
        if answer == "unsat":
            self.obligations.append(Obligation(a, b, text, answer, sorted(var.items())))
            self.used.add("elementwise_smt")
            return True
        if answer != "sat":
            self.failures.append(f"solver answered {answer} on an elementwise obligation")
        elif self.explain_domain and encode_equality(X, a, b, var, domain=False) != text \
                and self._solve(encode_equality(X, a, b, var, domain=False)) == "unsat":
            self.failures.append(f"{X.show(a, 2)} = {X.show(b, 2)} holds where both are defined, but an op of them is "
                                 f"not proved inside its domain (a divisor nonzero, a log / rsqrt argument positive, a "
                                 f"sqrt argument non-negative): a division by zero is undefined, so this is not proved")
        return False
