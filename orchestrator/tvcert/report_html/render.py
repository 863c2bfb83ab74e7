"""One self-contained HTML file for a verification result (no script, no network).

Read top to bottom a report says: the verdict and one sentence why; then, for a refutation, the first
parallel op whose value matches no logical tensor (source line, module path, the plan entry), the
subgraph around it drawn on both sides with the fact each edge carries, and the values there per rank,
Alive2-style (summaries first, full values behind a fold), and the hints; for UNKNOWN the blocking op,
its input facts, the rules that were tried and the condition that failed; for VERIFIED what was proved
(rules and their Coq theorems, stages, obligations) and the certificate's digest.

It renders the engine's :class:`~tvcert.engine.verify.Result` as it is; the only computation of its
own is re-running the reference interpreter at the counterexample's seed to show values (the run is
deterministic, so these are the values the verdict was based on).
"""
from __future__ import annotations

import hashlib
import html
import json
import re
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np

from . import draw

VERIFIED, REFUTED, UNKNOWN = "VERIFIED", "REFUTED", "UNKNOWN"
COLOR = {VERIFIED: "#1a7f37", REFUTED: "#cf222e", UNKNOWN: "#9a6700"}
E = html.escape

CSS = """
*{box-sizing:border-box}
html{font-size:15px}
body{font-family:-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;color:#24292f;margin:0;background:#fff;
 overflow-wrap:anywhere;word-break:break-word;line-height:1.45}
main{max-width:1240px;margin:0 auto;padding:14px 18px 40px}
header{display:flex;flex-wrap:wrap;align-items:baseline;gap:6px 14px;border-bottom:1px solid #d0d7de;padding-bottom:8px}
#verdict{font-size:1.7rem;font-weight:700;margin:0;padding:2px 12px;border-radius:6px;color:#fff}
header .plan{font-size:1.05rem;color:#57606a}
#reason{font-size:1.08rem;margin:8px 0 10px}
h2{font-size:1.1rem;margin:18px 0 6px;border-bottom:1px solid #eaeef2;padding-bottom:3px}
code,pre,.mono{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:.86rem}
pre{white-space:pre-wrap;word-break:break-word;overflow-wrap:anywhere;background:#f6f8fa;padding:8px 10px;
 border-radius:6px;margin:4px 0;max-width:100%}
dl.kv{display:grid;grid-template-columns:max-content minmax(0,1fr);gap:2px 14px;margin:4px 0}
dl.kv dt{color:#57606a}
dl.kv dd{margin:0;min-width:0}
dl.kv ul{margin:0;padding-left:18px}
.where{font-weight:600}
.red{color:#cf222e}
.box{border:1px solid #d0d7de;border-radius:8px;padding:8px 12px;margin:8px 0}
.focus{border-left:5px solid #cf222e}
.focus.amber{border-left-color:#9a6700}
.graphwrap{border:1px solid #d0d7de;border-radius:8px;padding:6px;text-align:center;max-width:100%}
svg.graph{height:auto;max-height:560px;width:100%}
.note{color:#57606a;font-size:.85rem}
table{border-collapse:collapse;width:100%;table-layout:fixed;margin:4px 0}
th,td{border:1px solid #d0d7de;padding:4px 6px;text-align:left;vertical-align:top;overflow-wrap:anywhere}
th{background:#f6f8fa;font-weight:600}
td.num{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:.85rem}
ul.hints{padding-left:0;margin:4px 0}
ul.hints li{margin:2px 0}
.hint{background:#fff8c5;border:1px solid #d4a72c;border-radius:6px;padding:4px 8px;list-style:none;margin:4px 0}
details{margin:6px 0}
.top{display:grid;grid-template-columns:minmax(0,5fr) minmax(0,7fr);gap:12px;align-items:start}
.top > *{min-width:0}
.top h2{margin-top:4px}
main > .box .split{display:grid;grid-template-columns:minmax(0,3fr) minmax(0,2fr);gap:6px 16px;align-items:start}
.split > *{min-width:0}
.box h3{font-size:1rem;margin:6px 0 4px}
.box h2{margin-top:2px}
@media (max-width:1000px){.top, main > .box .split{grid-template-columns:minmax(0,1fr)}}
summary{cursor:pointer;color:#0969da}
"""


# ============================================================================================ helpers
def _ops_by_path(g) -> dict[str, int]:
    return {n.path: i for i, n in enumerate(g.nodes)}


def _module(n) -> str | None:
    return (getattr(n, "meta", None) or {}).get("module")


def _fmt_num(x) -> str:
    try:
        f = float(x)
    except (TypeError, ValueError):
        return str(x)
    if not np.isfinite(f):
        return str(f)
    if f == int(f) and abs(f) < 1e15:
        return str(int(f))
    return f"{f:.6g}"


def _flat(v) -> list:
    return list(np.asarray(v).flat)


