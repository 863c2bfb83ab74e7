"""Pipelines traced from ``torch.distributed.pipelining`` (issue 16): one program per pipeline stage.

The spec builds the model, splits it into stages with its own code (``PipelineStage`` over the stage's
layers, or ``pipeline()`` / ``SplitPoint``), builds PyTorch's schedule (``ScheduleGPipe``, ``Schedule1F1B``)
and runs its training step (``schedule.step(...)``); :func:`trace_pipeline_plan` traces that step on every rank
of the mesh on the fake process group, unmodified:

* **Stage programs.** The schedule's forward and backward of every micro-batch, the gradient accumulation
  into ``.grad`` over micro-batches and the schedule's own gradient scaling (``scale_grads``: ``div_`` by the
  number of micro-batches) are ATen ops of the traced step.  Ranks with the same pipeline coordinate run one
  SPMD program (over the other mesh axes, e.g. ``tp``), pinned to that stage (``stage: {pp: s}``).
* **send / recv.** ``dist.isend`` / ``dist.irecv`` / ``batch_isend_irecv`` / ``send`` / ``recv`` (what
  ``P2POp`` and the schedule's ``_batch_p2p`` call) are traced as IR ``send`` / ``recv`` with the real peer:
  the peer's global rank is resolved through its process group to mesh coordinates.  A transfer between
  ranks that differ on one mesh axis (the pipeline axis) is a send / recv on that axis; any other peer
  (itself, or a rank differing on another axis too) is UNKNOWN naming the op and line.  The tag is what
  pairs them on the hardware: p2p messages between two ranks on one communicator are matched in order,
  so the k-th send from a to b on group g is received by b's k-th recv from a on g (tag ``"<group>.<k>"``).
  A schedule whose sends and recvs do not pair that way is rejected by the plan loader (never VERIFIED).
* **Warm-up.** ``PipelineStage``'s first step runs a vote (``_warmup_p2p``: the product of every stage's
  "static metadata" vote, sent around the ring) to choose static or dynamic shape inference.  Each rank's
  own vote is computed as PyTorch does; a stage whose metadata is incomplete (dynamic inference, which
  exchanges pickled objects) is UNKNOWN, so when every rank traces, every vote was static and the product
  the protocol would compute is STATIC: that is what the traced stages are given.
* **Shapes.**  Stages built without ``input_args`` / ``output_args`` (torchtitan's) would infer them at the
  first step by exchanging pickled metadata; here each stage module is run, in stage order, on a fake first
  micro-batch and the stage is given those shapes (:func:`_stage_metadata`).  A wrong shape cannot verify: the
  plan loader rejects a recv whose shape is not the sent tensor's.
* **The reference** (``reference="microbatches"``, the default): the unsplit model's gradient accumulation over
  the same micro-batches (the schedule's ``tensor_split``), each micro-batch's loss back-propagated, gradients
  divided by their count for a mean loss (``combine="mean"``) or summed for a loss normalised by the whole batch
  (``combine="sum"``, torchtitan's).  That this equals the full-batch gradient is arithmetic the engine has no
  rule for (a sum over unrolled micro-batch slices), so it is tested on the model in float64 with random weights
  and inputs before tracing (:func:`_check_reference_is_full_batch`; a ``combine`` that does not give the
  full-batch loss and gradients is UNKNOWN): ``reference="full"`` compares with the full batch and is
  UNKNOWN with more than one micro-batch.  Every parameter and buffer is an input of the stage holding it (held
  by no stage: bad input; by two, a tied weight: UNKNOWN).
* **Plain local shards.**  A framework whose TP parameters are plain local tensors (torchtitan's ``spmd_types``)
  declares their placements (``param_placements``, checked against the local shapes), runs the step in its own
  context (``step_context``: the SPMD mesh) and reduces pending gradients outside autograd (``grad_sync``):
  :func:`trace_titan_pp_job`.  A ``ppermute`` before a send (a peer differing on another axis) is located where its
  process group was created (``dist.new_group``'s caller): that line chose the peer, not the step's.
* **Failures.**  A step that raises while traced is UNKNOWN naming the schedule (the cause may be the trace's), never REFUTED; building the stage or schedule failing is bad input.
"""
from __future__ import annotations

import contextlib
from collections import defaultdict
from typing import Any, Callable, Mapping

from . import trace as T
from .aten import reg
from .dataparallel import _transplant_hooks, check_fully_shard
from .rank_workers import default_jobs, start as start_ranks
from .trace import TraceError

_OPS_DEFINED = False
_LIB = None  # keeps the op library alive


def _define_ops() -> None:
    """``tvcert_p2p::send`` / ``tvcert_p2p::recv``: opaque ops make_fx records in program order; the
    converter turns them into the IR's send / recv (axis, peer coordinate and tag resolved at trace time)."""
    global _OPS_DEFINED
    if _OPS_DEFINED:
        return
    import torch

    global _LIB
    _LIB = torch.library.Library("tvcert_p2p", "DEF")
    _LIB.define("send(Tensor x, str axis, int to, str tag) -> ()")
    _LIB.define("recv(int[] shape, ScalarType dtype, str axis, int src, str tag) -> Tensor")
    _LIB.define("ppermute(Tensor x, str axis, int shift, str where) -> Tensor")
    _LIB.impl("ppermute", lambda x, axis, shift, where: x.clone(), "CompositeExplicitAutograd")
    torch.library.register_fake("tvcert_p2p::ppermute", lambda x, axis, shift, where: torch.empty_like(x), lib=_LIB)
    _LIB.impl("send", lambda x, axis, to, tag: None, "CompositeExplicitAutograd")
    _LIB.impl("recv", lambda shape, dtype, axis, src, tag: torch.zeros(shape, dtype=dtype), "CompositeExplicitAutograd")
    torch.library.register_fake("tvcert_p2p::send", lambda x, axis, to, tag: None, lib=_LIB)
    torch.library.register_fake("tvcert_p2p::recv", lambda shape, dtype, axis, src, tag: torch.empty(shape, dtype=dtype),
                                lib=_LIB)
    _OPS_DEFINED = True


@reg("tvcert_p2p.send")
def _conv_send(c, n, x, axis, to, tag):
    return c.emit("send", [c.ir(x)], {"axis": axis, "to": int(to), "tag": tag}, n_out=0)


@reg("tvcert_p2p.ppermute")
def _conv_ppermute(c, n, x, axis, shift, where):
    if where:  # the shift exists because of the group the peer came from: located where the user built it (the
        c.cur_src = where  # step's frame, ``schedule.step(...)``, says nothing of which peer was chosen)
    return c.emit("ppermute", [c.ir(x)], {"axis": axis, "shift": int(shift)})


@reg("tvcert_p2p.recv")
def _conv_recv(c, n, shape, dtype, axis, src, tag):
    dt = "float" if dtype.is_floating_point else "int"
    return c.emit("recv", [], {"axis": axis, "src": int(src), "tag": tag, "shape": [int(s) for s in shape],
                               **({"dtype": dt} if dt != "float" else {})})


class _Done:
    """The Work a traced send / recv returns: the transfer is an op of the program, complete at once."""

    def wait(self, *a, **k):
        return True

    def is_completed(self):
        return True


