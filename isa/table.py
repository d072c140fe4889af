"""The ISA table: every instruction of the base ISA and the fusion extension.

One row per mnemonic. Adding an instruction means adding a row here, a
semantics function and (if new) a timing rule in the simulator; import-time
checks there fail until all three exist. Never renumber opcodes or functs:
they are the binary format.
"""

from __future__ import annotations

from isa.enums import DType, Extension, Unit
from isa.spec import InstructionSpec, parse_operands, validate_table

B, F = Extension.base, Extension.fusion
SC, LD, MX, VX, ST = Unit.scalar, Unit.load, Unit.matrix, Unit.vector, Unit.store
I8, I32, F32 = DType.i8, DType.i32, DType.f32
INT, ALL = (I8, I32), (I8, I32, F32)


def _row(
    mnemonic: str,
    operands: str,
    opcode: int,
    funct: int | None,
    unit: Unit | None,
    ext: Extension,
    timing: str,
    latency: int,
    semantics: str,
    dtypes: tuple[DType, ...] = (),
    mode: int | None = None,
    reads_data: bool = False,
) -> InstructionSpec:
    fixed = [("opcode", opcode)]
    if funct is not None:
        fixed.append(("funct", funct))
    if mode is not None:
        fixed.append(("mode", mode))
    return InstructionSpec(
        mnemonic, parse_operands(operands), tuple(fixed), unit, ext, timing, latency, dtypes, semantics, reads_data
    )


# --- scalar control core -------------------------------------------------------------------
# name, funct, semantics (rd = rs1 OP rs2); the -i forms use the same funct with an immediate.
SCALAR_ALU = (
    ("add", 0, "+"),
    ("sub", 1, "-"),
    ("and", 2, "&"),
    ("or", 3, "|"),
    ("xor", 4, "^"),
    ("sll", 5, "<< (low 5 bits)"),
    ("srl", 6, ">> logical (low 5 bits)"),
    ("sra", 7, ">> arithmetic (low 5 bits)"),
    ("mul", 8, "* (low 32 bits)"),
    ("div", 9, "/ signed, toward zero; traps on zero"),
    ("rem", 10, "% signed, sign of dividend; traps on zero"),
    ("slt", 11, "< signed ? 1 : 0"),
    ("sltu", 12, "< unsigned ? 1 : 0"),
)
SCALAR_IMM = ("add", "and", "or", "xor", "sll", "srl", "sra", "mul", "slt", "sltu")
BRANCHES = (
    ("beq", 0, "=="),
    ("bne", 1, "!="),
    ("blt", 2, "< signed"),
    ("bge", 3, ">= signed"),
    ("bltu", 4, "< unsigned"),
    ("bgeu", 5, ">= unsigned"),
)

_SCALAR = (
    *(_row(n, "rd, rs1, rs2", 0x01, f, SC, B, "scalar", 1, f"rd = rs1 {op}") for n, f, op in SCALAR_ALU),
    *(
        _row(n + "i", "rd, rs1, imm", 0x02, f, SC, B, "scalar", 1, f"rd = rs1 {op} imm")
        for n, f, op in SCALAR_ALU
        if n in SCALAR_IMM
    ),
    _row("li", "rd, imm32", 0x03, None, SC, B, "scalar", 1, "rd = imm32 (an fp32 literal gives its bits)"),
    *(
        _row(n, "rs1, rs2, target", 0x04, f, SC, B, "branch", 1, f"if rs1 {op} rs2: pc = target")
        for n, f, op in BRANCHES
    ),
    _row("jal", "rd, target", 0x05, None, SC, B, "branch", 1, "rd = pc + 1; pc = target"),
    _row("jalr", "rd, imm(rs1)", 0x06, None, SC, B, "branch", 1, "rd = pc + 1; pc = rs1 + imm"),
    _row("lw", "rd, imm(rs1)", 0x07, None, SC, B, "scalar_mem", 1, "rd = dram32[rs1 + imm]", reads_data=True),
    _row("sw", "rs2, imm(rs1)", 0x08, None, SC, B, "scalar_mem", 1, "dram32[rs1 + imm] = rs2"),
    _row(
        "loop",
        "rs1, lend",
        0x09,
        0,
        SC,
        B,
        "loop",
        1,
        "repeat [pc+1, lend) rs1 times with zero overhead (hardware loop stack)",
    ),
    _row("loopi", "n, lend", 0x09, 1, SC, B, "loop", 1, "repeat [pc+1, lend) n times with zero overhead"),
    _row("rdcnt", "rd, counter", 0x0A, None, SC, B, "scalar", 1, "rd = low 32 bits of a performance counter"),
    _row("nop", "", 0x0B, 0, SC, B, "scalar", 1, "no operation"),
    _row("halt", "", 0x0B, 1, SC, B, "control", 1, "wait for every unit to drain, then stop"),
    _row("fence", "", 0x0B, 2, SC, B, "control", 1, "stall issue until every unit queue is empty"),
    _row("sync.push", "src, dst", 0x0C, 0, None, B, "sync", 0, "in src's queue: signal one token to dst"),
    _row("sync.pop", "src, dst", 0x0C, 1, None, B, "sync", 0, "in dst's queue: wait for and take one token from src"),
)

