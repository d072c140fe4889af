"""What every kernel of one model shares: the graph, machine, dtype and (int8) quantization plan."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from assembler.texts import TextCache
from fusion.graph.hashing import extract_subgraph
from fusion.graph.ir import Graph
from fusion.quant.params import QuantParams
from fusion.quant.plan import QuantPlan, plan_quantization
from simulator.config import MachineConfig

SMALL_CONSTANT = 16  # constants up to this many elements enter a shape signature by value (scalars: immediates)


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

    def dequantizes(self, node: str) -> bool:
        """Whether an int8 matrix node's drain dequantizes to float32 instead of requantizing (read only by Adds:
        `quant.plan.MatrixQuant.dequantize`)."""
        quant = None if self.qplan is None else self.qplan.matrix.get(node)
        return quant is not None and quant.dequantize

    @cached_property
    def config_hash(self) -> str:
        """The machine config's hash (a guard field), computed once: planning builds many kernels."""
        return self.config.config_hash()

    @cached_property
    def texts(self) -> TextCache:
        """Encoded program texts this model's kernels share: repeated layers generate the same instructions,
        kept once (`assembler.TextCache`)."""
        return TextCache()

    @cached_property
    def _subgraphs(self) -> dict[tuple[str, ...], Graph]:
        return {}

    @cached_property
    def forms_memo(self) -> dict:
        """Its nodes' constant forms, quantized and packed once for every candidate (`lower.compiler.constant_forms`'
        `memo`)."""
        return {}

    def packed(self, key: tuple, pack: Callable[[], np.ndarray]) -> np.ndarray:
        """A constant's packing for a generator (`key`: its form, value and every input of the packing besides the
        model's constants), made once per model in `forms_memo`: a planner builds several candidates of one layer
        (fusions, schedules), each reading the same weight packed the same way."""
        found = self.forms_memo.get(key)
        if found is None:
            found = self.forms_memo.setdefault(key, pack())
        return found

    def subgraph(self, nodes: tuple[str, ...]) -> Graph:
        """The nodes as a standalone graph (memoised: codegen, guards and features all need it)."""
        sub = self._subgraphs.get(nodes)
        if sub is None:
            sub = extract_subgraph(self.graph, nodes, name=f"{self.graph.name}/{nodes[0]}")
            sub = self._subgraphs.setdefault(nodes, sub)
        return sub

    @cached_property
    def _signatures(self) -> dict[tuple[str, ...], str]:
        return {}

    def shape_signature(self, nodes: tuple[str, ...]) -> str:
        """What a group of these nodes computes, up to names and data (memoised): each value by its operator,
        attributes, type, storage dtype (int8 or not) and inputs (Merkle style), graph inputs by position,
        constants by dtype and shape (and value when small, up to SMALL_CONSTANT elements), but not the int8
        scales or the weights. Groups of a model's repeated layers share it: the planner prices and measures
        their kernels by the first one built (`planner.Evaluator`)."""
        found = self._signatures.get(nodes)
        if found is not None:
            return found
        sub = self.subgraph(nodes)

        def kind(v: str) -> tuple[str, bool]:
            return str(sub.types[v]), self.scale(v) is not None

        hashes = {v: repr(("input", i, kind(v))) for i, v in enumerate(sub.inputs)}
        for v, array in sub.constants.items():
            small = array.tolist() if array.size <= SMALL_CONSTANT else None
            hashes[v] = repr(("const", array.dtype.str, array.shape, small, self.scale(v) is not None))
        for node in sub.nodes:
            base = repr((node.op.value, node.attrs, tuple(hashes[v] for v in node.inputs)))
            hashes.update({out: _digest((base, i, kind(out))) for i, out in enumerate(node.outputs)})
        return self._signatures.setdefault(nodes, _digest(tuple(hashes[v] for v in sub.outputs)))


def _digest(text: object) -> str:
    return hashlib.blake2b(repr(text).encode(), digest_size=16).hexdigest()
