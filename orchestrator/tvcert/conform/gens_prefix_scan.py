"""Conformance generator for ``block_prefix_sum`` (kernel/prefix_scan.py): cumsum over a sharded dim as each rank's
local cumsum plus the carried offset.

Draws a plan spelled as frontends/aten.py traces real code: x of rank 2 or 3 sharded along the scanned dim d over
axis ``a`` (sizes 1-4, blocks of 1-3 rows), sometimes a second axis ``b`` (outer or inner) replicating x or sharding
another dim; the local cumsum ``x @ triu(ones(B, B))`` along d, the totals ``sum(x, d, keepdim)`` (or unsqueezed
after a plain sum) all_gathered over ``a`` along d, a coefficient row ``arange(p) < rank.a`` cast to reals and
reshaped, multiplied (either side) or used as a where condition, or row ``rank.a`` of ``tril(ones(p, p), -1)`` times
the totals, summed over d, or the totals' own cumsum read at row ``rank.a`` minus their row ``rank.a``
(``block_prefix_sum_scanned``), added to the local cumsum; now and then the reversed scan ``flip(cumsum(flip(x)))``
with the row ``arange(p) > rank.a`` (``block_suffix_sum``); the totals sometimes read off the local scan (its last
row, a reversed scan's first: ``scan_last_row_total``).  Near misses (the bugs of
examples/torch/realcode/cumsum_sp.py and more): the row ``<=`` or ``>`` the rank, the rank plus one, the other
axis's coordinate, the global rank on a 2-D mesh, a lower triangle with its diagonal, the gather over the other
axis, the offset summed over another dim too, the local mask ``triu(., 1)`` or of twos, the totals of ``2 x``; in
the scanned form the row of the cumsum alone, or both rows read from the cumsum; in the reversed scan the row on the
wrong side or with its own rank, one flip left out; the totals read off the scan's other end.  The ``scatter`` kind
spells autograd's backward of the carried offset: ``reduce_scatter_a(sum(x, d, keepdim) * M)`` along d (either
factor order, sometimes through an expand) with rank s's row ``M_s = arange(p) < s`` added to a reversed scan
(``block_suffix_sum_scattered``) or ``arange(p) > s`` to a cumsum (``block_prefix_sum_scattered``); its near misses are
the row's other side or with the rank's own entry, the rank plus one, the other axis's coordinate, the global rank,
the scatter over the other axis, along another dim, or an average, the totals of ``2 x`` and the local mask's.  Now
and then the local scan sits inside a pair of flips on each side (autograd's backward of a reversed scan:
``scan_flip_pairs``), a near miss flipping once outside.  A
VERIFIED plan must agree with the exact interpreter on every rank."""
from __future__ import annotations

from .gens import Draw

RULE = "block_prefix_sum"
NEAR = ["le", "gt", "plus_one", "other_axis", "global_rank", "diag_tri", "gather_b", "sum_other", "triu1", "twos",
        "scaled_totals", "one_flip", "first_row", "odd_pair"]


