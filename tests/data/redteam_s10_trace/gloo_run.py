"""Run a spec's parallel program on a real gloo group of 2 CPU processes and the logical model on the full tensors;
prints one JSON line {"spec.py:bug": [parallel loss on rank 0, logical loss]}. ``python gloo_run.py SPEC.py bug1
bug2 ...`` (the spec's INPUTS: float inputs N(0, 1), int inputs drawn from [GLOO_INT_LOW, range) (the spec's,
default 0); each input cut to rank r's block by its tp placement; the spec's ``logical`` (or ``mlp``),
``make_parallel(bug)`` and, if it has one, ``make_setup(bug)(ctx)`` run before, as ``ctx.state``)."""
import importlib.util
import json
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _spec(path):
    sp = importlib.util.spec_from_file_location("spec", path)
    mod = importlib.util.module_from_spec(sp)
    sp.loader.exec_module(mod)
    return mod


def _inputs(mod):
    g = torch.Generator().manual_seed(7)
    out = {}
    for k, v in mod.INPUTS.items():
        if v.get("dtype") == "int":
            hi = int(v["range"]) if "range" in v else mod.GLOO_INT_HIGH  # (no declared range: the spec's bound)
            out[k] = torch.randint(getattr(mod, "GLOO_INT_LOW", 0), hi, v["shape"], generator=g)
        else:
            out[k] = torch.randn(*v["shape"], generator=g, dtype=torch.float64)
    return out


def _local(mod, full, r, world):
    loc = {}
    for k, t in full.items():
        pl = mod.INPUTS[k].get("placement", {}).get("tp", "Replicate()")
        if pl.startswith("Shard("):
            d = int(pl[6:-1])
            t = t.chunk(world, d)[r]
        loc[k] = t.clone().requires_grad_(mod.INPUTS[k].get("param", False))
    return loc


class _Ctx:
    state = None

    def group(self, axis):
        return dist.group.WORLD

    def coord(self, axis):
        return dist.get_rank()

    def size(self, axis):
        return dist.get_world_size()


def _rank(r, world, init, cases, outfile):
    dist.init_process_group("gloo", init_method=init, rank=r, world_size=world)
    res = {}
    for path, bug in cases:
        mod = _spec(path)
        full = _inputs(mod)
        logical = getattr(mod, "logical", None) or mod.mlp
        ctx = _Ctx()
        if hasattr(mod, "make_setup"):
            ctx.state = mod.make_setup(bug)(ctx)
        loss = mod.make_parallel(bug)(ctx, **_local(mod, full, r, world))
        ref = logical(**{k: v.clone() for k, v in full.items()})
        res[f"{os.path.basename(path)}:{bug}"] = [float(loss.detach()), float(ref.detach())]
    if r == 0:
        with open(outfile, "w") as f:
            json.dump(res, f)
    dist.destroy_process_group()


def run_gloo(cases) -> dict:
    """{"spec.py:bug": [rank 0's parallel loss, the logical loss]} for each (spec path, bug) of ``cases``; the 2 ranks
    are forked from this process (one group for every case)."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "res.json")
        mp.start_processes(_rank, args=(2, f"file://{os.path.join(d, 'store')}", [(str(p), b) for p, b in cases], out),
                           nprocs=2, start_method="fork")
        with open(out) as f:
            return json.load(f)


if __name__ == "__main__":
    print(json.dumps(run_gloo([(sys.argv[1], b) for b in sys.argv[2:]])))
