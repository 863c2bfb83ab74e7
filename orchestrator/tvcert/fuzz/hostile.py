"""Hostile-input fuzzing of the front doors: ``tvcert run | verify`` on plans, ``tvcert check`` on
certificates, through :class:`click.testing.CliRunner` on :func:`tvcert.cli.main`.

Inputs are seeded mutations of valid plans (the bundled examples and generated pairs) and of
a valid certificate: structure-aware (replace a random subtree by a huge or negative number,
NaN, a wrong type, a deeply nested list, a long string; delete or add keys; make a node read
its own output or a later one, i.e. a cycle; duplicate names) and random (truncation, byte
flips, junk insertion).  The contract: exit 3 with a message for bad input, 0/1/2 if the
mutation happened to stay valid (1 only for ``check``: invalid certificate), never a
traceback, never a hang (each case runs under a SIGALRM deadline).
"""
from __future__ import annotations

import copy
import json
import random
import signal
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "examples"
DEADLINE = 20  # seconds per case


class Hang(Exception):
    pass


@dataclass
class Case:
    kind: str  # "plan" | "cert"
    command: str
    mutation: str
    text: str
    exit_code: Optional[int] = None
    problem: Optional[str] = None  # None = fine
    where: str = ""
    seconds: float = 0.0


@dataclass
class HostileResult:
    cases: list = field(default_factory=list)

    @property
    def crashes(self) -> list[Case]:
        return [c for c in self.cases if c.problem]

    def summary(self) -> dict[str, Any]:
        codes: dict[str, int] = {}
        for c in self.cases:
            k = f"{c.command}:{c.exit_code}"
            codes[k] = codes.get(k, 0) + 1
        return {"cases": len(self.cases), "problems": len(self.crashes), "exit_codes": dict(sorted(codes.items())),
                "max_seconds": round(max((c.seconds for c in self.cases), default=0.0), 2)}

    def table(self) -> str:
        s = self.summary()
        lines = ["Hostile input (CliRunner on tvcert.cli.main):", "",
                 f"- cases: {s['cases']}, problems (traceback / hang / wrong exit code): {s['problems']}, "
                 f"slowest case {s['max_seconds']} s",
                 f"- exit codes: {s['exit_codes']}"]
        seen = set()
        for c in self.crashes:
            key = (c.command, c.problem.splitlines()[0][:100], c.where)
            if key in seen:
                continue
            seen.add(key)
            lines.append(f"- PROBLEM `{c.command}` ({c.kind}, mutation {c.mutation}): {key[1]} at {c.where}; "
                         f"input starts {c.text[:160]!r}")
        return "\n".join(lines)


# ------------------------------------------------------------------ seeds
def seed_plans(n_generated: int = 6) -> list[dict]:
    out = [json.loads(p.read_text()) for p in sorted(EXAMPLES.glob("*.json"))]
    from .gen import generate

    for i in range(n_generated):
        out.append(generate(12345, i, perturb_rate=0.0).plan)
    return out


def seed_certificate() -> Optional[dict]:
    """A valid certificate from the first generated pair (or example) that verifies."""
    from ..certificate.emit import build_certificate
    from ..engine.verify import verify
    from ..plan import load_plan

    cands = [json.loads(p.read_text()) for p in sorted(EXAMPLES.glob("*.json"))]
    from .gen import generate

    cands += [generate(777, i, perturb_rate=0.0).plan for i in range(60)]
    for d in cands:
        try:
            res = verify(load_plan(copy.deepcopy(d)), refute=False)
            if res.verdict == "VERIFIED":
                return json.loads(json.dumps(build_certificate(res)))
        except Exception:
            continue
    return None


# ------------------------------------------------------------------ mutations
def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, prefix + (i,))


def _get(obj, path):
    for p in path:
        obj = obj[p]
    return obj


def _set(obj, path, value):
    if not path:
        return value
    _get(obj, path[:-1])[path[-1]] = value
    return obj


def _deep(n: int):
    v: Any = 1
    for _ in range(n):
        v = [v]
    return v


