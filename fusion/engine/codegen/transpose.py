"""Layout transforms without the baseline's strided DMAs: the `transpose_load` strategy of a Transpose node.

Element transposes (the output's last axis is another input axis): the baseline moves one element per DMA row.
The transposing load (`dma.ldt`) reads rows of contiguous elements and transposes them in flight: ONE load of
the whole input seen as a matrix leaves at most whole rows to reorder (`_whole_steps`), or, when reordering them
would cost more than it saves, one load per J x I block.

Row transposes: a Transpose that keeps the last axis (an attention head split or merge) moves whole rows, but
the baseline still needs one strided DMA per leading index, each paying the access latency on the in-order DMA
unit (8 x ~116 cycles for a 4 KiB head split). Here the input comes in with one contiguous load, the vector unit
copies each run of rows that stay adjacent to its place in the output order (`v.copy`, local to local, a couple
of cycles per row), and one contiguous store writes the output: two DMAs whatever the permutation. The same
local row permutation lets a writer store rows that an absorbed Transpose scatters with one DMA
(`scattered_rows`, used by the swapped GEMM). Which variant runs is decided with the timing rules
(`simulator.timing`): vector-copy cycles against the DMA access latencies they save.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np

from fusion.engine.codegen.matrix_group import is_dense
from fusion.engine.errors import CodegenError
from fusion.graph.ir import Node
from fusion.graph.ops import OpType
from fusion.lower.context import LowerContext
from fusion.lower.emitter import Emitter, Step
from fusion.lower.local_alloc import TileArena, largest_fitting
from fusion.lower.views import MAX_COLS, MAX_ROWS, View, dense, transfers
from isa import BY_MNEMONIC
from isa.enums import DType, Unit
from isa.fields import FIELDS
from simulator import timing
from simulator.config import MachineConfig

MAX_VECTOR_ELEMS = (1 << FIELDS["n"].width) - 1  # elements one vector instruction covers
COPY_LATENCY = BY_MNEMONIC["v.copy"].latency


def transposed_source(cx: LowerContext, node: Node) -> View:
    """The input seen in output order; raises CodegenError unless a transposing load fits it."""
    if node.op != OpType.Transpose:
        raise CodegenError(f"node {node.name!r} ({node.op.value}) is not a Transpose")
    src = cx.view(node.inputs[0]).permute(node.attr("perm"))
    es = src.dtype.size
    if len(src.shape) < 2 or src.strides[-2] != es or src.strides[-1] == es:
        raise CodegenError(f"node {node.name!r}: the output's rows are not input columns (no transposing load)")
    if src.shape[-1] > MAX_ROWS or src.shape[-2] > MAX_COLS:
        raise CodegenError(f"node {node.name!r}: a {src.shape[-1]} x {src.shape[-2]} block exceeds one DMA")
    return src


@dataclass(frozen=True)
class LocalTranspose:
    """A Transpose's output assembled densely in local memory from its dense input: ONE DMA into a staging tile
    (a contiguous `dma.ld`, or for an element transpose a whole-tensor `dma.ldt` of the input seen as
    `ldt` = (rows, cols)), then the `v.copy` runs (`row_runs`) that put rows of `width` elements in output order
    (none: the staging tile already is the output)."""

    source: View
    ldt: tuple[int, int] | None
    runs: tuple[tuple[int, int, int], ...]
    width: int

    @property
    def nbytes(self) -> int:
        return self.source.size * self.source.dtype.size

    def copy_cycles(self, cfg: MachineConfig) -> int:
        return copy_cycles(cfg, self.runs, self.width)

    def load(self, em: Emitter, staging: int) -> None:
        x = self.source
        if self.ldt is None:
            em.dma_load(x.reshape_dense((x.size,)), staging)
            return
        rows, cols = self.ldt
        local, dram, stride = em.regs(staging, x.address, cols * x.dtype.size)
        em.b.dma_ldt(local, dram, stride, rows, cols, x.dtype.name)

    def permute(self, em: Emitter, out: int, staging: int) -> None:
        copy_runs(em, list(self.runs), out, staging, self.width, self.source.dtype)


def local_transpose(cx: LowerContext, node: Node) -> LocalTranspose | None:
    """How to assemble the Transpose's output locally (see `LocalTranspose`); None when its input or output is
    not dense, one DMA cannot carry the input or one vector copy a row."""
    x, out = cx.view(node.inputs[0]), cx.view(node.outputs[0])
    perm = tuple(node.attr("perm"))
    if not (is_dense(x) and is_dense(out)) or x.dtype != out.dtype:
        return None
    n, a = len(perm), perm[-1]
    if x.shape[a] > MAX_VECTOR_ELEMS:
        return None
    if a == n - 1:  # rows move whole: a contiguous load, rows reordered
        runs = row_runs(x.shape, perm)
        in_place = len(runs) == 1 and runs[0][:2] == (0, 0)
        return LocalTranspose(x, None, () if in_place else tuple(runs), x.shape[-1])
    p, q = math.prod(x.shape[: a + 1]), math.prod(x.shape[a + 1 :])
    if p > MAX_ROWS or q > MAX_COLS:
        return None
    t_axes = (*range(a + 1, n), *range(a + 1))
    runs = row_runs(tuple(x.shape[axis] for axis in t_axes), tuple(t_axes.index(axis) for axis in perm))
    return LocalTranspose(x, (p, q), () if len(runs) == 1 else tuple(runs), x.shape[a])


def transpose_steps(cx: LowerContext, node: Node) -> list[Step]:
    if node.op == OpType.Transpose and tuple(node.attr("perm"))[-1] == len(node.attr("perm")) - 1:
        return row_permute_steps(cx, node)
    try:
        src = transposed_source(cx, node)
    except CodegenError:  # no per-block form: the whole-tensor one, if it applies
        if node.op != OpType.Transpose:
            raise
        whole = _whole_steps(cx, node, None)
        if whole is None:
            raise
        return whole
    out = cx.view(node.outputs[0])
    i_len, j_len = src.shape[-2], src.shape[-1]
    block = i_len * j_len
    lead = math.prod(src.shape[:-2])
    es = src.dtype.size
    whole = _whole_steps(cx, node, lead)
    if whole is not None:
        return whole
    probe = TileArena(cx.config, 0)
    per_step = largest_fitting(min(lead, MAX_ROWS), lambda b: probe.fits([b * block * es]))
    if per_step == 0:
        raise CodegenError(f"node {node.name!r}: one {i_len} x {j_len} block does not fit a buffer half")
    flat_out = out.reshape_dense((lead, block))
    steps = []
    for l0 in range(0, lead, per_step):
        count = min(per_step, lead - l0)
        tile = TileArena(cx.config, len(steps), cx.rotation).tile(count * block * es)

        def load(em: Emitter, l0=l0, count=count, tile=tile) -> None:
            for k in range(count):
                index = _unravel(l0 + k, src.shape[:-2])
                part = src.index(index)
                local, dram, stride = em.regs(tile + k * block * es, part.address, part.strides[-1])
                em.b.dma_ldt(local, dram, stride, j_len, i_len, src.dtype.name)

        steps.append(Step([], [(Unit.load, load)], [(tile, flat_out.slice(0, l0, count))]))
    return steps


def _whole_steps(cx: LowerContext, node: Node, lead: int | None) -> list[Step] | None:
    """An element transpose as ONE transposing load of the whole input and, when needed, a row permutation.

    With a = the input axis that becomes the output's last, the input seen as a P x Q matrix (P = the product of
    axes 0..a, Q = of the rest) transposes in one `dma.ldt` into Q x P, a tensor with axes (a+1, .., n-1, 0, .., a):
    its last axis is already the output's, so what is left moves whole rows of shape[a] elements (`row_runs`,
    `v.copy` on the vector unit), or nothing (perm (1, 2, 0), a rotation: the load is the transpose). Two DMAs
    instead of one per J x I block. None when it does not apply, does not fit, or its row copies cost more
    vector cycles than the `lead` per-block loads' access latencies (`simulator.timing`; None: no per-block form)."""
    lt = local_transpose(cx, node)
    if lt is None or not TileArena(cx.config, 0).fits([lt.nbytes, lt.nbytes]):
        return None
    if lead is not None and lt.copy_cycles(cx.config) >= lead * cx.config.dram_latency:
        return None
    return [_local_step(cx, node, lt)]


