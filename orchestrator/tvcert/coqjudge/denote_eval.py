"""Evaluate the Coq denotation (``Rules/IR/Denote.v``, ``LayoutOps.v``, ``Mesh.v``) on concrete rationals.

The denotation is the trusted specification; this module is how a test ties it to the exact interpreter.
:class:`CoqEval` writes one Coq file in which every tensor is a finite table of rationals
(``rat_realFieldType``), every op application is computed with ``vm_compute`` and materialised as a new
table, and every uninterpreted function ``fn k`` is the finite table of the values the interpreter used
(anything outside the table is a sentinel, so a denotation that asks for another argument cannot agree by
accident).  :func:`lop_term` is the IR op -> ``JLayout.lop`` printer an
emitter can reuse.
"""
from __future__ import annotations

import re
import subprocess
import tempfile
from fractions import Fraction
from pathlib import Path

import numpy as np

from .. import proofkit
from ..ops import Ctx
from .lops import coq_lop, fn_id, lop_of  # noqa: F401 (fn_id: tests)
from .terms import _rat, _seq

SENTINEL = Fraction(-13, 17)  # not a table value (those are positive integers) nor a test input


def lop_term(op: str, ra: dict, shapes: list[tuple[int, ...]], fns: list[str]) -> str:
    """The Coq ``JLayout.lop`` of an IR op with resolved attrs ``ra`` on operands of ``shapes``.

    Raises ValueError for an op (or attribute) LayoutOps.v does not denote."""
    return coq_lop(lop_of(op, ra, shapes, fns))


def frac(x) -> str:
    q = Fraction(x)
    return f"(lit Q {_rat(q)})"


class TableCtx:
    """An exact :class:`~tvcert.ops.base.Ctx` whose function table gives the k-th distinct (function, argument)
    the value k + 1, recording each.

    Any injective table is as good a witness as the interpreter's default one (the denotation quantifies
    over every ``fn``); small integers keep ``vm_compute`` fast (MathComp's rationals are built on unary
    naturals)."""

    def __init__(self, ctx):
        self._ctx = ctx
        self.calls: dict[tuple[str, Fraction], Fraction] = {}

    def __getattr__(self, a):
        return getattr(self._ctx, a)

    def value(self, name: str, v) -> Fraction:
        return self.calls.setdefault((name, Fraction(v)), Fraction(len(self.calls) + 1))

    def fn(self, name, x):
        x = np.asarray(x, dtype=object)
        return np.vectorize(lambda v: self.value(name, v), otypes=[object])(x) if x.size else x.copy()


class CoqEval:
    """One coqc run: tables, op applications (materialised), and the values to read back."""

    def __init__(self):
        self.body: list[str] = []
        self.fns: list[str] = []                       # fn k is the function named fns[k]
        self.table: dict[tuple[int, Fraction], Fraction] = {}
        self.ctx = TableCtx(Ctx(exact=True, seed=0))   # evaluate the interpreter's ops with this
        self.reads: list[tuple[tuple[int, ...], list[tuple[int, ...]]]] = []
        self._k = 0

    def _name(self, stem: str) -> str:
        self._k += 1
        return f"{stem}{self._k}"

    def learn_pointwise(self, key: str, f, values) -> int:
        """fn id of an uninterpreted pointwise op whose exact meaning on each of ``values`` is ``f``."""
        k = fn_id(self.fns, key)
        for v in values:
            self.table[(k, Fraction(v))] = Fraction(f(v))
        return k

    def tensor(self, a: np.ndarray) -> str:
        """A Coq tensor equal to ``a`` on its shape (0 outside)."""
        n = self._name("x")
        rows = "; ".join(f"({_seq(i)}, {frac(a[i])})" for i in np.ndindex(*a.shape))
        self.body.append(f"Definition {n} : tensor Q := tab [:: {rows}].")
        return n

    def family(self, xs: list[np.ndarray]) -> str:
        """A family (rank r holds ``xs[r]``)."""
        ts = [self.tensor(x) for x in xs]
        n = self._name("f")
        self.body.append(f"Definition {n} : family Q := fun r => nth (zero_t Q) [:: {'; '.join(ts)}] r.")
        return n

    def value(self, term: str, shape: tuple[int, ...], read: bool = True) -> str:
        """Materialise the tensor ``term`` on ``shape`` (vm_compute), optionally reading it back."""
        n = self._name("v")
        idx = [tuple(i) for i in np.ndindex(*shape)]
        ix = "[:: " + "; ".join(_seq(i) for i in idx) + "]" if idx else "[::]"
        self.body.append(f"Definition {n}_l := Eval vm_compute in map (fun i => (i, ({term}) i)) {ix}.")
        self.body.append(f"Definition {n} : tensor Q := tab {n}_l.")
        if read:
            self.body.append(f"Eval vm_compute in map (fun p => (numq p.2, denq p.2)) {n}_l.")
            self.reads.append((tuple(shape), idx))
        return n

    def text(self) -> str:
        for (name, v), y in self.ctx.calls.items():
            self.table[(fn_id(self.fns, name), v)] = y
        rows = "; ".join(f"({k}%N, {frac(v)}, {frac(y)})" for (k, v), y in sorted(self.table.items()))
        return "\n".join([
            "From mathcomp Require Import all_ssreflect all_algebra.", "From Coq Require Import BinPosDef.",
            "From TVCert Require Import IR.Syntax IR.Denote IR.LayoutOps IR.Mesh.",
            "Import JSyntax JDenote JLayout JMesh.",
            "Notation Q := rat_realFieldType.",
            "Definition tab (xs : seq (seq nat * Q)) : tensor Q :=",
            "  fun i => nth 0%R (map snd xs) (seq.index i (map fst xs)).",
            f"Definition FN : seq ((nat * Q) * Q) := [:: {rows}].",
            f"Definition fnT (f : nat) (x : Q) : Q := nth {frac(SENTINEL)} (map snd FN) (seq.index (f, x) (map fst FN)).",
            *self.body])

    def run(self, root: Path, timeout: int = 600) -> list[np.ndarray]:
        """Run coqc; the values read, in order, as object arrays of Fractions."""
        with tempfile.TemporaryDirectory() as td:
            f = Path(td) / "TVCertDenote.v"
            f.write_text(self.text())
            p = subprocess.run(["coqc", "-q", "-w", proofkit.COQ_WARNINGS, "-Q", str(root / "Rules"), "TVCert",
                                str(f)], capture_output=True, text=True, cwd=td, timeout=timeout)
        if p.returncode != 0:
            raise RuntimeError("coqc failed: " + (p.stdout + p.stderr)[-3000:])
        got = re.findall(r"=\s*\[::(.*?)\]\s*:\s*seq", p.stdout, flags=re.S)
        if len(got) != len(self.reads):
            raise RuntimeError(f"expected {len(self.reads)} results, coqc printed {len(got)}: {p.stdout[:2000]}")
        out = []
        for (shape, idx), g in zip(self.reads, got):
            pairs = re.findall(r"\(\s*\(?(-?\d+)\)?%Z\s*,\s*\(?(-?\d+)\)?%Z\s*\)", g)
            if len(pairs) != len(idx):
                raise RuntimeError(f"expected {len(idx)} values, got {len(pairs)}: {g[:500]}")
            a = np.empty(shape, dtype=object)
            for i, (num, den) in zip(idx, pairs):
                a[i] = Fraction(int(num), int(den))
            out.append(a)
        return out
