"""How coqc time and memory grow with plan size on the Coq judge's mesh route.

Builds an L-layer tanh MLP (forward) on a (dp, tp) mesh: batch sharded over dp, column- then
row-parallel matmuls, an all_reduce over tp per layer, the loss summed and all_reduced over dp.
For each L it emits the Coq file (``coqjudge.emit``) and runs ``coqc`` on it with ``Print
Assumptions plan_verified``, printing wall seconds and peak RSS (wait4) of coqc alone.

    python bench/coq_judge_scaling.py [L ...]        # default: 4 16 64
    python bench/coq_judge_scaling.py llama          # the llama3-8b 2-layer tp2 dp2 zero1 step (small dims):
                                                     # how much has a Coq term and a fact (first blockers),
                                                     # then Coq-checks the plan (or, while some node has no
                                                     # fact, the part with facts: the loss and every all_reduced
                                                     # gradient), coqc s / peak MB, and wrong variants of it
    python bench/coq_judge_scaling.py llama0         # the same for zero 0
    python bench/coq_judge_scaling.py llama-layers 2 4 8   # the zero-1 llama step at 2, 4, 8 layers: coqc s / MB
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "orchestrator"))

from tvcert import proofkit  # noqa: E402
from tvcert.coqjudge.emit import NotCovered, emit, probe_facts, probe_uncovered, translate  # noqa: E402
from tvcert.plan import load_plan  # noqa: E402


def mlp_plan(layers: int) -> dict:
    t = lambda n, s: {"name": n, "shape": s, "dtype": "float"}  # noqa: E731
    l_in, p_in, ln, pn, binds = [t("x", ["b", "h"])], [t("x", ["b/dp", "h"])], [], [], {}
    binds["x"] = {"local": "x", "placement": {"dp": "Shard(0)"}}
    cur = "x"
    for i in range(layers):
        w1, w2 = f"w1_{i}", f"w2_{i}"
        l_in += [t(w1, ["h", "f"]), t(w2, ["f", "h"])]
        p_in += [t(w1, ["h", "f/tp"]), t(w2, ["f/tp", "h"])]
        binds[w1] = {"local": w1, "placement": {"tp": "Shard(1)"}}
        binds[w2] = {"local": w2, "placement": {"tp": "Shard(0)"}}
        mm = lambda n, a, b: {"name": n, "op": "matmul", "inputs": [a, b]}  # noqa: E731
        ln += [mm(f"a{i}", cur, w1), {"name": f"h{i}", "op": "tanh", "inputs": [f"a{i}"]}, mm(f"o{i}", f"h{i}", w2)]
        pn += [mm(f"a{i}", cur, w1), {"name": f"h{i}", "op": "tanh", "inputs": [f"a{i}"]}, mm(f"p{i}", f"h{i}", w2),
               {"name": f"o{i}", "op": "all_reduce", "inputs": [f"p{i}"], "attrs": {"axis": "tp", "reduce": "sum"}}]
        cur = f"o{i}"
    ln += [{"name": "s0", "op": "sum", "inputs": [cur], "attrs": {"dims": [0]}},
           {"name": "loss", "op": "sum", "inputs": ["s0"], "attrs": {"dims": [0]}}]
    pn += [{"name": "s0p", "op": "sum", "inputs": [cur], "attrs": {"dims": [0]}},
           {"name": "s0", "op": "all_reduce", "inputs": ["s0p"], "attrs": {"axis": "dp", "reduce": "sum"}},
           {"name": "loss", "op": "sum", "inputs": ["s0"], "attrs": {"dims": [0]}}]
    return {"tvcert_plan": 1, "name": f"mlp{layers}_dp2_tp2", "dims": {"b": 4, "h": 4, "f": 8, "dp": 2, "tp": 2},
            "mesh": {"dp": "dp", "tp": "tp"},
            "logical": {"inputs": l_in, "nodes": ln, "outputs": ["loss"]},
            "parallel": [{"name": "spmd", "inputs": p_in, "nodes": pn, "outputs": ["loss"]}],
            "inputs": binds, "outputs": {"loss": {"local": "loss", "placement": {}}}}


def coqc(text: str) -> tuple[bool, float, float, str, float]:
    """coqc the text: accepted, wall s, peak MB, the output's tail, CPU s."""
    with tempfile.TemporaryDirectory() as td:
        f = Path(td) / "Bench.v"
        f.write_text(text + "\nPrint Assumptions plan_verified.\n")
        t0 = time.monotonic()
        p = subprocess.Popen(["coqc", "-q", "-w", proofkit.COQ_WARNINGS, "-Q", str(ROOT / "Rules"), "TVCert", str(f)],
                             cwd=td, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        out = p.stdout.read() if p.stdout else ""
        _, status, ru = os.wait4(p.pid, 0)
        secs = time.monotonic() - t0
    ok = os.waitstatus_to_exitcode(status) == 0 and "functional_extensionality_dep" in out
    return ok, secs, ru.ru_maxrss / 1024, out[-300:], ru.ru_utime + ru.ru_stime


LLAMA = ["llama3-8b", "--layers", "2", "--tp", "2", "--dp", "2", "--dims", "h=8,f=16,v=16,s=4,hd=4,nh=4,nkv=2"]


def llama_plan(zero: int, layers: int = 2) -> dict:
    args = [*LLAMA[:2], str(layers), *LLAMA[3:]]
    with tempfile.TemporaryDirectory() as td:
        out = Path(td) / "llama.json"
        subprocess.run([sys.executable, "-m", "tvcert.cli", "plan", *args, "--zero", str(zero), "-o", str(out)],
                       check=True, capture_output=True, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT / "orchestrator")})
        return json.loads(out.read_text())


