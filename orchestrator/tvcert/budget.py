"""Search budgets that do not depend on the machine's load.

A verdict must not change because the machine is busy: the refutation search used to stop after 30 s of wall
time, so a bug REFUTED on an idle machine came out UNKNOWN on a loaded one.  The limit that decides is now a
count of work units the reference interpreter charges per op it executes (deterministic for a given plan and
seed: the op count and the elements it reads and writes, weighted by the number mode, see :func:`op_units`);
wall time is kept only as a generous hang guard, and the reason of an UNKNOWN names the limit that was hit.

``work_budget(units, seconds)`` opens a budget; :func:`charge` spends units in every enclosing one and
:func:`check` raises :class:`tvcert.interp.BudgetExceeded` (kind "work" or "time") once one is exhausted.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

# Units of one op: a fixed cost (dispatch, attribute resolution: tens of microseconds of Python) plus its elements
# (inputs + outputs, or output x contracted size for a matmul), weighted by what an element costs in its number mode:
# numpy float64 ~0.01 us, 60-digit decimals (C libmpdec) ~0.25 us, exact Fractions a few us.  About one unit per
# microsecond of an idle CPU (measured on ddp_titan_llama3's off_by_one search: float64 1.4, decimal ~1 units/us).
OP_UNITS = 20
FLOAT_ELEMENTS_PER_UNIT = 100
DECIMAL_ELEMENTS_PER_UNIT = 4
EXACT_UNITS_PER_ELEMENT = 4


def op_units(elements: int, mode: str) -> int:
    """Work units of one op over ``elements`` elements in ``mode`` ("float64", "decimal" or "exact")."""
    if mode == "exact":
        return OP_UNITS + EXACT_UNITS_PER_ELEMENT * elements
    if mode == "decimal":
        return OP_UNITS + elements // DECIMAL_ELEMENTS_PER_UNIT
    return OP_UNITS + elements // FLOAT_ELEMENTS_PER_UNIT


@dataclass
class _Budget:
    units: int
    deadline: float  # time.monotonic(): the hang guard
    seconds: float
    spent: int = 0


_open: list[_Budget] = []


@contextlib.contextmanager
def work_budget(units: float, seconds: float):
    """Interpreter runs inside stop once ``units`` work units are spent (the limit that decides) or, as a hang
    guard only, ``seconds`` of wall time have passed.  Yields the budget (``spent``: units used so far)."""
    b = _Budget(int(units), time.monotonic() + seconds, seconds)
    _open.append(b)
    try:
        yield b
    finally:
        _open.remove(b)


def charge(units: int) -> None:
    for b in _open:
        b.spent += units


def check(where: str) -> None:
    """Raise BudgetExceeded when an enclosing budget is spent: work units first (kind "work"), then wall time."""
    if not _open:
        return
    from .interp import BudgetExceeded

    for b in _open:
        if b.spent > b.units:
            raise BudgetExceeded(f"the work budget ({b.units:.3g} interpreter work units, TVCERT_REFUTE_WORK) ran out "
                                 f"at {where}", "work")
    now = time.monotonic()
    for b in _open:
        if now > b.deadline:
            raise BudgetExceeded(f"the wall-clock time budget (a hang guard: {b.seconds:g} s, TVCERT_REFUTE_SECONDS) "
                                 f"ran out at {where}, with {b.spent:.3g} of {b.units:.3g} work units spent", "time")
