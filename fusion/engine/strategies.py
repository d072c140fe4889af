"""Kernel strategies as registered records: all the engine knows about one way of running a group of nodes.

A strategy's name is what plans, kernel metadata, cache keys and the HPM's features store (that string is the
stable format). Everything else is a field of its `Strategy` record, registered once below: which groups it
offers a candidate (its candidate rule and schedule space), the generator, the extra DRAM forms the generator
reads, whether it may join a pipelined pair, how the planner bounds and the analytic model prices it, and which
slot of the HPM's feature schema it counts under. The planner, kernel builder, features, cost models and the
HPM calibration ask the record (`strategy_of`); none compares names. Adding a strategy = its generator module +
one entry in `REGISTRY`; a record missing a required field fails at import, an inconsistent one in `_check`
(also at import), and `tests/fusion/engine/test_strategies.py` walks the registry (every record builds and prices
on a model it applies to, its HPM slot exists). See docs/fusion.md, "Adding a strategy".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import numpy as np

from fusion.engine.bounds import (
    band_bound,
    baseline_conv_bound,
    chain_bound,
    gemm_bound,
    packed_bound,
    stationary_bound,
    swapped_bound,
)
from fusion.engine.codegen.absorbed_layout import layout_chain_steps, layout_load_phases, layout_prefix
from fusion.engine.codegen.attention import attention_forms, attention_steps, group_match
from fusion.engine.codegen.attention_proj import k_scratch, pack_projection_weights, round_trips, sides
from fusion.engine.codegen.chain import CHAIN_OPS, chain_steps
from fusion.engine.codegen.conv import QUANTIZED, TAPS, conv_phases, conv_shape, pack_band_taps, quantized_bytes
from fusion.engine.codegen.conv import scratch_bytes as conv_scratch_bytes
from fusion.engine.codegen.conv_chain import (
    CHAIN_TAPS,
    CHAIN_ZEROS,
    SCRATCH,
    band_heights,
    chain_phases,
    pack_stage,
    parse_chain,
    zero_bytes,
)
from fusion.engine.codegen.conv_chain import scratch_bytes as chain_scratch_bytes
from fusion.engine.codegen.conv_packed import CONV_PANELS, packed_phases, panel_width
from fusion.engine.codegen.conv_packed import pack_panels as pack_conv_panels
from fusion.engine.codegen.conv_packed import scratch_sizes as packed_scratch_sizes
from fusion.engine.codegen.conv_stationary import PIECES, pack_pieces, stationary_phases
from fusion.engine.codegen.conv_stationary import scratch_sizes as stationary_scratch_sizes
from fusion.engine.codegen.gated import GATED, gated_heads, gated_steps, pack_gated
from fusion.engine.codegen.gemm import Schedule, pack_panels
from fusion.engine.codegen.matrix_group import EPILOGUE_HEADS, PACKED, matrix_group_steps, packable_weight
from fusion.engine.codegen.mlp import mlp_forms, mlp_steps
from fusion.engine.codegen.patch_embed import PATCHES, pack_patch_weights, patch_embed_steps
from fusion.engine.codegen.rotary import segment_chain_steps, segment_forms
from fusion.engine.codegen.siblings import SIBLINGS, pack_siblings, sibling_steps, sibling_weights
from fusion.engine.codegen.stream import stream_steps
from fusion.engine.codegen.swapped import (
    SWAPPED,
    matrix_head,
    pack_swapped,
    scratch_bytes,
    swapped_phases,
    swapped_shape,
)
from fusion.engine.codegen.transpose import transpose_steps
from fusion.engine.context import ModelContext
from fusion.engine.errors import CodegenError
from fusion.engine.plan import Group
from fusion.engine.views import is_view
from fusion.graph.ir import Graph, Node
from fusion.graph.ops import OpType
from fusion.lower import LOWERINGS
from fusion.lower.compiler import ALIAS_OPS
from fusion.lower.context import CONST_F32, CONST_I8, LowerContext, const_key, storage_dtype, temp_key
from fusion.lower.emitter import Step
from isa.enums import DType

if TYPE_CHECKING:
    from fusion.engine.candidates import Candidate

Phases = Callable[[LowerContext, Sequence[Node], Group, bool], list[list[Step]]]
Forms = Callable[[ModelContext, Graph, Mapping[str, np.ndarray]], tuple[dict[str, np.ndarray], dict[str, int]]]
PANELS = (1, 2, 4, 0)  # weight panels per GEMM step (0: as many as fit)


@dataclass(frozen=True)
class Strategy:
    """One kernel strategy. The first four fields have no default: a record without them does not construct."""

    name: str  # as stored in plans, kernel metadata, cache keys and KernelFeatures.strategy
    # the generator: (context, the group's nodes, the group, int8 rounding change allowed) -> fenced phases of
    # pipeline steps; None for a host view (no program: the engine reshapes on the host)
    phases: Phases | None
    hpm_feature: str  # the HPM schema's one-hot slot (`fusion.hpm.schema.STRATEGIES`, or "other" until retrained)
    # candidate rule: the candidate families (`candidates.Candidate.family`) it is the kernel of, and which single
    # nodes it runs alone; each gets one group in the default schedule. The static policy runs a TVM group of a
    # family with that family's strategy
    families: tuple[str, ...] = ()
    single: Callable[[Node], bool] | None = None
    # a schedule space replacing that rule: (record, model, candidate) -> the groups to try, in the order the
    # planner breaks ties in
    schedules: Callable[[Strategy, ModelContext, Candidate], list[Group]] | None = None
    pipelinable: bool = True  # may be one side of a pipelined pair or a token-ordered program boundary
    baseline: bool = False  # the unfused baseline's own kernel (or view): one node of it is not a fusion
    # tests tiles at issue (`bz.tile`) and skips the all-zero ones: its timing depends on the data, so it is priced
    # at the live zero-tile fraction, its guard holds the data class, it is never simulated on zero inputs to
    # settle a choice, never pipelined
    skips_zero_tiles: bool = False
    sparse_twin: str | None = None  # the strategy of its zero-skip variant (the dispatch table's sparse kernel)
    tiled: bool = False  # schedules vary the Group's tile rows, flattening, weight panels and loop order
    loop_order: str | None = None  # the GEMM loop order it always runs (None: "mn", or "nm" when A-stationary)
    # a lower bound on its kernel's cycles from shapes alone (branch and bound, the plan guard's rivals); None: 0,
    # always built
    shape_bound: Callable[[ModelContext, Group], float] | None = None
    # extra constant forms and DRAM scratch buffers its generator reads; a strategy with its own forms reads its own
    # packing of a Conv weight, never the baseline's tap-major one (`constant_forms(conv_taps=False)`)
    dram_forms: Forms | None = None
    spread: float | None = None  # the analytic model's stated relative error (None: the largest stated)
    # its steps hand work back and forth between the matrix and vector units on one dependency chain, so the
    # analytic model prices the two as one stage (`fusion.cost.analytic`; measured per record below)
    serial_compute: bool = False
    # whether a trailing Relu is the drain's activation for this head node: the kernel without it then differs
    # only in configuration fields (and a `li` or two), so the planner prices it from that kernel (`planner.Evaluator
    # ._folded`; tests/fusion/engine/test_planner_folded.py holds it for every such strategy); None: never
    folds_relu: Callable[[ModelContext, Node], bool] | None = None

    @property
    def host_view(self) -> bool:
        return self.phases is None

    def offers(self, mc: ModelContext, cand: Candidate) -> list[Group]:
        """The groups of this strategy to try for a candidate."""
        if self.schedules is not None:
            return self.schedules(self, mc, cand)
        head = mc.graph.node(cand.nodes[0])
        single = cand.family == "single" and self.single is not None and self.single(head)
        return [Group(cand.nodes, self.name)] if single or cand.family in self.families else []


# --- generators (each the strategy's codegen entry point, called with the group) ---------------------------


def _drain_relu(mc: ModelContext, head: Node) -> bool:
    """A conv's epilogue (`codegen.conv.Epilogue`) applies a Relu in its drain, unless the conv dequantizes (int8,
    read only by Adds): its Relu is then a vector pass after the rescale (`Epilogue.late`)."""
    return not mc.dequantizes(head.name)


def _unfused(cx: LowerContext, nodes: Sequence[Node], group: Group, rounding_change: bool) -> list[list[Step]]:
    if len(nodes) != 1:
        raise CodegenError("an unfused group holds exactly one node")
    return LOWERINGS[nodes[0].op](cx, nodes[0])


def _gemm(cx: LowerContext, nodes: Sequence[Node], group: Group, rounding_change: bool) -> list[list[Step]]:
    schedule = Schedule(group.tile_m, group.panels, strategy_of(group).skips_zero_tiles, group.resident_a)
    return [matrix_group_steps(cx, nodes, schedule, group.flatten, rounding_change)]


def _swapped(cx: LowerContext, nodes: Sequence[Node], group: Group, rounding_change: bool) -> list[list[Step]]:
    return swapped_phases(cx, nodes)


def _conv(cx: LowerContext, nodes: Sequence[Node], group: Group, rounding_change: bool) -> list[list[Step]]:
    return conv_phases(cx, nodes)


def _conv_packed(cx: LowerContext, nodes: Sequence[Node], group: Group, rounding_change: bool) -> list[list[Step]]:
    return packed_phases(cx, nodes)


def _conv_stationary(cx: LowerContext, nodes: Sequence[Node], group: Group, rounding_change: bool) -> list[list[Step]]:
    return stationary_phases(cx, nodes)


def _conv_chain(cx: LowerContext, nodes: Sequence[Node], group: Group, rounding_change: bool) -> list[list[Step]]:
    return chain_phases(cx, nodes, group.tile_m, group.resident_a)


def _chain(cx: LowerContext, nodes: Sequence[Node], group: Group, rounding_change: bool) -> list[list[Step]]:
    return [layout_chain_steps(cx, nodes) if layout_prefix(nodes) else chain_steps(cx, nodes)]


def _stream(cx: LowerContext, nodes: Sequence[Node], group: Group, rounding_change: bool) -> list[list[Step]]:
    return [stream_steps(cx, nodes)]


def _attention(cx: LowerContext, nodes: Sequence[Node], group: Group, rounding_change: bool) -> list[list[Step]]:
    return [attention_steps(cx, nodes)]


def _patch_embed(cx: LowerContext, nodes: Sequence[Node], group: Group, rounding_change: bool) -> list[list[Step]]:
    return [patch_embed_steps(cx, nodes, group.resident_a)]


def _gated(cx: LowerContext, nodes: Sequence[Node], group: Group, rounding_change: bool) -> list[list[Step]]:
    return [gated_steps(cx, nodes)]


def _mlp(cx: LowerContext, nodes: Sequence[Node], group: Group, rounding_change: bool) -> list[list[Step]]:
    return [mlp_steps(cx, nodes, group.panels, group.tile_m)]


def _segment_chain(cx: LowerContext, nodes: Sequence[Node], group: Group, rounding_change: bool) -> list[list[Step]]:
    return [segment_chain_steps(cx, nodes)]


def _siblings(cx: LowerContext, nodes: Sequence[Node], group: Group, rounding_change: bool) -> list[list[Step]]:
    return [sibling_steps(cx, nodes, group.panels)]


def _transpose(cx: LowerContext, nodes: Sequence[Node], group: Group, rounding_change: bool) -> list[list[Step]]:
    return [transpose_steps(cx, nodes[0])] if len(nodes) == 1 else layout_load_phases(cx, nodes)


# --- DRAM forms ---------------------------------------------------------------------------------------------


def _weight_form(mc: ModelContext) -> str:
    """How a matrix node's constant weight is stored for the device: int8 (quantized) or float32."""
    return CONST_I8 if mc.int8 else CONST_F32


