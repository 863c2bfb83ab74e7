"""The differential fuzzing loop: verifier verdict vs. exact-interpreter oracle, per pair.

For every generated pair: load it (invalid generations are counted and skipped), ask the
oracle (exact interpreter, several seeds and dims), ask the verifier (``verify(plan,
refute=True)``), and classify.  Two soundness counters matter:

* **false VERIFIED** — the verifier says VERIFIED (or its propagation matched every output,
  "would-be VERIFIED", which is what VERIFIED becomes once every rule has its theorem) while
  the oracle shows a difference.  The run stops, the pair is minimized greedily and saved under
  ``tests/regressions/`` with the rule ids the bogus proof used.
* **false REFUTED** — REFUTED although the exact oracle finds no difference (refutations are
  interpreter-confirmed, so this must stay 0; a float64-only refutation would show up here).

For every VERIFIED pair the certificate is built, checked, and a random single-field mutation
of it must be rejected.
"""
from __future__ import annotations

import copy
import json
import random
import time
import traceback
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from ..plan import PlanError, load_plan
from .gen import Pair, generate
from .oracle import oracle

REPO = Path(__file__).resolve().parents[3]
REGRESSIONS = REPO / "tests" / "regressions"


@dataclass
class Outcome:
    index: int
    family: str
    tags: list
    perturbed: bool
    mutation: Optional[str]
    status: str  # "invalid" | "oracle_error" | "oracle_crash" | "ok" | "verify_crash"
    oracle_equal: Optional[bool] = None
    verdict: Optional[str] = None
    would_verify: bool = False
    float_disagrees: bool = False
    reason: str = ""
    rules: list = field(default_factory=list)
    cert: Optional[str] = None  # None | "ok" | "check_failed: ..." | "mutation_accepted: ..."
    seconds: float = 0.0
    detail: str = ""
    oracle_thorough: bool = False  # only the thorough oracle found the difference

    @property
    def false_verified(self) -> bool:
        return self.status == "ok" and self.oracle_equal is False and (self.verdict == "VERIFIED" or self.would_verify)

    @property
    def false_refuted(self) -> bool:
        return self.status == "ok" and self.oracle_equal is True and self.verdict == "REFUTED"


def _reason_key(reasons: list[str]) -> str:
    """A short, aggregatable form of the first UNKNOWN reason."""
    if not reasons:
        return ""
    r = reasons[0]
    if r.startswith("no rule for"):
        op = r.split("'")[1] if "'" in r else "?"
        tail = r.split(": ", 1)[1] if ": " in r else r
        tail = tail.split(" [inputs")[0]
        for w in ("on axis", "along dim", "of size", "at $"):
            tail = tail.split(w)[0]
        return f"no rule for {op}: {tail.strip()[:70]}"
    if r.startswith("the proof uses rules with no proved theorem"):
        return "unproved rules " + r.split(": ", 1)[1][:60]
    if r.startswith("output"):
        if "is not proved equal" in r:
            return "output: expression not proved equal"
        if "reads it back as" in r:
            return "output: placement differs from the declared one"
        if "has no fact" in r:
            return "output: no fact (an op before it has no rule)"
    return r[:80]


