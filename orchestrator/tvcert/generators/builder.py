"""Building graphs and SPMD programs in Python.

Model code is written once against a :class:`Par` (the parallel layout); with every degree at 1
it emits the logical single-device graph, otherwise the rank-local SPMD program with the
collectives Megatron-style parallelism inserts.  Every node gets a ``src`` naming its role
("layer3.attn.o_proj.all_reduce"), which is how mutations find the op to break.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class G:
    """An append-only graph under construction."""

    inputs: list[dict] = field(default_factory=list)
    nodes: list[dict] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    scope: str = ""
    label: str = ""  # explicit stage label (repeated unit), overriding the layer scope
    _n: int = 0

    def input(self, name: str, shape: list, dtype: str = "float", range_: Any = None) -> str:
        d = {"name": name, "shape": list(shape), "dtype": dtype}
        if range_ is not None:
            d["range"] = range_
        self.inputs.append(d)
        return name

    def op(self, op: str, *inputs: str, role: str = "", name: str | None = None, **attrs) -> str:
        self._n += 1
        out = name or f"t{self._n}"
        d: dict[str, Any] = {"name": out, "op": op, "inputs": list(inputs)}
        if attrs:
            d["attrs"] = attrs
        d["src"] = f"{self.scope}.{role or op}" if self.scope else (role or op)
        if self.label or self.scope.startswith("layer"):
            d["layer"] = self.label or self.scope  # "layer3", "layer3.bwd", "adamw.<param>": one stage per repeated unit
        self.nodes.append(d)
        return out

    def multi(self, op: str, *inputs: str, n: int, role: str = "", **attrs) -> list[str]:
        outs = []
        for _ in range(n):
            self._n += 1
            outs.append(f"t{self._n}")
        d = {"outputs": outs, "op": op, "inputs": list(inputs), "attrs": attrs,
             "src": f"{self.scope}.{role or op}" if self.scope else (role or op)}
        if self.label or self.scope.startswith("layer"):
            d["layer"] = self.label or self.scope
        self.nodes.append(d)
        return outs

    def raw(self, node: dict) -> None:
        self.nodes.append(node)

    def to_json(self, **extra) -> dict:
        return {**extra, "inputs": self.inputs, "nodes": self.nodes, "outputs": self.outputs}


@dataclass(frozen=True)
class Par:
    """Parallel degrees; all 1 means the logical graph."""

    tp: int = 1
    sp: bool = False
    cp: int = 1
    dp: int = 1
    mb: int = 1  # micro-batches, a virtual (sequential) mesh axis
    zero: int = 0
    pp: int = 1  # pipeline stages: one program per stage, pinned to a coordinate of the pp axis
    ring: bool = False  # context parallelism by ring attention (else all-gather K/V)
    zigzag: bool = False  # ring over load-balanced chunks: cp rank r holds sequence chunks r and 2cp-1-r

    @property
    def logical(self) -> bool:
        return self.tp == 1 and self.cp == 1 and self.dp == 1 and self.mb == 1

    def axes(self) -> list[str]:
        """Mesh axes present, in nesting order."""
        return [a for a, d in (("cp", self.cp), ("tp", self.tp), ("dp", self.dp), ("mb", self.mb)) if d > 1]

    def data_axes(self) -> list[str]:
        """Axes that split tokens: weight gradients are partial sums over them."""
        return [a for a in ("cp", "dp", "mb") if getattr(self, a) > 1]

    def has(self, axis: str) -> bool:
        return axis in self.axes()
