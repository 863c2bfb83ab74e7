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


# ================================================================== the hostile-input suite (issue 18)
# Its own generator of bad inputs, each run in a forked child (peak memory measured per case with wait4, a hang
# killed at SUITE_DEADLINE): schema-driven documents, mutations of every bundled example, special files, huge
# literals, deep nesting, odd unicode, bad command lines and output paths.  The contract: never a traceback or
# an exit code outside 0-3 (4 = tvcert's own failure is counted as a problem too), never over SUITE_DEADLINE
# seconds or SUITE_MEMORY bytes, and a bad input exits 3 with one message line under 1 kB naming the JSON path
# (``$``) when the input is a plan or certificate document.
SUITE_DEADLINE = 30.0
SUITE_MEMORY = 1 << 30
MAX_MESSAGE_BYTES = 1024

ODD_STRINGS = ["\ud800", "a\udfffb", "\u0000", "\u202e\u202dx", "e\u0301\u0301\u0301", "\ufeffname", "\U0001F600",
               "\u2028\u2029", "x" * 100_000, "$.dims", "../../etc/passwd", "\\", "\"", "名前"]
HUGE_LITERALS = ["1" + "0" * 30, "-" + "9" * 25, "1e999", "-1e999", "1e-999", "2" * 5000, "9223372036854775808",
                 "-9223372036854775809", "18446744073709551616", "1.7976931348623157e309", "NaN", "-Infinity"]


@dataclass
class SuiteCase:
    kind: str
    detail: str
    args: list
    must_bad: bool
    needs_path: bool  # a bad document: its message must name a JSON path
    exit_code: Optional[int] = None
    problem: Optional[str] = None
    seconds: float = 0.0
    peak_bytes: int = 0
    message: str = ""


def _schema_doc(schema: dict, node: dict, rng: random.Random, depth: int = 0) -> Any:
    """A random document following (loosely) the JSON Schema ``node``: the right keys, random values."""
    if "$ref" in node:
        return _schema_doc(schema, schema.get("$defs", {}).get(node["$ref"].split("/")[-1], {}), rng, depth + 1)
    for k in ("anyOf", "oneOf"):
        if k in node:
            return _schema_doc(schema, rng.choice(node[k]), rng, depth + 1)
    t = node.get("type")
    if "enum" in node:
        return rng.choice(node["enum"] + [None, "zz"]) if rng.random() < 0.2 else rng.choice(node["enum"])
    if "const" in node:
        return node["const"]
    if depth > 8:
        return rng.choice([1, "a", None])
    if t == "object" or "properties" in node:
        props = node.get("properties", {})
        out = {}
        for k, v in props.items():
            if k in node.get("required", []) or rng.random() < 0.5:
                out[k] = _schema_doc(schema, v, rng, depth + 1)
        extra = node.get("additionalProperties")
        if isinstance(extra, dict):
            for _ in range(rng.randint(0, 3)):
                out[rng.choice(["x", "h", "tp", "rank.tp", "b", rng.choice(ODD_STRINGS)[:20]])] = \
                    _schema_doc(schema, extra, rng, depth + 1)
        return out
    if t == "array":
        return [_schema_doc(schema, node.get("items", {}), rng, depth + 1) for _ in range(rng.randint(0, 4))]
    if t == "integer":
        return rng.choice([0, 1, 2, 4, -1, 2 ** 40, rng.randint(1, 16)])
    if t == "number":
        return rng.choice([0.5, -1e9, 3, 1e300])
    if t == "string":
        return rng.choice(["x", "h", "tp", "h/tp", "rank.tp", "Replicate", "Shard(0)", "Partial(sum)", "matmul", "add",
                           "all_reduce", "", "-" * 300 + "h", "(" * 200 + "h" + ")" * 200])
    if t == "boolean":
        return rng.random() < 0.5
    return rng.choice([1, "x", None, [], {}])


def _examples() -> list[tuple[str, str]]:
    return [(p.name, p.read_text()) for p in sorted(EXAMPLES.glob("*.json"))]


def _literal_mutation(text: str, rng: random.Random) -> tuple[str, str]:
    """Replace a number of the document by a huge / non-finite literal, or a string by an odd one."""
    doc = json.loads(text)
    paths = list(_paths(doc))
    nums = [p for p in paths if p and isinstance(_get(doc, p), (int, float)) and not isinstance(_get(doc, p), bool)]
    strs = [p for p in paths if p and isinstance(_get(doc, p), str)]
    if nums and (rng.random() < 0.5 or not strs):
        p = rng.choice(nums)
        lit = rng.choice(HUGE_LITERALS)
        _set(doc, p, "@@LIT@@")
        return json.dumps(doc).replace('"@@LIT@@"', lit, 1), f"literal:{lit[:24]}@{'/'.join(map(str, p))[:40]}"
    if not strs:
        return text, "noop"
    p = rng.choice(strs)
    odd = rng.choice(ODD_STRINGS)
    _set(doc, p, odd)
    return json.dumps(doc), f"unicode:{odd[:8].encode('unicode_escape').decode()}@{'/'.join(map(str, p))[:40]}"


