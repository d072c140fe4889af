"""The HPM's feature vector: numbers derived from a kernel's `KernelFeatures` and the machine it runs on.

Besides raw sizes and instruction counts, the vector holds the machine-normalised quantities the timing rules
are made of: the analytic model's per-unit busy times (`fusion.cost.analytic`, itself built on
`simulator.timing`), MACs per array cycle, bytes per DRAM cycle, DMA latency per transfer, tile sizes per array
row, and each unit's distance from the estimate in log cycles (how near it is to being the bottleneck: what
decides between near-tied schedules, and unlike raw sizes it carries over to an unseen machine). The learned targets
are log(measured / analytic), so the trees correct the analytic model, and a machine never seen in training is
still predicted through quantities that scale with it. Schema 4 adds what the analytic model leaves out and the
simulator charges: the padding of a partly filled last vector beat or array tile (`fill`), the estimate with
loads and stores in series (`serial_dma_cycles`), the DRAM latency and fill relative to the estimate, and the
traffic per scratchpad bank (bank conflicts). Schema 6 adds the on-chip traffic the analytic energy leaves out
(it charges each DMA byte twice locally and nothing else): the accumulator and scratchpad bytes the matrix unit's
operands, results and drains and the vector passes move, estimated from the program's counts, as shares of the
estimate, so kinds with much local work per DRAM byte (attention, whole MLPs, pooled convs) are told apart by what
makes their energy differ, not by their few samples. The schema (names in order) is hashed; a model trained on
another schema is refused at load time.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from itertools import permutations

import numpy as np

from fusion.cost.analytic import UnitTimes, energy_pj, unit_times
from fusion.cost.interface import KernelFeatures
from fusion.engine.strategies import REGISTRY
from simulator.config import MachineConfig

SCHEMA_VERSION = 6
# Fixed lists, not the engine's: an op type or strategy added to the engine later counts under "other" instead of
# changing the schema (and making every trained model stale). Schema 5 froze them. A strategy counts under the slot
# its record names (`Strategy.hpm_feature`: a new one says "other" until the schema adds it and the HPM is retrained).
STRATEGIES = ("unfused", "epilogue", "zero_skip", "swapped", "implicit_gemm", "chain", "transpose_load", "stream")
LOOP_ORDERS = ("", "mn", "nm", *("".join(p) for p in permutations("mnk")))
OPS = (
    *("Identity", "Relu", "Sigmoid", "Tanh", "Erf", "Gelu", "Exp", "Sqrt"),
    *("Add", "Sub", "Mul", "Div", "Pow", "BatchNorm"),
    *("Transpose", "Reshape", "Concat", "Split", "Slice", "Gather"),
    *("ReduceMean", "Softmax", "LayerNorm", "MatMul", "Gemm", "Conv", "MaxPool", "AveragePool"),
)
UNITS = ("load", "store", "matrix", "vector", "issue", "transfer")  # `UnitTimes` fields with a busy time

NUMERIC = (
    "array_size",
    "vector_lanes",
    "dram_bytes_per_cycle",
    "dram_latency",
    "burst_bytes",
    "log_spad_bytes",
    "log_acc_bytes",
    "queue_depth",
    "int8",
    "log_macs",
    "log_vector_elems",
    "log_dram_read",
    "log_dram_write",
    "log_instructions",
    "log_dma",
    "log_matmuls",
    "log_vector_instrs",
    "log_chain_ops",
    "phases",
    "zero_tests",
    "log_load_cycles",
    "log_store_cycles",
    "log_matrix_cycles",
    "log_vector_cycles",
    "log_issue_cycles",
    "log_fill_cycles",
    "log_roofline_cycles",
    "log_latency_cycles",
    "log_estimate_cycles",
    "log_transfer_cycles",
    "log_load_bursts",
    "log_store_bursts",
    "log_steps",
    "log_step_chain",
    "log_step_max",
    "log_estimate_energy",
    "dma_share",
    "matrix_share",
    "vector_share",
    "issue_share",
    "bytes_per_dma",
    "rows_per_matmul",
    "elems_per_pass",
    "tile_m",
    "tile_n",
    "tile_k",
    "tile_fill",
    "zero_tile_fraction",
    "n_ops",
    "log_in_elems",
    "log_out_elems",
    "log_max_dim",
    "log_min_dim",
    "row_bytes_over_burst",
    "tile_m_per_array",
    "tile_n_per_array",
    "tile_k_per_array",
    *(f"{unit}_gap" for unit in UNITS),
    "lane_fill_pass",
    "lane_fill_row",
    "array_fill_n",
    "array_fill_k",
    "serial_dma_gap",
    "latency_share",
    "dma_latency_share",
    "fill_share",
    "spad_banks",
    "log_bank_bytes",
    "read_per_bank",
    "write_per_bank",
    "dma_per_bank",
    "acc_energy_share",
    "spad_energy_share",
)
FEATURE_NAMES: tuple[str, ...] = (
    *NUMERIC,
    *(f"op.{op}" for op in OPS),
    "op.other",
    *(f"strategy.{s}" for s in (*STRATEGIES, "other")),
    *(f"loop.{o or 'none'}" for o in LOOP_ORDERS),
)


def schema_hash(names: Sequence[str] = FEATURE_NAMES) -> str:
    text = json.dumps({"version": SCHEMA_VERSION, "names": list(names)})
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _log(x: float) -> float:
    return math.log1p(max(x, 0.0))


def estimate_cycles(f: KernelFeatures, cfg: MachineConfig) -> float:
    return max(unit_times(f, cfg).cycles, 1.0)


def estimate_energy(f: KernelFeatures, cfg: MachineConfig) -> float:
    return max(energy_pj(f, cfg), 1.0)


def fill(size: float, width: int) -> float:
    """Share of `ceil(size / width)` beats of `width` that `size` elements use: 1.0 when the last beat is full,
    lower the more of it is padding (a 16-element row on 24 lanes uses 2/3 of its one beat)."""
    return size / (math.ceil(size / width) * width) if size > 0 else 1.0


def serial_dma_cycles(units: UnitTimes) -> float:
    """The analytic composition with loads and stores in series (each DMA's access latency exposed, as the
    simulator shows for kernels of few large transfers) instead of overlapped on the shared channel."""
    busy = (units.load + units.store, units.matrix, units.vector)
    return max(*busy, units.issue) + (sum(busy) - max(busy)) / max(units.steps, 1)


def local_bytes(f: KernelFeatures) -> tuple[float, float]:
    """(accumulator bytes, scratchpad bytes beyond the DMAs') a kernel moves, estimated from its counts at its
    largest tiles: each matmul row reads A's tile_k elements and accumulates tile_n 32-bit sums (read and write),
    each preload reads a tile_k x tile_n weight tile, each drained row reads tile_n sums and writes them back, and
    each vector pass element is read and written as 32 bits."""
    operand = 1 if f.dtype == "int8" else 4
    acc = 4 * f.tile_n * (2 * f.matmul_rows + f.drain_rows)
    spad = operand * (f.matmul_rows * f.tile_k + f.preloads * f.tile_k * f.tile_n + f.drain_rows * f.tile_n)
    return float(acc), float(spad + 8 * f.vector_pass_elems)


def vectorize(f: KernelFeatures, cfg: MachineConfig) -> np.ndarray:
    """The feature vector in FEATURE_NAMES order."""
    n, lanes, bw = cfg.array_size, cfg.vector_lanes, cfg.dram_bytes_per_cycle
    units = unit_times(f, cfg)
    est = max(units.cycles, 1.0)
    steps = max(f.steps, 1)
    dims = [d for s in f.shapes for d in s] or [1]
    in_elems = sum(math.prod(s) for s in f.shapes[:-1])  # a group's inputs, then its (one) output
    out_elems = math.prod(f.shapes[-1]) if f.shapes else 0
    last = f.shapes[0][-1] if f.shapes and f.shapes[0] else 1
    out_row = f.shapes[-1][-1] if f.shapes and f.shapes[-1] else 1
    elem_bytes = 4 if f.dtype == "fp32" else 1
    dmas = f.dma_loads + f.dma_stores
    bank = cfg.spad_bank_bytes
    energy = estimate_energy(f, cfg)
    acc_bytes, spad_bytes = local_bytes(f)
    numeric = {
        "array_size": n,
        "vector_lanes": lanes,
        "dram_bytes_per_cycle": bw,
        "dram_latency": cfg.dram_latency,
        "burst_bytes": cfg.burst_bytes,
        "log_spad_bytes": math.log(cfg.spad_bytes),
        "log_acc_bytes": math.log(cfg.acc_bytes),
        "queue_depth": cfg.queue_depth,
        "int8": float(f.dtype == "int8"),
        "log_macs": _log(f.macs),
        "log_vector_elems": _log(f.vector_elems),
        "log_dram_read": _log(f.dram_read_bytes),
        "log_dram_write": _log(f.dram_write_bytes),
        "log_instructions": _log(f.instructions),
        "log_dma": _log(dmas),
        "log_matmuls": _log(f.matmuls),
        "log_vector_instrs": _log(f.vector_instrs),
        "log_chain_ops": _log(f.chain_ops),
        "phases": f.phases,
        "zero_tests": f.zero_tests,
        "log_load_cycles": _log(units.load),
        "log_store_cycles": _log(units.store),
        "log_matrix_cycles": _log(units.matrix),
        "log_vector_cycles": _log(units.vector),
        "log_issue_cycles": _log(units.issue),
        "log_fill_cycles": _log(units.fill),
        "log_roofline_cycles": _log(max(f.macs / (n * n), (f.dram_read_bytes + f.dram_write_bytes) / bw)),
        "log_latency_cycles": _log(dmas * cfg.dram_latency),
        "log_estimate_cycles": math.log(est),
        "log_transfer_cycles": _log(units.transfer),
        "log_load_bursts": _log(f.load_bursts),
        "log_store_bursts": _log(f.store_bursts),
        "log_steps": _log(steps),
        "log_step_chain": _log((units.load + units.matrix + units.vector + units.store) / steps),
        "log_step_max": _log(max(units.load, units.matrix, units.vector, units.store) / steps),
        "log_estimate_energy": math.log(energy),
        "dma_share": (units.load + units.store) / est,
        "matrix_share": units.matrix / est,
        "vector_share": units.vector / est,
        "issue_share": units.issue / est,
        "bytes_per_dma": (f.dram_read_bytes + f.dram_write_bytes) / dmas / cfg.burst_bytes if dmas else 0.0,
        "rows_per_matmul": f.matmul_rows / f.matmuls if f.matmuls else 0.0,
        "elems_per_pass": f.vector_pass_elems / f.vector_instrs / lanes if f.vector_instrs else 0.0,
        "tile_m": f.tile_m,
        "tile_n": f.tile_n,
        "tile_k": f.tile_k,
        "tile_fill": (f.tile_n * f.tile_k) / (n * n) if f.tile_n else 0.0,
        "zero_tile_fraction": f.zero_tile_fraction,
        "n_ops": len(f.ops),
        "log_in_elems": _log(in_elems),
        "log_out_elems": _log(out_elems),
        "log_max_dim": _log(max(dims)),
        "log_min_dim": _log(min(dims)),
        "row_bytes_over_burst": last * elem_bytes / cfg.burst_bytes,
        "tile_m_per_array": f.tile_m / n,
        "tile_n_per_array": f.tile_n / n,
        "tile_k_per_array": f.tile_k / n,
        **{f"{unit}_gap": math.log(est) - _log(getattr(units, unit)) for unit in UNITS},
        "lane_fill_pass": fill(f.vector_pass_elems / f.vector_instrs, lanes) if f.vector_instrs else 1.0,
        "lane_fill_row": fill(out_row, lanes),
        "array_fill_n": fill(out_row, n),
        "array_fill_k": fill(last, n),
        "serial_dma_gap": math.log(est) - _log(serial_dma_cycles(units)),
        "latency_share": cfg.dram_latency / est,
        "dma_latency_share": dmas * cfg.dram_latency / est,
        "fill_share": units.fill / est,
        "spad_banks": cfg.spad_banks,
        "log_bank_bytes": math.log(bank),
        "read_per_bank": f.dram_read_bytes / bank,
        "write_per_bank": f.dram_write_bytes / bank,
        "dma_per_bank": (f.dram_read_bytes + f.dram_write_bytes) / dmas / bank if dmas else 0.0,
        "acc_energy_share": acc_bytes * cfg.energy.acc_byte / energy,
        "spad_energy_share": spad_bytes * cfg.energy.spad_byte / energy,
    }
    values = [float(numeric[k]) for k in NUMERIC]
    values += [float(f.ops.count(op)) for op in OPS] + [float(sum(op not in OPS for op in f.ops))]
    slot = REGISTRY[f.strategy].hpm_feature if f.strategy in REGISTRY else "other"
    values += [float(slot == s) for s in STRATEGIES] + [float(slot not in STRATEGIES)]
    values += [float(f.loop_order == o) for o in LOOP_ORDERS]
    return np.array(values, dtype=np.float64)


def matrix_of(features: Sequence[KernelFeatures], configs: Sequence[MachineConfig]) -> np.ndarray:
    return np.stack([vectorize(f, c) for f, c in zip(features, configs, strict=True)])


def baselines(features: Sequence[KernelFeatures], configs: Sequence[MachineConfig]) -> tuple[np.ndarray, np.ndarray]:
    """(analytic cycles, analytic energy) per row: what the learned residuals multiply."""
    pairs = [(estimate_cycles(f, c), estimate_energy(f, c)) for f, c in zip(features, configs, strict=True)]
    arr = np.array(pairs, dtype=np.float64).reshape(-1, 2)
    return arr[:, 0], arr[:, 1]
