"""Ring-attention pairs for the differential fuzzer: random ring plans and random edits of their bodies.

A pair is causal or plain softmax attention over a random cp (2-4), with random sizes, scale and
an optional outer axis sharding batch (dp) or heads (tp).  Half of them get 1-3 random body
edits (operands swapped or rerouted, ppermute shift changed, an op or constant replaced, a
carried output redirected): the ring rule must never certify one that computes something else.

The oracle for these plans is float64 over several seeds (see :mod:`.oracle`): exact mode's
function tables do not satisfy exp(a+b) = exp(a)exp(b), which the online-softmax merge relies on.
"""
from __future__ import annotations

import random

from .gen import Pair

SWAP_OPS = {"add": ["sub", "mul", "maximum"], "sub": ["add", "mul"], "mul": ["add", "div"],
            "maximum": ["minimum", "add"], "exp": ["neg", "abs"], "div": ["mul", "sub"], "amax": ["sum", "amin"]}


def _n(name, op, *inputs, **attrs):
    d = {"name": name, "op": op, "inputs": list(inputs)}
    if attrs:
        d["attrs"] = attrs
    return d


def ring_plan(name: str, cp: int, dims: dict, causal: bool, scale: float, outer: tuple[str, int] | None,
              zigzag: bool = False) -> dict:
    """A correct ring-attention plan (q, k, v sharded on the sequence over cp); ``outer`` = (axis, dim 0 or 1)
    adds a size-2 axis sharding the batch or the heads; ``zigzag``: load-balanced chunks (rank r holds
    chunks r and 2cp-1-r), with the query / key positions built from the same two chunks."""
    shp, lshp, rows = ["b", "nh", "s", "hd"], ["b", "nh", "s/cp", "hd"], ["b", "nh", "s/cp", 1]
    mesh = [["cp", "cp"]]
    pl = {"cp": "ZigzagShard(2)" if zigzag else "Shard(2)"}
    if outer is not None:
        ax, d = outer
        mesh.append([ax, ax])  # its size is the dim named after it (2)
        pl[ax] = f"Shard({d})"
        shard_dim = "b" if d == 0 else "nh"
        lshp = [f"{x}/{ax}" if x == shard_dim else x for x in lshp]
        rows = [f"{x}/{ax}" if x == shard_dim else x for x in rows]
    logical = [_n("kt", "permute", "k", dims=[0, 1, 3, 2]), _n("s0", "matmul", "q", "kt"), _n("s1", "scale", "s0", value=scale)]
    body = [_n("kt", "permute", "k", dims=[0, 1, 3, 2]), _n("s0", "matmul", "q", "kt"), _n("s1", "scale", "s0", value=scale)]
    last = "s1"
    if causal:
        logical += [_n("iota", "iota", size="s"), _n("pos", "cast", "iota", dtype="float"),
                    _n("cols", "unsqueeze", "pos", dim=0), _n("rows", "unsqueeze", "pos", dim=1),
                    _n("mask", "gt", "cols", "rows"), _n("s2", "masked_fill", "s1", "mask", value=-1e9)]
        body += [_n("cols", "unsqueeze", "kpos", dim=0), _n("rows", "unsqueeze", "qpos", dim=1),
                 _n("mask", "gt", "cols", "rows"), _n("s2", "masked_fill", "s1", "mask", value=-1e9)]
        last = "s2"
    logical += [_n("p", "softmax", last, dim=-1), _n("o", "matmul", "p", "v")]
    body += [_n("bmax", "amax", last, dims=[-1], keepdim=True), _n("m2", "maximum", "m", "bmax"),
             _n("dm", "sub", "m", "m2"), _n("corr", "exp", "dm"), _n("ds", "sub", last, "m2"), _n("e", "exp", "ds"),
             _n("l_r", "mul", "l", "corr"), _n("l_b", "sum", "e", dims=[-1], keepdim=True), _n("l2", "add", "l_r", "l_b"),
             _n("acc_r", "mul", "acc", "corr"), _n("acc_b", "matmul", "e", "v"), _n("acc2", "add", "acc_r", "acc_b"),
             _n("k2", "ppermute", "k", axis="cp", shift=1), _n("v2", "ppermute", "v", axis="cp", shift=1)]
    carried, outs, invariants, inits = ["m", "l", "acc", "k", "v"], ["m2", "l2", "acc2", "k2", "v2"], ["q"], ["m0", "l0", "acc0", "k", "v"]
    nodes = [_n("m0", "const", value=-1e30, shape=rows), _n("l0", "const", value=0, shape=rows),
             _n("acc0", "const", value=0, shape=lshp)]
    if causal:
        body.append(_n("kpos2", "ppermute", "kpos", axis="cp", shift=1))
        carried.append("kpos")
        outs.append("kpos2")
        invariants.append("qpos")
        if zigzag:
            c = "(s/(2*cp))"
            blk = [_n("head", "slice", "iota", dim=0, start=f"rank.cp*{c}", end=f"(rank.cp+1)*{c}"),
                   _n("tail", "slice", "iota", dim=0, start=f"(2*cp-1-rank.cp)*{c}", end=f"(2*cp-rank.cp)*{c}"),
                   _n("blk", "concat", "head", "tail", dim=0)]
        else:
            blk = [_n("blk", "slice", "iota", dim=0, start="rank.cp*(s/cp)", end="(rank.cp+1)*(s/cp)")]
        nodes = [_n("iota", "iota", size="s"), *blk, _n("qpos", "cast", "blk", dtype="float")] + nodes
        inits.append("qpos")
    nodes.append({"outputs": [f"{c}_out" for c in carried], "op": "ring_loop", "inputs": inits + invariants,
                  "attrs": {"axis": "cp", "carry": len(carried),
                            "body": {"inputs": carried + invariants, "nodes": body, "outputs": outs}}})
    nodes.append(_n("o", "div", "acc_out", "l_out"))
    full = dict(dims, cp=cp)
    if outer is not None:
        full[outer[0]] = 2
    return {
        "tvcert_plan": 1, "name": name,
        "description": f"fuzz ring attention cp={cp} causal={causal} outer={outer} zigzag={zigzag}",
        "dims": full, "mesh": mesh,
        "logical": {"inputs": [{"name": x, "shape": shp} for x in "qkv"], "nodes": logical, "outputs": ["o"]},
        "parallel": [{"name": "ring", "inputs": [{"name": x, "shape": lshp} for x in "qkv"], "nodes": nodes,
                      "outputs": ["o"]}],
        "inputs": {x: {"local": x, "placement": dict(pl)} for x in "qkv"},
        "outputs": {"o": {"local": "o", "placement": dict(pl)}},
    }


