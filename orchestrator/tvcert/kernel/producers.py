"""Where a multi-op rule may look: the producers of the ops before the one it concludes at."""
from __future__ import annotations

from collections.abc import Mapping

from ..graph import Graph, Node


class ProducersBefore(Mapping):
    """The producers of the ops before ``index`` (what a multi-op rule ending there may look at), as a view of
    the graph's producer index: matching must not rebuild it, since every candidate op would cost O(graph)."""

    def __init__(self, g: Graph, index: int):
        self.index, self.all = index, g.producer_index()

    def __getitem__(self, t: str) -> tuple[int, Node]:
        got = self.all[t]
        if got[0] >= self.index:
            raise KeyError(t)
        return got

    def __iter__(self):
        return (t for t, (i, _) in self.all.items() if i < self.index)

    def __len__(self) -> int:
        return sum(1 for _ in self)


def producer(producers: Mapping, t: str) -> Node | None:
    """The op producing tensor ``t``, or None (an input, or produced at / after the op being matched)."""
    got = producers.get(t)
    return got[1] if got else None


def out_shape(n: Node) -> tuple[int, ...]:
    """The rank-local shape of ``n``'s first output at full dims."""
    return tuple(n.meta["shape@dims"][0][0])


def single_axis(n: Node) -> str | None:
    """The one mesh axis a collective runs over, else None."""
    ax = n.attrs.get("axis")
    if isinstance(ax, list):
        ax = ax[0] if len(ax) == 1 else None
    return ax if isinstance(ax, str) else None


def rank_free_attrs(n: Node, kc, allowed: tuple[str, ...] = ()) -> dict:
    """The attributes of a matched op, resolved once for every rank: each one (but those in ``allowed``,
    whose rank dependence the caller checks exactly) must be rank-free at every nesting level, or the
    values read at rank 0 would not be every rank's."""
    from ..ops import REGISTRY, resolve_attrs
    from ..shapes import rank_axes_in
    from .rules import RuleFailure

    for k, v in n.attrs.items():
        if k not in allowed and rank_axes_in(v):
            raise RuleFailure(f"{n.op} at {n.path}: attribute {k!r} depends on the rank; a matched op's "
                              f"attributes must be the same on every rank")
    return resolve_attrs(REGISTRY[n.op], n.attrs, kc.env0())


def shape_of(producers: Mapping, t: str) -> tuple[int, ...] | None:
    """The rank-local shape of tensor ``t`` at full dims, when an op before the matched one produces it."""
    got = producers.get(t)
    if got is None:
        return None
    n = got[1]
    return tuple(n.meta["shape@dims"][n.outputs.index(t)][0])


def appends_unit_dim(producers: Mapping, n: Node | None, t: str) -> bool:
    """``t`` is ``n``'s input with one trailing unit dim appended (``x[..., None]``): an unsqueeze / reshape /
    view whose result has exactly the input's shape plus a last dim of 1.  Inserting a unit dim anywhere else
    (``unsqueeze(mask, 0)``, an index reshaped to ``[1, n]``) pairs the wrong elements and is refused."""
    if n is None or n.op not in ("unsqueeze", "reshape", "view") or not n.inputs:
        return False
    src, dst = shape_of(producers, n.inputs[0]), shape_of(producers, t)
    return src is not None and dst is not None and dst == src + (1,)
