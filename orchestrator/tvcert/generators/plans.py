"""Plan generators for model families, from public model-card configurations."""
from __future__ import annotations

from typing import Any

from .builder import G, Par
from .llama import Cfg, Step, ep_sharded, state_layout

# Llama 3 model cards (hidden, layers, heads, kv heads, head dim, ffn, vocab, seq)
LLAMA3 = {
    "llama3-8b": dict(h=4096, layers=32, nh=32, nkv=8, hd=128, f=14336, v=128256, s=8192),
    "llama3-70b": dict(h=8192, layers=80, nh=64, nkv=8, hd=128, f=28672, v=128256, s=8192),
    "llama3-405b": dict(h=16384, layers=126, nh=128, nkv=8, hd=128, f=53248, v=128256, s=8192),
}
MODELS = sorted(LLAMA3)
CP_STYLES = ("allgather", "ring", "zigzag", "allgather-zigzag")


class GenError(ValueError):
    """The requested model / parallel configuration cannot be generated."""


def small_dims(par: Par) -> dict[str, int]:
    """Tiny dims with every divisibility the plan needs, for execution by the interpreter."""
    tp, cp = par.tp, par.cp
    return {"b": par.dp * par.mb, "s": 2 * cp * (tp if par.sp else 1), "h": 4, "nh": 2 * tp, "nkv": tp, "hd": 2,
            "f": 2 * tp, "v": 3 * tp}


def small_mesh(par: Par) -> Par:
    """The same structure at degree 2 (or 3 for mb) on every axis, so it can be executed."""
    return Par(tp=min(par.tp, 2), sp=par.sp, cp=min(par.cp, 2), dp=min(par.dp, 2), mb=min(par.mb, 3), zero=par.zero,
               pp=par.pp, ring=par.ring, zigzag=par.zigzag)


def llama3_plan(model: str, tp: int = 1, sp: bool = False, cp: int = 1, dp: int = 1, mb: int = 1, zero: int = 0,
                layers: int | None = None, dims: dict[str, int] | None = None, pp: int = 1,
                cp_style: str = "allgather", tie_embeddings: bool = False,
                masked_embedding: bool = False) -> dict[str, Any]:
    if model not in LLAMA3:
        raise GenError(f"unknown model {model!r}; known: {', '.join(MODELS)}")
    check_degrees(tp=tp, sp=sp, cp=cp, dp=dp, microbatches=mb, zero=zero, pp=pp, cp_style=cp_style)
    par = Par(tp=tp, sp=sp, cp=cp, dp=dp, mb=mb, zero=zero, pp=pp, **cp_flags(cp_style))
    card = dict(LLAMA3[model])
    nl = layers if layers is not None else card["layers"]
    card.pop("layers")
    if nl < pp:
        raise GenError(f"{nl} layers cannot fill {pp} pipeline stages")
    full = {"b": dp * mb, **card}
    if dims:
        for k in dims:
            if k not in full:
                raise GenError(f"--dims: {k!r} is not a model dim ({', '.join(full)})")
        full.update(dims)
    axes = par.axes()
    full.update({a: getattr(par, a) for a in axes})
    small = small_mesh(par)
    run = small_dims(small)
    run.update({a: getattr(small, a) for a in axes})
    _check(full, par)
    cfg = Cfg(full, nl, tie_embeddings=tie_embeddings, masked_embedding=masked_embedding)
    ring = ring_label(par)
    name = (f"{model}-tp{tp}{'sp' if sp else ''}-cp{cp}{ring}-dp{dp}-pp{pp}-mb{mb}-z{zero}-L{nl}"
            f"{'-tied' if tie_embeddings else ''}{'-masked' if masked_embedding else ''}")
    desc = (f"{model} training step ({nl} layers{', tied embeddings' if tie_embeddings else ''}"
            f"{', masked vocab-parallel lookup' if masked_embedding else ''}): "
            f"tp={tp}{' +sp' if sp else ''} cp={cp}{f' ({ring})' if ring else ''} dp={dp} pp={pp} microbatches={mb} "
            f"zero={zero}")
    return assemble(Step(G(), Par(), cfg), Step(G(), par, cfg), name, desc, full, run)


def check_degrees(**degrees: Any) -> None:
    """The generic option checks every model family shares."""
    style = degrees.pop("cp_style", "allgather")
    if style not in CP_STYLES:
        raise GenError(f"--cp-style must be one of {', '.join(CP_STYLES)}, got {style!r}")
    for k, v in degrees.items():
        if k not in ("sp", "zero") and v < 1:
            raise GenError(f"--{k} must be >= 1")
    if degrees.get("sp") and degrees.get("tp", 1) == 1:
        raise GenError("--sp needs --tp > 1")
    if degrees.get("zero") and degrees.get("dp", 1) == 1:
        raise GenError("--zero needs --dp > 1")


def cp_flags(cp_style: str) -> dict[str, bool]:
    """Par's flags for a --cp-style: zigzag is ring attention over load-balanced chunks."""
    return {"ring": cp_style in ("ring", "zigzag"), "zigzag": cp_style in ("zigzag", "allgather-zigzag")}


def ring_label(par: Par) -> str:
    """"ring" (or "zigzag" for load-balanced chunks) in plan names when context parallelism runs ring attention."""
    if not par.has("cp"):
        return ""
    if not par.ring:
        return "ag-zigzag" if par.zigzag else ""
    return "zigzag" if par.zigzag else "ring"


