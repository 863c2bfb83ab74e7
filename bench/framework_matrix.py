"""Issue 16's done-when matrix (H39): every framework x parallelism, correct and with its realistic bug, run as a
user runs it (the ``tvcert trace`` CLI in a fresh process; torchtitan from a job toml), with the verdict, the blamed
op / source line / module, the line where the bug is, whether they match, and the seconds.  Figures, not asserts.

    python bench/framework_matrix.py                  # every row (long: ~30-60 min on the 2 shared cores)
    python bench/framework_matrix.py --only titan     # rows whose label contains any of the comma-separated words
    python bench/framework_matrix.py --list           # the rows and their commands, nothing run

The expected place of a bug is read from the example's source (the line carrying the ``BUG <name>`` marker, or the
given text), or, where the bug is no statement (a stage split in a toml, a parameter mark removed), the module or
output the first divergence must name.  ``TVCERT_REFUTE_SECONDS`` defaults to 600 here: on the loaded machine the
60-digit confirming run of a pipeline plan passes the 30 s default and the wrong plan is UNKNOWN (never VERIFIED).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EX = ROOT / "examples" / "torch"
JOBS = ROOT / "examples" / "torchtitan"


@dataclass
class Row:
    model: str  # MLP | titan llama3 | mcore layer
    par: str  # DDP, FSDP2, HSDP, FSDP2+TP, TP+PP 1F1B, TP+CP, TP, TP+SP, ...
    variant: str  # "correct" or the bug's name
    args: list[str]  # tvcert trace arguments
    line: tuple[str, ...] | None = None  # (example file, marker text or regex, ...) -> the bug's line(s)
    module: str | None = None  # else: a regex the blamed module or output must match
    want: str = ""  # the done-when verdict: VERIFIED for correct, REFUTED for a bug
    extra: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.model} | {self.par} | {self.variant}"


def spec(name: str, **sets) -> list[str]:
    return [str(EX / name)] + [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]


def job(name: str, layers: int = 1, model: str = "llama3-debug") -> list[str]:
    return ["--torchtitan", model, "--config", str(JOBS / name), "--layers", str(layers)]


def rows() -> list[Row]:
    r = []

    def ok(model, par, args):
        r.append(Row(model, par, "correct", args, want="VERIFIED"))

    def bug(model, par, name, args, line=None, module=None):
        r.append(Row(model, par, name, args, line, module, want="REFUTED"))

    m = "MLP"
    ok(m, "DDP", spec("ddp_mlp.py"))
    bug(m, "DDP", "loss_div_world", spec("ddp_mlp.py", bug="loss_div_world"), ("ddp_mlp.py", "BUG loss_div_world"))
    ok(m, "FSDP2", spec("fsdp2_mlp.py"))
    bug(m, "FSDP2", "double_avg", spec("fsdp2_mlp.py", bug="double_avg"), ("fsdp2_mlp.py", "BUG double_avg"))
    ok(m, "HSDP", spec("fsdp2_mlp.py", mode="hybrid_shard"))
    bug(m, "HSDP", "double_avg", spec("fsdp2_mlp.py", mode="hybrid_shard", bug="double_avg"),
        ("fsdp2_mlp.py", "BUG double_avg"))
    ok(m, "FSDP2+TP", spec("fsdp2_mlp.py", mode="fsdp_tp"))
    bug(m, "FSDP2+TP", "double_avg", spec("fsdp2_mlp.py", mode="fsdp_tp", bug="double_avg"),
        ("fsdp2_mlp.py", "BUG double_avg"))
    ok(m, "TP+PP 1F1B", spec("pp_tp_mlp.py"))
    bug(m, "TP+PP 1F1B", "no_scale", spec("pp_tp_mlp.py", bug="no_scale"), ("pp_tp_mlp.py", "BUG no_scale"))
    ok(m, "DP+PP 1F1B", spec("pp_dp_mlp.py"))
    bug(m, "DP+PP 1F1B", "wrong_peer", spec("pp_dp_mlp.py", bug="wrong_peer"),
        ("pp_dp_mlp.py", "BUG wrong_peer", "g = dist.new_group(ranks)"))  # the peer list, the group built from it
    ok(m, "DP+PP 1F1B mb2", spec("pp_dp_mlp.py", microbatches=2))  # micro-batches of a dp shard (H45)
    bug(m, "DP+PP 1F1B mb2", "no_scale", spec("pp_dp_mlp.py", microbatches=2, bug="no_scale"),
        ("pp_dp_mlp.py", "BUG no_scale: the sum of the micro-batch means"))
    bug(m, "DP+PP 1F1B mb2", "double_avg", spec("pp_dp_mlp.py", microbatches=2, bug="double_avg"),
        ("pp_dp_mlp.py", "BUG double_avg", "dist.all_reduce(p.grad, op=op"))
    bug(m, "DP+PP 1F1B mb2", "no_dp_reduce", spec("pp_dp_mlp.py", microbatches=2, bug="no_dp_reduce"),
        ("pp_dp_mlp.py", "p.grad.div_(dp)", "BUG no_dp_reduce"))  # the gradient read back unreduced, its last op
    ok(m, "TP+CP", spec("cp_context_parallel.py", cp=2, tp=2))
    # the local iota is a valid prefix of the positions: the first value it changes is the RoPE cache read
    bug(m, "TP+CP", "positions_not_offset", spec("cp_context_parallel.py", cp=2, tp=2, bug="positions_not_offset"),
        ("cp_attention.py", "return t * cos[pos] + half * sin[pos]"))
    ok(m, "TP", spec("tp_ln_gelu_mlp.py"))
    bug(m, "TP", "no_allreduce", spec("tp_ln_gelu_mlp.py", bug="no_allreduce"),
        ("tp_ln_gelu_mlp.py", "return x + a @ w2 + b2"))

    t = "titan llama3"
    LOCAL_MEAN = ("fsdp2_titan_llama3.py", "BUG local_mean", "return total / count")  # the count, then its div
    ok(t, "DDP", job("llama3_debug_ddp.toml"))
    bug(t, "DDP", "loss_div_world", spec("ddp_titan_llama3.py", bug="loss_div_world"),
        ("ddp_titan_llama3.py", "BUG loss_div_world"))
    ok(t, "FSDP2", job("llama3_debug_fsdp2_dtensor.toml"))
    bug(t, "FSDP2", "local_mean", spec("fsdp2_titan_llama3.py", bug="local_mean"),
        LOCAL_MEAN)
    ok(t, "HSDP", job("llama3_debug_hsdp_dtensor.toml"))
    bug(t, "HSDP", "local_mean", spec("fsdp2_titan_llama3.py", mode="hybrid_shard", bug="local_mean"),
        LOCAL_MEAN)
    ok(t, "FSDP2+TP", job("llama3_debug_fsdp2_tp2_dtensor.toml"))
    bug(t, "FSDP2+TP", "local_mean", spec("fsdp2_titan_llama3.py", mode="fsdp_tp", bug="local_mean"),
        LOCAL_MEAN)
    ok(t, "TP+PP 1F1B", job("llama3_debug_pp2_tp2.toml", 2))
    bug(t, "TP+PP 1F1B", "wrong_peer", spec("pp_titan_tp.py", bug="wrong_peer"), ("pp_titan_tp.py", "BUG wrong_peer"))
    bug(t, "TP+PP 1F1B", "no_loss_scale", spec("pp_titan_tp.py", bug="no_loss_scale"),
        ("pp_titan_tp.py", "BUG no_loss_scale"))
    bug(t, "TP+PP 1F1B", "swapped_layers", job("llama3_debug_pp2_tp2_swapped_layers.toml", 2),
        module=r"^layers\.1\b")
    ok(t, "TP+PP+DP 1F1B", job("llama3_debug_pp2_tp2_dp2.toml", 2))
    for b in ("local_tokens", "no_loss_scale", "fsdp_divide"):  # H45: examples/torch/pp_titan_tp_dp.py
        where = ("pp_titan_tp.py", "BUG no_loss_scale") if b == "no_loss_scale" else ("pp_titan_tp_dp.py", f"BUG {b}")
        bug(t, "TP+PP+DP 1F1B", b, spec("pp_titan_tp_dp.py", bug=b), where)
    ok(t, "TP+CP", job("llama3_debug_tp2_cp2.toml"))
    bug(t, "TP+CP", "positions_not_offset", spec("cp_titan_llama3.py", bug="positions_not_offset"),
        module=r"attention\.rope\b")  # the RoPE cache read at the local positions (rope.py's prefix slice)
    ok(t, "TP+SP+CP", job("llama3_debug_tp2_sp_cp2.toml"))
    bug(t, "TP+SP+CP", "positions_not_offset", spec("cp_titan_llama3.py", sp="true", bug="positions_not_offset"),
        module=r"attention\.rope\b")
    ok(t, "TP", job("llama3_debug_tp2_nosp.toml"))
    ok(t, "TP+SP", job("llama3_debug_tp2.toml"))

    q = "titan qwen3"  # H53: torchtitan's qwen3 debugmodel (tied lm_head), SimpleFSDP for the dp axes
    ok(q, "TP+SP", job("qwen3_debug_tp2.toml", model="qwen3-debug"))
    bug(q, "TP+SP", "w2_output_replicate", spec("tp_titan_qwen3.py", bug="w2_output_replicate"),
        module=r"^layers\.0\.feed_forward\.w2\b")  # the slice standing where the reduce-scatter belongs
    ok(q, "FSDP2", job("qwen3_debug_fsdp2.toml", model="qwen3-debug"))
    ok(q, "FSDP2+TP", job("qwen3_debug_fsdp2_tp2.toml", model="qwen3-debug"))
    bug(q, "FSDP2+TP", "w2_output_replicate", spec("tp_titan_qwen3.py", job="fsdp2_tp2", bug="w2_output_replicate"),
        module=r"in module layers\.0\.feed_forward\.w2\b")  # torchtitan's own placement check fails there

    c = "mcore layer"
    ok(c, "TP", spec("mcore_layer.py"))
    ok(c, "TP+SP", spec("mcore_layer.py", sp="true"))
    bug(c, "TP+SP", "ln_not_marked", spec("mcore_layer.py", sp="true", bug="ln_not_marked"), module="layernorm")
    bug(c, "TP+SP", "no_finalize", spec("mcore_layer.py", sp="true", bug="no_finalize"), module="layernorm")
    return r


def expected_line(row: Row) -> str | None:
    """``file:N`` (or ``file:N or file:M`` where the bug is a value one line and the op reading it the next)."""
    if row.line is None:
        return None
    fname, *markers = row.line
    text = (EX / fname).read_text().splitlines()
    got = []
    for marker in markers:
        pat = re.compile(marker) if marker.startswith("^") else None
        hits = [i + 1 for i, ln in enumerate(text) if (pat.search(ln) if pat else marker in ln)]
        if len(hits) != 1:
            raise SystemExit(f"{fname}: marker {marker!r} found on lines {hits}, want exactly one")
        got.append(f"{fname}:{hits[0]}")
    return " or ".join(got)


def run(row: Row, timeout: float) -> dict:
    env = dict(os.environ)
    env.setdefault("TVCERT_REFUTE_SECONDS", "600")
    cmd = [sys.executable, "-m", "tvcert.cli", "trace", *row.args, "--verify", "--json", "-q"]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"verdict": f"TIMEOUT>{timeout:.0f}s", "seconds": time.perf_counter() - t0}
    secs = time.perf_counter() - t0
    try:
        out = json.loads(p.stdout[p.stdout.index("{"):])
    except ValueError:
        return {"verdict": f"exit {p.returncode}", "seconds": secs, "reason": (p.stderr.strip().splitlines() or [""])[-1]}
    out["seconds"] = secs
    return out


def blamed(out: dict) -> dict:
    d = (out.get("counterexample") or {}).get("first_divergence") or {}
    return {"op": d.get("op"), "src": d.get("src"), "module": d.get("module"), "tensor": d.get("tensor"),
            "text": d.get("text") or ("" if d else out.get("reason") or "")}  # a failing program: its reason


def matches(row: Row, b: dict, exp: str | None) -> str:
    if row.want != "REFUTED":
        return ""
    if exp is not None:
        return "yes" if b["src"] and b["src"].split("/")[-1] in exp.split(" or ") else "no"
    if row.module is not None:
        where = " ".join(str(b[k] or "") for k in ("module", "tensor")) + " " + b["text"].split(";")[0]
        return "yes" if re.search(row.module, where) else "no"
    return "?"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="", help="comma-separated words; rows whose label contains one")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--timeout", type=float, default=1500.0)
    ap.add_argument("--json", dest="json_out", default="", help="also write the rows' results here")
    a = ap.parse_args()
    words = [w.strip().lower() for w in a.only.split(",") if w.strip()]
    todo = [r for r in rows() if not words or any(w in r.label.lower() for w in words)]
    print("| model | parallelism | variant | verdict | blamed op | source line | module | expected | match | s |")
    print("|---|---|---|---|---|---|---|---|---|---|", flush=True)
    results = []
    for row in todo:
        exp = expected_line(row) or (f"module ~ {row.module}" if row.module else "")
        if a.list:
            print(f"| {row.model} | {row.par} | {row.variant} | | | | | {exp} | | `tvcert trace "
                  f"{' '.join(x.replace(str(ROOT) + '/', '') for x in row.args)} --verify` |")
            continue
        out = run(row, a.timeout)
        b = blamed(out)
        m = matches(row, b, exp if row.line else None)
        verdict = out.get("verdict", "?")
        if row.want and verdict != row.want:
            rs = out.get("reasons") or [out.get("reason") or ""]
            why = next((r for r in rs if not str(r).startswith("output '")), rs[0])  # past the unproved outputs
            verdict = f"{verdict} (want {row.want}{': ' + str(why)[:160] if why else ''})"
        print(f"| {row.model} | {row.par} | {row.variant} | {verdict} | {b['op'] or ''} | {b['src'] or ''} | "
              f"{b['module'] or ''} | {exp} | {m} | {out['seconds']:.0f} |", flush=True)
        results.append({"row": row.label, "verdict": out.get("verdict"), **b, "expected": exp, "match": m,
                        "seconds": round(out["seconds"], 1)})
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
