"""Shared check of the bug-injection suites: a mutated plan is REFUTED, the counterexample reproduces,
and the op blamed is the mutated one or downstream of it in the data flow."""
from __future__ import annotations

import json
from contextlib import contextmanager

import tvcert.kernel.equality as equality
from tvcert.engine.verify import verify
from tvcert.interp import run_plan
from tvcert.plan import load_plan


def _outs(n: dict) -> list[str]:
    return [n["name"]] if n.get("name") else list(n.get("outputs") or [])


def descendants(plan: dict, roots: set) -> set:
    """(program, tensor) pairs that depend on a root, following send -> recv by tag across stages
    (a changed send is the root ("send", tag))."""
    out = set(roots)
    changed = True
    while changed:
        changed = False
        tags = {n["attrs"]["tag"] for g in plan["parallel"] for n in g["nodes"]
                if n["op"] == "send" and ((g["name"], n["inputs"][0]) in out or ("send", n["attrs"]["tag"]) in out)}
        for g in plan["parallel"]:
            for n in g["nodes"]:
                hit = any((g["name"], x) in out for x in n.get("inputs", [])) or (
                    n["op"] == "recv" and n["attrs"]["tag"] in tags)
                new = {(g["name"], o) for o in _outs(n)} - out
                if hit and new:
                    out |= new
                    changed = True
    return out


# Solver seconds a mutant may spend being proved.  A wrong plan's failing obligations are what cost (1,000-2,700
# satisfiable calls, 15-30 s a mutant); the correct plans these mutate verify in 0.1-0.3 s in all, so a (false) proof
# of a mutant would fit in this budget many times over: the bound costs the suite minutes, not strength.
MUTANT_SMT_SECONDS = 5.0


@contextmanager
def _smt_budget(seconds: float):
    saved = equality.SMT_TOTAL_SECONDS
    equality.SMT_TOTAL_SECONDS = seconds
    try:
        yield
    finally:
        equality.SMT_TOTAL_SECONDS = saved


def assert_refuted_and_localized(good: dict, bad: dict, role: str) -> None:
    with _smt_budget(MUTANT_SMT_SECONDS):
        res = verify(load_plan(bad))
    assert res.verdict == "REFUTED", res.reasons
    cx = res.counterexample
    again = run_plan(load_plan(bad), dims=cx["dims"], seed=cx["seed"], exact=cx["mode"] == "exact")
    assert not again.equal
    div = cx["first_divergence"]
    assert div is not None
    before = {json.dumps(n, sort_keys=True) for g in good["parallel"] for n in g["nodes"]}
    roots = {(g["name"], o) for g in bad["parallel"] for n in g["nodes"]
             if json.dumps(n, sort_keys=True) not in before
             for o in (_outs(n) if n["op"] != "send" else [])}  # changed or new ops
    roots |= {("send", n["attrs"]["tag"]) for g in bad["parallel"] for n in g["nodes"]
              if n["op"] == "send" and json.dumps(n, sort_keys=True) not in before}
    names = {(g["name"], o) for g in bad["parallel"] for n in g["nodes"] for o in _outs(n)}
    roots |= {(g["name"], n["inputs"][0]) for g in good["parallel"] for n in g["nodes"]
              if n.get("src") == role and any((g["name"], o) not in names for o in _outs(n))}  # a removed op: its input
    assert (div["program"], div["tensor"]) in descendants(bad, roots) or div["src"] == role, (div, role)
