"""Red team s10 follow-up (H52): collectives a rank's setup reaches by a name bound at import time or through an object,
which a refusal that patches ``torch.distributed``'s module attributes does not see.  The program is
``setup_broadcast.py``'s vocab-parallel embedding; the setup "synchronises" the per-rank vocab start from rank 0
(every real rank then looks up rank 0's rows).  ``bug="import_bound"``: ``from torch.distributed import broadcast``
(bound before the patch); ``bug="funcol"``: ``funcol.broadcast``; ``bug="pg_method"``: the group object's own
``ProcessGroup.broadcast``.  Each came out VERIFIED on the fake process group (it moves no data); now UNKNOWN.
``bug=""``: each rank keeps its own start (VERIFIED)."""
import torch
import torch.distributed._functional_collectives as funcol
from torch.distributed import broadcast  # bound at import time

import importlib.util
from pathlib import Path

_sp = importlib.util.spec_from_file_location("redteam_s10_setup_broadcast_base", Path(__file__).with_name("setup_broadcast.py"))
_base = importlib.util.module_from_spec(_sp)
_sp.loader.exec_module(_base)
INPUTS, logical, make_parallel = _base.INPUTS, _base.logical, _base.make_parallel


def make_setup(bug: str):
    def setup(ctx):
        start = torch.tensor([ctx.coord("tp") * (INPUTS["w"]["shape"][0] // ctx.size("tp"))])
        if bug == "import_bound":
            broadcast(start, src=0, group=ctx.group("tp"))  # BUG: rank 0's start on every rank
        if bug == "funcol":
            start = funcol.broadcast(start, 0, ctx.group("tp")).wait()  # BUG: the same, functional
        if bug == "pg_method":
            import torch.distributed as dist
            opts = dist.BroadcastOptions()
            opts.rootRank = 0
            ctx.group("tp").broadcast([start], opts).wait()  # BUG: the same, through the group object
        return {"start": int(start)}
    return setup


def tvcert_trace(bug: str = ""):
    return dict(logical=logical, parallel=make_parallel(""), parallel_setup=make_setup(bug), inputs=INPUTS,
                mesh={"tp": 2}, name=f"redteam_s10_setup_bound{'_' + bug if bug else ''}")