def _deep_doc(text: str, rng: random.Random) -> tuple[str, str]:
    n = rng.choice([200, 5000, 100_000, 1_500_000])
    where = rng.choice(["list", "object", "attr"])
    if where == "list":
        return "[" * n + "]" * n, f"deep:list:{n}"
    if where == "object":
        return '{"a":' * n + "1" + "}" * n, f"deep:object:{n}"
    i = text.find('"nodes"')
    if i < 0:
        return "[" * n + "]" * n, f"deep:list:{n}"
    return text[:i] + '"zz": ' + "[" * n + "]" * n + ", " + text[i:], f"deep:inside:{n}"


def _special_paths(tmp: Path) -> list[tuple[str, str]]:
    import os

    fifo = tmp / "fifo.json"
    if not fifo.exists():
        os.mkfifo(fifo)
    (tmp / "dir.json").mkdir(exist_ok=True)
    link = tmp / "zero_link.json"
    if not link.is_symlink():
        link.symlink_to("/dev/zero")
    (tmp / "empty.json").write_text("")
    out = [("fifo", str(fifo)), ("directory", str(tmp / "dir.json")), ("symlink_dev_zero", str(link)),
           ("empty", str(tmp / "empty.json")), ("missing", str(tmp / "nope.json"))]
    for dev in ("/dev/zero", "/dev/urandom", "/dev/null"):
        if Path(dev).exists():
            out.append((dev, dev))
    return out


