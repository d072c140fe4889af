"""Calibration on the user's own workload: a model's candidate kernels measured on representative inputs.

`dynfuse hpm calibrate --model m.onnx --input x=x.npy -o DIR` takes every legal fusion candidate of the model
(several schedules and zero-skip twins each, as the seeded sweep does: `sweep.measure_candidates`), simulates them
on the values the inputs give every tensor, and adds the rows to DIR's dataset. Each candidate is a group of its
own, with a seed derived from the workload and its nodes (negative: never a sweep seed), so the evaluation split
holds out whole candidates and a retrain learns the rest. A measurement is logged (`workload.jsonl`, one fsync'ed
line per model, machine and dtype) and then skipped when asked again; `workload.npz` is rebuilt from the log, and
`load_dataset(DIR)` reads it together with the sweep's `dataset.npz`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fusion.engine.context import ModelContext
from fusion.graph.hashing import structural_hash
from fusion.hpm.dataset import WORKLOAD_NAME, SampleLog, rows_of, write_dataset
from fusion.hpm.errors import HpmError
from fusion.hpm.stamp import generator_hash
from fusion.hpm.sweep import DTYPES, SWEEP_NAME, GroupSpec, measure_candidates
from fusion.lower.compiler import check_inputs, load_graph
from fusion.quant.calibrate import calibrate
from fusion.reference.interpreter import evaluate
from simulator.config import load_config

LOG_NAME = "workload.jsonl"


@dataclass(frozen=True)
class WorkloadResult:
    dataset: Path
    rows: int  # kernels in the directory's workload dataset (every workload measured into it)
    measured: int  # kernels measured now
    failed: int  # kernels the simulator rejected now


def workload_key(graph_hash: str, inputs: Mapping[str, np.ndarray], config: str, dtype: str) -> str:
    digest = hashlib.sha256(f"{graph_hash}|{config}|{dtype}".encode())
    for name in sorted(inputs):
        digest.update(name.encode() + b"\0" + np.ascontiguousarray(inputs[name]).tobytes())
    return digest.hexdigest()[:16]


def candidate_seed(key: str, candidate: str) -> int:
    """A negative seed per (workload, candidate): sweep seeds are >= 0."""
    return -1 - int.from_bytes(hashlib.sha256(f"{key}/{candidate}".encode()).digest()[:7], "little")


def calibrate_workload(
    out_dir: Path, model: Path, inputs: Mapping[str, np.ndarray], configs: Sequence[str], dtype: str
) -> WorkloadResult:
    """Measure `model`'s candidate kernels on `inputs` on each machine in `configs`, into `out_dir`."""
    if dtype not in DTYPES:
        raise HpmError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    graph = load_graph(model)
    checked = check_inputs(graph, inputs)
    for name, value in checked.items():
        if not np.all(np.isfinite(value)):
            raise HpmError(f"--input {name}: not finite everywhere; calibration needs representative finite data")
    machines = [load_config(c) for c in configs]  # an unknown preset is an error before any work starts
    stamp = _check_directory(Path(out_dir))
    log = SampleLog(Path(out_dir) / LOG_NAME)
    done = {str(r.get("workload")) for r in log.records()}
    params = calibrate(graph, [checked]) if dtype == "int8" else None
    env = evaluate(graph, checked)
    measured = failed = 0
    graph_hash = structural_hash(graph)
    for config in machines:
        key = workload_key(graph_hash, checked, config.name, dtype)
        if key in done:
            continue
        spec = GroupSpec(0, f"workload:{Path(model).stem}", graph, config, dtype, 0.0, False)
        mc = ModelContext(graph, config, dtype, params)
        seed = int.from_bytes(bytes.fromhex(key)[:4], "little")
        rows, failures = measure_candidates(spec, mc, env, np.random.default_rng(seed))
        log.append({"workload": key, "generators": stamp, "rows": [_own_group(key, r) for r in rows]})
        measured, failed = measured + len(rows), failed + len(failures)
    records = log.records()
    stamps = {r.get("generators") for r in records}
    if stamps != {stamp}:
        raise HpmError(f"{log.path} holds measurements of other kernel generators {stamps - {stamp}}: use a new -o")
    rows = rows_of(records)
    path = write_dataset(Path(out_dir) / WORKLOAD_NAME, rows, {"workloads": len(records), "generators": stamp})
    return WorkloadResult(path, len(rows), measured, failed)


def _own_group(key: str, row: dict[str, Any]) -> dict[str, Any]:
    """A workload row keyed as its own candidate: seed from the workload and the candidate's nodes."""
    candidate = str(row["group"]).split("/", 1)[1]
    seed = candidate_seed(key, candidate)
    return {**row, "seed": seed, "group": f"{seed}/{candidate}"}


def _check_directory(out_dir: Path) -> str:
    """This code's generator stamp, refused if `out_dir` holds a sweep measured with other generators."""
    stamp = generator_hash()
    sweep = out_dir / SWEEP_NAME
    if sweep.is_file():
        try:
            held = json.loads(sweep.read_text()).get("generators")
        except (ValueError, AttributeError) as err:
            raise HpmError(f"{sweep}: not a sweep description ({err})") from None
        if held != stamp:
            raise HpmError(f"{out_dir} holds a sweep of kernel generators {held}, this code has {stamp}: use a new -o")
    out_dir.mkdir(parents=True, exist_ok=True)
    return stamp
