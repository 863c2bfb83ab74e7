"""A torchtitan job config (TOML) -> the parallelization :mod:`tvcert.frontends.torchtitan` traces.

Why a reader of our own: torchtitan 0.3.0 has no TOML reader (its ``ConfigManager`` takes ``--module`` /
``--config`` naming a Python ``config_registry`` function, then tyro overrides), and its top-level
``Trainer.Config`` cannot be imported without the trainer's data-loading dependencies (``torchdata``).  The
TOML keeps the field names of torchtitan's job config; each section we read is checked by torchtitan's
own dataclass (``ParallelismConfig``, ``TrainingConfig``, ``CompileConfig``, the activation-checkpointing
policy configs), so a key torchtitan does not know is bad input naming it.

Read: ``[model] name / flavor`` (``llama3`` / ``deepseek_v3`` / ``qwen3``, ``debugmodel``; torchtitan 0.3.0's
``--module`` / ``--config``), ``[parallelism]`` (degrees, ``enable_sequence_parallel``; the 0.1/0.2 key
``enable_async_tensor_parallel`` is accepted there as well as in ``[compile]``), ``[training] local_batch_size
/ seq_len / mixed_precision_param``, ``[activation_checkpoint] mode`` (``none`` / ``selective`` / ``full`` /
``memory-budget``, tyro's subcommand names, plus that policy's fields), ``[compile]``.  Accepted and not read
(they do not change one step's loss and gradients, and their classes need the trainer's dependencies):
the other sections of ``Trainer.Config`` and its top-level ``hf_assets_path`` / ``dump_folder``.
"""
from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from typing import Any

from .trace import TraceError

MODEL_NAMES = {"llama3": "llama3-debug", "deepseek_v3": "deepseek-v3-debug", "qwen3": "qwen3-debug"}  # [model] name -> MODELS key
FLAVORS = ("debugmodel",)
UNREAD_SECTIONS = ("profiler", "metrics", "tokenizer", "dataloader", "optimizer", "lr_scheduler", "checkpoint",
                   "validator", "override", "loss", "comm", "debug")
UNREAD_KEYS = ("hf_assets_path", "dump_folder")
MAX_SEQ = 64  # llama3_debug's RoPE cache (debug sizes)


@dataclass
class TitanJob:
    """What a job config asks for, in torchtitan's own config objects."""

    path: str
    model: str  # MODELS key
    parallelism: Any  # torchtitan ParallelismConfig
    training: Any  # torchtitan TrainingConfig
    compile: Any  # torchtitan CompileConfig
    ac: Any = None  # an ActivationCheckpointing policy config, or None
    ac_mode: str = "none"
    notes: list[str] = field(default_factory=list)

    @property
    def degrees(self) -> dict[str, int]:
        p = self.parallelism
        return {"dp_replicate": p.data_parallel_replicate_degree, "dp_shard": max(p.data_parallel_shard_degree, 1),
                "cp": p.context_parallel_degree, "tp": p.tensor_parallel_degree, "pp": p.pipeline_parallel_degree,
                "ep": p.expert_parallel_degree}


def _section(path: str, name: str, raw: Any, cls, rename: dict | None = None):
    """``cls(**raw)`` with every key checked against ``cls``'s fields (bad input names the key)."""
    if not isinstance(raw, dict):
        raise TraceError(f"{path}: [{name}] must be a table", "input")
    names = {f.name for f in dataclasses.fields(cls)}
    bad = sorted(set(raw) - names - set(rename or ()))
    if bad:
        raise TraceError(f"{path}: unknown key {name}.{bad[0]} (torchtitan's {cls.__qualname__} has "
                         f"{sorted(names)})", "input")
    try:
        return cls(**{k: v for k, v in raw.items() if k in names})
    except (TypeError, ValueError, AssertionError) as exc:
        raise TraceError(f"{path}: [{name}]: {exc}", "input") from None


