"""Trace PyTorch training code into a tvcert plan, on CPU, with fake tensors and a fake process group.

Usage (hand-written parallel code)::

    plan = trace_plan(
        logical=mlp,                       # logical(**inputs) -> scalar loss, the single-device model
        parallel=mlp_tp,                   # parallel(ctx, **local_inputs) -> scalar loss, run on every rank
        inputs={"x": dict(shape=[4, 8]),
                "w1": dict(shape=[8, 16], placement={"tp": "Shard(1)"}, param=True), ...},
        mesh={"tp": 2},
    )

What happens:

1. **Logical graph.** ``logical`` is traced once at degree 1 with ``make_fx(tracing_mode="fake")``
   as a *joint* program: the loss and ``torch.autograd.grad`` of the loss with respect to every
   ``param=True`` input.  Outputs: ``loss`` and ``grad_<param>``.
2. **Per-rank graphs.** For every rank of the mesh, in a fresh process of its own forked from the state before
   the logical trace (:mod:`.rank_workers`: a real rank never runs the logical model nor another rank), a fake
   process group is initialised
   (``dist.init_process_group("fake", ...)`` + ``init_device_mesh``), each input is given its local
   shape under its placement, and ``parallel(ctx, ...)`` is traced the same way.  ``ctx`` gives the
   process group of each mesh axis (``ctx.group("tp")``), the rank's coordinates (``ctx.coord``) and
   the ``DeviceMesh``.  Gradient synchronisation that real code performs *outside* the autograd graph
   (a DDP/FSDP hook, Megatron's ``allreduce_sequence_parallel_grads``, a post-accumulate-grad hook)
   is invisible to ``autograd.grad``: pass it as ``grad_sync(ctx, grads) -> grads`` so that it is
   traced, or leave it out and the plan reads the unsynchronised gradients back with the parameter's
   placement -- which cannot verify when a sync was needed.
3. **Conversion.** Every ATen node goes through :mod:`.aten`; collectives get their mesh axis by
   resolving the group name to ranks (``_resolve_process_group``) and the rank set to mesh axes.
4. **SPMD compression.** The ranks' IR programs must be structurally identical; integer attributes
   that differ (slice offsets of a vocab shard, ...) are fitted to an affine expression
   ``c + k_a*rank.a + ...`` over the mesh coordinates, giving one program for all ranks.
5. **Placements.** Inputs: the user's mapping (validated: axes exist, shard dims divide).
   Outputs: ``loss`` Replicate; ``grad_<p>`` the placement of ``p`` unless ``output_placements``
   says otherwise.

Any op without a conversion raises :class:`TraceError` naming the op and its source line (the CLI
reports it as UNKNOWN); structural rank differences likewise.

**Decompositions.** ``make_fx`` runs with PyTorch's own decomposition table (:func:`decompositions`):
the core ATen table (``torch._decomp.core_aten_decompositions``) minus every op :mod:`.aten` converts
directly, so a composite op (``stack``, ``unbind``, ``native_layer_norm_backward``, ``var_mean``,
``logsumexp``, ``mse_loss`` ...) reaches the converter as core ops and the converter's table is the core
set.  ``F.scaled_dot_product_attention`` is traced on SDPA's math backend
(``sdpa_kernel([SDPBackend.MATH])``: the math form, so autograd differentiates matmuls and a softmax),
and the fused CPU kernel ``_scaled_dot_product_flash_attention_for_cpu`` and the memory-efficient kernel
``_scaled_dot_product_efficient_attention`` (and their backwards), when code calls them anyway, are
decomposed to the same math form (:func:`_sdpa_flash_cpu`), and so is the CUDA flash kernel
``_scaled_dot_product_flash_attention`` (code that calls it directly; its extra outputs are uninitialised).
cuDNN attention is not: UNKNOWN naming the op.

**Dtypes.** Fake inputs have the dtype the code uses: an input's ``dtype`` may be ``float`` (float32),
``float32``, ``float64``, ``bfloat16``, ``float16``, or ``int`` / ``int64`` / ``int32``; every float dtype
means the reals in the plan.

Why ``make_fx`` over ``functional_call``-free plain functions rather than ``torch.export``:
``torch.export`` cannot produce the joint forward+backward of code with functional collectives and
fails on DTensor; ``make_fx`` over ``autograd.grad`` traces both in 0.1-0.2 s per layer.  DTensor
parameters must be passed as local shards and rebuilt with ``DTensor.from_local`` *inside* the traced
function, otherwise ``make_fx`` bakes the weights in as constants (see ``tvcert.frontends.dtensor``).
"""
from __future__ import annotations

import contextlib
import itertools
import math
import os
import re
import sys
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

from ..ops import get_op
from ..plan import IndexRangePlanError, PlanError, load_plan, parse_placement
from .aten import Converter, IRNode, Unconverted, fuse_collectives
from .rank_workers import default_jobs
from . import rank_workers


class TraceError(Exception):
    """The code could not be turned into a plan; the message says which op / line / rank and why.

    ``kind`` is "unsupported" (an op without conversion: the verdict is UNKNOWN), "spmd" (ranks
    differ structurally), or "input" (bad user mapping)."""

    def __init__(self, msg: str, kind: str = "unsupported", op: str | None = None, src: str | None = None):
        super().__init__(msg)
        self.kind = kind
        self.op = op
        self.src = src

    def __reduce__(self):  # from a worker process (rank_workers) with its kind, op and source line
        return (type(self), (str(self), self.kind, self.op, self.src))


# ====================================================================== mesh context
@dataclass
class MeshCtx:
    """What the parallel function sees on one rank."""

    axes: tuple[str, ...]
    sizes: tuple[int, ...]
    rank: int
    coords: dict[str, int]
    device_mesh: Any = None
    state: Any = None  # what ``parallel_setup(ctx)`` returned on this rank (e.g. a parallelized module)

    def group(self, axis: str):
        return self.device_mesh.get_group(axis)

    def coord(self, axis: str) -> int:
        return self.coords[axis]

    def size(self, axis: str) -> int:
        return self.sizes[self.axes.index(axis)]


def coords_of(rank: int, sizes: Sequence[int]) -> tuple[int, ...]:
    out = []
    for s in reversed(sizes):
        out.append(rank % s)
        rank //= s
    return tuple(reversed(out))


def rank_of(coords: Sequence[int], sizes: Sequence[int]) -> int:
    r = 0
    for c, s in zip(coords, sizes):
        r = r * s + c
    return r


def _group_axes_table(axes: Sequence[str], sizes: Sequence[int], rank: int) -> dict[frozenset, Any]:
    """frozenset of ranks -> axis name (one axis) or list of axes (a flattened group)."""
    me = coords_of(rank, sizes)
    table: dict[frozenset, Any] = {}
    for k in range(1, len(axes) + 1):
        for sub in itertools.combinations(range(len(axes)), k):
            ranks = set()
            for vals in itertools.product(*[range(sizes[i]) for i in sub]):
                c = list(me)
                for i, v in zip(sub, vals):
                    c[i] = v
                ranks.add(rank_of(c, sizes))
            key = frozenset(ranks)
            if key not in table:
                table[key] = axes[sub[0]] if k == 1 else [axes[i] for i in sub]
    return table


# ====================================================================== process group handling
@contextlib.contextmanager
def fake_world(rank: int, world: int):
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        dist.destroy_process_group()
    _clear_dtensor_caches()
    hook = sys.excepthook  # init_process_group chains a "[rank<r>]" excepthook; keep ours clean
    dist.init_process_group("fake", rank=rank, world_size=world, store=FakeStore())
    try:
        yield
    finally:
        sys.excepthook = hook
        if dist.is_initialized():
            dist.destroy_process_group()


_SETUP_HARMLESS_OPS = frozenset({"barrier", "monitored_barrier", "wait_tensor", "_wrap_tensor_autograd"})


# framework code whose setup collectives only move module parameters / buffers (or check their shapes), values the
# frontends replace by the declared inputs (functional_call): DTensor's distribute_tensor (parallelize_module), DDP's
# constructor (shape check, rank 0's parameters and buffers broadcast)
_SETUP_PARAM_SYNCS = (("tensor/_api.py", "distribute_tensor"), ("utils.py", "_verify_param_shape_across_processes"),
                      ("utils.py", "_sync_module_states"))


def _setup_collective_site(frame):
    """(torch.distributed API the user's code called, "file:line" of that call, under DTensor's distribute_tensor?)
    for the collective op the dispatch mode sees: the outermost torch.distributed frame below the first frame that
    is neither torch's nor this module's (``broadcast_object_list``, not the ``broadcast`` it runs)."""
    import torch

    tdir = os.path.dirname(torch.__file__) + os.sep
    ddir = os.path.join(tdir, "distributed") + os.sep
    exempt = {(os.path.join(ddir, *f.split("/")), name) for f, name in _SETUP_PARAM_SYNCS}
    api, where, in_distribute = None, None, False
    while frame is not None:
        fn = frame.f_code.co_filename
        in_distribute |= (fn, frame.f_code.co_name) in exempt
        if where is None:
            if fn.startswith(ddir) and not fn.endswith("c10d_logger.py"):
                api = frame.f_code.co_name
            elif not fn.startswith(tdir) and fn != __file__:
                where = f"{os.path.basename(fn)}:{frame.f_lineno}"
        frame = frame.f_back
    return api, where or "?", in_distribute