def _packed_forms(mc: ModelContext, sub: Graph, forms: Mapping[str, np.ndarray]) -> tuple[dict, dict]:
    """A fused GEMM's constant weight, also packed panel-major (as the device reads it: int8 or float32)."""
    head = sub.nodes[0]
    w = packable_weight(sub, head) if head.op in EPILOGUE_HEADS else None
    if w is None:
        return {}, {}
    data = forms[const_key(w, _weight_form(mc))]
    return {
        const_key(w, PACKED): mc.packed((PACKED, w), partial(pack_panels, np.asarray(data), mc.config.array_size))
    }, {}


def _swapped_forms(mc: ModelContext, sub: Graph, forms: Mapping[str, np.ndarray]) -> tuple[dict, dict]:
    """A swapped GEMM's constant weight as the rows the array streams (see `codegen.swapped`), and C^T's
    scratch buffer."""
    head = matrix_head(sub.nodes)
    w = packable_weight(sub, head)
    if w is None:
        raise CodegenError(f"node {head.name!r}: the swapped orientation needs a constant 2-D weight")
    chunk = swapped_shape(sub, mc.config, head, mc.int8).chunk
    data = np.asarray(forms[const_key(w, _weight_form(mc))])
    packed = {const_key(w, SWAPPED): pack_swapped(data, chunk, mc.config.array_size)}
    return packed, {temp_key(head, 0): scratch_bytes(sub, mc.config, head, mc.int8)}