# --- DMA ---------------------------------------------------------------------------------
_DMA = (
    _row(
        "dma.ld",
        "rd, rs1, rs2, rows, cols, dtype",
        0x10,
        0,
        LD,
        B,
        "dma_load",
        0,
        "local[rd] = dram[rs1] as rows x cols, DRAM row stride rs2 bytes, dense locally",
        ALL,
    ),
    _row(
        "dma.ldt",
        "rd, rs1, rs2, rows, cols, dtype",
        0x10,
        1,
        LD,
        F,
        "dma_load_transposed",
        2,
        "local[rd] = transpose(dram[rs1] rows x cols): a cols x rows tile, transposed in flight",
        ALL,
    ),
    _row(
        "dma.st",
        "rd, rs1, rs2, rows, cols, dtype",
        0x11,
        0,
        ST,
        B,
        "dma_store",
        0,
        "dram[rd] = local[rs1] rows x cols, DRAM row stride rs2 bytes",
        ALL,
    ),
    _row(
        "dma.stz",
        "rd, rs1, rs2, rows, cols, dtype",
        0x11,
        1,
        ST,
        F,
        "dma_store",
        0,
        "dma.st, and the zero-tile counter += the all-zero N x N tiles of the stored rows x cols (tiled from its "
        "first row and column; edge tiles partial; f32 -0.0 is zero), counted on the store path at no cost",
        ALL,
    ),
)

# --- systolic matrix unit ------------------------------------------------------------------
_MATRIX = (
    _row(
        "mx.preload",
        "rs1, rows, cols, dtype",
        0x20,
        None,
        MX,
        B,
        "preload",
        0,
        "weights = spad[rs1] rows(K) x cols, zero-padded to N x N, for the next mx.mm*: they shift into the "
        "array's shadow buffer while it computes (double-buffered)",
        (I8, F32),
    ),
    _row(
        "mx.mm",
        "rd, rs1, rows",
        0x21,
        0,
        MX,
        B,
        "matmul",
        0,
        "acc[rd] = spad[rs1] (rows x K) @ weights (int8 -> int32 or fp32); rows enter right behind the previous "
        "matmul's, the results follow 2N - 1 cycles later",
    ),
    _row("mx.mma", "rd, rs1, rows", 0x21, 1, MX, B, "matmul", 0, "acc[rd] += spad[rs1] (rows x K) @ weights"),
    _row(
        "mx.mm.s",
        "rd, rs1, rs2, rows",
        0x21,
        3,
        MX,
        F,
        "matmul",
        0,
        "mx.mm with A's rows rs2 bytes apart (row i of K elements at spad[rs1 + i * rs2]): a k-slice of a dense "
        "rows x D tile read in place at stride D * elem, as Gemmini's A stride; the unit's row fetch adds the "
        "stride, one row a cycle either way, so it times as mx.mm",
    ),
    _row(
        "mx.mma.s",
        "rd, rs1, rs2, rows",
        0x21,
        4,
        MX,
        F,
        "matmul",
        0,
        "acc[rd] += A @ weights, A's rows rs2 bytes apart (as mx.mm.s)",
    ),
    _row(
        "mx.mms",
        "rs1, rows",
        0x21,
        2,
        MX,
        F,
        "matmul_stream",
        0,
        "stream spad[rs1] (rows x K) @ weights row by row to the vector unit (vc.lds)",
    ),
    _row(
        "ep.cfg",
        "rs1, rs2, rs3, shift, act, epflags, dtype",
        0x22,
        None,
        MX,
        F,
        "epilogue_config",
        0,
        "configure drain epilogue: bias at rs1, residual at rs2, scale rs3 (epflags pc: local address of a "
        "per-column (mult, shift) i32 table, shift ignored), shift, activation, out dtype",
        ALL,
    ),
    _row(
        "mx.drain",
        "rd, rs1, rows, cols",
        0x23,
        0,
        MX,
        F,
        "drain",
        3,
        "spad[rd] = requant(act(acc[rs1] + bias + residual)) rows x cols, no DRAM round trip",
    ),
    _row(
        "mx.drain.s",
        "rd, rs1, rs2, rows, cols",
        0x23,
        1,
        MX,
        F,
        "drain",
        3,
        "mx.drain with the output rows rs2 bytes apart (row i at spad[rd + i * rs2]): a column panel drained "
        "straight into its place in a dense rows x D tile at stride D * elem; the epilogue's write address "
        "generator adds the stride, one row a cycle either way, so it times as mx.drain",
    ),
)

