"""Run the conformance generators: per rule id, N random instances, counted by outcome.

Outcomes: ``hit`` (the kernel concluded using the rule and the conclusion holds on every rank), ``other`` (it
concluded with other rules only; still checked), ``refused`` (RuleFailure), ``skip`` (the instance was not
executable: a shape the op rejects, a division by zero in exact mode), ``DISAGREE`` (a conclusion that does not
hold: a soundness bug), ``crash`` (the harness or the kernel raised an unexpected exception).
"""
from __future__ import annotations

import time
import zlib
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from .core import safe_run
from .gens import SINGLE_OP, Draw


@dataclass
class RuleStats:
    rule: str
    n: int = 0
    counts: Counter = field(default_factory=Counter)
    seconds: float = 0.0
    failures: list = field(default_factory=list)  # (seed, description, detail)

    @property
    def hits(self) -> int:
        return self.counts["hit"]

    @property
    def bad(self) -> int:
        return self.counts["DISAGREE"] + self.counts["crash"]


def generators() -> dict:
    from .eqgen import EQUALITY
    from .plans import PLAN_RULES

    g = {k: ("op", v) for k, v in SINGLE_OP.items()}
    g.update({k: ("eq", v) for k, v in EQUALITY.items()})
    g.update({k: ("plan", v) for k, v in PLAN_RULES.items()})
    return g


def run_rule(rule: str, n: int, seed: int = 0, max_failures: int = 5, exact_every: int = 1,
             time_budget: float | None = None) -> RuleStats:
    kind, gen = generators()[rule]
    st = RuleStats(rule)
    t0 = time.perf_counter()
    for i in range(n):
        if time_budget is not None and time.perf_counter() - t0 > time_budget:
            break
        s = seed * 1_000_003 + i
        dr = Draw(np.random.default_rng([s, zlib.crc32(rule.encode())]))
        if kind == "op":
            try:
                case = gen(dr)
            except (ValueError, IndexError, ZeroDivisionError) as exc:  # a generator that drew nothing valid
                st.n += 1
                st.counts["skip"] += 1
                continue
            exact = (i % exact_every) == 0 if exact_every else False
            res = safe_run(case, s, exact=exact)
            desc = case.describe()
        else:
            res, desc = gen(dr, s)
        st.n += 1
        if res.status == "ok":
            st.counts["hit" if rule in res.rules else "other"] += 1
        else:
            st.counts[res.status] += 1
        if res.status in ("DISAGREE", "crash") and len(st.failures) < max_failures:
            st.failures.append((s, desc, res.detail, res.rules))
    st.seconds = time.perf_counter() - t0
    return st


def format_row(st: RuleStats) -> str:
    c = st.counts
    return (f"| {st.rule} | {st.n} | {c['hit']} | {c['other']} | {c['refused']} | {c['skip']} | "
            f"{c['DISAGREE']} | {c['crash']} | {st.seconds:.1f} |")


HEADER = ("| rule | instances | hit (rule used, holds) | other rules (hold) | refused | not executable | "
          "DISAGREE | crash | seconds |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
