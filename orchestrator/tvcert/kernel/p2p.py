"""send / recv between pipeline stages: which send a recv receives (send_recv_preserves).

The pairing is the plan loader's (:func:`tvcert.plan.pair_messages`, stored as ``Plan.p2p``): a
message is keyed by its tag and the full stage coordinates of sender and receiver, and a plan whose
sends and recvs do not pair one-to-one is rejected when it is loaded.  The engine, the certificate
checker and the interpreter all read that one pairing.  Only stage-to-stage transfers between
programs pinned on the send axis exist, with rank-independent peers and the same unpinned axes on
both sides, so a fact moves unchanged.
"""
from __future__ import annotations

from ..plan import Plan
from .rules import RuleFailure


def paired_send(plan: Plan, program: str, node: int) -> tuple[str, int]:
    """(program, node index) of the send the recv at ``program`` node ``node`` receives."""
    got = plan.p2p.get((program, node))
    if got is None:
        raise RuleFailure(f"the recv at {plan.programs[program].nodes[node].path} is paired with no send")
    return got


def check_transfer(plan: Plan, sender: str, receiver: str) -> None:
    if plan.program_axes(sender) != plan.program_axes(receiver):
        raise RuleFailure(f"programs {sender!r} and {receiver!r} span different mesh axes, so placements do not carry over")
