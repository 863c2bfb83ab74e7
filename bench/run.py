"""Verification time and memory per model and parallel plan (`make bench`).

Each case runs in a fresh subprocess so its peak RSS is its own: generate the plan, serialize
it, load it (schema + shape checks at full size), verify it.  Figures are printed and written
to bench/results.md; nothing is asserted (machines here are shared and noisy).

    python bench/run.py [--quick] [--only SUBSTRING] [--out bench/results.md]
"""
from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CASE_CODE = r"""
import json, resource, sys, time
from tvcert.generators.plans import generate_plan
from tvcert.plan import load_plan
from tvcert.engine.verify import verify
kw = json.loads(sys.argv[1])
bug = kw.pop("bug", None)
t0 = time.perf_counter(); p = generate_plan(**kw); t1 = time.perf_counter()
if bug:
    from tvcert.generators.mutations import mutate
    p, _ = mutate(p, bug)
text = json.dumps(p); t2 = time.perf_counter()
plan = load_plan(json.loads(text), check_run_dims=False); t3 = time.perf_counter()
res = verify(plan, refute=False); t4 = time.perf_counter()
print(json.dumps({"verdict": res.verdict, "generate_s": t1 - t0, "load_s": t3 - t2, "verify_s": t4 - t3,
                  "total_s": (t4 - t3) + (t3 - t2), "plan_mb": len(text) / 2**20,
                  "parallel_ops": res.stats["parallel_ops"], "rules": res.stats["rules_applied"],
                  "obligations": res.stats["obligations"], "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "reasons": res.reasons[:2]}))
"""

# TrainVerify's published configurations (nm = micro-batches)
HEADLINE = [
    ("llama3-8b", dict(dp=512)),
    ("llama3-70b", dict(dp=16, tp=8, pp=4, mb=32)),
    ("llama3-405b", dict(dp=64, tp=8, pp=16, mb=16)),
    ("deepseek-v3-16b", dict(dp=16, tp=4, pp=2, mb=16)),
    ("deepseek-v3-236b", dict(dp=16, tp=8, pp=4, mb=16)),
    ("deepseek-v3-671b", dict(dp=32, tp=8, pp=8, mb=16)),
]
EXTRA = dict(sp=True, cp=2, zero=1, ep=8)


def cases(quick: bool):
    out = []
    for model, kw in HEADLINE:
        out.append(("headline", model, kw))
        full = dict(kw, **{k: v for k, v in EXTRA.items()
                           if (k != "ep" or model.startswith("deepseek")) and (k != "sp" or kw.get("tp", 1) > 1)})
        out.append(("headline +sp cp2 zero1 (ep8)", model, full))
        out.append(("headline +sp ring-cp2 zero1 (ep8)", model, dict(full, cp_style="ring")))
        out.append(("headline +sp zigzag-cp2 zero1 (ep8)", model, dict(full, cp_style="zigzag")))
        out.append(("headline +sp ag-zigzag-cp2 zero1 (ep8)", model, dict(full, cp_style="allgather-zigzag")))
    sweeps = [("layers", "llama3-8b", {"tp": 8, "dp": 8}, "layers", [4, 8, 16, 32] if quick else [4, 8, 16, 32, 64, 126]),
              ("tp", "llama3-70b", {"layers": 8}, "tp", [1, 2, 4, 8]),
              ("dp", "llama3-70b", {"layers": 8, "tp": 8}, "dp", [2, 64, 4096]),
              ("microbatches", "llama3-70b", {"layers": 8, "tp": 8, "dp": 8}, "mb", [1, 16, 1024]),
              ("pp", "llama3-70b", {"layers": 16, "tp": 8}, "pp", [1, 4, 16]),
              ("hidden x", "llama3-70b", {"layers": 8, "tp": 8}, "hscale", [1, 4, 16]),
              ("seq", "llama3-70b", {"layers": 8, "tp": 8, "cp": 2}, "s", [8192, 131072, 1048576]),
              ("ring cp", "llama3-70b", {"layers": 8, "tp": 8, "cp_style": "ring"}, "cp", [2, 8, 32]),
              ("zigzag cp", "llama3-70b", {"layers": 8, "tp": 8, "cp_style": "zigzag"}, "cp", [2, 8, 32])]
    for name, model, base, key, values in sweeps:
        for v in values:
            kw = dict(base)
            if key == "hscale":
                kw["dims"] = {"h": 8192 * v, "f": 28672 * v}
            elif key == "s":
                kw["dims"] = {"s": v}
            else:
                kw[key] = v
            out.append((f"sweep {name}={v}", model, kw))
    # a plan with one bug: the proof stops early and every later op is a candidate for multi-op rules
    out.append(("one bug (UNKNOWN before refutation)", "llama3-405b",
                dict(HEADLINE[2][1], bug="missing_allreduce_o_proj")))
    if quick:
        out = [c for c in out if "405b" not in c[1] and "671b" not in c[1]]
    return out


def run_case(model: str, kw: dict) -> dict:
    arg = json.dumps({"model": model, **kw})
    env = {"PYTHONPATH": str(ROOT / "orchestrator"), "PATH": "/usr/bin:/bin"}
    p = subprocess.run([sys.executable, "-c", CASE_CODE, arg], capture_output=True, text=True, env=env, timeout=3600)
    if p.returncode != 0:
        return {"error": (p.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="skip the largest models and sweep points")
    ap.add_argument("--only", default="", help="run cases whose label or model contains this")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results.md"))
    args = ap.parse_args()
    rows = []
    header = ("| case | model | options | verdict | load s | verify s | total s | peak RSS MB | plan MB | parallel ops |\n"
              "|---|---|---|---|---|---|---|---|---|---|")
    print(header)
    for label, model, kw in cases(args.quick):
        if args.only and args.only not in label and args.only not in model:
            continue
        r = run_case(model, kw)
        opts = " ".join(f"{k}={v}" for k, v in kw.items())
        if "error" in r:
            row = f"| {label} | {model} | {opts} | ERROR: {r['error'][:80]} | | | | | | |"
        else:
            row = (f"| {label} | {model} | {opts} | {r['verdict']} | {r['load_s']:.2f} | {r['verify_s']:.2f} | "
                   f"{r['total_s']:.2f} | {r['peak_rss_mb']:.0f} | {r['plan_mb']:.1f} | {r['parallel_ops']} |")
        print(row, flush=True)
        rows.append(row)
    cpu = platform.processor() or platform.machine()
    keep = ""
    try:  # sections other tools append (fuzzing results) survive a re-run
        old = Path(args.out).read_text()
        keep = old[old.index("\n## ", old.index("| case |")):] if "| case |" in old and "\n## " in old[old.index("| case |"):] else ""
    except (OSError, ValueError):
        pass
    with open(args.out, "w") as f:
        f.write(f"# tvcert benchmarks\n\nMachine: {platform.node()} ({cpu}, {_cores()} cores, Python "
                f"{platform.python_version()}); date {date.today().isoformat()}.\n\n"
                "Each case runs in a fresh process: plan generated and serialized, then loaded (schema and "
                "shape checks at full size) and verified; `total` = load + verify. Peak RSS includes the "
                "interpreter and numpy/z3 imports (~100 MB).\n\n")
        f.write(header + "\n" + "\n".join(rows) + "\n" + keep)
    print(f"wrote {args.out}")
    return 0


def _cores() -> int:
    import os

    return os.cpu_count() or 1


if __name__ == "__main__":
    sys.exit(main())
