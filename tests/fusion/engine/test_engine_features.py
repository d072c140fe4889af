"""Kernel features carry the schedule's GEMM loop order, so cost models can tell A-stationary and swapped
kernels from the default order (and the HPM's feature vector encodes it)."""

from __future__ import annotations

import numpy as np
from engine_helpers import context

from fusion.engine.candidates import Candidate, schedules
from fusion.engine.features import kernel_features
from fusion.engine.kernel import try_build
from fusion.graph.builder import GraphBuilder
from fusion.graph.ops import OpType
from fusion.hpm.schema import FEATURE_NAMES, vectorize


def test_loop_order_follows_the_schedule() -> None:
    rng = np.random.default_rng(0)
    b = GraphBuilder("mm")
    x = b.input("x", (16, 64))
    b.output(b.op(OpType.MatMul, x, b.constant(rng.standard_normal((64, 128)).astype(np.float32), "w"), name="mm"))
    mc = context(b.build(), {"x": rng.standard_normal((16, 64)).astype(np.float32)}, "fp32")
    seen: dict[str, set[str]] = {}
    for group in schedules(mc, Candidate(("mm",), "single")):
        kernel = try_build(mc, group)
        assert not isinstance(kernel, str), kernel
        feats = kernel_features(mc, kernel)
        want = "knm" if group.strategy == "swapped" else "nm" if group.resident_a else "mn"
        assert feats.loop_order == want, group.schedule
        seen.setdefault(feats.loop_order, set()).add(group.schedule)
        row = dict(zip(FEATURE_NAMES, vectorize(feats, mc.config), strict=True))
        assert row[f"loop.{want}"] == 1.0 and sum(v for k, v in row.items() if k.startswith("loop.")) == 1.0
    assert set(seen) == {"mn", "nm", "knm"}
