"""One group -> one standalone program: a `.kernel` block whose metadata is the kernel's guard.

Each group is compiled as its own program over its own DRAM image (H5's memory planner places the group's
values and constants), so kernels are cached, guarded, dispatched and validated one by one; the engine moves
tensors between them in their storage dtype (int8 where the quantization plan says so). Unfused groups reuse
the baseline's kernel generators (`fusion.lower`); fused ones use `fusion.engine.codegen`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from assembler.builder import ProgramBuilder
from assembler.link import paused_gc
from assembler.objfile import ObjectFile
from fusion.engine.codegen.matrix_group import EPILOGUE_HEADS
from fusion.engine.context import ModelContext
from fusion.engine.errors import CodegenError
from fusion.engine.plan import Group
from fusion.engine.strategies import phases, strategy_of
from fusion.engine.views import is_view
from fusion.graph.hashing import extract_subgraph
from fusion.graph.ir import Graph, Node
from fusion.graph.ops import OpType
from fusion.lower import (
    constant_forms,
    declare,
    emit_phases,
    finish_program,
    plan_dram,
    symbol_names,
)
from fusion.lower.context import LowerContext, bias_form, const_key
from fusion.lower.emitter import Emitter, Step
from fusion.lower.errors import LoweringError
from fusion.quant.params import quantize_bias


@dataclass(frozen=True)
class Guard:
    """What a kernel was specialised for; checked before every dispatch."""

    shapes: tuple[tuple[str, tuple[int, ...]], ...]  # input value -> shape
    dtypes: tuple[tuple[str, str], ...]  # input value -> numpy dtype name (storage dtype)
    sparsity: str  # data class of the zero-skip operand ("any" for kernels that do not care)
    config_hash: str


@dataclass(frozen=True)
class Kernel:
    group: Group
    program: ObjectFile | None  # None: an alias group (Reshape/Identity), done on the host
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    guard: Guard
    compile_seconds: float
    symbols: dict[str, str] | None = None  # graph value -> tensor name in the program
    pipelined_with: Group | None = None  # a pipelined pair (`fusion.engine.pipelined`): `group` produces, this consumes

    @property
    def nbytes(self) -> int:
        if self.program is None:
            return 64
        return 8 * len(self.program.text) + len(self.program.data) + 256


def group_subgraph(graph: Graph, group: Group) -> Graph:
    return extract_subgraph(graph, group.nodes, name=f"{graph.name}/{group.nodes[0]}")


def group_phases(cx: LowerContext, nodes: Sequence[Node], group: Group, rounding_change: bool) -> list[list[Step]]:
    """The group's fenced phases of pipeline steps, by its strategy's generator (`strategies.phases`)."""
    return phases(cx, nodes, group, rounding_change)


def storage_dtypes(mc: ModelContext, sub: Graph, values: Sequence[str]) -> tuple[tuple[str, str], ...]:
    return tuple((v, "int8" if mc.scale(v) is not None else str(sub.types[v].dtype.numpy)) for v in values)


def expected_guard(mc: ModelContext, sub: Graph, group: Group, sparsity: str) -> Guard:
    """The guard a kernel for `group` on data of class `sparsity` carries (zero-skip kernels alone care)."""
    return Guard(
        tuple((v, sub.types[v].shape) for v in sub.inputs),
        storage_dtypes(mc, sub, sub.inputs),
        sparsity if strategy_of(group).skips_zero_tiles else "any",
        mc.config_hash,
    )


def build_kernel(mc: ModelContext, group: Group, sparsity: str = "any") -> Kernel:
    """Generate, assemble and link the group's program. Raises CodegenError/LoweringError when it cannot.

    The cyclic GC is paused meanwhile: a build makes up to millions of small objects that live until it ends
    (items, operand tuples), and the collections they trigger, each scanning all that survive, took a sixth of
    the build time (resnet18 224 int8); what the build leaves cyclic is collected after."""
    with paused_gc():
        return _build_kernel(mc, group, sparsity)


def _build_kernel(mc: ModelContext, group: Group, sparsity: str) -> Kernel:
    start = time.perf_counter()
    sub = mc.subgraph(group.nodes)
    guard = expected_guard(mc, sub, group, sparsity)
    if strategy_of(group).host_view:
        node = sub.nodes[0]
        if not is_view(sub, node):
            raise CodegenError(f"node {node.name!r} ({node.op.value}) is not a view")
        return Kernel(group, None, sub.inputs, sub.outputs, guard, time.perf_counter() - start, None)
    data, addresses = _dram_image(mc, sub, group)

    def body(b: ProgramBuilder, em: Emitter, cx: LowerContext) -> None:
        emit_phases(b, em, group_phases(cx, sub.nodes, group, mc.allow_rounding_change))

    name = identifier(f"{group.strategy}_{group.nodes[0]}")
    program, names = link_program(mc, sub, guard, (data, addresses), name, (group.strategy, group.schedule), body)
    return Kernel(group, program, sub.inputs, sub.outputs, guard, time.perf_counter() - start, names)


def link_program(
    mc: ModelContext,
    sub: Graph,
    guard: Guard,
    image: tuple[bytes, Mapping[str, int]],
    name: str,
    strategy: tuple[str, str],
    body: Callable[[ProgramBuilder, Emitter, LowerContext], None],
) -> tuple[ObjectFile, dict[str, str]]:
    """The program every kernel is: `sub`'s inputs and outputs declared at their DRAM addresses (`image`: data
    section and addresses), the kernel metadata (strategy and schedule, ops, dtype, guard), `body` emitting the
    text, linked with the data. Returns the program and its symbol names (graph value -> tensor)."""
    data, addresses = image
    cx = LowerContext(sub, mc.config, mc.qplan, mc.params, addresses)
    b = ProgramBuilder(data_base=0, texts=mc.texts)  # texts and data equal to this model's earlier ones are shared
    attrs = {
        "strategy": strategy[0],
        "schedule": strategy[1],
        "ops": " ".join(n.op.value for n in sub.nodes),
        "dtype": mc.dtype,
        "sparsity": guard.sparsity,
        "config": guard.config_hash,
    }
    names = symbol_names([*sub.inputs, *sub.outputs])
    ins = [declare(cx, names, v) for v in sub.inputs]
    outs = [declare(cx, names, v) for v in sub.outputs]
    with b.kernel(name, inputs=ins, outputs=outs, attrs=attrs):
        body(b, Emitter(b), cx)
    return finish_program(b, data), names


def identifier(text: str) -> str:
    """`text` as an assembler identifier (every other character an underscore)."""
    return "".join(c if c.isalnum() or c == "_" else "_" for c in text)


def _dram_image(mc: ModelContext, sub: Graph, group: Group) -> tuple[bytes, dict[str, int]]:
    """The group's constants (data section), scratch buffers and DRAM addresses of every value, by the baseline's
    planner."""
    forms, scratch = dram_forms(mc, sub, group)
    data, addresses, _ = plan_dram(sub, mc.qplan, mc.config, forms, whole_program=True, scratch=scratch)
    return data, addresses


def dram_forms(mc: ModelContext, sub: Graph, group: Group) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """The constants as the group's generator reads them (packed weights included) and its DRAM scratch buffers
    (key -> bytes): what a program holding the group needs in its DRAM image."""
    extra = strategy_of(group).dram_forms  # a generator with its own forms reads no baseline tap-major Conv weight
    forms = constant_forms(sub, mc.qplan, conv_taps=extra is None, memo=mc.forms_memo)
    forms.update(_absorbed_biases(mc, sub))
    if extra is None:
        return forms, {}
    more, scratch = extra(mc, sub, forms)
    forms.update(more)
    return forms, scratch


def _absorbed_biases(mc: ModelContext, sub: Graph) -> dict[str, np.ndarray]:
    """int8 with rounding change: an Add's constant that a MatMul's drain absorbs, in accumulator units."""
    if not (mc.int8 and mc.allow_rounding_change) or not sub.nodes or sub.nodes[0].op not in EPILOGUE_HEADS:
        return {}
    q = mc.qplan.matrix[sub.nodes[0].name]
    return {
        const_key(v, bias_form(sub.nodes[0].name)): quantize_bias(sub.constants[v], q.input_scale, q.weight_scale)
        for node in sub.nodes[1:]
        if node.op == OpType.Add
        for v in node.inputs
        if sub.is_constant(v)
    }


def try_build(mc: ModelContext, group: Group, sparsity: str = "any") -> Kernel | str:
    """The kernel, or the reason it cannot be generated (a legality answer from the generator itself)."""
    try:
        return build_kernel(mc, group, sparsity)
    except (CodegenError, LoweringError) as err:
        return str(err)
