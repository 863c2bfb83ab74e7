"""Megatron-core's own ColumnParallelLinear -> GeLU -> RowParallelLinear, traced from megatron-core's code.

`build` is ordinary Megatron model code: the layers read tensor parallelism (and sequence parallelism) from the
TransformerConfig and from `parallel_state`, which tvcert initialises on its fake process group.  The loss is
computed on Megatron's [seq, batch, hidden] layout; under sequence parallelism each rank holds a sequence shard,
so the local sum is reduced over the tensor-parallel group with Megatron's own mapping.

    tvcert trace examples/torch/mcore_mlp.py --verify
    tvcert trace examples/torch/mcore_mlp.py --set sp=true --verify
    tvcert trace examples/torch/mcore_mlp.py --set sp=true --set bug=no_finalize --verify   # REFUTED
"""
import torch

S, B, H, F = 4, 2, 8, 16


def build(config):
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.module import MegatronModule

    class MLP(MegatronModule):
        def __init__(self):
            super().__init__(config)
            self.fc1 = ColumnParallelLinear(H, F, config=config, init_method=config.init_method, bias=True,
                                            gather_output=False)
            self.fc2 = RowParallelLinear(F, H, config=config, init_method=config.output_layer_init_method,
                                         bias=True, input_is_parallel=True, skip_bias_add=False)

        def forward(self, x):
            h, _ = self.fc1(x)
            y, _ = self.fc2(torch.nn.functional.gelu(h))
            return y

    return MLP()


def loss(model, x, target):
    from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region

    local = 0.5 * ((model(x) - target) ** 2).sum()
    return reduce_from_tensor_model_parallel_region(local) if model.fc1.sequence_parallel else local


def tvcert_trace(tp: int = 2, sp: bool = False, bug: str = ""):
    """bug: "" | "no_finalize" (Megatron's finalize_model_grads not run: under SP the row-parallel bias gradient
    stays a partial sum)."""
    from tvcert.frontends.megatron_core import trace_megatron

    seq = {"tp": "Shard(0)"} if sp else {}
    data = {"x": {"shape": [S, B, H], "placement": seq}, "target": {"shape": [S, B, H], "placement": seq}}
    return trace_megatron(build, loss, data=data, tp=tp, sp=sp, finalize=bug != "no_finalize",
                          name=f"mcore_mlp_tp{tp}{'_sp' if sp else ''}{'_' + bug if bug else ''}",
                          config_kw={"hidden_size": H, "ffn_hidden_size": F})
