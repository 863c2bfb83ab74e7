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
