"""The timing rules of docs/architecture.md, one pure function each: the only copy of every formula.

The simulator, the fusion engine's analytic cost model and the RTL tests all call these. `TIMING_RULES`
maps each name used in the ISA table's `timing` column to its function; the simulator checks at import
that every row's rule exists. Results are cycles an instruction occupies its unit (scalar rules: issue
cycles), without stalls caused by other units.
"""

from __future__ import annotations

from collections.abc import Callable

from simulator.config import MachineConfig


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def dma_bursts(cfg: MachineConfig, rows: int, row_bytes: int, stride: int) -> int:
    """Bursts of a 2-D transfer: contiguous ones pack bursts, each strided row starts its own."""
    if rows <= 1 or stride == row_bytes:
        return _ceil_div(rows * row_bytes, cfg.burst_bytes)
    return rows * _ceil_div(row_bytes, cfg.burst_bytes)


def dma_transfer_cycles(cfg: MachineConfig, rows: int, row_bytes: int, stride: int) -> int:
    """Cycles the DRAM channel is busy moving the bursts (after the access latency)."""
    return _ceil_div(dma_bursts(cfg, rows, row_bytes, stride) * cfg.burst_bytes, cfg.dram_bytes_per_cycle)


def dma_cycles(cfg: MachineConfig, rows: int, row_bytes: int, stride: int) -> int:
    """`dma_load`, `dma_store`: DRAM latency plus burst transfer time."""
    return cfg.dram_latency + dma_transfer_cycles(cfg, rows, row_bytes, stride)


def dma_transposed_cycles(cfg: MachineConfig, rows: int, row_bytes: int, stride: int, latency: int) -> int:
    """`dma_load_transposed`: the same DRAM traffic, plus the transpose buffer's pipeline."""
    return dma_cycles(cfg, rows, row_bytes, stride) + latency


def preload_cycles(cfg: MachineConfig) -> int:
    """`preload`: weights shift into the array's shadow buffer one row per cycle. The weight port is busy N cycles
    and a matmul can switch to the new weights N cycles after the preload starts (`matmul_start`); meanwhile the
    array keeps computing with its active weights (double-buffered stationary weights)."""
    return cfg.array_size


def matmul_cycles(cfg: MachineConfig, rows: int) -> int:
    """`matmul`, `matmul_stream`: rows enter skewed one per cycle; the last leaves 2N - 1 cycles after it enters.

    This is the latency until the last result is in the accumulator (or, for `mx.mms`, out of the array): what an
    accumulator reader waits for. The array's input is busy only `matmul_input_cycles`. An `mx.mms` takes longer
    when the stream FIFO is full: it is done the cycle after its last row's `stream_row_out`.
    """
    return rows + 2 * cfg.array_size - 1


def matmul_input_cycles(cfg: MachineConfig, rows: int) -> int:
    """Cycles an `mx.mm`/`mx.mma` occupies the array's input: one row per cycle. The next matmul's first row may
    enter the cycle after this one's last row (the 2N - 1 skew is latency, not occupancy): back-to-back matmuls
    of R rows each take R per matmul plus one 2N - 1 at the end."""
    return rows


def matmul_start(ready: int, input_free: int, weights_ready: int) -> int:
    """Earliest start of an `mx.mm`/`mx.mma`: in order (`ready`), once the previous matmul's rows have entered
    (`input_free`, from `matmul_input_cycles`) and the last preload's weights are in (`weights_ready`: its start +
    `preload_cycles`). An accumulating matmul needs no more: the accumulator's read-modify-write happens where rows
    leave the array, in order, so it follows the earlier results into the same rows."""
    return max(ready, input_free, weights_ready)


def preload_start(ready: int, weights_free: int) -> int:
    """Earliest start of an `mx.preload`: in order, once the previous preload has finished shifting. It may start
    in the same cycle as the matmul that switches to the previous preload's weights (that switch reads the shadow
    buffer before the new rows overwrite it), and overlaps that matmul's rows."""
    return max(ready, weights_free)


def matrix_drained_start(ready: int, results: int) -> int:
    """Earliest start of an instruction that needs every earlier matrix result: `mx.drain`, `mx.mms` (it starts on
    an empty array, so a full-FIFO freeze stalls no other matmul), `sync.push` from the matrix unit (its token
    means the results are there), and a preload or matmul whose operand is in the accumulator. `results` is the
    latest finish (`matmul_cycles` after its start) of any earlier matrix instruction. A drain holds the whole
    unit until it finishes."""
    return max(ready, results)


def matrix_segment_cycles(cfg: MachineConfig, tiles: int, matmuls_per_tile: int, rows: int) -> int:
    """Cycles from the first preload of a run of `tiles` weight tiles, each one preload followed by
    `matmuls_per_tile` back-to-back matmuls of `rows` rows, until the last result is in the accumulator (where a
    drain can start). Each preload after the first overlaps the previous tile's last matmul, so consecutive tiles'
    first matmuls are (m - 1) * rows + max(N, rows) apart (`preload_start`, `matmul_start`)."""
    if tiles <= 0 or matmuls_per_tile <= 0:
        return 0
    n = preload_cycles(cfg)
    period = (matmuls_per_tile - 1) * matmul_input_cycles(cfg, rows) + max(n, matmul_input_cycles(cfg, rows))
    last = n + (tiles - 1) * period + (matmuls_per_tile - 1) * matmul_input_cycles(cfg, rows)
    return last + matmul_cycles(cfg, rows)


