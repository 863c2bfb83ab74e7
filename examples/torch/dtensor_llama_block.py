"""A small Llama-style block parallelized with DTensor's `parallelize_module` (Colwise / Rowwise).

`tvcert trace examples/torch/dtensor_llama_block.py --verify`; `--set swap=true` swaps Colwise and
Rowwise on the MLP's first linear (a plan bug).
"""
import torch
import torch.nn as nn
from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel, parallelize_module

B, S, H, NH, F = 2, 4, 8, 4, 8
HD = H // NH


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + self.eps) * self.weight


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(H, H, bias=False) for _ in range(4))

    def forward(self, x):
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, -1, HD).transpose(1, 2)
        k = self.wk(x).view(b, s, -1, HD).transpose(1, 2)
        v = self.wv(x).view(b, s, -1, HD).transpose(1, 2)
        p = torch.softmax(q @ k.transpose(-1, -2) / 1.5, -1)
        o = (p @ v).transpose(1, 2).reshape(b, s, -1)
        return self.wo(o)


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = nn.Linear(H, F, bias=False)
        self.w3 = nn.Linear(H, F, bias=False)
        self.w2 = nn.Linear(F, H, bias=False)

    def forward(self, x):
        return self.w2(torch.nn.functional.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn_norm, self.ffn_norm = RMSNorm(H), RMSNorm(H)
        self.attn, self.mlp = Attention(), MLP()

    def forward(self, x):
        h = x + self.attn(self.attn_norm(x))
        return h + self.mlp(self.ffn_norm(h))


def make_block():
    torch.manual_seed(0)
    return Block()


def tp_plan(swap=False):
    plan = {
        "attn.wq": ColwiseParallel(), "attn.wk": ColwiseParallel(), "attn.wv": ColwiseParallel(),
        "attn.wo": RowwiseParallel(),
        "mlp.w1": ColwiseParallel(), "mlp.w3": ColwiseParallel(), "mlp.w2": RowwiseParallel(),
    }
    if swap:
        plan["mlp.w3"] = RowwiseParallel()
    return plan


def tp_plan_sp():
    """torchtitan-style TP + sequence parallelism: norms on sequence shards (dim 1), all-gather before
    the column-parallel linears, reduce-scatter after the row-parallel ones."""
    col = lambda: ColwiseParallel(input_layouts=Shard(1))  # noqa: E731
    row = lambda: RowwiseParallel(output_layouts=Shard(1))  # noqa: E731
    return {"attn_norm": SequenceParallel(), "ffn_norm": SequenceParallel(),
            "attn.wq": col(), "attn.wk": col(), "attn.wv": col(), "attn.wo": row(),
            "mlp.w1": col(), "mlp.w3": col(), "mlp.w2": row()}


def loss_fn(out, x, target):
    return 0.5 * ((out - target) ** 2).sum()


def tvcert_trace(swap: bool = False, sp: bool = False):
    from tvcert.frontends.dtensor import trace_module_plan

    if sp:  # activations, target and the per-rank loss live on sequence shards: the loss is a partial sum
        seq = {"shape": [B, S, H], "placement": {"tp": "Shard(1)"}}
        return trace_module_plan(make_block, lambda m, mesh: parallelize_module(m, mesh, tp_plan_sp()), loss_fn,
                                 data={"x": seq, "target": seq}, mesh={"tp": 2}, name="dtensor_llama_block_sp",
                                 output_placements={"loss": {"tp": "Partial(sum)"}})
    return {"tvcert_plan": 1, **trace_module_plan(
        make_block, lambda m, mesh: parallelize_module(m, mesh, tp_plan(swap)), loss_fn,
        data={"x": {"shape": [B, S, H]}, "target": {"shape": [B, S, H]}}, mesh={"tp": 2},
        name=f"dtensor_llama_block{'_swap' if swap else ''}")}
