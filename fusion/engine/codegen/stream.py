"""Matrix -> vector streaming: a MatMul whose rows flow straight into a vector chain (`mx.mms` + `vc.lds`).

For a MatMul with K <= N and at most N output columns (one weight tile, no accumulation), each output tile is
streamed row by row from the array into a vector register and the consumers (e.g. the scaled Softmax of
attention scores, an activation) run on it in registers: the scores never exist in the scratchpad or DRAM.
On the int8 path the stream carries int32 sums; the chain requantizes them exactly as the drain would
(`vc.rqnt`) and dequantizes like the unfused consumer, so results stay bit-exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import product

from fusion.engine.codegen.chain import Registers, emit_chain, operand_views, operands
from fusion.engine.codegen.gemm import _load_operand, _quantizer
from fusion.engine.errors import CodegenError
from fusion.graph.ir import Node
from fusion.graph.ops import OpType
from fusion.lower.context import LowerContext
from fusion.lower.emitter import Emitter, Step, Streamed, f32_bits
from fusion.lower.kernels.matrix import matrix_operand, requant
from fusion.lower.local_alloc import TileArena
from isa.enums import Unit


def stream_steps(cx: LowerContext, nodes: Sequence[Node]) -> list[Step]:
    head, rest = nodes[0], list(nodes[1:])
    if head.op != OpType.MatMul or not rest:
        raise CodegenError(f"node {head.name!r}: a stream is a MatMul followed by a vector chain")
    table = operands(cx, rest, frozenset({head.outputs[0]}))
    q = cx.matrix(head) if cx.int8 else None
    a = matrix_operand(cx, head, head.inputs[0], q.input_scale if q else None)
    b = matrix_operand(cx, head, head.inputs[1], q.weight_scale if q else None)
    *batch, m, k = a.view.shape
    n = b.view.shape[-1]
    if len(b.view.shape) > len(a.view.shape) or k > cx.config.array_size or n > cx.config.array_size:
        raise CodegenError(f"node {head.name!r}: streaming needs K and N at most the array size")
    b_full = b.view.broadcast_to((*batch, k, n))
    if m * n > cx.config.vreg_elems or m > 4095:
        raise CodegenError(f"node {head.name!r}: a {m} x {n} tile does not fit a vector register")
    out = cx.view(rest[-1].outputs[0])
    ext, rows_in = operand_views(cx, table, out.shape)
    mult_shift = requant(cx, head)
    scale = cx.scale(head.outputs[0])
    steps = []
    for index in product(*(range(d) for d in batch)):
        arena = TileArena(cx.config, len(steps), cx.rotation)
        loads: list = []
        quants: list = []
        a_addr, dt = _load_operand(arena, a, a.view.index(index), loads, quants)
        b_addr, _ = _load_operand(arena, b, b_full.index(index), loads, quants)
        addr = {v: arena.tile(m * n * view.dtype.size) for v, view in ext.items()}
        loads += [(view.index(index), addr[v]) for v, view in ext.items()]
        addr |= {v: arena.tile(n * 4) for v in rows_in}
        loads += [(view, addr[v]) for v, view in rows_in.items()]
        out_addr = arena.tile(m * n * 4)

        def matrix(em: Emitter, a_addr=a_addr, b_addr=b_addr, dt=dt) -> None:
            em.b.mx_preload(em.reg(b_addr), k, n, dt.name)
            em.b.mx_mms(em.reg(a_addr), m)

        def vector(em: Emitter, addr=addr, out_addr=out_addr) -> None:
            regs = Registers()
            r = regs.new(head.outputs[0])
            em.b.vc_lds(r, m * n)
            if mult_shift is not None:
                em.b.vc_rqnt(r, r, em.reg(mult_shift[0]), mult_shift[1])
                em.b.vc_cvt(r, r, "f32")
                em.b.vc_mul_vs(r, r, em.reg(f32_bits(scale)))
            emit_chain(cx, em, rest, table, addr, out_addr, m * n, n, regs)

        compute = [(Unit.vector, _quantizer(quants))] if quants else []
        compute += [(Unit.matrix, matrix), (Unit.vector, Streamed(vector))]  # the chain takes rows as they leave
        steps.append(Step(loads, compute, [(out_addr, out.index(index))]))
    return steps
