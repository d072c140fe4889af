"""One point of the space: a (machine, model, policy, dtype) compiled, fused and simulated by the fusion engine.

A point's figures are a pure function of its key (the machine's every field, the model file's and inputs'
hashes, the policy, dtype and validation policy), except the measured planning time: a point computed twice,
on any worker, gives the same row, and the key is what a resumed or merged sweep recognises it by.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from fusion.engine.engine import EngineOptions, FusionEngine
from fusion.engine.report import build_report
from fusion.engine.validation import ValidationPolicy
from fusion.explore.space import SWEEPABLE, Value, machine
from fusion.graph.ir import Graph
from isa.errors import DynfuseError
from simulator.area import area
from simulator.config import PRESETS

POINT_VERSION = 1  # part of every key: rows of another version are other points
OK, INVALID, ERROR = "ok", "invalid_config", "error"
TIMING_COLUMNS = ("plan_seconds",)  # measured wall time: the only figure that varies between runs


@dataclass(frozen=True)
class Model:
    """A model as every point runs it: the graph and the inputs (given, or seeded by the model's hash)."""

    name: str
    sha: str  # of the ONNX file's bytes
    graph: Graph
    inputs: dict[str, np.ndarray]
    inputs_sha: str


@dataclass(frozen=True)
class Point:
    key: str
    model: str
    policy: str
    dtype: str
    preset: str
    overrides: tuple[tuple[str, Value], ...]


@dataclass(frozen=True)
class Settings:
    """What every point of one sweep shares (sent to each worker once)."""

    models: dict[str, Model]
    validate: str


def machine_fields(preset: str, overrides: dict[str, Value]) -> dict[str, Value]:
    """Every sweepable field of the point's machine (the preset's, overridden): its columns and key."""
    base = asdict(PRESETS[preset])
    return {name: overrides.get(name, base[name]) for name in SWEEPABLE}


def make_point(model: Model, policy: str, dtype: str, preset: str, overrides: dict[str, Value], validate: str) -> Point:
    energy = asdict(PRESETS[preset].energy)
    ident = {
        "version": POINT_VERSION,
        "model": model.sha,
        "inputs": model.inputs_sha,
        "policy": policy,
        "dtype": dtype,
        "validate": validate,
        "machine": machine_fields(preset, overrides),
        "energy": energy,
    }
    key = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:20]
    return Point(key, model.name, policy, dtype, preset, tuple(overrides.items()))


def evaluate_point(settings: Settings, point: Point) -> dict[str, Any]:
    """The point's row: figures of the model run under the policy on the machine, or why there are none."""
    model = settings.models[point.model]
    overrides = dict(point.overrides)
    row: dict[str, Any] = {
        "key": point.key,
        "model": model.name,
        "model_sha": model.sha,
        "policy": point.policy,
        "dtype": point.dtype,
        "preset": point.preset,
        **machine_fields(point.preset, overrides),
    }
    config = machine(point.preset, overrides)
    if isinstance(config, str):
        return {**row, "status": INVALID, "reason": config}
    size = area(config)
    row.update(area_mm2=size.total_mm2, array_mm2=size.array_mm2, vector_mm2=size.vector_mm2, sram_mm2=size.sram_mm2)
    options = EngineOptions(policy=point.policy, validation=ValidationPolicy.parse(settings.validate), workers=1)
    samples = [model.inputs] if point.dtype == "int8" else None
    engine = None
    try:
        engine = FusionEngine(model.graph, config, point.dtype, options, samples=samples)
        result = engine.run(model.inputs)
        report = build_report(engine.for_inputs(model.inputs), result)
    except DynfuseError as err:  # the model does not fit this machine, a kernel traps: data about the space
        return {**row, "status": ERROR, "reason": f"{type(err).__name__}: {err}"}
    finally:
        if engine is not None:
            engine.close()
    kernels = [g for g in report.groups if g["strategy"] != "alias"]
    return {
        **row,
        "status": OK,
        "reason": "",
        "cycles": report.cycles,
        "dram_traffic_bytes": report.dram_bytes,
        "energy_pj": report.energy_pj,
        "roofline_cycles": report.roofline_cycles,
        "roofline_fraction": report.roofline_cycles / report.cycles if report.cycles else 0.0,
        "kernels": len(kernels),
        "fused_kernels": sum(1 for g in kernels if len(g["nodes"]) > 1),
        "plan_seconds": report.plan_seconds,
    }
