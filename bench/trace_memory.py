"""Peak memory and time of tracing one Llama-3-405B-dims transformer layer on fake tensors.

    PYTHONPATH=orchestrator python bench/trace_memory.py [--tp 8] [--seq 8192]

Traces the logical joint (forward + backward) layer at degree 1 and the hand-written tensor
parallel layer on every rank of the fake process group, converts to IR, compresses to SPMD and
validates the plan at full size.  Nothing is allocated: tensors are FakeTensors.  Prints the peak
RSS (``ru_maxrss``) before and after, which must stay under 2 GB (issue 7).
"""
from __future__ import annotations

import argparse
import json
import resource
import sys
import time


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tp", type=int, default=8)
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    import torch
    import torch.distributed._functional_collectives as funcol

    from tvcert.frontends.trace import trace_plan

    H, F, NH, NKV, HD = 16384, 53248, 128, 8, 128
    B, S, TP = a.batch, a.seq, a.tp
    EPS = 1e-5

    class Copy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, g):
            ctx.g = g
            return x.view_as(x)

        @staticmethod
        def backward(ctx, gr):
            return funcol.all_reduce(gr, "sum", ctx.g), None

    class Reduce(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, g):
            return funcol.all_reduce(x, "sum", g)

        @staticmethod
        def backward(ctx, gr):
            return gr, None

    ident = lambda x: x  # noqa: E731

    def layer(x, attn_norm, wq, wk, wv, wo, ffn_norm, w1, w3, w2, target, copy=ident, red=ident):
        def norm(t, w):
            return t * torch.rsqrt((t * t).mean(-1, keepdim=True) + EPS) * w
        b, s, _ = x.shape
        h = copy(norm(x, attn_norm))
        nkv = wk.shape[1] // HD
        q = (h @ wq).view(b, s, -1, HD).transpose(1, 2)
        k = (h @ wk).view(b, s, nkv, HD).transpose(1, 2)
        v = (h @ wv).view(b, s, nkv, HD).transpose(1, 2)
        rep = q.shape[1] // nkv
        k = k[:, :, None].expand(b, nkv, rep, s, HD).reshape(b, nkv * rep, s, HD)
        v = v[:, :, None].expand(b, nkv, rep, s, HD).reshape(b, nkv * rep, s, HD)
        p = torch.softmax(q @ k.transpose(-1, -2) / 11.0, -1)
        o = (p @ v).transpose(1, 2).reshape(b, s, -1)
        x = x + red(o @ wo)
        h = copy(norm(x, ffn_norm))
        x = x + red((torch.nn.functional.silu(h @ w1) * (h @ w3)) @ w2)
        return 0.5 * ((x - target) ** 2).sum()

    def layer_tp(ctx, **kw):
        g = ctx.group("tp")
        return layer(**kw, copy=lambda t: Copy.apply(t, g), red=lambda t: Reduce.apply(t, g))

    col, row = {"tp": "Shard(1)"}, {"tp": "Shard(0)"}
    inputs = {
        "x": {"shape": [B, S, H]},
        "attn_norm": {"shape": [H], "param": True},
        "wq": {"shape": [H, NH * HD], "placement": col, "param": True},
        "wk": {"shape": [H, NKV * HD], "placement": col, "param": True},
        "wv": {"shape": [H, NKV * HD], "placement": col, "param": True},
        "wo": {"shape": [NH * HD, H], "placement": row, "param": True},
        "ffn_norm": {"shape": [H], "param": True},
        "w1": {"shape": [H, F], "placement": col, "param": True},
        "w3": {"shape": [H, F], "placement": col, "param": True},
        "w2": {"shape": [F, H], "placement": row, "param": True},
        "target": {"shape": [B, S, H]},
    }
    before = rss_mb()
    t0 = time.perf_counter()
    plan = trace_plan(layer, layer_tp, inputs=inputs, mesh={"tp": TP}, name="llama3_405b_layer")
    dt = time.perf_counter() - t0
    after = rss_mb()
    params = sum(int(torch.tensor(v["shape"]).prod()) for k, v in inputs.items() if v.get("param"))
    out = {
        "layer": "llama3-405b dims", "hidden": H, "ffn": F, "heads": NH, "kv_heads": NKV, "seq": S, "batch": B, "tp": TP,
        "params_per_layer": params, "bytes_if_materialised_fp32": params * 4,
        "logical_ops": len(plan["logical"]["nodes"]), "parallel_ops": len(plan["parallel"][0]["nodes"]),
        "trace_seconds": round(dt, 2), "peak_rss_mb_before": round(before, 1), "peak_rss_mb": round(after, 1),
        "under_2gb": after < 2048,
    }
    if a.json:
        print(json.dumps(out, indent=2))
    else:
        for k, v in out.items():
            print(f"{k:28s} {v}")
    return 0 if out["under_2gb"] else 1


if __name__ == "__main__":
    sys.exit(main())
