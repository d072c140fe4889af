"""Each elementwise op's vector recipe, written once and emitted in two forms: memory to memory (`v.*` over the
n elements of local tiles: the unfused kernels) and register to register (`vc.*`: vector chains).

A recipe sees only a `Form`: `op(name, dst, a, b)` is one vector instruction (unary without b, `.vs` with a
`Scalar`, `.vr` with a `Row`), `clip` the clamp, and `temp`/`release` a scratch tile or register. Every formula
follows the reference (`fusion.reference.kernels`) operation by operation, so float32 results are bit-identical
to it and the int8 path (float32 on dequantized inputs) stays bit-exact against the quantized reference.

`Recipe.reads` names what a recipe reads, in operand order: graph values, or a constant form key (Where reads its
constant condition as two float masks, see `where_masks`; Trilu its triangle, keyed by its output).
`Recipe.check` refuses, with a reason, a node the recipe cannot run (checked before any instruction is emitted).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from fusion.graph.ir import DataType, Graph, Node
from fusion.graph.ops import OpType
from fusion.lower.context import SEL_FALSE, SEL_TRUE, const_key, const_scalar
from fusion.lower.emitter import Emitter, f32_bits

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
MAX_POW = 8  # largest |integer exponent| written as repeated multiplies


@dataclass(frozen=True)
class Scalar:
    """A one-element constant operand, as float32 bits (a `.vs` register operand)."""

    bits: int

    @property
    def value(self) -> float:
        return struct.unpack("<f", struct.pack("<I", self.bits))[0]


@dataclass(frozen=True)
class Row:
    """A row vector repeated for every row of the other operand (`.vr`; chains only)."""

    handle: int


@dataclass(frozen=True)
class Col:
    """One value per row of the other operand (`.vc`): a row reduction's result broadcast back over its row."""

    handle: int


Operand = int | Scalar | Row | Col


class Form(Protocol):
    period: int

    def op(self, name: str, dst: int, a: int, b: Operand | None = None) -> None: ...

    def row_op(self, name: str, dst: int, a: int, b: Operand | None = None) -> None: ...

    def reduce(self, name: str, dst: int, src: int) -> None: ...

    def clip(self, dst: int, a: int, lo: float, hi: float) -> None: ...

    def temp(self) -> int: ...

    def row_temp(self) -> int: ...

    def reuse(self, handle: int) -> int: ...

    def release(self, handle: int) -> None: ...


_SUFFIX = {Scalar: "_vs", Row: "_vr", Col: "_vc"}


