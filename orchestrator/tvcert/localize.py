"""Where do the parallel and logical programs part?  (Alive2-style localization.)

Given one concrete run, every rank-local tensor of the parallel program is explained, if it
can be, as some logical tensor under some placement (Replicate / Shard(d) / Partial(sum) per
mesh axis).  The first parallel op whose inputs are all explained but whose output is not is
where the plans diverge.  This is evidence for a person, computed from the run; it proves
nothing and is not used to decide verdicts.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from .interp import RunResult, assemble, values_equal
from .plan import Binding, Placement, Plan, fmt_placement

MAX_COMBOS = 400


@dataclass
class Explanation:
    logical: str
    placement: dict[str, Placement]

    def __str__(self) -> str:
        return f"{self.logical} as {fmt_placement(self.placement)}"


@dataclass
class Divergence:
    program: str
    node_path: str
    op: str
    tensor: str
    src: str | None
    inputs: dict[str, str]  # input tensor -> explanation text
    sample: dict[str, list]  # a few rank-local values

    def describe(self) -> str:
        where = f" ({self.src})" if self.src else ""
        ins = "; ".join(f"{k} = {v}" for k, v in self.inputs.items()) or "no tensor inputs"
        return (f"first divergence: op {self.op!r} producing {self.tensor!r} at {self.node_path}{where} "
                f"in program {self.program!r}: its inputs are explained ({ins}), but its result equals no logical "
                f"tensor under any placement")


def _candidates(axes: list[str], ndim: int) -> list[dict[str, Placement]]:
    opts = [Placement("R"), Placement("P", reduce="sum")] + [Placement("S", d) for d in range(ndim)]
    combos = []
    for choice in itertools.product(opts, repeat=len(axes)):
        combos.append(dict(zip(axes, choice)))
        if len(combos) >= MAX_COMBOS:
            break
    return combos


def explain(plan: Plan, res: RunResult, program: str, tensor: str,
            by_shape: Mapping[tuple, list[tuple[str, np.ndarray]]]) -> Explanation | None:
    mesh = res.mesh
    ranks = mesh.ranks(plan.programs[program].stage)
    locals_ = {r: res.parallel.values[program][r][tensor] for r in ranks}
    first = locals_[ranks[0]]
    if first.dtype == np.int64:
        return Explanation("<index tensor>", {})
    axes = plan.program_axes(program)
    dummy = Binding(tensor, program, tensor, {}, [], "")
    from .ops import Ctx

    ctx = Ctx(exact=res.mode == "exact")
    for combo in _candidates(axes, first.ndim):
        asm = assemble(dummy, locals_, mesh, ranks[0], ctx, placement=combo)
        if asm.value is None:
            continue
        for name, v in by_shape.get(asm.value.shape, []):
            if values_equal(asm.value, v, ctx.exact):
                return Explanation(name, combo)
    return None


def first_divergence(plan: Plan, res: RunResult) -> Divergence | None:
    by_shape: dict[tuple, list[tuple[str, np.ndarray]]] = {}
    for name, v in res.logical.items():
        if isinstance(v, np.ndarray) and v.dtype != np.int64:
            by_shape.setdefault(v.shape, []).append((name, v))
    for pname, g in plan.programs.items():
        known: dict[str, str] = {b.local: f"{name} as {fmt_placement(b.placement)}" for name, b in plan.inputs.items()
                                 if b.program == pname}
        for n in g.nodes:
            if not n.outputs:
                continue
            if any(x not in known for x in n.inputs):
                for o in n.outputs:
                    known.pop(o, None)
                continue
            for o in n.outputs:
                ex = explain(plan, res, pname, o, by_shape)
                if ex is None:
                    ranks = res.mesh.ranks(g.stage)
                    sample = {str(list(r)): _short(res.parallel.values[pname][r][o]) for r in ranks[:4]}
                    return Divergence(pname, n.path, n.op, o, n.src, {x: known[x] for x in n.inputs}, sample)
                known[o] = str(ex)
    return None


def _short(v: np.ndarray, k: int = 6) -> list:
    flat = list(v.flat)[:k]
    return [float(x) if not isinstance(x, (int, np.integer)) else int(x) for x in flat]