def _local_step(cx: LowerContext, node: Node, lt: LocalTranspose) -> Step:
    """One step: the Transpose's output assembled locally (`LocalTranspose`), then one contiguous store."""
    arena = TileArena(cx.config, 0, cx.rotation)
    staging = arena.tile(lt.nbytes)
    ordered = arena.tile(lt.nbytes) if lt.runs else staging
    out = cx.view(node.outputs[0])
    compute = [(Unit.load, partial(lt.load, staging=staging))]
    if lt.runs:
        compute.append((Unit.vector, partial(lt.permute, out=ordered, staging=staging)))
    return Step([], compute, [(ordered, out.reshape_dense((out.size,)))])


def copy_runs(em: Emitter, runs: list[tuple[int, int, int]], to: int, frm: int, width: int, dtype: DType) -> None:
    """`v.copy` of each run of rows (`row_runs`) from the tile at `frm` to the tile at `to`, in pieces one vector
    instruction covers."""
    row_bytes = width * dtype.size
    chunk = max(1, MAX_VECTOR_ELEMS // width)
    for o, i, count in runs:
        for k in range(0, count, chunk):
            rows = min(chunk, count - k)
            em.b.v_copy(*em.regs(to + (o + k) * row_bytes, frm + (i + k) * row_bytes), rows * width, dtype.name)


def _unravel(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(int(i) for i in np.unravel_index(flat, shape)) if shape else ()


def row_runs(shape: tuple[int, ...], perm: tuple[int, ...]) -> list[tuple[int, int, int]]:
    """(output row, input row, count) runs of a Transpose keeping the last axis: output rows [o, o + count) are
    input rows [i, i + count), in the row-major order of the leading axes."""
    lead = shape[:-1]
    return _runs(np.arange(math.prod(lead)).reshape(lead).transpose(perm[:-1]).ravel())


def _runs(rows: np.ndarray) -> list[tuple[int, int, int]]:
    """(position, rows[position], count): the maximal stretches where `rows` goes up by one."""
    starts = np.concatenate(([0], np.flatnonzero(np.diff(rows) != 1) + 1))
    counts = np.diff(np.concatenate((starts, [len(rows)])))
    return [(int(k), int(rows[k]), int(c)) for k, c in zip(starts, counts, strict=True)]


def copy_cycles(cfg: MachineConfig, runs: Sequence[tuple[int, int, int]], width: int) -> int:
    """Vector cycles of `copy_runs` (the timing rules' price of a local row permutation)."""
    return sum(timing.vector_cycles(cfg, c * width, COPY_LATENCY) for *_, c in runs)


def scattered_rows(view: View, cfg: MachineConfig) -> tuple[View, list[tuple[int, int, int]]] | None:
    """A view listing whole rows of a dense tensor in another order (a Transpose of leading axes seen from the
    writer): the dense tensor as a flat view and the runs (dense row, listed row, count) that put the listed rows
    in place (`copy_runs`), so a tile in listed order is stored with ONE DMA after a local permutation instead of
    one strided DMA per leading index. None when the rows are already in order, are not such a permutation, or
    the row copies cost more vector cycles than the strided store's extra access latencies (`simulator.timing`)."""
    es = view.dtype.size
    width = view.shape[-1]
    if view.strides[-1] != es or is_dense(view):
        return None
    lead_shape, lead_strides = view.shape[:-1], view.strides[:-1]
    grid = np.indices(lead_shape).reshape(len(lead_shape), -1)
    flat = (np.asarray(lead_strides, dtype=np.int64)[:, None] * grid).sum(axis=0)
    row_bytes = width * es
    if flat.min() != 0 or np.any(flat % row_bytes):
        return None
    rows = flat // row_bytes
    if not np.array_equal(np.sort(rows), np.arange(len(rows))):
        return None
    runs = [(dense_row, listed, count) for listed, dense_row, count in _runs(rows)]
    if copy_cycles(cfg, runs, width) >= (len(transfers(view)) - 1) * cfg.dram_latency:
        return None
    return dense(view.address, (len(rows) * width,), view.dtype), runs


def row_permute_steps(cx: LowerContext, node: Node) -> list[Step]:
    """One step: contiguous load, `v.copy` per run of adjacent rows, contiguous store (see the module docstring)."""
    lt = local_transpose(cx, node)
    if lt is None:
        raise CodegenError(
            f"node {node.name!r}: a row permutation needs dense tensors of one dtype and rows one vector copy covers"
        )
    if not TileArena(cx.config, 0).fits([lt.nbytes, lt.nbytes]):
        raise CodegenError(f"node {node.name!r}: {lt.nbytes}-byte input and output tiles do not fit a buffer slot")
    return [_local_step(cx, node, lt)]