def _conv_forms(mc: ModelContext, sub: Graph, forms: Mapping[str, np.ndarray]) -> tuple[dict, dict]:
    """The Conv weight as per-tap tiles, the scratch buffer of the output before its layout change and (a float
    input on the int8 path) its int8 copy."""
    conv, last = sub.nodes[0], sub.nodes[-1].outputs[0]
    weights = np.asarray(forms[const_key(conv.inputs[1], _weight_form(mc))])
    s = conv_shape(sub, mc.config, conv)
    taps = {
        const_key(conv.inputs[1], TAPS): mc.packed(
            (TAPS, conv.inputs[1], s), partial(pack_band_taps, weights, s, mc.config.array_size)
        )
    }
    scratch = {temp_key(conv, 2): conv_scratch_bytes(sub, mc.config, conv, storage_dtype(sub, mc.qplan, last))}
    if mc.int8 and storage_dtype(sub, mc.qplan, conv.inputs[0]) is DType.f32:
        scratch[temp_key(conv, QUANTIZED)] = quantized_bytes(sub, conv)
    return taps, scratch


def _conv_packed_forms(mc: ModelContext, sub: Graph, forms: Mapping[str, np.ndarray]) -> tuple[dict, dict]:
    """The Conv weight in Cout-tile panels, the output scratch and the channels-last input (`codegen.conv_packed`)."""
    conv, last = sub.nodes[0], sub.nodes[-1].outputs[0]
    s = conv_shape(sub, mc.config, conv, packed=True)
    weights = np.asarray(forms[const_key(conv.inputs[1], _weight_form(mc))])
    taps = {
        const_key(conv.inputs[1], CONV_PANELS): mc.packed(
            (CONV_PANELS, conv.inputs[1], s), partial(pack_conv_panels, weights, s, panel_width(mc.config, s))
        )
    }
    mm_dt = DType.i8 if mc.int8 else DType.f32
    sizes = packed_scratch_sizes(sub, mc.config, sub.nodes, storage_dtype(sub, mc.qplan, last), mm_dt)
    return taps, {temp_key(conv, k): nbytes for k, nbytes in sizes.items()}


