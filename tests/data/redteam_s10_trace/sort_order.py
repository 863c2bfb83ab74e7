"""Red team s10 (H49): orders torch leaves unspecified, which the converter fixed to one order.

* ``unstable_sort``: ``torch.sort(flags, dim=1)`` (not stable) permutes the rows of ``x``; the logical model sorts
  stably.  On CPU torch's unstable sort orders equal keys otherwise from a row of 32 on; the converter read both as
  the stable order (topk, lower index first) and the plan VERIFIED.
* ``topk_unsorted``: ``torch.topk(x, 8, sorted=False).values`` weighted position by position; torch returns the 8
  values unsorted from a row of 8 on, the converter read them as sorted.
``bug=""``: the rank program sorts like the logical model (VERIFIED).  The program is the same on every tp rank
(replicated inputs): only the op's order semantics is at stake."""
import torch

B, N, K = 2, 32, 8


def _loss(x, w, flags, stable: bool, sorted_: bool):
    perm = torch.sort(flags, dim=1, stable=True).indices if stable else torch.sort(flags, dim=1).indices
    vals = torch.topk(x, K, dim=1, sorted=sorted_).values
    return (torch.gather(x, 1, perm) * w).sum() + (vals * w[:, :K]).sum()


def logical(x, w, flags):
    return _loss(x, w, flags, True, True)


def make_parallel(bug: str):
    def parallel(ctx, x, w, flags):
        return _loss(x, w, flags, bug != "unstable_sort", bug != "topk_unsorted")
    return parallel


INPUTS = {
    "x": {"shape": [B, N], "param": True, "dtype": "float64"},
    "w": {"shape": [B, N], "dtype": "float64"},
    "flags": {"shape": [B, N], "dtype": "int", "range": 2},
}


def tvcert_trace(bug: str = ""):
    return dict(logical=logical, parallel=make_parallel(bug), inputs=INPUTS, mesh={"tp": 2},
                name=f"redteam_s10_sort_order{'_' + bug if bug else ''}")


def torch_losses(bug: str, seed: int = 0) -> tuple[float, float]:
    """(the rank program's loss, the logical loss) in eager torch on one draw of the inputs."""
    g = torch.Generator().manual_seed(seed)
    x, w = torch.randn(B, N, generator=g, dtype=torch.float64), torch.randn(B, N, generator=g, dtype=torch.float64)
    flags = torch.randint(0, 2, (B, N), generator=g)
    return float(make_parallel(bug)(None, x, w, flags)), float(logical(x, w, flags))
