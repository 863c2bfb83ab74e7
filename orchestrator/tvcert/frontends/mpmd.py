"""Per-rank programs that differ, as one program in which every rank runs its own (MPMD by rank guards).

When the traced ranks run different programs (torch's causal ring attention: ``_is_causal_behavior`` skips,
masks or takes half a block depending on (rank, step)), no rank's program stands for the others.  The ranks are
grouped into classes (a class: ranks whose programs are one SPMD program over the remaining axes, e.g. the tp
ranks of one cp coordinate); the merged program is

* the common prefix (identical on every rank, up to affine rank attributes) once;
* after it, each class's program, renamed, with every collective shared: the k-th collective of every class is
  the same op over the same axis (else no merge: the runtime pairs collectives by their order on a group), and
  its input on rank r is *rank r's class's* tensor, picked by a rank-indexed ``slice`` of the classes' tensors
  stacked on a new leading dim (``select``); every class continues from the shared result; the ops that end
  every class's stretch between two collectives alike (the classes converge again: the loss after the ring)
  are shared the same way, once, and so is an op a class applies to the same tensors as an earlier class;
* each output picked the same way.

On each rank the picked values are exactly what that rank's own program computes (the other classes' copies run on
the rank's data, and are then discarded), so the interpreter runs every rank's program as it is; the engine sees
plain ops (stack, rank-indexed slice), whose rules are the ordinary ones.  The merge is exact, not a rule: the
merged program is what the ranks run.  One caveat for refutation: a discarded copy can leave an op's domain on a
rank it does not belong to (a division by zero there); the refuter's 60-digit run would then see an undefined
value in a program that is defined on every rank.  Ring attention divides only by sums of exponentials and takes
logs of them, so it cannot; other users of the merge must keep that in mind.
"""
from __future__ import annotations

import contextlib
from itertools import combinations
from typing import Any, Mapping, Sequence

from ..ops import REGISTRY
from .trace import TraceError, spmd_compress

_COMM = ("collective", "p2p")


def _names(n: Mapping[str, Any]) -> list[str]:
    return list(n["outputs"]) if "outputs" in n else [n["name"]]


def _common_prefix(per_rank: Mapping[tuple, list[dict]], axes, sizes) -> int:
    """Index of the first op at which the ranks' programs have no SPMD form."""
    progs = list(per_rank.values())
    for i in range(min(map(len, progs))):
        try:
            spmd_compress({c: [p[i]] for c, p in per_rank.items()}, axes, sizes)
        except TraceError:
            return i
    return min(map(len, progs))


def _classes(per_rank, outs, start: int, axes, sizes):
    """The smallest set of class axes A such that the ranks agreeing on A run one SPMD program (from ``start``) over
    the other axes: (A, their sizes, [(A coordinates, compressed nodes, outputs)] in row-major order)."""
    for k in range(1, len(axes) + 1):
        for sub in combinations(range(len(axes)), k):
            rest = [i for i in range(len(axes)) if i not in sub]
            groups: dict[tuple, dict] = {}
            for c in per_rank:
                groups.setdefault(tuple(c[i] for i in sub), {})[tuple(c[i] for i in rest)] = c
            got = []
            try:
                for key in sorted(groups):
                    members = groups[key]
                    if len({tuple(outs[c]) for c in members.values()}) != 1:
                        raise TraceError("outputs differ", "spmd")
                    nodes, _ = spmd_compress({rc: per_rank[c][start:] for rc, c in members.items()},
                                             tuple(axes[i] for i in rest), tuple(sizes[i] for i in rest))
                    got.append((key, nodes, outs[next(iter(members.values()))]))
            except TraceError:
                continue
            return [axes[i] for i in sub], [sizes[i] for i in sub], got
    raise AssertionError("one class per rank always compresses")


def _sig(n: Mapping[str, Any]) -> tuple:
    return n["op"], repr(n.get("attrs")), len(n["inputs"]), len(_names(n))