@contextlib.contextmanager
def _setup_collectives_refused(rank: int):
    """A collective that ``parallel_setup`` runs (outside the trace) is UNKNOWN: on the fake process group it moves no
    data, so the rank would keep its own value where a real rank receives another's (a per-rank vocab start
    ``dist.broadcast`` from rank 0 came out VERIFIED; red team s10).  Refused at the dispatcher (a torch dispatch
    mode sees every ``c10d`` / ``_c10d_functional`` op, whatever name or object the call went through:
    ``from torch.distributed import broadcast``, ``pg.broadcast``, funcol, object collectives).  Barriers, waits
    and group creation are not values.  Exempt: the scatter / broadcast of DTensor's ``distribute_tensor``
    (``parallelize_module``, ``distribute_module``): the frontends replace every parameter and buffer it
    distributes by the declared input's shard (``functional_call``), so its values are never read; so DDP's own
    parameter / buffer broadcast (:data:`_SETUP_PARAM_SYNCS`).  Not covered: a plain ``trace_plan`` setup that
    distributes a per-rank non-parameter value that way, and DDP's broadcast of a per-rank int buffer."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Refuse(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            ns, op = func.namespace, func._opname
            if ns in ("c10d", "_c10d_functional", "c10d_functional") and op not in _SETUP_HARMLESS_OPS:
                api, where, exempt = _setup_collective_site(sys._getframe(1))
                if not exempt:
                    name = api or f"{ns}.{op}"
                    raise TraceError(f"parallel_setup runs torch.distributed.{name} at {where} ({ns}.{op}) on rank "
                                     f"{rank}, outside the trace: the fake process group moves no data, so the values a "
                                     f"real rank receives are unknown", "unsupported", f"torch.distributed.{name}", where)
            return func(*args, **(kwargs or {}))

    with Refuse():
        yield


def _clear_dtensor_caches() -> None:
    """DTensor caches sharding propagation and redistribution plans keyed on specs whose DeviceMesh
    compares equal on every rank; a hit returns the mesh object of the rank traced *before*, with
    that rank's coordinates, so e.g. a backward Replicate -> Shard slice picks rank 0's chunk on
    every rank (seen: ``nn.Parameter(dtensor)`` on rank 1 gets rank 0's mesh through the C++ fast-path
    cache).  Each rank is traced in the same process, so the caches are emptied between ranks."""
    try:
        from torch.distributed.tensor import DTensor
        from torch.distributed.tensor import _redistribute as rd
    except ImportError:  # pragma: no cover
        return
    prop = DTensor._op_dispatcher.sharding_propagator
    for f in (getattr(prop, "propagate_op_sharding", None), getattr(prop, "_propagate_tensor_meta_cached", None),
              getattr(rd, "_gen_transform_infos", None)):
        if f is not None and hasattr(f, "cache_clear"):
            f.cache_clear()
    if hasattr(rd, "clear_redistribute_planner_cache"):
        rd.clear_redistribute_planner_cache()
    import torch

    native = getattr(torch._C, "_clear_DTensor_sharding_propagator_cache", None)  # the C++ dispatch fast path's
    if native is not None:
        native()


def _axis_resolver(axes, sizes, rank) -> Callable[[str], Any]:
    from torch.distributed.distributed_c10d import _resolve_process_group, get_process_group_ranks

    table = _group_axes_table(axes, sizes, rank)

    def resolve(group_name):
        g = _resolve_process_group(group_name) if isinstance(group_name, str) else group_name
        ranks = frozenset(get_process_group_ranks(g))
        if len(ranks) == 1:
            raise KeyError("a group of one rank")
        if ranks not in table:
            raise KeyError(f"ranks {sorted(ranks)} of rank {rank}")
        return table[ranks]

    return resolve


# ====================================================================== source locations
_FRONTEND_DIR = os.path.dirname(os.path.abspath(__file__))
_PACKAGE_DIR = os.path.dirname(_FRONTEND_DIR)  # orchestrator/tvcert: frames of ours
# Directories of libraries whose frames are never the "user" location of an op (a front end adds the
# SPMD runtime that wraps every op, e.g. ``spmd_types``, so the location names the model's line).
SKIP_FRAME_DIRS: list[str] = []
_FRAME_RE = re.compile(r'File "([^"]+)", line (\d+)')


def _dir_prefix(path: str) -> str:
    """A directory as a path prefix that matches only files inside it (``.../torch`` must not match
    ``.../torchtitan``); a file (``contextlib.py``) stays itself."""
    return path if path.endswith(".py") else path.rstrip(os.sep) + os.sep


@contextlib.contextmanager
def _user_stack_traces():
    """Record on every fx node the user frames below the traced joint function.

    ``make_fx(record_stack_traces=True)`` keeps only frames named ``forward``; plain functions
    (hand-written layers) would get no location, so the frames are chosen here: those inside the innermost
    ``joint`` frame of this package, without torch's, this package's and :data:`SKIP_FRAME_DIRS`' own.
    They are read straight off the live frames (``sys._getframe``), without symbolizing the whole stack or
    reading source lines (only ``file:line`` is used, :func:`src_of`): that was a fifth of the tracing time."""
    import torch
    import torch.fx.proxy as fxp

    torch_dir = os.path.dirname(os.path.abspath(torch.__file__))
    skip = tuple(_dir_prefix(d) for d in (torch_dir, _FRONTEND_DIR, *SKIP_FRAME_DIRS))
    kept_file: dict[str, bool] = {}  # code filename -> not under a skipped directory
    joint_file: dict[str, bool] = {}  # code filename -> in this package

    class _Stack:
        __slots__ = ("frame",)

        def __init__(self, frame):
            self.frame = frame

        @staticmethod
        def extract(*, script=False, cpp=False, skip=0):
            return _Stack(sys._getframe(1))

        def summary(self):
            frames = []
            f = self.frame
            while f is not None:
                fn = f.f_code.co_filename
                if f.f_code.co_name == "joint":
                    inside = joint_file.get(fn)
                    if inside is None:
                        inside = joint_file[fn] = os.path.abspath(fn).startswith(_FRONTEND_DIR)
                    if inside:
                        break
                keep = kept_file.get(fn)
                if keep is None:
                    keep = kept_file[fn] = not os.path.abspath(fn).startswith(skip)
                if keep:
                    frames.append(traceback.FrameSummary(fn, f.f_lineno, f.f_code.co_name, lookup_line=False,
                                                         line=""))
                f = f.f_back
            if f is None:  # not below the joint function: no user location
                return traceback.StackSummary()
            return traceback.StackSummary.from_list(frames[::-1])

    old_filter, old_tb = fxp.TracerBase._filter_traceback_frames, fxp.CapturedTraceback
    fxp.TracerBase._filter_traceback_frames = lambda self, summary: summary
    fxp.CapturedTraceback = _Stack
    try:
        yield
    finally:
        fxp.TracerBase._filter_traceback_frames = old_filter
        fxp.CapturedTraceback = old_tb


# A transform of the joint function before make_fx traces it (``functional.functionalized``, set by a front end
# whose framework writes through aliases, e.g. ``tvcert.frontends.megatron_core``); None: traced as it is.
joint_transform: Optional[Callable[[Callable], Callable]] = None

# Progress of a long trace (tvcert.progress.Progress.tick, set by the CLI): called with one line of text.
progress_hook: Optional[Callable[[str], None]] = None
_progress_where = ""  # "rank 2/4" while a rank is traced
# Ranks traced at once, each in its own fresh process (:mod:`.rank_workers`); None: ``TVCERT_TRACE_JOBS``, else the
# CPUs free (set by the CLI's ``--jobs``).
rank_jobs: Optional[int] = None
# Called once per trace_plan with {"world", "traced_ranks", "jobs"} (bench/trace_cost.py); None: not called.
stats_hook: Optional[Callable[[dict], None]] = None
# Ranks with no SPMD form: (per-rank nodes, per-rank outputs, axes, sizes, the TraceError) -> (nodes, outputs, notes)
# of one program in which every rank runs its own (``mpmd.merge_ranks``, set by ``context_parallel``); None: UNKNOWN.
spmd_fallback: Optional[Callable] = None
_LAYER_RE = re.compile(r"(?:^|\.)(?:layers|h|blocks)\.(\d+)$")
_IN_LAYER_RE = re.compile(r"^(.*?(?:^|\.)(?:layers|h|blocks)\.\d+)(?:\.|$)")


def layer_of(module: Optional[str]) -> Optional[str]:
    """The transformer layer a module path lies in (``model.layers.3`` for ``model.layers.3.attention.wq``), else
    None.  Written as the node's ``layer``: the engine derives a run of ops with one label once per canonical form
    and replays it for its copies (``kernel/memo.py``, which compares the whole canonical form, so a label only
    delimits the run: a layer whose ops differ from another's is derived on its own)."""
    m = _IN_LAYER_RE.match(module or "")
    return m.group(1) if m else None


def _tick(text: str) -> None:
    if progress_hook is not None:
        progress_hook(text)


@contextlib.contextmanager
def _module_paths():
    """Record on every fx node the path of the module that ran it (``model.layers.0.mlp.down_proj``), in
    ``node.meta["nn_module_stack"]`` as dynamo does ({path: (path, class)}, outermost first).

    Global forward hooks keep a stack of the modules being called; the path of a module is its name under
    its caller (``named_children``), else under the outermost module, else its class name.  Entering a
    transformer layer (``...layers.N``) is reported to :data:`progress_hook`."""
    import torch
    import torch.fx.traceback as fxtb

    stack: list[tuple[Any, str]] = []
    names: dict[int, dict[int, str]] = {}

    def path_of(mod) -> str:
        if not stack:
            return ""
        parent, ppath = stack[-1]
        for n, c in parent.named_children():
            if c is mod:
                return f"{ppath}.{n}" if ppath else n
        root = stack[0][0]
        table = names.get(id(root))
        if table is None:
            table = names[id(root)] = {id(m): n for n, m in root.named_modules()}
        return table.get(id(mod)) or f"{ppath}.<{type(mod).__name__}>".lstrip(".")

    def publish() -> None:
        # the outermost module called has no name of its own: its class name stands for it
        fxtb.current_meta["nn_module_stack"] = {p or type(m).__name__: (p or type(m).__name__, type(m).__qualname__)
                                                for m, p in stack}

    def pre(mod, args):
        p = path_of(mod)
        stack.append((mod, p))
        publish()
        m = _LAYER_RE.search(p)
        if m and progress_hook is not None:
            progress_hook(f"tracing {_progress_where + ': ' if _progress_where else ''}layer {m.group(1)} ({p})")

    def post(mod, args, out):
        exc = sys.exc_info()[1]  # called on the way out of a failing forward (always_call): innermost module first
        if exc is not None and out is None and not hasattr(exc, "_tvcert_module"):
            for m, path in reversed(stack):
                if m is mod:
                    try:
                        exc._tvcert_module = path or type(mod).__name__
                    except AttributeError:
                        pass
                    break
        for k in range(len(stack) - 1, -1, -1):
            if stack[k][0] is mod:
                del stack[k:]
                break
        publish()

    h1 = torch.nn.modules.module.register_module_forward_pre_hook(pre)
    h2 = torch.nn.modules.module.register_module_forward_hook(post, always_call=True)
    try:
        yield
    finally:
        h1.remove()
        h2.remove()
        fxtb.current_meta.pop("nn_module_stack", None)


def module_of(node) -> Optional[str]:
    """Innermost module path recorded by :func:`_module_paths` (None outside any module)."""
    st = node.meta.get("nn_module_stack") if node is not None else None
    if not st:
        return None
    last = list(st.values())[-1]
    return last[0] if isinstance(last, tuple) else str(last)


class _ModuleConverter(Converter):
    """The converter, also keeping each IR node's module path (``IRNode.module``, written as the node's
    ``module`` field by :func:`_finish_outputs`)."""

    def emit(self, *args, **kwargs):
        out = super().emit(*args, **kwargs)
        mod = module_of(self.cur)
        if mod and self.nodes:
            self.nodes[-1].module = mod
        return out


def src_of(node) -> Optional[str]:
    st = node.meta.get("stack_trace")
    if not st:
        return None
    m = _FRAME_RE.findall(st)
    if not m:
        return None
    f, line = m[-1]
    return f"{os.path.basename(f)}:{line}"


def _exc_src(exc: BaseException) -> Optional[str]:
    """Innermost user frame (not torch, not this package) of an exception's traceback."""
    import torch

    torch_dir = os.path.dirname(os.path.abspath(torch.__file__))
    best = None
    for fr in traceback.extract_tb(exc.__traceback__):
        f = os.path.abspath(fr.filename)
        if fr.filename.startswith("<") or f.startswith(torch_dir) or f.startswith(_FRONTEND_DIR) or "/site-packages/" in f:
            continue
        best = f"{os.path.basename(f)}:{fr.lineno}"
    return best


def _tool_frame_in_failure(exc: BaseException) -> Optional[str]:
    """The first tvcert frame (``file:line``) between the user's code and the failing op, or None.

    A failure is the parallel program's own (REFUTED: no input avoids it) only when no code of ours stands
    between the user's call and the error: a crash inside one of our replacements (a collective remap, a
    kernel's math form, a hook guard) is our limitation, UNKNOWN."""
    import torch

    torch_dir = os.path.dirname(os.path.abspath(torch.__file__))
    entered = False
    for fr in traceback.extract_tb(exc.__traceback__):
        if fr.filename.startswith("<"):  # generated code (fx's "<string>", "<eval_with_key>"): no one's
            continue
        if fr.name in ("__torch_function__", "__torch_dispatch__"):  # our modes pass every op through; an op
            continue                                                   # they replace runs in a frame of its own
        f = os.path.abspath(fr.filename)
        ours = f.startswith(_PACKAGE_DIR)
        if not entered:
            entered = not ours and not f.startswith(torch_dir)
        elif ours:
            return f"{os.path.relpath(f, os.path.dirname(_PACKAGE_DIR))}:{fr.lineno}"
    return None


# ====================================================================== tracing one program
FLOAT_DTYPES = {"float": "float32", "float32": "float32", "float64": "float64", "double": "float64",
                "bfloat16": "bfloat16", "float16": "float16", "half": "float16"}
INT_DTYPES = {"int": "int64", "int64": "int64", "long": "int64", "int32": "int32"}


@dataclass
class InputSpec:
    name: str
    shape: list[int]
    dtype: str = "float"  # float | int (the plan's dtype class)
    range: Any = None  # R (values in [0, R)) or [lo, hi] (values in [lo, hi)), as a plan's int input
    placement: dict[str, str] = field(default_factory=dict)
    param: bool = False
    layout: list = field(default_factory=list)
    torch_dtype: str = "float32"  # the dtype of the fake tensor the code is traced with


def _parse_inputs(inputs: Mapping[str, Mapping[str, Any]], mesh: Mapping[str, int]) -> list[InputSpec]:
    out = []
    for name, spec in inputs.items():
        # any printable name without spaces (passed as **kwargs; "x-in", "layer.0/w" ...)
        if not isinstance(name, str) or not name.isprintable() or not re.fullmatch(r"\S+", name) or name.startswith("#"):
            raise TraceError(f"input name {name!r} must be printable, without spaces, not starting with '#'", "input")
        unknown = set(spec) - {"shape", "dtype", "range", "placement", "param", "layout"}
        if unknown:
            raise TraceError(f"input {name!r}: unknown keys {sorted(unknown)}", "input")
        shape = [int(s) for s in spec["shape"]]
        tdt = str(spec.get("dtype", "float")).removeprefix("torch.")
        if tdt not in FLOAT_DTYPES and tdt not in INT_DTYPES:
            raise TraceError(f"input {name!r}: dtype must be one of {sorted(FLOAT_DTYPES) + sorted(INT_DTYPES)}, "
                             f"got {spec.get('dtype')!r}", "input")
        dtype = "float" if tdt in FLOAT_DTYPES else "int"
        pl = dict(spec.get("placement", {}))
        for a, text in pl.items():
            if a not in mesh:
                raise TraceError(f"input {name!r}: placement axis {a!r} is not a mesh axis {list(mesh)}", "input")
            try:
                p = parse_placement(text)
            except ValueError as exc:
                raise TraceError(f"input {name!r}: {exc}", "input") from None
            if p.kind == "S" and not spec.get("layout"):  # with a layout: checked on the laid-out shape
                if not -len(shape) <= p.dim < len(shape):
                    raise TraceError(f"input {name!r}: Shard({p.dim}) but the tensor has rank {len(shape)}", "input")
            elif p.kind == "P":
                raise TraceError(f"input {name!r}: Partial input placements are not supported by the tracer", "input")
        _check_range(name, spec.get("range"))
        param = bool(spec.get("param", False))
        if param and dtype != "float":
            raise TraceError(f"input {name!r}: only float inputs can be parameters", "input")
        out.append(InputSpec(name, shape, dtype, spec.get("range"), pl, param, _parse_layout(name, spec.get("layout")),
                             torch_dtype=FLOAT_DTYPES.get(tdt) or INT_DTYPES[tdt]))
    return out


def _check_range(name: str, r) -> None:
    """A trace-spec int range: R > 0 or [lo, hi] with integers lo < hi; else TraceError naming the input."""
    ok = lambda v: isinstance(v, int) and not isinstance(v, bool)  # noqa: E731
    if r is None or (ok(r) and r > 0) or (isinstance(r, (list, tuple)) and len(r) == 2 and all(map(ok, r))
                                         and r[0] < r[1]):
        return
    raise TraceError(f"input {name!r}: range must be an integer R > 0 (values in [0, R)) or [lo, hi] with integers "
                     f"lo < hi (values in [lo, hi)), got {r!r}", "input")


def int_bounds_of(specs: Sequence[InputSpec]) -> dict[str, tuple[int, int]]:
    """Declared int input ranges as [lo, hi) (what the converter's cross-entropy decides its ignore mask by)."""
    return {s.name: (int(s.range[0]), int(s.range[1])) if isinstance(s.range, (list, tuple)) else (0, int(s.range))
            for s in specs if s.dtype == "int" and s.range is not None}


def range_json(r):
    """An InputSpec range as the plan writes it: R, or [lo, hi]."""
    return [int(r[0]), int(r[1])] if isinstance(r, (list, tuple)) else int(r)


_COMPARES = {"eq", "ne", "lt", "le", "gt", "ge"}


def _low_needed(op: str, c, flipped: bool) -> Optional[int]:
    """The largest lo for which ``x op c`` (``c op x`` when flipped) is not decided on [lo, hi), hi > 0: eq / ne
    need c itself, x < c (x >= c) needs floor(c) - 1, x <= c (x > c) needs floor(c).  None unless negative."""
    if isinstance(c, bool) or not isinstance(c, (int, float)):
        return None
    if flipped:
        op = {"lt": "gt", "gt": "lt", "le": "ge", "ge": "le"}.get(op, op)
    if op in ("eq", "ne"):
        lo = int(c) if float(c).is_integer() else None
    else:
        lo = math.floor(c) - (1 if op in ("lt", "ge") else 0)
    return lo if lo is not None and lo < 0 else None


_SHAPE_OPS = {"reshape", "unsqueeze", "squeeze", "expand", "transpose", "permute", "slice", "flatten", "clone",
              "contiguous", "alias"}


def _default_int_ranges(specs: Sequence[InputSpec], nodes: Sequence[Mapping[str, Any]]) -> None:
    """An int input without a ``range`` gets the smallest bound its uses in the logical graph give (through
    shape-only ops and ``where``'s value arms): the rows of an embedding table it indexes, ``one_hot``'s classes
    (cross-entropy targets), ``embedding_backward``'s ``num_weights``.  Else TraceError: the range must be given.
    Its lo is 0, or the smallest negative value a comparison of it with a constant needs to be undecided
    (``labels != -100``: -100; cross-entropy's ignore mask is such a comparison): real labels are padded with
    the ignore index, and a proof over [0, hi) would not cover them (a per-rank token count folded to a
    constant).  Then its range is [lo, hi].
    A bound holds only for the values that reach the index: through a ``where`` arm only when its condition
    redirects exactly one constant c of the input (``where(x != c, x, 0)``, the ignore index) that the range then
    holds; a ``where(ids < V, ids, 0)`` leaves every id defined, so it bounds nothing (red team s10: the OOV ids
    a rank program forgot to map were outside the inferred [0, V))."""
    shapes = {s.name: s.shape for s in specs}
    consts = {(n.get("name") or (n.get("outputs") or [None])[0]): (n.get("attrs") or {}).get("value")
              for n in nodes if n["op"] == "const" and not (n.get("attrs") or {}).get("shape")}
    for s in specs:
        if s.dtype != "int" or s.range is not None:
            continue
        names, same, bounds, lows = {s.name}, {s.name}, [], []  # same: its values only (no where arm)
        kept: dict[str, int] = {}  # its values except one constant c, redirected by a where: -> c
        masks: dict[str, tuple[str, Any, str]] = {}  # compare of (kept) values v with a constant c: -> (op, c, v)
        masked_use = False
        for n in nodes:
            ins = n.get("inputs", [])
            if not any(i in names for i in ins):
                continue
            out = n.get("name") or (n.get("outputs") or [None])[0]
            a = n.get("attrs") or {}
            if n["op"] in _COMPARES and len(ins) == 2 and (ins[0] in same) != (ins[1] in same):
                k = 0 if ins[0] in same else 1
                lo = _low_needed(n["op"], consts.get(ins[1 - k]), k == 1)
                if lo is not None:
                    lows.append(lo)
            if n["op"] in _COMPARES and len(ins) == 2 and ((ins[0] in same or ins[0] in kept) !=
                                                            (ins[1] in same or ins[1] in kept)):
                k = 0 if ins[0] in same or ins[0] in kept else 1
                masks[out] = (n["op"], consts.get(ins[1 - k]), ins[k])
            if n["op"] in _SHAPE_OPS and ins and ins[0] in names:
                names.add(out)
                if ins[0] in same:
                    same.add(out)
                if ins[0] in kept:
                    kept[out] = kept[ins[0]]
            elif n["op"] == "where" and len(ins) == 3 and (ins[1] in names or ins[2] in names):
                names.add(out)
                op, c, v = masks.get(ins[0], (None, None, None))
                arm = 1 if op == "ne" else 2 if op == "eq" else None
                if (arm is not None and ins[arm] == v and (v in same or kept.get(v) == c) and isinstance(c, int)
                        and not isinstance(c, bool) and ins[3 - arm] not in names):
                    kept[out] = c  # (the mask compares the very tensor of the arm, element for element)
            bounded = n["op"] in ("one_hot", "embedding", "embedding_backward")
            index = ins[0] if n["op"] == "one_hot" else ins[1] if len(ins) > 1 else None
            if bounded and index not in same and index not in kept:
                masked_use = masked_use or index in names
                continue
            if n["op"] == "one_hot" and isinstance(a.get("num_classes"), int):
                bounds.append((a["num_classes"], kept.get(index)))
            elif n["op"] == "embedding" and ins[0] in shapes:
                bounds.append((shapes[ins[0]][0], kept.get(index)))
            elif n["op"] == "embedding_backward" and isinstance(a.get("num_weights"), int):
                bounds.append((a["num_weights"], kept.get(index)))
        # a redirected constant c must lie in the range: below 0 it is lo (a compare with it), else below the bound
        bounds = [b for b, c in bounds if c is None or c < 0 or c < b]
        if not bounds:
            why = (" only through a where that redirects some of its values (every value is then defined: the "
                   "tracer cannot size it)" if masked_use else " no embedding table or class dim the tracer could size it by")
            raise TraceError(f"input {s.name!r}: int inputs need a 'range' (values lie in [0, range)); this one "
                             f"indexes{why}", "input")
        s.range = [min(lows), min(bounds)] if lows else min(bounds)


def _parse_layout(name: str, steps) -> list:
    """An input's ``layout``: [{"op": reshape | permute | transpose | flatten | squeeze | unsqueeze | pad | slice | view,
    "attrs": {...}}, ...] applied to the logical tensor before its placement (the plan's binding layout), e.g. a
    fused w_qkv whose rank r holds [q_r; k_r; v_r]."""
    from ..plan import LAYOUT_OPS

    if steps is None:
        return []
    if not isinstance(steps, (list, tuple)):
        raise TraceError(f"input {name!r}: layout must be a list of {{op, attrs}} steps", "input")
    out = []
    for j, st in enumerate(steps):
        if not isinstance(st, Mapping) or st.get("op") not in LAYOUT_OPS or not isinstance(st.get("attrs", {}), Mapping):
            raise TraceError(f"input {name!r}: layout[{j}] must be {{op, attrs}} with op one of {sorted(LAYOUT_OPS)}",
                             "input")
        out.append({"op": st["op"], "attrs": dict(st.get("attrs", {}))})
    return out


def laid_out_shape(spec: InputSpec) -> list[int]:
    """The input's shape after its layout (before the placement)."""
    from ..plan import Binding, layout_shape

    if not spec.layout:
        return list(spec.shape)
    b = Binding(spec.name, "spmd", spec.name, {}, [(st["op"], st["attrs"]) for st in spec.layout],
                f"inputs.{spec.name}")
    try:
        return [int(x) for x in layout_shape(b, tuple(spec.shape), {})]
    except PlanError as exc:
        raise TraceError(f"input {spec.name!r}: {exc}", "input") from None


def local_shape(spec: InputSpec, mesh: Mapping[str, int]) -> list[int]:
    s = laid_out_shape(spec)
    for a, text in spec.placement.items():
        p = parse_placement(text)
        if p.kind in ("S", "Z"):  # ZigzagShard: two chunks of 2p, as many elements as Shard's block
            what = "Shard" if p.kind == "S" else "ZigzagShard"
            if not -len(s) <= p.dim < len(s):
                raise TraceError(f"input {spec.name!r}: {what}({p.dim}) but the laid-out tensor has rank {len(s)}",
                                 "input")
            d = p.dim % len(s)
            parts = mesh[a] * (1 if p.kind == "S" else 2)
            if s[d] % parts and p.kind == "S":  # legal PyTorch (torch.chunk, DTensor's uneven Shard): UNKNOWN
                raise TraceError(f"input {spec.name!r}: dim {d} of size {s[d]} is not divisible by mesh axis {a!r} "
                                 f"of size {mesh[a]}: uneven shards have no plan form yet")
            if s[d] % parts:
                raise TraceError(f"input {spec.name!r}: dim {d} of size {s[d]} is not divisible by "
                                 f"2 x mesh axis {a!r} of size {mesh[a]}", "input")
            s[d] //= mesh[a]
    return s


def _fake_inputs(specs: Sequence[InputSpec], shapes: Sequence[Sequence[int]]):
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        xs = [torch.empty(sh, dtype=getattr(torch, s.torch_dtype)) if s.dtype == "float"
              else torch.zeros(sh, dtype=getattr(torch, s.torch_dtype)) for s, sh in zip(specs, shapes)]
    return xs


_DECOMP: dict | None = None


def decompositions() -> dict:
    """The decomposition table make_fx traces with: PyTorch's core ATen decompositions, except for the ops the
    converter (:mod:`.aten`) converts directly (their direct form is what the engine's rules speak of, e.g.
    ``nll_loss_forward``, ``_softmax_backward_data``, ``embedding_dense_backward``), plus the math-form
    decomposition of the fused CPU attention kernel and its backward (:func:`_sdpa_flash_cpu`)."""
    global _DECOMP
    if _DECOMP is None:
        import torch
        from torch._decomp import core_aten_decompositions

        from .aten import COMPLEX_TABLE, TABLE

        def converted(op) -> bool:
            names = (str(op), str(getattr(op, "overloadpacket", op)))
            return any(nm in TABLE or nm in COMPLEX_TABLE for nm in names)

        # (not torch._decomp.decomposition_table: it lowers some ops to prims, which have no conversion)
        table = {op: f for op, f in core_aten_decompositions().items() if not converted(op)}
        aten = torch.ops.aten
        fwd, bwd, efwd, ebwd, ffwd, fbwd = _sdpa_flash_cpu()
        table[aten._scaled_dot_product_flash_attention_for_cpu.default] = fwd
        table[aten._scaled_dot_product_flash_attention_for_cpu_backward.default] = bwd
        table[aten._scaled_dot_product_efficient_attention.default] = efwd
        table[aten._scaled_dot_product_efficient_attention_backward.default] = ebwd
        table[aten._scaled_dot_product_flash_attention.default] = ffwd
        table[aten._scaled_dot_product_flash_attention_backward.default] = fbwd
        _DECOMP = table
    return _DECOMP


def _sdpa_flash_cpu():
    """The fused CPU attention kernel and its backward, in the math form over the reals.

    Forward: ``P = softmax(scale * q @ k^T + mask)`` (a boolean mask / ``is_causal`` as a ``-inf`` fill,
    handled exactly by the converter's extended-real rules), ``out = P @ v``; with ``enable_gqa`` semantics
    when k / v have fewer heads (each k/v head repeated for its group of q heads).  The logsumexp output is
    uninitialised memory (``torch.empty``): the converter makes any read of it UNKNOWN.  Backward: the gradient
    of that forward, ``dV = P^T dO``, ``dS = softmax_backward(dO V^T, P)``, ``dQ = scale dS K``,
    ``dK = scale dS^T Q`` (summed over each k/v head's group), P recomputed from q and k.  The kernel computes its
    backward from the out and logsumexp it is given (``P = exp(S - lse)``, ``D = rowsum(dO * out)``), so the
    recomputed form equals it only for the forward's own outputs on the same inputs: each forward records its
    (q, k, v, mask, scale, causal, out, logsumexp) by fx node and version counter (a view's in-place write bumps
    it), and a backward given anything else (a custom autograd.Function passing a wrong logsumexp or a scaled
    out, a ring merging blocks) is UNKNOWN naming the op and the user's line.  Dropout must be 0."""
    import math as _m
    import os as _os
    import sys as _sys

    import torch
    from torch.fx.experimental.proxy_tensor import get_proxy_mode, get_proxy_slot
    from torch.multiprocessing.reductions import StorageWeakRef

    aten = torch.ops.aten
    torch_dir = _os.path.dirname(_os.path.abspath(torch.__file__))
    fields = ("query", "key", "value", "mask", "out", "logsumexp")

    def user_line():
        f = _sys._getframe(2)
        while f is not None:
            fn = _os.path.abspath(f.f_code.co_filename)
            if not (fn.startswith(torch_dir) or fn.startswith(_FRONTEND_DIR) or "/site-packages/" in fn):
                return f"{_os.path.basename(fn)}:{f.f_lineno}"
            f = f.f_back
        return None

    def unknown(op, why):
        src = user_line()
        raise TraceError(f"{op}{' at ' + src if src else ''}: {why}", "unsupported", op, src)

    def state(op, tensors):
        """(fx node through detach / alias, version) of each tensor (None for an absent mask; a constant the
        trace did not make: its identity, kept alive), and this trace's forward records."""
        mode = get_proxy_mode()
        if mode is None:
            unknown(op, "called outside make_fx tracing")
        recs, consts = mode.tracer.__dict__.setdefault("_tvcert_sdpa_forwards", ({}, []))
        out = []
        for t in tensors:
            px = None if t is None else get_proxy_slot(t, mode.tracer, None)
            if px is None:
                out.append(None if t is None else ("untraced", id(t), t._version))
                consts.append(t)
                continue
            n = px.proxy.node
            while n.op == "call_function" and n.target in (aten.detach.default, aten.alias.default):
                n = n.args[0]
            out.append((n, t._version))
        return tuple(out), recs, mode.tracer.graph

    def storage(t):
        return StorageWeakRef(t.untyped_storage())

    def remember(kind, op, q, k, v, mask, causal, s, out, lse):
        tensors = (q, k, v, mask, out, lse)
        st, recs, graph = state(op, tensors)
        stores = {storage(t): nm for nm, t in zip(fields, tensors) if t is not None}
        recs[st[4]] = ((kind, bool(causal), s) + st, stores, next(iter(reversed(graph.nodes))))

    def written(storages, since):
        """(field, node) of the first in-place write into the storage of a forward's tensor after ``since`` (through
        an alias with its own version counter, ``.data``), else None."""
        n = since.next
        while n.op != "root":
            sch = getattr(n.target, "_schema", None) if n.op == "call_function" else None
            for i, a in enumerate(sch.arguments if sch is not None else ()):
                if a.alias_info is None or not a.alias_info.is_write:
                    continue
                x = n.kwargs.get(a.name, n.args[i] if i < len(n.args) and not a.kwarg_only else None)
                for y in (x if isinstance(x, (list, tuple)) else [x]):
                    val = y.meta.get("val") if isinstance(y, torch.fx.Node) else None
                    if isinstance(val, torch.Tensor) and storage(val) in storages:
                        return storages[storage(val)], n
            n = n.next
        return None

    def require(kind, op, q, k, v, mask, causal, s, out, lse):
        """The backward's out / logsumexp are its forward's own outputs on the same inputs, unwritten since, else
        UNKNOWN."""
        st, recs, _ = state(op, (q, k, v, mask, out, lse))
        mine = (kind, bool(causal), s) + st
        rec, storages, since = recs.get(st[4], (None, None, None))
        if rec == mine:
            w = written(storages, since)
            if w is None:
                return
            unknown(op, f"its {w[0]} is written in place after its forward ({w[1].target} at {src_of(w[1])}); the "
                        f"recomputed backward would not see the write")
        model = ("tvcert models this backward by recomputing the attention probabilities from query and key, "
                 "which equals the kernel (P = exp(scale q k^T + mask - logsumexp), D = rowsum(grad_out * out)) "
                 "only for its forward's own out and logsumexp on the same inputs")
        if rec is None:
            unknown(op, f"its out is not an unmodified output of a traced {kind} attention forward; {model}")
        diff = [nm for nm, a, b in zip(("kernel", "is_causal", "scale") + fields, rec, mine) if a != b]
        unknown(op, f"its {', '.join(diff)} differ{'s' if len(diff) == 1 else ''} from the forward that produced its "
                    f"out (other values, or written in place since); {model}")

    def probs(q, k, v, is_causal, attn_mask, scale):
        E = q.shape[-1]
        s = (1.0 / _m.sqrt(E)) if scale is None else float(scale)
        g = q.shape[1] // k.shape[1]
        kr = k.repeat_interleave(g, dim=1) if g != 1 else k
        vr = v.repeat_interleave(g, dim=1) if g != 1 else v
        S = torch.matmul(q, kr.transpose(-2, -1)) * s
        if attn_mask is not None:
            S = S.masked_fill(attn_mask.logical_not(), float("-inf")) if attn_mask.dtype == torch.bool \
                else S + attn_mask
        if is_causal:
            L, Sk = q.shape[-2], k.shape[-2]
            keep = torch.ones(L, Sk, dtype=torch.bool).tril()
            S = S.masked_fill(keep.logical_not(), float("-inf"))
        P = aten._safe_softmax.default(S, -1)
        return P, kr, vr, s, g

    def forward(query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
        if dropout_p != 0.0:
            raise RuntimeError("tvcert: attention dropout is random; trace with dropout_p=0")
        P, kr, vr, s, g = probs(query, key, value, is_causal, attn_mask, scale)
        out = torch.matmul(P, vr)
        lse = torch.empty(query.shape[:-1], dtype=torch.float32)
        return out, lse, s

    def fwd(query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
        out, lse, s = forward(query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)
        remember("fused CPU", "aten._scaled_dot_product_flash_attention_for_cpu", query, key, value, attn_mask,
                 is_causal, s, out, lse)
        return out, lse

    def bwd(grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, *, attn_mask=None, scale=None,
            kind="fused CPU", op="aten._scaled_dot_product_flash_attention_for_cpu_backward"):
        if dropout_p != 0.0:
            raise RuntimeError("tvcert: attention dropout is random; trace with dropout_p=0")
        P, kr, vr, s, g = probs(query, key, value, is_causal, attn_mask, scale)
        require(kind, op, query, key, value, attn_mask, is_causal, s, out, logsumexp)
        dV = torch.matmul(P.transpose(-2, -1), grad_out)
        dP = torch.matmul(grad_out, vr.transpose(-2, -1))
        dS = aten._softmax_backward_data.default(dP, P, -1, P.dtype)
        dQ = torch.matmul(dS, kr) * s
        dK = torch.matmul(dS.transpose(-2, -1), query) * s
        if g != 1:
            B, Hk = key.shape[0], key.shape[1]
            dK = dK.reshape(B, Hk, g, *dK.shape[2:]).sum(2)
            dV = dV.reshape(B, Hk, g, *dV.shape[2:]).sum(2)
        return dQ, dK, dV

    def efwd(query, key, value, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False, *, scale=None):
        """The memory-efficient kernel (an additive ``attn_bias``): the same math form; its logsumexp and
        dropout seeds are uninitialised (reading them is UNKNOWN)."""
        out, lse, s = forward(query, key, value, dropout_p, is_causal, attn_mask=attn_bias, scale=scale)
        remember("memory-efficient", "aten._scaled_dot_product_efficient_attention", query, key, value, attn_bias,
                 is_causal, s, out, lse)
        return out, lse, torch.empty((), dtype=torch.int64), torch.empty((), dtype=torch.int64)

    def ebwd(grad_out, query, key, value, attn_bias, out, logsumexp, philox_seed, philox_offset, dropout_p,
             grad_input_mask, is_causal=False, *, scale=None):
        if dropout_p != 0.0:
            raise RuntimeError("tvcert: attention dropout is random; trace with dropout_p=0")
        P, kr, vr, s, g = probs(query, key, value, is_causal, attn_bias, scale)
        require("memory-efficient", "aten._scaled_dot_product_efficient_attention_backward", query, key, value,
                attn_bias, is_causal, s, out, logsumexp)
        if g != 1:
            raise RuntimeError("tvcert: the memory-efficient attention kernel takes as many k/v heads as q heads")
        dV = torch.matmul(P.transpose(-2, -1), grad_out)
        dP = torch.matmul(grad_out, vr.transpose(-2, -1))
        dS = aten._softmax_backward_data.default(dP, P, -1, P.dtype)
        dQ = torch.matmul(dS, kr) * s
        dK = torch.matmul(dS.transpose(-2, -1), query) * s
        dB = None
        if attn_bias is not None and grad_input_mask[3]:  # d(scores)/d(bias) = 1: dS summed over broadcast dims
            dB = dS
            while dB.dim() > attn_bias.dim():
                dB = dB.sum(0)
            dB = dB.sum([i for i, n in enumerate(attn_bias.shape) if n == 1 and dB.shape[i] != 1], keepdim=True) \
                if any(n == 1 and dB.shape[i] != 1 for i, n in enumerate(attn_bias.shape)) else dB
        return dQ, dK, dV, dB

    def ffwd(query, key, value, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None):
        """The CUDA flash kernel: the same math form; logsumexp, sequence offsets, RNG state and debug mask are
        uninitialised (reading them is UNKNOWN); max_q / max_k are the sequence lengths."""
        if return_debug_mask:
            raise RuntimeError("tvcert: flash attention's debug mask is not traced")
        out, lse, s = forward(query, key, value, dropout_p, is_causal, scale=scale)
        out = torch.empty_like(query).copy_(out)  # the kernel's strides (its meta function's), which DTensor relies on
        remember("CUDA flash", "aten._scaled_dot_product_flash_attention", query, key, value, None, is_causal, s,
                 out, lse)
        e = torch.empty((), dtype=torch.int64)
        # cum_seq_q / cum_seq_k are undefined for dense inputs (None, as the kernel's meta function gives; DTensor
        # wraps them as scalars-or-nothing)
        return (out, lse, None, None, query.shape[-2], key.shape[-2], e, torch.empty((), dtype=torch.int64),
                torch.empty(0, dtype=query.dtype))

    def fbwd(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p,
             is_causal, philox_seed, philox_offset, *, scale=None):
        dq, dk, dv = bwd(grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, scale=scale,
                         kind="CUDA flash", op="aten._scaled_dot_product_flash_attention_backward")
        return tuple(torch.empty_like(t).copy_(g) for t, g in ((query, dq), (key, dk), (value, dv)))  # its strides

    return fwd, bwd, efwd, ebwd, ffwd, fbwd


def _returned(result, params: Sequence[str]):
    """(loss, None) for a loss to differentiate, or (loss, outputs) for outputs the program computed itself.

    Returned as: a 0-d loss tensor (or a tuple whose first element is one); ``(loss, {param: grad})``, a loss
    with its own gradients alongside (keys ``p`` or ``grad_p``, every parameter); or a dict
    ``{name: tensor}`` of named outputs (``loss``, ``grad_<p>``, updated parameters, optimizer state)."""
    import torch

    def tensor(name, t):
        if not isinstance(t, torch.Tensor):
            raise TraceError(f"the traced function returns {type(t).__name__} as {name!r}, not a tensor", "input")
        return t.detach()

    if isinstance(result, Mapping):
        if not result:
            raise TraceError("the traced function returns an empty dict of outputs", "input")
        return None, {str(k): tensor(str(k), v) for k, v in result.items()}
    if isinstance(result, (tuple, list)) and len(result) == 2 and isinstance(result[1], Mapping):
        loss, gd = result
        keys = {str(k).removeprefix("grad_") if str(k).removeprefix("grad_") in params else str(k) for k in gd}
        if keys != set(params):
            raise TraceError(f"the traced function returns (loss, gradients) with gradients of {sorted(keys)}, but "
                             f"the parameters are {sorted(params)}", "input")
        by = {(str(k).removeprefix("grad_") if str(k).removeprefix("grad_") in params else str(k)): v
              for k, v in gd.items()}
        _scalar(loss)
        return loss, {"loss": tensor("loss", loss), **{f"grad_{p}": tensor(f"grad_{p}", by[p]) for p in params}}
    loss = result[0] if isinstance(result, (tuple, list)) and result else result
    _scalar(loss)
    return loss, None


def _scalar(loss) -> None:
    import torch

    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        raise TraceError("the traced function must return a scalar loss tensor, (loss, {param: gradient}) or a dict "
                         "of named outputs", "input")


def _gradients(loss, kw: Mapping[str, Any], params: Sequence[str], via_backward: bool) -> dict:
    """``grad_<p>`` of every parameter.  A program that ran the backward itself (``loss.backward()``, the
    gradients are in ``.grad``) is read as it is; hooks it registered on a parameter while it ran (Hugging Face's
    ``replicated_with_grad_allreduce`` registers its all_reduce at the first forward) are fired by running
    ``loss.backward()``, inside the trace; else ``torch.autograd.grad``."""
    import torch

    leaves = [kw[p] for p in params]
    if not params:
        return {}
    ran = any(t.grad is not None for t in leaves)
    if not ran:
        if not loss.requires_grad:
            raise TraceError("the traced function returns a loss that does not require grad and computed no "
                             "gradients (no .grad is set): return (loss, {param: gradient}) or a dict of outputs "
                             "for a program that computes its own gradients", "input")
        hooked = [p for p, t in zip(params, leaves) if getattr(t, "_post_accumulate_grad_hooks", None)]
        for p in hooked:  # a hook that cannot be traced is UNKNOWN naming the parameter, never a crash / REFUTED
            hooks = kw[p]._post_accumulate_grad_hooks
            for k, h in list(hooks.items()):
                hooks[k] = _guarded_hook(h, p)
        if via_backward or hooked:
            loss.backward()
        else:
            gs = torch.autograd.grad(loss, leaves, allow_unused=True)
            return {f"grad_{p}": torch.zeros_like(t) if g is None else g for p, t, g in zip(params, leaves, gs)}
    return {f"grad_{p}": torch.zeros_like(t) if t.grad is None else t.grad for p, t in zip(params, leaves)}


def _guarded_hook(h, param: str):
    def fail(why: str):
        raise TraceError(f"the gradient hook {getattr(h, '__qualname__', h)!r} registered on parameter {param!r} "
                         f"while the program ran cannot be traced ({why}): its gradient synchronisation is unknown",
                         "unsupported", "grad hook")

    def hook(t):
        import torch.fx.traceback as fxtb

        old = fxtb.current_meta.get("custom")  # "custom" is copied onto every node: the hook's ops are marked
        fxtb.current_meta["custom"] = {**(old or {}), "tvcert_hook": param}
        try:
            out = h(t)
        except TraceError:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure of the hook's own code
            fail(f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}")
        finally:
            if old is None:
                fxtb.current_meta.pop("custom", None)
            else:
                fxtb.current_meta["custom"] = old
        if out is not None:
            fail(f"it returns {type(out).__name__}, not None")
    return hook


@contextlib.contextmanager
def _dtensor_sdpa():
    """``F.scaled_dot_product_attention`` of DTensors (PyTorch's DTensor test Transformer: head-sharded q/k/v):
    on SDPA's math backend DTensor runs the composite, which mixes a plain causal-mask tensor into DTensor ops and
    fails.  When q, k and v have the same placements, each Replicate or Shard of the batch or head dim (0 or 1),
    attention is independent per batch row and head, and DTensor's own attention strategy computes it on the
    local shards; so does this, on the math backend like the logical model (the same form for the engine).  A
    mask, dropout, GQA or any other placement keeps the normal path."""
    import torch
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.overrides import TorchFunctionMode

    sdpa = torch.nn.functional.scaled_dot_product_attention

    def local(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        qkv = (query, key, value)
        if attn_mask is not None or dropout_p != 0.0 or enable_gqa or not all(isinstance(t, DTensor) for t in qkv):
            return None
        pl = query.placements
        if any(t.placements != pl or t.device_mesh != query.device_mesh for t in qkv) or \
                not all(isinstance(p, Replicate) or (isinstance(p, Shard) and p.dim in (0, 1)) for p in pl) or \
                query.shape[:2] != key.shape[:2] or key.shape != value.shape[:-1] + key.shape[-1:]:
            return None
        out = sdpa(*(t.to_local(grad_placements=pl) for t in qkv), is_causal=bool(is_causal), scale=scale)
        return DTensor.from_local(out, query.device_mesh, pl, run_check=False)

    class Mode(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is sdpa:
                out = local(*args, **kwargs)
                if out is not None:
                    return out
            return func(*args, **kwargs)

    with Mode():
        yield


def _op_name(x):
    """``dist.ReduceOp.X`` as the functional collectives spell it (``"x"``); anything else unchanged."""
    import torch.distributed as dist

    return x.name.lower() if isinstance(x, dist.ReduceOp.RedOpType) else x


@contextlib.contextmanager
def _traceable_collectives():
    """``torch.distributed``'s classic collectives (``dist.all_reduce(t, group=g)``, what gradient hooks call)
    traced as their functional form copied into the buffer: PyTorch's own remapping for tracing
    (``_functional_collectives.traceable_collective_remaps``).  ``async_op=True`` keeps the classic call (which
    the converter refuses: UNKNOWN); point-to-point ops are not remapped."""
    import torch.distributed as dist
    import torch.distributed._functional_collectives as fc
    import torch.distributed.distributed_c10d as c10d

    saved = []
    for orig, new in getattr(fc, "traceable_collective_remaps", {}).items():
        if orig.__name__ in ("isend", "irecv", "batch_isend_irecv"):
            continue

        def wrap(*a, _orig=orig, _new=new, **k):
            if k.get("async_op"):
                return _orig(*a, **k)
            # the remaps take the functional form's op names ("avg"); a classic call passes dist.ReduceOp.AVG
            return _new(*(_op_name(x) for x in a), **{n: _op_name(x) for n, x in k.items()})

        for mod in (dist, c10d):
            if getattr(mod, orig.__name__, None) is orig:
                saved.append((mod, orig.__name__, orig))
                setattr(mod, orig.__name__, wrap)
    try:
        yield
    finally:
        for mod, name, orig in reversed(saved):
            setattr(mod, name, orig)


@contextlib.contextmanager
def _data_assignment_refused():
    """``t.data = v`` while the program is traced is UNKNOWN: it swaps ``t``'s values without an op make_fx records,
    so the reads of ``t`` after it would be converted with the old values (``y.data = all_reduce(y.data)``, a
    second reduction, came out VERIFIED; red team s10).  Reading ``.data`` is untouched."""
    import torch

    desc = torch._C.TensorBase.__dict__["data"]

    def assign(self, value):
        f = sys._getframe(1)
        where = f"{os.path.basename(f.f_code.co_filename)}:{f.f_lineno}"
        raise TraceError(f"a tensor's .data is assigned at {where} while the program is traced: make_fx records no op "
                         f"for it, so later reads would see the old values", "unsupported", ".data assignment", where)

    before = torch.Tensor.__dict__.get("data")  # (nested traces: the outer one's property comes back)
    torch.Tensor.data = property(desc.__get__, assign, doc=desc.__doc__)
    try:
        yield
    finally:
        if before is not None:
            torch.Tensor.data = before
        elif "data" in torch.Tensor.__dict__:
            del torch.Tensor.data


def _trace_joint(fn: Callable[..., Any], specs: Sequence[InputSpec], shapes, pre_args: tuple = (),
                 grad_sync: Callable | None = None, sync_args: tuple = (), backward: bool = False):
    """make_fx the joint program: (loss, *grads of params).  The gradients come from ``torch.autograd.grad``;
    code that refuses it (reentrant activation checkpointing) is traced again with ``loss.backward()``, and so
    is code whose gradients are produced by hooks that only ``backward()`` fires (``backward=True``)."""
    if backward:
        return _trace_joint_once(fn, specs, shapes, pre_args, grad_sync, sync_args, True)
    first: list = []
    try:
        return _trace_joint_once(fn, specs, shapes, pre_args, grad_sync, sync_args, False, first)
    except RuntimeError as exc:
        if "incompatible with .grad()" not in str(exc) and "not compatible with .grad()" not in str(exc):
            raise
    # The program ran once already in this process, where a real rank runs it once: a forward reading Python state
    # it changes (a call counter) would be traced as its second call.  Its forward must record the same ops again.
    again: list = []
    out = _trace_joint_once(fn, specs, shapes, pre_args, grad_sync, sync_args, True, again)
    if not first or first != again:
        at = next((i for i, (a, b) in enumerate(zip(first, again)) if a != b), min(len(first), len(again)))
        raise TraceError(f"the program refuses torch.autograd.grad (reentrant activation checkpointing), so it was "
                         f"traced a second time with loss.backward(), and its forward recorded other ops the second "
                         f"time (from op {at}): it reads Python state it changes, and the trace would not be what a "
                         f"real rank's first call runs", "unsupported", "second trace")
    return out


def _forward_signature() -> list:
    """The ops make_fx recorded so far (target, arguments with nodes as their positions), to compare two calls."""
    import torch
    from torch.fx.experimental.proxy_tensor import get_proxy_mode

    mode = get_proxy_mode()
    if mode is None:
        return []
    pos: dict = {}

    def enc(a):
        if isinstance(a, torch.fx.Node):
            return ("node", pos.get(a))
        if isinstance(a, (list, tuple)):
            return tuple(enc(b) for b in a)
        if isinstance(a, dict):
            return tuple(sorted((str(k), enc(v)) for k, v in a.items()))
        return repr(a)

    sig = []
    for i, nd in enumerate(mode.tracer.graph.nodes):
        pos[nd] = i
        sig.append((nd.op, str(nd.target), enc(nd.args), enc(nd.kwargs)))
    return sig


def _trace_joint_once(fn, specs, shapes, pre_args, grad_sync, sync_args, via_backward: bool,
                      forward_sig: list | None = None):
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx
    import torch.fx.traceback as fxtb

    names = [s.name for s in specs]
    params = [s.name for s in specs if s.param]

    out_names: list[str] = []

    def joint(*flat):
        kw = {}
        for n, t, s in zip(names, flat, specs):
            kw[n] = t.detach().requires_grad_(True) if s.param else t
        with _traceable_collectives(), _dtensor_sdpa():
            result = fn(*pre_args, **kw)
            if forward_sig is not None:  # (_trace_joint compares a second trace's forward with the first's)
                forward_sig[:] = _forward_signature()
            loss, given = _returned(result, params)
            if given is not None:  # the program's own outputs (its own gradients, an optimizer step): as they are
                outs = given
            else:
                outs = {"loss": loss, **_gradients(loss, kw, params, via_backward)}
                if grad_sync is not None:
                    gd = dict(grad_sync(*sync_args, {p: outs[f"grad_{p}"] for p in params}))
                    outs.update({f"grad_{p}": gd[p] for p in params})
        clash = sorted(set(outs) & set(names))
        if clash:
            raise TraceError(f"output {clash[0]!r} has an input's name: name an updated parameter e.g. "
                             f"'new.{clash[0]}'", "input")
        out_names[:] = list(outs)
        return tuple(outs.values())

    xs = _fake_inputs(specs, shapes)
    import logging

    log = logging.getLogger("torch._subclasses.fake_tensor")  # it logs every failing meta kernel
    level = log.level
    log.setLevel(logging.CRITICAL)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from . import grad_origin

    try:
        sites: set = set()  # backward ops get their forward op's line and module (grad_origin)
        with _user_stack_traces(), fxtb.preserve_node_meta(), _module_paths(), sdpa_kernel([SDPBackend.MATH]), \
                grad_origin.backward_origins(sites), _data_assignment_refused():
            gm = make_fx(joint if joint_transform is None else joint_transform(joint), tracing_mode="fake",
                         record_stack_traces=True,
                         decomposition_table=decompositions())(*xs)
        grad_origin.copy_forward_origins(gm, sites, src_of)
    finally:
        log.setLevel(level)
    return gm, list(out_names)


def _convert(gm, names, resolver=None, mesh: Mapping[str, int] | None = None,
             int_bounds: Mapping[str, tuple[int, int]] | None = None) -> tuple[list[IRNode], list[Any]]:
    conv = _ModuleConverter(gm, names, resolver, src_of)
    conv.int_bounds = dict(int_bounds or {})
    try:
        nodes, outs = conv.run()
    except Unconverted as exc:
        near = [conv.cur, *conv.cur.users] if conv.cur is not None else []  # a get_attr: the op reading it
        hook = next((m.meta["custom"]["tvcert_hook"] for m in near
                     if isinstance(m.meta.get("custom"), dict) and m.meta["custom"].get("tvcert_hook")), None)
        note = f" (in the gradient hook registered on parameter {hook!r}: its gradient synchronisation is unknown)" \
            if hook else ""
        raise TraceError(str(exc) + note, "unsupported", exc.op, exc.src) from None
    if mesh:
        def size(axis):
            n = 1
            for a in ([axis] if isinstance(axis, str) else axis):
                n *= mesh[a]
            return n
        nodes = fuse_collectives(nodes, outs, size)
        from .buffers import unpack_flat_collectives  # FSDP2's flat all-gather / reduce-scatter, per tensor

        nodes = unpack_flat_collectives(nodes, outs, size)
    return nodes, outs


# ====================================================================== SPMD compression
def _leaves(x, path=()):
    if isinstance(x, dict):
        for k in sorted(x):
            yield from _leaves(x[k], path + (k,))
    elif isinstance(x, list):
        for i, y in enumerate(x):
            yield from _leaves(y, path + (i,))
    else:
        yield path, x


def _set_leaf(x, path, v):
    for p in path[:-1]:
        x = x[p]
    x[path[-1]] = v


def _affine(values: dict[tuple[int, ...], Any], axes, sizes) -> str | None:
    """Fit v(coords) = b + sum_a k_a * coord_a exactly, as a dim expression; None if impossible."""
    zero = tuple(0 for _ in axes)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values.values()):
        return None
    b = values[zero]
    ks = []
    for i in range(len(axes)):
        if sizes[i] == 1:
            ks.append(0)
            continue
        unit = list(zero)
        unit[i] = 1
        ks.append(values[tuple(unit)] - b)
    for c, v in values.items():
        if b + sum(k * ci for k, ci in zip(ks, c)) != v:
            return None
    terms = [f"rank.{a}*{k}" if k != 1 else f"rank.{a}" for a, k in zip(axes, ks) if k != 0]
    if b != 0 or not terms:
        terms.append(str(b))
    return "+".join(terms).replace("+-", "-")


def spmd_compress(per_rank: dict[tuple[int, ...], list[dict]], axes, sizes) -> tuple[list[dict], list[str]]:
    """One program for all ranks, or TraceError naming the first structural difference.

    Returns (nodes, notes) where notes lists the attributes that became rank expressions."""
    coords = sorted(per_rank)
    base = per_rank[coords[0]]
    notes = []
    for c in coords[1:]:
        other = per_rank[c]
        if len(other) != len(base):
            i = next((j for j, (m, n) in enumerate(zip(other, base)) if (m["op"], m["inputs"]) != (n["op"], n["inputs"])),
                     min(len(other), len(base)))
            at = "".join(f"; op {i} on rank {r}: {p[i]['op']} at {p[i].get('src')}" for r, p in ((coords[0], base), (c, other))
                         if i < len(p))
            raise TraceError(f"rank {c} traces {len(other)} ops but rank {coords[0]} traces {len(base)}: "
                             f"the ranks run different programs (no SPMD form){at}", "spmd",
                             base[i]["op"] if i < len(base) else None, base[i].get("src") if i < len(base) else None)
    out = []
    for i, n in enumerate(base):
        n2 = dict(n)
        n2["attrs"] = dict(n.get("attrs", {}))
        for c in coords[1:]:
            m = per_rank[c][i]
            if (m["op"], m["inputs"], m.get("name"), m.get("outputs")) != (n["op"], n["inputs"], n.get("name"), n.get("outputs")):
                raise TraceError(f"op {i} differs between ranks: {n['op']}({', '.join(n['inputs'])}) at {n.get('src')} on "
                                 f"rank {coords[0]} vs {m['op']}({', '.join(m['inputs'])}) at {m.get('src')} on rank {c}",
                                 "spmd", n["op"], n.get("src"))
        leaves = [dict(_leaves(per_rank[c][i].get("attrs", {}))) for c in coords]
        keys = set(leaves[0])
        if any(set(lv) != keys for lv in leaves[1:]):
            raise TraceError(f"op {i} ({n['op']} at {n.get('src')}) has different attributes on different ranks", "spmd",
                             n["op"], n.get("src"))
        for path in sorted(keys, key=str):
            vals = {c: lv[path] for c, lv in zip(coords, leaves)}
            if len(set(map(repr, vals.values()))) == 1:
                continue
            expr = _affine(vals, axes, sizes)
            kind = getattr(get_op(n["op"]).attrs.get(path[0]), "kind", None)
            if expr is not None and kind in ("int", "ints"):  # a literal-only attribute: no rank expression
                raise TraceError(f"attribute {'.'.join(map(str, path))} of op {i} ({n['op']} at {n.get('src')}) takes "
                                 f"rank-dependent values {sorted(set(vals.values()), key=repr)} ({expr}), but "
                                 f"{n['op']} needs the same {path[0]} on every rank: the ranks run different programs "
                                 f"(no SPMD form)", "spmd", n["op"], n.get("src"))
            if expr is None:
                raise TraceError(f"attribute {'.'.join(map(str, path))} of op {i} ({n['op']} at {n.get('src')}) takes "
                                 f"rank-dependent values {sorted(set(vals.values()), key=repr)} that are not affine in "
                                 f"the mesh coordinates", "spmd", n["op"], n.get("src"))
            _set_leaf(n2["attrs"], path, expr)
            notes.append(f"{n2.get('name') or n2.get('outputs')}: {n['op']} attribute "
                         f"{'.'.join(map(str, path))} = {expr}")
        if not n2["attrs"]:
            n2.pop("attrs")
        out.append(n2)
    return out, notes


# ====================================================================== the API
def trace_plan(logical: Callable[..., Any], parallel: Callable[..., Any], *, inputs: Mapping[str, Mapping[str, Any]],
               mesh: Mapping[str, int], name: str = "traced", description: str | None = None,
               grad_sync: Callable | None = None, output_placements: Mapping[str, Mapping[str, str]] | None = None,
               parallel_setup: Callable | None = None, validate: bool = True, parallel_backward: bool = False) -> dict:
    """Trace ``logical`` (degree 1) and ``parallel`` (every rank of ``mesh``) into a plan dict.

    ``inputs``: name -> {shape, dtype ("float"|"int"), range (int inputs: R or [lo, hi]; default: what they
    index, lo from an ignore index or a negative compare), placement {axis: text}, layout [{op, attrs}]
    (applied to the logical tensor before the placement), param (bool: differentiate the loss with respect to it)}; shapes are logical (full) shapes.
    ``logical`` / ``parallel`` return a loss, ``(loss, {param: grad})`` or a dict of named outputs
    (:func:`_returned`); gradients a program computed with its own ``loss.backward()`` are read from ``.grad``.
    ``grad_sync(ctx, grads) -> grads`` runs on each rank after autograd, inside the trace.
    ``parallel_setup(ctx)`` runs on each rank before tracing (outside the trace); its result is
    ``ctx.state`` (build and parallelize modules there).
    ``parallel_backward``: the parallel program is traced with ``loss.backward()`` (not ``autograd.grad``), so
    the framework's post-accumulate-grad hooks (DDP's reducer) run inside the trace; gradients are read from
    each parameter's ``.grad`` (``grad_sync`` may read them from where the framework left them instead).
    Raises :class:`TraceError` (unsupported op, ranks not SPMD, bad mapping)."""
    mesh = {str(a): int(s) for a, s in mesh.items()}
    if not mesh or any(s <= 0 for s in mesh.values()):
        raise TraceError(f"mesh {mesh} needs positive axis sizes", "input")
    specs = _parse_inputs(inputs, mesh)
    names = [s.name for s in specs]
    axes, sizes = tuple(mesh), tuple(mesh.values())
    world = 1
    for s in sizes:
        world *= s

    from torch.distributed.device_mesh import init_device_mesh

    global _progress_where
    lshapes = [local_shape(s, mesh) for s in specs]
    declared = int_bounds_of(specs)  # before inference: an inferred range keeps the ignore mask
    late: dict[str, Any] = {}  # what a rank's conversion needs from the logical trace (released to its process)

    def one_rank(r: int):
        global _progress_where
        c = coords_of(r, sizes)
        _progress_where = f"rank {r + 1}/{world}"
        _tick(f"tracing rank {r + 1}/{world} (coordinates {dict(zip(axes, c))})")
        t0 = time.process_time()
        with fake_world(r, world):
            dm = init_device_mesh("cpu", sizes, mesh_dim_names=axes)
            ctx = MeshCtx(axes, sizes, r, dict(zip(axes, c)), dm)
            if parallel_setup is not None:
                with _setup_collectives_refused(r):
                    ctx.state = parallel_setup(ctx)
            t1 = time.process_time()
            try:
                gm_r, pout_names = _trace_joint(parallel, specs, lshapes, pre_args=(ctx,), grad_sync=grad_sync, sync_args=(ctx,),
                                        backward=parallel_backward)
            except TraceError:
                raise
            except Exception as exc:  # the user's parallel code itself fails (shapes, sharding propagation)
                from .moe import data_dependent  # values fake tensors lack (MoE routing): UNKNOWN, never REFUTED

                dd = data_dependent(exc, f"rank {r} (coordinates {dict(zip(axes, c))})")
                if dd is not None:
                    raise dd from exc
                src = _exc_src(exc)
                first = (str(exc).strip().splitlines() or [type(exc).__name__])
                mod = getattr(exc, "_tvcert_module", None)
                tool = _tool_frame_in_failure(exc)
                where = (f"on rank {r} (coordinates {dict(zip(axes, c))})"
                         f"{' in module ' + mod if mod else ''}{' at ' + src if src else ''}")
                if tool is not None:  # our own model of an op / collective / hook failed: not a witness
                    raise TraceError(f"the trace's own model failed at {tool} {where}: "
                                     f"{type(exc).__name__}: {' '.join(first)[:800]}", "unsupported", None, src) from exc
                raise TraceError(f"the parallel program fails {where}: "
                                 f"{type(exc).__name__}: {' '.join(first)[:800]}", "crash", None, src) from exc
            t2 = time.process_time()
            pnodes, pouts = _convert(gm_r, names, _axis_resolver(axes, sizes, r), mesh, declared)
            t3 = time.process_time()
        want = late["out_names"]
        if sorted(pout_names) != sorted(want):
            raise TraceError(f"the parallel program's outputs {pout_names} are not the logical model's {want}", "input")
        pouts = [pouts[pout_names.index(o)] for o in want]
        return (*_finish_outputs(pnodes, pouts, want, names), (t1 - t0, t2 - t1, t3 - t2))

    try:
        jobs = rank_jobs if rank_jobs is not None else default_jobs()
    except ValueError as exc:
        raise TraceError(str(exc), "input") from None
    # every rank once, each in a fresh process forked from the state before the logical trace (a real rank never runs
    # the logical model, nor another rank), released with the logical outputs' names (rank_workers.py)
    decompositions()  # tvcert's own table (no user state): built once here, not in every rank's process
    ranks = rank_workers.start(one_rank, world, jobs, late.update, (sys.modules[__name__], "progress_hook"))
    # ---- logical
    _progress_where = "logical model"
    _tick("tracing the logical model")
    t_start, c_start = time.perf_counter(), time.process_time()
    try:
        try:
            gm, out_names = _trace_joint(logical, specs, [s.shape for s in specs])
        except TraceError:
            raise
        except Exception as exc:
            from .moe import data_dependent  # values fake tensors lack (MoE routing): UNKNOWN, not bad input

            dd = data_dependent(exc, "the logical model")
            if dd is not None:
                raise dd from exc
            src = _exc_src(exc)
            raise TraceError(f"the logical model fails{' at ' + src if src else ''}: {type(exc).__name__}: {exc}",
                             "input", None, src) from exc
        lnodes, louts = _convert(gm, names, int_bounds=declared)
        _default_int_ranges(specs, [n.to_json() for n in lnodes])
        lnodes_j, lout_j = _finish_outputs(lnodes, louts, out_names, names)
    except BaseException:
        ranks.close()
        raise
    ranks.release({"out_names": out_names})

    # ---- parallel, per rank
    per_rank: dict[tuple[int, ...], list[dict]] = {}
    outs_by_rank: dict[tuple[int, ...], list[str]] = {}
    pouts_ref = None

    t_ranks, c_ranks = time.perf_counter(), time.process_time()
    secs = [0.0, 0.0, 0.0]  # the ranks' setup, make_fx and conversion CPU seconds (summed over ranks)
    try:
        for r, (nodes_j, outs_j, took) in ranks.results():
            secs = [a + b for a, b in zip(secs, took)]
            if pouts_ref is None:
                pouts_ref = outs_j
            elif outs_j != pouts_ref and spmd_fallback is None:
                raise TraceError(f"rank {r} returns different tensors than rank 0", "spmd")
            per_rank[coords_of(r, sizes)] = nodes_j
            outs_by_rank[coords_of(r, sizes)] = outs_j
            if ranks.jobs > 1:
                _tick(f"traced {r + 1}/{world} ranks")
    finally:
        ranks.close()
    _progress_where = ""
    t_compress = time.perf_counter()
    try:
        if any(o != pouts_ref for o in outs_by_rank.values()):
            raise TraceError("the ranks return different tensors", "spmd")
        pnodes_j, notes = spmd_compress(per_rank, axes, sizes)
    except TraceError as exc:
        if exc.kind != "spmd" or spmd_fallback is None:
            raise
        pnodes_j, pouts_ref, notes = spmd_fallback(per_rank, outs_by_rank, axes, sizes, exc)
    t_done = time.perf_counter()

    # ---- placements
    in_pl = {s.name: {"local": s.name, "placement": dict(s.placement), **({"layout": s.layout} if s.layout else {})}
             for s in specs}
    out_pl = {o: {"local": local, **_output_binding(o, specs)} for o, local in zip(out_names, pouts_ref)}
    for k, v in (output_placements or {}).items():
        if k not in out_pl:
            raise TraceError(f"output_placements names {k!r}, which is not an output {list(out_pl)}", "input")
        out_pl[k]["placement"] = dict(v)

    def decl(s, shape):
        d = {"name": s.name, "shape": list(shape), "dtype": s.dtype}
        if s.range is not None:
            d["range"] = range_json(s.range)
        return d

    plan = {
        "tvcert_plan": 1,
        "name": name,
        "description": description or f"traced from {getattr(parallel, '__module__', '?')}.{getattr(parallel, '__qualname__', '?')}",
        "dims": {a: s for a, s in mesh.items()},
        "mesh": {a: a for a in mesh},
        "logical": {"inputs": [decl(s, s.shape) for s in specs], "nodes": lnodes_j, "outputs": lout_j},
        "parallel": [{"name": "spmd", "inputs": [decl(s, sh) for s, sh in zip(specs, lshapes)],
                      "nodes": pnodes_j, "outputs": list(pouts_ref)}],
        "inputs": in_pl,
        "outputs": out_pl,
    }
    if notes:
        plan["description"] += "; rank-dependent attributes: " + "; ".join(notes)
    if validate:
        try:
            load_plan(plan)
        except IndexRangePlanError as exc:  # a declared range the program cannot take (ids = -100 into a table)
            raise TraceError(f"the traced plan cannot be verified over its declared int ranges: {exc.msg}",
                             "unsupported", "declared int range") from None
        except PlanError as exc:
            raise TraceError(f"the traced plan does not validate: {exc}", "internal") from None
    if stats_hook is not None:  # where the time went (bench/trace_cost.py): wall seconds, the ranks' CPU seconds
        stats_hook({"world": world, "traced_ranks": len(per_rank), "jobs": ranks.jobs,
                    "logical_s": t_ranks - t_start, "logical_cpu_s": c_ranks - c_start,
                    "ranks_wall_s": t_compress - t_ranks, "rank_setup_s": secs[0], "rank_trace_s": secs[1],
                    "rank_convert_s": secs[2], "compress_s": t_done - t_compress,
                    "validate_s": time.perf_counter() - t_done})
    return plan


def _output_binding(out: str, specs: Sequence[InputSpec]) -> dict:
    """The default placement (and layout) of an output: that of the input it is named after -- ``grad_<p>``,
    ``new.<p>`` (an updated parameter) or ``<state>.<p>`` / ``<state>_<p>`` (optimizer state, e.g. ``exp_avg.<p>``),
    the longest input name matching --, else Replicate (``loss``, anything else)."""
    best = None
    for s in specs:
        n = s.name
        if out == n or out.endswith("." + n) or out.endswith("_" + n):
            if best is None or len(n) > len(best.name):
                best = s
    if best is None:
        return {"placement": {}}
    return {"placement": dict(best.placement), **({"layout": best.layout} if best.layout else {})}


def _finish_outputs(nodes: list[IRNode], outs: list[Any], out_names: list[str], input_names: list[str]):
    """Nodes as JSON and output tensor names.  Outputs are renamed to ``loss`` / ``grad_<p>`` when the
    tensor is produced by a node (so logical and parallel outputs line up by name)."""
    js = [n.to_json() for n in nodes]
    for n, d in zip(nodes, js):
        if getattr(n, "module", None):
            d["module"] = n.module
            lab = layer_of(n.module)
            if lab is not None:
                d["layer"] = lab
    rename: dict[str, str] = {}
    produced = {o for n in nodes for o in n.outputs}
    final = []
    for want, have in zip(out_names, outs):
        if not isinstance(have, str):
            raise TraceError(f"output {want} is not a tensor ({have!r})", "unsupported")
        if have in produced and have not in rename and want not in produced and want not in input_names:
            rename[have] = want
            final.append(want)
        else:
            final.append(rename.get(have, have))
    if rename:
        for n in js:
            n["inputs"] = [rename.get(x, x) for x in n["inputs"]]
            if "name" in n:
                n["name"] = rename.get(n["name"], n["name"])
            if "outputs" in n:
                n["outputs"] = [rename.get(x, x) for x in n["outputs"]]
    return js, final

