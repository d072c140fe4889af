"""What every kernel of one model shares: the graph, machine, dtype and (int8) quantization plan."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from assembler.texts import TextCache
from fusion.graph.hashing import extract_subgraph
from fusion.graph.ir import Graph
from fusion.quant.params import QuantParams
from fusion.quant.plan import QuantPlan, plan_quantization
from simulator.config import MachineConfig


@dataclass(frozen=True, eq=False)
class ModelContext:
    graph: Graph
    config: MachineConfig
    dtype: str  # "fp32" or "int8"
    params: QuantParams | None = None
    allow_rounding_change: bool = False  # allow fusions that skip an int8 requantization (changes rounding)

    def __reduce__(self) -> tuple:
        """Pickles as its fields; the memoised plan and subgraphs are rebuilt where it lands (a compile worker)."""
        return (ModelContext, (self.graph, self.config, self.dtype, self.params, self.allow_rounding_change))

    @cached_property
    def qplan(self) -> QuantPlan | None:
        return None if self.params is None else plan_quantization(self.graph, self.params)

    @property
    def int8(self) -> bool:
        return self.params is not None

    def scale(self, value: str) -> float | None:
        return None if self.qplan is None else self.qplan.scales.get(value)

    @cached_property
    def config_hash(self) -> str:
        """The machine config's hash (a guard field), computed once: planning builds many kernels."""
        return self.config.config_hash()

    @cached_property
    def texts(self) -> TextCache:
        """Encoded program texts this model's kernels share: repeated layers generate the same instructions,
        encoded once (`assembler.TextCache`)."""
        return TextCache()

    @cached_property
    def _subgraphs(self) -> dict[tuple[str, ...], Graph]:
        return {}

    def subgraph(self, nodes: tuple[str, ...]) -> Graph:
        """The nodes as a standalone graph (memoised: codegen, guards and features all need it)."""
        sub = self._subgraphs.get(nodes)
        if sub is None:
            sub = extract_subgraph(self.graph, nodes, name=f"{self.graph.name}/{nodes[0]}")
            sub = self._subgraphs.setdefault(nodes, sub)
        return sub
