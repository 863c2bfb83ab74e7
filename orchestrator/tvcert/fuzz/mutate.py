"""Mutation operators: perturb the parallel side of a generated pair (usually making it unequal).

Each operator takes a plan dict (never modified) and a ``random.Random`` and returns a new
plan dict, or ``None`` when it does not apply.  A mutation may leave the pair equal (swapping
the operands of an add) or make the plan invalid (a shape no longer agrees): the oracle and
the loader decide, and the runner counts both.
"""
from __future__ import annotations

import copy
import random
import re
from typing import Callable, Optional

NONLIN = ["tanh", "exp", "sigmoid", "silu", "relu", "square", "abs", "gelu", "sin"]
DIM_KEYS = ("dim", "dims", "dim0", "dim1", "split_dim", "concat_dim")


def _prog(plan: dict) -> dict:
    return plan["parallel"][0]


def _rename_uses(plan: dict, after: int, old: str, new: str) -> None:
    """Replace uses of ``old`` by ``new`` in parallel nodes after index ``after`` and in outputs."""
    prog = _prog(plan)
    for n in prog["nodes"][after + 1:]:
        n["inputs"] = [new if x == old else x for x in n.get("inputs", [])]
    prog["outputs"] = list(dict.fromkeys(new if x == old else x for x in prog["outputs"]))
    for b in plan["outputs"].values():
        if b["local"] == old:
            b["local"] = new


def _float_nodes(plan: dict) -> list[int]:
    out = []
    for i, n in enumerate(_prog(plan)["nodes"]):
        if n["op"] in ("const", "send", "recv") or "name" not in n:
            continue
        out.append(i)
    return out


def m_wrong_dim(plan, rng):
    nodes = _prog(plan)["nodes"]
    cands = [(i, k) for i, n in enumerate(nodes) for k in DIM_KEYS if k in n.get("attrs", {})]
    if not cands:
        return None
    i, k = rng.choice(cands)
    a = nodes[i]["attrs"]
    v = a[k]
    if isinstance(v, list):
        if not v:
            return None
        if nodes[i]["op"] == "permute" and len(v) >= 2:
            j, l = rng.sample(range(len(v)), 2)
            v = list(v)
            v[j], v[l] = v[l], v[j]
            a[k] = v
        else:
            a[k] = [x + rng.choice([-1, 1]) for x in v]
    else:
        a[k] = v + rng.choice([-1, 1])
    return plan