# --- vector unit, memory to memory ------------------------------------------------------------
# name, funct, dtypes, latency, semantics
VECTOR_BINARY = (
    ("add", 0, ALL, 1, "a + b"),
    ("sub", 1, ALL, 1, "a - b"),
    ("mul", 2, ALL, 2, "a * b"),
    ("max", 3, ALL, 1, "max(a, b)"),
    ("min", 4, ALL, 1, "min(a, b)"),
    ("div", 5, (F32,), 4, "a / b"),
    ("sll", 6, INT, 1, "a << b"),
    ("srl", 7, INT, 1, "a >> b logical"),
    ("sra", 8, INT, 1, "a >> b arithmetic"),
)
VECTOR_MODES = (
    ("", 0, "b = local[rs2] (n elements)"),
    (".vs", 1, "b = scalar rs2 broadcast"),
    (".vr", 2, "b = local[rs2] (period elements) repeated for every row"),
    (".vc", 3, "b = local[rs2] (n / period elements), one per row"),
)
VECTOR_UNARY = (
    ("relu", 0, ALL, 1, "max(a, 0)"),
    ("neg", 1, ALL, 1, "-a"),
    ("abs", 2, ALL, 1, "|a|"),
    ("exp", 3, (F32,), 4, "e^a"),
    ("recip", 4, (F32,), 4, "1 / a"),
    ("rsqrt", 5, (F32,), 4, "1 / sqrt(a)"),
    ("sqrt", 6, (F32,), 4, "sqrt(a)"),
    ("erf", 7, (F32,), 4, "erf(a)"),
    ("tanh", 8, (F32,), 4, "tanh(a)"),
    ("sigmoid", 9, (F32,), 4, "1 / (1 + e^-a)"),
    ("copy", 10, ALL, 1, "a"),
)
VECTOR_REDUCE = (
    ("rsum", 0, ALL, 2, "sum of each row of period elements (i8 sums as i32)"),
    ("rmax", 1, ALL, 2, "max of each row of period elements"),
    ("rmin", 2, ALL, 2, "min of each row of period elements"),
)
SATURATION = "i8 saturates, i32 wraps"


def _vector_binary_rows(prefix: str, opcode: int, ext: Extension, timing: str) -> tuple[InstructionSpec, ...]:
    rows = []
    for name, funct, dtypes, lat, sem in VECTOR_BINARY:
        for suffix, mode, operand_text in VECTOR_MODES:
            if prefix == "v":
                ops = "rd, rs1, rs2, n, dtype" if mode < 2 else "rd, rs1, rs2, n, period, dtype"
                what = f"local[rd] = {sem} over n elements of local[rs1]; {operand_text}; {SATURATION}"
                rows.append(_row(f"v.{name}{suffix}", ops, opcode, funct, VX, ext, timing, lat, what, dtypes, mode))
            else:
                ops = "vd, vs1, rs2" if mode == 1 else "vd, vs1, vs2"
                what = f"vd = {sem} with a = vs1, b = {'scalar rs2' if mode == 1 else 'vs2'}" + (
                    "" if mode < 2 else f" ({'row' if mode == 2 else 'column'} broadcast by length)"
                )
                rows.append(_row(f"vc.{name}{suffix}", ops, opcode, funct, VX, ext, timing, lat, what, (), mode))
    return tuple(rows)


_VECTOR = (
    *_vector_binary_rows("v", 0x30, B, "vector"),
    *(
        _row(f"v.{n}", "rd, rs1, n, dtype", 0x31, f, VX, B, "vector", lat, f"local[rd] = {s} over n elements", d)
        for n, f, d, lat, s in VECTOR_UNARY
    ),
    *(
        _row(f"v.{n}", "rd, rs1, n, period, dtype", 0x32, f, VX, B, "vector_reduce", lat, f"local[rd] = {s}", d)
        for n, f, d, lat, s in VECTOR_REDUCE
    ),
    _row(
        "v.clip",
        "rd, rs1, rs2, rs3, n, dtype",
        0x33,
        0,
        VX,
        B,
        "vector",
        1,
        "local[rd] = min(max(local[rs1], rs2), rs3) over n elements",
        ALL,
    ),
    _row(
        "v.cvt",
        "rd, rs1, n, dtype, dtype2",
        0x33,
        1,
        VX,
        B,
        "vector",
        2,
        "local[rd] = convert n elements of local[rs1] from dtype to dtype2 (round half to even, saturate)",
        ALL,
    ),
    _row(
        "v.rqnt",
        "rd, rs1, rs2, shift, n",
        0x33,
        2,
        VX,
        B,
        "vector",
        3,
        "local[rd] (i8) = sat8((local[rs1] (i32) * rs2 + 2^(shift-1)) >> shift)",
    ),
    _row(
        "v.rqnt.vr",
        "rd, rs1, rs2, n, period",
        0x33,
        4,
        VX,
        B,
        "vector",
        3,
        "local[rd] (i8) = requant of local[rs1] (i32) by the (mult, shift) i32 pair at local[rs2] of column "
        "i mod period (per-channel)",
    ),
    _row(
        "v.rqnt.vc",
        "rd, rs1, rs2, n, period",
        0x33,
        5,
        VX,
        B,
        "vector",
        3,
        "local[rd] (i8) = requant of local[rs1] (i32) by the (mult, shift) i32 pair at local[rs2] of row "
        "i div period (per-channel)",
    ),
    _row(
        "v.qnt",
        "rd, rs1, rs2, n",
        0x33,
        3,
        VX,
        B,
        "vector",
        3,
        "local[rd] (i8) = sat8(round_half_even(local[rs1] (f32) * f32(rs2)))",
    ),
)