def _suite_case(i: int, rng: random.Random, tmp: Path, examples, schema, cert_text) -> SuiteCase:
    """The i-th case: a kind in rotation, its details from ``rng``."""
    kinds = ["schema", "example_struct", "example_text", "special_file", "literal", "deep", "usage", "output_path"]
    kind = kinds[i % len(kinds)]
    name, text = examples[(i // len(kinds)) % len(examples)]  # every bundled example in turn
    doc_target = "cert" if (cert_text and rng.random() < 0.25) else "plan"
    base_text = cert_text if doc_target == "cert" else text
    cmd = "check" if doc_target == "cert" else rng.choice(["verify", "verify", "run"])
    path = tmp / f"case{i % 7}.json"
    if kind == "schema":
        doc = _schema_doc(schema, schema, rng)
        path.write_text(_dumps(doc), encoding="utf-8", errors="surrogatepass")
        return SuiteCase(kind, "schema document", [rng.choice(["verify", "run"]), str(path)], False, True)
    if kind == "example_struct":
        doc, m = mutate_struct(json.loads(base_text), rng)
        path.write_text(_dumps(doc), encoding="utf-8", errors="surrogatepass")
        return SuiteCase(kind, f"{name if doc_target == 'plan' else 'cert'}:{m}", [cmd, str(path)],
                         not isinstance(doc, dict), True)
    if kind == "example_text":
        t, m = mutate_text(base_text, rng)
        path.write_text(t, encoding="utf-8", errors="surrogateescape")
        return SuiteCase(kind, f"{name if doc_target == 'plan' else 'cert'}:{m}", [cmd, str(path)],
                         m in ("empty", "non_object", "deep_text"), True)
    if kind == "special_file":
        label, p = rng.choice(_special_paths(tmp))
        c = rng.choice(["verify", "run", "check", "check-plan"])
        args = ["check", str(tmp / "good_cert.json"), "--plan", p] if c == "check-plan" and cert_text else \
            [c if c != "check-plan" else "check", p]
        return SuiteCase(kind, f"{label} as {args[0]}{' --plan' if '--plan' in args else ''}", args, True, True)
    if kind == "literal":
        t, m = _literal_mutation(base_text, rng)
        path.write_text(t, encoding="utf-8", errors="surrogatepass")
        bad = m.startswith("literal:") and not m.startswith("literal:1e-999")
        bad = bad or m.startswith(("unicode:\\ud8", "unicode:a\\udf"))  # lone surrogates
        return SuiteCase(kind, f"{name if doc_target == 'plan' else 'cert'}:{m}", [cmd, str(path)], bad, True)
    if kind == "deep":
        t, m = _deep_doc(base_text, rng)
        path.write_text(t, encoding="utf-8")
        c = "check" if doc_target == "cert" else rng.choice(["verify", "run"])
        # a certificate given an extra nested key is tampered with, so INVALID (1) is right as well
        return SuiteCase(kind, m, [c, str(path)], not (m.startswith("deep:inside:") and c == "check"), True)
    if kind == "usage":
        good = str(EXAMPLES / name)
        args = rng.choice([["verify", good, "--bogus"], ["run", good, "--seed", "abc"], ["run", good, "--dims", "h=0"],
                           ["run", good, "--dims", "zz=4"], ["run", good, "--dims", "h=" + "9" * 30],
                           ["run", good, "--dims", "h"], ["nosuchcommand"], ["verify"], ["verify", str(tmp)],
                           ["check", good, "--solver", "yices"], ["verify", good, "--torch", good],
                           ["plan", "llama3-8b", "--dims", "h=0", "-o", str(tmp / "p.json")],
                           ["plan", "no-such-model", "-o", str(tmp / "p.json")],
                           ["mutate", good, "--bug", "nope", "-o", str(tmp / "m.json")]])
        return SuiteCase(kind, " ".join(a if len(a) < 40 else a[:37] + "..." for a in args[:1] + args[2:]), args, True,
                         False)
    # output paths: the input itself, under a file, in /proc, a directory
    src = tmp / "input_copy.json"
    src.write_text(text)
    (tmp / "afile").write_text("x")
    opt = rng.choice(["--emit-cert", "--report"])
    out = rng.choice([str(src), str(tmp / "afile" / "x.json"), "/proc/tvcert_x.json", str(tmp / "dir.json"),
                      "/proc/self/status"])
    if out.endswith("dir.json"):
        (tmp / "dir.json").mkdir(exist_ok=True)
    return SuiteCase(kind, f"{opt} {out.replace(str(tmp), '$TMP')}", ["verify", str(src), opt, out],
                     True, False)  # every one is refused before the plan is verified


def _run_in_child(args: list[str], deadline: float) -> tuple[Optional[int], Optional[str], str, float, int]:
    """(exit code, problem, output, seconds, peak RSS bytes) of ``tvcert ARGS`` run in a forked child."""
    import os
    import pickle
    import select

    rfd, wfd = os.pipe()
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        os.close(rfd)
        try:
            code, problem, where, out = _invoke(args)
            payload = pickle.dumps((code, problem if not where else f"{problem} at {where}", out[:20000]))
        except BaseException as exc:  # noqa: BLE001
            payload = pickle.dumps((None, f"harness: {type(exc).__name__}: {exc}", ""))
        try:
            os.write(wfd, payload)
        finally:
            os._exit(0)
    os.close(wfd)
    chunks = []
    timed_out = False
    end = time.monotonic() + deadline
    while True:
        left = end - time.monotonic()
        if left <= 0:
            timed_out = True
            break
        r, _, _ = select.select([rfd], [], [], min(left, 1.0))
        if r:
            b = os.read(rfd, 1 << 20)
            if not b:
                break
            chunks.append(b)
    os.close(rfd)
    if timed_out:
        os.kill(pid, signal.SIGKILL)
    _, status, ru = os.wait4(pid, 0)
    secs = time.perf_counter() - t0
    peak = ru.ru_maxrss * 1024
    if timed_out:
        return None, f"hang: no answer within {deadline:g} s", "", secs, peak
    try:
        code, problem, out = pickle.loads(b"".join(chunks))
    except Exception:  # noqa: BLE001
        return None, f"the case's process died (status {status})", "", secs, peak
    return code, problem, out, secs, peak


def _message_problem(case: SuiteCase, out: str) -> Optional[str]:
    lines = [ln for ln in out.splitlines() if ln.startswith(("error:", "Error:", "INVALID", "{\"error\""))]
    if case.exit_code == 3:
        if not lines:
            return "exit 3 without an error line"
        msg = lines[-1]
        if len(msg.encode("utf-8", "backslashreplace")) > MAX_MESSAGE_BYTES:
            return f"message of {len(msg)} characters (limit {MAX_MESSAGE_BYTES} bytes)"
        if case.needs_path and "$" not in msg and not msg.startswith("Error: Invalid value for '") \
                and case.args[0] in ("verify", "run", "check"):  # (click names the argument it refuses)
            return f"exit 3 message names no JSON path: {msg[:160]!r}"
    return None


@dataclass
class SuiteResult:
    cases: list = field(default_factory=list)
    seconds: float = 0.0

    @property
    def problems(self) -> list[SuiteCase]:
        return [c for c in self.cases if c.problem]

    def summary(self) -> dict[str, Any]:
        by_kind: dict[str, dict[str, int]] = {}
        for c in self.cases:
            k = by_kind.setdefault(c.kind, {})
            k[str(c.exit_code)] = k.get(str(c.exit_code), 0) + 1
        return {"cases": len(self.cases), "problems": len(self.problems),
                "tracebacks": sum(1 for c in self.cases if c.problem and ("traceback" in c.problem or "exception" in c.problem)),
                "hangs": sum(1 for c in self.cases if c.problem and c.problem.startswith("hang")),
                "over_memory": sum(1 for c in self.cases if c.peak_bytes > SUITE_MEMORY),
                "max_seconds": round(max((c.seconds for c in self.cases), default=0.0), 2),
                "peak_rss_mb": round(max((c.peak_bytes for c in self.cases), default=0) / 2 ** 20, 1),
                "max_message_bytes": max((len(c.message.encode('utf-8', 'backslashreplace')) for c in self.cases), default=0),
                "exit_codes_by_kind": dict(sorted(by_kind.items())), "seconds": round(self.seconds, 1)}

    def table(self) -> str:
        s = self.summary()
        lines = [f"- inputs: {s['cases']} in {s['seconds']} s; problems: {s['problems']} (tracebacks {s['tracebacks']}, "
                 f"hangs over {SUITE_DEADLINE:g} s {s['hangs']}, over {SUITE_MEMORY >> 20} MB {s['over_memory']})",
                 f"- slowest case {s['max_seconds']} s; peak RSS of a case {s['peak_rss_mb']} MB (forked from the "
                 f"harness, so it includes the harness's own pages); longest error line {s['max_message_bytes']} bytes",
                 "- exit codes by kind: " + "; ".join(f"{k}: {v}" for k, v in s["exit_codes_by_kind"].items())]
        seen = set()
        for c in self.problems:
            key = (c.kind, (c.problem or "")[:90])
            if key in seen:
                continue
            seen.add(key)
            lines.append(f"- PROBLEM {c.kind} ({c.detail}): {c.problem[:300]}")
        return "\n".join(lines)


def run_suite(n: int, seed: int = 0, seconds: float | None = None, say: Callable[[str], None] | None = None,
              deadline: float = SUITE_DEADLINE) -> SuiteResult:
    """Run ``n`` generated hostile inputs (or as many as fit in ``seconds``)."""
    from ..plan import json_schema

    say = say or (lambda s: None)
    rng = random.Random(f"tvcert-hostile-suite/{seed}")
    examples = _examples()
    schema = json_schema()
    res = SuiteResult()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        cert = seed_certificate()
        cert_text = json.dumps(cert) if cert is not None else None
        if cert_text:
            (tmp / "good_cert.json").write_text(cert_text)
        for i in range(n):
            if seconds is not None and time.perf_counter() - t0 > seconds:
                say(f"time budget reached after {i} cases")
                break
            case = _suite_case(i, rng, tmp, examples, schema, cert_text)
            code, problem, out, secs, peak = _run_in_child(case.args, deadline)
            case.exit_code, case.seconds, case.peak_bytes = code, secs, peak
            lines = [ln for ln in out.splitlines() if ln.startswith(("error:", "Error:", "INVALID", "{\"error\""))]
            case.message = lines[-1] if lines else ""
            if problem is None:
                if code not in (0, 1, 2, 3):
                    problem = f"exit code {code}"
                elif case.must_bad and code != 3:
                    problem = f"exit code {code} for bad input (want 3)"
                else:
                    problem = _message_problem(case, out)
            if problem is None and peak > SUITE_MEMORY:
                problem = f"peak RSS {peak >> 20} MB"
            case.problem = problem
            res.cases.append(case)
            if problem:
                say(f"hostile suite case {i} ({case.kind}: {case.detail}): {problem[:300]}")
            if i % 500 == 499:
                say(f"{i + 1} cases, {len(res.problems)} problems, {time.perf_counter() - t0:.0f} s")
    res.seconds = time.perf_counter() - t0
    return res


def main(argv: list[str] | None = None) -> int:
    import argparse
    import sys

    ap = argparse.ArgumentParser(prog="python -m tvcert.fuzz.hostile", description="hostile-input suite (issue 18)")
    ap.add_argument("--n", type=int, default=10000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seconds", type=float, default=None, help="stop after this many seconds")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    res = run_suite(a.n, a.seed, a.seconds, say=lambda s: print(s, file=sys.stderr, flush=True))
    print(json.dumps(res.summary(), indent=2) if a.json else res.table())
    return 1 if res.problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