def _conv_chain_forms(mc: ModelContext, sub: Graph, forms: Mapping[str, np.ndarray]) -> tuple[dict, dict]:
    """Every chained Conv's weight as per-tap tiles, a zero run (edge rows), and the last one's output scratch
    (`codegen.conv_chain`)."""
    chain = parse_chain(sub, sub.nodes, mc.config)
    taps = {}
    for st in chain.stages:
        weight = st.conv.inputs[1]
        taps[const_key(weight, CHAIN_TAPS)] = mc.packed(
            (CHAIN_TAPS, weight, st.s, st.depthwise),
            partial(pack_stage, st, forms[const_key(weight, _weight_form(mc))], mc.config.array_size),
        )
    taps[const_key(chain.stages[0].conv.inputs[1], CHAIN_ZEROS)] = np.zeros(zero_bytes(mc.config), np.int8)
    out_dt = storage_dtype(sub, mc.qplan, chain.stages[-1].nodes[-1].outputs[0])
    return taps, {temp_key(chain.stages[-1].conv, SCRATCH): chain_scratch_bytes(chain, out_dt)}


def _gated_forms(mc: ModelContext, sub: Graph, forms: Mapping[str, np.ndarray]) -> tuple[dict, dict]:
    """The two weights packed panel-interleaved (`codegen.gated`)."""
    (first, second), _ = gated_heads(sub.nodes)
    data = [np.asarray(forms[const_key(n.inputs[1], _weight_form(mc))]) for n in (first, second)]
    return {const_key(first.inputs[1], GATED): pack_gated(*data, mc.config.array_size)}, {}


def _mlp_forms(mc: ModelContext, sub: Graph, forms: Mapping[str, np.ndarray]) -> tuple[dict, dict]:
    """Both MLP weights packed per hidden panel and its row parameters in one block (`codegen.mlp`)."""
    return mlp_forms(LowerContext(sub, mc.config, mc.qplan, mc.params, {}), dict(forms)), {}


