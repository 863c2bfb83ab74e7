"""``tvcert fuzz``: differential fuzzing of the verifier against the exact interpreter."""
from __future__ import annotations

import json
import platform
import sys
import time

import click


@click.command()
@click.option("--pairs", "-n", type=int, default=1000, show_default=True, help="pairs to generate")
@click.option("--seed", "-s", type=int, default=0, show_default=True, help="stream seed (the run is deterministic)")
@click.option("--jobs", "-j", type=int, default=1, show_default=True, help="worker processes")
@click.option("--time-budget", type=float, default=None, help="stop after this many seconds")
@click.option("--no-certs", is_flag=True, help="skip the certificate round trip on VERIFIED pairs")
@click.option("--keep-going", is_flag=True, help="do not stop at the first false VERIFIED")
@click.option("--hostile", "hostile_n", type=int, default=0, help="also run this many hostile-input cases")
@click.option("--markdown", type=click.Path(dir_okay=False), default=None, help="write the table to this file")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
def fuzz(pairs: int, seed: int, jobs: int, time_budget: float | None, no_certs: bool, keep_going: bool,
         hostile_n: int, markdown: str | None, as_json: bool) -> None:
    """Differential soundness fuzzing: random logical/parallel pairs, verifier vs. exact oracle.

    Exit 0 when there is no false VERIFIED, no false REFUTED and no crash; 1 otherwise.
    """
    from .runner import format_table, run

    def say(s: str) -> None:
        click.echo(s, err=True)

    st, falses = run(pairs, seed=seed, jobs=jobs, certs=not no_certs, stop_on_false=not keep_going,
                     time_budget=time_budget, say=say)
    s = st.summary()
    hostile_res = None
    if hostile_n:
        from .hostile import run_hostile

        hostile_res = run_hostile(hostile_n, seed=seed, say=say)
    table = format_table(st)
    if hostile_res is not None:
        table += "\n\n" + hostile_res.table()
    if markdown:
        import subprocess

        try:
            rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                 cwd=str(__import__("pathlib").Path(__file__).parent), timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            rev = "?"
        head = (f"# Differential soundness fuzzing\n\n`python -m tvcert.fuzz --pairs {pairs} --seed {seed} --jobs {jobs}"
                f"{f' --time-budget {time_budget:g}' if time_budget else ''}{f' --hostile {hostile_n}' if hostile_n else ''}`\n\n"
                f"Machine: {platform.node()} ({platform.machine()}, {platform.processor() or 'cpu'}, "
                f"Python {platform.python_version()}, {__import__('os').cpu_count()} cores); date "
                f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; commit {rev} (plus uncommitted work of the day).\n\n")
        with open(markdown, "w") as f:
            f.write(head + table + "\n")
    if as_json:
        click.echo(json.dumps({"summary": s, "per_family": st.per_family(), "per_mutation": st.per_mutation(),
                               "false_verified": [str(p) for _, _, p in falses],
                               "notable": st.notable(),
                               "hostile": hostile_res.summary() if hostile_res else None}))
    else:
        click.echo(table)
    bad = (s["false_verified"] or s["false_refuted"] or s["verify_crash"] or s["loader_crash"]
           or (hostile_res is not None and hostile_res.crashes))
    sys.exit(1 if bad else 0)
