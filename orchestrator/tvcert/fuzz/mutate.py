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
