"""Kernel features carry the schedule's GEMM loop order, so cost models can tell A-stationary and swapped
kernels from the default order (and the HPM's feature vector encodes it)."""

from __future__ import annotations

import numpy as np
import pytest
from engine_helpers import context, model
from hypothesis import given, settings
from hypothesis import strategies as st

from assembler.builder import ProgramBuilder
from fusion.engine.candidates import Candidate, enumerate_candidates, schedules, zero_skip_twin
from fusion.engine.engine import EngineOptions, FusionEngine
from fusion.engine.features import _unrolled, kernel_features
from fusion.engine.kernel import try_build
from fusion.engine.strategies import strategy_of
from fusion.graph.builder import GraphBuilder
from fusion.graph.ops import OpType
from fusion.hpm.schema import FEATURE_NAMES, vectorize
from isa import INSTRUCTIONS
from isa.encoding import decode
from isa.enums import DType
from simulator.timing import dma_bursts


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


def test_dispatched_kernels_features_are_their_own_counts() -> None:
    """The engine takes a dispatched kernel's features from the planner's count of that very kernel (re-counting
    a large program is slow): they are what counting the dispatched program gives, at the live zero-tile
    fraction, for every group of the plan."""
    graph, x = model("encoder_post_d64")
    engine = FusionEngine(graph, "base", "int8", EngineOptions(pipeline=False))
    result = engine.run(x)
    kernels = {c.group.nodes: engine._kernel(engine._state, c.group, "any")[0] for c in engine.plan.choices}
    checked = 0
    for record in result.records:
        if record.features is None:
            continue
        kernel = kernels[record.nodes]
        assert record.features == kernel_features(engine.mc, kernel, record.features.zero_tile_fraction)
        checked += 1
    assert checked >= 4


def _issued(text) -> list:
    """The decoded instructions in the order the core issues them (`_issued_pcs`)."""
    return [decode(text[pc]) for pc in _issued_pcs(text)]


def _issued_pcs(text) -> list[int]:
    """The pcs of the instructions in the order the core issues them: a `loopi`'s body [pc + 1, pc + lend) run n
    times (zero times when n is 0), as `simulator.units.scalar` runs it; a loop nested in a body runs each pass."""
    out = []

    def run(lo: int, hi: int) -> None:
        pc = lo
        while pc < hi:
            ins = decode(text[pc])
            out.append(pc)
            if ins.mnemonic != "loopi":
                pc += 1
                continue
            end = pc + ins.field("lend")
            for _ in range(ins.field("n")):
                run(pc + 1, end)
            pc = end

    run(0, len(text))
    return out


def _decoded_counts(mc, kernel) -> dict[str, int]:
    """The counts the features hold, from the ISA's own decoder word by word (an oracle sharing no table or field
    arithmetic with `kernel_features`)."""
    counts = dict.fromkeys(("instructions", "dma_loads", "dma_stores", "load_bytes", "store_bytes"), 0)
    counts.update(dict.fromkeys(("load_bursts", "store_bursts", "preloads", "matmuls", "matmul_rows"), 0))
    counts.update(dict.fromkeys(("drains", "drain_rows", "phases", "tile_m", "tile_k", "tile_n"), 0))
    regs: dict[int, int] = {}
    for ins in _issued(kernel.program.text):
        t = ins.spec.timing
        counts["instructions"] += 1
        if ins.mnemonic == "li":
            regs[ins.field("rd")] = ins.field("imm32") & 0xFFFFFFFF
        elif t.startswith("dma_"):
            side = "store" if t == "dma_store" else "load"
            rows, row_bytes = ins.field("rows"), ins.field("cols") * (1 if ins.field("dtype") == DType.i8 else 4)
            counts[f"dma_{side}s"] += 1
            counts[f"{side}_bytes"] += rows * row_bytes
            counts[f"{side}_bursts"] += dma_bursts(mc.config, rows, row_bytes, regs.get(ins.field("rs2"), row_bytes))
        elif t == "preload":
            counts["preloads"] += 1
            counts["tile_k"], counts["tile_n"] = (
                max(counts["tile_k"], ins.field("rows")),
                max(counts["tile_n"], ins.field("cols")),
            )
        elif t in ("matmul", "matmul_stream"):
            counts["matmuls"] += 1
            counts["matmul_rows"] += ins.field("rows")
            counts["tile_m"] = max(counts["tile_m"], ins.field("rows"))
        elif t == "drain":
            counts["drains"] += 1
            counts["drain_rows"] += ins.field("rows")
        elif ins.mnemonic == "fence":
            counts["phases"] += 1
    return counts


@pytest.mark.parametrize(("name", "dtype"), [("encoder_post_d64", "int8"), ("resnet_block", "fp32")])
def test_features_count_what_the_isa_decoder_reads(name: str, dtype: str) -> None:
    """Every candidate kernel (every schedule, zero-skip twins included) of a bundled model: the vectorised
    counts equal a word-by-word count through `isa.encoding.decode`."""
    graph, x = model(name)
    mc = context(graph, x, dtype)
    seen = 0
    for cand in enumerate_candidates(graph):
        groups = schedules(mc, cand)
        for group in groups + [t for g in groups if (t := zero_skip_twin(g))]:
            kernel = try_build(mc, group, "sparse" if strategy_of(group).skips_zero_tiles else "any")
            if isinstance(kernel, str) or kernel.program is None:
                continue
            f = kernel_features(mc, kernel)
            want = _decoded_counts(mc, kernel)
            got = {k: getattr(f, k, None) for k in want}
            got.update(load_bytes=f.dram_read_bytes, store_bytes=f.dram_write_bytes)
            assert got == want, group
            seen += 1
    assert seen >= 20


@st.composite
def _loop_nests(draw: st.DrawFn, depth: int = 0) -> list:
    """A body: plain instructions (None) and loops (trip count, body), nested up to three deep."""
    body = []
    for _ in range(draw(st.integers(0 if depth else 1, 4))):
        if depth < 3 and draw(st.booleans()):
            body.append((draw(st.integers(0, 3)), draw(_loop_nests(depth + 1))))
        else:
            body.append(None)
    return body


@given(_loop_nests())
@settings(max_examples=60, deadline=None)
def test_unrolled_issues_nested_loops_as_the_core_does(nest: list) -> None:
    """`features._unrolled` (runs of issued indices, vectorised) against the word-by-word issue order."""
    b = ProgramBuilder()
    marks = iter(range(1 << 20))

    def emit(body: list) -> None:
        for part in body:
            if part is None:
                b.nop()
                continue
            count, inner = part
            end = f"end{next(marks)}"
            b.loopi(count, end)
            emit(inner)
            b.nop()  # (a loop body is never empty)
            b.label(end)

    emit(nest)
    b.halt()
    text = b.build().text
    words, kind = _unrolled(np.asarray(text, dtype=np.uint64))
    pcs = _issued_pcs(text)
    assert words.tolist() == [text[pc] for pc in pcs]
    assert [INSTRUCTIONS[k].mnemonic for k in kind.tolist()] == [decode(text[pc]).mnemonic for pc in pcs]
