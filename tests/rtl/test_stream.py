"""mx.mms -> stream FIFO -> vc.lds on the RTL against the simulator's chain_stream timing rule.

The vector side may start before the first row exists (it waits), or after some rows wait in the FIFO;
every beat must leave when `chain_stream_finish` says its prefix of the stream is done.
"""

from __future__ import annotations

import numpy as np
import pytest

from isa import DType, make
from rtl.replay import run_cases
from rtl.stimulus import stream_case
from rtl.units import STREAM
from simulator import timing
from simulator.config import PRESETS
from simulator.semantics.matrix import matmul

pytestmark = pytest.mark.rtl


@pytest.mark.parametrize("config", ["tiny", "base"])
def test_stream_path_matches_chain_stream_timing(config: str, tmp_path) -> None:
    cfg = PRESETS[config]
    n, depth = cfg.array_size, STREAM.params(cfg)["DEPTH"]
    rng = np.random.default_rng(5)
    cases = []
    # (rows, mms start, lds start): lds early, together, and late enough that up to DEPTH rows wait
    for rows, mms, lds in ((1, 0, 0), (3 * n, 0, 0), (2 * n, 5, 0), (2 * n, 0, 2 * n - 1 + depth - 1), (n, 3, 1)):
        w = rng.integers(-128, 128, (n, n), dtype=np.int8)
        a = rng.integers(-128, 128, (rows, n), dtype=np.int8)
        word = make("vc.lds", 1, rows * n)
        last_ready = timing.stream_row_ready(cfg, mms, rows - 1)
        charged = timing.chain_stream_cycles(cfg, rows * n, word.spec.latency, lds, last_ready)
        label = f"stream rows={rows} mms@{mms} lds@{lds}"
        product = matmul(a, w, DType.i8)
        cases.append(stream_case(cfg, label, word, w, a, product, mms_start=mms, lds_start=lds, charged=charged))
    report = run_cases(STREAM, cfg, cases, vcd_dir=tmp_path)
    assert report.ok, report.first_mismatch()