def m_missing_collective(plan, rng):
    nodes = _prog(plan)["nodes"]
    cands = [i for i, n in enumerate(nodes) if n["op"] in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")]
    if not cands:
        return None
    i = rng.choice(cands)
    n = nodes.pop(i)
    _rename_uses(plan, i - 1, n["name"], n["inputs"][0])
    return plan


def m_extra_collective(plan, rng):
    prog = _prog(plan)
    cands = _float_nodes(plan)
    if not cands:
        return None
    i = rng.choice(cands)
    n = prog["nodes"][i]
    axes = list(plan["mesh"])
    new = n["name"] + "_x"
    red = rng.choice(["sum", "sum", "avg", "max"])
    prog["nodes"].insert(i + 1, {"name": new, "op": "all_reduce", "inputs": [n["name"]],
                                 "attrs": {"axis": rng.choice(axes), "reduce": red}})
    _rename_uses(plan, i + 1, n["name"], new)
    return plan


def m_wrong_scaling(plan, rng):
    prog = _prog(plan)
    nodes = prog["nodes"]
    kind = rng.choice(["scale_value", "reduce_kind", "insert_scale"])
    if kind == "scale_value":
        c = [i for i, n in enumerate(nodes) if n["op"] in ("scale", "add_scalar")]
        if c:
            a = nodes[rng.choice(c)]["attrs"]
            a["value"] = rng.choice([a["value"] * 2, -a["value"], a["value"] + 1])
            return plan
    if kind == "reduce_kind":
        c = [i for i, n in enumerate(nodes) if n["op"] == "all_reduce"]
        if c:
            a = nodes[rng.choice(c)]["attrs"]
            a["reduce"] = {"sum": "avg", "avg": "sum", "max": "sum"}[a.get("reduce", "sum")]
            return plan
        c = [i for i, n in enumerate(nodes) if n["op"] == "mean"]
        if c:
            nodes[rng.choice(c)]["op"] = "sum"
            return plan
    cands = _float_nodes(plan)
    if not cands:
        return None
    i = rng.choice(cands)
    n = nodes[i]
    new = n["name"] + "_s"
    nodes.insert(i + 1, {"name": new, "op": "scale", "inputs": [n["name"]], "attrs": {"value": rng.choice([2, 0.5, -1])}})
    _rename_uses(plan, i + 1, n["name"], new)
    return plan


def m_swap_operands(plan, rng):
    nodes = _prog(plan)["nodes"]
    c = [i for i, n in enumerate(nodes) if len(n.get("inputs", [])) == 2 and n["inputs"][0] != n["inputs"][1]
         and n["op"] not in ("embedding", "index_select", "masked_fill")]
    if not c:
        return None
    n = nodes[rng.choice(c)]
    n["inputs"] = n["inputs"][::-1]
    return plan


_SLICE_RE = re.compile(r"^rank\.(\w+)\*\(\((.+)\)/(\w+)\)$")


def m_off_by_one_slice(plan, rng):
    nodes = _prog(plan)["nodes"]
    c = [i for i, n in enumerate(nodes) if n["op"] == "slice" and isinstance(n.get("attrs", {}).get("start"), str)
         and _SLICE_RE.match(n["attrs"]["start"])]
    if not c:
        return None
    a = nodes[rng.choice(c)]["attrs"]
    ax, E, _ = _SLICE_RE.match(a["start"]).groups()
    L = f"(({E})/{ax})"
    kind = rng.choice(["overlap", "reversed", "shift"])
    if kind == "overlap":  # rank r takes [r*(L-1), r*(L-1)+L): off by one per rank
        a["start"], a["end"] = f"rank.{ax}*({L}-1)", f"rank.{ax}*({L}-1)+{L}"
    elif kind == "reversed":  # the wrong block
        a["start"], a["end"] = f"({ax}-1-rank.{ax})*{L}", f"({ax}-rank.{ax})*{L}"
    else:  # shifted by one element, last rank clamps (shape errors are caught by the loader)
        a["start"], a["end"] = f"rank.{ax}*{L}+1", f"(rank.{ax}+1)*{L}+1"
    return plan


def m_rank_constant(plan, rng):
    prog = _prog(plan)
    cands = _float_nodes(plan)
    if not cands:
        return None
    i = rng.choice(cands)
    n = prog["nodes"][i]
    ax = rng.choice(list(plan["mesh"]))
    new = n["name"] + "_r"
    val = rng.choice([f"rank.{ax}", f"2*rank.{ax}-1", f"rank.{ax}*{ax}"])
    prog["nodes"].insert(i + 1, {"name": new, "op": "add_scalar", "inputs": [n["name"]], "attrs": {"value": val}})
    _rename_uses(plan, i + 1, n["name"], new)
    return plan


def m_nonlinear_swap(plan, rng):
    nodes = _prog(plan)["nodes"]
    c = [i for i, n in enumerate(nodes) if n["op"] in NONLIN]
    if not c:
        return None
    n = nodes[rng.choice(c)]
    n["op"] = rng.choice([o for o in NONLIN if o != n["op"]])
    return plan


def m_output_placement(plan, rng):
    name = rng.choice(list(plan["outputs"]))
    b = plan["outputs"][name]
    ax = rng.choice(list(plan["mesh"]))
    cur = b["placement"].get(ax, "Replicate")
    m = re.match(r"Shard\((\d+)\)", cur)
    opts = ["Replicate", "Partial(sum)", "Partial(avg)", "Shard(0)", "Shard(1)"]
    if m:
        opts.append(f"Shard({int(m.group(1)) + 1})")
    opts = [o for o in opts if o != cur]
    b["placement"][ax] = rng.choice(opts)
    return plan


def m_input_placement(plan, rng):
    """Bind an input with another placement than the program assumes (shapes may still agree)."""
    name = rng.choice(list(plan["inputs"]))
    b = plan["inputs"][name]
    ax = rng.choice(list(plan["mesh"]))
    cur = b["placement"].get(ax, "Replicate")
    opts = [o for o in ["Replicate", "Partial(sum)", "Partial(avg)", "Shard(0)", "Shard(1)", "Shard(2)"] if o != cur]
    b["placement"][ax] = rng.choice(opts)
    return plan


def m_wrong_axis(plan, rng):
    """A collective over the other mesh axis (2-axis meshes)."""
    axes = list(plan["mesh"])
    if len(axes) < 2:
        return None
    nodes = _prog(plan)["nodes"]
    c = [n for n in nodes if n["op"] in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")]
    if not c:
        return None
    n = rng.choice(c)
    ax = n["attrs"]["axis"]
    if isinstance(ax, list):
        n["attrs"]["axis"] = ax[:1] if len(ax) > 1 else [a for a in axes if a not in ax][:1]
    else:
        n["attrs"]["axis"] = next(a for a in axes if a != ax)
    return plan


def m_mesh_order(plan, rng):
    """Reverse the mesh axis order: nested placements on one dim change meaning."""
    if len(plan["mesh"]) < 2:
        return None
    plan["mesh"] = dict(reversed(list(plan["mesh"].items())))
    return plan


def m_drop_op(plan, rng):
    """Drop a pointwise op on the parallel side (a forgotten activation or scaling)."""
    nodes = _prog(plan)["nodes"]
    c = [i for i, n in enumerate(nodes) if len(n.get("inputs", [])) == 1 and n["op"] in NONLIN + ["neg", "scale", "add_scalar", "softmax", "log_softmax", "triu", "tril"]]
    if not c:
        return None
    i = rng.choice(c)
    n = nodes.pop(i)
    _rename_uses(plan, i - 1, n["name"], n["inputs"][0])
    return plan


def m_reshape_transpose(plan, rng):
    """Insert a transpose + reshape-back pair that scrambles a square-ish tensor (order swap)."""
    nodes = _prog(plan)["nodes"]
    c = [i for i, n in enumerate(nodes) if n["op"] in ("reshape", "view")]
    if not c:
        return None
    i = rng.choice(c)
    n = nodes[i]
    shp = n["attrs"]["shape"]
    if len(shp) < 2:
        return None
    # reshape to the reversed dim order, then transpose the first two back: same shape, other order
    j = rng.randrange(len(shp) - 1)
    swapped = list(shp)
    swapped[j], swapped[j + 1] = swapped[j + 1], swapped[j]
    n["attrs"]["shape"] = swapped
    new = n["name"] + "_t"
    nodes.insert(i + 1, {"name": new, "op": "transpose", "inputs": [n["name"]], "attrs": {"dim0": j, "dim1": j + 1}})
    _rename_uses(plan, i + 1, n["name"], new)
    return plan


_RANK_RE = re.compile(r"rank\.([A-Za-z_]\w*)")


def _mesh_axes(plan: dict) -> list[str]:
    """The mesh axis names, whether the mesh is written as an object or as [[axis, size], ...]."""
    return list(plan["mesh"]) if isinstance(plan["mesh"], dict) else [a for a, _ in plan["mesh"]]


def _rank_strings(v, path=()):
    """(path, string) of every string mentioning a rank coordinate inside an attribute value, at any depth."""
    if isinstance(v, str):
        if _RANK_RE.search(v):
            yield path, v
    elif isinstance(v, list):
        for j, x in enumerate(v):
            yield from _rank_strings(x, path + (j,))
    elif isinstance(v, dict):
        for k, x in v.items():
            yield from _rank_strings(x, path + (k,))


def _set_path(root, path, value):
    for k in path[:-1]:
        root = root[k]
    root[path[-1]] = value


def m_rank_other_axis(plan, rng):
    """A rank offset that also depends on another mesh axis: the global rank ``rank.dp*tp + rank.tp`` where the
    tp rank is meant, or ``rank.tp + rank.dp`` (right on coordinate 0 of the other axis only)."""
    axes = _mesh_axes(plan)
    if len(axes) < 2:
        return None
    cands = [(n["attrs"], k, path, text) for g in plan["parallel"] for n in g["nodes"]
             for k, v in n.get("attrs", {}).items() for path, text in _rank_strings(v)]
    if not cands:
        return None
    attrs, k, path, text = rng.choice(cands)
    ax = rng.choice(_RANK_RE.findall(text))
    others = [a for a in axes if a != ax]
    if not others:
        return None
    other = rng.choice(others)
    new = rng.choice([f"(rank.{other}*{ax}+rank.{ax})", f"(rank.{ax}+rank.{other})", f"(rank.{ax}*(1+rank.{other}))"])
    replaced = re.sub(rf"rank\.{ax}\b", new, text)
    if path:
        _set_path(attrs[k], path, replaced)
    else:
        attrs[k] = replaced
    return plan


def m_nested_rank_literal(plan, rng):
    """Add a constant whose value hides a rank coordinate one or more list levels deep (``[["rank.tp"]]``)."""
    prog = _prog(plan)
    cands = _float_nodes(plan)
    if not cands:
        return None
    i = rng.choice(cands)
    n = prog["nodes"][i]
    axes = _mesh_axes(plan)
    val: object = rng.choice([f"rank.{rng.choice(axes)}", f"0*rank.{rng.choice(axes)}+1"])
    for _ in range(rng.choice([1, 2, 3])):
        val = [val]
    c, new = n["name"] + "_lit", n["name"] + "_plus"
    prog["nodes"][i + 1:i + 1] = [{"name": c, "op": "const", "inputs": [], "attrs": {"value": val}},
                                  {"name": new, "op": "add", "inputs": [n["name"], c]}]
    _rename_uses(plan, i + 2, n["name"], new)
    return plan


_DISGUISES = ("(rank).{a}", "rank . {a}", "\uff52\uff41\uff4e\uff4b.{a}")  # \uff52.. is a full-width "rank" (NFKC)


def m_rank_respelled(plan, rng):
    """Every rank coordinate of one attribute spelled another way the evaluator reads alike (``(rank).tp``,
    ``rank . tp``, full-width letters): the plan means the same, so a checker that reads rank dependence off the
    text differently from the evaluator shows up as a verdict change (the oracle still decides which is right)."""
    cands = [(n["attrs"], k, path, text) for g in plan["parallel"] for n in g["nodes"]
             for k, v in n.get("attrs", {}).items() for path, text in _rank_strings(v)]
    if not cands:
        return None
    attrs, k, path, text = rng.choice(cands)
    form = rng.choice(_DISGUISES)
    replaced = _RANK_RE.sub(lambda m: form.format(a=m.group(1)), text)
    if path:
        _set_path(attrs[k], path, replaced)
    else:
        attrs[k] = replaced
    return plan


def m_rank_constant_disguised(plan, rng):
    """``m_rank_constant`` (a rank-dependent scalar added to a float tensor: wrong on every rank but 0) with the
    coordinate spelled so that a text scan for ``rank.<axis>`` misses it."""
    prog = _prog(plan)
    cands = _float_nodes(plan)
    if not cands:
        return None
    i = rng.choice(cands)
    n = prog["nodes"][i]
    ax = rng.choice(_mesh_axes(plan))
    val = rng.choice(_DISGUISES).format(a=ax)
    if rng.random() < 0.5:
        val = [[val]]
        c, new = n["name"] + "_lit", n["name"] + "_plus"
        prog["nodes"][i + 1:i + 1] = [{"name": c, "op": "const", "inputs": [], "attrs": {"value": val}},
                                      {"name": new, "op": "add", "inputs": [n["name"], c]}]
        _rename_uses(plan, i + 2, n["name"], new)
        return plan
    new = n["name"] + "_r"
    prog["nodes"].insert(i + 1, {"name": new, "op": "add_scalar", "inputs": [n["name"]], "attrs": {"value": val}})
    _rename_uses(plan, i + 1, n["name"], new)
    return plan


def _dim_strings(v, path=()):
    """(path, string) of every string inside an attribute value that is a dim expression (no rank coordinate)."""
    if isinstance(v, str):
        if re.search(r"[A-Za-z_]", v) and not _RANK_RE.search(v) and "rank" not in v:
            yield path, v
    elif isinstance(v, list):
        for j, x in enumerate(v):
            yield from _dim_strings(x, path + (j,))


def m_literal_for_dim(plan, rng):
    """A dim expression in an attribute (a count, a block size, a reshape target) replaced by its value at the
    declared dims: the plan is the same there and wrong wherever the dim differs (the oracle's second
    instantiation), so only a proof redone at other sizes may tell (kernel/sizes.py)."""
    from ..shapes import parse

    cands = [(n["attrs"], k, path, text) for g in plan["parallel"] for n in g["nodes"]
             for k, v in n.get("attrs", {}).items() if k not in ("axis", "reduce", "dtype", "equation", "tag", "body")
             for path, text in _dim_strings(v)]
    if not cands:
        return None
    attrs, k, path, text = rng.choice(cands)
    try:
        value = parse(text).eval(plan["dims"])
    except (ValueError, TypeError, KeyError, ZeroDivisionError):
        return None
    if path:
        _set_path(attrs[k], path, value)
    else:
        attrs[k] = value
    return plan


def m_negative_shard_dim(plan, rng):
    """An input's ``Shard(d)`` written ``Shard(d - rank)`` (DTensor's ``Shard(-1)``): the same placement."""
    shapes = {t["name"]: t["shape"] for t in plan["logical"]["inputs"]}
    cands = [(b, a) for name, b in plan.get("inputs", {}).items() if name in shapes and not b.get("layout")
             for a, t in b.get("placement", {}).items() if re.fullmatch(r"(Shard|ZigzagShard)\(\d+\)", t)]
    if not cands:
        return None
    b, a = rng.choice(cands)
    kind, d = re.fullmatch(r"(Shard|ZigzagShard)\((\d+)\)", b["placement"][a]).groups()
    nd = len(shapes[next(n for n, x in plan["inputs"].items() if x is b)])
    b["placement"][a] = f"{kind}({int(d) - nd})"
    return plan


def m_unit_dim_elsewhere(plan, rng):
    """A mask or index given its unit dim in front instead of at the end (``unsqueeze(m, 0)``, an index reshaped
    to ``[1, n]``): the broadcast then pairs the wrong elements."""
    nodes = [n for g in plan["parallel"] for n in g["nodes"]]
    cands = [n for n in nodes if n["op"] == "unsqueeze" and n.get("attrs", {}).get("dim") != 0]
    cands += [n for n in nodes if n["op"] in ("reshape", "view") and isinstance(n.get("attrs", {}).get("shape"), list)
              and len(n["attrs"]["shape"]) >= 2 and n["attrs"]["shape"][-1] == 1]
    if not cands:
        return None
    n = rng.choice(cands)
    if n["op"] == "unsqueeze":
        n["attrs"]["dim"] = 0
    else:
        n["attrs"]["shape"] = [1] + n["attrs"]["shape"][:-1]
    return plan


def m_collective_across_nonlinear(plan, rng):
    """Move a collective past the op that consumes it: ``f(all_reduce(x))`` becomes ``all_reduce(f(x))``, right only
    where f commutes with the reduction (linear f and a sum), wrong for softmax, exp, ..."""
    nodes = _prog(plan)["nodes"]
    uses: dict[str, list[int]] = {}
    for j, n in enumerate(nodes):
        for x in n.get("inputs", []):
            uses.setdefault(x, []).append(j)
    cands = [(i, uses[n["name"]][0]) for i, n in enumerate(nodes)
             if n["op"] in ("all_reduce", "all_gather", "reduce_scatter") and len(uses.get(n["name"], [])) == 1
             and len(nodes[uses[n["name"]][0]].get("inputs", [])) == 1 and "name" in nodes[uses[n["name"]][0]]]
    if not cands:
        return None
    i, j = rng.choice(cands)
    c, f = nodes[i], nodes[j]
    x = c["inputs"][0]
    f_new = dict(f, inputs=[x], name=f["name"] + "_early")
    c_new = dict(c, inputs=[f_new["name"]], name=f["name"])
    nodes[j] = c_new
    nodes[i] = f_new
    # every use between i and j of c's result would now see f's input: keep the plan well-formed or give up
    if any(c["name"] in n.get("inputs", []) for n in nodes):
        return None
    return plan


# ------------------------------------------------------------------ send / recv (the p2p family, fuzz/gen.py)
def _sends(plan) -> list[dict]:
    return [n for g in plan["parallel"] for n in g["nodes"] if n["op"] == "send"]


def _recvs(plan) -> list[dict]:
    return [n for g in plan["parallel"] for n in g["nodes"] if n["op"] == "recv"]


def m_send_shared_tag(plan, rng):
    """Two sends between the same stages share a tag (one of them, or both and the matching recvs): which send a
    recv receives is then ambiguous, and the loader must refuse the plan (exit 3)."""
    sends = _sends(plan)
    same = [(a, b) for a in sends for b in sends if a is not b and a["attrs"]["to"] == b["attrs"]["to"]
            and a["attrs"]["tag"] != b["attrs"]["tag"]]
    if not same:
        return None
    a, b = rng.choice(same)
    old = a["attrs"]["tag"]
    a["attrs"]["tag"] = b["attrs"]["tag"]
    if rng.random() < 0.5:
        for r in _recvs(plan):
            if r["attrs"]["tag"] == old:
                r["attrs"]["tag"] = b["attrs"]["tag"]
    return plan


def m_recv_swapped_tags(plan, rng):
    """Two recvs of one stage exchange their tags: every message is still received once (the plan loads), but each
    recv now gets the other tensor."""
    recvs = _recvs(plan)
    pairs = [(a, b) for a in recvs for b in recvs if a is not b and a["attrs"]["src"] == b["attrs"]["src"]
             and a["attrs"].get("shape") == b["attrs"].get("shape")]
    if not pairs:
        return None
    a, b = rng.choice(pairs)
    a["attrs"]["tag"], b["attrs"]["tag"] = b["attrs"]["tag"], a["attrs"]["tag"]
    return plan


def m_send_extra_copy(plan, rng):
    """A second send of a message (same tag, same stages) after the first: the interpreter, engine and checker used
    to disagree on which one a recv takes; now the loader refuses it."""
    for g in plan["parallel"]:
        idx = [i for i, n in enumerate(g["nodes"]) if n["op"] == "send"]
        if idx:
            i = rng.choice(idx)
            n = g["nodes"][i]
            others = [x["name"] for x in g["inputs"] if x["name"] != n["inputs"][0]]
            dup = copy.deepcopy(n)
            if others:
                dup["inputs"] = [rng.choice(others)]
            g["nodes"].insert(rng.randint(i + 1, len(g["nodes"])), dup)
            return plan
    return None


P2P_MUTATIONS: dict[str, Callable] = {
    "send_shared_tag": m_send_shared_tag,
    "recv_swapped_tags": m_recv_swapped_tags,
    "send_extra_copy": m_send_extra_copy,
}


# ------------------------------------------------------------------ stages (the stage_alias family, fuzz/gen.py)
# Its plans name the parallel nodes of stage k ``s<k>_c`` (the first internal op, whose result in the template is
# hash-equal to a boundary input), ``s<k>_z`` (the op reading both), the copy's boundary ``b2``, and the logical
# claim about the copy's internal result ``o``.
def _pnode(plan, name):
    return next((n for g in plan["parallel"] for n in g["nodes"] if n.get("name") == name), None)


def m_stage_claims_boundary(plan, rng):
    """Declare the copy's internal result to be what its boundary input holds (what a hash-substituting replay
    concluded): o = g(w) where the copy computes f(w) and its boundary is g(w)."""
    b2 = _pnode(plan, "b2")
    lo = next((n for n in plan["logical"]["nodes"] if n.get("name") == "o"), None)
    if b2 is None or lo is None or (lo["op"], lo.get("attrs")) == (b2["op"], b2.get("attrs")):
        return None
    lo["op"] = b2["op"]
    lo["attrs"] = copy.deepcopy(b2.get("attrs", {}))
    if not lo["attrs"]:
        del lo["attrs"]
    return plan


def m_stage_alias_in_copy(plan, rng):
    """The copy's first internal op becomes its boundary's op, so the alias is in the copy and not the template:
    the copy computes g(w) where o = f(w) is declared."""
    b2, c2 = _pnode(plan, "b2"), _pnode(plan, "s2_c")
    if b2 is None or c2 is None or (c2["op"], c2.get("attrs")) == (b2["op"], b2.get("attrs")):
        return None
    c2["op"] = b2["op"]
    c2["attrs"] = copy.deepcopy(b2.get("attrs", {}))
    if not c2["attrs"]:
        del c2["attrs"]
    return plan


STAGE_MUTATIONS: dict[str, Callable] = {
    "stage_claims_boundary": m_stage_claims_boundary,
    "stage_alias_in_copy": m_stage_alias_in_copy,
}


MUTATIONS: dict[str, Callable] = {
    "wrong_dim": m_wrong_dim,
    "missing_collective": m_missing_collective,
    "extra_collective": m_extra_collective,
    "wrong_scaling": m_wrong_scaling,
    "swap_operands": m_swap_operands,
    "off_by_one_slice": m_off_by_one_slice,
    "rank_constant": m_rank_constant,
    "nonlinear_swap": m_nonlinear_swap,
    "output_placement": m_output_placement,
    "input_placement": m_input_placement,
    "wrong_axis": m_wrong_axis,
    "mesh_order": m_mesh_order,
    "drop_op": m_drop_op,
    "reshape_transpose_order": m_reshape_transpose,
    "rank_other_axis": m_rank_other_axis,
    "nested_rank_literal": m_nested_rank_literal,
    "rank_respelled": m_rank_respelled,
    "rank_constant_disguised": m_rank_constant_disguised,
    "literal_for_dim": m_literal_for_dim,
    "negative_shard_dim": m_negative_shard_dim,
    "unit_dim_elsewhere": m_unit_dim_elsewhere,
    "collective_across_nonlinear": m_collective_across_nonlinear,
}


def mutate(plan: dict, rng: random.Random, tries: int = 6) -> Optional[tuple[dict, str]]:
    names = list(MUTATIONS)
    for _ in range(tries):
        k = rng.choice(names)
        out = MUTATIONS[k](copy.deepcopy(plan), rng)
        if out is not None:
            out["description"] = f"mutation: {k}"
            return out, k
    return None