def edit_body(body: dict, rng: random.Random) -> str:
    """One random edit of a loop body (it may leave the plan ill-formed; the loader then rejects it)."""
    nodes = body["nodes"]
    n = nodes[rng.randrange(len(nodes))]
    kind = rng.choice(["swap", "reroute", "shift", "op", "value", "output"])
    names = body["inputs"] + [m["name"] for m in nodes if "name" in m]
    if kind == "swap" and len(n["inputs"]) >= 2:
        n["inputs"][0], n["inputs"][1] = n["inputs"][1], n["inputs"][0]
    elif kind == "reroute" and n["inputs"]:
        j = rng.randrange(len(n["inputs"]))
        n["inputs"][j] = rng.choice(names[: names.index(n["name"])] if n.get("name") in names else names)
    elif kind == "shift":
        rng.choice([m for m in nodes if m["op"] == "ppermute"])["attrs"]["shift"] = rng.choice([-1, 0, 2, 3])
    elif kind == "op" and n["op"] in SWAP_OPS:
        n["op"] = rng.choice(SWAP_OPS[n["op"]])
    elif kind == "value" and "value" in n.get("attrs", {}):
        n["attrs"]["value"] = rng.choice([0, 1, 2.0, -1e9, 0.25])
    elif kind == "output":
        j = rng.randrange(len(body["outputs"]))
        body["outputs"][j] = rng.choice(names)
    else:
        return "none"
    return f"ring_{kind}"


def gen_ring(rng: random.Random, name: str, perturb_rate: float) -> Pair:
    cp = rng.choice([2, 2, 3, 4])
    dims = {"b": rng.choice([1, 2]), "nh": rng.choice([1, 2]), "hd": rng.choice([1, 2, 3])}
    zigzag = rng.random() < 0.3
    dims["s"] = cp * rng.choice([1, 2, 3]) * (2 if zigzag else 1)
    outer = rng.choice([None, None, ("dp", 0), ("tp", 1)])  # (axis, the dim it shards: batch or heads)
    if outer is not None:
        dims["b" if outer[1] == 0 else "nh"] = 2
    causal = rng.random() < 0.7
    plan = ring_plan(name, cp, dims, causal, rng.choice([1.0, 0.5, 0.7071067811865476]), outer, zigzag)
    pair = Pair(plan, "ring", ["ring_attention"] + (["causal"] if causal else []) + ([outer[0]] if outer else [])
                + (["zigzag"] if zigzag else []))
    if rng.random() < perturb_rate:
        loop = next(n for n in plan["parallel"][0]["nodes"] if n["op"] == "ring_loop")
        edits = [edit_body(loop["attrs"]["body"], rng) for _ in range(rng.randint(1, 3))]
        if zigzag and causal and rng.random() < 0.3:
            edits.append(edit_chunks(plan["parallel"][0]["nodes"], rng))
        pair.perturbed, pair.mutation = True, "+".join(edits)
    return pair


def edit_chunks(nodes: list[dict], rng: random.Random) -> str:
    """Move one zig-zag position chunk: the positions no longer match the rows the rank holds."""
    which = rng.choice(["head", "tail"])
    n = next(m for m in nodes if m.get("name") == which)
    k = rng.choice(["rank.cp", "(cp+rank.cp)", "(cp-1-rank.cp)", "(2*cp-1-rank.cp)", "(2*rank.cp)"])
    n["attrs"]["start"], n["attrs"]["end"] = f"{k}*(s/(2*cp))", f"({k}+1)*(s/(2*cp))"
    return "zigzag_chunk"