def _few(v, k: int = 6) -> str:
    flat = _flat(v)
    s = ", ".join(_fmt_num(x) for x in flat[:k])
    return f"[{s}{', …' if len(flat) > k else ''}]"


def _full(v, limit: int = 4096) -> str:
    a = np.asarray(v)
    if a.dtype == object:
        try:
            a = a.astype(np.float64)
        except (TypeError, ValueError):
            return str(a.tolist())[:20000]
    with np.printoptions(threshold=limit, linewidth=110, precision=8, suppress=False):
        s = np.array2string(a, separator=", ")
    return s


def _fdiff(a, b) -> float | None:
    try:
        x = np.asarray(a, dtype=np.float64)
        y = np.asarray(b, dtype=np.float64)
    except (TypeError, ValueError):
        return None
    if x.shape != y.shape:
        return None
    if x.size == 0:
        return 0.0
    with np.errstate(invalid="ignore", over="ignore"):
        d = np.abs(x - y)
    return float(np.nanmax(d)) if np.isfinite(d).any() or d.size else float("inf")


def _short_expr(exprs, e: int, depth: int = 2, limit: int = 110) -> str:
    s = exprs.show(e, depth)
    return s if len(s) <= limit else s[:limit - 1] + "…"


def _fact_text(res, program: str, tensor: str, depth: int = 2) -> str | None:
    from ..kernel.rules import fmt_pl

    f = res.prop.facts.get(program, {}).get(tensor)
    if f is None:
        return None
    return f"{_short_expr(res.exprs, f.expr, depth)} as {fmt_pl(res.plan.program_axes(program), f.pl)}"


def _shape_text(n, k: int) -> str:
    sd = (getattr(n, "meta", None) or {}).get("shape@dims")
    if not sd or k >= len(sd):
        return ""
    shape, _ = sd[k]
    return "[" + ", ".join(map(str, shape)) + "]"


# ============================================================================================ focus
@dataclass
class Focus:
    kind: str  # "divergence" | "blocking" | "output"
    program: str
    node: int | None  # index in the program (None: a program input)
    tensor: str | None
    logical_node: int | None = None


def logical_counterpart(plan, pnode) -> int | None:
    """The logical op the parallel op stands for: same op and source line, else same op and output name, else
    same output name.  A heuristic for display (names and lines are what traced and hand-written plans share)."""
    lg = plan.logical.nodes
    if pnode.src:
        same = [i for i, n in enumerate(lg) if n.op == pnode.op and n.src == pnode.src]
        if same:
            named = [i for i in same if set(lg[i].outputs) & set(pnode.outputs)]
            return (named or same)[0]
    for i, n in enumerate(lg):
        if n.op == pnode.op and set(n.outputs) & set(pnode.outputs):
            return i
    for i, n in enumerate(lg):
        if set(n.outputs) & set(pnode.outputs):
            return i
    if pnode.src:
        same = [i for i, n in enumerate(lg) if n.src == pnode.src]
        if same:
            return same[-1]
    return None


def blocking_failure(fails):
    """The failure to show first: a near miss of a named rule (its reason starts with the rule's name: a
    multi-op rule whose ops are there but one side condition fails) says the most; else the first in order."""
    rules = _manifest_rules()
    for f in fails:
        m = re.match(r"([A-Za-z_][A-Za-z0-9_]*): ", f.reason)
        if m and m.group(1) in rules:
            return f
    return fails[0]


def find_focus(res) -> Focus | None:
    plan = res.plan
    if res.verdict == REFUTED:
        div = (res.counterexample or {}).get("first_divergence")
        if div and div.get("program") in plan.programs:
            g = plan.programs[div["program"]]
            i = _ops_by_path(g).get(div["node"])
            if i is not None:
                return Focus("divergence", div["program"], i, div["tensor"], logical_counterpart(plan, g.nodes[i]))
        for o in (res.counterexample or {}).get("outputs", []):
            if not o["equal"] and o["name"] in plan.outputs:
                b = plan.outputs[o["name"]]
                g = plan.programs[b.program]
                pi = g.producer_index().get(b.local)
                li = plan.logical.producer_index().get(o["name"])
                return Focus("output", b.program, pi[0] if pi else None, b.local, li[0] if li else None)
        return None
    if res.verdict == UNKNOWN:
        fails = res.prop.open_failures()
        if fails:
            f = blocking_failure(fails)
            g = plan.programs[f.program]
            n = g.nodes[f.node]
            return Focus("blocking", f.program, f.node, n.outputs[0] if n.outputs else None,
                         logical_counterpart(plan, n))
        for m in res.matches:
            if not m.ok and m.program in plan.programs:
                g = plan.programs[m.program]
                pi = g.producer_index().get(m.local)
                li = plan.logical.producer_index().get(m.name)
                return Focus("output", m.program, pi[0] if pi else None, m.local, li[0] if li else None)
    return None


