"""`KernelFeatures` of a generated kernel: static counts read off its instructions, plus the group's work.

Counting the generated program (not a formula of the group) means every schedule choice (tile rows, flattening,
fused epilogue, chains) shows up in the features, for the analytic model and the learned one alike.
"""

from __future__ import annotations

import numpy as np

from fusion.cost.interface import KernelFeatures
from fusion.engine.context import ModelContext
from fusion.engine.kernel import Kernel
from fusion.engine.plan import Group
from fusion.engine.strategies import strategy_of
from fusion.graph.cost import macs as node_macs
from fusion.graph.cost import vector_ops
from isa import INSTRUCTIONS
from isa.enums import DType, Unit
from isa.fields import FIELDS
from simulator import timing
from simulator.config import MachineConfig

_SPECS = tuple(INSTRUCTIONS)
# the decode tables, vectorised: per distinct mask (in table order), its rows' match values (sorted) and their spec
# indices (a later row with the same mask and match replaces an earlier one); a word is the spec of the first mask
# with a row matching it
_MATCHES = tuple(
    (np.uint64(mask), np.array(sorted(rows), dtype=np.uint64), np.array([rows[m] for m in sorted(rows)]))
    for mask in dict.fromkeys(spec.mask for spec in _SPECS)
    for rows in [{spec.match: i for i, spec in enumerate(_SPECS) if spec.mask == mask}]
)
PASS_TIMINGS = frozenset({"vector", "vector_reduce", "chain_load", "chain_reduce", "chain_stream"})
CHAIN_TIMINGS = frozenset({"chain_op", "chain_store"})
DTYPE_BYTES = {int(DType.i8): 1, int(DType.i32): 4, int(DType.f32): 4}
_DTYPE_BYTES = np.array([DTYPE_BYTES.get(d, 0) for d in range(4)])
LI, LOAD, STORE, PRELOAD, MATMUL, DRAIN, PASS, CHAIN, ZERO_TEST, FENCE, POP, OTHER = range(12)


def _category(mnemonic: str, t: str) -> int:
    """What the features count an instruction as (the first that applies)."""
    rules = (
        (mnemonic == "li", LI),
        (t in ("dma_load", "dma_load_transposed"), LOAD),
        (t == "dma_store", STORE),
        (t == "preload", PRELOAD),
        (t in ("matmul", "matmul_stream"), MATMUL),
        (t == "drain", DRAIN),
        (t in PASS_TIMINGS, PASS),
        (t in CHAIN_TIMINGS, CHAIN),
        (t == "zero_test", ZERO_TEST),
        (mnemonic == "fence", FENCE),
        (mnemonic == "sync.pop", POP),
    )
    return next((c for applies, c in rules if applies), OTHER)


_CATEGORY = np.array([_category(spec.mnemonic, spec.timing) for spec in _SPECS])
_HAS_N = np.array([any(f.name == "n" for f in spec.fields) for spec in _SPECS])
_CHAIN_LOAD = np.array([spec.timing in ("chain_load", "chain_stream") for spec in _SPECS])
_CHAIN_REDUCE = np.array([spec.timing == "chain_reduce" for spec in _SPECS])
_CHAIN_STORE = np.array([spec.timing == "chain_store" for spec in _SPECS])
_PUSH = np.array([spec.mnemonic == "sync.push" for spec in _SPECS])
_STREAM_MATMUL = np.array([spec.timing == "matmul_stream" for spec in _SPECS])


def _spec_indices(words: np.ndarray) -> np.ndarray:
    """Each word's row of the ISA table (a ValueError naming the first word that matches none)."""
    found = np.full(words.shape, -1)
    for mask, matches, specs in _MATCHES:
        masked = words & mask
        at = np.minimum(np.searchsorted(matches, masked), len(matches) - 1)
        hit = (matches[at] == masked) & (found < 0)
        found[hit] = specs[at[hit]]
    if (found < 0).any():
        raise ValueError(f"word {int(words[np.argmax(found < 0)]):#018x} matches no instruction")
    return found


def _fields(words: np.ndarray, *names: str) -> tuple[np.ndarray, ...]:
    """The named fields of every word (int64)."""
    out = []
    for name in names:
        f = FIELDS[name]
        out.append(((words >> np.uint64(f.lo)) & np.uint64((1 << f.width) - 1)).astype(np.int64))
    return tuple(out)