def llama_coverage(d: dict):
    """The issue's first-stage plan: steps with a Coq term, steps with a fact, the first blockers by kind."""
    from collections import Counter

    plan = load_plan(d, check_run_dims=False)
    try:
        translate(plan)
        print("translation: every step has a Coq term")
    except NotCovered as exc:
        print("translation:", exc.coverage)
    kinds = Counter((u.op, u.why) for u in probe_uncovered(plan))
    for (op, why), k in kinds.items():
        print(f"  no Coq term: {op} x{k}: {why}")
    named, missing, cp = probe_facts(plan)
    n = len(plan.programs[next(iter(plan.programs))].nodes)
    print(f"fact search: {len(named)} of {n} program nodes get a fact (a node reading one without a fact is skipped)")
    for (op, why), c in Counter((u.op, u.why) for u in missing).items():
        print(f"  no rule: {op} x{c}: {why}  (first: {next(u.node for u in missing if (u.op, u.why) == (op, why))})")
    return named, cp


def llama_prefix(d: dict, named: dict, cp) -> dict:
    """The plan cut to the program nodes with a fact: its outputs are the loss and every gradient the
    program all_reduces (their logical nodes and placements from the facts)."""
    ni = len(cp.l_inputs)
    lname = lambda l: cp.l_inputs[l][0] if l < ni else cp.l_nodes[l - ni].name  # noqa: E731
    prog = d["parallel"][0]
    keep = [n for n in prog["nodes"] if n["name"] in named]
    outs = {}
    for n in keep:
        if n["op"] == "all_reduce" and (n.get("src", "").endswith("grad_all_reduce") or n.get("src") == "head.loss.all_reduce"):
            l, pls = named[n["name"]]
            outs[lname(l)] = {"local": n["name"], "placement": {a: str(pl) for (a, _), pl in zip(cp.mesh, pls)
                                                                if pl.kind != "R"}}
    d = {**d, "name": d["name"] + " (forward, backward, gradient all_reduce)",
         "logical": {**d["logical"], "outputs": list(outs)},
         "parallel": [{**prog, "nodes": keep, "outputs": [b["local"] for b in outs.values()]}], "outputs": outs}
    d.pop("run_dims", None)
    return d