VALUES: list[tuple[str, Callable[[random.Random], Any]]] = [
    ("huge_int", lambda r: r.choice([10 ** 30, 2 ** 63, 2 ** 62, 10 ** 400])),
    ("negative", lambda r: r.choice([-1, -(2 ** 40), 0])),
    ("float", lambda r: r.choice([1.5, 1e308, -0.0])),
    ("nan_inf", lambda r: r.choice([float("nan"), float("inf"), float("-inf")])),
    ("null", lambda r: None),
    ("bool", lambda r: r.choice([True, False])),
    ("string", lambda r: r.choice(["", "x", "rank.tp", "1/0", "tp**99", "__import__('os')", "a" * 600, "Shard(-7)"])),
    ("list", lambda r: r.choice([[], [1, 2], ["a"], [None]])),
    ("dict", lambda r: r.choice([{}, {"a": 1}])),
    ("deep_nesting", lambda r: _deep(r.choice([50, 900, 5000]))),
]


def mutate_struct(doc: dict, rng: random.Random) -> tuple[Any, str]:
    try:
        return _mutate_struct(doc, rng)
    except (TypeError, AttributeError, KeyError, IndexError, ValueError, RecursionError):
        return copy.deepcopy(doc), "noop"


def _mutate_struct(doc: dict, rng: random.Random) -> tuple[Any, str]:
    d = copy.deepcopy(doc)
    paths = list(_paths(d))
    kind = rng.choice(["replace"] * 6 + ["delete", "add_key", "cycle", "dup_name", "self_input", "swap_sections"])
    if kind == "replace":
        p = rng.choice(paths)
        name, f = rng.choice(VALUES)
        return _set(d, p, f(rng)), f"replace:{name}@{'/'.join(map(str, p))[:60]}"
    if kind == "delete":
        p = rng.choice([p for p in paths if p] or [()])
        if not p:
            return d, "noop"
        parent = _get(d, p[:-1])
        if isinstance(parent, dict):
            parent.pop(p[-1], None)
        else:
            parent.pop(p[-1])
        return d, f"delete@{'/'.join(map(str, p))[:60]}"
    if kind == "add_key":
        dicts = [p for p in paths if isinstance(_get(d, p), dict)]
        p = rng.choice(dicts)
        _get(d, p)["zz_unknown"] = 1
        return d, f"add_key@{'/'.join(map(str, p))[:60]}"
    graphs = []
    for k in ("logical",):
        if isinstance(d.get(k), dict) and isinstance(d[k].get("nodes"), list):
            graphs.append(d[k])
    for g in d.get("parallel", []) if isinstance(d.get("parallel"), list) else []:
        if isinstance(g, dict) and isinstance(g.get("nodes"), list):
            graphs.append(g)
    graphs = [g for g in graphs if g["nodes"]]
    if not graphs:
        return d, "noop"
    g = rng.choice(graphs)
    nodes = g["nodes"]
    if kind == "cycle" and len(nodes) >= 2:  # node i reads node j's output, j > i
        i = rng.randrange(len(nodes) - 1)
        j = rng.randrange(i + 1, len(nodes))
        if nodes[i].get("inputs") and nodes[j].get("name"):
            nodes[i]["inputs"][0] = nodes[j]["name"]
        return d, "cycle"
    if kind == "self_input":
        n = rng.choice(nodes)
        if n.get("name"):
            n["inputs"] = [n["name"]] + list(n.get("inputs", []))[1:]
        return d, "self_input"
    if kind == "dup_name" and len(nodes) >= 2:
        a, b = rng.sample(range(len(nodes)), 2)
        if nodes[a].get("name"):
            nodes[b]["name"] = nodes[a]["name"]
        return d, "dup_name"
    if kind == "swap_sections":
        if "logical" in d and d.get("parallel"):
            d["logical"], d["parallel"] = d["parallel"], d["logical"]
        return d, "swap_sections"
    return d, "noop"


def mutate_text(text: str, rng: random.Random) -> tuple[str, str]:
    kind = rng.choice(["truncate", "flip", "junk", "deep_text", "empty", "non_object"])
    if kind == "truncate":
        return text[:rng.randrange(max(len(text), 1))], "truncate"
    if kind == "flip":
        b = bytearray(text.encode())
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(len(b))
            b[i] = rng.randrange(256)
        return b.decode("utf-8", errors="surrogateescape"), "flip"
    if kind == "junk":
        i = rng.randrange(len(text) + 1)
        return text[:i] + rng.choice(["}", "]", ",", "\"", "\\u0000", "1e999999", "NaN", "{" * 100]) + text[i:], "junk"
    if kind == "deep_text":
        n = rng.choice([1000, 100000])
        return "[" * n + "]" * n, "deep_text"
    if kind == "empty":
        return "", "empty"
    return rng.choice(["[]", "1", "\"plan\"", "null", "true"]), "non_object"


