"""Conformance instances of the loss-parallel row rules on load-balanced (context-parallel) token rows (H46).

torchtitan's TP + CP job reads ``_LossParallelCrossEntropy`` (vocab sharded over tp) on tokens a cp axis holds in
head-tail order (``ZigzagShard`` of the token dim): ``vocab_parallel_log_softmax`` / ``vocab_parallel_nll_loss`` /
``vocab_parallel_nll_backward`` then conclude ``zigzag_rowwise`` / ``zigzag_rowwise2`` on that axis
(kernel/patterns.py ``_row_axes``).  Each instance is one of the loss examples (``examples/vocab_parallel_loss*.json``)
with a cp axis of size 2 or 3 added outside or inside tp, the logits and labels ``ZigzagShard(0)`` on it, the loss
``Partial(sum)`` and the logits' gradient ``ZigzagShard(0)``; near misses: the labels or the gradient claimed
``Shard(0)`` (contiguous) instead, or the loss ``Replicate`` -- a verdict of VERIFIED must then still agree with the
interpreter on every rank (the runner's oracle), so a wrong conclusion is caught.
"""
from __future__ import annotations

import json

from .gens import Draw

LOSS = ["vocab_parallel_loss.json", "vocab_parallel_loss_local_max.json",
        "vocab_parallel_loss_no_target_all_reduce.json"]


def _local_n(shape: list, ax: str) -> list:
    return [f"n/{ax}" if s == "n" else s for s in shape]


def b_cp_loss(dr: Draw):
    """A loss example on tokens zig-zag sharded over an added cp axis (see the module docstring)."""
    from .plans import EXAMPLES

    name = dr.pick(LOSS)
    d = json.loads((EXAMPLES / name).read_text())
    tp, pc = dr.pick([2, 3, 4]), dr.pick([2, 3])
    d["dims"] = {"tp": tp, "v": tp * dr.int(1, 3), "n": 2 * pc * dr.int(1, 2), "cp": pc}
    d.pop("run_dims", None)
    mesh = d["mesh"] if isinstance(d["mesh"], list) else [[k, v] for k, v in d["mesh"].items()]
    outer = dr.coin()
    d["mesh"] = [["cp", "cp"]] + mesh if outer else mesh + [["cp", "cp"]]
    for prog in d["parallel"]:
        for i in prog["inputs"]:
            i["shape"] = _local_n(i["shape"], "cp")
    miss = dr.pick(["", "", "", "labels_contiguous", "grad_contiguous", "loss_replicated"])
    d["inputs"]["logits"].setdefault("placement", {})["cp"] = "ZigzagShard(0)"
    d["inputs"]["t"].setdefault("placement", {})["cp"] = "Shard(0)" if miss == "labels_contiguous" else "ZigzagShard(0)"
    d["outputs"]["loss"].setdefault("placement", {})["cp"] = "Replicate" if miss == "loss_replicated" else "Partial(sum)"
    d["outputs"]["dx"].setdefault("placement", {})["cp"] = "Shard(0)" if miss == "grad_contiguous" else "ZigzagShard(0)"
    return d, f"{name} dims={d['dims']} cp {'outer' if outer else 'inner'}{' near miss ' + miss if miss else ''}"
