"""`KernelFeatures` of a generated kernel: static counts read off its instructions, plus the group's work.

Counting the generated program (not a formula of the group) means every schedule choice (tile rows, flattening,
fused epilogue, chains) shows up in the features, for the analytic model and the learned one alike.
"""

from __future__ import annotations

from collections.abc import Sequence

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
_LOOPI = next(i for i, spec in enumerate(_SPECS) if spec.mnemonic == "loopi")


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


def _unrolled(words: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The words and their rows of the ISA table (`_spec_indices`) in the order they issue: each `loopi` body
    repeated its count of times (the loop instruction itself issues once), so the counts are the ones of the
    program unrolled. A `loop` (count in a register) is counted once."""
    kind = _spec_indices(words)
    starts = np.flatnonzero(kind == _LOOPI)
    if not starts.size:
        return words, kind
    n, lend = _fields(words[starts], "n", "lend")
    loops = sorted(zip(starts.tolist(), (starts + lend).tolist(), n.tolist(), strict=True))

    def spans(lo: int, hi: int, i: int) -> tuple[list[tuple[int, int, int]], int]:
        """Runs (first, end, times) of the indices issued over [lo, hi) from loops[i] on, in order (a body without
        loops of its own as one run of `count` times); the next loop index past hi."""
        out, at = [], lo
        while i < len(loops) and loops[i][0] < hi:
            pc, end, count = loops[i]
            out.append((at, pc + 1, 1))
            body, i = spans(pc + 1, end, i + 1)
            out += body * count if len(body) > 1 else [(pc + 1, end, count)]
            at = end
        out.append((at, hi, 1))
        return out, i

    runs = np.array(spans(0, len(words), 0)[0], dtype=np.int64)
    first, length, times = runs[:, 0], runs[:, 1] - runs[:, 0], runs[:, 2]
    sizes = length * times
    which = np.repeat(np.arange(len(runs)), sizes)  # each issued instruction's run
    issued = first[which] + (np.arange(int(sizes.sum())) - (np.cumsum(sizes) - sizes)[which]) % length[which]
    return words[issued], kind[issued]


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


def _pass_elems(kind: np.ndarray, category: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Elements each vector pass goes over (0 for other instructions): its n field, or for a chain reduction
    (`vc.rsum`, ...: no n field) its register's length, taken as the longest chain load (`vc.ld`, `vc.lds`) of its
    chain (since the last `vc.st`; a chain without one: the chain before it). A broadcast operand's shorter load
    does not shorten it."""
    elems = np.where((category == PASS) & _HAS_N[kind], n, 0)
    reduces = _CHAIN_REDUCE[kind]
    if reduces.any():
        chain = np.cumsum(_CHAIN_STORE[kind])  # a chain ends at its store
        key = np.where(_CHAIN_LOAD[kind], (chain << 32) | n, 0)  # the latest chain's loads rank first (n < 2^32)
        elems = np.where(reduces, np.maximum.accumulate(key) & 0xFFFFFFFF, elems)
    return elems


def _matrix_segments(kind: np.ndarray, category: np.ndarray, src: np.ndarray) -> int:
    """Runs of matmuls the matrix unit waits out: instructions that need every earlier result (`mx.drain`, `mx.mms`,
    a `sync.push` from the matrix unit: `timing.matrix_drained_start`) right after a matmul, preloads aside. Each
    pays the array's latency once; back-to-back drains after one run wait once."""
    matmul = category == MATMUL
    waits = (category == DRAIN) | _STREAM_MATMUL[kind] | (_PUSH[kind] & (src == int(Unit.matrix)))
    at = np.flatnonzero(matmul | waits)
    return int(np.count_nonzero(waits[at[1:]] & matmul[at[:-1]]))


def _main_unit(matmuls: int, vector_instrs: int, dma_stores: int) -> int | None:
    """The unit a kernel's pipeline steps hand their tiles to: the matrix unit, else the vector unit, else the
    store unit (None: a kernel with none of them)."""
    for unit, busy in ((Unit.matrix, matmuls), (Unit.vector, vector_instrs), (Unit.store, dma_stores)):
        if busy:
            return int(unit)
    return None


def _stepped(category: np.ndarray, phase: np.ndarray, dst: np.ndarray, main: int | None) -> np.ndarray:
    """Per instruction: whether its fenced phase (`phase`: the fence count before it) is pipelined, i.e. hands
    tiles to the main unit (a `sync.pop` into it). The other phases (a LayerNorm pass after a GEMM, a copy) run
    their loads, vector work and stores in series; a kernel without any step is all one pipeline."""
    stepped = phase[(category == POP) & (dst == main)] if main is not None else phase[:0]
    if not stepped.size:
        return np.ones(category.shape, dtype=bool)
    pipelined = np.zeros(int(phase[-1]) + 1, dtype=bool)  # per phase (phases count up from 0: a lookup table)
    pipelined[stepped] = True
    return pipelined[phase]


def _first_step_token(
    tokens: np.ndarray, kind: np.ndarray, pops: np.ndarray, src: np.ndarray, dst: np.ndarray, main: int | None
) -> int:
    """Position of the load unit's first token (of `tokens`, its pipelined ones) that feeds a step: one not into
    the vector unit, or into the vector unit when the vector unit's next token after popping it (`pops`: the
    pipelined sync.pop; tokens pair up first in, first out) does not hand it back to the load unit. An earlier one
    hands a prologue back (an A-stationary GEMM's resident A). Its first token without one."""
    vector = int(Unit.vector)
    pops = np.flatnonzero(pops & (src == int(Unit.load)) & (dst == vector))
    onward = np.flatnonzero(_PUSH[kind] & (src == vector))
    for handed, at in enumerate(tokens):
        if dst[at] != vector or main == vector:
            return int(at)
        after = onward[onward > pops[handed]] if handed < pops.size else onward[:0]
        if not after.size or dst[after[0]] != int(Unit.load):
            return int(at)
    return int(tokens[0]) if tokens.size else 0


def _beside(tokens: np.ndarray, category: np.ndarray, src: np.ndarray, dst: np.ndarray) -> bool:
    """Whether the load unit's first token goes to the vector unit and its next one, with no wait of the load unit
    between, to the matrix unit, which takes it before its first preload or matmul: those loads stream beside the
    vector unit's prologue and the first step waits for both (a matrix unit first fed by the vector unit alone, A
    and B cut into tiles, takes the load unit's token later)."""
    matrix = int(Unit.matrix)
    if tokens.size < 2 or dst[tokens[0]] != int(Unit.vector) or dst[tokens[1]] != matrix:
        return False
    if ((category[tokens[0] : tokens[1]] == POP) & (dst[tokens[0] : tokens[1]] == int(Unit.load))).any():
        return False
    takes = np.flatnonzero((category == POP) & (src == int(Unit.load)) & (dst == matrix))
    work = np.flatnonzero((category == PRELOAD) | (category == MATMUL))
    return bool(takes.size and work.size and takes[0] < work[0])


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


def program_counts(text: Sequence[int], config: MachineConfig) -> dict[str, int]:
    """The `KernelFeatures` counted from a program's instruction words (every field but the group's own: ops,
    strategy, dtype, shapes, work, loop order, sparsity), with numpy (a large conv kernel has ~40k words)."""
    words, kind = _unrolled(np.asarray(text, dtype=np.uint64))
    category = _CATEGORY[kind]
    fields = ("rows", "cols", "dtype", "rs2", "rd", "imm32", "n", "dst", "src")
    rows, cols, dtype, rs2, rd, imm, n, dst, src = _fields(words, *fields)
    dma = np.flatnonzero((category == LOAD) | (category == STORE))
    li = np.flatnonzero(category == LI)
    row_bytes = cols[dma] * _DTYPE_BYTES[dtype[dma]]
    strides = _strides(li, rd[li], imm[li], dma, rs2[dma], row_bytes)
    store = category[dma] == STORE
    nbytes = rows[dma] * row_bytes

    def most(values: np.ndarray) -> int:
        return int(values.max()) if values.size else 0

    def part(mask: np.ndarray) -> tuple[int, int]:
        """DMA count and DRAM bursts of the transfers `mask` selects (over the DMA instructions)."""
        return int(np.count_nonzero(mask)), _bursts(config, rows[dma][mask], row_bytes[mask], strides[mask])

    preload, matmul, drain, passes = category == PRELOAD, category == MATMUL, category == DRAIN, category == PASS
    elems = _pass_elems(kind, category, n)
    main = _main_unit(int(np.count_nonzero(matmul)), int(np.count_nonzero(passes)), int(np.count_nonzero(store)))
    phase = np.cumsum(category == FENCE)
    stepped = _stepped(category, phase, dst, main)
    serial = ~stepped
    # the vector work that prepares the main unit's first operands (an int8 GEMM's quantization of A, A cut into
    # k-slice tiles): the vector unit's passes before its first token into the main unit, when that token comes
    # before it first waits for the main unit (attention's softmax waits for the scores: not a head)
    vector = int(Unit.vector)
    into = np.flatnonzero(_PUSH[kind] & (src == vector) & (dst == main) & stepped) if main != vector else []
    waits = np.flatnonzero((category == POP) & (dst == vector) & (src == main) & stepped)
    prologue = len(into) > 0 and (not waits.size or into[0] < waits[0])
    vector_head = passes & stepped & (np.arange(len(words)) < into[0]) if prologue else np.zeros_like(passes)
    # the pipelined phases' loads the load unit issues before its first token: no step starts before they are in.
    # The lead, the first step's own loads after them: where that token hands a prologue back (an A-stationary
    # GEMM's resident A), up to the load unit's first token that feeds a step; where it hands the vector unit a
    # prologue (`vector_head`), the loads of the load unit's next token when the matrix unit waits for them too
    # (`_beside`: the weight tile the matrix unit waits for beside the quantization of the activation);
    # otherwise none (the vector unit prepares the first step's operands meanwhile)
    tokens = np.flatnonzero(_PUSH[kind] & (src == int(Unit.load)) & stepped)
    first = int(tokens[0]) if tokens.size else len(words)
    head = ~store & stepped[dma] & (dma < first)
    if vector_head.any():
        end = int(tokens[1]) if _beside(tokens, category, src, dst) else first
    else:
        end = _first_step_token(tokens, kind, (category == POP) & stepped, src, dst, main)
    lead = ~store & stepped[dma] & (dma > first) & (dma < end)
    loads, stores = part(~store), part(store)
    heads, leads, serial_loads, serial_stores = (
        part(head),
        part(lead),
        part(~store & serial[dma]),
        part(store & serial[dma]),
    )
    return {
        "dram_read_bytes": int(nbytes[~store].sum()),
        "dram_write_bytes": int(nbytes[store].sum()),
        "tile_m": most(rows[matmul]),
        "tile_n": most(cols[preload]),
        "tile_k": most(rows[preload]),
        "instructions": len(words),
        "dma_loads": loads[0],
        "dma_stores": stores[0],
        "preloads": int(np.count_nonzero(preload)),
        "matmuls": int(np.count_nonzero(matmul)),
        "matmul_rows": int(rows[matmul].sum()),
        "drains": int(np.count_nonzero(drain)),
        "drain_rows": int(rows[drain].sum()),
        "vector_instrs": int(np.count_nonzero(passes)),
        "vector_pass_elems": int(elems.sum()),
        "chain_ops": int(np.count_nonzero(category == CHAIN)),
        "phases": int(np.count_nonzero(category == FENCE)),
        "zero_tests": int(np.count_nonzero(category == ZERO_TEST)),
        "steps": int(np.count_nonzero((category == POP) & (dst == main))) if main is not None else 0,
        "load_steps": int(np.count_nonzero((category == POP) & (dst == main) & (src == int(Unit.load)))),
        "load_bursts": loads[1],
        "store_bursts": stores[1],
        "matrix_segments": _matrix_segments(kind, category, src),
        "head_loads": heads[0],
        "head_load_bursts": heads[1],
        "head_vector_instrs": int(np.count_nonzero(vector_head)),
        "head_vector_elems": int(elems[vector_head].sum()),
        "lead_loads": leads[0],
        "lead_load_bursts": leads[1],
        "serial_loads": serial_loads[0],
        "serial_load_bursts": serial_loads[1],
        "serial_stores": serial_stores[0],
        "serial_store_bursts": serial_stores[1],
        "serial_vector_instrs": int(np.count_nonzero(passes & serial)),
        "serial_vector_elems": int(elems[serial].sum()),
        "serial_chain_ops": int(np.count_nonzero((category == CHAIN) & serial)),
        "serial_phases": len(np.unique(phase[serial & np.isin(category, (LOAD, STORE, PASS, CHAIN))])),
    }


def kernel_features(mc: ModelContext, kernel: Kernel, zero_tile_fraction: float = 0.0) -> KernelFeatures:
    """The kernel's features: its group's ops, shapes and work, and the counts of its program."""
    sub = mc.subgraph(kernel.group.nodes)
    counts = program_counts(kernel.program.text if kernel.program is not None else [], mc.config)
    return KernelFeatures(
        ops=tuple(n.op.value for n in sub.nodes),
        strategy=kernel.group.strategy,
        dtype=mc.dtype,
        shapes=tuple(sub.types[v].shape for v in (*sub.inputs, *sub.outputs)),
        macs=sum(node_macs(sub, n) for n in sub.nodes),
        vector_elems=sum(vector_ops(sub, n) for n in sub.nodes),
        loop_order=loop_order(kernel.group, bool(counts["matmuls"])),
        zero_tile_fraction=zero_tile_fraction,
        **counts,
    )
