"""Conformance instances of ``zigzag_from_index_block`` (kernel/zigzag_index.py) and ``iota_rank_block``
(kernel/iota_block.py: :func:`b_iota_block`), H46.

Each instance is a small plan: a replicated X [n, h] (or, with a tp axis, ``Shard(1)`` over tp) read at an index
built as torch's ``_HeadTailLoadBalancer._generate_indices`` builds it (an iota viewed as 2p chunks, the head
chunks 0..p-1 and the tail chunks 2p-1-r picked by ``index_select``, stacked and flattened), by ``index_select``
along dim 0 or by ``gather`` with the index broadcast over dim 1; rank r keeps rows [r*2c, (r+1)*2c); the output
(scaled by 2) is claimed ``ZigzagShard(0)`` over cp.  Near misses: the tail chunks in contiguous order (chunk p+r),
an index off by one chunk (heads 1..p, tails 2p-2-r), rank r keeping block p-1-r, the claim ``Shard(0)``; the runner's oracle checks every
VERIFIED instance on every rank.  Mesh sizes p in 2..4, chunk rows c in 1..3, a tp axis outside or inside cp.
"""
from __future__ import annotations

from .gens import Draw


def _node(name, op, inputs, **attrs):
    return {"name": name, "op": op, "inputs": inputs, **({"attrs": attrs} if attrs else {}), "src": "gen:1"}


def b_cp_index(dr: Draw):
    p, c, h = dr.int(2, 4), dr.int(1, 3), dr.pick([2, 4])
    n = 2 * p * c
    tp = dr.pick([0, 0, 2])
    miss = dr.pick(["", "", "", "", "tail_contiguous", "off_by_chunk", "mirrored_block", "claim_shard"])
    gather = dr.coin()
    # the head-tail index as torch's balancer computes it
    tail_of = (lambda: [_node("tl_c", "const", [], value=2 * p - 1, dtype="int"),
                        _node("tl", "sub", ["tl_c", "hd"])]) if miss != "tail_contiguous" else \
        (lambda: [_node("tl", "add_scalar", ["hd"], value=p)])
    shift = 1 if miss == "off_by_chunk" else 0
    nodes = [_node("io", "iota", [], size=n, start=0, step=1, dtype="int"),
             _node("ch", "reshape", ["io"], shape=[2 * p, c]),
             _node("hd", "iota", [], size=p, start=shift, step=1, dtype="int"), *tail_of(),
             _node("ph", "index_select", ["ch", "hd"], dim=0),
             _node("pt", "index_select", ["ch", "tl"], dim=0),
             _node("phu", "unsqueeze", ["ph"], dim=1), _node("ptu", "unsqueeze", ["pt"], dim=1),
             _node("pr", "concat", ["phu", "ptu"], dim=1),
             _node("P", "reshape", ["pr"], shape=[n])]
    lh = "h/tp" if tp else "h"
    if gather:
        nodes += [_node("Pu", "unsqueeze", ["P"], dim=1), _node("G", "expand", ["Pu"], shape=["n", lh]),
                  _node("xs", "gather", ["x", "G"], dim=0)]
    else:
        nodes += [_node("xs", "index_select", ["x", "P"], dim=0)]
    r = f"({p - 1}-rank.cp)" if miss == "mirrored_block" else "rank.cp"
    nodes += [_node("blk", "slice", ["xs"], dim=0, start=f"{r}*{2 * c}", end=f"{r}*{2 * c}+{2 * c}"),
              _node("y", "scale", ["blk"], value=2.0)]
    mesh = [["cp", "cp"]] + ([["tp", "tp"]] if tp else [])
    if tp and dr.coin():
        mesh = mesh[::-1]
    dims = {"cp": p, "n": n, "h": h * (tp or 1), **({"tp": tp} if tp else {})}
    x_pl = {"tp": "Shard(1)"} if tp else {}
    y_pl = {"cp": "Shard(0)" if miss == "claim_shard" else "ZigzagShard(0)", **x_pl}
    d = {"tvcert_plan": 1, "name": "cp_index", "description": "head-tail balancer's index", "dims": dims,
         "mesh": mesh,
         "logical": {"inputs": [{"name": "x", "shape": ["n", "h"], "dtype": "float"}],
                     "nodes": [_node("y", "scale", ["x"], value=2.0)], "outputs": ["y"]},
         "parallel": [{"name": "spmd", "inputs": [{"name": "x", "shape": ["n", lh], "dtype": "float"}],
                       "nodes": nodes, "outputs": ["y"]}],
         "inputs": {"x": {"local": "x", "placement": x_pl}},
         "outputs": {"y": {"local": "y", "placement": y_pl}}}
    return d, (f"p={p} c={c} h={h} tp={tp} mesh={[m[0] for m in mesh]} {'gather' if gather else 'index_select'}"
               f"{' near miss ' + miss if miss else ''}")


def b_iota_block(dr: Draw):
    """``iota_rank_block``: rank r's positions ``iota(n, start=s0 + r*n*t, step=t)`` (times 2, cast to float or
    not) claimed Shard(0) over cp of the logical ``iota(p*n, s0, t)``; another axis (dp) replicated, outside or
    inside cp.  Near misses: the stride one off (``r*(n*t+1)``), the start read from the other axis' coordinate,
    the global rank (``rank.dp*cp + rank.cp``), the claim over dp instead of cp."""
    p, n, t, s0 = dr.int(2, 4), dr.int(1, 4), dr.pick([1, 1, 2, 3]), dr.pick([0, 0, 1, 5])
    dp = dr.pick([0, 2, 3])
    miss = dr.pick(["", "", "", "stride_off", "other_axis", "global_rank", "claim_other"])
    if dp == 0 and miss in ("other_axis", "global_rank", "claim_other"):
        miss = ""
    r = {"other_axis": "rank.dp", "global_rank": f"(rank.dp*{p}+rank.cp)"}.get(miss, "rank.cp")
    stride = n * t + (1 if miss == "stride_off" else 0)
    dt = dr.pick(["int", "float"])
    mesh = [["cp", "cp"]] + ([["dp", "dp"]] if dp else [])
    if dp and dr.coin():
        mesh = mesh[::-1]
    dims = {"cp": p, **({"dp": dp} if dp else {})}
    par = [_node("pos", "iota", [], size=n, start=f"{r}*{stride}+{s0}", step=t, dtype=dt),
           _node("y", "scale", ["pos"], value=2)]
    d = {"tvcert_plan": 1, "name": "iota_block", "description": "a rank's positions as an iota", "dims": dims,
         "mesh": mesh,
         "logical": {"inputs": [], "nodes": [_node("pos", "iota", [], size=p * n, start=s0, step=t, dtype=dt),
                                             _node("y", "scale", ["pos"], value=2)], "outputs": ["y"]},
         "parallel": [{"name": "spmd", "inputs": [], "nodes": par, "outputs": ["y"]}],
         "inputs": {},
         "outputs": {"y": {"local": "y", "placement": {"dp" if miss == "claim_other" else "cp": "Shard(0)"}}}}
    return d, f"p={p} n={n} t={t} s0={s0} dp={dp} {dt}{' near miss ' + miss if miss else ''}"