def assemble(logical: Step, step: Step, name: str, desc: str, full: dict, run: dict) -> dict[str, Any]:
    """Build the logical step and the parallel step, and write the plan: mesh, programs, placements."""
    lloss, lout = logical.build()
    _name_outputs(logical, lloss, lout)
    ploss, pout = step.build()
    _name_outputs(step, ploss, pout)
    pp = step.par.pp
    mesh = ([["pp", "pp"]] if pp > 1 else []) + [[a, a] for a in step.par.axes()]
    if pp > 1:
        full["pp"] = pp
        run["pp"] = pp  # one program per stage: the stage count is structure, not a size
    programs = [g.to_json(name=_prog(step, st), **({"stage": {"pp": st}} if pp > 1 else {}))
                for st, g in enumerate(step.gs)]
    return {
        "tvcert_plan": 1,
        "name": name,
        "description": desc,
        "dims": full,
        "run_dims": run,
        "mesh": mesh or [["tp", 1]],
        "logical": logical.g.to_json(),
        "parallel": programs,
        "inputs": _input_placements(step),
        "outputs": _output_placements(step),
    }


def _prog(step: Step, st: int) -> str:
    return "spmd" if step.par.pp == 1 else f"stage{st}"


def seq_needs(par: Par) -> list[tuple[str, str]]:
    """How the sequence must divide, for every model family: over cp, over cp*tp under SP, and into 2cp
    chunks (of whole SP blocks) with load balancing."""
    need = [("s", "cp")]
    if par.sp:
        need.append(("s", "cp*tp"))
    if par.zigzag and par.has("cp"):
        need.append(("s", "2*cp*tp" if par.sp else "2*cp"))
    return need


def _product(d: dict[str, int], expr: str) -> int:
    out = 1
    for part in expr.split("*"):
        out *= int(part) if part.isdigit() else d.get(part, 1)
    return out


def check_divisible(d: dict[str, int], need: list[tuple[str, str]]) -> None:
    """Every ``(a, b)``: the product of dims ``a`` divides by the product ``b`` (dim names or integers)."""
    for a, b in need:
        num, den = _product(d, a), _product(d, b)
        if num % den:
            raise GenError(f"{a}={num} is not divisible by {b}={den}")


def _check(d: dict[str, int], par: Par) -> None:
    check_divisible(d, [("nh", "nkv"), ("nkv", "tp"), ("f", "tp"), ("v", "tp"), *seq_needs(par)])
    if d["hd"] % 2:
        raise GenError("head dim must be even (RoPE)")


def _name_outputs(step: Step, loss: str, outs: dict) -> None:
    """Give outputs stable names (loss_out, <param>_out, ...) with identity casts, in the owning stage's program."""
    last = step.gs[-1]
    last.nodes.append({"name": "loss_out", "op": "cast", "inputs": [loss], "src": "outputs"})
    last.outputs.append("loss_out")
    step.out_stage = {"loss_out": len(step.gs) - 1}
    for _, (st, produced) in outs.items():
        g = step.gs[st]
        for k, t in produced.items():
            g.nodes.append({"name": f"{k}_out", "op": "cast", "inputs": [t], "src": "outputs"})
            g.outputs.append(f"{k}_out")
            step.out_stage[f"{k}_out"] = st


def _input_placements(step: Step) -> dict[str, Any]:
    last = len(step.gs) - 1
    data = step.data_placement()
    out: dict[str, Any] = {"tokens": {"local": "tokens", "placement": data, "program": _prog(step, 0)},
                           "targets": {"local": "targets", "placement": data, "program": _prog(step, last)}}
    for name, st in step.buffers().items():
        out[name] = {"local": name, "program": _prog(step, st)}
    for name in step.params:
        prog = _prog(step, step.stage_of[name])
        out[name] = {"local": name, "placement": step.param_placement(name), "program": prog}
        for st in (f"{name}.exp_avg", f"{name}.exp_avg_sq"):
            out[st] = {**_state_binding(step, name, st), "program": prog}
    return out


def _state_binding(step: Step, name: str, local: str) -> dict[str, Any]:
    if not step.zero_of(name):
        return {"local": local, "placement": step.param_placement(name)}
    if ep_sharded(step, name):  # expert dim kept: [ne, rest]
        return {"local": local, "placement": {"ep": "Shard(0)", "dp": "Shard(1)"}, "layout": state_layout(step, name)}
    pl = {"dp": "Shard(0)"}
    if step.params[name].tp_dim is not None and step.par.has("tp"):
        pl["tp"] = "Shard(0)"
    return {"local": local, "placement": pl, "layout": state_layout(step, name)}


def _output_placements(step: Step) -> dict[str, Any]:
    out: dict[str, Any] = {"loss_out": {"local": "loss_out", "program": _prog(step, step.out_stage["loss_out"])}}
    for name in step.params:
        prog = _prog(step, step.stage_of[name])
        out[f"{name}_out"] = {"local": f"{name}_out", "placement": step.param_placement(name), "program": prog}
        for st in (f"{name}.exp_avg", f"{name}.exp_avg_sq"):
            out[f"{st}_out"] = {**_state_binding(step, name, f"{st}_out"), "program": prog}
    return out


def generate_plan(model: str, **options: Any) -> dict[str, Any]:
    """Any supported model family by name (used by the CLI and the benchmarks)."""
    if model.startswith("deepseek-v3-"):
        from . import deepseek

        return deepseek.deepseek_plan(model, **options)
    return llama3_plan(model, **options)