def _common_tail(segs: Sequence[Sequence[Mapping[str, Any]]]) -> int:
    """How many ops end every class's segment with the same ops and attributes (the classes' programs converge
    again, e.g. the loss after a ring whose blocks differed): they are emitted once, not once per class."""
    k = 0
    while all(k < len(s) for s in segs) and len({_sig(s[len(s) - 1 - k]) for s in segs}) == 1:
        k += 1
    return k


def _index_expr(class_axes: Sequence[str], class_sizes: Sequence[int]) -> str:
    """Row-major index of the rank's class, as a dim expression over its coordinates."""
    terms, stride = [], 1
    for a, s in reversed(list(zip(class_axes, class_sizes))):
        terms.append(f"rank.{a}" if stride == 1 else f"rank.{a}*{stride}")
        stride *= s
    return "+".join(reversed(terms))


def merge_ranks(per_rank: Mapping[tuple, list[dict]], outs: Mapping[tuple, list[str]], axes: Sequence[str],
                sizes: Sequence[int], why: TraceError) -> tuple[list[dict], list[str], list[str]]:
    """(nodes, outputs, notes) of the merged program; TraceError (kind "spmd") when the classes' collectives
    differ, naming the first difference and ``why`` the ranks had no SPMD form."""
    start = _common_prefix(per_rank, axes, sizes)
    prefix, notes = spmd_compress({c: p[:start] for c, p in per_rank.items()}, axes, sizes)
    class_axes, class_sizes, classes = _classes(per_rank, outs, start, axes, sizes)
    used = {x for p in per_rank.values() for n in p for x in _names(n)}
    taken = {x for n in prefix for x in _names(n)} | {x for p in per_rank.values() for n in p for x in n["inputs"]
                                                     if x not in used}  # the prefix's tensors and the inputs

    def fresh(base: str) -> str:
        name, i = base, 1
        while name in used:
            name, i = f"{base}_{i}", i + 1
        used.add(name)
        return name

    comms = []
    for key, nodes, _ in classes:
        comms.append([i for i, n in enumerate(nodes) if REGISTRY[n["op"]].category in _COMM])
    sig = [[(classes[g][1][i]["op"], classes[g][1][i].get("attrs")) for i in comms[g]] for g in range(len(classes))]
    for g in range(1, len(classes)):
        if sig[g] != sig[0]:
            j = next((j for j, (a, b) in enumerate(zip(sig[g], sig[0])) if a != b), min(len(sig[g]), len(sig[0])))
            raise TraceError(f"{why}; the ranks' programs cannot be merged either: their collectives differ "
                             f"(collective {j}: {sig[0][j:j + 1]} on class {classes[0][0]} vs {sig[g][j:j + 1]} on "
                             f"class {classes[g][0]} of {class_axes})", "spmd", why.op, why.src)
    for g in range(len(classes)):
        if any(REGISTRY[classes[g][1][i]["op"]].category == "p2p" for i in comms[g]) or \
                any(REGISTRY[n["op"]].category == "loop" for n in classes[g][1]):
            raise TraceError(f"{why}; the ranks' programs cannot be merged: a send / recv or a loop (whose body's "
                             f"collectives every copy would run) after they differ", "spmd", why.op, why.src)
    index = _index_expr(class_axes, class_sizes)
    out_nodes = list(prefix)
    renames = [dict() for _ in classes]

    def select(tensors: list[str], src, name: str | None = None) -> str:
        """``tensors[class of this rank]``: stacked on a new dim 0, sliced at the rank's class index."""
        if len(set(tensors)) == 1:
            return tensors[0]
        ups = []
        for t in tensors:
            ups.append(fresh(f"{t}_mpmd_u"))
            out_nodes.append({"op": "unsqueeze", "name": ups[-1], "inputs": [t], "attrs": {"dim": 0}, "src": src})
        st, sl = fresh("mpmd_stack"), fresh("mpmd_pick")
        out_nodes.append({"op": "concat", "name": st, "inputs": ups, "attrs": {"dim": 0}, "src": src})
        out_nodes.append({"op": "slice", "name": sl, "inputs": [st],
                          "attrs": {"dim": 0, "start": index, "end": f"{index}+1"}, "src": src})
        res = name if name is not None else fresh("mpmd_sel")
        out_nodes.append({"op": "squeeze", "name": res, "inputs": [sl], "attrs": {"dims": [0]}, "src": src})
        return res

    cse: dict[tuple, list[str]] = {}

    def emit(g: int, n: dict) -> None:
        m = dict(n, inputs=[renames[g].get(x, x) for x in n["inputs"]])
        key = (n["op"], repr(n.get("attrs")), tuple(m["inputs"]))
        if key in cse:  # another class computed this op of the same tensors already: the same value on every rank
            renames[g].update(zip(_names(n), cse[key]))
            return
        new = {x: fresh(f"{x}_mpmd{g}") for x in _names(n)}
        if REGISTRY[n["op"]].category not in _COMM:
            cse[key] = [new[x] for x in _names(n)]
        renames[g].update(new)
        if "outputs" in n:
            m["outputs"] = [new[x] for x in n["outputs"]]
        else:
            m["name"] = new[n["name"]]
        out_nodes.append(m)

    def share(heads: list[dict]) -> None:
        """One node for the classes' ``heads`` (the same op and attributes), fed on each rank by its class's inputs."""
        ins = [select([renames[g].get(h["inputs"][j], h["inputs"][j]) for g, h in enumerate(heads)],
                      heads[0].get("src")) for j in range(len(heads[0]["inputs"]))]
        shared = dict(heads[0], inputs=ins)
        names = [fresh(f"{x}_mpmd") for x in _names(heads[0])]
        if "outputs" in shared:
            shared["outputs"] = names
        else:
            shared["name"] = names[0]
        out_nodes.append(shared)
        for g, h in enumerate(heads):
            renames[g].update(zip(_names(h), names))

    bounds = [0] * len(classes)
    for k in range(len(comms[0]) + 1):
        stops = [comms[g][k] if k < len(comms[0]) else len(classes[g][1]) for g in range(len(classes))]
        tail = _common_tail([classes[g][1][bounds[g]:stops[g]] for g in range(len(classes))])
        for g, (_, nodes, _) in enumerate(classes):
            for n in nodes[bounds[g]:stops[g] - tail]:
                emit(g, n)
        for j in range(tail, 0, -1):  # the classes run the same ops again: shared, each rank's inputs its class's
            share([classes[g][1][stops[g] - j] for g in range(len(classes))])
        bounds = [st + 1 for st in stops]
        if k == len(comms[0]):
            break
        share([classes[g][1][comms[g][k]] for g in range(len(classes))])
    final = []
    for j, o in enumerate(classes[0][2]):
        per_class = [renames[g].get(c[2][j], c[2][j]) for g, c in enumerate(classes)]
        if len(set(per_class)) == 1:
            final.append(per_class[0])
            continue
        want = o if all(c[2][j] == o for c in classes) else f"out{j}"
        if want not in taken:  # the classes' own tensor of that name is renamed: the pick may take the name
            used.discard(want)
        final.append(select(per_class, None, fresh(want)))
    first = next(iter(per_rank.values()))
    at = first[start].get("src") if start < len(first) else None
    notes = notes + [f"the ranks differ from op {start}{' at ' + at if at else ''} ({why}); from there every rank "
                     f"runs its own class's program ({len(classes)} classes over {list(class_axes)}), its tensors "
                     f"picked by a rank-indexed slice at each collective and output"]
    return out_nodes, final, notes


@contextlib.contextmanager
def per_rank_programs():
    """Trace with ranks allowed to differ: merged by :func:`merge_ranks`, and collectives kept though a rank ignores
    their result (it still sends its data to the others)."""
    from . import aten, trace

    saved = trace.spmd_fallback, aten.LIVE_OPS
    trace.spmd_fallback = merge_ranks
    aten.LIVE_OPS = aten.LIVE_OPS | {op for op, s in REGISTRY.items() if s.category == "collective"}
    try:
        yield
    finally:
        trace.spmd_fallback, aten.LIVE_OPS = saved