# ------------------------------------------------------------------ running one case
def _invoke(args: list[str]) -> tuple[Optional[int], Optional[str], str, str]:
    """Run the CLI in-process; returns (exit code, problem, where, output)."""
    from click.testing import CliRunner

    from ..cli import main

    def on_alarm(signum, frame):
        raise Hang(f"no answer within {DEADLINE} s")

    runner = CliRunner()
    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(DEADLINE)
    try:
        res = runner.invoke(main, args, catch_exceptions=True)
    except Hang as exc:
        return None, f"hang: {exc}", "", ""
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    out = (res.output or "") + (getattr(res, "stderr", "") if _has_stderr(res) else "")
    exc = res.exception
    if exc is not None and not isinstance(exc, SystemExit):
        tb = traceback.extract_tb(res.exc_info[2]) if res.exc_info else []
        frame = tb[-1] if tb else None
        where = f"{frame.filename.split('orchestrator/')[-1]}:{frame.lineno} ({frame.name})" if frame else "?"
        kind = "hang" if isinstance(exc, Hang) else "uncaught exception"
        return res.exit_code, f"{kind}: {type(exc).__name__}: {str(exc)[:200]}", where, out
    if "Traceback (most recent call last)" in out:
        return res.exit_code, "traceback printed", "", out
    return res.exit_code, None, "", out


def _has_stderr(res) -> bool:
    try:
        res.stderr
        return True
    except (ValueError, AttributeError):
        return False


def run_case(kind: str, command: str, mutation: str, text: str, tmp: Path, must_be_bad: bool,
             extra: list[str] | None = None) -> Case:
    path = tmp / ("input.json" if kind == "plan" else "cert.json")
    path.write_text(text, encoding="utf-8", errors="surrogateescape")
    t0 = time.perf_counter()
    args = [command, str(path)] + (extra or [])
    code, problem, where, out = _invoke(args)
    c = Case(kind, command, mutation, text[:400], code, problem, where, time.perf_counter() - t0)
    if c.problem is None:
        allowed = {0, 1, 3} if command == "check" else {0, 1, 2, 3}
        if code not in allowed:
            c.problem = f"exit code {code} (allowed {sorted(allowed)})"
        elif must_be_bad and code != 3:
            c.problem = f"exit code {code} for input that is not a valid {'plan' if kind == 'plan' else 'certificate'} JSON object (want 3)"
        elif code == 3 and not out.strip():
            c.problem = "exit 3 without a message"
    return c


def _dumps(obj) -> str:
    try:
        return json.dumps(obj)
    except (ValueError, RecursionError):
        return "[" * 3000 + "]" * 3000


def run_hostile(n: int, seed: int = 0, say: Callable[[str], None] | None = None) -> HostileResult:
    say = say or (lambda s: None)
    rng = random.Random(f"tvcert-hostile/{seed}")
    plans = seed_plans()
    cert = seed_certificate()
    out = HostileResult()
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        for i in range(n):
            target = "cert" if (cert is not None and rng.random() < 0.3) else "plan"
            base = cert if target == "cert" else rng.choice(plans)
            must_bad = False
            if rng.random() < 0.65:
                doc, m = mutate_struct(base, rng)
                if rng.random() < 0.25 and "deep" not in m:  # stack a second mutation
                    doc, m2 = mutate_struct(doc, rng) if isinstance(doc, dict) else (doc, "")
                    m = f"{m}+{m2}"
                text = _dumps(doc)
                must_bad = not isinstance(doc, dict)
            else:
                text, m = mutate_text(json.dumps(base), rng)
                must_bad = m in ("empty", "non_object", "deep_text")
            if target == "plan":
                cmd = rng.choice(["run", "verify", "verify"])
                case = run_case("plan", cmd, m, text, tmp, must_bad)
            else:
                case = run_case("cert", "check", m, text, tmp, must_bad)
            out.cases.append(case)
            if case.problem:
                say(f"hostile case {i}: {case.command} {case.mutation}: {case.problem} at {case.where}")
    return out
