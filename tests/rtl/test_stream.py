"""mx.mms -> stream FIFO -> vc.lds on the RTL against the simulator's stream timing rules.

The vector side may start before the first row exists (it waits), or after rows wait in the FIFO; when more
than `stream_fifo_depth` rows wait the array freezes until the vector side takes one (`stream_row_out`).
Every beat must leave when `chain_stream_finish` says its prefix of the stream is done, every input row must
be taken on the cycle the array advances, and every row must leave the array when `stream_row_out` says.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from isa import DType, make
from rtl.replay import run_cases
from rtl.stimulus import stream_case, stream_schedule
from rtl.units import STREAM
from simulator import timing
from simulator.config import PRESETS, MachineConfig
from simulator.semantics.matrix import matmul

pytestmark = pytest.mark.rtl
SHALLOW = replace(PRESETS["tiny"], name="shallow", stream_fifo_depth=2)
DEEP = replace(PRESETS["tiny"], name="deep", stream_fifo_depth=7)


def _cases(cfg: MachineConfig, model: MachineConfig) -> list:
    """Stream cases whose expectations come from `model`'s timing (the RTL is built for `cfg`)."""
    n, depth = cfg.array_size, cfg.stream_fifo_depth
    rng = np.random.default_rng(5)
    cases = []
    # (rows, mms start, lds start): lds early, together, late enough that up to DEPTH rows wait, and later
    # still, so the FIFO fills and the array stalls (once, or again and again)
    plan = [(1, 0, 0), (3 * n, 0, 0), (2 * n, 5, 0), (2 * n, 0, 2 * n - 1 + depth - 1), (n, 3, 1)]
    plan += [(3 * n, 0, 2 * n + depth + 3), (3 * n, 2, 6 * n), (depth + 1, 0, 2 * n + depth)]
    for rows, mms, lds in plan:
        w = rng.integers(-128, 128, (n, n), dtype=np.int8)
        a = rng.integers(-128, 128, (rows, n), dtype=np.int8)
        word = make("vc.lds", 1, rows * n)
        out, _ = stream_schedule(model, rows, mms, lds)
        charged = timing.chain_stream_cycles(model, rows * n, word.spec.latency, lds, out[-1])
        label = f"stream rows={rows} mms@{mms} lds@{lds}"
        product = matmul(a, w, DType.i8)
        cases.append(
            stream_case(
                model, label, word, w, a, product, mms_start=mms, lds_start=lds, charged=charged,
                mms_charged=out[-1] + 1 - mms,
            )
        )  # fmt: skip
    return cases


@pytest.mark.parametrize("cfg", [PRESETS["tiny"], PRESETS["base"], SHALLOW, DEEP], ids=lambda c: c.name)
def test_stream_path_matches_the_stream_timing_rules(cfg: MachineConfig, tmp_path) -> None:
    cases = _cases(cfg, cfg)
    model_stalls = [c for c in cases if c.expected[2].offsets[-1] > c.expected[1].offsets[-1] + 2 * cfg.array_size - 1]
    assert model_stalls  # some cases overflow the FIFO
    report = run_cases(STREAM, cfg, cases, vcd_dir=tmp_path)
    assert report.ok, report.first_mismatch()


def test_a_model_with_another_fifo_depth_disagrees_with_the_rtl(tmp_path) -> None:
    report = run_cases(STREAM, SHALLOW, _cases(SHALLOW, replace(SHALLOW, stream_fifo_depth=3)), vcd_dir=tmp_path)
    assert report.cycle_mismatches > 0 and "cycle mismatch" in report.first_mismatch()