# --- vector chains (fusion): intermediates stay in vector registers -----------------------------
_CHAIN = (
    _row("vc.ld", "vd, rs1, n, dtype", 0x40, 0, VX, F, "chain_load", 1, "vd = n elements of local[rs1]", ALL),
    _row("vc.st", "rd, vs1", 0x40, 1, VX, F, "chain_store", 1, "local[rd] = vs1"),
    _row(
        "vc.lds",
        "vd, n",
        0x40,
        2,
        VX,
        F,
        "chain_stream",
        1,
        "vd = next n elements streamed from the matrix unit (mx.mms), overlapping it",
    ),
    *_vector_binary_rows("vc", 0x41, F, "chain_op"),
    *(
        _row(f"vc.{n}", "vd, vs1", 0x42, f, VX, F, "chain_op", lat, f"vd = {s} of vs1")
        for n, f, _, lat, s in VECTOR_UNARY
    ),
    *(
        _row(f"vc.{n}", "vd, vs1, period", 0x43, f, VX, F, "chain_reduce", lat, f"vd = {s} of vs1")
        for n, f, _, lat, s in VECTOR_REDUCE
    ),
    _row("vc.clip", "vd, vs1, rs2, rs3", 0x44, 0, VX, F, "chain_op", 1, "vd = min(max(vs1, rs2), rs3)"),
    _row("vc.cvt", "vd, vs1, dtype2", 0x44, 1, VX, F, "chain_op", 2, "vd = vs1 converted to dtype2"),
    _row(
        "vc.rqnt",
        "vd, vs1, rs2, shift",
        0x44,
        2,
        VX,
        F,
        "chain_op",
        3,
        "vd (i8) = sat8((vs1 (i32) * rs2 + 2^(shift-1)) >> shift)",
    ),
    _row("vc.qnt", "vd, vs1, rs2", 0x44, 3, VX, F, "chain_op", 3, "vd (i8) = sat8(round_half_even(vs1 * f32(rs2)))"),
)

# --- fusion control flow -----------------------------------------------------------------------
_CONTROL = (
    _row(
        "bz.tile",
        "rs1, n, dtype, btarget",
        0x50,
        0,
        SC,
        F,
        "zero_test",
        1,
        "if n elements of local[rs1] are all zero: pc = btarget",
        ALL,
        reads_data=True,
    ),
    _row(
        "bnz.tile",
        "rs1, n, dtype, btarget",
        0x50,
        1,
        SC,
        F,
        "zero_test",
        1,
        "if any of n elements of local[rs1] is non-zero: pc = btarget",
        ALL,
        reads_data=True,
    ),
    _row(
        "dispatch",
        "rs1, table, ncase",
        0x51,
        None,
        SC,
        F,
        "dispatch",
        1,
        "if rs1 < ncase: pc = dram32[table + 4 * rs1], else fall through",
        reads_data=True,
    ),
    _row(
        "zc.clr",
        "",
        0x52,
        0,
        ST,
        F,
        "zero_count_clear",
        0,
        "zero-tile counter = 0, in order with the stores (it enters the store queue)",
    ),
    _row(
        "zc.rd",
        "rd",
        0x52,
        1,
        SC,
        F,
        "zero_count_read",
        1,
        "rd = the zero-tile counter, once every earlier dma.stz has finished (issue waits for them)",
        reads_data=True,
    ),
)

INSTRUCTIONS: tuple[InstructionSpec, ...] = (*_SCALAR, *_DMA, *_MATRIX, *_VECTOR, *_CHAIN, *_CONTROL)
validate_table(INSTRUCTIONS)
BY_MNEMONIC: dict[str, InstructionSpec] = {s.mnemonic: s for s in INSTRUCTIONS}
