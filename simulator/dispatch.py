"""The explicit mnemonic -> instruction-builder map, checked against the ISA table at import.

Every row of `isa.INSTRUCTIONS` must have a builder here and a timing rule in `simulator.timing`, and
every operation name the table lists must have a semantics function; otherwise importing the simulator
fails, naming what is missing. No dispatch by name reflection.
"""

from __future__ import annotations

from functools import partial
from types import ModuleType
from typing import TYPE_CHECKING

from isa import BY_MNEMONIC, INSTRUCTIONS, Instruction
from isa.enums import Unit
from isa.errors import IsaTableError
from isa.table import BRANCHES, SCALAR_ALU, SCALAR_IMM, VECTOR_BINARY, VECTOR_MODES, VECTOR_REDUCE, VECTOR_UNARY
from simulator.semantics import scalar as scalar_sem
from simulator.semantics import vector as vector_sem
from simulator.timing import TIMING_RULES
from simulator.units import chain, dma, matrix, scalar, vector

if TYPE_CHECKING:
    from simulator.machine import Builder, Once


def _vector_family(prefix: str, module: ModuleType) -> dict[str, Builder]:
    """Rows the memory-to-memory (`v.`) and chain (`vc.`) families share; both modules name their builders alike."""
    binary = {
        f"{prefix}.{n}{suffix}": module.binary(n, mode) for n, *_ in VECTOR_BINARY for suffix, mode, _ in VECTOR_MODES
    }
    return {
        **binary,
        **{f"{prefix}.{name}": module.unary(name) for name, *_ in VECTOR_UNARY},
        **{f"{prefix}.{name}": module.reduce(name) for name, *_ in VECTOR_REDUCE},
        f"{prefix}.clip": module.clip,
        f"{prefix}.cvt": module.convert,
        f"{prefix}.rqnt": module.to_int8("rqnt"),
        f"{prefix}.qnt": module.to_int8("qnt"),
    }


def _bound(run: Once) -> Builder:
    """The builder of `run`'s steps: `run` bound to the machine, pc and instruction."""
    return lambda m, pc, ins: partial(run, m, pc, ins)


BUILDERS: dict[str, Builder] = {
    **{name: scalar.alu(name, immediate=False) for name, _, _ in SCALAR_ALU},
    **{name + "i": scalar.alu(name, immediate=True) for name, _, _ in SCALAR_ALU if name in SCALAR_IMM},
    **{name: scalar.branch(name) for name, _, _ in BRANCHES},
    "li": scalar.li,
    "jal": scalar.jal,
    "jalr": scalar.jalr,
    "lw": scalar.scalar_memory(store=False),
    "sw": scalar.scalar_memory(store=True),
    "loop": scalar.loop,
    "loopi": scalar.loopi,
    "rdcnt": scalar.rdcnt,
    "nop": scalar.nop,
    "halt": scalar.halt,
    "fence": scalar.fence,
    "sync.push": _bound(scalar.sync_push),
    "sync.pop": _bound(scalar.sync_pop),
    "bz.tile": scalar.zero_test(branch_if_zero=True),
    "bnz.tile": scalar.zero_test(branch_if_zero=False),
    "dispatch": scalar.dispatch,
    "zc.rd": scalar.zero_count_read,
    "zc.clr": dma.zero_count_clear,
    "dma.ld": dma.dma_load(transposed=False),
    "dma.ldt": dma.dma_load(transposed=True),
    "dma.st": dma.dma_store(counting=False),
    "dma.stz": dma.dma_store(counting=True),
    "mx.preload": matrix.preload,
    "mx.mm": matrix.matmul(accumulate=False),
    "mx.mma": matrix.matmul(accumulate=True),
    "mx.mm.s": matrix.matmul(accumulate=False, strided=True),
    "mx.mma.s": matrix.matmul(accumulate=True, strided=True),
    "mx.mms": matrix.matmul_stream,
    "ep.cfg": matrix.epilogue_config,
    "mx.drain": matrix.drain(strided=False),
    "mx.drain.s": matrix.drain(strided=True),
    "v.rqnt.vr": vector.requantize_channels(per_row=False),
    "v.rqnt.vc": vector.requantize_channels(per_row=True),
    **_vector_family("v", vector),
    "vc.ld": chain.chain_load,
    "vc.st": chain.chain_store,
    "vc.lds": chain.chain_stream,
    **_vector_family("vc", chain),
}