def evaluate(pair: Pair, index: int = 0, certs: bool = True, oracle_seeds=(0, 1, 2)) -> Outcome:
    from ..engine.verify import verify, used_rules

    t0 = time.perf_counter()
    out = Outcome(index, pair.family, list(pair.tags), pair.perturbed, pair.mutation, "ok")
    try:
        plan = load_plan(copy.deepcopy(pair.plan))
    except PlanError as exc:
        out.status, out.detail = "invalid", str(exc)[:200]
        return out
    except Exception as exc:  # the loader must never crash on a well-typed dict
        out.status, out.detail = "loader_crash", f"{type(exc).__name__}: {exc}"
        return out
    o = oracle(plan, pair.alt_dims, seeds=oracle_seeds)
    out.float_disagrees = o.float_disagrees
    if o.crash:
        out.status, out.detail = "oracle_crash", o.crash
        return out
    if o.equal is None:
        out.status, out.detail = "oracle_error", "; ".join(o.notes)[:200]
        return out
    out.oracle_equal = o.equal
    try:
        res = verify(plan, refute=True)
    except Exception as exc:
        out.status, out.detail = "verify_crash", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=4)}"
        return out
    out.verdict = res.verdict
    sized = res.stats.get("size_check") or {}
    out.would_verify = (all(m.ok for m in res.matches) and res.prop.blocked is None
                        and sized.get("verdict", "VERIFIED") == "VERIFIED")  # a size-coincidence proof is no proof
    if o.equal and (out.would_verify or res.verdict in ("VERIFIED", "REFUTED")):
        # the verdict claims something: make the oracle work harder before trusting "equal"
        o2 = oracle(plan, pair.alt_dims, seeds=oracle_seeds, use_float=False,
                    thorough=5 if res.verdict == "REFUTED" else 1)
        if o2.equal is False:
            out.oracle_equal = False
            out.oracle_thorough = True
        elif o2.equal is None:
            out.status, out.oracle_equal = "oracle_uncertain", None
            out.detail = "; ".join(o2.notes)[:200]
    out.rules = sorted(used_rules(res)) if out.would_verify else []
    if res.verdict != "VERIFIED":
        out.reason = _reason_key(res.reasons)
    if res.verdict == "REFUTED" and res.counterexample:
        ce = res.counterexample
        out.detail = f"counterexample mode={ce.get('mode')} seed={ce.get('seed')} dims={ce.get('dims')} " + \
            "; ".join(f"{o['name']}: max_diff={o['max_diff']:.3g}" for o in ce.get("outputs", []) if not o["equal"])
    if certs and res.verdict == "VERIFIED":
        out.cert = certificate_round_trip(res, random.Random(index))
    out.seconds = time.perf_counter() - t0
    return out


# ------------------------------------------------------------------ certificates in the loop
CERT_MUTATIONS = ["output_expr", "output_placement", "step_expr", "step_placement", "step_rule", "step_node",
                  "plan_digest", "plan_content", "manifest_digest", "rule_theorem"]


def mutate_certificate(cert: dict, rng: random.Random) -> tuple[dict, str] | None:
    c = copy.deepcopy(cert)
    for _ in range(10):
        k = rng.choice(CERT_MUTATIONS)
        if k == "output_expr" and c["outputs"]:
            c["outputs"][rng.randrange(len(c["outputs"]))]["expr"] += 1
        elif k == "output_placement" and c["outputs"]:
            o = c["outputs"][rng.randrange(len(c["outputs"]))]
            if not o["placement"]:
                continue
            i = rng.randrange(len(o["placement"]))
            o["placement"][i] = "Partial(sum)" if o["placement"][i] != "Partial(sum)" else "Replicate"
        elif k == "step_expr" and c["steps"]:
            st = c["steps"][rng.randrange(len(c["steps"]))]
            if not st["out"]:  # a memoized stage's row has no per-op facts
                continue
            st["out"][0][0] += rng.choice([1, -1])
        elif k == "step_placement" and c["steps"]:
            st = c["steps"][rng.randrange(len(c["steps"]))]
            if not st["out"]:
                continue
            pl = st["out"][0][1]
            if not pl:
                continue
            i = rng.randrange(len(pl))
            pl[i] = "Partial(sum)" if pl[i] != "Partial(sum)" else "Replicate"
        elif k == "step_rule" and c["steps"]:
            st = c["steps"][rng.randrange(len(c["steps"]))]
            if not st["rules"]:
                continue
            st["rules"][0] = rng.choice(["matmul_row_parallel", "allgather_shard", "elementwise_smt"])
        elif k == "step_node" and c["steps"]:
            st = c["steps"][rng.randrange(len(c["steps"]))]
            st["node"] += 1
        elif k == "plan_digest":
            c["plan"]["digest"] = "sha256:" + "0" * 64
        elif k == "plan_content":
            d = c["plan"]["content"]["dims"]
            key = rng.choice(sorted(d))
            d[key] += 1
        elif k == "manifest_digest":
            c["manifest"]["digest"] = "sha256:" + "f" * 64
        elif k == "rule_theorem" and c["manifest"]["rules"]:
            r = rng.choice(sorted(c["manifest"]["rules"]))
            c["manifest"]["rules"][r]["theorem"] += "_x"
        else:
            continue
        if c != cert:
            return c, k
    return None


