"""Conformance plans for the vocab-parallel loss patterns in DTensor's spelling (``loss_parallel()``,
examples/torch/realcode/loss_parallel_dtensor.py, sum reduction): the safe target gets its trailing unit dim
before the block mask (forward), the labels get it before the ignore test (backward).

Traced once per tp degree (2, 4) and cached.  Half the draws carry a near miss of what the matcher checks for
this spelling (labels in [0, V), or padded with -100: the masked conclusions) -- the unit dim put in front (``[1, n]``), the unsqueezed labels swapped for another int tensor of
the same shape, the squeeze taken of another where, a block bound or offset moved -- or one of
:func:`.plans._edit_example`'s edits.  The check is :func:`.plans.plan_gen`'s: VERIFIED implies interpreter-equal.
"""
from __future__ import annotations

import copy
import importlib.util

from .gens import Draw
from .plans import EXAMPLES, _Skip, _edit_example

_TRACED: dict = {}


def _traced(tp: int, padded: bool = False) -> dict:
    """``padded``: labels with no declared range (-100 padding drawn; the patterns' masked conclusions)."""
    if (tp, padded) not in _TRACED:
        stem = "loss_parallel_padded" if padded else "loss_parallel_dtensor"
        try:
            spec = importlib.util.spec_from_file_location(stem, EXAMPLES / "torch" / "realcode" / f"{stem}.py")
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            _TRACED[tp, padded] = mod.tvcert_trace(tp=tp, reduction="sum")
        except ImportError as exc:  # torch not installed
            raise _Skip(f"torch unavailable: {exc}")
    return copy.deepcopy(_TRACED[tp, padded])


def _near_miss(dr: Draw, d: dict) -> str:
    nodes = d["parallel"][0]["nodes"]
    name = {n.get("name") or n["outputs"][0]: n for n in nodes}
    views = {k for k, n in name.items() if n["op"] == "reshape" and n["inputs"] == ["labels"]}
    kind = dr.pick(["permuted_unit", "target_from_ids", "target_from_ids", "squeeze_local_ids", "bound", "edit"])
    if kind == "permuted_unit":  # t'[:, None] replaced by a reshape that permutes the tokens: [a, N/a]^T -> [N, 1]
        cands = [n for n in nodes if n["op"] == "unsqueeze" and name.get(n["inputs"][0], {}).get("op") == "where"]
        if cands:
            n, N = dr.pick(cands), _tokens(d)
            nm = n.get("name")
            i = nodes.index(n)
            nodes[i:i + 1] = [
                {"op": "reshape", "name": nm + "_a", "inputs": n["inputs"], "attrs": {"shape": [2, N // 2]}},
                {"op": "transpose", "name": nm + "_b", "inputs": [nm + "_a"], "attrs": {"dim0": 0, "dim1": 1}},
                {"op": "reshape", "name": nm, "inputs": [nm + "_b"], "attrs": {"shape": [N, 1]}}]
            return f" +near {nm}: tokens permuted into the unit dim"
    if kind == "target_from_ids":  # the safe target built from another int tensor of the token shape (the ids)
        ws = [n for n in nodes if n["op"] == "where" and len(n["inputs"]) == 3 and
              (n["inputs"][1] in views or name.get(n["inputs"][1], {}).get("op") == "unsqueeze")]
        if ws:
            w = dr.pick(ws)
            ne = name.get(w["inputs"][0])
            src = w["inputs"][1]
            flat = {"op": "reshape", "name": "ids_flat", "inputs": ["ids"], "attrs": {"shape": [_tokens(d)]}}
            new = [flat]
            if src not in views:  # the unit-dim labels: unsqueeze the ids too
                new.append({"op": "unsqueeze", "name": "ids_unit", "inputs": ["ids_flat"], "attrs": {"dim": 1}})
            alt = new[-1]["name"]
            nodes[nodes.index(w):nodes.index(w)] = new
            w["inputs"][1] = alt
            if ne is not None and ne["op"] == "ne" and dr.coin(0.7):
                i = nodes.index(ne)
                nodes[i:i + 1] = [dict(ne, inputs=[alt, *ne["inputs"][1:]])]
                nodes.remove(flat)
                nodes.insert(0, flat)
                if len(new) > 1:
                    nodes.remove(new[1])
                    nodes.insert(1, new[1])
            return f" +near {w.get('name')} targets the ids"
    if kind == "squeeze_local_ids" and "index_put_" in name:  # the backward squeezes the forward's local ids
        sq = [n for n in nodes if n["op"] == "squeeze" and name.get(n["inputs"][0], {}).get("op") == "where"]
        if sq and nodes.index(name["index_put_"]) < nodes.index(sq[0]):
            sq[0]["inputs"] = ["index_put_"]
            return f" +near {sq[0]['name']} squeezes index_put_"
    if kind == "bound":
        cands = [n for n in nodes if isinstance(n.get("attrs", {}).get("value"), str) and "rank." in n["attrs"]["value"]]
        if cands:
            n = dr.pick(cands)
            n["attrs"]["value"] = dr.pick(["{e}+1", "({e})-1", "rank.tp*(8/tp+1)", "(tp-1-rank.tp)*(8/tp)"]).format(
                e=n["attrs"]["value"])
            return f" +near {n['name']}={n['attrs']['value']}"
    return _edit_example(dr, d)


def _tokens(d: dict) -> int:
    shp = next(i["shape"] for i in d["parallel"][0]["inputs"] if i["name"] == "labels")
    return shp[0] * shp[1]


def b_dtensor_loss(dr: Draw):
    tp = dr.pick([2, 4])
    padded = dr.coin()
    d = _traced(tp, padded)
    d["name"] = f"dtensor-loss-parallel-tp{tp}{'-padded' if padded else ''}"
    extra = _near_miss(dr, d) if dr.coin(0.6) else ""
    return d, f"DTensor loss_parallel (sum{', padded labels' if padded else ''}) tp={tp}{extra}"
