"""Coq as the judge (issue 14): print a plan as a Coq term and have Coq check it.

``emit.emit(plan)`` writes the ``.v`` text (``the_plan : mplan`` on every mesh axis, ``the_cert``,
``plan_verified : mplan_equiv the_plan``);
``coq.check_file(path)`` runs coqc on it and checks ``Print Assumptions plan_verified``
against proofkit's axiom allowlist.  See ``Rules/IR/`` for the definitions it relies on.
"""
from .emit import NotCovered, Uncovered, emit, render, search, translate  # noqa: F401