@dataclass
class MemoryForm:
    """`v.*` over n float32 elements of local tiles (rows of `period` for reductions and `.vr`/`.vc` operands);
    temps are the scratch tiles the kernel reserved: full tiles and, for row recipes, per-row tiles. An input tile
    is the kernel's private copy, so `reuse` overwrites it in place."""

    em: Emitter
    n: int
    temps: list[int] = field(default_factory=list)
    period: int = 1
    row_temps: list[int] = field(default_factory=list)
    _lent: set[int] = field(default_factory=set)
    _row_tiles: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        self._row_tiles = set(self.row_temps)

    def _emit(self, name: str, dst: int, a: int, b: Operand | None, count: int) -> None:
        em = self.em
        if b is None:
            getattr(em.b, f"v_{name}")(*em.regs(dst, a), count, "f32")
        elif isinstance(b, Scalar):
            getattr(em.b, f"v_{name}_vs")(*em.regs(dst, a, b.bits), count, "f32")
        elif isinstance(b, Row | Col):
            getattr(em.b, f"v_{name}{_SUFFIX[type(b)]}")(*em.regs(dst, a, b.handle), count, self.period, "f32")
        else:
            getattr(em.b, f"v_{name}")(*em.regs(dst, a, b), count, "f32")

    def op(self, name: str, dst: int, a: int, b: Operand | None = None) -> None:
        self._emit(name, dst, a, b, self.n)

    def row_op(self, name: str, dst: int, a: int, b: Operand | None = None) -> None:
        self._emit(name, dst, a, b, self.n // self.period)

    def reduce(self, name: str, dst: int, src: int) -> None:
        getattr(self.em.b, f"v_{name}")(*self.em.regs(dst, src), self.n, self.period, "f32")

    def clip(self, dst: int, a: int, lo: float, hi: float) -> None:
        self.em.b.v_clip(*self.em.regs(dst, a, f32_bits(lo), f32_bits(hi)), self.n, "f32")

    def _take(self, pool: list[int]) -> int:
        if not pool:
            raise AssertionError("recipe needs more scratch tiles than its kernel reserved")
        self._lent.add(pool[0])
        return pool.pop(0)

    def temp(self) -> int:
        return self._take(self.temps)

    def row_temp(self) -> int:
        return self._take(self.row_temps)

    def reuse(self, handle: int) -> int:
        return handle

    def release(self, handle: int) -> None:
        """Back to the end of its pool: the next take rotates to another tile (a reused input goes nowhere)."""
        if handle in self._lent:
            self._lent.discard(handle)
            (self.row_temps if handle in self._row_tiles else self.temps).append(handle)


class Registers(Protocol):
    def temp(self) -> int: ...

    def release(self, reg: int) -> None: ...


@dataclass
class RegisterForm:
    """`vc.*` register to register (a register holds whole rows of `period`); temps come from the chain's
    register free list."""

    em: Emitter
    regs: Registers
    period: int = 1

    def op(self, name: str, dst: int, a: int, b: Operand | None = None) -> None:
        b_ = self.em.b
        if b is None:
            getattr(b_, f"vc_{name}")(dst, a)
        elif isinstance(b, Scalar):
            getattr(b_, f"vc_{name}_vs")(dst, a, self.em.reg(b.bits))
        elif isinstance(b, Row | Col):
            getattr(b_, f"vc_{name}{_SUFFIX[type(b)]}")(dst, a, b.handle)
        else:
            getattr(b_, f"vc_{name}")(dst, a, b)

    def row_op(self, name: str, dst: int, a: int, b: Operand | None = None) -> None:
        self.op(name, dst, a, b)  # a register's length is its own

    def reduce(self, name: str, dst: int, src: int) -> None:
        getattr(self.em.b, f"vc_{name}")(dst, src, self.period)

    def clip(self, dst: int, a: int, lo: float, hi: float) -> None:
        self.em.b.vc_clip(dst, a, self.em.reg(f32_bits(lo)), self.em.reg(f32_bits(hi)))

    def temp(self) -> int:
        return self.regs.temp()

    def row_temp(self) -> int:
        return self.regs.temp()

    def reuse(self, handle: int) -> int:
        return self.regs.temp()  # the chain may still read the value: a register of its own

    def release(self, handle: int) -> None:
        self.regs.release(handle)


Emit = Callable[[Form, Node, int, list[Operand]], None]


def _inputs(graph: Graph, node: Node) -> tuple[str, ...]:
    return node.inputs


def _first(graph: Graph, node: Node) -> tuple[str, ...]:
    return node.inputs[:1]


def _always(graph: Graph, node: Node) -> str | None:
    return None


@dataclass(frozen=True)
class Recipe:
    emit: Emit
    reads: Callable[[Graph, Node], tuple[str, ...]] = _inputs
    scalars: frozenset[int] = frozenset()  # operand positions where a one-element constant is a `.vs` scalar
    check: Callable[[Graph, Node], str | None] = _always
    temps: int = 0  # scratch tiles or registers it takes at most


def _unary(name: str) -> Recipe:
    def emit(f: Form, node: Node, out: int, ins: list[Operand]) -> None:
        f.op(name, out, ins[0])

    return Recipe(emit, _first)


def _binary(name: str) -> Recipe:
    def emit(f: Form, node: Node, out: int, ins: list[Operand]) -> None:
        f.op(name, out, ins[0], ins[1])

    return Recipe(emit, scalars=frozenset({1}))


def _gelu(f: Form, node: Node, out: int, ins: list[Operand]) -> None:
    """0.5 * x * (1 + erf(x / sqrt 2)) or the tanh form, op by op in the reference's order."""
    x = ins[0]
    t = f.temp()
    if node.attr("approximate") == "tanh":
        f.op("mul", t, x, Scalar(f32_bits(0.044715)))
        f.op("mul", t, t, x)
        f.op("mul", t, t, x)
        f.op("add", t, x, t)
        f.op("mul", t, t, Scalar(f32_bits(SQRT_2_OVER_PI)))
        f.op("tanh", t, t)
    else:
        f.op("div", t, x, Scalar(f32_bits(math.sqrt(2.0))))
        f.op("erf", t, t)
    f.op("add", t, t, Scalar(f32_bits(1.0)))
    f.op("mul", out, x, Scalar(f32_bits(0.5)))
    f.op("mul", out, out, t)
    f.release(t)


def _batchnorm(f: Form, node: Node, out: int, ins: list[Operand]) -> None:
    """(x - mean) * (scale / sqrt(var + eps)) + bias with every parameter broadcast along the channel axis."""
    x, scale, bias, mean, var = ins
    t = f.temp()
    f.op("add", t, var, Scalar(f32_bits(node.attr("epsilon"))))
    f.op("sqrt", t, t)
    f.op("div", t, scale, t)
    f.op("sub", out, x, mean)
    f.op("mul", out, out, t)
    f.op("add", out, out, bias)
    f.release(t)


def _clip(f: Form, node: Node, out: int, ins: list[Operand]) -> None:
    f.clip(out, ins[0], node.attr("min"), node.attr("max"))


def _hard_sigmoid_into(f: Form, out: int, x: int, alpha: float, beta: float) -> None:
    """clip(f32(alpha) * x + f32(beta), 0, 1), as the reference."""
    f.op("mul", out, x, Scalar(f32_bits(alpha)))
    f.op("add", out, out, Scalar(f32_bits(beta)))
    f.clip(out, out, 0.0, 1.0)


def _hard_sigmoid(f: Form, node: Node, out: int, ins: list[Operand]) -> None:
    _hard_sigmoid_into(f, out, ins[0], node.attr("alpha"), node.attr("beta"))


def _hard_swish(f: Form, node: Node, out: int, ins: list[Operand]) -> None:
    """x * hard_sigmoid(x, 1/6, 1/2)."""
    t = f.temp()
    _hard_sigmoid_into(f, t, ins[0], 1.0 / 6.0, 0.5)
    f.op("mul", out, ins[0], t)
    f.release(t)


def pow_exponent(graph: Graph, node: Node) -> float | None:
    return const_scalar(graph, node.inputs[1])


def _pow_check(graph: Graph, node: Node) -> str | None:
    e = pow_exponent(graph, node)
    if e is None:
        return "Pow needs a one-element constant exponent"
    if e == 0.5 or (e == int(e) and 1 <= abs(e) <= MAX_POW):
        return None
    return f"Pow exponent {e}: the vector unit has no log; it runs 0.5 and integers 1..{MAX_POW} (and negatives)"


def _pow(f: Form, node: Node, out: int, ins: list[Operand]) -> None:
    """x^0.5 as sqrt; x^k as x * x * ... * x left to right; x^-k as the reciprocal of that (numpy's -1)."""
    x, e = ins[0], ins[1]
    assert isinstance(e, Scalar)
    k = e.value
    if k == 0.5:
        f.op("sqrt", out, x)
        return
    if abs(k) == 1:
        f.op("copy", out, x)
    else:
        f.op("mul", out, x, x)
        for _ in range(int(abs(k)) - 2):
            f.op("mul", out, out, x)
    if k < 0:
        f.op("recip", out, out)


def _cast_check(graph: Graph, node: Node) -> str | None:
    src, dst = graph.types[node.inputs[0]].dtype, graph.types[node.outputs[0]].dtype
    if src == dst == DataType.float32:
        return None
    return f"Cast from {src.value} to {dst.value}: only float32 data flows through the accelerator"


def where_masks(cond: np.ndarray) -> dict[str, np.ndarray]:
    """A constant Where condition as two float32 clamps: where the condition holds, SEL_TRUE is +inf and SEL_FALSE
    -inf; elsewhere the reverse. Then where(c, a, b) = max(min(a, SEL_TRUE), min(b, SEL_FALSE)) exactly (for
    every a and b but a NaN in the branch not taken)."""
    c = np.asarray(cond, dtype=bool)
    inf = np.float32(np.inf)
    return {SEL_TRUE: np.where(c, inf, -inf).astype(np.float32), SEL_FALSE: np.where(c, -inf, inf).astype(np.float32)}


def _where_reads(graph: Graph, node: Node) -> tuple[str, ...]:
    cond, a, b = node.inputs
    return a, b, const_key(cond, SEL_TRUE), const_key(cond, SEL_FALSE)


def _where_check(graph: Graph, node: Node) -> str | None:
    if not graph.is_constant(node.inputs[0]):
        return "Where needs a constant condition (masks are folded at import; no compare instruction)"
    return None


def _where(f: Form, node: Node, out: int, ins: list[Operand]) -> None:
    a, b, on, off = ins
    t = f.temp()
    _min_into(f, out, a, on)
    _min_into(f, t, b, off)
    f.op("max", out, out, t)
    f.release(t)


def trilu_mask(node: Node, shape: tuple[int, ...]) -> np.ndarray:
    """Where Trilu keeps its input: the lower (upper) triangle of the last two axes from diagonal k, broadcast."""
    rows, cols = shape[-2:]
    keep = (np.triu if node.attr("upper") else np.tril)(np.ones((rows, cols), bool), node.attr("k"))
    return np.broadcast_to(keep, shape)


def _trilu_reads(graph: Graph, node: Node) -> tuple[str, ...]:
    out = node.outputs[0]
    return node.inputs[0], const_key(out, SEL_TRUE), const_key(out, SEL_FALSE)


def _trilu(f: Form, node: Node, out: int, ins: list[Operand]) -> None:
    """where(triangle, x, 0) with the triangle as compile-time clamps (see where_masks)."""
    x, on, off = ins
    _where(f, node, out, [x, Scalar(0), on, off])


def _min_into(f: Form, dst: int, value: Operand, mask: Operand) -> None:
    """min(value, mask) with a scalar value as the `.vs` operand."""
    if isinstance(value, Scalar):
        f.op("min", dst, mask, value)
    else:
        f.op("min", dst, value, mask)


UNARY_INSTRUCTION = {
    OpType.Relu: "relu",
    OpType.Sigmoid: "sigmoid",
    OpType.Tanh: "tanh",
    OpType.Erf: "erf",
    OpType.Exp: "exp",
    OpType.Sqrt: "sqrt",
    OpType.Identity: "copy",
    OpType.Neg: "neg",
    OpType.Abs: "abs",
    OpType.Reciprocal: "recip",
}
BINARY_INSTRUCTION = {OpType.Add: "add", OpType.Sub: "sub", OpType.Mul: "mul", OpType.Div: "div"}

RECIPES: dict[OpType, Recipe] = {
    **{op: _unary(name) for op, name in UNARY_INSTRUCTION.items()},
    **{op: _binary(name) for op, name in BINARY_INSTRUCTION.items()},
    OpType.Cast: Recipe(_unary("copy").emit, _first, check=_cast_check),
    OpType.Expand: _unary("copy"),  # the operand is read broadcast to the output shape
    OpType.Gelu: Recipe(_gelu, _first, temps=1),
    OpType.Clip: Recipe(_clip, _first),
    OpType.HardSigmoid: Recipe(_hard_sigmoid, _first),
    OpType.HardSwish: Recipe(_hard_swish, _first, temps=1),
    OpType.Pow: Recipe(_pow, scalars=frozenset({1}), check=_pow_check),
    OpType.Where: Recipe(_where, _where_reads, frozenset({0, 1}), _where_check, temps=1),
    OpType.Trilu: Recipe(_trilu, _trilu_reads, temps=1),
    OpType.BatchNorm: Recipe(_batchnorm, temps=1),
}


@dataclass
class CountingForm:
    """Emits nothing: counts the vector instructions a recipe issues (its cost, from what it emits): `count` over
    every element (ops, clamps, row reductions), `row_count` once per row of `period` (a row recipe's per-row
    ops), as the memory form's `v.*` instructions process them."""

    period: int = 1
    count: int = 0
    row_count: int = 0
    handles: int = 0

    def op(self, name: str, dst: int, a: int, b: Operand | None = None) -> None:
        self.count += 1

    def row_op(self, name: str, dst: int, a: int, b: Operand | None = None) -> None:
        self.row_count += 1

    def reduce(self, name: str, dst: int, src: int) -> None:
        self.count += 1

    def clip(self, dst: int, a: int, lo: float, hi: float) -> None:
        self.count += 1

    def temp(self) -> int:
        self.handles += 1
        return -self.handles

    def row_temp(self) -> int:
        return self.temp()

    def reuse(self, handle: int) -> int:
        return self.temp()

    def release(self, handle: int) -> None:
        pass


def instructions_per_element(graph: Graph, node: Node) -> int:
    """How many vector instructions the node's recipe applies to each element (dequantization excluded)."""
    recipe = RECIPES[node.op]
    ins: list[Operand] = []
    for pos, value in enumerate(recipe.reads(graph, node)):
        scalar = const_scalar(graph, value) if pos in recipe.scalars else None
        ins.append(pos if scalar is None else Scalar(f32_bits(scalar)))
    form = CountingForm()
    recipe.emit(form, node, -1, ins)
    return form.count


def _softmax(f: Form, node: Node, out: int, ins: list[Operand]) -> None:
    """exp(x - max) / sum over each row, as the reference."""
    x = ins[0]
    m = f.row_temp()
    f.reduce("rmax", m, x)
    f.op("sub", out, x, Col(m))
    f.release(m)
    f.op("exp", out, out)
    s = f.row_temp()
    f.reduce("rsum", s, out)
    f.op("div", out, out, Col(s))
    f.release(s)


def _mean_into(f: Form, dst: int, src: int, period: float) -> None:
    f.reduce("rsum", dst, src)
    f.row_op("div", dst, dst, Scalar(f32_bits(period)))


def _layernorm(f: Form, node: Node, out: int, ins: list[Operand]) -> None:
    """mean = sum / count; (x - mean) / sqrt(var + eps) * scale + bias, in the reference's order."""
    x, params = ins[0], ins[1:]
    period = float(f.period)
    m = f.row_temp()
    c = f.reuse(x)
    _mean_into(f, m, x, period)
    f.op("sub", c, x, Col(m))
    f.release(m)
    f.op("mul", out, c, c)
    v = f.row_temp()
    _mean_into(f, v, out, period)
    f.row_op("add", v, v, Scalar(f32_bits(node.attr("epsilon"))))
    f.row_op("sqrt", v, v)
    f.op("div", out, c, Col(v))
    f.op("mul", out, out, params[0])
    if len(params) > 1:
        f.op("add", out, out, params[1])
    f.release(v)
    f.release(c)


ROW_RECIPES: dict[OpType, Emit] = {OpType.Softmax: _softmax, OpType.LayerNorm: _layernorm}  # over the last axis


def _reduce_mean(f: Form, node: Node, out: int, ins: list[Operand]) -> None:
    """sum / count of each row (numpy's mean: a pairwise row sum, then one division)."""
    _mean_into(f, out, ins[0], float(f.period))


def _reduce_sum(f: Form, node: Node, out: int, ins: list[Operand]) -> None:
    f.reduce("rsum", out, ins[0])


# over the last axis, keeping it (length 1): one value per row, which a chain broadcasts back over its row (`Col`)
REDUCE_RECIPES: dict[OpType, Emit] = {OpType.ReduceMean: _reduce_mean, OpType.ReduceSum: _reduce_sum}


def vector_elements(graph: Graph, node: Node) -> int | None:
    """Element operations the node's recipe issues over its output, counted from what it emits (each instruction
    over every element, a row recipe's per-row ops once per row); None for a node without a recipe, or one its
    recipe refuses."""
    out = graph.types[node.outputs[0]]
    if node.op in ROW_RECIPES:
        period = out.shape[-1] if out.shape else 1
        form = CountingForm(period)
        ROW_RECIPES[node.op](form, node, -1, list(range(len(node.inputs))))
        return out.size * form.count + out.size // max(period, 1) * form.row_count
    if refusal(graph, node) is not None:
        return None
    return out.size * instructions_per_element(graph, node)


def refusal(graph: Graph, node: Node) -> str | None:
    """Why this node has no vector recipe (None: it has one)."""
    recipe = RECIPES.get(node.op)
    return f"{node.op.value} has no vector recipe" if recipe is None else recipe.check(graph, node)