def _conv_stationary_forms(mc: ModelContext, sub: Graph, forms: Mapping[str, np.ndarray]) -> tuple[dict, dict]:
    """The Conv weight packed piece-major (`codegen.conv_stationary`), the out^T and channels-last temps."""
    conv, cfg = sub.nodes[0], mc.config
    weights = forms[const_key(conv.inputs[1], _weight_form(mc))]
    s = conv_shape(sub, cfg, conv, packed=True)
    packed = {
        const_key(conv.inputs[1], PIECES): mc.packed(
            (PIECES, conv.inputs[1], s), partial(pack_pieces, np.asarray(weights), s, cfg.array_size)
        )
    }
    sizes = stationary_scratch_sizes(sub, cfg, conv, DType.i8 if mc.int8 else DType.f32)
    return packed, {temp_key(conv, k): nbytes for k, nbytes in sizes.items()}


def _segment_forms(mc: ModelContext, sub: Graph, forms: Mapping[str, np.ndarray]) -> tuple[dict, dict]:
    """The region's constant operands packed segment-major (`codegen.rotary`)."""
    return segment_forms(sub, mc.config), {}


def _sibling_forms(mc: ModelContext, sub: Graph, forms: Mapping[str, np.ndarray]) -> tuple[dict, dict]:
    """The side-by-side GEMMs' weights concatenated and packed panel-major (`codegen.siblings`)."""
    names = sibling_weights(sub)
    data = [np.asarray(forms[const_key(w, _weight_form(mc))]) for w in names]
    return {const_key(names[0], SIBLINGS): pack_siblings(data, mc.config.array_size)}, {}


def _patch_forms(mc: ModelContext, sub: Graph, forms: Mapping[str, np.ndarray]) -> tuple[dict, dict]:
    """A patchify Conv's weight packed Cout-tile major as its steps read it (`codegen.patch_embed`)."""
    weight = sub.nodes[0].inputs[1]
    data = np.asarray(forms[const_key(weight, _weight_form(mc))])
    return {const_key(weight, PATCHES): pack_patch_weights(data, mc.config.array_size)}, {}


def _attention_forms(mc: ModelContext, sub: Graph, forms: Mapping[str, np.ndarray]) -> tuple[dict, dict]:
    """The positions a generated mask is computed from (`codegen.attention`); with the Q/K/V projections taken in,
    their weights packed per head (`codegen.attention_proj`) and, where K round-trips through DRAM
    (`attention_proj.round_trips`), its scratch buffer."""
    match = group_match(sub, sub.nodes)  # an output projection is only ever taken in with the Q/K/V ones
    if not match.projections:
        return attention_forms(sub), {}
    k = sides(sub, match)[1]
    trip = round_trips(sub, match, storage_dtype(sub, mc.qplan, k.x), mc.int8)
    packed = pack_projection_weights(sub, match, forms, mc.int8, mc.config.array_size, trip)
    key, shape = k_scratch(sub, match)
    scratch = {key: math.prod(shape) * (1 if mc.int8 else 4)} if trip else {}
    return {**attention_forms(sub), **packed}, scratch


# --- candidate rules and schedule spaces -------------------------------------------------------------------


def _head(mc: ModelContext, cand: Candidate) -> Node:
    return mc.graph.node(cand.nodes[0])


def _views(s: Strategy, mc: ModelContext, cand: Candidate) -> list[Group]:
    """A layout-only node (`ALIAS_OPS`), or a constant slab Gather: a view on the host, no kernel."""
    head = _head(mc, cand)
    single = cand.family == "single"
    return [Group(cand.nodes, s.name)] if single and (head.op in ALIAS_OPS or is_view(mc.graph, head)) else []


def _conv_space(s: Strategy, mc: ModelContext, cand: Candidate) -> list[Group]:
    """A Conv alone or with the consumers its drain absorbs (another schedule of the `conv` family)."""
    conv = cand.family == "conv" or (cand.family == "single" and _head(mc, cand).op == OpType.Conv)
    return [Group(cand.nodes, s.name)] if conv else []


