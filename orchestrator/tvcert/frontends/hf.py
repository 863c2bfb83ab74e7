"""Hugging Face transformers front end: ``tvcert verify --hf MODEL --tp N``.

The model is built from a tiny config with random weights (no hub download): MODEL is a model type
(``llama``, ``qwen2``, ``qwen3``, ``mistral``, ``gemma2``, ``phi3``, any ``AutoConfig.for_model`` type), a
config class (``LlamaConfig``) or a causal-LM class (``LlamaForCausalLM``).  The parallel version is what
``from_pretrained(..., tp_plan="auto")`` / ``DistributedConfig(tp_size=N)`` applies after model init: the
model's own ``base_model_tp_plan`` (plus ``lm_head`` / ``embed_tokens`` rules), resolved per layer by the
model's ``_resolve_parallel_plans`` and applied by ``apply_tensor_parallelism`` on the ``tp`` mesh.
``tp_plan`` overrides entries (``{"model.layers.*.mlp.down_proj": "colwise"}``; ``null`` removes one).

The model is called normally (``model(input_ids=...)``, default attention) and the loss is the mean
next-token cross-entropy over ``labels``; loss and every parameter's gradient are verified against the
single-device model (:func:`tvcert.frontends.dtensor.trace_module_plan`).
"""
from __future__ import annotations

from typing import Any, Mapping

from .trace import TraceError

# what a tiny config sets (names as in LlamaConfig; a config without a key ignores it)
TINY = dict(vocab_size=32, hidden_size=32, intermediate_size=32, num_attention_heads=8, num_key_value_heads=8,
            head_dim=4, num_hidden_layers=1, max_position_embeddings=64, use_cache=False,
            tie_word_embeddings=False, sliding_window=2)
BATCH, SEQ = 2, 4


def _config(model: str, overrides: Mapping[str, Any]):
    import transformers

    name = model.strip()
    cls = getattr(transformers, name, None) if name[:1].isupper() else None
    if cls is not None and name.endswith("Config"):
        cfg_cls = cls
    elif cls is not None and hasattr(cls, "config_class"):
        cfg_cls = cls.config_class
    elif cls is None and name[:1].islower():
        from transformers import CONFIG_MAPPING

        if name not in CONFIG_MAPPING:
            raise TraceError(f"--hf {model!r}: no such model type (e.g. llama, qwen2, qwen3, mistral, gemma2, phi3)",
                             "input")
        cfg_cls = CONFIG_MAPPING[name]
    else:
        raise TraceError(f"--hf {model!r}: not a transformers config class, model class or model type", "input")
    kw = dict(TINY)
    kw.update(overrides)
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the first build may warn of full-size special token ids (fixed below)
    try:
        cfg = cfg_cls(**kw)
        vocab = cfg.get_text_config().vocab_size
        # full-size defaults outside the tiny vocabulary (phi3: pad / eos 32000) are dropped unless given
        fix = {k: None for k in ("pad_token_id", "bos_token_id", "eos_token_id")
               if k not in overrides and isinstance(getattr(cfg, k, None), int) and not 0 <= getattr(cfg, k) < vocab}
        if fix:
            cfg = cfg_cls(**kw, **fix)
    except Exception as exc:  # noqa: BLE001 - the config class rejects a value
        raise TraceError(f"--hf {model!r}: {cfg_cls.__name__}({', '.join(f'{k}={v!r}' for k, v in overrides.items())})"
                         f" fails: {type(exc).__name__}: {exc}", "input") from None
    finally:
        hf_logging.set_verbosity(level)
    return cfg, (cls if cls is not None and not name.endswith("Config") else None)


def _cfg_text(cfg) -> str:
    keys = [k for k in TINY if hasattr(cfg, k)]
    return f"{type(cfg).__name__}({', '.join(f'{k}={getattr(cfg, k)!r}' for k in keys)})"


def _model_class(cfg, cls):
    if cls is not None:
        return cls
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM._model_mapping[type(cfg)]
    except KeyError:
        raise TraceError(f"--hf: {type(cfg).__name__} has no causal-LM model class", "input") from None


def hf_spec(model: str, tp: int = 2, *, tp_plan: Mapping[str, Any] | None = None, config: Mapping[str, Any] | None = None,
            dtype: str = "float32", batch: int = BATCH, seq: int = SEQ, seed: int = 0) -> dict:
    """The :func:`~tvcert.frontends.dtensor.trace_module_plan` arguments of ``--hf MODEL --tp N`` (traced by
    :func:`trace_hf`)."""
    import torch

    cfg, cls = _config(model, dict(config or {}))
    mcls = _model_class(cfg, cls)
    vocab = cfg.get_text_config().vocab_size
    tdtype = getattr(torch, dtype)

    def make():
        torch.manual_seed(seed)
        try:
            return mcls(cfg).to(tdtype).train()
        except Exception as exc:  # noqa: BLE001 - the tiny config does not build
            raise TraceError(f"--hf {model!r}: {mcls.__name__} does not build from {_cfg_text(cfg)}: "
                             f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}", "input") from None

    def parallelize(m, mesh):
        from transformers.distributed import DistributedConfig
        from transformers.distributed.tensor_parallel import apply_tensor_parallelism

        try:
            dc = DistributedConfig(tp_size=mesh.size(), tp_plan=dict(tp_plan)) if tp_plan else \
                DistributedConfig(tp_size=mesh.size())
            plan, _, _ = m._resolve_parallel_plans(dc)
            return apply_tensor_parallelism(m, mesh, plan)
        except Exception as exc:  # noqa: BLE001 - a tp_plan key or style transformers rejects
            raise TraceError(f"--hf {model!r}: the tp_plan cannot be applied at tp={mesh.size()}: "
                             f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}", "input") from None

    def loss_fn(out, input_ids, labels):
        logits = out.logits
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1))

    tok = {"shape": [batch, seq], "dtype": "int", "range": vocab}
    # labels as Hugging Face's collators give them: padding is -100, cross-entropy's ignore_index
    labels = {"shape": [batch, seq], "dtype": "int", "range": [-100, vocab]}
    return dict(model_factory=make, parallelize=parallelize, loss_fn=loss_fn,
                data={"input_ids": tok, "labels": labels}, mesh={"tp": int(tp)},
                name=f"hf_{cfg.model_type}_tp{tp}", call="input_ids")


def trace_hf(model: str, tp: int = 2, **kw) -> dict:
    """The traced plan dict of ``--hf MODEL --tp N`` (see :func:`hf_spec` for the keyword arguments)."""
    from .dtensor import trace_module_plan

    spec = hf_spec(model, tp, **kw)
    spec.pop("call")
    return trace_module_plan(**spec)


def verify_hf(model: str, tp: int = 2, **kw):
    """Trace and verify: the :class:`tvcert.engine.verify.Result` (verdict, reasons, counterexample).  A trace
    that fails raises :class:`~tvcert.frontends.trace.TraceError` (``kind`` "crash": the parallel model itself
    fails, which ``tvcert verify --hf`` reports as REFUTED)."""
    from ..engine.verify import verify
    from ..plan import load_plan

    return verify(load_plan(trace_hf(model, tp, **kw)))