def matrix_lower_bound(cfg: MachineConfig, preloads: int, rows: int) -> int:
    """A lower bound on the matrix unit's time for `preloads` weight tiles and `rows` matmul rows in total, however
    they are split: the weight port takes every preload in turn and the input one row per cycle, and the last
    result needs 2N - 1 more cycles (`matmul_cycles` of 0 rows)."""
    if preloads <= 0 and rows <= 0:
        return 0
    return max(preloads * preload_cycles(cfg), matmul_input_cycles(cfg, rows)) + matmul_cycles(cfg, 0)


def stream_row_ready(cfg: MachineConfig, start: int, row: int) -> int:
    """Cycle at which output row `row` of a matmul started at `start` is complete (after de-skew)."""
    return start + row + 2 * cfg.array_size - 1


def stream_row_out(ready: int, previous_out: int, taken_depth_before: int) -> int:
    """Cycle a streamed row leaves the array into the stream FIFO (or, when it is empty, straight through it).

    Not before it is `ready` (`stream_row_ready`), nor before the row ahead of it has left (a stall freezes the
    whole array, so later rows slip with it), nor before the FIFO has room: the row `stream_fifo_depth` places
    earlier must have been taken by the vector unit in an earlier cycle (`taken_depth_before`; -1 if there is no
    such row). Cycles a row waits beyond `ready` and the row ahead are `matrix_stall_stream_full`.
    """
    return max(ready, previous_out + 1, taken_depth_before + 1)


def stream_row_taken(start: int, index: int, out: int) -> int:
    """Cycle a `vc.lds` started at `start` takes its `index`-th row: one row per cycle, once the row is out."""
    return max(start + index, out)


def epilogue_config_cycles(cfg: MachineConfig) -> int:
    """`epilogue_config`: one register write on the matrix unit."""
    return 1


def drain_cycles(cfg: MachineConfig, rows: int, latency: int) -> int:
    """`drain`: one N-wide accumulator row per cycle through bias -> activation -> requantize. The bias and a
    per-column (mult, shift) table (epflags pc) are read once, before the first row, within the latency."""
    return rows + latency


def vector_cycles(cfg: MachineConfig, n: int, latency: int) -> int:
    """`vector`, `vector_reduce`, `chain_load`, `chain_reduce`: ceil(n / L) beats plus the pipeline."""
    return _ceil_div(n, cfg.vector_lanes) + latency


def chain_op_cycles(cfg: MachineConfig, latency: int) -> int:
    """`chain_op`, `chain_store`: streams behind its producer, adding only its pipeline depth."""
    return latency


def chain_stream_finish(cfg: MachineConfig, start: int, n: int, last_row_out: int, latency: int) -> int:
    """`chain_stream` end cycle: consume n elements, but not before the last streamed row is out of the array
    (`stream_row_out`; without stalls that is `stream_row_ready`)."""
    return max(start + _ceil_div(n, cfg.vector_lanes), last_row_out + 1) + latency


def chain_stream_cycles(cfg: MachineConfig, n: int, latency: int, start: int, last_row_out: int) -> int:
    """`chain_stream`: cycles the vector unit is occupied when it starts at `start`."""
    return chain_stream_finish(cfg, start, n, last_row_out, latency) - start


def sync_cycles(cfg: MachineConfig) -> int:
    """`sync`: token pushes and pops take no unit time."""
    return 0


def scalar_cycles(cfg: MachineConfig) -> int:
    """`scalar`, `loop`, `control`: one issue cycle (hardware loops cost nothing per iteration)."""
    return 1


def branch_cycles(cfg: MachineConfig, taken: bool) -> int:
    """`branch`, `zero_test`, `dispatch`: one cycle, plus the penalty when taken."""
    return 1 + (cfg.branch_penalty if taken else 0)


def zero_count_clear_cycles(cfg: MachineConfig) -> int:
    """`zero_count_clear` (`zc.clr`): the store queue passes it on at once, in order with the stores."""
    return 0


def zero_count_read_start(ready: int, counted: int) -> int:
    """Earliest issue of a `zero_count_read` (`zc.rd`): the counter is complete once the last `dma.stz` issued
    before it has finished (`counted`: its finish; its zero-tile count is combinational on the store path, so it
    adds no cycle to the store). It then costs `scalar_cycles`."""
    return max(ready, counted)


def scalar_mem_cycles(cfg: MachineConfig) -> int:
    """`scalar_mem` (`lw`, `sw`): issue stalls for the DRAM latency."""
    return 1 + cfg.dram_latency


TIMING_RULES: dict[str, Callable[..., int]] = {
    "dma_load": dma_cycles,
    "dma_store": dma_cycles,
    "dma_load_transposed": dma_transposed_cycles,
    "preload": preload_cycles,
    "matmul": matmul_cycles,
    "matmul_stream": matmul_cycles,
    "epilogue_config": epilogue_config_cycles,
    "drain": drain_cycles,
    "vector": vector_cycles,
    "vector_reduce": vector_cycles,
    "chain_load": vector_cycles,
    "chain_op": chain_op_cycles,
    "chain_reduce": vector_cycles,
    "chain_store": chain_op_cycles,
    "chain_stream": chain_stream_cycles,
    "sync": sync_cycles,
    "zero_test": branch_cycles,
    "dispatch": branch_cycles,
    "scalar": scalar_cycles,
    "branch": branch_cycles,
    "loop": scalar_cycles,
    "control": scalar_cycles,
    "scalar_mem": scalar_mem_cycles,
    "zero_count_clear": zero_count_clear_cycles,
    "zero_count_read": scalar_cycles,
}