def _ac(path: str, raw: dict) -> tuple[str, Any]:
    from torchtitan.distributed.activation_checkpoint import FullAC, MemoryBudgetAC, SelectiveAC

    raw = dict(raw)
    mode = raw.pop("mode", "selective")  # Trainer.Config's default policy is SelectiveAC
    classes = {"selective": SelectiveAC.Config, "full": FullAC.Config, "memory-budget": MemoryBudgetAC.Config}
    if mode == "none":
        if raw:
            raise TraceError(f"{path}: activation_checkpoint.{sorted(raw)[0]} with mode = \"none\"", "input")
        return mode, None
    if mode not in classes:
        raise TraceError(f"{path}: activation_checkpoint.mode = {mode!r}: torchtitan's policies are "
                         f"{['none', *classes]}", "input")
    return mode, _section(path, "activation_checkpoint", raw, classes[mode])


def load_job(path: str, model: str | None = None) -> TitanJob:
    """Parse and check ``path`` (bad input: :class:`TraceError` kind ``input``, naming the key).  ``model``: the
    ``--torchtitan`` model, which a ``[model] name`` must agree with."""
    from . import torchtitan as tt

    tt.prepare()
    from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig

    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except OSError as exc:
        raise TraceError(f"--config {path}: cannot read: {exc.strerror or exc}", "input") from None
    except tomllib.TOMLDecodeError as exc:
        raise TraceError(f"--config {path}: not TOML: {exc}", "input") from None
    known = {"model", "parallelism", "training", "activation_checkpoint", "compile", *UNREAD_SECTIONS, *UNREAD_KEYS}
    bad = sorted(set(doc) - known)
    if bad:
        raise TraceError(f"{path}: unknown section or key {bad[0]!r} (torchtitan's job config has {sorted(known)})",
                         "input")
    notes = [f"[{s}] not read" for s in UNREAD_SECTIONS if s in doc]

    m = doc.get("model", {})
    if not isinstance(m, dict) or set(m) - {"name", "flavor"}:
        raise TraceError(f"{path}: unknown key model.{sorted(set(m) - {'name', 'flavor'})[0]} (read: name, flavor)"
                         if isinstance(m, dict) else f"{path}: [model] must be a table", "input")
    name = m.get("name", next((k for k, v in MODEL_NAMES.items() if v == model), "llama3"))
    if name not in MODEL_NAMES:
        raise TraceError(f"{path}: model.name = {name!r}: traced are {sorted(MODEL_NAMES)}", "input")
    if model is not None and MODEL_NAMES[name] != model:
        raise TraceError(f"{path}: model.name = {name!r} but --torchtitan {model}", "input")
    flavor = m.get("flavor", "debugmodel")
    if flavor not in FLAVORS:
        raise TraceError(f"{path}: model.flavor = {flavor!r}: only {list(FLAVORS)} (at small dims) is traced",
                         "input")

    par = dict(doc.get("parallelism", {}))
    cmp = dict(doc.get("compile", {}))
    if "enable_async_tensor_parallel" in par:  # torchtitan 0.1/0.2 kept it under [parallelism]
        cmp.setdefault("enable_async_tensor_parallel", par.pop("enable_async_tensor_parallel"))
    parallelism = _section(path, "parallelism", par, ParallelismConfig)
    compile_ = _section(path, "compile", cmp, CompileConfig)
    training = _section(path, "training", doc.get("training", {}), TrainingConfig)
    ac_mode, ac = _ac(path, doc.get("activation_checkpoint", {}))
    if training.seq_len > MAX_SEQ or training.local_batch_size * training.seq_len > 256:
        raise TraceError(f"{path}: training.seq_len = {training.seq_len}, local_batch_size = "
                         f"{training.local_batch_size}: traced at debug sizes (seq_len <= {MAX_SEQ}, "
                         f"local_batch_size * seq_len <= 256)", "input")
    return TitanJob(path, MODEL_NAMES[name], parallelism, training, compile_, ac, ac_mode, notes)


