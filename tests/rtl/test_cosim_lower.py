"""The baseline's window kernels on the RTL: the implicit-GEMM Conv (`fusion.lower.kernels.conv_implicit`: DMA-
gathered panels, masks, strided compaction, the GEMM and its epilogue), the depthwise Conv and the max and
average pools on the unpadded frame (`frame_windows`, `frame_pool`) and the window kernel's average pool
(`windows`), compiled for `tiny`, simulated on seeded inputs, and every matrix and vector transaction the RTL
has a datapath for replayed on the Verilog units, values and cycles exact: int8, the matrix unit and the
integer vector ops; fp32, the integer ops on float bits (the padding masks), float arithmetic having no RTL
datapath."""

from __future__ import annotations

import numpy as np
import pytest

from fusion.graph.builder import GraphBuilder
from fusion.graph.ir import Graph
from fusion.graph.ops import OpType
from fusion.lower.compiler import compile as compile_model
from rtl.cosim import Recorded, cosimulate
from simulator.config import PRESETS
from simulator.run import simulate

pytestmark = pytest.mark.rtl
TINY = PRESETS["tiny"]


def _graph(name: str, op: OpType, x: tuple[int, ...], weight: tuple[int, ...] | None = None, **attrs) -> Graph:
    rng = np.random.default_rng(11)
    b = GraphBuilder(name)
    h = b.op(OpType.Relu, b.input("x", x), name="relu")  # int8 data into the window kernel
    args = [h]
    if weight is not None:
        args += [b.constant(rng.standard_normal(weight).astype(np.float32), "w")]
        args += [b.constant(rng.standard_normal(weight[0]).astype(np.float32), "b")]
    b.output(b.op(op, *args, name=name, **attrs))
    return b.build()


def _conv(name, x, weight, strides, pads, group=1, dilations=None):
    dilations = dilations or (1,) * len(strides)
    return _graph(name, OpType.Conv, x, weight, strides=strides, pads=pads, dilations=dilations, group=group)


def _pool(name, op, x, kernel, strides, pads, **extra):
    attrs = {"kernel": kernel, "strides": strides, "pads": pads, "dilations": (1,) * len(kernel), "ceil_mode": 0}
    return _graph(name, op, x, **attrs, **extra)


CASES = {
    "conv_same_3x3": _conv("conv", (1, 6, 5, 5), (8, 6, 3, 3), (1, 1), (1, 1, 1, 1)),
    "conv_strided_grouped": _conv("conv", (1, 4, 7, 6), (6, 2, 3, 2), (2, 2), (1, 0, 1, 1), group=2),
    "conv_1d_dilated": _conv("conv", (2, 3, 9), (5, 3, 3), (1,), (2, 1), dilations=(2,)),
    "conv_stem_channel_major": _conv("conv", (1, 2, 9, 9), (4, 2, 3, 3), (2, 2), (1, 1, 1, 1)),
    "depthwise_frame": _conv("conv", (1, 4, 6, 6), (4, 1, 3, 3), (1, 1), (1, 1, 1, 1), group=4),
    "max_pool_frame": _pool("pool", OpType.MaxPool, (1, 3, 8, 8), (3, 3), (2, 2), (1, 1, 1, 1)),
    "average_pool_frame": _pool(
        "pool", OpType.AveragePool, (1, 3, 6, 6), (3, 3), (1, 1), (1, 1, 1, 1), count_include_pad=0
    ),
    "average_pool_window": _pool(
        "pool", OpType.AveragePool, (1, 3, 2, 2), (2, 2), (1, 2), (0, 0, 1, 1), count_include_pad=0
    ),
}


def _recorded(name: str, graph: Graph, dtype: str) -> Recorded:
    x = {"x": np.random.default_rng(3).standard_normal(graph.types["x"].shape).astype(np.float32)}
    model = compile_model(graph, TINY, dtype, samples=[x] if dtype == "int8" else None, cleanup=False)
    placed = {model.tensor_names[k]: v for k, v in x.items()}
    sim = simulate(model.program, TINY, placed, record_transactions=True)
    return Recorded(f"{name}:{dtype}", model.program, sim.transactions)


@pytest.mark.parametrize("dtype", ["int8", "fp32"])
def test_baseline_window_kernels_match_the_rtl(dtype: str) -> None:
    runs = [_recorded(name, graph, dtype) for name, graph in CASES.items()]
    reports = cosimulate(TINY, runs)
    for report in reports:
        assert report.ok, "\n".join(report.lines())
    compared = {r.program: r.compared for r in reports}
    assert all(compared.values()), compared  # every kernel has replayed transactions
    units = {b.unit for r in reports for b in r.batches}
    conv_units = {b.unit for r in reports if r.program.startswith("conv_") for b in r.batches}
    if dtype == "int8":
        assert {"matrix_unit", "vector_unit"} <= units and "matrix_unit" in conv_units
    else:
        assert units == conv_units == {"vector_unit"}
