"""`tvcert plan` (generate a training plan) and `tvcert mutate` (inject a known bug)."""
from __future__ import annotations

import json

import click

from ..cli import _fail_bad, write_atomic


@click.command("plan")
@click.argument("model", metavar="MODEL")
@click.option("--tp", default=1, show_default=True, help="tensor-parallel degree")
@click.option("--sp", is_flag=True, help="Megatron sequence parallelism (needs --tp > 1)")
@click.option("--cp", default=1, show_default=True, help="context-parallel degree")
@click.option("--cp-style", type=click.Choice(["allgather", "ring", "zigzag", "allgather-zigzag"]), default="allgather",
              show_default=True,
              help="context-parallel attention: all-gather K/V, ring attention with the online-softmax merge over "
                   "contiguous blocks, zigzag: ring attention over load-balanced chunks (cp rank r holds chunks r "
                   "and 2cp-1-r of 2cp), or allgather-zigzag: all-gather K/V over load-balanced chunks (Llama 3's)")
@click.option("--dp", default=1, show_default=True, help="data-parallel degree")
@click.option("--zero", type=click.IntRange(0, 1), default=0, show_default=True, help="ZeRO stage (1: sharded optimizer)")
@click.option("--microbatches", "mb", default=1, show_default=True, help="gradient-accumulation micro-batches")
@click.option("--ep", default=1, show_default=True, help="expert-parallel degree (deepseek-v3-* models)")
@click.option("--pp", default=1, show_default=True, help="pipeline stages (one program per stage, send/recv between them)")
@click.option("--tie-embeddings", "tie", is_flag=True,
              help="llama: the LM head is the embedding table transposed (as in Llama 3.2 1B/3B)")
@click.option("--masked-embedding", "masked", is_flag=True,
              help="llama: Megatron's masked vocab-parallel embedding lookup instead of the one-hot matmul")
@click.option("--layers", type=int, default=None, help="number of layers (default: the model card's)")
@click.option("--dims", "dims_text", metavar="NAME=V,...", help="override model dims, e.g. h=64,f=128")
@click.option("-o", "--output", "out", required=True, type=click.Path(dir_okay=False), help="plan file to write")
def plan(model, tp, sp, cp, cp_style, dp, zero, mb, ep, pp, tie, masked, layers, dims_text, out):
    """Generate the full training-step plan of MODEL (llama3-8b, llama3-70b, llama3-405b,
    deepseek-v3-16b, deepseek-v3-236b, deepseek-v3-671b).

    The plan holds the logical single-device step (embedding, layers, final norm, LM head,
    cross-entropy, backward, gradient clipping, AdamW) and its SPMD program under the chosen
    parallelism, with symbolic dims so it verifies at full size and runs at small `run_dims`.
    """
    from ..cli import _parse_dims
    from .plans import GenError, llama3_plan

    try:
        if model.startswith("deepseek-v3-"):
            from .deepseek import deepseek_plan

            if tie:
                raise GenError("--tie-embeddings applies to the llama family (DeepSeek-V2/V3 are untied)")
            if masked:
                raise GenError("--masked-embedding applies to the llama family")
            p = deepseek_plan(model, tp=tp, sp=sp, cp=cp, dp=dp, mb=mb, zero=zero, ep=ep, layers=layers,
                              dims=_parse_dims(dims_text), pp=pp, cp_style=cp_style)
        elif ep > 1:
            raise GenError("--ep applies to MoE models (deepseek-v3-*)")
        else:
            p = llama3_plan(model, tp=tp, sp=sp, cp=cp, dp=dp, mb=mb, zero=zero, layers=layers,
                            dims=_parse_dims(dims_text), pp=pp, cp_style=cp_style, tie_embeddings=tie,
                            masked_embedding=masked)
    except GenError as exc:
        _fail_bad(str(exc))
    from ..plan import PlanError, load_plan

    try:  # never write a plan `verify` would refuse (e.g. --dims h=0, or sizes the shards do not divide)
        load_plan(json.loads(json.dumps(p)))
    except PlanError as exc:
        _fail_bad(f"the options give a plan that is not valid: {exc}")
    write_atomic(out, json.dumps(p, indent=1) + "\n")
    n = sum(len(g["nodes"]) for g in p["parallel"])
    click.echo(f"wrote {out}: {p['description']} ({len(p['logical']['nodes'])} logical ops, {n} parallel ops)")


@click.command("mutate")
@click.argument("plan_path", metavar="PLAN.json", type=click.Path(dir_okay=False), required=False)
@click.option("--bug", "bug", help="mutation name (see --list)")
@click.option("--list", "list_", is_flag=True, help="list the mutations and the plan options each needs")
@click.option("-o", "--output", "out", type=click.Path(dir_okay=False), help="mutated plan file to write")
def mutate(plan_path, bug, list_, out):
    """Inject a known silent parallelization bug into a generated plan."""
    from ..plan import PlanError, read_plan_json
    from .mutations import MOE_MUTATIONS, MUTATIONS, MutationError, mutate as do_mutate

    if list_:
        for m in MUTATIONS + MOE_MUTATIONS:
            opts = " ".join(f"--{k.replace('_', '-')} {v}" if v is not True else f"--{k.replace('_', '-')}"
                            for k, v in m.config.items())
            click.echo(f"{m.name:36s} {m.doc}  [needs: {opts}]")
        return
    if not (plan_path and bug and out):
        _fail_bad("give PLAN.json, --bug NAME and -o OUT (or --list)")
    from ..cli import check_outputs

    check_outputs({"PLAN.json": plan_path}, {"-o": out})
    try:
        raw = read_plan_json(plan_path)
        mutated, role = do_mutate(raw, bug)
    except (PlanError, MutationError) as exc:
        _fail_bad(str(exc))
    write_atomic(out, json.dumps(mutated, indent=1) + "\n")
    click.echo(f"wrote {out}: {bug} at the op with role {role!r}")