def _mutants(pre: dict) -> list[tuple[str, dict]]:
    """Wrong variants of the Coq-checked llama part (each must be shown wrong by the interpreter)."""
    import copy

    def v(name, f):
        d = copy.deepcopy(pre)
        nodes = {n["name"]: n for n in d["parallel"][0]["nodes"]}
        f(d, nodes)
        out.append((name, d))

    def reroute(d, old, new):  # every reader of old reads new (the collective is skipped)
        for n in d["parallel"][0]["nodes"]:
            n["inputs"] = [new if x == old else x for x in n["inputs"]]
        for b in d["outputs"].values():
            b["local"] = new if b["local"] == old else b["local"]
        d["parallel"][0]["outputs"] = [new if x == old else x for x in d["parallel"][0]["outputs"]]

    by_src = {n.get("src"): n["name"] for n in pre["parallel"][0]["nodes"]}
    bwd_ar = next(n for n in pre["parallel"][0]["nodes"] if n["op"] == "all_reduce" and "bwd" in n.get("src", "")
                  and n["attrs"]["axis"] == "tp")
    zero = "optim.embedding.grad_reduce_scatter" in by_src   # ZeRO-1: gradients reduce_scattered, state flat
    sync = "reduce_scatter" if zero else "all_reduce"
    emb, wo = by_src[f"optim.embedding.grad_{sync}"], by_src[f"optim.layer0.wo.grad_{sync}"]
    out: list[tuple[str, dict]] = []
    if not zero:
        v("embedding gradient without its dp all_reduce", lambda d, n: reroute(d, emb, n[emb]["inputs"][0]))
    v(f"embedding gradient {sync} over tp instead of dp", lambda d, n: n[emb]["attrs"].update(axis="tp"))
    if not zero:
        v("wo gradient all_reduced with avg instead of sum", lambda d, n: n[wo]["attrs"].update(reduce="avg"))
    else:
        lm_perm = next(x["name"] for x in pre["parallel"][0]["nodes"] if x.get("src") == "optim.lm_head.tp_dim_first")
        v("ZeRO: lm_head gradient flattened without its transpose (wrong flatten order)",
          lambda d, n: n[by_src["optim.lm_head.grad_flatten"]].update(inputs=n[lm_perm]["inputs"]))
        v("ZeRO: lm_head parameter shard sliced on the other dp rank", lambda d, n: n[by_src["optim.lm_head.param_shard"]]
          ["attrs"].update(start="(1-rank.dp)*((h)*(v/tp)/dp)", end="(2-rank.dp)*((h)*(v/tp)/dp)"))
        v("ZeRO: wo updated parameter all_gathered over tp instead of dp",
          lambda d, n: n[by_src["optim.layer0.wo.param_all_gather"]]["attrs"].update(axis="tp"))
        v("ZeRO: clip norm term of wo without its dp all_reduce",
          lambda d, n: reroute(d, by_src["optim.layer0.wo.sumsq_all_reduce"], by_src["optim.layer0.wo.sumsq"]))
        v("ZeRO: wo second moment from the unclipped gradient shard",
          lambda d, n: n[by_src["optim.layer0.wo.g2"]].update(inputs=[wo]))
    v("row-parallel o_proj without its tp all_reduce", lambda d, n: reroute(d, by_src["layer0.o_proj.all_reduce"],
                                                                            by_src["layer0.o_proj"]))
    v("vocab-parallel embedding lookup without its tp all_reduce",
      lambda d, n: reroute(d, by_src["embed.all_reduce"], by_src["embed.lookup"]))
    v("RMSNorm's mean-square over the partial (pre all_reduce) embedding",
      lambda d, n: n[by_src["layer0.attn_norm.sq"]].update(inputs=[by_src["embed.lookup"]]))
    v("loss read without its dp all_reduce", lambda d, n: reroute(d, by_src["head.loss.all_reduce"],
                                                                   by_src["head.loss.mean"]))
    v("cross-entropy target picked without its tp all_reduce",
      lambda d, n: reroute(d, by_src["head.ce.target"], by_src["head.ce.local_target"]))
    v("this rank's vocab block slice reversed", lambda d, n: n[by_src["embed.vocab_block"]]["attrs"].update(
        start="(1-rank.tp)*(v/tp)", end="(2-rank.tp)*(v/tp)"))
    v("loss mean over a dp rank's token count", lambda d, n: n[by_src["head.loss.count"]]["attrs"].update(
        value="b/dp*s"))
    v("q_proj reads the residual stream instead of the normed one",
      lambda d, n: n[by_src["layer0.q_proj"]].update(inputs=[by_src["embed.all_reduce"], "layer0.wq"]))
    v(f"backward {bwd_ar['src']} skipped", lambda d, n: reroute(d, bwd_ar["name"], bwd_ar["inputs"][0]))
    if "optim.layer0.wo.sq" in by_src:   # the optimizer part (the whole plan)
        v(f"clip norm: wo's sum of squares over its partial (pre dp {sync}) gradient",
          lambda d, n: n[by_src["optim.layer0.wo.sq"]].update(inputs=[n[wo]["inputs"][0]]))
        v("clip norm: a replicated parameter's sum of squares not divided by tp",
          lambda d, n: reroute(d, by_src["optim.final_norm.sumsq_dedup"], by_src["optim.final_norm.sumsq"]))
        v("AdamW: wo's first moment from the unclipped gradient",
          lambda d, n: n[by_src["optim.layer0.wo.m_new"]].update(inputs=[wo]))
    return out


