"""`KernelFeatures` of a generated kernel: static counts read off its instructions, plus the group's work.

Counting the generated program (not a formula of the group) means every schedule choice (tile rows, flattening,
fused epilogue, chains) shows up in the features, for the analytic model and the learned one alike.
"""

from __future__ import annotations

from collections import Counter

from fusion.cost.interface import KernelFeatures
from fusion.engine.context import ModelContext
from fusion.engine.kernel import Kernel
from fusion.engine.plan import Group
from fusion.engine.strategies import strategy_of
from fusion.graph.cost import macs as node_macs
from fusion.graph.cost import vector_ops
from isa import INSTRUCTIONS, InstructionSpec
from isa.enums import DType, Unit
from isa.fields import FIELDS
from simulator import timing

_BY_MASK: dict[int, dict[int, InstructionSpec]] = {}
for _spec in INSTRUCTIONS:
    _BY_MASK.setdefault(_spec.mask, {})[_spec.match] = _spec


def _spec_of(word: int) -> InstructionSpec:
    """The table row of a word (a lean decode: features need the row and a few raw fields, not validation)."""
    for mask, rows in _BY_MASK.items():
        spec = rows.get(word & mask)
        if spec is not None:
            return spec
    raise ValueError(f"word {word:#018x} matches no instruction")


def _field(word: int, name: str) -> int:
    f = FIELDS[name]
    return (word >> f.lo) & ((1 << f.width) - 1)


PASS_TIMINGS = frozenset({"vector", "vector_reduce", "chain_load", "chain_reduce", "chain_stream"})
CHAIN_TIMINGS = frozenset({"chain_op", "chain_store"})
DTYPE_BYTES = {int(DType.i8): 1, int(DType.i32): 4, int(DType.f32): 4}


def _steps(counts: Counter[str]) -> int:
    """Pipeline steps of the kernel's main compute unit: how many times it receives a step's tiles."""
    for unit, busy in ((Unit.matrix, "matmuls"), (Unit.vector, "vector_instrs"), (Unit.store, "dma_stores")):
        if counts[busy]:
            return counts[f"pops_{int(unit)}"]
    return 0


def loop_order(group: Group, has_matmul: bool) -> str:
    """The GEMM loop order (outer to inner) the schedule runs, so cost models can tell the orders apart: "mn"
    streams A's row tiles under each preloaded weight tile (the default), "nm" keeps A resident (A-stationary:
    loaded once, weight panels streamed), "knm" is the swapped orientation (each k-slice of A^T preloaded once,
    the weight's columns streamed through it as rows: a strategy's fixed order, `Strategy.loop_order`); "" without
    a matmul."""
    if not has_matmul:
        return ""
    fixed = strategy_of(group).loop_order
    if fixed is not None:
        return fixed
    return "nm" if group.resident_a else "mn"


def kernel_features(mc: ModelContext, kernel: Kernel, zero_tile_fraction: float = 0.0) -> KernelFeatures:
    sub = mc.subgraph(kernel.group.nodes)
    counts: Counter[str] = Counter()
    tile = {"m": 0, "n": 0, "k": 0}
    regs: dict[int, int] = {}  # register values set by `li` (the generators load every constant that way)
    for word in kernel.program.text if kernel.program is not None else ():
        spec = _spec_of(word)
        t = spec.timing
        counts["instructions"] += 1
        if spec.mnemonic == "li":
            regs[_field(word, "rd")] = _field(word, "imm32")
        elif t in ("dma_load", "dma_load_transposed", "dma_store"):
            side = "store" if t == "dma_store" else "load"
            rows = _field(word, "rows")
            row_bytes = _field(word, "cols") * DTYPE_BYTES[_field(word, "dtype")]
            stride = regs.get(_field(word, "rs2"), row_bytes)
            counts[f"dma_{side}s"] += 1
            counts[f"{side}_bytes"] += rows * row_bytes
            counts[f"{side}_bursts"] += timing.dma_bursts(mc.config, rows, row_bytes, stride)
        elif t == "preload":
            counts["preloads"] += 1
            tile["k"], tile["n"] = max(tile["k"], _field(word, "rows")), max(tile["n"], _field(word, "cols"))
        elif t in ("matmul", "matmul_stream"):
            counts["matmuls"] += 1
            counts["matmul_rows"] += _field(word, "rows")
            tile["m"] = max(tile["m"], _field(word, "rows"))
        elif t == "drain":
            counts["drains"] += 1
            counts["drain_rows"] += _field(word, "rows")
        elif t in PASS_TIMINGS:
            counts["vector_instrs"] += 1
            counts["vector_pass_elems"] += _field(word, "n") if any(f.name == "n" for f in spec.fields) else 0
        elif t in CHAIN_TIMINGS:
            counts["chain_ops"] += 1
        elif t == "zero_test":
            counts["zero_tests"] += 1
        elif spec.mnemonic == "fence":
            counts["phases"] += 1
        elif spec.mnemonic == "sync.pop":
            counts[f"pops_{_field(word, 'dst')}"] += 1
    return KernelFeatures(
        ops=tuple(n.op.value for n in sub.nodes),
        strategy=kernel.group.strategy,
        dtype=mc.dtype,
        shapes=tuple(sub.types[v].shape for v in (*sub.inputs, *sub.outputs)),
        macs=sum(node_macs(sub, n) for n in sub.nodes),
        vector_elems=sum(vector_ops(sub, n) for n in sub.nodes),
        dram_read_bytes=counts["load_bytes"],
        dram_write_bytes=counts["store_bytes"],
        tile_m=tile["m"],
        tile_n=tile["n"],
        tile_k=tile["k"],
        loop_order=loop_order(kernel.group, bool(counts["matmuls"])),
        zero_tile_fraction=zero_tile_fraction,
        instructions=counts["instructions"],
        dma_loads=counts["dma_loads"],
        dma_stores=counts["dma_stores"],
        preloads=counts["preloads"],
        matmuls=counts["matmuls"],
        matmul_rows=counts["matmul_rows"],
        drains=counts["drains"],
        drain_rows=counts["drain_rows"],
        vector_instrs=counts["vector_instrs"],
        vector_pass_elems=counts["vector_pass_elems"],
        chain_ops=counts["chain_ops"],
        phases=counts["phases"],
        zero_tests=counts["zero_tests"],
        steps=_steps(counts),
        load_bursts=counts["load_bursts"],
        store_bursts=counts["store_bursts"],
    )
