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
