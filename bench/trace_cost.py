"""Tracing cost of the PyTorch front end over the mesh size and the depth (issue 16): where the time goes.

    PYTHONPATH=orchestrator python bench/trace_cost.py [--ranks 2,4,8,16,64] [--layers 1,2,4,8,32]
        [--budget 120] [--verify] [--jobs N] [--src DIR]

Each cell traces torchtitan's Llama 3 (the debug flavour's structure: fused QKV, complex RoPE, SwiGLU, untied
head; dim 64, 8 heads; local batch 2, seq 8) from a job config -- FSDP2 (SimpleFSDP) x TP + SP, ``ranks = dp x tp`` with tp = 2 up
to 16 ranks and dp 8 x tp 8 at 64 (dp 1 x tp 2 is torchtitan's TP route) -- in a fresh subprocess, and prints
where ``trace_plan``'s time goes (``tvcert.frontends.trace.stats_hook``): the CPU seconds of the logical model's
trace, then summed over the ranks the CPU seconds of their setup (the framework building and parallelizing the model), make_fx of the joint forward +
backward and conversion (ATen -> IR), the wall time of the rank phase (less than the sum with ``--jobs``), SPMD
compression + plan validation, and the rest (the front end's own preparation); then verifying (``--verify``) with the
engine's stages (runs of ops of one transformer layer, ``layer`` labels) and how many distinct ones it derived (the
rest replayed, ``kernel/memo.py``), the wall time of the whole cell (with imports), the peak RSS and the 1-minute load
average as the cell started; ``CPU s`` (user + system, the cell's process and its rank workers) is the figure least disturbed by other
load on a shared machine.  A cell whose predicted time (from the cells before it) exceeds ``--budget`` seconds is skipped and
printed as such.  Each rank is traced once, in its own process forked from the state before the logical trace
(``frontends/rank_workers.py``); ``--jobs N`` runs up to N of them at once (``TVCERT_TRACE_JOBS``; 1 by default here so
cells compare); every rank is traced.
``--src DIR`` imports tvcert from DIR instead of this tree's ``orchestrator/`` (an older checkout, for
before / after figures).  Figures, never asserts: this machine is shared and noisy.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CELL = r"""
import json, resource, sys, time
t_start = time.perf_counter()
from tvcert.frontends import trace as T
from tvcert.frontends.titan_config import load_job
from tvcert.frontends.torchtitan import trace_titan_job
stats = {}
T.stats_hook = stats.update
a = json.loads(sys.argv[1])
t0 = time.perf_counter()
plan = trace_titan_job(load_job(a["config"], "llama3-debug"), layers=a["layers"])
t1 = time.perf_counter()
out = {**stats, "plan_s": t1 - t0, "import_s": t0 - t_start, "ops": len(plan["parallel"][0]["nodes"])}
if stats:
    out["other_s"] = out["plan_s"] - sum(stats[k] for k in ("logical_s", "ranks_wall_s", "compress_s", "validate_s"))
if a["verify"]:
    from tvcert.plan import load_plan
    from tvcert.engine.verify import verify
    t2 = time.perf_counter()
    res = verify(load_plan(plan))
    out["verify_s"] = time.perf_counter() - t2
    out["verdict"] = res.verdict
    out["stages"] = (res.stats.get("stages", 0), res.stats.get("distinct_stages", 0))
me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
out["cpu_s"] = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime  # with the rank workers'
out["peak_rss_mb"] = me.ru_maxrss / 1024
print("RESULT " + json.dumps(out))
"""

TOML = """[model]
name = "llama3"
flavor = "debugmodel"

[training]
local_batch_size = 2
seq_len = 8
mixed_precision_param = "float32"

[parallelism]
data_parallel_replicate_degree = 1
data_parallel_shard_degree = {dp}
tensor_parallel_degree = {tp}
enable_sequence_parallel = true