def _strides(
    li: np.ndarray, rd: np.ndarray, imm: np.ndarray, dma: np.ndarray, rs2: np.ndarray, row_bytes: np.ndarray
) -> np.ndarray:
    """Each DMA's row stride: the value the last `li` before it (positions `li`, `dma` in the program) put in its
    stride register (rs2), else its row bytes (the generators load every constant with `li`; other writes are not
    followed). One search over (register, position) keys."""
    if not li.size:
        return row_bytes
    span = max(int(li[-1]), int(dma[-1]) if dma.size else 0) + 1
    keys = rd * span + li
    order = np.argsort(keys, kind="stable")
    keys, values = keys[order], imm[order]
    at = np.searchsorted(keys, rs2 * span + dma) - 1
    found = np.maximum(at, 0)
    same = (at >= 0) & (keys[found] // span == rs2)
    return np.where(same, values[found], row_bytes)


def _bursts(cfg: MachineConfig, rows: np.ndarray, row_bytes: np.ndarray, strides: np.ndarray) -> int:
    """Total `timing.dma_bursts` of the transfers (each distinct shape asked once; rows < 2^12, row bytes < 2^16)."""
    if not rows.size:
        return 0
    shapes, counts = np.unique((strides << 28) | (row_bytes << 12) | rows, return_counts=True)
    return sum(
        int(n) * timing.dma_bursts(cfg, int(k) & 0xFFF, (int(k) >> 12) & 0xFFFF, int(k) >> 28)
        for k, n in zip(shapes, counts, strict=True)
    )


def _chain_reduce_elems(kind: np.ndarray, n: np.ndarray) -> int:
    """Elements the chain reductions (`vc.rsum`, ...: no n field) pass over: their register's length, taken as the
    longest chain load (`vc.ld`, `vc.lds`) of their chain (since the last `vc.st`; a chain without one: the chain
    before it). A broadcast operand's shorter load does not shorten it."""
    reduces = np.flatnonzero(_CHAIN_REDUCE[kind])
    if not reduces.size:
        return 0
    chain = np.cumsum(_CHAIN_STORE[kind])  # a chain ends at its store
    key = np.where(_CHAIN_LOAD[kind], (chain << 32) | n, 0)  # the latest chain's loads rank first (n < 2^32)
    return int((np.maximum.accumulate(key)[reduces] & 0xFFFFFFFF).sum())


def _matrix_segments(kind: np.ndarray, category: np.ndarray, src: np.ndarray) -> int:
    """Runs of matmuls the matrix unit waits out: instructions that need every earlier result (`mx.drain`, `mx.mms`,
    a `sync.push` from the matrix unit: `timing.matrix_drained_start`) right after a matmul, preloads aside. Each
    pays the array's latency once; back-to-back drains after one run wait once."""
    matmul = category == MATMUL
    waits = (category == DRAIN) | _STREAM_MATMUL[kind] | (_PUSH[kind] & (src == int(Unit.matrix)))
    at = np.flatnonzero(matmul | waits)
    return int(np.count_nonzero(waits[at[1:]] & matmul[at[:-1]]))


def _steps(pops: np.ndarray, matmuls: int, vector_instrs: int, dma_stores: int) -> int:
    """Pipeline steps of the kernel's main compute unit: how many times it receives a step's tiles (`pops`: the
    `sync.pop` destinations)."""
    for unit, busy in ((Unit.matrix, matmuls), (Unit.vector, vector_instrs), (Unit.store, dma_stores)):
        if busy:
            return int(np.count_nonzero(pops == int(unit)))
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
    """The kernel's features, counted from its instruction words with numpy (a large conv kernel has ~40k)."""
    sub = mc.subgraph(kernel.group.nodes)
    text = kernel.program.text if kernel.program is not None else []
    words = np.asarray(text, dtype=np.uint64)
    kind = _spec_indices(words)
    category = _CATEGORY[kind]
    fields = ("rows", "cols", "dtype", "rs2", "rd", "imm32", "n", "dst", "src")
    rows, cols, dtype, rs2, rd, imm, n, dst, src = _fields(words, *fields)
    dma = np.flatnonzero((category == LOAD) | (category == STORE))
    li = np.flatnonzero(category == LI)
    row_bytes = cols[dma] * _DTYPE_BYTES[dtype[dma]]
    strides = _strides(li, rd[li], imm[li], dma, rs2[dma], row_bytes)
    store = category[dma] == STORE
    nbytes = rows[dma] * row_bytes
    dma_rows = rows[dma]

    def most(values: np.ndarray) -> int:
        return int(values.max()) if values.size else 0

    preload, matmul, drain = category == PRELOAD, category == MATMUL, category == DRAIN
    counts = {
        "instructions": len(words),
        "dma_loads": int(np.count_nonzero(~store)),
        "dma_stores": int(np.count_nonzero(store)),
        "load_bytes": int(nbytes[~store].sum()),
        "store_bytes": int(nbytes[store].sum()),
        "load_bursts": _bursts(mc.config, dma_rows[~store], row_bytes[~store], strides[~store]),
        "store_bursts": _bursts(mc.config, dma_rows[store], row_bytes[store], strides[store]),
        "preloads": int(np.count_nonzero(preload)),
        "matmuls": int(np.count_nonzero(matmul)),
        "matmul_rows": int(rows[matmul].sum()),
        "drains": int(np.count_nonzero(drain)),
        "drain_rows": int(rows[drain].sum()),
        "vector_instrs": int(np.count_nonzero(category == PASS)),
        "vector_pass_elems": int(n[(category == PASS) & _HAS_N[kind]].sum()) + _chain_reduce_elems(kind, n),
        "chain_ops": int(np.count_nonzero(category == CHAIN)),
        "phases": int(np.count_nonzero(category == FENCE)),
        "zero_tests": int(np.count_nonzero(category == ZERO_TEST)),
    }
    tile = {"m": most(rows[matmul]), "k": most(rows[preload]), "n": most(cols[preload])}
    steps = _steps(dst[category == POP], counts["matmuls"], counts["vector_instrs"], counts["dma_stores"])
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
        steps=steps,
        load_bursts=counts["load_bursts"],
        store_bursts=counts["store_bursts"],
        matrix_segments=_matrix_segments(kind, category, src),
    )