def check_supported(job: TitanJob) -> None:
    """What the trace cannot do yet: UNKNOWN (TraceError kind ``unsupported``) naming the field."""
    p, c = job.parallelism, job.compile
    if p.pipeline_parallel_degree > 1 and job.model == "qwen3-debug":  # as Decoder.Config.update_from_config
        raise TraceError(f"{job.path}: parallelism.pipeline_parallel_degree = {p.pipeline_parallel_degree} with "
                         f"model.name = \"qwen3\": torchtitan refuses weight tying (qwen3 ties lm_head to the "
                         f"embedding) with pipeline parallelism", "input")
    if p.pipeline_parallel_degree > 1 and job.model != "llama3-debug":
        raise TraceError(f"{job.path}: parallelism.pipeline_parallel_degree = {p.pipeline_parallel_degree} with "
                         f"model {job.model}: pipelining is traced for llama3", "unsupported",
                         "pipeline_parallel_degree")
    if p.pipeline_parallel_degree > 1:  # alone, with TP and / or dp_replicate (frontends/pipelining.trace_titan_pp_job)
        others = [f"{k} = {v}" for k, v in job.degrees.items() if k not in ("pp", "tp", "dp_replicate") and v > 1]
        why = (f"with {', '.join(others)}: pipeline parallelism is traced from a job alone or with "
               f"tensor_parallel_degree and data_parallel_replicate_degree (FSDP's sharded parameters under the "
               f"pipeline are not traced)" if others else
               f"with activation_checkpoint.mode = {job.ac_mode!r}: checkpointing under pipelining is traced with "
               f"mode = \"full\" only" if job.ac is not None and job.ac_mode != "full" else
               "with compile.enable: not traced" if job.compile.enable else None)
        if why:
            raise TraceError(f"{job.path}: parallelism.pipeline_parallel_degree = {p.pipeline_parallel_degree} {why}",
                             "unsupported", "pipeline_parallel_degree")
    if p.context_parallel_degree > 1:  # torchtitan's apply_cp_to_forward route (frontends/titan_cp.py)
        from .titan_cp import check_cp_job

        check_cp_job(job)
    dp = p.data_parallel_shard_degree > 1 or p.data_parallel_replicate_degree > 1
    if p.spmd_backend != "spmd_types" and not (p.spmd_backend == "partial_dtensor" and
                                               (dp or p.context_parallel_degree > 1)):
        raise TraceError(f"{job.path}: parallelism.spmd_backend = {p.spmd_backend!r}: traced is torchtitan's default "
                         f"\"spmd_types\" (TP; data parallelism through SimpleFSDP on DTensor), and \"partial_dtensor"
                         f"\" with data parallelism (parallelize_llama's FSDP2, frontends/titan_fsdp2.py)",
                         "unsupported", "spmd_backend")
    if c.enable_async_tensor_parallel:
        raise TraceError(f"{job.path}: compile.enable_async_tensor_parallel: async TP is inductor's micro-pipeline "
                         f"pass under torch.compile (fused all-gather/reduce-scatter matmuls), which the eager "
                         f"CPU trace does not run", "unsupported", "enable_async_tensor_parallel")
    if job.ac_mode == "memory-budget":
        raise TraceError(f"{job.path}: activation_checkpoint.mode = \"memory-budget\" is a torch.compile "
                         f"partitioner policy, which the eager CPU trace does not run", "unsupported",
                         "activation_checkpoint")
    if job.ac_mode == "selective":
        raise TraceError(f"{job.path}: activation_checkpoint.mode = \"selective\" (torchtitan's default policy): "
                         f"per-op selective checkpointing caches the collectives' outputs, which spmd_types' "
                         f"in-place collectives (as the trace performs them) write after the save; the trace "
                         f"fails there, so no verdict (mode = \"none\" or \"full\" are traced)", "unsupported",
                         "activation_checkpoint")
    if p.data_parallel_shard_degree == -1:
        job.notes.append("data_parallel_shard_degree = -1 read as 1 (no world size: the other degrees fill it)")
    if c.enable:
        job.notes.append("compile.enable: the eager program is traced (torch.compile is not run)")
