"""Every vector row of the ISA table (memory-to-memory and chain) against independent oracles and its timing rule."""

from __future__ import annotations

import math

import numpy as np
import pytest
from sim_helpers import local, machine, unit_slices

from isa import BY_MNEMONIC, INSTRUCTIONS
from isa.enums import DType, Unit
from simulator import PRESETS
from simulator.semantics.scalar import bits_from_f32

CFG = PRESETS["tiny"]
A, B, D = 0, 4096, 8192
N, PERIOD = 24, 6
RNG = np.random.default_rng(7)
RANGES = {"i8": (-128, 127), "i32": (-(2**31), 2**31 - 1)}


def beats(n: int) -> int:
    """Contract: the vector unit handles L elements per cycle."""
    return -(-n // CFG.vector_lanes)


def _values(dtype: str, count: int, positive: bool = False) -> np.ndarray:
    if dtype == "f32":
        x = RNG.uniform(0.1 if positive else -4, 4, count).astype(np.float32)
        return x
    lo, hi = RANGES[dtype]
    if dtype == "i32":
        lo, hi = -(2**20), 2**20  # keep products in range for interesting but checkable results
    return RNG.integers(lo, hi, count, endpoint=True).astype(DType[dtype].numpy)


def _to(dtype: str, exact: np.ndarray) -> np.ndarray:
    """Cast an exact int64 / float64 result to `dtype` by the ISA rule: i8 saturates, i32 wraps, f32 rounds."""
    if dtype == "f32":
        return exact.astype(np.float32)
    if dtype == "i8":
        return np.clip(exact, -128, 127).astype(np.int8)
    return ((exact.astype(np.int64) + 2**31) % 2**32 - 2**31).astype(np.int32)


def _wide(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float64 if x.dtype == np.float32 else np.int64)


def _binary_oracle(op: str, a: np.ndarray, b: np.ndarray, dtype: str) -> np.ndarray:
    wa, wb = _wide(a), _wide(b)
    bits = 8 if dtype == "i8" else 32
    shift = (wb.astype(np.int64) & (bits - 1)) if dtype != "f32" else None
    exact = {
        "add": lambda: wa + wb,
        "sub": lambda: wa - wb,
        "mul": lambda: wa * wb,
        "max": lambda: np.maximum(wa, wb),
        "min": lambda: np.minimum(wa, wb),
        "div": lambda: wa / wb,
        "sll": lambda: wa << shift,
        "sra": lambda: wa >> shift,
        "srl": lambda: ((wa % 2**bits) >> shift) - ((((wa % 2**bits) >> shift) >> (bits - 1)) << bits),
    }[op]()
    return _to(dtype, exact)


UNARY_ORACLE = {
    "relu": lambda x: np.maximum(x, 0),
    "neg": lambda x: -x,
    "abs": np.abs,
    "copy": lambda x: x,
    "exp": np.exp,
    "recip": lambda x: 1 / x,
    "rsqrt": lambda x: 1 / np.sqrt(x),
    "sqrt": np.sqrt,
    "erf": lambda x: np.array([math.erf(v) for v in x]),
    "tanh": np.tanh,
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
}


def _split(mnemonic: str) -> tuple[str, str]:
    parts = mnemonic.split(".")
    return parts[1], ("." + parts[2]) if len(parts) > 2 else ""


def _cases(prefix: str, opcodes: tuple[int, ...]) -> list[tuple[str, str]]:
    """(mnemonic, dtype) pairs; a chain op takes the dtypes of its memory-to-memory twin."""
    out = []
    for spec in INSTRUCTIONS:
        if spec.mnemonic.startswith(prefix) and spec.opcode in opcodes:
            twin = BY_MNEMONIC["v." + spec.mnemonic.split(".", 1)[1]]
            out += [(spec.mnemonic, dt.name) for dt in twin.dtypes]
    return out


def _compare(got: np.ndarray, want: np.ndarray, dtype: str) -> None:
    if dtype == "f32":
        np.testing.assert_allclose(got, want, rtol=3e-6, atol=1e-6)
    else:
        assert got.dtype == want.dtype and np.array_equal(got, want)


def _binary_operands(dtype: str, suffix: str, op: str):
    a = _values(dtype, N)
    count = {"": N, ".vr": PERIOD, ".vc": N // PERIOD, ".vs": 1}[suffix]
    b = _values(dtype, count, positive=op == "div")
    if op in ("sll", "srl", "sra"):
        b = RNG.integers(0, 40, count).astype(a.dtype)
    full = {"": b, ".vs": np.full(N, b[0]), ".vr": np.tile(b, N // PERIOD), ".vc": np.repeat(b, PERIOD)}[suffix]
    return a, b, full


def _scalar_bits(value) -> int:
    return bits_from_f32(float(value)) if isinstance(value, np.floating) else int(value)


@pytest.mark.parametrize(("mnemonic", "dtype"), _cases("v.", (0x30,)))
def test_memory_binary(mnemonic: str, dtype: str) -> None:
    op, suffix = _split(mnemonic)
    a, b, full = _binary_operands(dtype, suffix, op)
    if suffix == ".vs":
        setup, loc = f"li x2, {_scalar_bits(b[0])}", {A: a}
    else:
        setup, loc = f"li x2, {B}", {A: a, B: b}
    extra = f", {PERIOD}" if suffix in (".vr", ".vc") else ""
    m = machine(f"li x1, {A}\n{setup}\nli x3, {D}\n{mnemonic} x3, x1, x2, {N}{extra}, {dtype}\nhalt\n", local=loc)
    _compare(local(m, D, N, DType[dtype].numpy), _binary_oracle(op, a, full, dtype), dtype)
    spec_latency = next(s.latency for s in INSTRUCTIONS if s.mnemonic == mnemonic)
    ((_, start, finish),) = unit_slices(m, Unit.vector)
    assert finish - start == beats(N) + spec_latency


@pytest.mark.parametrize(("mnemonic", "dtype"), _cases("v.", (0x31,)))
def test_memory_unary(mnemonic: str, dtype: str) -> None:
    op = mnemonic[2:]
    a = _values(dtype, N, positive=op in ("sqrt", "rsqrt", "recip"))
    m = machine(f"li x1, {A}\nli x3, {D}\n{mnemonic} x3, x1, {N}, {dtype}\nhalt\n", local={A: a})
    _compare(local(m, D, N, DType[dtype].numpy), _to(dtype, UNARY_ORACLE[op](_wide(a))), dtype)
    ((_, start, finish),) = unit_slices(m, Unit.vector)
    assert finish - start == beats(N) + next(s.latency for s in INSTRUCTIONS if s.mnemonic == mnemonic)


@pytest.mark.parametrize(("mnemonic", "dtype"), _cases("v.", (0x32,)))
def test_memory_reduce(mnemonic: str, dtype: str) -> None:
    op = mnemonic[2:]
    a = _values(dtype, N)
    rows = _wide(a).reshape(-1, PERIOD)
    exact = {"rsum": rows.sum(1), "rmax": rows.max(1), "rmin": rows.min(1)}[op]
    out = "i32" if (op == "rsum" and dtype == "i8") else dtype
    m = machine(f"li x1, {A}\nli x3, {D}\n{mnemonic} x3, x1, {N}, {PERIOD}, {dtype}\nhalt\n", local={A: a})
    _compare(local(m, D, N // PERIOD, DType[out].numpy), _to(out, exact), out)


@pytest.mark.parametrize("dtype", ["i8", "i32", "f32"])
def test_clip_and_convert(dtype: str) -> None:
    a = _values(dtype, N)
    lo, hi = (np.float32(-1.5), np.float32(2.0)) if dtype == "f32" else (-50, 60)
    src = f"li x1, {A}\nli x3, {D}\nli x2, {_scalar_bits(lo)}\nli x4, {_scalar_bits(hi)}\n"
    src += f"v.clip x3, x1, x2, x4, {N}, {dtype}\nli x5, {B}\n"
    for i, dst in enumerate(("i8", "i32", "f32")):
        src += f"li x6, {B + i * 256}\nv.cvt x6, x1, {N}, {dtype}, {dst}\n"
    m = machine(src + "halt\n", local={A: a})
    _compare(local(m, D, N, a.dtype), np.clip(a, lo, hi).astype(a.dtype), dtype)
    for i, dst in enumerate(("i8", "i32", "f32")):
        got = local(m, B + i * 256, N, DType[dst].numpy)
        exact = np.rint(_wide(a)) if dst != "f32" else _wide(a)
        want = exact.astype(np.float32) if dst == "f32" else np.clip(exact, *RANGES[dst]).astype(DType[dst].numpy)
        _compare(got, want, dst)


def test_requantize_and_quantize() -> None:
    x = RNG.integers(-(2**16), 2**16, N).astype(np.int32)
    f = RNG.uniform(-50, 50, N).astype(np.float32)
    src = f"li x1, {A}\nli x2, 77\nli x3, {D}\nv.rqnt x3, x1, x2, 9, {N}\n"
    src += f"li x1, {B}\nli x2, {bits_from_f32(3.0)}\nli x3, {D + 256}\nv.qnt x3, x1, x2, {N}\nhalt\n"
    m = machine(src, local={A: x, B: f})
    want = [max(-128, min(127, (int(v) * 77 + 256) >> 9)) for v in x]
    assert local(m, D, N, np.int8).tolist() == want
    assert local(m, D + 256, N, np.int8).tolist() == np.clip(np.rint(f.astype(np.float64) * 3), -128, 127).tolist()


# --- chains: each vc.* op must equal its memory-to-memory twin, and cost only its latency ---------------


def _twin_programs(mnemonic: str, dtype: str) -> tuple[str, str, dict, int, str]:
    """(chain program, memory program, local data, result count, result dtype) computing the same op."""
    op, suffix = _split(mnemonic)
    spec = next(s for s in INSTRUCTIONS if s.mnemonic == mnemonic)
    if spec.opcode == 0x41:
        a, b, _ = _binary_operands(dtype, suffix, op)
        if suffix == ".vs":
            scalar = f"li x2, {_scalar_bits(b[0])}\n"
            chain = f"{scalar}vc.ld v1, x1, {N}, {dtype}\n{mnemonic} v3, v1, x2\n"
            memory = f"{scalar}v.{op}.vs x3, x1, x2, {N}, {dtype}\n"
        else:
            chain = f"li x2, {B}\nvc.ld v1, x1, {N}, {dtype}\nvc.ld v2, x2, {b.size}, {dtype}\n{mnemonic} v3, v1, v2\n"
            extra = f", {PERIOD}" if suffix else ""
            memory = f"li x2, {B}\nv.{op}{suffix} x3, x1, x2, {N}{extra}, {dtype}\n"
        return chain, memory, {A: a, B: b}, N, dtype
    a = _values(dtype, N, positive=op in ("sqrt", "rsqrt", "recip"))
    if spec.opcode == 0x42:
        return (f"vc.ld v1, x1, {N}, {dtype}\n{mnemonic} v3, v1\n", f"v.{op} x3, x1, {N}, {dtype}\n", {A: a}, N, dtype)
    out = "i32" if (op == "rsum" and dtype == "i8") else dtype
    return (
        f"vc.ld v1, x1, {N}, {dtype}\n{mnemonic} v3, v1, {PERIOD}\n",
        f"v.{op} x3, x1, {N}, {PERIOD}, {dtype}\n",
        {A: a},
        N // PERIOD,
        out,
    )


@pytest.mark.parametrize(("mnemonic", "dtype"), _cases("vc.", (0x41, 0x42, 0x43)))
def test_chain_op_equals_memory_twin(mnemonic: str, dtype: str) -> None:
    chain, memory, data, count, out = _twin_programs(mnemonic, dtype)
    head = f"li x1, {A}\nli x3, {D}\n"
    fused = machine(head + chain + "vc.st x3, v3\nhalt\n", local=data)
    plain = machine(head + memory + "halt\n", local=data)
    assert np.array_equal(
        local(fused, D, count, DType[out].numpy), local(plain, D, count, DType[out].numpy), equal_nan=True
    )
    spec = next(s for s in INSTRUCTIONS if s.mnemonic == mnemonic)
    op_slice = [s for s in unit_slices(fused, Unit.vector) if fused.instructions[s[0]].mnemonic == mnemonic]
    ((_, start, finish),) = op_slice
    want = beats(N) + spec.latency if spec.timing == "chain_reduce" else spec.latency
    assert finish - start == want


def test_chain_conversions_and_quantization_match_memory_ops() -> None:
    x = RNG.integers(-(2**16), 2**16, N).astype(np.int32)
    f = RNG.uniform(-50, 50, N).astype(np.float32)
    chain = (
        f"li x1, {A}\nli x2, 77\nvc.ld v1, x1, {N}, i32\nvc.rqnt v2, v1, x2, 9\nli x3, {D}\nvc.st x3, v2\n"
        f"li x1, {B}\nli x2, {bits_from_f32(3.0)}\nvc.ld v1, x1, {N}, f32\nvc.qnt v2, v1, x2\n"
        f"vc.cvt v3, v1, i32\nli x4, -5\nli x5, 5\nvc.clip v4, v3, x4, x5\n"
        f"li x3, {D + 256}\nvc.st x3, v2\nli x3, {D + 512}\nvc.st x3, v4\nhalt\n"
    )
    memory = (
        f"li x1, {A}\nli x2, 77\nli x3, {D}\nv.rqnt x3, x1, x2, 9, {N}\n"
        f"li x1, {B}\nli x2, {bits_from_f32(3.0)}\nli x3, {D + 256}\nv.qnt x3, x1, x2, {N}\n"
        f"li x6, 12288\nv.cvt x6, x1, {N}, f32, i32\nli x4, -5\nli x5, 5\nli x3, {D + 512}\n"
        f"v.clip x3, x6, x4, x5, {N}, i32\nhalt\n"
    )
    fused, plain = machine(chain, local={A: x, B: f}), machine(memory, local={A: x, B: f})
    for addr, dt in ((D, np.int8), (D + 256, np.int8), (D + 512, np.int32)):
        assert np.array_equal(local(fused, addr, N, dt), local(plain, addr, N, dt))


def test_chain_is_one_pass_cheaper_than_memory_ops() -> None:
    a = _values("f32", 64)
    chain = f"li x1, {A}\nli x3, {D}\nvc.ld v1, x1, 64, f32\nvc.exp v2, v1\nvc.add v3, v2, v1\nvc.st x3, v3\nhalt\n"
    memory = f"li x1, {A}\nli x3, {D}\nv.exp x3, x1, 64, f32\nv.add x3, x3, x1, 64, f32\nhalt\n"
    fused, plain = machine(chain, local={A: a}), machine(memory, local={A: a})
    assert np.array_equal(local(fused, D, 64, np.float32), local(plain, D, 64, np.float32))
    busy = [sum(f - s for _, s, f in unit_slices(x, Unit.vector)) for x in (fused, plain)]
    assert busy[0] < busy[1]


def test_chain_register_faults() -> None:
    from simulator import SimulatorTrap

    with pytest.raises(SimulatorTrap, match="v1 is read before any instruction wrote it"):
        machine("vc.relu v2, v1\nhalt\n")
    with pytest.raises(SimulatorTrap, match="overflow v1"):
        machine(f"li x1, 0\nvc.ld v1, x1, {CFG.vreg_elems + 1}, i8\nhalt\n")
    with pytest.raises(SimulatorTrap, match="operand dtypes differ"):
        machine("li x1, 0\nvc.ld v1, x1, 4, i8\nvc.ld v2, x1, 4, i32\nvc.add v3, v1, v2\nhalt\n")
    with pytest.raises(SimulatorTrap, match="exp needs dtype f32"):
        machine("li x1, 0\nvc.ld v1, x1, 4, i8\nvc.exp v3, v1\nhalt\n")
