"""Every program under examples/ assembles, runs race-free in checked mode and matches a numpy reference;
each fused version beats its unfused twin on cycles (and DRAM bytes where fusion removes traffic)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from assembler.source import assemble_file
from simulator import PRESETS, RunResult, simulate

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
RNG = np.random.default_rng(11)


def _i8(*shape: int) -> np.ndarray:
    return RNG.integers(-128, 128, shape, dtype=np.int8)


def _gemm() -> tuple[dict, dict]:
    a, w = _i8(64, 64), _i8(64, 64)
    return {"a": a, "w": w}, {"c": a.astype(np.int64) @ w}


def _gemm_bias_relu() -> tuple[dict, dict]:
    a, w, bias = _i8(64, 64), _i8(64, 64), RNG.integers(-20000, 20000, 64).astype(np.int32)
    t = np.maximum(a.astype(np.int64) @ w + bias, 0)
    return {"a": a, "w": w, "bias": bias}, {"c": np.clip((t * 3 + (1 << 9)) >> 10, -128, 127)}


def _chain() -> tuple[dict, dict]:
    x = RNG.standard_normal(4096).astype(np.float32)
    return {"x": x}, {"y": 1 / (1 + np.exp(-(x.astype(np.float64) * 0.5 + 0.25)))}


def _stream() -> tuple[dict, dict]:
    a, w = _i8(64, 16), _i8(16, 16)
    return {"a": a, "w": w}, {"c": np.maximum(a.astype(np.int64) @ w, 0)}


def _sparse() -> tuple[dict, dict]:
    a, w = _i8(64, 64), _i8(64, 16)
    a[:, 16:32] = 0
    a[:, 48:] = 0
    return {"a": a, "w": w}, {"c": a.astype(np.int64) @ w}


def _dispatch(sel: int) -> Callable[[], tuple[dict, dict]]:
    def make() -> tuple[dict, dict]:
        x = _i8(256)
        wide = x.astype(np.int64)
        y = [np.maximum(wide, 0), np.clip(-wide, -128, 127), np.clip(np.abs(wide), -128, 127), wide]
        return {"x": x, "sel": np.array([sel], np.int32)}, {"y": y[sel] if sel < 4 else np.zeros(256)}

    return make


def _transpose() -> tuple[dict, dict]:
    a = _i8(16, 64)
    return {"a": a}, {"b": a.T}


CASES: dict[str, Callable[[], tuple[dict, dict]]] = {
    "gemm_tiled": _gemm,
    "gemm_bias_relu_fused": _gemm_bias_relu,
    "gemm_bias_relu_unfused": _gemm_bias_relu,
    "vector_chain_fused": _chain,
    "vector_chain_unfused": _chain,
    "mm_stream_fused": _stream,
    "mm_stream_unfused": _stream,
    "sparse_zero_skip": _sparse,
    "sparse_dense": _sparse,
    "dispatch_table": _dispatch(3),
    "dispatch_branches": _dispatch(3),
    "transpose_load": _transpose,
    "transpose_by_columns": _transpose,
}


def run(name: str, inputs: dict) -> RunResult:
    return simulate(assemble_file(EXAMPLES / f"{name}.s"), "base", inputs, checked=True)


def test_every_example_is_covered() -> None:
    assert {p.stem for p in EXAMPLES.glob("*.s")} == set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_example_matches_numpy(name: str) -> None:
    inputs, want = CASES[name]()
    result = run(name, inputs)
    for key, value in want.items():
        got = result.outputs[key]
        if got.dtype == np.float32:
            np.testing.assert_allclose(got, value, rtol=1e-6, atol=1e-7)
        else:
            assert np.array_equal(got, value), key
    assert result.counters.roofline_bound_cycles <= result.counters.cycle


@pytest.mark.parametrize(
    ("fused", "unfused", "extra_dram_bytes"),
    [
        ("gemm_bias_relu_fused", "gemm_bias_relu_unfused", None),
        ("vector_chain_fused", "vector_chain_unfused", None),
        ("mm_stream_fused", "mm_stream_unfused", None),
        ("sparse_zero_skip", "sparse_dense", None),
        ("dispatch_table", "dispatch_branches", 4),  # the one table entry read
        ("transpose_load", "transpose_by_columns", 0),  # same bytes, far fewer bursts
    ],
)
def test_fused_beats_its_twin(fused: str, unfused: str, extra_dram_bytes: int | None) -> None:
    """None: fusion must remove DRAM traffic; a number: the fused version moves exactly that many more bytes."""
    inputs, _ = CASES[fused]()
    a, b = run(fused, inputs).counters, run(unfused, inputs).counters
    assert a.cycle < b.cycle
    dram = [c.dram_read_bytes + c.dram_write_bytes for c in (a, b)]
    if extra_dram_bytes is None:
        assert dram[0] < dram[1]
    else:
        assert dram[0] == dram[1] + extra_dram_bytes
    assert a.instructions_fusion > 0 or fused.startswith(("sparse", "dispatch"))


@pytest.mark.parametrize("sel", range(5))
def test_dispatch_never_costs_more_than_a_branch_chain(sel: int) -> None:
    inputs, want = _dispatch(sel)()
    table, chain = run("dispatch_table", inputs), run("dispatch_branches", inputs)
    assert np.array_equal(table.outputs["y"], want["y"]) and np.array_equal(chain.outputs["y"], want["y"])
    assert table.counters.cycle <= chain.counters.cycle


def test_kernels_split_the_timeline() -> None:
    inputs, _ = _gemm_bias_relu()
    result = run("gemm_bias_relu_unfused", inputs)
    per_kernel = result.kernel_counters
    assert set(per_kernel) == {"gemm", "bias_relu_requant"}
    assert sum(c.cycle for c in per_kernel.values()) == result.counters.cycle
    assert per_kernel["gemm"].macs == 64**3 and per_kernel["bias_relu_requant"].macs == 0
    assert per_kernel["bias_relu_requant"].vector_elem_ops == 3 * 4096


SLOW_NARROW = replace(
    PRESETS["base"],
    name="slow",
    dram_latency=7,
    dram_bytes_per_cycle=4,
    queue_depth=1,
    branch_penalty=0,
    vector_lanes=4,
    spad_banks=1,
    acc_banks=1,
)


@pytest.mark.parametrize("config", [SLOW_NARROW, PRESETS["large"]], ids=["slow", "large"])
@pytest.mark.parametrize("name", ["gemm_tiled", "gemm_bias_relu_fused", "mm_stream_fused", "sparse_zero_skip"])
def test_results_do_not_depend_on_timing_parameters(name: str, config) -> None:
    """Data work happens in program order; a race-free program computes the same on any machine timing."""
    inputs, _ = CASES[name]()
    fast = run(name, inputs)
    slow = simulate(assemble_file(EXAMPLES / f"{name}.s"), config, inputs, checked=True)
    assert fast.outputs.keys() == slow.outputs.keys()
    assert all(np.array_equal(fast.outputs[k], slow.outputs[k]) for k in fast.outputs)
    assert slow.counters.cycle != fast.counters.cycle