# ============================================================================================ drawing
def neighborhood(g, center: int, up: int = 2, down: int = 1, cap: int = 7, fan_out: int = 3,
                 fan_in: int = 3) -> list[int]:
    prod = {o: i for i, n in enumerate(g.nodes) for o in n.outputs}
    cons: dict[str, list[int]] = {}
    for i, n in enumerate(g.nodes):
        for x in n.inputs:
            cons.setdefault(x, []).append(i)
    keep = {center}
    front = [center]
    edge_of = set()  # the farthest ops up: their own inputs are named in their box, not drawn
    for level in range(up):
        nxt = []
        for i in front:
            for x in g.nodes[i].inputs[:fan_in if level == 0 else 2]:  # farther up: the two main operands
                j = prod.get(x)
                if j is not None and j not in keep and len(keep) < cap:
                    keep.add(j)
                    nxt.append(j)
                    if level == up - 1:
                        edge_of.add(j)
        front = nxt
    front = [center]
    for _ in range(down):
        nxt = []
        for i in front:
            for o in g.nodes[i].outputs:
                for j in cons.get(o, [])[:fan_out]:
                    if j not in keep:
                        keep.add(j)
                        nxt.append(j)
                        edge_of.add(j)  # consumers: their other inputs are named in their box
        front = nxt
    NEIGHBORHOOD_EDGE[id(g)] = edge_of
    return sorted(keep)


NEIGHBORHOOD_EDGE: dict[int, set[int]] = {}  # graph id -> the rim (farthest-up ops, consumers) of its last one


def _op_label(n, extra: str = "") -> str:
    out = ", ".join(n.outputs) if n.outputs else "(no output)"
    lines = [f"{n.op} → {out}"]
    if n.attrs.get("axis") is not None and n.op not in ("ring_loop",):
        lines.append(f"axis {n.attrs['axis']}")
    if n.src:
        lines.append(n.src)
    mod = _module(n)
    if mod:
        lines.append(mod)
    if extra:
        lines.append(extra)
    return "\n".join(lines)


def _cluster(g, keep: list[int], prefix: str, mark: dict[int, str], edge_label, title: str) -> draw.Cluster:
    c = draw.Cluster(title)
    prod = {o: i for i, n in enumerate(g.nodes) for o in n.outputs}
    ext: set[str] = set()
    for i in keep:
        n = g.nodes[i]
        c.nodes.append(draw.DNode(f"{prefix}{i}", _op_label(n), mark=mark.get(i),
                                  tooltip=f"{n.path}: {n.op}({', '.join(n.inputs)})"))
    ks = set(keep)
    rim = NEIGHBORHOOD_EDGE.get(id(g), set())
    for i in keep:
        n = g.nodes[i]
        ins = list(dict.fromkeys(n.inputs))
        outside = [x for x in ins if prod.get(x) not in ks and x not in ext]
        if i in rim and outside:  # the rim of the drawing: its other inputs are named in its box, not drawn
            for dn in c.nodes:
                if dn.id == f"{prefix}{i}":
                    dn.label += "\n← " + ", ".join(outside)
            ins = [x for x in ins if prod.get(x) in ks]
            outside = []
        if len(outside) > 2:  # several tensors from outside the drawing: one node for them, not a wide row
            gid = f"{prefix}x:{i}"
            c.nodes.append(draw.DNode(gid, f"{len(outside)} tensors from outside:\n{', '.join(outside)}",
                                      kind="tensor", tooltip="; ".join(edge_label(x) for x in outside)))
            c.edges.append(draw.DEdge(gid, f"{prefix}{i}", "; ".join(edge_label(x) for x in outside[:2]) + " …"))
            ext.update(outside)
        for x in ins:
            j = prod.get(x)
            if j not in ks and x in ext and x in outside and len(outside) > 2:
                continue
            src = f"{prefix}{j}" if j in ks else f"{prefix}t:{x}"
            if j not in ks and x not in ext:
                ext.add(x)
                what = "input" if j is None else "from " + g.nodes[j].op
                c.nodes.append(draw.DNode(src, f"{x}\n({what})", kind="tensor"))
            c.edges.append(draw.DEdge(src, f"{prefix}{i}", edge_label(x)))
    return c