def certificate_round_trip(res, rng: random.Random) -> str:
    from ..certificate.check import Certificate, Invalid, Unreadable, check_certificate
    from ..certificate.emit import build_certificate

    try:
        cert = build_certificate(res)
        check_certificate(Certificate.model_validate(json.loads(json.dumps(cert))), solvers=("z3",))
    except Exception as exc:
        return f"check_failed: {type(exc).__name__}: {str(exc)[:200]}"
    m = mutate_certificate(cert, rng)
    if m is None:
        return "ok"
    bad, kind = m
    try:
        check_certificate(Certificate.model_validate(bad), solvers=("z3",))
    except (Invalid, Unreadable):
        return "ok"
    except Exception as exc:  # pydantic ValidationError etc. also reject, but say so
        return "ok" if type(exc).__name__ == "ValidationError" else f"mutation_crash[{kind}]: {type(exc).__name__}: {exc}"
    return f"mutation_accepted[{kind}]"


# ------------------------------------------------------------------ minimizer
def still_false(plan_dict: dict, alt_dims=None) -> bool:
    from ..engine.verify import verify

    try:
        plan = load_plan(copy.deepcopy(plan_dict))
    except Exception:
        return False
    o = oracle(plan, alt_dims, use_float=False, thorough=2)
    if o.equal is not False:
        return False
    try:
        res = verify(plan, refute=False)
    except Exception:
        return False
    return res.verdict == "VERIFIED" or (all(m.ok for m in res.matches) and res.prop.blocked is None)