class _P2P:
    """The rank's point-to-point calls as traced send / recv ops, with per-(group, peer, direction) counters.

    A transfer must be between pipeline stages (the peer's coordinate on ``pp_axis`` differs).  A peer that also
    differs on other axes by ``d_a`` (a hand-built pipeline group pairing other ranks) is, on the sending side,
    ``ppermute(x, a, d_a)`` and a send to the rank with the same other coordinates: the receiver
    ``(s + 1, c + d)`` then gets the value rank ``(s, c)`` sent, what the hardware delivers.  The shifts must be
    the same on every rank of the stage (SPMD compression checks it), and :func:`check_pairing` checks that the
    ranks' real messages pair one to one."""

    def __init__(self, ctx: T.MeshCtx, resolve: Callable[[Any], Any], pp_axis: str):
        self.ctx = ctx
        self.resolve = resolve
        self.pp_axis = pp_axis
        self.count: dict[tuple, int] = defaultdict(int)
        self.log: list[tuple] = []  # (direction, this rank, peer rank, group, k): the real messages

    def _where(self, group, peer, group_peer, what: str):
        import torch.distributed.distributed_c10d as c10d

        g = group if group is not None else c10d._get_default_group()
        glob = c10d._canonicalize_group_rank(g, peer, group_peer, return_global=True)
        axes, sizes = self.ctx.axes, self.ctx.sizes
        mine, theirs = T.coords_of(self.ctx.rank, sizes), T.coords_of(glob, sizes)
        if mine[axes.index(self.pp_axis)] == theirs[axes.index(self.pp_axis)]:
            raise TraceError(f"a {what} on rank {self.ctx.rank} {dict(zip(axes, mine))} goes to rank {glob} "
                             f"{dict(zip(axes, theirs))} of the same pipeline stage ({self.pp_axis} coordinate): only "
                             f"transfers between stages are traced", "unsupported", f"dist.{what}", _caller())
        shifts = {a: (y - x) % n for a, x, y, n in zip(axes, mine, theirs, sizes) if a != self.pp_axis and x != y}
        try:
            gname = self.resolve(g)
        except KeyError:
            gname = "group"
        gname = gname if isinstance(gname, str) else "+".join(gname)
        direction = "send" if "send" in what else "recv"
        k = self.count[(gname, glob, direction)]
        self.count[(gname, glob, direction)] += 1
        self.log.append((direction, self.ctx.rank, glob, gname, k))
        return theirs[axes.index(self.pp_axis)], shifts, f"{gname}.{k}"

    def isend(self, tensor, dst=None, group=None, tag=0, group_dst=None):
        import torch
        import torch.distributed.distributed_c10d as c10d

        to, shifts, tg = self._where(group, dst, group_dst, "isend")
        site = _GROUP_SITES.get(getattr(group if group is not None else c10d._get_default_group(), "group_name", ""),
                                "")
        for a, d in shifts.items():
            tensor = torch.ops.tvcert_p2p.ppermute(tensor, a, d, site)
        torch.ops.tvcert_p2p.send(tensor, self.pp_axis, int(to), tg)
        return _Done()

    def irecv(self, tensor, src=None, group=None, tag=0, group_src=None):
        import torch

        frm, _, tg = self._where(group, src, group_src, "irecv")
        got = torch.ops.tvcert_p2p.recv([int(s) for s in tensor.shape], tensor.dtype, self.pp_axis, int(frm), tg)
        with torch.no_grad():
            tensor.copy_(got)
        return _Done()

    def send(self, tensor, dst=None, group=None, tag=0, group_dst=None):
        self.isend(tensor, dst, group, tag, group_dst)

    def recv(self, tensor, src=None, group=None, tag=0, group_src=None):
        self.irecv(tensor, src, group, tag, group_src)
        return src

    def batch_isend_irecv(self, ops):
        out = []
        for op in ops:  # by name: a P2POp built before the trace holds torch's own isend / irecv
            kind = getattr(op.op, "__name__", "")
            if kind not in ("isend", "irecv"):
                raise TraceError(f"batch_isend_irecv of a P2POp with op {kind!r}", "unsupported", "batch_isend_irecv")
            f = self.isend if kind == "isend" else self.irecv
            out.append(f(op.tensor, group=op.group, tag=op.tag,
                         **({"group_dst": op.group_peer} if kind == "isend" else {"group_src": op.group_peer})))
        return out


def check_pairing(logs: Mapping[int, list[tuple]], axes, sizes) -> None:
    """Every real message (k-th from rank a to rank b on a group) is sent once and received once; else the
    pipeline would hang on the hardware: UNKNOWN naming the first unmatched one (the plan has no hang)."""
    sends = {(a, b, g, k) for lg in logs.values() for d, a, b, g, k in lg if d == "send"}
    recvs = {(b, a, g, k) for lg in logs.values() for d, a, b, g, k in lg if d == "recv"}
    for what, left, right in (("sent", sends, recvs), ("received", recvs, sends)):
        extra = sorted(left - right)
        if extra:
            a, b, g, k = extra[0]
            ca, cb = dict(zip(axes, T.coords_of(a, sizes))), dict(zip(axes, T.coords_of(b, sizes)))
            raise TraceError(f"message {k} on group {g!r} from rank {a} {ca} to rank {b} {cb} is {what} but never "
                             f"{'received' if what == 'sent' else 'sent'}: the pipeline would hang", "spmd", "p2p")


_GROUP_SITES: dict[str, str] = {}  # process group name -> "file:line" of the user code that created it


@contextlib.contextmanager
def _recorded_groups():
    """``dist.new_group`` remembering its caller (the user's line building a pipeline group by hand): a shift over
    another axis before a send (:class:`_P2P`) is located there when no user frame is on the step's stack."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    orig = c10d.new_group
    _GROUP_SITES.clear()  # a new world (group names are reused)

    def new_group(*a, **k):
        g = orig(*a, **k)
        where = _caller()
        if where and hasattr(g, "group_name"):
            _GROUP_SITES[g.group_name] = where
        return g

    dist.new_group = c10d.new_group = new_group
    try:
        yield
    finally:
        dist.new_group = c10d.new_group = orig


def _caller() -> str | None:
    """The innermost frame of the caller's caller outside torch and this package (by directory)."""
    import os
    import traceback

    import torch

    skip = (os.path.dirname(os.path.abspath(torch.__file__)) + os.sep, T._PACKAGE_DIR + os.sep)
    for fr in reversed(traceback.extract_stack()[:-2]):
        f = os.path.abspath(fr.filename)
        if not fr.filename.startswith("<") and not f.startswith(skip):
            return f"{os.path.basename(f)}:{fr.lineno}"
    return None