def build_drawing(res, focus: Focus) -> tuple[draw.Drawing, str] | None:
    plan = res.plan
    if focus.node is None:
        return None
    g = plan.programs[focus.program]
    keep = neighborhood(g, focus.node)
    mark = "red" if focus.kind in ("divergence", "output") else "amber"

    def pl_label(x: str) -> str:
        f = _fact_text(res, focus.program, x, 1)
        return f"{x}: {f}" if f else f"{x}: no fact"

    clusters = []
    cross = []
    if focus.logical_node is not None:
        lg = plan.logical
        lkeep = neighborhood(lg, focus.logical_node)

        def lg_label(x: str) -> str:
            pi = lg.producer_index().get(x)
            sh = _shape_text(pi[1], pi[1].outputs.index(x)) if pi else ""
            return f"{x} {sh}".strip()

        clusters.append(_cluster(lg, lkeep, "L", {focus.logical_node: "peer"}, lg_label, "logical (single device)"))
        cross.append(draw.DEdge(f"L{focus.logical_node}", f"P{focus.node}",
                                "should equal" if focus.kind != "blocking" else "stands for",
                                dashed=True, color=draw.RED if mark == "red" else draw.AMBER))
    axes = ", ".join(f"{a}={plan.mesh().get(a)}" for a in plan.program_axes(focus.program))
    clusters.append(_cluster(g, keep, "P", {focus.node: mark}, pl_label,
                             f"parallel: program {focus.program!r} (every rank; mesh {axes})"))
    d = draw.Drawing(clusters, cross)
    return d, mark


# ============================================================================================ values
def _rerun(res):
    cx = res.counterexample or {}
    from ..interp import RunError, run_plan

    try:
        if cx.get("mode") == "exact":
            return run_plan(res.plan, cx.get("dims"), seed=cx.get("seed", 0), exact=True, no_tables=True)
        return run_plan(res.plan, cx.get("dims"), seed=cx.get("seed", 0))
    except (RunError, Exception):  # noqa: BLE001 - the values are illustration; the verdict stands without them
        return None


def _compare(plan, run, program: str, rank, local: np.ndarray, logical: np.ndarray) -> tuple[Any, str]:
    """The part of ``logical`` that ``rank`` should hold for an elementwise comparison, and how it was cut."""
    ls, ps = tuple(logical.shape), tuple(local.shape)
    if ls == ps:
        return logical, "as Replicate (whole tensor)"
    mesh = run.mesh
    if len(ls) == len(ps):
        diff = [d for d in range(len(ls)) if ls[d] != ps[d]]
        if len(diff) == 1:
            d = diff[0]
            for a in plan.program_axes(program):
                k = mesh.sizes[a]
                if ls[d] == ps[d] * k:
                    c = rank[mesh.axes.index(a)]
                    sl = [slice(None)] * len(ls)
                    sl[d] = slice(c * ps[d], (c + 1) * ps[d])
                    return logical[tuple(sl)], f"its Shard({d}) block on axis {a!r}"
    return None, f"shapes differ (local {list(ps)}, logical {list(ls)}): no elementwise comparison"


def values_section(res, focus: Focus | None) -> str:
    cx = res.counterexample or {}
    if focus is None or focus.tensor is None:
        return ""
    run = _rerun(res)
    if run is None:
        return ("<h2>Values</h2><p class='note'>the reference interpreter could not re-run the counterexample "
                "to show values here; the samples recorded by the verifier:</p>" + _samples(cx))
    plan = res.plan
    g = plan.programs[focus.program]
    ranks = run.mesh.ranks(g.stage)
    lname = None
    if focus.logical_node is not None:
        ln = plan.logical.nodes[focus.logical_node]
        lname = focus.tensor if focus.tensor in ln.outputs else (ln.outputs[0] if ln.outputs else None)
    lval = run.logical.get(lname) if lname else None
    rows, folds = [], []
    for r in ranks:
        v = run.parallel.values.get(focus.program, {}).get(r, {}).get(focus.tensor)
        if v is None:
            continue
        v = np.asarray(v)
        want, how = (None, "no logical counterpart found")
        if lval is not None:
            want, how = _compare(plan, run, focus.program, r, v, np.asarray(lval))
        md = _fdiff(v, want) if want is not None else None
        mdt = "—" if md is None else f"<b class='red'>{_fmt_num(md)}</b>" if md > 0 else "0"
        rk = E(", ".join(f"{a}={c}" for a, c in zip(run.mesh.axes, r)))
        rows.append(f"<tr><td class='num'>{rk}</td><td class='num'>{E(str(list(v.shape)))} {E(_few(v))}</td>"
                    f"<td class='num'>{'' if want is None else E(str(list(np.shape(want)))) + ' ' + E(_few(want))}"
                    f"<br><span class='note'>{E(how)}</span></td><td class='num'>{mdt}</td></tr>")
        folds.append(f"<details><summary>rank {rk}: full values of parallel {E(focus.tensor)}"
                     f"{'' if want is None else ' and logical ' + E(lname)}</summary>"
                     f"<pre>parallel {E(focus.tensor)} on rank {rk} {E(str(list(v.shape)))}:\n{E(_full(v))}</pre>"
                     + ("" if want is None else f"<pre>logical {E(lname)} ({E(how)}):\n{E(_full(want))}</pre>")
                     + "</details>")
        if len(rows) >= 8:
            break
    head = (f"<h2 id='values-h'>Values at {E(focus.tensor)} (seed {run.seed}, {E(run.mode)}, "
            f"{E(', '.join(f'{k}={v}' for k, v in run.dims.items()))})</h2>")
    lab = f"logical {E(lname)}" if lname else "logical (no counterpart)"
    table = (f"<table id='values'><colgroup><col style='width:9%'><col style='width:38%'><col style='width:38%'>"
             f"<col style='width:15%'></colgroup><tr><th>rank</th><th>parallel {E(focus.tensor)} (shape, first "
             f"entries)</th><th>{lab} (what the rank should hold)</th><th>max |diff|</th></tr>{''.join(rows)}</table>")
    return head + table + "".join(folds)


