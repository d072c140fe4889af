"""`compile(model_or_graph, config, dtype) -> CompiledModel`: the unfused baseline.

Every node becomes its own `.kernel` block (base ISA only) that reads its inputs from DRAM and writes its output
to DRAM; Reshape and Identity are DRAM aliases with no kernel. Kernels end with a fence, so one kernel's DRAM
writes are complete before the next one reads them. On the int8 path the graph is quantized with
`fusion.quant` (symmetric per-tensor scales calibrated on sample inputs; `run()` calibrates on its own inputs
when no samples were given) and compiled results are bit-exact against `fusion.reference.quantized`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from assembler.builder import ProgramBuilder
from assembler.objfile import ObjectFile
from fusion.graph.ir import Graph, Node
from fusion.graph.ops import OpType
from fusion.lower.context import (
    CONST_F32,
    CONST_I8,
    LowerContext,
    bias_form,
    const_key,
    storage_dtype,
    taps_form,
    temp_key,
)
from fusion.lower.emitter import Emitter, Step, run_pipeline
from fusion.lower.errors import LoweringError, UnsupportedOpError
from fusion.lower.kernels import elementwise, frame_pool, frame_windows, matrix, movement, normalize, windows
from fusion.lower.kernels.conv_implicit import pack_weight, packs, slab_layout
from fusion.lower.kernels.matrix import CONST_RQNT, dequant_form
from fusion.lower.kernels.recipes import RECIPES, refusal, trilu_mask, where_masks
from fusion.lower.memory_plan import Interval, MemoryPlan, align, plan_arena
from fusion.quant.calibrate import calibrate
from fusion.quant.params import QuantParams, quantize_tensor
from fusion.quant.plan import QuantPlan, plan_quantization
from isa.enums import Extension
from simulator.config import MachineConfig, load_config

# of an activation: no kernel (of a constant: a copy); Cast between float32 types only (see recipes)
ALIAS_OPS = frozenset({OpType.Reshape, OpType.Identity, OpType.Cast})
LOWERINGS: dict[OpType, Callable[[LowerContext, Node], list[list[Step]]]] = {
    **matrix.LOWERINGS,
    **elementwise.LOWERINGS,
    **normalize.LOWERINGS,
    **movement.LOWERINGS,
    **windows.LOWERINGS,
    **frame_windows.LOWERINGS,  # depthwise Conv on its unpadded frame where it applies
    **frame_pool.LOWERINGS,  # MaxPool and AveragePool likewise
}
SCRATCH: dict[OpType, Callable[[Graph, Node, QuantPlan | None], list[int]]] = windows.SCRATCH
DTYPES = ("fp32", "int8")
MATRIX_OPS = frozenset({OpType.MatMul, OpType.Gemm, OpType.Conv})
Samples = Sequence[Mapping[str, np.ndarray]]


def supported_ops() -> frozenset[OpType]:
    return frozenset(LOWERINGS)


def load_graph(model_or_graph: Graph | onnx.ModelProto | str | Path, cleanup: bool = True) -> Graph:
    if isinstance(model_or_graph, Graph):
        graph = model_or_graph
    else:
        from fusion.onnx_import.importer import import_model

        graph = import_model(model_or_graph)
    if cleanup:
        from fusion.passes.pipeline import cleanup as run_cleanup

        graph = run_cleanup(graph)
    return graph


def alias_roots(graph: Graph) -> dict[str, str]:
    """Every Reshape/Identity output of an activation -> the value whose DRAM bytes it shares."""
    roots: dict[str, str] = {}
    for node in graph.nodes:
        if node.op in ALIAS_OPS and not graph.is_constant(node.inputs[0]):
            roots[node.outputs[0]] = roots.get(node.inputs[0], node.inputs[0])
    return roots


def constant_forms(
    graph: Graph, plan: QuantPlan | None, conv_taps: bool = True, memo: dict | None = None
) -> dict[str, np.ndarray]:
    """Every constant as the kernels read it: float32, or (int8 path) pre-quantized matrix operands and biases;
    with `conv_taps`, each Conv weight also tap-major as the baseline conv kernel reads it (a fused conv kernel
    reads its own packing instead: without it, its DRAM image neither carries nor slab-packs that copy).
    `memo` (one per model and plan, its graph's subgraphs passed here): each node's forms kept by (node,
    `conv_taps`), so a planner quantizes and packs a weight once, not once per candidate kernel holding it."""
    forms: dict[str, np.ndarray] = {}
    for node in graph.nodes:
        if memo is None:
            forms.update(_node_forms(graph, plan, node, conv_taps))
            continue
        key = (node.name, conv_taps)
        part = memo.get(key)
        if part is None:
            part = memo.setdefault(key, _node_forms(graph, plan, node, conv_taps))
        forms.update(part)
    return forms


def _node_forms(graph: Graph, plan: QuantPlan | None, node: Node, conv_taps: bool) -> dict[str, np.ndarray]:
    """`constant_forms` of one node's constants."""
    forms: dict[str, np.ndarray] = {}
    if node.op == OpType.Trilu:
        out = node.outputs[0]
        masks = where_masks(trilu_mask(node, graph.types[out].shape))
        forms.update({const_key(out, form): mask for form, mask in masks.items()})
    for pos, value in enumerate(node.inputs):
        if not graph.is_constant(value):
            continue
        data = np.asarray(graph.constants[value])
        # an int8 weight quantized once for both its forms (a conv's weights: megabytes)
        weight = (
            plan.matrix[node.name].quantize_weight(data)
            if plan is not None and node.op in MATRIX_OPS and pos == 1
            else None
        )
        if conv_taps and node.op == OpType.Conv and pos == 1 and packs(data.shape):  # the baseline's tap-major
            stored = data if plan is None else weight
            forms[const_key(value, taps_form(plan is not None))] = pack_weight(stored)
        if plan is not None and node.op in MATRIX_OPS and pos < 2:
            q = plan.matrix[node.name]
            quantized = quantize_tensor(data, q.input_scale) if pos == 0 else weight
            forms[const_key(value, CONST_I8)] = quantized
            if pos == 1 and q.per_channel and not q.dequantize:
                forms[const_key(value, CONST_RQNT)] = q.requant_table()
            if pos == 1 and q.dequantize:
                forms[const_key(value, dequant_form(node.name))] = q.dequant_scales()
        elif plan is not None and node.op in MATRIX_OPS and pos == 2:
            forms[const_key(value, bias_form(node.name))] = plan.matrix[node.name].quantize_bias(data)
        elif node.op == OpType.Where and pos == 0:
            forms.update({const_key(value, form): mask for form, mask in where_masks(data).items()})
        elif data.dtype == np.float32:
            forms[const_key(value, CONST_F32)] = data
    return forms


def refusals(graph: Graph) -> list[tuple[Node, str]]:
    """Every node no kernel generator runs, with the reason."""
    out = []
    for node in graph.nodes:
        if node.op not in supported_ops():
            out.append((node, "no kernel generator"))
        elif node.op in RECIPES and (reason := refusal(graph, node)) is not None:
            out.append((node, reason))
    return out


def check_supported(graph: Graph) -> None:
    """One UnsupportedOpError listing every node no kernel generator runs, with its reason."""
    problems = refusals(graph)
    if problems:
        listing = "; ".join(f"{n.name!r} ({n.op.value}: {why})" for n, why in problems)
        first = problems[0][0]
        raise UnsupportedOpError(first.name, first.op.value, f"{len(problems)} unsupported node(s): {listing}")


def _intervals(graph: Graph, plan: QuantPlan | None, roots: Mapping[str, str]) -> list[Interval]:
    end = len(graph.nodes)
    live: dict[str, list[int]] = {v: [-1, -1] for v in graph.inputs}
    for i, node in enumerate(graph.nodes):
        for v in node.outputs:
            live.setdefault(roots.get(v, v), [i, i])
        for v in node.inputs:
            if not graph.is_constant(v):
                live[roots.get(v, v)][1] = i
    for v in graph.outputs:
        if not graph.is_constant(v):
            live[roots.get(v, v)][1] = end
    out = [Interval(v, graph.types[v].size * storage_dtype(graph, plan, v).size, s, e) for v, (s, e) in live.items()]
    for i, node in enumerate(graph.nodes):
        if node.op in SCRATCH:
            out += [Interval(temp_key(node, k), n, i, i) for k, n in enumerate(SCRATCH[node.op](graph, node, plan))]
    return out


def _data_section(forms: Mapping[str, np.ndarray]) -> tuple[bytes, dict[str, int]]:
    """The constants back to back, each aligned, and their offsets. Joined from the arrays' own buffers: one
    copy of the section (megabytes of weights per candidate kernel), not one more per array first."""
    chunks: list = []
    addresses, offset = {}, 0
    for key, array in forms.items():
        raw = np.ascontiguousarray(array)
        addresses[key] = offset
        padded = align(max(raw.nbytes, 1))
        chunks += [raw, bytes(padded - raw.nbytes)]
        offset += padded
    return b"".join(chunks), addresses


def symbol_names(names: Sequence[str], reserved: Sequence[str] = ()) -> dict[str, str]:
    """Graph names -> unique assembler names ([A-Za-z_.$][A-Za-z0-9_.$]*): other characters become '_'."""
    out: dict[str, str] = {}
    taken = set(reserved)
    for name in names:
        base = re.sub(r"[^A-Za-z0-9_.$]", "_", name)
        base = base if re.match(r"[A-Za-z_.$]", base) else f"_{base}"
        candidate, k = base, 1
        while candidate in taken:
            candidate, k = f"{base}_{k}", k + 1
        taken.add(candidate)
        out[name] = candidate
    return out


def declare(cx: LowerContext, names: Mapping[str, str], value: str) -> tuple[str, str, tuple[int, ...], int]:
    """A `.kernel` input/output declaration: (program name, dtype, shape, DRAM address)."""
    view = cx.view(value)
    return names[value], view.dtype.name, view.shape, view.address


@dataclass(frozen=True)
class CompiledModel:
    """A graph compiled for one machine and dtype: the program, its memory plan, and how to run it."""

    graph: Graph
    config: MachineConfig
    dtype: str
    program: ObjectFile
    memory: MemoryPlan
    params: QuantParams | None
    compile_seconds: float
    kernels: tuple[str, ...] = field(default=())
    tensor_names: Mapping[str, str] = field(default_factory=dict)  # graph value -> name in the program

    @property
    def plan(self) -> QuantPlan | None:
        return None if self.params is None else plan_quantization(self.graph, self.params)

    def run(self, inputs: Mapping[str, np.ndarray], checked: bool = False) -> tuple[dict[str, np.ndarray], Any]:
        """Simulate on `inputs` (graph input name -> float32 array); returns (outputs as float32, counters)."""
        from simulator.run import simulate

        placed = {self.tensor_names[k]: v for k, v in check_inputs(self.graph, inputs).items()}
        result = simulate(self.program, self.config, placed, checked=checked)
        plan = self.plan
        outputs = {}
        for name in self.graph.outputs:
            if self.graph.is_constant(name):  # no kernel computes a constant output
                outputs[name] = np.array(self.graph.constants[name])
                continue
            data = result.outputs[self.tensor_names[name]]
            scale = None if plan is None else plan.scales[name]
            outputs[name] = data if scale is None else data.astype(np.float32) * np.float32(scale)
        return outputs, result.counters


def check_inputs(graph: Graph, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Exactly the graph's inputs, each of its declared shape, as float32; otherwise a clear LoweringError."""
    missing = [v for v in graph.inputs if v not in inputs]
    unknown = [v for v in inputs if v not in graph.inputs]
    if missing or unknown:
        raise LoweringError(f"model needs inputs {list(graph.inputs)}: missing {missing}, unknown {unknown}")
    out = {}
    for v in graph.inputs:
        array = np.asarray(inputs[v])
        want = graph.types[v].shape
        if array.shape != want:
            raise LoweringError(f"input {v!r} has shape {array.shape}, the model expects {want}")
        if array.dtype.kind not in "fiu":
            raise LoweringError(f"input {v!r} has dtype {array.dtype}, the model expects float32")
        out[v] = np.array(array, dtype=np.float32, order="C")  # keeps 0-d arrays 0-d
    return out


class LazyInt8Model:
    """An int8 model without calibration samples: the first run calibrates on its inputs, then compiles."""

    def __init__(self, graph: Graph, config: MachineConfig) -> None:
        self.graph, self.config, self.dtype = graph, config, "int8"
        self.compiled: CompiledModel | None = None

    def run(self, inputs: Mapping[str, np.ndarray], checked: bool = False) -> tuple[dict[str, np.ndarray], Any]:
        if self.compiled is None:
            self.compiled = compile_graph(self.graph, self.config, "int8", [check_inputs(self.graph, inputs)])
        return self.compiled.run(inputs, checked=checked)


def compile(
    model_or_graph: Graph | onnx.ModelProto | str | Path,
    config: MachineConfig | str = "base",
    dtype: str = "fp32",
    samples: Samples | None = None,
    cleanup: bool = True,
) -> CompiledModel | LazyInt8Model:
    """Compile a model (ONNX path/proto or Graph). int8 calibrates on `samples`; without them the first
    `run()` calibrates on its own inputs (a LazyInt8Model)."""
    if dtype not in DTYPES:
        raise LoweringError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    graph = load_graph(model_or_graph, cleanup)
    cfg = load_config(config)
    if dtype == "int8" and samples is None:
        check_supported(graph)
        return LazyInt8Model(graph, cfg)
    return compile_graph(graph, cfg, dtype, samples)


def compile_graph(graph: Graph, cfg: MachineConfig, dtype: str, samples: Samples | None = None) -> CompiledModel:
    start = time.perf_counter()
    check_supported(graph)
    params = calibrate(graph, [check_inputs(graph, s) for s in samples]) if dtype == "int8" else None
    plan = None if params is None else plan_quantization(graph, params)
    data, addresses, memory = plan_dram(graph, plan, cfg)
    cx = LowerContext(graph, cfg, plan, params, addresses)
    b = ProgramBuilder(data_base=0)
    em = Emitter(b)
    names = symbol_names(list(graph.types))
    kernels = _emit_kernels(cx, b, em, names)
    program = finish_program(b, data)
    used = program.extensions()
    if used - {Extension.base}:
        raise AssertionError(f"the unfused baseline must use the base ISA only, got {sorted(e.value for e in used)}")
    seconds = time.perf_counter() - start
    return CompiledModel(graph, cfg, dtype, program, memory, params, seconds, kernels, names)


def plan_dram(
    graph: Graph,
    plan: QuantPlan | None,
    cfg: MachineConfig,
    forms: Mapping[str, np.ndarray] | None = None,
    whole_program: bool = False,
    scratch: Mapping[str, int] | None = None,
) -> tuple[bytes, dict[str, int], MemoryPlan]:
    """A graph's DRAM image: the constants as the kernels read them (`forms`, default `constant_forms`; a fused
    kernel adds e.g. packed weights; a tap-major Conv weight is stored slab-major for the machine's array size,
    `conv_implicit.slab_layout`) in the data section at address 0, then an address for every value and its
    aliases. `whole_program` keeps every value live throughout (a fused kernel reads its inputs while it writes its
    outputs, so no two of its buffers may share bytes); otherwise buffers are reused by liveness, node by node.
    `scratch` (key -> bytes) adds DRAM buffers a generator needs for the whole program."""
    roots = alias_roots(graph)
    forms = constant_forms(graph, plan) if forms is None else forms
    data, addresses = _data_section({k: slab_layout(k, v, cfg.array_size) for k, v in forms.items()})
    intervals = _intervals(graph, plan, roots)
    if whole_program:
        intervals = [replace(iv, start=-1, end=len(graph.nodes)) for iv in intervals]
    intervals += [Interval(key, n, -1, len(graph.nodes)) for key, n in (scratch or {}).items()]
    memory = plan_arena(intervals, align(len(data) or 1), cfg.dram_bytes)
    addresses.update(memory.addresses)
    for alias, root in roots.items():
        addresses[alias] = addresses[root]
    return data, addresses, memory


def emit_phases(b: ProgramBuilder, em: Emitter, phases: Sequence[Sequence[Step]]) -> None:
    """Each phase through the token pipeline, then a fence: its DRAM writes land before the next phase reads."""
    for phase in phases:
        run_pipeline(em, list(phase))
        b.fence()


def finish_program(b: ProgramBuilder, data: bytes) -> ObjectFile:
    """End the text with `halt`, append the constants as the data section (at DRAM address 0) and link."""
    b.halt()
    if data:
        b.data()
        b.label("constants")
        b.i8(data)
    return b.build()


def _emit_kernels(cx: LowerContext, b: ProgramBuilder, em: Emitter, names: Mapping[str, str]) -> tuple[str, ...]:
    graph = cx.graph
    kernel_names = symbol_names([n.name for n in graph.nodes], reserved=("graph_inputs", "graph_outputs"))
    attrs_common = {"dtype": "int8" if cx.int8 else "fp32", "config": cx.config.config_hash()}
    with b.kernel("graph_inputs", inputs=[declare(cx, names, v) for v in graph.inputs], attrs={"op": "inputs"}):
        b.nop()
    roots = alias_roots(graph)
    lowered = [n for n in graph.nodes if n.outputs[0] not in roots]
    for node in lowered:
        ins = [declare(cx, names, v) for v in dict.fromkeys(node.inputs) if not graph.is_constant(v)]
        outs = [declare(cx, names, v) for v in node.outputs]
        attrs = {
            "op": node.op.value,
            **attrs_common,
            "shapes": " ".join(str(graph.types[v]) for v in (*node.inputs, *node.outputs)),
            **{f"attr.{k}": str(v).replace(" ", "") for k, v in node.attrs},
        }
        with b.kernel(kernel_names[node.name], inputs=ins, outputs=outs, attrs=attrs):
            emit_phases(b, em, LOWERINGS[node.op](cx, node))
    outs = [declare(cx, names, v) for v in dict.fromkeys(graph.outputs) if not graph.is_constant(v)]
    with b.kernel("graph_outputs", outputs=outs, attrs={"op": "outputs"}):
        b.nop()
    return tuple(kernel_names[n.name] for n in lowered)
