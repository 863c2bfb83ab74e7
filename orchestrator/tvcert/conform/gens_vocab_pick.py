"""Conformance generator for ``vocab_parallel_target_logit`` and its backward (kernel/vocab_pick.py): Megatron's
target-logit pick on vocab-sharded logits, as frontends/aten.py converts megatron-core's cross_entropy.py.

Draws the logits X [N, V] (V = p*B, blocks of 1-3 ids over axis ``a`` of 1-4 ranks, sometimes a second axis ``b``
replicating everything), the targets t in [0, V) of a token shape of N rows (1-D or 2-D), and builds the parallel
program -- the block mask ``(t < rank*B) | (t >= rank*B + B)`` (either order), the masked target ``where(m, 0, t -
rank*B)`` (an add_scalar or a sub of a constant), flattened, the row-wise gather and its reshape back, zeroed where
masked -- with the logical program the same code at degree 1 (bounds 0 and V, offset 0). The forward's output is
Partial(sum) over a; the backward's ``where(one_hot(lid1, B), (pick - (1 - float(m)))[:, None], X)`` is Shard(1)
over a. Near misses: the next rank's bounds or offset, an offset one off, the other axis's coordinate, the mask with
its comparisons swapped, the pick not zeroed (the forward's where left out), the one-hot V wide (sliced back), the
update's subtrahend 1 (its mask left out). A VERIFIED plan must agree with the exact interpreter on every rank."""
from __future__ import annotations

from .gens import Draw

RULE = "vocab_parallel_target_logit"
RULE_BWD = "vocab_parallel_target_logit_backward"
NEAR = ["next_rank", "offset_one", "other_axis", "swapped", "no_zero", "wide_one_hot", "no_mask_update"]


def gen_vocab_pick(dr: Draw, seed: int):
    from .plans import _check_plan

    bwd = dr.coin()
    two = dr.coin(0.3)
    axes = ["a", "b"] if two else ["a"]
    if two and dr.coin():
        axes.reverse()
    p, q, B = dr.pick([1, 2, 3, 4]), 2, dr.int(1, 3)
    V = p * B
    tok = [dr.int(1, 3)] if dr.coin(0.4) else [dr.int(1, 3), dr.int(1, 3)]
    N = 1
    for s in tok:
        N *= s
    near = dr.pick(NEAR) if dr.coin(0.35) else ""
    if near == "other_axis" and not two or near == "no_zero" and bwd or \
            near in ("wide_one_hot", "no_mask_update") and not bwd:
        near = ""
    tnames = [f"t{k}" for k in range(len(tok))]
    n_expr = "*".join(tnames)
    lo, hi = 0, V  # (a range past [0, V) is refused at load: index_domain does not read the mask's logical_or)
    sub_form, or_swap = dr.coin(0.3), dr.coin()

    def prog(par: bool):
        nodes = []

        def op(name, o, inputs, **attrs):
            nodes.append({"name": name, "op": o, "inputs": inputs, "attrs": attrs})
            return name

        r = {"next_rank": "(rank.a+1)", "other_axis": "rank.b"}.get(near, "rank.a") if par else None
        blo = f"{r}*(v/a)" if par else 0
        bhi = f"{r}*(v/a)+v/a" if par else "v"
        op("clo", "const", [], value=blo, dtype="int")
        op("chi", "const", [], value=bhi, dtype="int")
        swapped = par and near == "swapped"
        op("lt", "ge" if swapped else "lt", ["t", "clo"])
        op("ge", "lt" if swapped else "ge", ["t", "chi"])
        op("m", "logical_or", ["ge", "lt"] if or_swap else ["lt", "ge"])
        shift = (f"{r}*(0-v/a){'+1' if near == 'offset_one' else ''}" if par else 0)
        if sub_form:
            op("coff", "const", [], value=f"{r}*(v/a){'-1' if near == 'offset_one' else ''}" if par else 0,
               dtype="int")
            op("off", "sub", ["t", "coff"])
        else:
            op("off", "add_scalar", ["t"], value=shift)
        op("zi", "const", [], value=0, dtype="int")
        op("lid", "where", ["m", "zi", "off"])
        lid1 = op("lid1", "reshape", ["lid"], shape=[n_expr]) if len(tok) > 1 else "lid"
        op("j", "unsqueeze", [lid1], dim=1)
        op("g", "gather", ["X", "j"], dim=1)
        op("pk", "reshape", ["g"], shape=[n_expr])
        if bwd:
            op("mf", "reshape", ["m"], shape=[n_expr])
            op("mc", "cast", ["mf"], dtype="float")
            op("one", "const", [], value=1)
            if par and near == "no_mask_update":
                op("u", "scale", ["one"], value=1)
            else:
                op("u", "sub", ["one", "mc"])
            op("sb", "sub", ["pk", "u"])
            op("v", "unsqueeze", ["sb"], dim=1)
            op("oh", "one_hot", [lid1], num_classes=("v" if near == "wide_one_hot" else "v/a") if par else "v")
            if par and near == "wide_one_hot":
                op("ohs", "slice", ["oh"], dim=1, start=0, end="v/a", step=1)
            op("y", "where", ["ohs" if par and near == "wide_one_hot" else "oh", "v", "X"])
        else:
            op("pk2", "reshape", ["pk"], shape=tnames)
            if par and near == "no_zero":
                op("y", "scale", ["pk2"], value=1)
            else:
                op("zf", "const", [], value=0)
                op("y", "where", ["m", "zf", "pk2"])
        return nodes

    xpl = {"a": "Shard(1)", **({"b": "Replicate()"} if two else {})}
    ypl = {"a": "Shard(1)" if bwd else "Partial(sum)", **({"b": "Replicate()"} if two else {})}
    t_in = {"name": "t", "shape": tnames, "dtype": "int", "range": [lo, "v"]}
    dd = {"tvcert_plan": 1, "name": "vocab_pick", "dims": {**dict(zip(tnames, tok)), "v": V, "a": p, "b": q},
          "mesh": {k: k for k in axes},
          "logical": {"inputs": [{"name": "X", "shape": [n_expr, "v"], "dtype": "float"}, t_in], "nodes": prog(False),
                      "outputs": ["y"]},
          "parallel": [{"name": "p", "inputs": [{"name": "X", "shape": [n_expr, "v/a"], "dtype": "float"}, dict(t_in)],
                        "nodes": prog(True), "outputs": ["y"]}],
          "inputs": {"X": {"local": "X", "placement": xpl}, "t": {"local": "t", "placement": {}}},
          "outputs": {"y": {"local": "y", "placement": ypl}}}
    desc = (f"{'backward' if bwd else 'forward'} X [{N}, {V}] {xpl} tokens {tok} t in [{lo}, {hi}) "
            f"{'sub' if sub_form else 'add_scalar'}{' near ' + near if near else ''} mesh {axes} a={p} b={q}")
    return _check_plan(dd, RULE_BWD if bwd else RULE), desc


VOCAB_PICK_GENERATORS = {RULE: gen_vocab_pick, RULE_BWD: gen_vocab_pick}