def llama_mutants(pre: dict) -> None:
    """Each mutant: the interpreter shows it wrong; the search finds no certificate; Coq's mcheck says false
    on the correct plan's facts reused by node name (what a buggy search might claim)."""
    from tvcert.coqjudge.emit import R_, render, search
    from tvcert.interp import run_plan

    gcp = translate(load_plan(pre, check_run_dims=False))
    good = {n.name: f for n, f in zip(gcp.p_nodes, search(gcp))}
    lines, names = [], []
    for name, d in _mutants(pre):
        plan = load_plan(d, check_run_dims=False)
        wrong = not run_plan(plan, plan.dims, seed=0, exact=False).equal
        try:
            cp = translate(plan)
        except NotCovered:
            print(f"  {name}: interpreter wrong {wrong}; no Coq term")
            continue
        try:
            search(cp)
            print(f"  {name}: interpreter wrong {wrong}; the search FOUND a certificate")
            continue
        except NotCovered:
            pass
        cert = [good.get(n.name, (len(cp.l_inputs), (R_,) * len(cp.mesh))) for n in cp.p_nodes]
        cp.x_nodes = gcp.x_nodes
        k = len(names)
        text = render(cp, cert)
        body = text[text.index("Definition the_plan"):text.index("(* Printer check")] + \
            text[text.index("Definition the_xs"):text.index("Lemma the_check")]
        lines.append(body.replace("the_plan", f"plan_{k}").replace("the_cert", f"cert_{k}").replace("the_xs", f"xs_{k}")
                     .replace("the_nat", f"nat_{k}"))
        lines.append(f"Eval vm_compute in mcheckx plan_{k} xs_{k} cert_{k}.")
        names.append((name, wrong))
    head = ("From mathcomp Require Import all_ssreflect.\nFrom Coq Require Import BinPosDef.\n"
            "From TVCert Require Import IR.Syntax IR.Denote IR.LayoutOps IR.Check IR.Mesh IR.MeshCheck IR.NatTable.\n"
            "Import JSyntax JDenote JLayout JCheck JMesh JMeshCheck JNatTable.\n")
    with tempfile.TemporaryDirectory() as td:
        f = Path(td) / "Mut.v"
        f.write_text(head + "\n".join(lines))
        t0 = time.monotonic()
        r = subprocess.run(["coqc", "-q", "-w", proofkit.COQ_WARNINGS, "-Q", str(ROOT / "Rules"), "TVCert", str(f)],
                           cwd=td, capture_output=True, text=True)
    import re

    verdicts = re.findall(r"=\s*(true|false)\s*:\s*bool", r.stdout)
    print(f"  Coq mcheck on reused facts ({time.monotonic() - t0:.0f} s):")
    for (name, wrong), v in zip(names, verdicts + ["?"] * len(names)):
        print(f"    {name}: interpreter wrong {wrong}; no certificate from the search; mcheck {v}")


