"""send / recv between pipeline stages: which send a recv receives (send_recv_preserves).

A message is keyed by its tag and the full stage coordinates of sender and receiver.  Only
stage-to-stage transfers between programs pinned on the send axis are covered, with
rank-independent peers and the same unpinned axes on both sides, so a fact moves unchanged.
"""
from __future__ import annotations

from typing import Any, Mapping

from ..plan import Plan
from ..shapes import dim_value
from .rules import RuleFailure

Key = tuple


def _coord(v: Any, plan: Plan, what: str) -> int:
    if isinstance(v, str) and "rank." in v:
        raise RuleFailure(f"{what} {v!r} depends on the rank; only fixed stage-to-stage transfers are covered")
    return dim_value(v, plan.dims)


def send_key(plan: Plan, program: str, attrs: Mapping[str, Any]) -> Key:
    g = plan.programs[program]
    axis = attrs["axis"]
    if axis not in g.stage:
        raise RuleFailure(f"send over axis {axis!r}, but program {program!r} is not pinned to a stage of that axis")
    to = _coord(attrs["to"], plan, "send destination")
    dst = dict(g.stage)
    dst[axis] = to
    return (attrs["tag"], tuple(sorted(g.stage.items())), tuple(sorted(dst.items())))


def recv_key(plan: Plan, program: str, attrs: Mapping[str, Any]) -> Key:
    g = plan.programs[program]
    axis = attrs["axis"]
    if axis not in g.stage:
        raise RuleFailure(f"recv over axis {axis!r}, but program {program!r} is not pinned to a stage of that axis")
    src = dict(g.stage)
    src[axis] = _coord(attrs["src"], plan, "recv source")
    return (attrs["tag"], tuple(sorted(src.items())), tuple(sorted(g.stage.items())))


def check_transfer(plan: Plan, sender: str, receiver: str) -> None:
    if plan.program_axes(sender) != plan.program_axes(receiver):
        raise RuleFailure(f"programs {sender!r} and {receiver!r} span different mesh axes, so placements do not carry over")
