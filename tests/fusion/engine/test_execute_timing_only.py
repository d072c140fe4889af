"""`execute.timing_cycles` simulates timing only: every kernel the fusion engine simulates while planning and running
a bundled model, simulated both ways (the full simulator is the oracle), counts alike."""

from __future__ import annotations

import numpy as np
import pytest
from engine_helpers import MODELS

import fusion.engine.execute as execute
from fusion.engine.engine import EngineOptions, FusionEngine
from fusion.engine.validation import ValidationPolicy
from fusion.lower.compiler import load_graph
from simulator import simulate


@pytest.mark.parametrize(("name", "dtype"), [("resnet_block", "int8"), ("mlp", "fp32"), ("encoder_post_d64", "int8")])
def test_every_kernel_planned_for_a_bundled_model_counts_alike(monkeypatch, name: str, dtype: str) -> None:
    """Each program the engine simulates while planning and running a model (its candidate kernels, measured on
    zeros, and the plan's kernels on the model's values), also simulated the other way: the same counters."""
    compared: list[int] = []

    def both(program, config, inputs=None, checked=False, timing_only=False):
        full = simulate(program, config, inputs, checked=checked)
        timed = simulate(program, config, inputs, checked=checked, timing_only=True)
        assert (timed.counters, timed.kernel_counters) == (full.counters, full.kernel_counters)
        compared.append(len(program.text))
        return timed if timing_only else full

    monkeypatch.setattr(execute, "simulate", both)
    graph = load_graph(MODELS / f"{name}.onnx")
    data = np.load(MODELS / f"{name}.npz")["input"]
    engine = FusionEngine(graph, "base", dtype, EngineOptions(validation=ValidationPolicy("off")))
    engine.run({graph.inputs[0]: data})
    assert len(compared) >= 3
