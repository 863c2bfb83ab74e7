"""The subgraph around an op, drawn as SVG: Graphviz ``dot -Tsvg`` when it is installed, else a small layered
layout of our own (still SVG).  Pure data in, SVG text out; nothing here reads the engine."""
from __future__ import annotations

import html
import re
import shutil
import subprocess
import textwrap
from dataclasses import dataclass, field

RED, RED_FILL = "#cf222e", "#ffebe9"
AMBER, AMBER_FILL = "#9a6700", "#fff8c5"
GREY = "#57606a"


@dataclass
class DNode:
    id: str
    label: str  # lines separated by "\n"
    kind: str = "op"  # "op" | "tensor"
    mark: str | None = None  # None | "red" (diverging) | "amber" (blocking) | "peer" (logical counterpart)
    tooltip: str = ""


@dataclass
class DEdge:
    src: str
    dst: str
    label: str = ""
    dashed: bool = False
    color: str | None = None


@dataclass
class Cluster:
    title: str
    nodes: list[DNode] = field(default_factory=list)
    edges: list[DEdge] = field(default_factory=list)


@dataclass
class Drawing:
    clusters: list[Cluster]
    cross: list[DEdge] = field(default_factory=list)  # between clusters (logical counterpart <-> parallel op)


def wrap(text: str, width: int = 34, max_lines: int = 4) -> list[str]:
    out: list[str] = []
    for part in text.split("\n"):
        out += textwrap.wrap(part, width, break_long_words=True, break_on_hyphens=False) or [""]
    if len(out) > max_lines:
        out = out[:max_lines - 1] + [out[max_lines - 1][:width - 1] + "…"]
    return out