def _conv_chain_space(s: Strategy, mc: ModelContext, cand: Candidate) -> list[Group]:
    """Consecutive Convs computed depth-first: one schedule per band height and layout (`conv_chain.band_heights`;
    `resident_a`: wide bands, every buffer slot holding one band)."""
    if cand.family not in s.families:
        return []
    nodes = [mc.graph.node(n) for n in cand.nodes]
    space = band_heights(mc.graph, mc.config, mc.qplan, nodes) or ((0, False),)  # the generator says why it refuses
    return [Group(cand.nodes, s.name, rows, resident_a=wide) for rows, wide in space]


def _matrix(mc: ModelContext, cand: Candidate) -> bool:
    """A matrix node alone or with the consumers its drain absorbs."""
    return _head(mc, cand).op in EPILOGUE_HEADS and cand.family in ("single", "epilogue")


def _gemm_space(s: Strategy, mc: ModelContext, cand: Candidate) -> list[Group]:
    """Every distinct GEMM schedule of a matrix node (and the consumers its drain absorbs)."""
    return gemm_schedules(mc, cand.nodes, s.name) if _matrix(mc, cand) else []


def _swapped_space(s: Strategy, mc: ModelContext, cand: Candidate) -> list[Group]:
    """Its own family (a GEMM with an absorbed Transpose or chain epilogue), or any matrix node's group."""
    return [Group(cand.nodes, s.name)] if cand.family in s.families or _matrix(mc, cand) else []


def _siblings_space(s: Strategy, mc: ModelContext, cand: Candidate) -> list[Group]:
    """GEMMs side by side: two weight panels per step, or as many as fit."""
    return [Group(cand.nodes, s.name, panels=p) for p in (2, 0)] if cand.family == "siblings" else []


def _patch_space(s: Strategy, mc: ModelContext, cand: Candidate) -> list[Group]:
    """Weights streamed per step, or all resident in the spare bank (`codegen.patch_embed`)."""
    return [Group(cand.nodes, s.name, resident_a=r) for r in (False, True)] if cand.family in s.families else []


