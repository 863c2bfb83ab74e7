"""Reports of a verification result: text for people, JSON for machines, HTML for a browser."""
from __future__ import annotations

import json
from typing import Any

from .verify import REFUTED, UNKNOWN, VERIFIED, Result


def result_json(res: Result) -> dict[str, Any]:
    return {
        "plan": res.plan.name,
        "verdict": res.verdict,
        "outputs": [{"name": m.name, "proved": m.ok, "problem": m.problem,
                     "placement": {a: str(p) for a, p in res.plan.outputs[m.name].placement.items()}
                     if m.name in res.plan.outputs else None} for m in res.matches],
        "reasons": res.reasons if res.verdict != VERIFIED else [],
        "counterexample": res.counterexample,
        "stats": res.stats,
    }


_MEANS = {"sum": "the sum", "avg": "the mean", "max": "the maximum"}


def output_claim(b) -> str:
    """What a VERIFIED output's binding claims, in words (a Partial(sum) gradient is not a plain value): e.g.
    ``Partial(sum) over tp: the sum over tp ranks equals the logical value``."""
    by: dict[str, list[str]] = {}
    for a, pl in b.placement.items():
        if pl.kind != "R":
            by.setdefault(str(pl), []).append(a)
    if not by:
        claim = "Replicate: every rank holds the logical value"
    else:
        heads, phrases = [], []
        for text, axes in by.items():
            pl, over = b.placement[axes[0]], " x ".join(axes)
            heads.append(f"{text} over {over}")
            phrases.append(f"{_MEANS[pl.reduce]} over {over} ranks" if pl.kind == "P" else
                           f"the reordering of the {over} ranks' zig-zag chunks of dim {pl.dim}" if pl.kind == "Z" else
                           f"the concatenation along dim {pl.dim} of the {over} ranks' blocks")
        claim = f"{', '.join(heads)}: {', and of that '.join(phrases)} equals the logical value"
    if b.layout:
        claim += f" (after layout {', '.join(op for op, _ in b.layout)})"
    return claim


def render_text(res: Result) -> str:
    lines = []
    st = res.stats
    if res.verdict == VERIFIED:
        lines.append(f"VERIFIED: plan {res.plan.name!r} computes its logical graph")
        lines.append(f"  {len(res.matches)} outputs proved; {st['rules_applied']} rule applications, "
                     f"{st['obligations']} SMT obligations, {st['wall_seconds']:.3f} s")
        sized = st.get("size_check") or {}
        if sized.get("dims"):
            lines.append(f"  re-proved at dims {sized['dims']} (engine/sizes.py)")
        elif sized:
            lines.append("  proved at the declared dims only: no second instantiation of the dims loads")
        width = max((len(m.name) for m in res.matches), default=0)
        for m in res.matches:
            b = res.plan.outputs.get(m.name)
            lines.append(f"  ok  {m.name:{width}s}  {output_claim(b) if b is not None else ''}".rstrip())
        return "\n".join(lines)
    if res.verdict == REFUTED:
        cx = res.counterexample or {}
        lines.append(f"REFUTED: plan {res.plan.name!r} does not compute its logical graph")
        dims = ", ".join(f"{k}={v}" for k, v in cx.get("dims", {}).items())
        lines.append(f"counterexample at {dims} ({cx.get('mode')}, seed {cx.get('seed')}), confirmed by the reference interpreter:")
        if cx.get("confirmed"):
            lines.append(f"  confirmed where rounding cannot explain it: {cx['confirmed']}")
        for o in cx.get("outputs", []):
            status = "equal" if o["equal"] else "DIFFERS"
            extra = f" ({o['problem']})" if o.get("problem") else ""
            lines.append(f"  output {o['name']:20s} {status:8s} max |diff| = {o['max_diff']:.3g}{extra}")
        div = cx.get("first_divergence")
        if div:
            lines.append(div["text"])
            for r, vals in div["sample"].items():
                lines.append(f"    rank {r}: {vals}")
        for s in cx.get("engine_stuck_at", []):
            src = f" ({s['src']})" if s.get("src") else ""
            lines.append(f"  prover stopped at {s['op']!r} {s['node']}{src}: {s['reason']}")
        lines.append("inputs of the counterexample:")
        for k, v in cx.get("inputs", {}).items():
            more = " ..." if v["truncated"] else ""
            lines.append(f"  {k} {v['shape']}: {v['values']}{more}")
        return "\n".join(lines)
    lines.append(f"UNKNOWN: plan {res.plan.name!r} is neither proved nor refuted (this is not a success)")
    for r in res.reasons:
        lines.append(f"  - {r}")
    return "\n".join(lines)


def render_html(res: Result, hints=(), cert_path: str | None = None, title_note: str | None = None) -> str:
    """The HTML report (one self-contained file): :func:`tvcert.report_html.render_report`.  ``hints``: extra
    lines the terminal printed (e.g. the trace's gradient hints); ``cert_path``: where ``--emit-cert`` wrote."""
    from ..report_html import render_report

    return render_report(res, hints=hints, cert_path=cert_path, title_note=title_note)