# ---------------------------------------------------------------------------------------------- Graphviz
def _dq(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _dlabel(lines: list[str]) -> str:
    return _dq("\n".join(lines)).replace("\n", "\\n")


def to_dot(d: Drawing) -> str:
    out = ["digraph tvcert {", '  graph [rankdir=TB, newrank=true, nodesep=0.35, ranksep=0.45, fontname="Helvetica", '
           'fontsize=12, bgcolor="white", pad=0.1];',
           '  node [shape=box, style="rounded,filled", fillcolor="#f6f8fa", color="#8c959f", fontname="Helvetica", '
           'fontsize=11, margin="0.12,0.06"];',
           '  edge [fontname="Helvetica", fontsize=9, color="#8c959f", fontcolor="#424a53", arrowsize=0.7];']
    for k, c in enumerate(d.clusters):
        out.append(f"  subgraph cluster_{k} {{")
        out.append(f'    label={_dq(c.title)}; style="rounded"; color="#d0d7de"; fontcolor="#24292f";')
        for n in c.nodes:
            attrs = {"label": _dlabel(wrap(n.label, 30, 5))}
            if n.kind == "tensor":
                attrs.update(shape="ellipse", style="filled", fillcolor="#ffffff", fontsize="10")
            if n.mark == "red":
                attrs.update(color=RED, fillcolor=RED_FILL, fontcolor=RED, penwidth="2.5")
            elif n.mark == "amber":
                attrs.update(color=AMBER, fillcolor=AMBER_FILL, penwidth="2.5")
            elif n.mark == "peer":
                attrs.update(color="#0969da", fillcolor="#ddf4ff", penwidth="2")
            if n.mark:
                attrs["class"] = f"tvcert_{n.mark}"  # Graphviz puts it on the node's <g>: the page's tests find it
            if n.tooltip:
                attrs["tooltip"] = n.tooltip
            a = ", ".join(f"{k2}={v if v.startswith(chr(34)) else _dq(v)}" for k2, v in attrs.items())
            out.append(f"    {_dq(n.id)} [{a}];")
        for e in c.edges:
            out.append("    " + _dedge(e))
        out.append("  }")
    for e in d.cross:
        out.append("  " + _dedge(e, constraint=False))
    out.append("}")
    return "\n".join(out)


def _dedge(e: DEdge, constraint: bool = True) -> str:
    attrs = []
    if e.label:
        attrs.append(f"label={_dlabel(wrap(e.label, 36, 4))}")
    if e.dashed:
        attrs.append('style="dashed"')
    if e.color:
        attrs.append(f"color={_dq(e.color)}, fontcolor={_dq(e.color)}")
    if not constraint:
        attrs.append("constraint=false")
    return f"{_dq(e.src)} -> {_dq(e.dst)} [{', '.join(attrs)}];"


def dot_svg(d: Drawing, timeout: float = 30.0) -> str | None:
    """SVG from Graphviz, or None when ``dot`` is missing or fails."""
    exe = shutil.which("dot")
    if exe is None:
        return None
    try:
        p = subprocess.run([exe, "-Tsvg"], input=to_dot(d).encode(), capture_output=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if p.returncode != 0:
        return None
    return _inline(p.stdout.decode("utf-8", "replace"))


def _inline(svg: str) -> str:
    """Graphviz's standalone SVG made inline and fluid: no prolog, no DOCTYPE, no comments, no fixed size
    (the viewBox keeps the aspect ratio; CSS caps the width at the page's)."""
    svg = re.sub(r"<\?xml.*?\?>", "", svg, flags=re.S)
    svg = re.sub(r"<!DOCTYPE.*?>", "", svg, flags=re.S)
    svg = re.sub(r"<!--.*?-->", "", svg, flags=re.S)
    m = re.search(r"<svg\b[^>]*>", svg)
    if not m:
        return svg
    tag = m.group(0)
    w = re.search(r'\bwidth="([\d.]+)pt"', tag)
    new = re.sub(r'\s(width|height)="[^"]*"', "", tag)
    style = f' style="max-width:min(100%, {float(w.group(1)) * 1.34:.0f}px)"' if w else ""
    new = new.replace("<svg", f'<svg class="graph" role="img" aria-label="subgraph around the op"{style}', 1)
    return svg.replace(tag, new, 1).strip()


# ---------------------------------------------------------------------------------------------- fallback
def own_svg(d: Drawing) -> str:
    """A small layered layout: each cluster a column, ops in rows by dependency depth."""
    BOX_W, LINE_H, PAD, GAP_Y, COL_GAP = 230, 14, 8, 46, 40
    cols = []
    x0 = 10
    for c in d.clusters:
        ids = [n.id for n in c.nodes]
        preds: dict[str, list[str]] = {i: [] for i in ids}
        for e in c.edges:
            if e.dst in preds and e.src in preds:
                preds[e.dst].append(e.src)
        level: dict[str, int] = {}

        def lvl(i: str, seen=()) -> int:
            if i in level:
                return level[i]
            level[i] = 0 if not preds[i] or i in seen else 1 + max(lvl(p, seen + (i,)) for p in preds[i])
            return level[i]

        for i in ids:
            lvl(i)
        rows: dict[int, list[DNode]] = {}
        for n in c.nodes:
            rows.setdefault(level[n.id], []).append(n)
        width = max(len(r) for r in rows.values()) * (BOX_W + 16) if rows else BOX_W
        pos: dict[str, tuple[float, float, float, float]] = {}
        y = 34
        for k in sorted(rows):
            r = rows[k]
            h = max(len(wrap(n.label, 32, 5)) for n in r) * LINE_H + 2 * PAD
            for j, n in enumerate(r):
                x = x0 + (width - len(r) * (BOX_W + 16)) / 2 + j * (BOX_W + 16) + 8
                pos[n.id] = (x, y, BOX_W, h)
            y += h + GAP_Y
        cols.append((c, pos, x0, width, y))
        x0 += width + COL_GAP
    total_w = x0
    total_h = max((c[4] for c in cols), default=60) + 10
    allpos = {k: v for _, pos, *_ in cols for k, v in pos.items()}
    out = [f'<svg class="graph" role="img" aria-label="subgraph around the op" xmlns="http://www.w3.org/2000/svg" '
           f'viewBox="0 0 {total_w:.0f} {total_h:.0f}" style="max-width:min(100%, {total_w:.0f}px)" '
           f'font-family="Helvetica, Arial, sans-serif">',
           '<defs><marker id="arr" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" '
           'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#8c959f"/></marker></defs>']
    for c, pos, cx, cw, ch in cols:
        out.append(f'<rect x="{cx}" y="4" width="{cw}" height="{ch - 10}" rx="8" fill="none" stroke="#d0d7de"/>')
        out.append(f'<text x="{cx + cw / 2}" y="22" text-anchor="middle" font-size="12" fill="#24292f">'
                   f'{html.escape(c.title)}</text>')
    for e in [e for c, *_ in cols for e in c.edges] + d.cross:
        if e.src not in allpos or e.dst not in allpos:
            continue
        sx, sy, sw, sh = allpos[e.src]
        tx, ty, tw, th = allpos[e.dst]
        x1, y1, x2, y2 = sx + sw / 2, sy + sh, tx + tw / 2, ty
        if e in d.cross:
            x1, y1, x2, y2 = sx + sw, sy + sh / 2, tx, ty + th / 2
        color = e.color or "#8c959f"
        dash = ' stroke-dasharray="5,4"' if e.dashed else ""
        out.append(f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" stroke="{color}"{dash} '
                   f'marker-end="url(#arr)"/>')
        if e.label:
            lines = wrap(e.label, 40, 2)
            mx, my = (x1 + x2) / 2 + 4, (y1 + y2) / 2 - 4 * len(lines)
            for k, ln in enumerate(lines):
                out.append(f'<text x="{mx:.1f}" y="{my + 11 * k:.1f}" font-size="9" fill="#424a53">'
                           f'{html.escape(ln)}</text>')
    for c, pos, *_ in cols:
        for n in c.nodes:
            x, y, w, h = pos[n.id]
            stroke, fill, sw = "#8c959f", "#f6f8fa", 1
            if n.mark == "red":
                stroke, fill, sw = RED, RED_FILL, 2.5
            elif n.mark == "amber":
                stroke, fill, sw = AMBER, AMBER_FILL, 2.5
            elif n.mark == "peer":
                stroke, fill, sw = "#0969da", "#ddf4ff", 2
            rx = h / 2 if n.kind == "tensor" else 6
            cls = f"node tvcert_{n.mark}" if n.mark else "node"
            out.append(f'<g class="{cls}"><title>{html.escape(n.tooltip or n.label)}</title><rect x="{x:.1f}" y="{y:.1f}" '
                       f'width="{w}" height="{h}" rx="{rx}" fill="{fill}" stroke="{stroke}" stroke-width="{sw}"/>')
            for k, ln in enumerate(wrap(n.label, 32, 5)):
                out.append(f'<text x="{x + w / 2:.1f}" y="{y + PAD + 11 + LINE_H * k:.1f}" text-anchor="middle" '
                           f'font-size="11" fill="{RED if n.mark == "red" else "#24292f"}">{html.escape(ln)}</text>')
            out.append("</g>")
    out.append("</svg>")
    return "\n".join(out)


def render_svg(d: Drawing, use_dot: bool = True) -> tuple[str, str]:
    """(svg, engine): Graphviz's when available, else our own layout."""
    if use_dot:
        s = dot_svg(d)
        if s is not None:
            return s, "graphviz dot"
    return own_svg(d), "built-in layout (Graphviz dot not found)"