# instructions run at once the first time a pc is reached, without a step (`Machine._first`): a step is built for
# such a pc only when it is reached again (a loop or a branch back); these are the most frequent ones in
# straight-line code, whose step would cost more to build than the instruction costs to run
RUN_ONCE: dict[str, Once] = {"li": scalar.li_now, "sync.push": scalar.sync_push, "sync.pop": scalar.sync_pop}

# a run without values (`Machine.values` False) does the frequent unit instructions of straight-line code each by one
# function of (machine, pc, instruction) that makes the accesses and queues the op but computes nothing: run once at
# first reach as `RUN_ONCE`, and bound to its pc (`partial`) as its step when reached again
TIMED: dict[str, Once] = {
    "mx.preload": matrix.preload_timed,
    "mx.mm": matrix.matmul_timed(accumulate=False),
    "mx.mma": matrix.matmul_timed(accumulate=True),
    "mx.mm.s": matrix.matmul_timed(accumulate=False, strided=True),
    "mx.mma.s": matrix.matmul_timed(accumulate=True, strided=True),
    "dma.ld": dma.dma_load_timed(transposed=False),
    "dma.ldt": dma.dma_load_timed(transposed=True),
    "dma.st": dma.dma_store_timed(counting=False),
    "dma.stz": dma.dma_store_timed(counting=True),
    **{f"v.{n}{suffix}": vector.binary_timed(n, mode) for n, *_ in VECTOR_BINARY for suffix, mode, _ in VECTOR_MODES},
}
TIMED_ONCE: dict[str, Once] = RUN_ONCE | TIMED
TIMED_BUILDERS: dict[str, Builder] = BUILDERS | {name: _bound(run) for name, run in TIMED.items()}


def instruction_unit(ins: Instruction) -> Unit:
    """The unit whose queue an instruction enters (sync tokens: push -> src, pop -> dst)."""
    if ins.spec.unit is not None:
        return ins.spec.unit
    return Unit(ins.field("src") if ins.mnemonic == "sync.push" else ins.field("dst"))


def check_complete() -> None:
    missing = sorted(set(BY_MNEMONIC) - set(BUILDERS))
    extra = sorted(set(BUILDERS) - set(BY_MNEMONIC))
    if missing or extra:
        raise IsaTableError(f"simulator dispatch out of date: no builder for {missing}, builders for unknown {extra}")
    no_rule = sorted({spec.timing for spec in INSTRUCTIONS} - set(TIMING_RULES))
    if no_rule:
        raise IsaTableError(f"no timing rule in simulator.timing for {no_rule}")
    ops = {
        "scalar ALU": ({n for n, _, _ in SCALAR_ALU}, set(scalar_sem.ALU)),
        "branch": ({n for n, _, _ in BRANCHES}, set(scalar_sem.BRANCH_CONDITIONS)),
        "vector unary": ({n for n, *_ in VECTOR_UNARY}, set(vector_sem.UNARY_OPS)),
        "vector reduce": ({n for n, *_ in VECTOR_REDUCE}, set(vector_sem.REDUCE_OPS)),
        "vector binary": ({n for n, *_ in VECTOR_BINARY}, set(vector_sem.BINARY_OPS)),
    }
    for family, (wanted, have) in ops.items():
        if wanted - have:
            raise IsaTableError(f"no {family} semantics for {sorted(wanted - have)}")


check_complete()