def llama_layers(layers: list[int]) -> None:
    """The ZeRO-1 llama step (small dims) at several layer counts: coqc wall / CPU seconds and peak RSS."""
    proofkit.build(ROOT)
    print(f"{'layers':>6} {'p_nodes':>8} {'l_nodes':>8} {'x_nodes':>8} {'file kB':>8} {'emit s':>7} {'coqc s':>7} "
          f"{'CPU s':>7} {'peak MB':>8}  accepted  (load {os.getloadavg()[0]:.1f})")
    for n in layers:
        d = llama_plan(1, n)
        t0 = time.monotonic()
        text, cp, _ = emit(load_plan(d, check_run_dims=False))
        te = time.monotonic() - t0
        ok, secs, mb, tail, cpu = coqc(text)
        print(f"{n:>6} {len(cp.p_nodes):>8} {len(cp.l_nodes):>8} {len(cp.x_nodes):>8} {len(text) / 1024:>8.0f} "
              f"{te:>7.1f} {secs:>7.1f} {cpu:>7.1f} {mb:>8.0f}  {ok}  (load {os.getloadavg()[0]:.1f})"
              + ("" if ok else "  " + " ".join(tail.split())), flush=True)


def main(argv: list[str]) -> None:
    if argv[:1] == ["llama-layers"]:
        llama_layers([int(a) for a in argv[1:]] or [2, 4, 8])
        return
    if argv in (["llama"], ["llama0"]):
        d = llama_plan(0 if argv == ["llama0"] else 1)
        named, cp = llama_coverage(d)
        n = len(d["parallel"][0]["nodes"])
        pre = d if len(named) == n else llama_prefix(d, named, cp)   # the whole plan once every node has a fact
        proofkit.build(ROOT)
        text, pcp, _ = emit(load_plan(pre, check_run_dims=False))
        ok, secs, mb, tail, cpu = coqc(text)
        print(f"Coq-checked {'plan' if pre is d else 'part'}: {len(pcp.p_nodes)} program / {len(pcp.l_nodes)} "
              f"logical nodes, {len(pre['outputs'])} outputs, file {len(text) / 1024:.0f} kB: "
              f"coqc {secs:.1f} s, peak {mb:.0f} MB, accepted {ok}" + ("" if ok else "  " + " ".join(tail.split())))
        print("wrong variants of that part:")
        llama_mutants(pre)
        return
    proofkit.build(ROOT)
    print(f"{'layers':>6} {'p_nodes':>8} {'file kB':>8} {'coqc s':>7} {'peak MB':>8}  accepted")
    for layers in [int(a) for a in argv] or [4, 16, 64]:
        text, cp, _ = emit(load_plan(mlp_plan(layers)))
        ok, secs, mb, tail, cpu = coqc(text)
        print(f"{layers:>6} {len(cp.p_nodes):>8} {len(text) / 1024:>8.1f} {secs:>7.1f} {mb:>8.0f}  {ok}"
              + ("" if ok else "  " + " ".join(tail.split())))


if __name__ == "__main__":
    main(sys.argv[1:])
