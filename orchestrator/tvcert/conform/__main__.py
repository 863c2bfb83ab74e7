"""python -m tvcert.conform --rule ID --n N [--seed S] [--budget SECONDS] [--md FILE]

``--rule all`` (the default) runs every rule id of the kernel's RULES; ``--rule`` may be given several times.
Prints one table row per rule (instances by outcome) and every disagreement with its reproducer; exits 1 if
any instance disagrees with the interpreter (or crashes), 3 if a rule id has no generator.
"""
from __future__ import annotations

import argparse
import sys
import time

from ..kernel.rules import RULES
from .runner import HEADER, format_row, generators, run_rule


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tvcert.conform", description=__doc__.splitlines()[0])
    ap.add_argument("--rule", action="append", help="rule id (repeatable; default: every rule id)")
    ap.add_argument("--n", type=int, default=100, help="instances per rule")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--budget", type=float, default=None, help="seconds per rule at most (stops early; reported)")
    ap.add_argument("--md", help="append the table to this markdown file")
    a = ap.parse_args(argv)
    gens = generators()
    missing = sorted(set(RULES) - set(gens))
    if missing:
        print(f"rule ids without a conformance generator: {', '.join(missing)}", file=sys.stderr)
        return 3
    rules = list(RULES) if not a.rule or a.rule == ["all"] else a.rule
    unknown = [r for r in rules if r not in gens]
    if unknown:
        print(f"unknown rule id(s): {', '.join(unknown)}", file=sys.stderr)
        return 3
    rows, bad = [], 0
    t0 = time.perf_counter()
    print(HEADER)
    for r in rules:
        st = run_rule(r, a.n, a.seed, time_budget=a.budget)
        row = format_row(st)
        rows.append(row)
        print(row, flush=True)
        for seed, desc, detail, used in st.failures:
            print(f"    {st.counts['DISAGREE'] and 'DISAGREE' or 'crash'} seed={seed}: {desc}\n      rules {used}\n      "
                  f"{detail}", flush=True)
        bad += st.bad
    total = time.perf_counter() - t0
    print(f"{len(rules)} rules, {total:.0f} s, {bad} disagreement(s) / crash(es)")
    if a.md:
        with open(a.md, "a") as fh:
            fh.write(f"\n{HEADER}\n" + "\n".join(rows) + f"\n\n{len(rules)} rules, seed {a.seed}, "
                     f"n={a.n}{f', budget {a.budget:.0f} s/rule' if a.budget else ''}: {total:.0f} s, "
                     f"{bad} disagreement(s) / crash(es)\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