def _candidates(d: dict) -> Iterable[dict]:
    # drop an extra logical output
    if len(d["logical"]["outputs"]) > 1:
        for name in list(d["logical"]["outputs"]):
            c = copy.deepcopy(d)
            c["logical"]["outputs"].remove(name)
            loc = c["outputs"].pop(name)["local"]
            if all(b["local"] != loc for b in c["outputs"].values()):
                c["parallel"][0]["outputs"] = [x for x in c["parallel"][0]["outputs"] if x != loc]
            yield c
    # drop a node (logical or parallel), rewiring its uses to its first input
    for side in ("logical", "parallel"):
        g = d["logical"] if side == "logical" else d["parallel"][0]
        for i in range(len(g["nodes"]) - 1, -1, -1):
            n = g["nodes"][i]
            c = copy.deepcopy(d)
            gc = c["logical"] if side == "logical" else c["parallel"][0]
            gc["nodes"].pop(i)
            if n.get("inputs"):
                new = n["inputs"][0]
                for m in gc["nodes"][i:]:
                    m["inputs"] = [new if x == n.get("name") else x for x in m.get("inputs", [])]
                gc["outputs"] = list(dict.fromkeys(new if x == n.get("name") else x for x in gc["outputs"]))
                binds = c["outputs"]
                if side == "parallel":
                    for b in binds.values():
                        if b["local"] == n.get("name"):
                            b["local"] = new
                else:
                    if n.get("name") in binds:
                        binds[new] = binds.pop(n["name"])
            yield c
    # drop unused inputs
    for k, t in enumerate(d["logical"]["inputs"]):
        used = any(t["name"] in n.get("inputs", []) for n in d["logical"]["nodes"]) or t["name"] in d["logical"]["outputs"]
        if used:
            continue
        c = copy.deepcopy(d)
        c["logical"]["inputs"].pop(k)
        b = c["inputs"].pop(t["name"])
        c["parallel"][0]["inputs"] = [x for x in c["parallel"][0]["inputs"] if x["name"] != b["local"]]
        yield c
    # shrink dims
    mesh = set(d["mesh"])
    for k, v in d["dims"].items():
        if k in mesh:
            continue
        for nv in sorted({1, 2, 3, v // 2, v // 3}):
            if 0 < nv < v:
                c = copy.deepcopy(d)
                c["dims"][k] = nv
                yield c


def minimize(plan: dict, alt_dims=None, budget: int = 400) -> dict:
    cur = copy.deepcopy(plan)
    tries = 0
    progress = True
    while progress and tries < budget:
        progress = False
        for c in _candidates(cur):
            tries += 1
            if still_false(c, None):
                cur = c
                progress = True
                break
            if tries >= budget:
                break
    return cur


def save_regression(plan: dict, out: Outcome, dest: Path = REGRESSIONS) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    name = f"false_verified_{out.family}_{out.mutation or 'none'}_{out.index}"
    plan = copy.deepcopy(plan)
    plan["name"] = name
    plan["description"] = (f"fuzz regression: verifier VERIFIED (or would) a pair the exact interpreter shows unequal; "
                           f"rules used: {', '.join(out.rules)}")
    p = dest / f"{name}.json"
    p.write_text(json.dumps(plan, indent=1) + "\n")
    return p


# ------------------------------------------------------------------ the batch
@dataclass
class Stats:
    outcomes: list = field(default_factory=list)
    wall: float = 0.0
    generated: int = 0

    def add(self, o: Outcome) -> None:
        self.outcomes.append(o)

    def summary(self) -> dict[str, Any]:
        ok = [o for o in self.outcomes if o.status == "ok"]
        c = Counter(o.status for o in self.outcomes)
        s = {
            "generated": len(self.outcomes),
            "invalid_skipped": c["invalid"],
            "oracle_unrunnable": c["oracle_error"],
            "oracle_crash": c["oracle_crash"],
            "oracle_uncertain": c["oracle_uncertain"],
            "verify_crash": c["verify_crash"],
            "loader_crash": c["loader_crash"],
            "pairs": len(ok),
            "equal": sum(o.oracle_equal is True for o in ok),
            "unequal": sum(o.oracle_equal is False for o in ok),
            "perturbed": sum(o.perturbed for o in ok),
            "verified": sum(o.verdict == "VERIFIED" for o in ok),
            "would_be_verified": sum(o.would_verify for o in ok),
            "refuted": sum(o.verdict == "REFUTED" for o in ok),
            "unknown": sum(o.verdict == "UNKNOWN" for o in ok),
            "false_verified": sum(o.false_verified for o in ok),
            "false_refuted": sum(o.false_refuted for o in ok),
            "float_disagrees": sum(o.float_disagrees for o in ok),
            "unequal_found_only_by_thorough_oracle": sum(o.oracle_thorough for o in ok),
            "certs_checked": sum(o.cert is not None for o in ok),
            "cert_problems": sum(o.cert not in (None, "ok") for o in ok),
            "wall_seconds": round(self.wall, 1),
            "pairs_per_second": round(len(self.outcomes) / self.wall, 1) if self.wall else 0.0,
        }
        return s

    def per_family(self) -> dict[str, dict[str, int]]:
        """Equal pairs per transform tag: how many, VERIFIED, would-be VERIFIED, UNKNOWN."""
        t: dict[str, Counter] = defaultdict(Counter)
        for o in self.outcomes:
            if o.status != "ok" or o.oracle_equal is not True:
                continue
            for tag in o.tags or [o.family]:
                c = t[tag]
                c["equal"] += 1
                c["verified"] += o.verdict == "VERIFIED"
                c["would"] += o.would_verify
                c["unknown"] += o.verdict == "UNKNOWN"
                c["unknown_raw"] += not o.would_verify and o.verdict != "REFUTED"
        return {k: dict(v) for k, v in sorted(t.items())}

    def per_mutation(self) -> dict[str, dict[str, int]]:
        t: dict[str, Counter] = defaultdict(Counter)
        for o in self.outcomes:
            if not o.perturbed:
                continue
            c = t[o.mutation or "?"]
            c["generated"] += 1
            if o.status != "ok":
                c[o.status] += 1
                continue
            c["unequal"] += o.oracle_equal is False
            c["equal"] += o.oracle_equal is True
            c[o.verdict] += 1
            c["would"] += o.would_verify
            c["false_verified"] += o.false_verified
        return {k: dict(v) for k, v in sorted(t.items())}

    def notable(self) -> list[dict]:
        """Every pair worth a look: soundness counters, crashes, certificate problems (with its index)."""
        out = []
        for o in self.outcomes:
            why = []
            if o.false_verified:
                why.append("false VERIFIED")
            if o.false_refuted:
                why.append("false REFUTED")
            if o.status.endswith("crash"):
                why.append(o.status)
            if o.cert not in (None, "ok"):
                why.append("certificate: " + o.cert)
            if why:
                out.append({"index": o.index, "why": why, "family": o.family, "mutation": o.mutation,
                            "verdict": o.verdict, "detail": o.detail.splitlines()[0][:300] if o.detail else ""})
        return out

    def unknown_reasons(self, k: int = 12) -> list[tuple[str, int]]:
        c = Counter(o.reason for o in self.outcomes if o.status == "ok" and o.oracle_equal and o.verdict == "UNKNOWN")
        return c.most_common(k)

    def raw_unknown_reasons(self, k: int = 12) -> list[tuple[str, int]]:
        c = Counter(o.reason for o in self.outcomes
                    if o.status == "ok" and o.oracle_equal and not o.would_verify and o.verdict != "REFUTED")
        return c.most_common(k)


def _work(args) -> Outcome:
    seed, i, certs, perturb_rate = args
    try:
        pair = generate(seed, i, perturb_rate)
    except Exception as exc:  # a generator bug (a StopIteration here once ended the whole stream silently)
        return Outcome(i, "generator", [], False, None, "harness_crash",
                       detail=f"generate: {type(exc).__name__}: {exc}\n{traceback.format_exc(limit=6)}")
    try:
        return evaluate(pair, i, certs)
    except Exception as exc:  # never lose a pair silently
        return Outcome(i, pair.family, pair.tags, pair.perturbed, pair.mutation, "harness_crash",
                       detail=f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=6)}")


def run(pairs: int, seed: int = 0, jobs: int = 1, certs: bool = True, perturb_rate: float = 0.5,
        stop_on_false: bool = True, minimize_false: bool = True, time_budget: float | None = None,
        say: Callable[[str], None] | None = None, regressions: Path = REGRESSIONS) -> tuple[Stats, list[tuple[Outcome, dict, Path | None]]]:
    """Run ``pairs`` pairs; returns the stats and every false VERIFIED (outcome, minimized plan, saved path)."""
    say = say or (lambda s: None)
    st = Stats()
    falses: list = []
    t0 = time.perf_counter()
    args = ((seed, i, certs, perturb_rate) for i in range(pairs))
    if jobs > 1:
        import multiprocessing as mp

        pool = mp.get_context("fork").Pool(jobs)
        it = pool.imap(_work, args, chunksize=8)
    else:
        pool = None
        it = map(_work, args)
    try:
        for n, o in enumerate(it, 1):
            st.add(o)
            if o.false_verified:
                pair = generate(seed, o.index, perturb_rate)
                say(f"FALSE VERIFIED at pair {o.index} ({o.family}, mutation {o.mutation}); rules {o.rules}")
                small = minimize(pair.plan, pair.alt_dims) if minimize_false else pair.plan
                path = save_regression(small, o, regressions)
                say(f"minimized pair saved to {path}:\n{json.dumps(small, indent=1)}")
                falses.append((o, small, path))
                if stop_on_false:
                    break
            if n % 500 == 0:
                el = time.perf_counter() - t0
                say(f"{n}/{pairs} pairs, {n / el:.1f}/s")
            if time_budget and time.perf_counter() - t0 > time_budget:
                say(f"time budget reached after {n} pairs")
                break
    finally:
        if pool is not None:
            pool.terminate()
    st.wall = time.perf_counter() - t0
    return st, falses


def format_table(st: Stats) -> str:
    s = st.summary()
    lines = ["| measure | value |", "| --- | --- |"]
    for k, v in s.items():
        lines.append(f"| {k.replace('_', ' ')} | {v} |")
    lines += ["", "UNKNOWN rate on oracle-equal pairs, per transform family (a pair counts for every transform it uses):", "",
              "| family | equal pairs | VERIFIED | would-be VERIFIED | UNKNOWN | UNKNOWN rate | raw UNKNOWN rate (propagation) |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    for k, c in st.per_family().items():
        e = c.get("equal", 0)
        lines.append(f"| {k} | {e} | {c.get('verified', 0)} | {c.get('would', 0)} | {c.get('unknown', 0)} | "
                     f"{c.get('unknown', 0) / e:.0%} | {c.get('unknown_raw', 0) / e:.0%} |")
    lines += ["", "Perturbed pairs per mutation operator:", "",
              "| mutation | generated | invalid | oracle unequal | oracle equal | VERIFIED | would-be VERIFIED | REFUTED | UNKNOWN | false VERIFIED |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for k, c in st.per_mutation().items():
        lines.append(f"| {k} | {c.get('generated', 0)} | {c.get('invalid', 0)} | {c.get('unequal', 0)} | {c.get('equal', 0)} | "
                     f"{c.get('VERIFIED', 0)} | {c.get('would', 0)} | {c.get('REFUTED', 0)} | {c.get('UNKNOWN', 0)} | "
                     f"{c.get('false_verified', 0)} |")
    lines += ["", "Most frequent first reasons for UNKNOWN on equal pairs (raw propagation):", ""]
    for r, n in st.raw_unknown_reasons():
        lines.append(f"- {n} x {r}")
    crashes = [o for o in st.outcomes if o.status.endswith("crash")]
    if crashes:
        lines += ["", "Crashes:", ""]
        seen = set()
        for o in crashes:
            key = (o.status, o.detail.splitlines()[0][:120] if o.detail else "")
            if key in seen:
                continue
            seen.add(key)
            lines.append(f"- {o.status} at pair {o.index}: {key[1]}")
    fr = [o for o in st.outcomes if o.false_refuted]
    if fr:
        lines += ["", "False REFUTED (exact oracle finds no difference):", ""]
        for o in fr[:20]:
            lines.append(f"- pair {o.index} ({o.family}, mutation {o.mutation}): {o.detail}")
    certs = [o for o in st.outcomes if o.cert not in (None, "ok")]
    if certs:
        kinds = Counter(o.cert.split(":")[0] + ":" + o.cert.split(":")[-1][:90] for o in certs)
        lines += ["", f"Certificate problems ({len(certs)} of {sum(o.cert is not None for o in st.outcomes)} VERIFIED pairs):", ""]
        for k, n in kinds.most_common(8):
            ex = next(o.index for o in certs if o.cert.split(":")[0] + ":" + o.cert.split(":")[-1][:90] == k)
            lines.append(f"- {n} x {k} (first: pair {ex})")
    return "\n".join(lines)