def _mlp_space(s: Strategy, mc: ModelContext, cand: Candidate) -> list[Group]:
    """Two hidden panels per step (weights streamed in more, smaller DMAs), or as many as fit, and four where the
    hidden dimension has 5-8 panels: there "as many as fit" is about one group (no weight DMA beside the matrix
    work) and four is two groups; measured on the zoo's int8 MLPs, four beats both on ViT (3,525 -> 3,325 cycles)
    and whisper (3,286 -> 3,089). With more panels "as many as fit" already leaves several groups: on BERT (32
    panels) four was never taken and cost 0.07-0.18 s of its planning."""
    if cand.family not in s.families:
        return []
    graph = mc.graph
    first = next(graph.node(n) for n in cand.nodes if graph.node(n).op in (OpType.MatMul, OpType.Gemm))
    hidden_panels = -(-graph.types[first.outputs[0]].shape[-1] // mc.config.array_size)
    counts = (2, 4, 0) if 4 < hidden_panels <= 8 else (2, 0)
    return [Group(cand.nodes, s.name, panels=p) for p in counts]


def gemm_schedules(mc: ModelContext, nodes: tuple[str, ...], strategy: str = "epilogue") -> list[Group]:
    """Distinct GEMM schedules: batch flattening, row tiles, weight panels per step, A-stationary order. Only a
    batch of more than one GEMM is flattened: flattening a batch of one generates the same program
    (tests/fusion/engine/test_planner_repeats.py)."""
    graph, n_arr = mc.graph, mc.config.array_size
    head = graph.node(nodes[0])
    a, b = (graph.types[v].shape for v in head.inputs[:2])
    out = graph.types[head.outputs[0]].shape
    total_panels = -(-out[-1] // n_arr)
    panels = sorted({p if p < total_panels else 0 for p in PANELS}, key=lambda p: p or total_panels)
    groups = []
    for flatten in (False, True) if math.prod(a[:-2]) > 1 and len(b) == 2 else (False,):
        rows = math.prod(a[:-1]) if flatten else a[-2]
        for tile_m in (0, n_arr) if rows > 2 * n_arr else (0,):
            groups += [Group(nodes, strategy, tile_m, flatten, p) for p in panels]
        groups += [Group(nodes, strategy, 0, flatten, p, True) for p in panels]
    return groups


# --- the registry ------------------------------------------------------------------------------------------

# In the order `candidates.schedules` offers their groups (ties in the planner keep the first). The spreads are
# the analytic model's root-mean-square relative error per strategy over every distinct kernel of the
# none/static/dynamic plans of the bundled models, hand-built transformer blocks and the zoo's small exports, both
# dtypes (`bench/bench_cost.py` -> bench/results/cost.md, 2178 kernels at 18f8bcd; rounded up to a hundredth); one
# measured on fewer than 20 kernels states none (there: transpose_load 2, siblings 18, implicit_packed 12,
# segment_chain 8, gated 4, patch_embed 2).
REGISTRY: Mapping[str, Strategy] = {
    s.name: s
    for s in (
        Strategy("alias", None, "other", schedules=_views, pipelinable=False, baseline=True),
        Strategy(
            "unfused",
            _unfused,
            "unfused",
            single=lambda n: True,
            baseline=True,
            shape_bound=baseline_conv_bound,
            spread=0.15,
        ),
        Strategy("chain", _chain, "chain", ("chain", "layout_chain"), single=lambda n: n.op in CHAIN_OPS, spread=0.02),
        Strategy(
            "transpose_load",
            _transpose,
            "transpose_load",
            ("layout_load",),
            single=lambda n: n.op == OpType.Transpose,
        ),
        Strategy(
            "implicit_gemm",
            _conv,
            "implicit_gemm",
            ("conv",),
            single=lambda n: n.op == OpType.Conv,
            shape_bound=band_bound,
            dram_forms=_conv_forms,
            spread=0.10,
            folds_relu=_drain_relu,
        ),
        # the conv family's channels-last schedule: kernel taps packed into K, only kept pixels computed
        Strategy(
            "implicit_packed",
            _conv_packed,
            "implicit_gemm",
            schedules=_conv_space,
            shape_bound=packed_bound,
            dram_forms=_conv_packed_forms,
            folds_relu=_drain_relu,
        ),
        # few output pixels, many channels: the patch preloaded, the weights streamed as rows
        Strategy(
            "implicit_stationary",
            _conv_stationary,
            "implicit_gemm",
            schedules=_conv_space,
            loop_order="knm",  # as the swapped GEMM: each K piece of A^T preloaded, the weights streamed as rows
            shape_bound=stationary_bound,
            dram_forms=_conv_stationary_forms,
            spread=0.11,
        ),
        # elementwise chains through last-axis Slice/Concat (rotary embeddings): segment-major registers
        Strategy("segment_chain", _segment_chain, "other", ("segment_chain",), dram_forms=_segment_forms),
        # GEMMs reading one activation side by side (Q, K, V projections): A read once, one panel pipeline
        Strategy("siblings", _siblings, "other", schedules=_siblings_space, dram_forms=_sibling_forms),
        Strategy("stream", _stream, "stream", ("stream",), dram_forms=_packed_forms, spread=0.09),
        # two GEMMs of one activation joined by a chain (a gated MLP): one kernel, A read once
        Strategy("gated", _gated, "other", ("gated",), dram_forms=_gated_forms),
        # layer fusion: consecutive Convs band by band, intermediates in the scratchpad (a band height per schedule)
        Strategy(
            "conv_chain",
            _conv_chain,
            "implicit_gemm",
            ("conv_chain",),
            schedules=_conv_chain_space,
            shape_bound=chain_bound,
            pipelinable=False,  # its first phase clears tiles (no loads) and most band steps store nothing
            dram_forms=_conv_chain_forms,
            spread=0.15,
            # the vector unit clips a stage's rows in the next stage's tile and the matrix unit waits for them:
            # MobileNetV2 and ResNet-50 blocks a median 19% above their prediction as overlapping stages, 9% in series
            serial_compute=True,
        ),
        # a patchify Conv (+ its token Reshape + Transpose) as one GEMM over the input's own rows (ViT patches)
        Strategy(
            "patch_embed", _patch_embed, "other", ("patch_embed",), schedules=_patch_space, dram_forms=_patch_forms
        ),
        # a whole MLP (prologue chain, GEMM1, activation, GEMM2, epilogue chain): the hidden activation on chip
        # spread: rms relative error over 100 MLP kernels (5 shapes, prologue/epilogue variants, both dtypes);
        # GEMM1, the activation chain and GEMM2 of a hidden panel group in turn: a median 24% above the prediction
        # as overlapping stages, 7% in series
        Strategy(
            "mlp",
            _mlp,
            "other",
            ("mlp",),
            schedules=_mlp_space,
            dram_forms=_mlp_forms,
            spread=0.12,
            serial_compute=True,
        ),
        # scores, softmax and the product with V on one dependency chain per head: 18% above the prediction as
        # overlapping stages, 5% in series
        Strategy(
            "attention",
            _attention,
            "other",
            ("attention",),
            dram_forms=_attention_forms,
            spread=0.07,
            serial_compute=True,
        ),
        # the attention with its Q/K/V and/or output projections computed in it (`codegen.attention_proj`); no
        # spread stated yet, so the planner measures it where the choice is close. Its 2-3 head blocks run as one
        # step, one head's projections on the matrix unit beside another's softmax on the vector unit
        # (`codegen.attention_order`): priced as overlapping stages, the zoo's kernels are -2.4% (vit int8),
        # -6.8% (vit fp32), +0.3% (bert int8) off; in series +15.7%, +4.3%, +2.0%
        Strategy(
            "attention_proj",
            _attention,
            "other",
            ("attention_proj",),
            dram_forms=_attention_forms,
        ),
        Strategy(
            "epilogue",
            _gemm,
            "epilogue",
            ("epilogue",),
            schedules=_gemm_space,
            sparse_twin="zero_skip",
            tiled=True,
            shape_bound=gemm_bound,
            dram_forms=_packed_forms,
            spread=0.09,
        ),
        # offered by no candidate: the epilogue's variant for sparse data (the planner adds it as a twin)
        Strategy(
            "zero_skip",
            _gemm,
            "zero_skip",
            pipelinable=False,
            skips_zero_tiles=True,
            tiled=True,
            dram_forms=_packed_forms,
        ),
        Strategy(
            "swapped",
            _swapped,
            "swapped",
            ("swapped",),
            schedules=_swapped_space,
            loop_order="knm",
            shape_bound=swapped_bound,
            dram_forms=_swapped_forms,
            spread=0.02,
        ),
    )
}


def _check(registry: Mapping[str, Strategy]) -> None:
    """Refuse an inconsistent registry at import (a forgotten piece of a new strategy)."""
    for name, s in registry.items():
        problems = []
        if s.host_view and s.pipelinable:
            problems.append("a host view (no generator) cannot be pipelined")
        if s.skips_zero_tiles and s.pipelinable:
            problems.append("a kernel testing tiles at issue cannot be pipelined")
        if s.sparse_twin is not None and not (
            s.sparse_twin in registry and registry[s.sparse_twin].skips_zero_tiles and s.tiled
        ):
            problems.append(f"its sparse twin {s.sparse_twin!r} is not a registered zero-skip strategy")
        if s.host_view and s.dram_forms is not None:
            problems.append("a host view (no generator) reads no DRAM forms")
        offered = s.families or s.single is not None or s.schedules is not None
        if not offered and not any(t.sparse_twin == name for t in registry.values()):
            problems.append("no candidate offers it (no families, single-node rule or schedule space)")
        claimed = [t.name for t in registry.values() if t is not s and set(t.families) & set(s.families)]
        if claimed:
            problems.append(f"shares a candidate family with {', '.join(claimed)}")
        if s.spread is not None and not 0 < s.spread < 1:
            problems.append(f"spread {s.spread} is not a relative error in (0, 1)")
        if problems:
            raise ValueError(f"strategy {name!r}: " + "; ".join(problems))


_check(REGISTRY)
NAMES = tuple(REGISTRY)


def strategy_of(group: Group | str) -> Strategy:
    """The record of a group's strategy (or of a strategy name)."""
    name = group if isinstance(group, str) else group.strategy
    record = REGISTRY.get(name)
    if record is None:
        raise ValueError(f"unknown strategy {name!r} (known: {', '.join(REGISTRY)})")
    return record


def shape_bound(mc: ModelContext, group: Group) -> float:
    """Cycles this group's kernel takes at least, from shapes alone (0 when its strategy states no bound)."""
    bound = strategy_of(group).shape_bound
    return 0.0 if bound is None else bound(mc, group)


def phases(cx: LowerContext, nodes: Sequence[Node], group: Group, rounding_change: bool) -> list[list[Step]]:
    """The group's program as fenced phases of pipeline steps, by its strategy's generator."""
    generate = strategy_of(group).phases
    if generate is None:
        raise CodegenError(f"strategy {group.strategy!r} has no generator (a view on the host)")
    return generate(cx, nodes, group, rounding_change)