def _samples(cx: dict) -> str:
    div = cx.get("first_divergence") or {}
    rows = "".join(f"<tr><td class='num'>{E(r)}</td><td class='num'>{E(_few(v))}</td></tr>"
                   for r, v in (div.get("sample") or {}).items())
    return f"<table><tr><th>rank</th><th>first entries</th></tr>{rows}</table>" if rows else ""


# ============================================================================================ sections
def _kv(items: Iterable[tuple[str, str]]) -> str:
    return "<dl class='kv'>" + "".join(f"<dt>{E(k)}</dt><dd>{v}</dd>" for k, v in items if v) + "</dl>"


def _plan_entry(res, program: str, node: int) -> str:
    g = res.plan.programs[program]
    n = g.nodes[node]
    entry = {"op": n.op}
    entry.update({"name": n.outputs[0]} if len(n.outputs) == 1 else {"outputs": n.outputs})
    entry["inputs"] = n.inputs
    if n.attrs:
        attrs = {k: v for k, v in n.attrs.items() if k != "body"}
        if "body" in n.attrs:
            attrs["body"] = f"<{len(n.attrs['body'].get('nodes', []))} ops>"
        entry["attrs"] = attrs
    if n.src:
        entry["src"] = n.src
    if _module(n):
        entry["module"] = _module(n)
    return json.dumps(entry, default=str)


def _where_items(res, program: str, node: int) -> list[tuple[str, str]]:
    n = res.plan.programs[program].nodes[node]
    return [("source line", f"<code id='src' class='where'>{E(n.src)}</code>" if n.src else
             "<span id='src' class='note'>not recorded in the plan (no <code>src</code> field)</span>"),
            ("module", f"<code id='module' class='where'>{E(_module(n))}</code>" if _module(n) else
             "<span id='module' class='note'>not recorded</span>"),
            ("plan entry", f"<code>{E(n.path)}</code> in program <code>{E(program)}</code>"
                           f"<pre id='plan-entry'>{E(_plan_entry(res, program, node))}</pre>")]


def divergence_section(res, focus: Focus | None, hints: list[str]) -> str:
    cx = res.counterexample or {}
    div = cx.get("first_divergence")
    out = []
    if div and focus is not None and focus.kind == "divergence":
        ins = "".join(f"<li><code>{E(k)}</code> = {E(v)}</li>" for k, v in div.get("inputs", {}).items())
        out.append("<section class='box focus' id='divergence'><h2>First diverging parallel op</h2><div class='split'>" + _kv([
            ("op", f"<code id='div-op' class='where red'>{E(div['op'])}</code> producing <code>{E(div['tensor'])}</code>"),
            *_where_items(res, focus.program, focus.node),
            ("its inputs", f"<ul>{ins}</ul>" if ins else "no tensor inputs"),
            ("its result", "equals no logical tensor under any placement on the counterexample run"),
        ]) + hints_section(hints, "h3", wrap=True) + "</div></section>")
    elif focus is not None and focus.kind == "output":
        out.append("<section class='box focus' id='divergence'><h2>Where it shows</h2><p>no parallel op diverges "
                   f"before the read-back: output tensor <code id='div-op' class='red'>{E(focus.tensor or '')}</code> "
                   f"of program <code>{E(focus.program)}</code> is read back wrongly.</p>"
                   + (_kv(_where_items(res, focus.program, focus.node)) if focus.node is not None else "")
                   + hints_section(hints, "h3", wrap=True) + "</section>")
    return "".join(out)


def reduction_hints(res, focus: Focus | None) -> list[str]:
    """Hints from the facts, for what the localizer's own hints do not cover: an input of the diverging op that
    is a reduction (all_reduce / reduce_scatter) over an axis on which its operand was already Replicate, so
    the value was summed over the ranks again (a doubled all_reduce)."""
    if focus is None or focus.node is None or focus.kind != "divergence":
        return []
    plan = res.plan
    g = plan.programs[focus.program]
    axes = plan.program_axes(focus.program)
    prod = g.producer_index()
    out = []
    for x in g.nodes[focus.node].inputs:
        if x not in prod:
            continue
        _, p = prod[x]
        if p.op not in ("all_reduce", "reduce_scatter") or not p.inputs:
            continue
        ax = p.attrs.get("axis")
        f = res.prop.facts.get(focus.program, {}).get(p.inputs[0])
        names = [ax] if isinstance(ax, str) else list(ax or [])
        if f is None or not names or any(a not in axes for a in names):
            continue
        if all(f.pl[axes.index(a)].kind == "R" for a in names):
            where = f" ({p.src}{', ' + _module(p) if _module(p) else ''})" if p.src else ""
            out.append(f"input {x} is {p.op} over {', '.join(names)} of {p.inputs[0]}, which is already Replicate on "
                       f"{', '.join(names)}: every rank adds the same value again (×{'·'.join(str(plan.mesh()[a]) for a in names)}). "
                       f"Is a reduction applied twice{where}?")
    return out