[activation_checkpoint]
mode = "none"
"""


def mesh_of(ranks: int) -> tuple[int, int]:
    """(dp, tp) of a cell: tp 2 (dp = ranks / 2) up to 16 ranks, dp 8 x tp 8 at 64."""
    if ranks == 64:
        return 8, 8
    if ranks < 2 or ranks % 2:
        raise SystemExit(f"--ranks {ranks}: an even number of ranks (dp x tp 2), or 64 (dp 8 x tp 8)")
    return ranks // 2, 2


def run_cell(ranks: int, layers: int, verify: bool, jobs: int, tmp: Path, src: Path) -> dict:
    dp, tp = mesh_of(ranks)
    cfg = tmp / f"dp{dp}_tp{tp}.toml"
    cfg.write_text(TOML.format(dp=dp, tp=tp))
    env = dict(os.environ, PYTHONPATH=str(src))
    env["TVCERT_TRACE_JOBS"] = str(jobs)
    load = os.getloadavg()[0]  # the 1-minute load average as the cell starts (the machine is shared)
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", CELL, json.dumps({"config": str(cfg), "layers": layers,
                                                                 "verify": verify})],
                       capture_output=True, text=True, env=env, cwd=ROOT)
    wall = time.perf_counter() - t0
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        err = (p.stderr.strip().splitlines() or ["?"])[-1]
        return {"ranks": ranks, "dp": dp, "tp": tp, "layers": layers, "wall_s": wall, "error": err[:200]}
    out = json.loads(line[7:])
    return {"ranks": ranks, "dp": dp, "tp": tp, "layers": layers, "wall_s": wall, "load": load, **out}


COLS = ["ranks", "layers", "ranks traced", "logical CPU s", "rank setup CPU s", "rank make_fx CPU s", "rank convert CPU s",
        "ranks wall s", "compress + validate s", "other s", "verify s", "verdict", "engine stages (distinct)", "wall s",
        "CPU s", "peak RSS MB", "parallel ops", "load"]
HEADER = "| " + " | ".join(COLS) + " |\n|" + "---|" * len(COLS)


def fmt(r: dict) -> str:
    head = f"| {r['ranks']} (dp {r['dp']} x tp {r['tp']}) | {r['layers']} | "
    if "skipped" in r:
        return head + f"skipped: predicted {r['skipped']:.0f} s |" + " |" * (len(COLS) - 3)
    if "error" in r:
        return head + f"error: {r['error']} |" + " |" * (len(COLS) - 3)
    if "rank_trace_s" not in r:  # a tracer without the stats hook (--src of an older tree): the plan's seconds only
        return head + "- | " * 7 + f"{r['plan_s']:.1f} (all) | - | - | - | {r['wall_s']:.1f} | {r['cpu_s']:.1f} | " \
            f"{r['peak_rss_mb']:.0f} | {r['ops']} | {r['load']:.1f} |"
    v = f"{r['verify_s']:.1f}" if "verify_s" in r else "-"
    st = f"{r['stages'][0]} ({r['stages'][1]})" if "stages" in r else "-"
    return (head + f"{r['traced_ranks']}/{r['world']} (jobs {r['jobs']}) | {r['logical_cpu_s']:.1f} | "
            f"{r['rank_setup_s']:.1f} | {r['rank_trace_s']:.1f} | {r['rank_convert_s']:.1f} | {r['ranks_wall_s']:.1f} | "
            f"{r['compress_s'] + r['validate_s']:.1f} | {r['other_s']:.1f} | {v} | {r.get('verdict', '-')} | {st} | "
            f"{r['wall_s']:.1f} | {r['cpu_s']:.1f} | {r['peak_rss_mb']:.0f} | {r['ops']} | {r['load']:.1f} |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", default="2,4,8,16,64")
    ap.add_argument("--layers", default="1,2,4,8,32")
    ap.add_argument("--budget", type=float, default=120.0, help="skip a cell predicted to take longer (s)")
    ap.add_argument("--verify", action="store_true", help="also verify each traced plan")
    ap.add_argument("--jobs", type=int, default=1, help="rank processes at once (TVCERT_TRACE_JOBS)")
    ap.add_argument("--src", type=Path, default=ROOT / "orchestrator", help="the tvcert sources to measure")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    ranks = [int(x) for x in a.ranks.split(",")]
    layers = [int(x) for x in a.layers.split(",")]
    rows: list[dict] = []
    per_unit: float | None = None  # seconds per traced rank per layer, from the cells so far
    print(HEADER, flush=True)
    with tempfile.TemporaryDirectory() as td:
        for rk in ranks:
            for ly in layers:
                dp, tp = mesh_of(rk)
                if per_unit is not None:
                    guess = 8 + per_unit * rk * (ly + 1) / min(a.jobs, rk)
                    if guess > a.budget:
                        r = {"ranks": rk, "dp": dp, "tp": tp, "layers": ly, "skipped": guess}
                        rows.append(r)
                        print(fmt(r), flush=True)
                        continue
                r = run_cell(rk, ly, a.verify, a.jobs, Path(td), a.src.resolve())
                rows.append(r)
                print(fmt(r), flush=True)
                if "error" not in r:
                    per_unit = max(per_unit or 0.0, r["plan_s"] * min(a.jobs, rk) / (rk * (ly + 1)))
    if a.json:
        print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
