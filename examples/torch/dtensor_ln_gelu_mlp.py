"""A LayerNorm + GELU MLP block (nn.LayerNorm, nn.GELU, nn.Linear) parallelized with DTensor's
`parallelize_module`, for `tvcert trace`.

    tvcert trace examples/torch/dtensor_ln_gelu_mlp.py --verify                    # Colwise / Rowwise: VERIFIED
    tvcert trace examples/torch/dtensor_ln_gelu_mlp.py --set sp=true --verify      # + SequenceParallel: VERIFIED
    tvcert trace examples/torch/dtensor_ln_gelu_mlp.py --set sp=true --set bug=no_sequence_parallel --verify

``bug=no_sequence_parallel`` (with ``sp``): the LayerNorm is left out of the plan while the linears take
sequence-sharded input.  The forward is still right (LayerNorm is per token) but the norm's weight and bias
gradients stay partial sums over the sequence shards: REFUTED.  ``dtype=float64`` builds the module in float64.
"""
import torch
import torch.nn as nn
from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel, parallelize_module

B, S, H, FF = 2, 4, 8, 16


class Block(nn.Module):
    def __init__(self, approximate="none"):
        super().__init__()
        self.norm = nn.LayerNorm(H)
        self.up = nn.Linear(H, FF)
        self.act = nn.GELU(approximate=approximate)
        self.down = nn.Linear(FF, H)

    def forward(self, x):
        return x + self.down(self.act(self.up(self.norm(x))))


def plan(sp: bool, bug: str):
    if not sp:
        return {"up": ColwiseParallel(), "down": RowwiseParallel()}
    p = {"norm": SequenceParallel(), "up": ColwiseParallel(input_layouts=Shard(1)),
         "down": RowwiseParallel(output_layouts=Shard(1))}
    if bug == "no_sequence_parallel":
        del p["norm"]
    return p


def loss_fn(out, x, target):
    return ((out - target) ** 2).sum()


def tvcert_trace(sp: bool = False, bug: str = "", tp: int = 2, dtype: str = "float32", approximate: str = "none"):
    from tvcert.frontends.dtensor import trace_module_plan

    dt = getattr(torch, dtype)

    def make():
        torch.manual_seed(0)
        return Block(approximate).to(dt)

    pl = plan(sp, bug)
    if sp:
        seq = {"shape": [B, S, H], "placement": {"tp": "Shard(1)"}, **({} if dtype == "float32" else {"dtype": dtype})}
        return trace_module_plan(make, lambda m, mesh: parallelize_module(m, mesh, pl), loss_fn,
                                 data={"x": seq, "target": seq}, mesh={"tp": tp},
                                 name=f"dtensor_ln_gelu_mlp_sp{'_' + bug if bug else ''}",
                                 output_placements={"loss": {"tp": "Partial(sum)"}})
    full = {"shape": [B, S, H], **({} if dtype == "float32" else {"dtype": dtype})}
    return trace_module_plan(make, lambda m, mesh: parallelize_module(m, mesh, pl), loss_fn,
                             data={"x": full, "target": full}, mesh={"tp": tp},
                             name=f"dtensor_ln_gelu_mlp{'_' + bug if bug else ''}")