def hints_section(hints: list[str], tag: str = "h2", wrap: bool = False) -> str:
    if not hints:
        return ""
    out = (f"<{tag}>Hints</{tag}><ul class='hints' id='hints'>" + "".join(f"<li class='hint'>{E(h)}</li>" for h in hints)
           + "</ul>")
    return f"<div>{out}</div>" if wrap else out


def blocking_section(res, focus: Focus | None) -> str:
    fails = res.prop.open_failures()
    if not fails or focus is None or focus.kind != "blocking":
        return ""
    f = blocking_failure(fails)
    rule, cond, tried = _near_rule(f)
    others = [g for g in fails if g is not f]
    ins = "".join(f"<li><code>{E(x)}</code></li>" for x in f.inputs) or "<li>no tensor inputs with facts</li>"
    return ("<section class='box focus amber' id='blocking'><h2>Blocking op</h2>" + _kv([
        ("op", f"<code id='div-op' class='where'>{E(f.op)}</code> producing "
               f"<code>{E(', '.join(res.plan.programs[f.program].nodes[f.node].outputs))}</code>"),
        *_where_items(res, f.program, f.node),
        ("input facts", f"<ul id='input-facts'>{ins}</ul>"),
        ("rule that almost applied", f"<code id='near-rule'>{E(rule)}</code>"
                                     + (f"<div class='note'>rules for this op: {E(', '.join(tried))}</div>" if tried else "")),
        ("failed condition", f"<span id='failed-condition' class='where'>{E(cond)}</span>"),
        ("other ops without a rule", "<ul>" + "".join(
            f"<li><code>{E(g.op)}</code> at <code>{E(g.path)}</code>{' (' + E(g.src) + ')' if g.src else ''}: "
            f"{E(g.reason)}</li>" for g in others[:5]) + "</ul>" if others else ""),
    ]) + "</section>")


def _manifest_rules() -> dict:
    from ..certificate.format import manifest_path

    try:
        m = json.loads(manifest_path().read_text())
    except (OSError, ValueError):
        return {}
    return {**m.get("theorems", {}), **m.get("rules", {})}


def _near_rule(f) -> tuple[str, str, list[str]]:
    """(rule, failed condition, rules of the manifest for this op) from a failure's reason.  A multi-op rule
    names itself ('ring_attention_online_softmax: the keys ...'); a single-op rule family names the op."""
    rules = _manifest_rules()
    m = re.match(r"([A-Za-z_][A-Za-z0-9_]*): (.*)", f.reason, re.S)
    if m and m.group(1) in rules:
        return m.group(1), m.group(2), []
    base = f.op.split("_")[0]
    tried = sorted(r for r in rules if r.startswith(f.op) or (len(base) > 2 and r.startswith(base)))[:12]
    return f"the {f.op!r} rules", f.reason, tried