@contextlib.contextmanager
def _captured_p2p(ctx: T.MeshCtx, resolve, pp_axis: str, log: list):
    """``torch.distributed``'s point-to-point functions as traced send / recv (``P2POp`` checks its op against
    the module's ``isend`` / ``irecv``, so both modules are patched with the same functions), and the schedule's
    warm-up vote settled as described in the module docstring."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d
    from torch.distributed.pipelining import schedules

    _define_ops()
    p = _P2P(ctx, resolve, pp_axis)
    names = ("isend", "irecv", "send", "recv", "batch_isend_irecv")
    saved = [(m, nm, getattr(m, nm)) for m in (dist, c10d) for nm in names]
    for m in (dist, c10d):
        for nm in names:
            setattr(m, nm, getattr(p, nm))
    old_warm = schedules._PipelineSchedule._warmup_p2p
    schedules._PipelineSchedule._warmup_p2p = _static_warmup
    try:
        yield
    finally:
        schedules._PipelineSchedule._warmup_p2p = old_warm
        log[:] = p.log
        for m, nm, f in saved:
            setattr(m, nm, f)


def _stage_metadata(by_index: Mapping[int, Any], first, first_shape, on_its_rank) -> dict[int, tuple]:
    """What PipelineStage's dynamic shape inference would exchange, for stages built without ``input_args`` /
    ``output_args`` (torchtitan's): each stage's module run, in stage order, on a fake first micro-batch (the first
    data input's local rows / micro-batches; a stage's input is the previous stage's output, requiring grad).
    Plain tensors only.  ``on_its_rank(i)``: a context yielding stage i's object, rebuilt in its rank's world and
    run in the step's context when there is one (a TP stage's collectives need its process groups).  A wrong guess
    cannot verify: a received buffer whose shape is not the sent tensor's is rejected by the plan loader."""
    from torch.distributed.pipelining._utils import InferenceMode, extract_tensor_metas
    from torch._subclasses.fake_tensor import FakeTensorMode

    if not any(InferenceMode.needs_dynamic(sg._user_meta, True) for sg, *_ in by_index.values()
               if hasattr(sg, "_user_meta")):
        return {}
    import torch
    from torch.distributed.tensor import DTensor

    idx = sorted(by_index)
    n_mb = by_index[idx[0]][1]
    shape = list(first_shape)
    if shape[0] % n_mb:
        raise TraceError(f"the first data input's {shape[0]} local rows do not split into {n_mb} micro-batches", "input")
    shape[0] //= n_mb
    out = {}
    mode = FakeTensorMode(allow_non_fake_inputs=True)  # entered after the stage is built (a mesh reads real ranks)
    with mode:
        dt = getattr(torch, first.torch_dtype)
        x = torch.zeros(shape, dtype=dt) if first.dtype == "int" else torch.empty(shape, dtype=dt)
    for i in idx:
        with on_its_rank(i) as sg, mode:
            y = sg.submod(x)
            ys = y if isinstance(y, tuple) else (y,)
            if any(isinstance(t, DTensor) for t in ys) or not all(isinstance(t, torch.Tensor) for t in ys):
                raise TraceError(f"PipelineStage {i} outputs {type(y).__name__} (DTensors / non-tensors): its dynamic "
                                 f"metadata inference is not emulated; give the stage input_args / output_args",
                                 "unsupported", "PipelineStage")
            out[i] = (extract_tensor_metas((x,)), extract_tensor_metas(ys))
            x = ys[0].detach().requires_grad_(True) if len(ys) == 1 else None
            if x is None and i != idx[-1]:
                raise TraceError(f"PipelineStage {i} outputs {len(ys)} tensors: dynamic metadata is emulated for one",
                                 "unsupported", "PipelineStage")
    return out


def _give_metadata(sg, metas: Mapping[int, tuple]) -> None:
    from torch.distributed.pipelining._utils import InferenceMode, _StageMeta

    if sg.stage_index in metas and hasattr(sg, "_user_meta") and InferenceMode.needs_dynamic(sg._user_meta, True):
        ins, outs = metas[sg.stage_index]
        sg._user_meta = _StageMeta(inputs=ins, outputs=outs, input_grads=None, output_grads=None)


def _static_warmup(self, stages, has_backward, p2p_done):
    """``PipelineStage``s: the vote settled (module docstring).  ``pipeline()``'s stages (``_PipelineStage``, shapes
    from the exported graph): PyTorch's legacy warm-up (``_get_init_p2p_neighbors_ops``) only opens the
    communicators -- a 0-d stage index sent into a 1-element buffer that is discarded -- so it is not traced, on any
    rank (the messages after it keep their order on both ends)."""
    from torch.distributed.pipelining._utils import InferenceMode
    from torch.distributed.pipelining.stage import PipelineStage

    plain = [isinstance(st, PipelineStage) for st in stages]
    if not any(plain):
        return None
    if not all(plain):
        raise TraceError("a rank mixes PipelineStage and pipeline()-built stages: their warm-up is not traced",
                         "unsupported", "PipelineStage")
    for st in stages:
        if InferenceMode.needs_dynamic(st._user_meta, has_backward):
            raise TraceError(f"PipelineStage {st.stage_index} infers its shapes at the first step (dynamic metadata), "
                             f"which exchanges pickled objects between ranks that the trace cannot run; give the "
                             f"stage its example input_args and output_args", "unsupported", "PipelineStage")
        st._inference_mode = InferenceMode.STATIC


def _safe(name: str) -> str:
    return name.replace(".", "__")


def _default_step(schedule, ctx, pp_axis, x, target):
    """torchtitan's training step (``train.py``): the first stage feeds the inputs, the last one the targets and
    collects the micro-batch losses; the reported loss is their mean."""
    import torch

    s, n = ctx.coord(pp_axis), ctx.size(pp_axis)
    losses: list = []
    schedule.step(*(x,) if s == 0 else (), target=target if s == n - 1 else None,
                  losses=losses if s == n - 1 else None)
    return torch.mean(torch.stack(losses)) if s == n - 1 else None


def trace_pipeline_plan(model_factory: Callable[[], Any], make_stage: Callable[[Any, Any], Any],
                        make_schedule: Callable[[Any, Any], Any], loss_fn: Callable[..., Any], *,
                        data: Mapping[str, Mapping[str, Any]], mesh: Mapping[str, int], pp_axis: str = "pp",
                        step: Callable[..., Any] | None = None, name: str = "pipeline", reference: str = "microbatches",
                        combine: str = "mean", description: str | None = None,
                        output_placements: Mapping[str, Mapping[str, str]] | None = None,
                        param_placements: Callable[[Any], Mapping[str, Mapping[str, str]]] | None = None,
                        step_context: Callable[[Any], Any] | None = None,
                        grad_sync: Callable[[Any, dict], dict] | None = None) -> dict:
    """Trace a ``torch.distributed.pipelining`` training step into a plan with one program per stage.

    ``model_factory()`` builds the unsplit model (the logical model: ``loss_fn(model(first data input),
    *other data inputs)`` on the full batch); ``make_stage(model, ctx)`` is the rank's own code building its
    ``PipelineStage`` from a fresh model (``ctx.coord(pp_axis)``, ``ctx.group(pp_axis)``); ``make_schedule(stage,
    ctx)`` builds the schedule; ``step(schedule, ctx, **data)`` runs one training step and returns the loss on the
    last stage and None elsewhere (default: torchtitan's step, the mean of the micro-batch losses).  ``data``:
    name -> input spec (:func:`.trace.trace_plan`), the whole batch on every rank of the stage that reads it.
    The stage modules' parameters and buffers are the model's, found by module identity, else by name
    (:func:`_held_params`).  Placements: a DTensor parameter's own; a parameter held as a plain local shard
    (torchtitan's ``spmd_types`` TP) gets ``param_placements(stage module)[name]`` ({axis: placement}, checked
    against its local shape; absent: Replicate).  ``step_context(ctx)``: a context manager entered around the rank's
    traced step and its shape inference (torchtitan's SPMD mesh context).  ``grad_sync(ctx, {logical name:
    gradient})``: the rank's gradient reductions that run outside autograd (FSDP's all-reduce of pending TP
    gradients), applied after the step."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor
    from torch.nn.parallel import DistributedDataParallel
    from torch.nn.utils.stateless import _reparametrize_module

    mesh = {str(a): int(s) for a, s in mesh.items()}
    if reference not in ("microbatches", "full"):
        raise TraceError(f"reference must be 'microbatches' or 'full', got {reference!r}", "input")
    if combine not in ("mean", "sum"):
        raise TraceError(f"combine must be 'mean' or 'sum', got {combine!r}", "input")
    if pp_axis not in mesh:
        raise TraceError(f"the pipeline axis {pp_axis!r} is not a mesh axis {list(mesh)}", "input")
    axes, sizes = tuple(mesh), tuple(mesh.values())
    pi = axes.index(pp_axis)
    world = 1
    for s_ in sizes:
        world *= s_
    dnames = list(data)
    run_step = step or (lambda sch, ctx, **d: _default_step(sch, ctx, pp_axis, *[d[k] for k in dnames]))
    late: dict[str, Any] = {}

    def build(r: int):
        """On rank r (inside its fake world): ctx, the stage, the schedule and the stage's parameters
        {name in the stage module: (logical name, DTensor (mesh, placements) or None)}."""
        c = T.coords_of(r, sizes)
        dm = init_device_mesh("cpu", sizes, mesh_dim_names=axes)
        ctx = T.MeshCtx(axes, sizes, r, dict(zip(axes, c)), dm)
        model = model_factory()
        try:
            with _recorded_groups():
                stage = make_stage(model, ctx)
            sched = make_schedule(stage, ctx)
        except TraceError:
            raise
        except Exception as exc:
            src = T._exc_src(exc)
            raise TraceError(f"building the pipeline stage / schedule fails on rank {r}{' at ' + src if src else ''}: "
                             f"{type(exc).__name__}: {' '.join(str(exc).split())[:500]}", "input", None, src) from exc
        stages = list(stage) if isinstance(stage, (list, tuple)) else [stage]  # several: a looped / interleaved schedule
        for sg in stages:  # gradient sync in DDP's C++ reducer / FSDP2's hooks is not traced
            check_fully_shard(sg.submod)
            if isinstance(sg.submod, DistributedDataParallel):
                raise TraceError(f"stage {sg.stage_index}'s module is DistributedDataParallel, whose gradient "
                                 f"all-reduce (run by the schedule's last backward) is not traced", "unsupported",
                                 "DistributedDataParallel")
        held = {}
        for i, sg in enumerate(stages):
            pls = param_placements(sg.submod) if param_placements else None
            held.update({(i, sn): v for sn, v in _held_params(model, sg.submod, c[pi], pls, mesh).items()})
        return ctx, stages, sched, held


    def one_rank(r: int):
        """Rank r's stage program, in its own process (:mod:`.rank_workers`); what it needs from the pre-pass and
        the logical model's build is ``late``, released to it."""
        holder, placement, metas, bufs, specs = (late[k] for k in ("holder", "placement", "metas", "bufs", "specs"))
        names = [s.name for s in specs]
        lshapes = [T.local_shape(s, mesh) for s in specs]
        grad_pl: dict[str, dict[str, str]] = {}
        log: list = []
        c = T.coords_of(r, sizes)
        st = c[pi]
        T._progress_where = f"rank {r + 1}/{world}"
        T._tick(f"tracing rank {r + 1}/{world} (coordinates {dict(zip(axes, c))})")
        with T.fake_world(r, world):
            ctx, stages, sched, held = build(r)
            n_mb = int(sched._n_microbatches)
            for sg in stages:
                _give_metadata(sg, metas)
            for sn, (ln, dt) in held.items():
                if holder.get(ln) != st or placement[ln] != _placement_text(dt, axes):
                    raise TraceError(f"rank {r} (stage coordinate {st}) holds parameter {ln!r} differently from the "
                                     f"first rank of its stage", "spmd")
            resolve = T._axis_resolver(axes, sizes, r)

            def parallel(ctx_, **kw):
                leaves = {}
                for sn, (ln, dt) in held.items():
                    t = kw[_safe(ln)]
                    if ln in bufs:
                        leaves[sn] = _buffer_value(t, bufs[ln])
                        continue
                    # a DTensor parameter is a leaf DTensor over the traced local shard (as the stage holds it)
                    leaves[sn] = t if dt is None or isinstance(dt, dict) else \
                        DTensor.from_local(t.detach(), *dt, run_check=False).requires_grad_()
                real = {(i, n): p for i, sg in enumerate(stages) for n, p in sg.submod.named_parameters()}
                for key, p in real.items():  # the stage's gradient hooks fire on the traced leaves, as on its own
                    _transplant_hooks(p, leaves[key])
                before = {key: p._version for key, p in real.items()}
                with contextlib.ExitStack() as es:
                    for i, sg in enumerate(stages):
                        es.enter_context(_reparametrize_module(sg.submod, {n: v for (j, n), v in leaves.items()
                                                                           if j == i}))
                    es.enter_context(_captured_p2p(ctx_, resolve, pp_axis, log))
                    if step_context is not None:
                        es.enter_context(step_context(ctx_))
                    loss = run_step(sched, ctx_, **{k: kw[k] for k in dnames})
                touched = [held[key][0] for key, p in real.items() if p.grad is not None or p._version != before[key]]
                if touched:  # e.g. an optimizer built on the module's own parameters: not the traced program
                    raise TraceError(f"the step writes to parameters {touched} (or their .grad) outside the traced "
                                     f"stage modules' parameters", "unsupported", "parameter write")
                out = {} if loss is None else {"loss": loss.full_tensor() if isinstance(loss, DTensor) else loss}
                for sn, (ln, dt) in held.items():
                    if ln in bufs:
                        continue
                    g = leaves[sn].grad
                    if g is None:
                        g = torch.zeros_like(leaves[sn])
                    if isinstance(g, DTensor):
                        grad_pl[f"grad_{_safe(ln)}"] = _placement_text((g.device_mesh, g.placements), axes)
                        g = g.to_local()
                    out[f"grad_{_safe(ln)}"] = g
                if grad_sync is not None:
                    gs = {ln: out[f"grad_{_safe(ln)}"] for _, (ln, _) in held.items() if ln not in bufs}
                    out.update({f"grad_{_safe(ln)}": g for ln, g in grad_sync(ctx_, gs).items()})
                if not out:
                    raise TraceError(f"stage {st} holds no parameters and returns no loss", "input")
                return out

            try:
                gm_r, pout_names = T._trace_joint(parallel, specs, lshapes, pre_args=(ctx,))
            except TraceError:
                raise
            except Exception as exc:
                src = T._exc_src(exc)
                first = (str(exc).strip().splitlines() or [type(exc).__name__])
                # not REFUTED: the failure may be the trace's (a schedule doing what fake tensors cannot), and no
                # interpreter run confirms it
                raise TraceError(f"the {type(sched).__name__} step cannot be traced on rank {r} (coordinates "
                                 f"{dict(zip(axes, c))}){' at ' + src if src else ''}: {type(exc).__name__}: "
                                 f"{' '.join(first)[:800]}", "unsupported", type(sched).__name__, src) from exc
            pnodes, pouts = T._convert(gm_r, names, resolve, mesh, T.int_bounds_of(specs))
        nodes_j, outs_j = T._finish_outputs(pnodes, pouts, pout_names, names)
        return nodes_j, outs_j, pout_names, n_mb, log, grad_pl, type(sched).__name__

    try:
        jobs = T.rank_jobs if T.rank_jobs is not None else default_jobs()
    except ValueError as exc:
        raise TraceError(str(exc), "input") from None
    # every rank once, in a fresh process forked now: before the logical model is built and before the pre-pass
    # builds each stage's first rank here (a real rank runs neither, nor another rank's trace)
    T.decompositions()  # tvcert's own table (no user state): built once here, not in every rank's process
    ranks = start_ranks(one_rank, world, jobs, late.update, (T, "progress_hook"))
    try:
        logical_model = model_factory()
        pnames = [n for n, _ in logical_model.named_parameters()]
        bufs = dict(logical_model.named_buffers())  # inputs, not differentiated; a complex one (a RoPE cache) as [..., 2]
        if any(not (b.dtype.is_floating_point or b.is_complex()) for b in bufs.values()):
            raise TraceError(f"integer buffers {[n for n, b in bufs.items() if not b.is_floating_point()]} are not traced",
                             "unsupported", "buffer")
        # every parameter's placement, from the first rank of the stage holding it
        holder: dict[str, int] = {}
        placement: dict[str, dict[str, str]] = {}
        by_index: dict[int, Any] = {}  # stage index -> (its module, schedule's micro-batch count), from the pre-pass
        for st in range(mesh[pp_axis]):
            r0 = T.rank_of([st if i == pi else 0 for i in range(len(axes))], sizes)
            with T.fake_world(r0, world):
                _, stages0, sched0, held = build(r0)
                by_index.update({sg.stage_index: (sg, int(sched0._n_microbatches), r0) for sg in stages0})
                for sn, (ln, dt) in held.items():
                    if holder.setdefault(ln, st) != st:
                        raise TraceError(f"parameter {ln!r} is held by stages {holder[ln]} and {st} (a tied weight): "
                                         f"not traced", "unsupported", "tied parameter")
                    if ln in bufs and dt is not None and not isinstance(dt, dict):
                        raise TraceError(f"buffer {ln!r} is a DTensor: not traced", "unsupported", "buffer")
                    placement[ln] = _placement_text(dt, axes)
        missing = [n for n in [*pnames, *bufs] if n not in holder]
        if missing:
            raise TraceError(f"parameters {missing} are held by no pipeline stage", "input")
        inputs: dict[str, dict] = {_safe(n): {"shape": list(p.shape), "param": True, "placement": placement[n],
                                              "dtype": str(p.dtype).removeprefix("torch.")}
                                   for n, p in logical_model.named_parameters()}
        for n, b in bufs.items():
            inputs[_safe(n)] = {"shape": list(b.shape) + ([2] if b.is_complex() else []), "placement": placement[n],
                                "dtype": str(b.real.dtype if b.is_complex() else b.dtype).removeprefix("torch.")}
        inputs.update({n: dict(v) for n, v in data.items()})
        specs = T._parse_inputs(inputs, mesh)
        names = [s.name for s in specs]

        lshapes = [T.local_shape(s, mesh) for s in specs]
        first = specs[names.index(dnames[0])]
        @contextlib.contextmanager
        def on_its_rank(i):
            """Stage i's object for the shape inference: the pre-pass's, or rebuilt on its rank in the step context."""
            if step_context is None:
                yield by_index[i][0]
                return
            r0 = by_index[i][2]
            with T.fake_world(r0, world):
                ctx0, stages0, _, _ = build(r0)
                with step_context(ctx0):
                    yield next(sg for sg in stages0 if sg.stage_index == i)

        metas = _stage_metadata(by_index, first, lshapes[names.index(dnames[0])], on_its_rank)
        per_stage: dict[int, dict[tuple, list[dict]]] = defaultdict(dict)
        stage_outs: dict[int, list[str]] = {}
        stage_onames: dict[int, list[str]] = {}
        grad_pl: dict[str, dict[str, str]] = {}
        n_mbs: dict[int, int] = {}
        logs: dict[int, list] = {}
        ranks.release({"holder": holder, "placement": placement, "metas": metas, "bufs": bufs, "specs": specs})
        for r, (nodes_j, outs_j, pout_names, n_mb_r, log_r, gpl, sched_name) in ranks.results():
            st = T.coords_of(r, sizes)[pi]
            n_mbs[r], logs[r] = n_mb_r, log_r
            grad_pl.update(gpl)
            if st in stage_outs and (stage_onames[st], stage_outs[st]) != (pout_names, outs_j):
                raise TraceError(f"rank {r} returns different tensors than the other ranks of stage {st}", "spmd")
            stage_outs[st], stage_onames[st] = outs_j, pout_names
            per_stage[st][tuple(x for i, x in enumerate(T.coords_of(r, sizes)) if i != pi)] = nodes_j
            if ranks.jobs > 1:
                T._tick(f"traced {r + 1}/{world} ranks")
        T._progress_where = ""
        check_pairing(logs, axes, sizes)
        n_mb = sorted(set(n_mbs.values()))
        if len(n_mb) != 1:
            raise TraceError(f"the ranks' schedules split the batch into different numbers of micro-batches {n_mb}",
                             "spmd")
        n_mb = n_mb[0]
        if reference != "full" and n_mb > 1:
            _check_reference_is_full_batch(model_factory, loss_fn, data, n_mb, combine, mesh)

        def logical(**kw):
            st = {n: kw[_safe(n)] for n in pnames}
            st.update({n: _buffer_value(kw[_safe(n)], b) for n, b in bufs.items()})
            d = [kw[k] for k in dnames]
            if reference == "full" or n_mb == 1:
                return loss_fn(torch.func.functional_call(logical_model, st, (d[0],)), *d[1:])
            # single-device gradient accumulation: each micro-batch's loss back-propagated into .grad; with
            # combine="mean" (a mean loss per micro-batch) the gradients divided by the number of micro-batches and the
            # reported loss the micro-batch losses' mean, with "sum" (a loss normalised by the whole batch, torchtitan's)
            # their sum
            # the schedule's split (microbatch._split_tensor) of each rank's rows, assembled across its data shard
            chunks = [_shard_microbatches(t, data[k], mesh, n_mb) for k, t in zip(dnames, d)]
            losses = []
            for k in range(n_mb):
                out = torch.func.functional_call(logical_model, st, (chunks[0][k],))
                losses.append(loss_fn(out, *[t[k] for t in chunks[1:]]))
                losses[-1].backward()
            if combine == "sum":
                return torch.sum(torch.stack([x.detach() for x in losses]))
            for n in pnames:
                st[n].grad.div_(n_mb)
            return torch.mean(torch.stack([x.detach() for x in losses]))

        T._progress_where = "logical model"
        T._tick("tracing the logical model")
        try:
            gm, out_names = T._trace_joint(logical, specs, [s.shape for s in specs])
        except TraceError:
            raise
        except Exception as exc:
            src = T._exc_src(exc)
            raise TraceError(f"the logical model fails{' at ' + src if src else ''}: {type(exc).__name__}: {exc}",
                             "input", None, src) from exc
        lnodes, louts = T._convert(gm, names, int_bounds=T.int_bounds_of(specs))
        T._default_int_ranges(specs, [n.to_json() for n in lnodes])
        lnodes_j, lout_j = T._finish_outputs(lnodes, louts, out_names, names)

        if sorted(o for s in stage_onames.values() for o in s) != sorted(out_names):
            raise TraceError(f"the stages' outputs {sorted(o for s in stage_onames.values() for o in s)} are not the "
                             f"logical model's {sorted(out_names)} (the loss is returned by the last stage only)", "input")
        held_by = {_safe(n): st for n, st in holder.items()}  # parameters and buffers live on the stage holding them
        oaxes = tuple(a for a in axes if a != pp_axis)
        osizes = tuple(s for a, s in zip(axes, sizes) if a != pp_axis)
        spec_of = {s.name: (s, sh) for s, sh in zip(specs, lshapes)}
        programs, bind, notes = [], {}, []
        for st in sorted(per_stage):
            nodes, nts = T.spmd_compress(per_stage[st], oaxes, osizes)
            notes += [f"stage {st}: {x}" for x in nts]
            pname = f"stage{st}"
            used = {i for nd in nodes for i in nd.get("inputs", [])} | set(stage_outs[st])
            mine = [s.name for s in specs if held_by.get(s.name) == st or (s.name not in held_by and s.name in used)]
            for nm in mine:
                if nm in bind:
                    raise TraceError(f"input {nm!r} is read by stages {bind[nm]} and {st}: a logical input lives on one "
                                     f"stage", "unsupported", "input on two stages")
                bind[nm] = st
            programs.append({"name": pname, "stage": {pp_axis: st},
                             "inputs": [_decl(spec_of[nm][0], spec_of[nm][1]) for nm in mine],
                             "nodes": nodes, "outputs": list(stage_outs[st])})
        unread = [nm for nm in names if nm not in bind]
        if unread:
            raise TraceError(f"data inputs {unread} are read by no stage", "input")
        in_pl = {s.name: {"local": s.name, "program": f"stage{bind[s.name]}", "placement": dict(s.placement)}
                 for s in specs}
        out_pl = {}
        for st in sorted(stage_outs):
            for o, local in zip(stage_onames[st], stage_outs[st]):
                out_pl[o] = {"local": local, "program": f"stage{st}", **T._output_binding(o, specs)}
        for k, v in {**grad_pl, **(output_placements or {})}.items():
            if k not in out_pl:
                raise TraceError(f"output_placements names {k!r}, which is not an output {list(out_pl)}", "input")
            out_pl[k]["placement"] = dict(v)
        plan = {
            "tvcert_plan": 1, "name": name,
            "description": f"traced from torch.distributed.pipelining ({sched_name}, {pp_axis}={mesh[pp_axis]}, "
                           f"{n_mb} micro-batches); logical: "
                           + ("the unsplit model on the full batch" if reference == "full" or n_mb == 1 else
                              f"the unsplit model's {combine} of the losses of the same {n_mb} micro-batches (gradient "
                              f"accumulation)") + (f"; {description}" if description else "")
                           + ("; rank-dependent attributes: " + "; ".join(notes) if notes else ""),
            "dims": dict(mesh), "mesh": {a: a for a in mesh},
            "logical": {"inputs": [_decl(s, s.shape) for s in specs], "nodes": lnodes_j, "outputs": lout_j},
            "parallel": programs, "inputs": in_pl, "outputs": out_pl,
        }
        from ..plan import PlanError, load_plan

        try:
            load_plan(plan)
        except PlanError as exc:
            raise TraceError(f"the traced pipeline does not form a valid plan: {exc}", "spmd") from None
        return plan
    finally:
        ranks.close()


def _shard_microbatches(t, spec: Mapping[str, Any], mesh: Mapping[str, int], n_mb: int) -> tuple:
    """The logical micro-batches of a data input: the schedule splits each rank's rows (``tensor_split`` of its
    local batch), so with the batch dim sharded over one mesh axis of size p (``Shard(0)``, data parallelism)
    micro-batch i is every rank's part i, rank-major: part i of ``interleave(t, 0, p, n_mb)`` (the batch dim read as
    (p, n_mb, n), the first two swapped; ``kernel/microbatch.py``, the rule the ranks' slices are read by).  A batch
    replicated on every axis: the plain split.  Sharded over several axes or another dim: not covered (UNKNOWN)."""
    import torch

    pl = {a: str(v) for a, v in (spec.get("placement") or {}).items() if str(v) != "Replicate"}
    if not pl:
        return torch.tensor_split(t, n_mb, 0)
    (a, text), = pl.items() if len(pl) == 1 else ((None, None),)
    if a is None or text.replace(" ", "") not in ("Shard(0)", f"Shard({-t.dim()})") or t.shape[0] % (mesh[a] * n_mb):
        raise TraceError(f"a data input placed {pl} (the batch dim of {t.shape[0]} rows): micro-batches are covered "
                         f"for a batch sharded Shard(0) over one mesh axis into equal parts", "unsupported", "pipeline")
    p, n = mesh[a], t.shape[0] // (mesh[a] * n_mb)
    rest = list(t.shape[1:])
    y = t.reshape([p, n_mb, n, *rest]).transpose(0, 1).reshape(list(t.shape))
    return torch.tensor_split(y, n_mb, 0)


def _check_reference_is_full_batch(model_factory, loss_fn, data: Mapping[str, Mapping[str, Any]], n_mb: int,
                                   combine: str, mesh: Mapping[str, int]) -> None:
    """The micro-batch reference (the ``combine`` of the micro-batch losses, :func:`trace_pipeline_plan`) must be the
    single-device model on the whole batch, or a VERIFIED would certify a step whose gradients are not the model's:
    ``combine="sum"`` of per-micro-batch means is n_mb times the full-batch mean, and so is any normalisation the
    loss does per micro-batch that the combine does not undo (unequal micro-batches under "mean").  The engine
    cannot prove the identity (no rule for sums over micro-batch slices), so it is tested here on the model in
    float64 with random weights and inputs: loss and every gradient; a mismatch is UNKNOWN."""
    import torch

    g = torch.Generator().manual_seed(0)
    try:
        model = model_factory().to(torch.float64)
        with torch.no_grad():
            for t in [*model.parameters(), *model.buffers()]:
                if t.is_floating_point() or t.is_complex():
                    t.copy_(torch.randn(t.shape, dtype=t.dtype, generator=g) * 0.5)
        d = []
        for spec in data.values():
            shape = [int(x) for x in spec["shape"]]
            if str(spec.get("dtype", "float")) == "int":
                r = spec.get("range") or 2  # [lo, hi]: valid labels in [0, hi) (lo is padding)
                lo, hi = (int(r[0]), int(r[1])) if isinstance(r, list) else (0, int(r))
                v = torch.randint(max(lo, 0), hi, shape, generator=g)
                if lo < 0 and shape:
                    # padded labels, as interp.random_value draws them, in a share growing along the batch dim so
                    # that micro-batches hold unequal counts of real tokens (a per-micro-batch mean then differs
                    # from the full-batch mean); each micro-batch's first element keeps a real label
                    share = (torch.arange(shape[0], dtype=torch.float64) + 1) / (shape[0] + 1) * 0.8
                    pad = torch.rand(shape, dtype=torch.float64, generator=g) < share.reshape([-1] + [1] * (len(shape) - 1))
                    for rows in _shard_microbatches(torch.arange(shape[0]), spec, mesh, n_mb):
                        if len(rows):
                            pad[int(rows[0])].reshape(-1)[0] = False
                    v = torch.where(pad, torch.full_like(v, lo), v)
                d.append(v)
            else:
                d.append(torch.randn(shape, dtype=torch.float64, generator=g))
        params = [p for p in model.parameters() if p.requires_grad]
        full = loss_fn(model(d[0]), *d[1:])
        chunks = [_shard_microbatches(t, spec, mesh, n_mb) for t, spec in zip(d, data.values())]
        parts = [loss_fn(model(chunks[0][k]), *[c[k] for c in chunks[1:]]) for k in range(n_mb)]
        comb = torch.stack(parts).sum() / (n_mb if combine == "mean" else 1)
        full_v, comb_v = full.detach(), comb.detach()
        pairs = [(full, comb), *zip(torch.autograd.grad(full, params, allow_unused=True, retain_graph=True),
                                    torch.autograd.grad(comb, params, allow_unused=True))]
    except Exception as exc:  # noqa: BLE001 - the identity is untested, so not assumed
        raise TraceError(f"the micro-batch reference (combine={combine!r}) could not be compared with the full-batch "
                         f"model ({type(exc).__name__}: {str(exc)[:200]})", "unsupported", "pipeline") from None
    for what, (a, b) in zip(["loss", *(f"gradient {k}" for k in range(len(params)))], pairs):
        a = torch.zeros(()) if a is None else a.detach()
        b = torch.zeros(()) if b is None else b.detach()
        # (a loss may compute in float32 inside, torchtitan's cross-entropy does; a wrong normalisation is off by
        # a factor, here n_mb, or by the micro-batches' size ratios)
        diff = (a.double() - b.double()).abs().max()
        if not torch.isfinite(diff) or diff > 1e-5 * max(1.0, a.double().abs().max().item()):
            raise TraceError(f"the micro-batch reference is not the full-batch model (its {what} differs): the "
                             f"{combine} of the {n_mb} micro-batch losses is {comb_v.item():.6g}, the loss on the "
                             f"whole batch {full_v.item():.6g} "
                             f"(random float64 weights and inputs; "
                             + ("combine='sum' is for a loss normalised by the whole batch, not per micro-batch"
                                if combine == "sum" else "a mean loss over unequal micro-batches, or normalised by "
                                "something else than its micro-batch") + ")", "unsupported", "pipeline")


def _held_params(model, submod, st: int, placements=None, mesh=None) -> dict[str, tuple[str, Any]]:
    """The stage module's parameters: {name in the stage module: (the model's name for it, (mesh, placements)
    of a DTensor parameter, ``placements[name]`` ({axis: text}) for a plain local shard, or None)}.  A stage
    module's submodules are the model's own (PyTorch's tutorial slices ``model.layers``; ``parallelize_module``
    keeps the modules and swaps their parameters), else a copy with the model's names (torchtitan deep-copies the
    model and deletes the other stages' layers).  A plain local shard's shape must be the model's under its
    placement on ``mesh``."""
    from torch.distributed.tensor import DTensor

    mods = {id(m): n for n, m in model.named_modules()}
    shapes = {n: tuple(p.shape) for n, p in [*model.named_parameters(), *model.named_buffers()]}
    out = {}
    for smn, sm in submod.named_modules():
        for pn, p in [*sm.named_parameters(recurse=False), *sm.named_buffers(recurse=False)]:
            base = mods.get(id(sm), smn).replace(_CHECKPOINT_PREFIX, "")  # checkpoint_wrapper's extra level
            ln = f"{base}.{pn}" if base else pn
            sn = f"{smn}.{pn}" if smn else pn
            pl = None if isinstance(p, DTensor) or placements is None else dict(placements.get(sn) or {})
            want = shapes.get(ln)
            if want is not None and pl:
                want = _local_shape(want, pl, mesh, f"parameter {sn!r} of stage {st}")
            if want is None or want != tuple(p.shape):
                raise TraceError(f"parameter {sn!r} of stage {st}'s module is not a parameter of the model (looked up "
                                 f"as {ln!r}" + (f", placement {pl}" if pl else "") + ")", "input")
            out[sn] = (ln, (p.device_mesh, p.placements) if isinstance(p, DTensor) else pl)
    return out


_CHECKPOINT_PREFIX = "_checkpoint_wrapped_module."  # torch's checkpoint_wrapper (activation checkpointing)


def _local_shape(shape, pl: Mapping[str, str], mesh: Mapping[str, int], what: str) -> tuple:
    """A plain local shard's shape: ``Shard(d)`` on axis a divides dim d by the axis size (evenly, else bad input)."""
    s = list(shape)
    for a, text in pl.items():
        if text == "Replicate":
            continue
        if not (text.startswith("Shard(") and a in mesh):
            raise TraceError(f"{what}: placement {a}: {text} is not a Shard / Replicate over a mesh axis {list(mesh)}",
                             "input")
        d = int(text[6:-1]) % len(s)
        if s[d] % mesh[a]:
            raise TraceError(f"{what}: dim {d} of size {s[d]} does not split evenly over {a} = {mesh[a]}", "input")
        s[d] //= mesh[a]
    return tuple(s)


def _buffer_value(t, like):
    import torch

    return torch.view_as_complex(t) if like.is_complex() else t


def _placement_text(dt, axes) -> dict[str, str]:
    if dt is None or isinstance(dt, dict):
        return dict(dt or {})
    from .dtensor import _pl_text

    mesh, pls = dt
    return {a: _pl_text(p) for a, p in zip(mesh.mesh_dim_names, pls)}


def _decl(s, shape) -> dict:
    d = {"name": s.name, "shape": list(shape), "dtype": s.dtype}
    if s.range is not None:
        d["range"] = T.range_json(s.range)
    return d


def trace_titan_pp_job(job, model, desc: str, name: str | None = None, step: Callable[..., Any] | None = None,
                       dp_reduce: Callable[[Any, dict], dict] | None = None) -> dict:
    """A torchtitan job with ``pipeline_parallel_degree`` > 1, alone or with ``tensor_parallel_degree`` and / or
    ``data_parallel_replicate_degree`` (the other degrees 1).  With dp_replicate > 1 each replica feeds its shard of
    the batch (``Shard(0)`` over ``dp_replicate``) and its schedule splits that into micro-batches (logical block
    (replica, micro-batch): ``kernel/microbatch.py``); ``global_valid_tokens`` is the whole batch's count (the
    trainer's ``dist_sum_tensor`` over the batch mesh) and FSDP's reduction of every gradient over the replicas --
    a sum, torchtitan's divide factor 1 -- runs after the step (``dp_reduce(group, grads)``, default a sum: FSDP's
    hooks are not traced here, as for the SP norms below); the reported loss is ``Partial(sum)`` over the replicas
    (the trainer's ``dist_sum`` over the loss mesh).  On every rank: the job's ``ParallelDims`` (mesh
    ``pp x dp_replicate x tp``, torchtitan's world order, the ``spmd_types`` backend) on the fake
    process group, torchtitan's own ``pipeline_llm`` (``_pipeline_module_split``: a deep copy of the model with the
    other stages' layers deleted, ``PipelineStage`` without static shapes; its schedule from
    ``pipeline_parallel_schedule`` with ``scale_grads=False``; each model part parallelized as ``parallelize_llama``
    does under ``spmd_types``: ``Module.parallelize``, the TP plan) with torchtitan's ``CrossEntropyLoss``, and the
    trainer's step (``Trainer.pp_forward_backward_step``: the first stage feeds the tokens, the last the labels, the
    loss normalised by ``global_valid_tokens`` through the schedule's ``loss_kwargs``, the reported loss the
    micro-batch losses' sum) in the trainer's ``train_context`` (the SPMD mesh).  ``global_valid_tokens`` is the batch's
    token count (labels in [0, vocab): no ignore index, so the trainer's count is that).  Parameters are plain local
    shards; their placements are torchtitan's ``_sharding_config`` declarations, and the TP-Replicate parameters'
    pending gradients (SP norms) are all-reduced over tp after the step, FSDP's job (as in :func:`.torchtitan.
    trace_titan`).  The logical model is the unsplit single-device model's gradient accumulation over the same
    micro-batches (``combine="sum"``).  ``step(schedule, ctx, tokens, labels)``: a replacement trainer step (an
    example's bug)."""
    import os

    import torch

    from . import torchtitan as tt

    from .titan_config import check_supported

    check_supported(job)  # pipeline parallelism alone or with TP, no checkpointing / compile
    d = job.degrees
    tt.prepare()
    import torch.distributed._functional_collectives as funcol
    from torchtitan.components.loss import CrossEntropyLoss, cross_entropy_loss
    from torchtitan.distributed.full_dtensor import validate_config
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.distributed.pipeline_parallel import pipeline_llm
    from torchtitan.distributed.spmd_types import set_current_spmd_mesh, set_spmd_meshes

    pp, tp, rep = d["pp"], d["tp"], d["dp_replicate"]
    sp = job.parallelism.enable_sequence_parallel and tp > 1
    b, s = job.training.local_batch_size, job.training.seq_len
    if sp and s % tp:
        raise TraceError(f"{job.path}: sequence parallelism needs training.seq_len ({s}) divisible by "
                         f"tensor_parallel_degree ({tp})", "input")
    n_tokens = b * s * rep  # global_valid_tokens: the trainer's count summed over the batch mesh (dp_replicate)

    def make():
        return tt._build(model.config(1, False, True)).to_empty(device="cpu")

    def loss_fn(pred, labels, **_):  # the logical loss: the single-device cross-entropy sum over the token count
        return cross_entropy_loss(pred, labels, global_vocab_size=model.vocab) / n_tokens

    built: dict[int, Any] = {}
    pending: set[str] = set()  # TP-Replicate parameters: their gradient is a pending sum over tp

    def make_stage(_m, ctx):
        pd = ParallelDims(dp_replicate=rep, dp_shard=1, cp=1, tp=tp, pp=pp, ep=1, world_size=pp * rep * tp,
                          spmd_backend="spmd_types")
        pd.build_mesh()
        m = tt._build(model.config(tp, sp, True)).to_empty(device="cpu")

        def parallelize(mm, *, ac_config=None, dump_folder="", **_):
            """parallelize_llama under spmd_types: the TP plan, then activation checkpointing (full: the backward
            re-runs each block's forward, inside the step); compile and FSDP at degree 1 are not run."""
            if tp > 1:
                validate_config(pd, mm)
                mm.parallelize(pd)
            if ac_config is not None:
                ac_config.build(dump_folder=dump_folder).apply(mm)
            return mm

        titan_loss = CrossEntropyLoss(CrossEntropyLoss.Config(global_vocab_size=model.vocab))
        sched, parts, _, _ = pipeline_llm(m, parallel_dims=pd, training=job.training, parallelism=job.parallelism,
                                          compile_config=job.compile, ac_config=job.ac, dump_folder="/tmp",
                                          device=torch.device("cpu"), model_config=model.config(tp, sp, True),
                                          parallelize_fn=parallelize, loss_fn=titan_loss)
        built[ctx.rank] = (sched, pd)
        return list(getattr(sched, "_stages", None) or [sched._stage])

    def placements(submod):  # tp = 1: no tp axis, every parameter whole
        lay = tt.layouts(submod) if tp > 1 else {}
        out = {}
        for n, t in [*submod.named_parameters(), *submod.named_buffers()]:
            pl, pend = tt._placement(lay.get(tt._clean(n)), t.dim())
            out[n] = pl
            if pend and isinstance(t, torch.nn.Parameter):
                pending.add(tt._clean(n))
        return out

    @contextlib.contextmanager
    def train_context(ctx):  # the trainer's train_context: the SPMD meshes, the dense mesh current
        pd = built[ctx.rank][1]
        set_spmd_meshes(dense_mesh=pd.spmd_dense_mesh(), sparse_mesh=pd.spmd_sparse_mesh())
        with set_current_spmd_mesh(pd.spmd_dense_mesh()):
            yield

    def sync(ctx, grads):  # FSDP's gradient reduction (in hooks, outside autograd): the pending TP gradients
        pd = built[ctx.rank][1]  # summed over tp, then every gradient summed over dp_replicate (divide factor 1)
        if tp > 1:
            group = pd.get_mesh("tp").get_group()
            grads = {n: funcol.all_reduce(g, "sum", group) if n in pending else g for n, g in grads.items()}
        if rep > 1:
            grads = (dp_reduce or _sum_over)(pd.get_mesh("dp_replicate").get_group(), grads)
        return grads

    def trainer_step(sch, ctx, tokens, labels):  # Trainer.pp_forward_backward_step
        stages = getattr(sch, "_stages", None) or [sch._stage]
        first, last = any(x.is_first for x in stages), any(x.is_last for x in stages)
        losses = [] if last else None
        sch.step(*(tokens,) if first else (), target=labels if last else None, losses=losses,
                 loss_kwargs={"global_valid_tokens": n_tokens}, return_outputs=False)
        return torch.sum(torch.stack(losses)) if last else None

    ids = {"shape": [b * rep, s], "dtype": "int", "range": model.vocab,
           **({"placement": {"dp_replicate": "Shard(0)"}} if rep > 1 else {})}
    # torchtitan's world order: pp outer, then dp_replicate, tp inner
    mesh = {"pp": pp, **({"dp_replicate": rep} if rep > 1 else {}), **({"tp": tp} if tp > 1 else {})}
    with tt.funcol_collectives():
        return trace_pipeline_plan(make, make_stage, lambda st, ctx: built[ctx.rank][0], loss_fn,
                                   data={"tokens": ids, "labels": ids}, mesh=mesh, step=step or trainer_step,
                                   combine="sum", description=desc,
                                   name=name or f"{model.name}_{os.path.splitext(os.path.basename(job.path))[0]}",
                                   param_placements=placements, step_context=train_context,
                                   grad_sync=sync if tp > 1 or rep > 1 else None,
                                   output_placements={"loss": {"dp_replicate": "Partial(sum)"}} if rep > 1 else None)


def _sum_over(group, grads: dict) -> dict:
    """FSDP2's gradient reduction over the replicas with torchtitan's divide factor 1 (``disable_fsdp_gradient_division``:
    the loss is already normalised by the global token count): a sum."""
    import torch.distributed._functional_collectives as funcol

    return {n: funcol.all_reduce(g, "sum", group) for n, g in grads.items()}