def gen_prefix_scan(dr: Draw, seed: int):
    from .plans import _check_plan

    two = dr.coin(0.4)
    axes = ["a", "b"] if two else ["a"]
    if two and dr.coin():
        axes.reverse()
    p, q = dr.pick([1, 2, 3, 4]), dr.pick([2, 3])
    r = dr.pick([2, 2, 3])
    d = dr.int(0, r - 1)
    B = dr.int(1, 3)
    full = [dr.int(1, 3) for _ in range(r)]
    full[d] = p * B
    xb = None
    if two:
        others = [k for k in range(r) if k != d]
        xb = "Replicate" if dr.coin(0.4) else f"Shard({dr.pick(others)})"
        if xb != "Replicate":
            full[int(xb[6:-1])] *= q
    near = dr.pick(NEAR) if dr.coin(0.35) else ""
    if near in ("other_axis", "global_rank", "gather_b") and not two:
        near = ""
    kinds = ["mul", "mul_rev", "where", "gcumsum", "gcumsum"]
    kind = dr.pick(kinds + ["matmul"] if r == 2 and d == 0 else kinds) if dr.coin(0.7) else "scatter"
    rev = kind in ("mul", "mul_rev", "where") and dr.coin(0.3)  # the reversed scan flip(cumsum(flip(x)))
    if kind == "scatter":
        rev = dr.coin()
        if near in ("diag_tri", "sum_other", "first_row"):
            near = dr.pick(["", "scatter_dim", "scatter_avg"])
    if near == "one_flip" and not rev:
        near = ""
    if kind == "gcumsum" and near in ("plus_one", "diag_tri", "global_rank", "sum_other") or \
            kind == "matmul" and near in ("le", "gt", "sum_other"):
        near = ""  # no such near miss in this spelling
    if near == "diag_tri" and kind != "matmul":
        near = ""
    flat = kind != "scatter" and dr.coin(0.3)
    dims = {f"n{k}": v for k, v in enumerate(full)}
    dims.update({"a": p, "b": q})
    local = list(full)
    local[d] //= p
    if xb and xb != "Replicate":
        local[int(xb[6:-1])] //= q
    tsh = list(local)
    tsh[d] = 1
    gsh = list(tsh)
    gsh[d] = p

    par = []

    def op(name, o, inputs, **attrs):
        par.append({"name": name, "op": o, "inputs": inputs, "attrs": attrs})
        return name

    def scan(src, n, out, ones_value=1, diag=0, reverse=False, one_flip=False, pairs=False, odd=False):
        """The IR's cumsum along d over n rows (frontends/aten.py); ``reverse``: flipped along d on both sides
        (a near miss flips one side only); ``pairs``: inside a pair of flips on each side, as autograd's backward
        of a reversed scan spells it (``odd``, a near miss: one outer flip only)."""
        if pairs:
            pre = [{"name": f"{out}_p0", "op": "flip", "inputs": [src], "attrs": {"dims": [d]}},
                   {"name": f"{out}_p1", "op": "flip", "inputs": [f"{out}_p0"], "attrs": {"dims": [d]}}]
            inner = scan(f"{out}_p1", n, f"{out}_q", ones_value, diag, reverse, one_flip)
            post = [{"name": out if odd else f"{out}_q0", "op": "flip", "inputs": [f"{out}_q"], "attrs": {"dims": [d]}}]
            if not odd:
                post.append({"name": out, "op": "flip", "inputs": [f"{out}_q0"], "attrs": {"dims": [d]}})
            return pre + inner + post
        nodes = []
        t = src
        if reverse:
            nodes.append({"name": f"{out}_f", "op": "flip", "inputs": [src], "attrs": {"dims": [d]}})
            t = src = f"{out}_f"
            final, out = out, f"{out}_r"
        if d != r - 1:
            nodes.append({"name": f"{out}_t", "op": "transpose", "inputs": [src], "attrs": {"dim0": d, "dim1": r - 1}})
            t = f"{out}_t"
        nodes.append({"name": f"{out}_c", "op": "const", "inputs": [], "attrs": {"value": ones_value, "shape": [n, n]}})
        nodes.append({"name": f"{out}_U", "op": "triu", "inputs": [f"{out}_c"], "attrs": {"diagonal": diag}})
        mm = out if d == r - 1 else f"{out}_mm"
        nodes.append({"name": mm, "op": "matmul", "inputs": [t, f"{out}_U"], "attrs": {}})
        if d != r - 1:
            nodes.append({"name": out, "op": "transpose", "inputs": [mm], "attrs": {"dim0": d, "dim1": r - 1}})
        if reverse:
            nodes.append({"name": final, "op": "scale" if one_flip else "flip", "inputs": [out],
                          "attrs": {"value": 1} if one_flip else {"dims": [d]}})
        return nodes

    pairs = kind in ("mul", "mul_rev", "where", "scatter") and dr.coin(0.2)  # inside pairs of flips (autograd)
    if near == "odd_pair" and not pairs:
        near = ""
    par += scan("x", B, "lc", 2 if near == "twos" else 1, 1 if near == "triu1" else 0, rev, near == "one_flip",
                pairs, near == "odd_pair")
    last_row = kind != "scatter" and dr.coin(0.25)  # the totals read off the local scan (a reversed scan's first row)
    if last_row and near in ("scaled_totals",) or not last_row and near == "first_row" or near == "first_row" and B < 2:
        near = ""
    src = op("x2", "scale", ["x"], value=2) if near == "scaled_totals" else "x"
    tot = "tot"
    if last_row and B == 1 and dr.coin():
        tot = "lc"  # a block of one row gathered whole (torch's y[-1:] traces to no op)
    elif last_row:
        lo = 0 if rev != (near == "first_row") else B - 1
        op("tot", "slice", ["lc"], dim=d, start=lo, end=lo + 1, step=1)
    elif flat:
        op("tot0", "sum", [src], dims=[d], keepdim=False)
        op("tot", "unsqueeze", ["tot0"], dim=d)
    else:
        op("tot", "sum", [src], dims=[d], keepdim=True)
    rank = {"plus_one": "rank.a+1", "other_axis": "rank.b"}.get(near, "rank.a")
    if near == "global_rank":
        rank = "rank.b*a+rank.a" if axes[0] == "b" else "rank.a*b+rank.b"
    if kind != "scatter":
        op("G", "all_gather", [tot], axis="b" if near == "gather_b" else "a", dim=d)
    if kind == "scatter":  # rank s sends M_s * T_s, rank r receives sum_s M_s[r] * T_s
        op("j", "iota", [], size=p, start=0, step=1, dtype="int")
        op("rk", "const", [], value=rank, dtype="int")
        cmp = {"le": "le", "gt": "gt"}.get(near, "lt") if rev else {"le": "ge", "gt": "lt"}.get(near, "gt")
        op("m", cmp, ["j", "rk"])
        shape = [1] * r
        shape[d] = p
        op("mf", "cast", ["m"], dtype="float")
        op("M", "reshape", ["mf"], shape=shape)
        w = op("W", "mul", ["M", tot] if dr.coin() else [tot, "M"])
        if dr.coin(0.3):
            w = op("We", "expand", [w], shape=gsh)
        sd = (d + 1) % r if near == "scatter_dim" else d
        op("off", "reduce_scatter", [w], axis="b" if near == "gather_b" else "a", dim=sd,
           reduce="avg" if near == "scatter_avg" else "sum")
    elif kind == "gcumsum":  # cumsum(G, d)[rank] - G[rank]; near: no difference ("le"), both rows of the cumsum ("gt")
        par += scan("G", p, "GC")
        at = "rank.b" if near == "other_axis" else "rank.a"
        op("A0", "slice", ["GC"], dim=d, start=at, end=f"{at}+1", step=1)
        op("B0", "slice", ["GC" if near == "gt" else "G"], dim=d, start=at, end=f"{at}+1", step=1)
        sq = d == 0 and dr.coin()
        a_t = op("A", "squeeze", ["A0"], dims=[0]) if sq else "A0"
        b_t = op("B", "squeeze", ["B0"], dims=[0]) if sq else "B0"
        if near == "le":
            op("off", "scale", [a_t], value=1)
        else:
            op("off", "sub", [a_t, b_t])
    elif kind == "matmul":
        op("tri1", "const", [], value=1, shape=[p, p])
        op("tri", "tril", ["tri1"], diagonal=0 if near == "diag_tri" else -1)
        start = {"plus_one": "rank.a+1", "other_axis": "rank.b"}.get(near, rank)
        op("M", "slice", ["tri"], dim=0, start=start, end=f"{start}+1", step=1)
        op("off", "matmul", ["M", "G"])
    else:
        op("j", "iota", [], size=p, start=0, step=1, dtype="int")
        op("rk", "const", [], value=rank, dtype="int")
        cmp = {"le": "ge", "gt": "lt"}.get(near, "gt") if rev else {"le": "le", "gt": "gt"}.get(near, "lt")
        op("m", cmp, ["j", "rk"])
        shape = [1] * r
        shape[d] = p
        if kind == "where":
            op("M", "reshape", ["m"], shape=shape)
            op("z", "const", [], value=0)
            op("W", "where", ["M", "G", "z"])
        else:
            op("mf", "cast", ["m"], dtype="float")
            op("M", "reshape", ["mf"], shape=shape)
            op("W", "mul", ["G", "M"] if kind == "mul_rev" else ["M", "G"])
        op("off", "sum", ["W"], dims=[d, (d + 1) % r] if near == "sum_other" else [d], keepdim=True)
    op("y", "add", ["off", "lc"] if dr.coin() else ["lc", "off"])
    lg = scan("x", full[d], "y", reverse=rev, pairs=pairs)
    pl = {"a": f"Shard({d})", **({"b": xb} if two else {})}
    local_s = [f"n{k}" for k in range(r)]
    local_s[d] += "/a"
    if xb and xb != "Replicate":
        local_s[int(xb[6:-1])] += "/b"
    dd = {"tvcert_plan": 1, "name": "prefix_scan", "dims": dims, "mesh": {k: k for k in axes},
          "logical": {"inputs": [{"name": "x", "shape": [f"n{k}" for k in range(r)], "dtype": "float"}], "nodes": lg,
                      "outputs": ["y"]},
          "parallel": [{"name": "p", "inputs": [{"name": "x", "shape": local_s, "dtype": "float"}], "nodes": par,
                        "outputs": ["y"]}],
          "inputs": {"x": {"local": "x", "placement": pl}}, "outputs": {"y": {"local": "y", "placement": pl}}}
    desc = (f"x {full} {pl} {'reversed ' if rev else ''}{'flip-paired ' if pairs else ''}scan dim {d} {kind}{' last-row totals' if last_row else ''}"
            f"{' flat' if flat else ''}{' near ' + near if near else ''} "
            f"mesh {axes} a={p} b={q}")
    return _check_plan(dd, RULE), desc


PREFIX_SCAN_GENERATORS = {RULE: gen_prefix_scan, "block_prefix_sum_scanned": gen_prefix_scan,
                          "block_suffix_sum": gen_prefix_scan, "scan_last_row_total": gen_prefix_scan,
                          "block_suffix_sum_scattered": gen_prefix_scan, "block_prefix_sum_scattered": gen_prefix_scan,
                          "scan_flip_pairs": gen_prefix_scan}