def proved_section(res, cert_digest: str | None, cert_path: str | None) -> str:
    from ..engine.verify import used_rules

    st = res.stats
    rules = _manifest_rules()
    used = sorted(used_rules(res))
    count: dict[str, int] = {}
    for s in res.prop.steps:
        for r in s.rules:
            count[r] = count.get(r, 0) + 1
    for r in res.prover.used:
        count.setdefault(r, 0)
    rows = "".join(f"<tr><td><code>{E(r)}</code></td><td>{count.get(r, 0) or '—'}</td><td><code>"
                   f"{E(rules.get(r, {}).get('theorem', 'NOT IN MANIFEST'))}</code></td></tr>" for r in used)
    missing = [r for r in used if r not in rules]
    coq = ("yes: every rule used is a theorem of the Coq kernel (proofs/manifest.json pins its statement; "
           "`tvcert proofs` rebuilds and rechecks Rules/)" if not missing else
           f"NO: {', '.join(missing)} have no theorem in proofs/manifest.json")
    from ..engine.report import output_claim

    outs = "".join(f"<li><code>{E(m.name)}</code> ← <code>{E(m.local)}</code> in program <code>{E(m.program)}</code>"
                   + (f": {E(output_claim(res.plan.outputs[m.name]))}" if m.name in res.plan.outputs else "") + "</li>"
                   for m in res.matches)
    digest = (f"<code id='digest'>{E(cert_digest)}</code>" if cert_digest else
              "<span id='digest' class='note'>no certificate could be built</span>")
    items = [
        ("outputs proved", f"{len(res.matches)}<ul>{outs}</ul>"),
        ("rule applications", str(st.get("rules_applied", len(res.prop.steps)))),
        ("stages", f"{st.get('stages', 0)} memoized stage instances, {st.get('distinct_stages', 0)} distinct; "
                   f"{st.get('programs', len(res.plan.programs))} program(s)"),
        ("SMT obligations", str(st.get("obligations", 0))),
        ("rules proved in Coq", E(coq) + " <span class='note'>(the plan itself is Coq-checked, as a theorem "
                                          "about it, only by <code>--emit-coq</code> / <code>tvcert check --coq</code>)"
                                          "</span>"),
        ("certificate digest", digest + (f" <span class='note'>(written to {E(cert_path)}; replay with "
                                          f"<code>tvcert check {E(cert_path)}</code>)</span>" if cert_path else
                                          " <span class='note'>(sha256 of the certificate `--emit-cert` writes)</span>")),
        ("plan digest", f"<code>{E(res.plan.digest())}</code>"),
    ]
    return ("<section class='box' id='proved'><h2>What was proved</h2>" + _kv(items) +
            f"<h2>Rules used</h2><table id='rules'><tr><th>rule</th><th>applications</th><th>Coq theorem</th></tr>"
            f"{rows}</table></section>")


def cert_digest(res) -> str | None:
    try:
        from ..certificate.emit import build_certificate, dump_certificate

        return "sha256:" + hashlib.sha256(dump_certificate(build_certificate(res)).encode()).hexdigest()
    except Exception:  # noqa: BLE001 - a report without a digest is still a report
        return None


def outputs_table(res) -> str:
    cx = res.counterexample or {}
    if cx.get("outputs"):
        row = [f"<tr><td><code>{E(o['name'])}</code></td><td>{'equal' if o['equal'] else '<b class=red>DIFFERS</b>'}"
               f"</td><td class='num'>{_fmt_num(o['max_diff'])}</td><td>{E(o.get('problem') or '')}</td></tr>"
               for o in cx["outputs"]]
        head = ("<table id='outputs'><colgroup><col style='width:34%'><col style='width:12%'><col style='width:14%'>"
                "<col></colgroup><tr><th>output</th><th>status</th><th>max |diff|</th><th>problem</th></tr>")
        bad = sum(1 for o in cx["outputs"] if not o["equal"])
        more = ""
        if len(row) > 8:  # a whole training step has an output per gradient: the rest behind a fold
            more = (f"<details><summary>the other {len(row) - 8} outputs</summary>{head}{''.join(row[8:])}</table>"
                    "</details>")
        return (f"<h2>Outputs on the counterexample ({bad} of {len(row)} differ)</h2>{head}{''.join(row[:8])}</table>"
                + more)
    return ""


def inputs_fold(res) -> str:
    cx = res.counterexample or {}
    ins = cx.get("inputs") or {}
    if not ins:
        return ""
    rows = "".join(f"<pre>{E(k)} {E(str(v['shape']))}: {E(', '.join(_fmt_num(x) for x in v['values']))}"
                   f"{' …' if v.get('truncated') else ''}</pre>" for k, v in ins.items())
    return f"<details id='cx-inputs'><summary>inputs of the counterexample ({len(ins)} tensors)</summary>{rows}</details>"


def reason_sentence(res, focus: Focus | None) -> str:
    plan = res.plan
    if res.verdict == VERIFIED:
        return (f"every one of the {len(res.matches)} logical outputs is proved to be read back as declared, by "
                f"{res.stats.get('rules_applied', len(res.prop.steps))} applications of Coq-proved rules.")
    if res.verdict == REFUTED:
        cx = res.counterexample or {}
        bad = [o["name"] for o in cx.get("outputs", []) if not o["equal"]]
        if len(bad) > 3:
            bad = bad[:3] + [f"{len(bad) - 3} more"]
        div = cx.get("first_divergence")
        where = ""
        if div:
            n = plan.programs[div["program"]].nodes[focus.node] if focus and focus.node is not None else None
            loc = f" ({div['src']}{', ' + _module(n) if n is not None and _module(n) else ''})" if div.get("src") else ""
            where = f"; the first parallel op that goes wrong is {div['op']!r} producing {div['tensor']!r}{loc}"
        return (f"on a concrete input confirmed by the reference interpreter, output{'s' if len(bad) != 1 else ''} "
                f"{', '.join(bad) or '?'} differ{'s' if len(bad) == 1 else ''} from the logical model{where}.")
    fails = res.prop.open_failures()
    if fails:
        f = blocking_failure(fails)
        return (f"no proof and no confirmed counterexample: no rule justifies {f.op!r} at {f.path}"
                f"{' (' + f.src + ')' if f.src else ''}; this is not a success.")
    first = res.reasons[0] if res.reasons else "no reason recorded"
    return f"no proof and no confirmed counterexample ({first}); this is not a success."


def _svg_width(svg: str) -> float:
    m = re.search(r'viewBox="[-\d.]+ [-\d.]+ ([\d.]+) [\d.]+"', svg)
    return float(m.group(1)) if m else 0.0


def render_report(res, hints: Iterable[str] = (), cert_path: str | None = None, title_note: str | None = None,
                  use_dot: bool = True) -> str:
    """The HTML report of ``res``; ``hints`` are extra lines the terminal printed (e.g. the trace's gradient
    hints); the divergence's own hints are taken from the result."""
    from .. import __name__ as _pkg  # noqa: F401
    from ..engine.report import render_text, result_json

    plan = res.plan
    focus = find_focus(res)
    cx = res.counterexample or {}
    div = cx.get("first_divergence") or {}
    all_hints = [ln.strip()[len("hint:"):].strip() for ln in (div.get("text") or "").splitlines()
                 if ln.strip().startswith("hint:")] + [h[len("hint:"):].strip() if h.startswith("hint:") else h
                                                       for h in hints]
    all_hints += reduction_hints(res, focus)
    stuck = "".join(f"<li><code>{E(s['op'])}</code> at <code>{E(s['node'])}</code>"
                    f"{' (' + E(s['src']) + ')' if s.get('src') else ''}: {E(s['reason'])}</li>"
                    for s in cx.get("engine_stuck_at", []))
    parts = [f"<header><h1 id='verdict' style='background:{COLOR[res.verdict]}'>{res.verdict}</h1>"
             f"<span class='plan'>plan <code>{E(plan.name)}</code>{' — ' + E(title_note) if title_note else ''}"
             f"</span></header>",
             f"<p id='reason'>{E(reason_sentence(res, focus))}</p>"]
    top = []
    if res.verdict == REFUTED:
        top.append(divergence_section(res, focus, all_hints))
    elif res.verdict == UNKNOWN:
        top.append(blocking_section(res, focus))
    d = build_drawing(res, focus) if focus is not None else None
    if d is not None:
        svg, engine = draw.render_svg(d[0], use_dot)
        legend = ("red: the diverging op; blue: its logical counterpart; edge labels: the tensor and the fact the "
                  "prover holds about it" if d[1] == "red" else
                  "amber: the op no rule justifies; blue: its logical counterpart; edge labels: the tensor and the "
                  "fact the prover holds about it")
        top.append(f"<section id='subgraph'><h2>The subgraph around it</h2><div class='graphwrap'>{svg}</div>"
                   f"<p class='note'>{E(legend)} (drawn with {E(engine)})</p></section>")
    top = [t for t in top if t]
    if len(top) == 2 and d is not None and _svg_width(svg) <= 820:  # side by side; a wide drawing gets the page width
        parts.append("<div class='top'>" + "".join(top) + "</div>")
    else:
        parts += top
    if res.verdict == REFUTED:
        parts.append(values_section(res, focus))
        if not (focus is not None and focus.kind in ("divergence", "output")):
            parts.append(hints_section(all_hints))
        if stuck:
            parts.append(f"<h2>Where the prover stopped</h2><ul id='stuck'>{stuck}</ul>")
        parts.append(outputs_table(res))
        if cx.get("confirmed"):
            parts.append(f"<p class='note' id='confirmed'>how it was confirmed: {E(cx['confirmed'])}</p>")
        parts.append(inputs_fold(res))
    elif res.verdict == UNKNOWN:
        parts.append(hints_section(all_hints))
        parts.append("<h2>All reasons</h2><ul id='reasons'>" + "".join(f"<li>{E(r)}</li>" for r in res.reasons)
                     + "</ul>")
    else:
        parts.append(proved_section(res, cert_digest(res), cert_path))
        parts.append(hints_section(all_hints))
    if plan.description:
        parts.append(f"<p class='note'>plan: {E(plan.description)}</p>")
    parts.append(f"<details><summary>the terminal's text</summary><pre id='text'>{E(render_text(res))}</pre></details>")
    parts.append(f"<details><summary>machine-readable result (JSON)</summary><pre>"
                 f"{E(json.dumps(result_json(res), indent=1, default=str))}</pre></details>")
    st = res.stats
    parts.append(f"<p class='note'>tvcert: {st.get('parallel_ops', '?')} parallel ops, {st.get('logical_ops', '?')} "
                 f"logical ops, {st.get('wall_seconds', '?')} s</p>")
    return ("<!doctype html><html lang='en'><head><meta charset='utf-8'>"
            "<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<title>tvcert {res.verdict}: {E(plan.name)}</title><style>{CSS}</style></head><body><main>"
            + "".join(p for p in parts if p) + "</main></body></html>\n")
