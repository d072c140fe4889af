# GEMM with a fused epilogue: C[64,64] (i8) = requant(relu(A @ W + bias), mult 3, shift 10).
#
# Same tiling as gemm_tiled.s, but each finished accumulator tile is drained through the matrix
# unit's epilogue (bias -> relu -> requantize) straight into the scratchpad as int8, so only the
# final int8 tile travels to DRAM. Twin: gemm_bias_relu_unfused.s.
.equ ACC, 0x1000000
.equ WBUF, 0x10000           # W panels alternate between banks 1 and 2
.equ OUTBUF, 0x30000         # int8 output tiles alternate between 0x30000 and 0x30400 (bank 3)
.equ BIAS, 0x3f000
.kernel gemm_bias_relu
.input a: i8[64, 64] @ A
.input w: i8[64, 64] @ W
.input bias: i32[64] @ B
.output c: i8[64, 64] @ C
    li x3, 64
    li x1, 0
    li x2, A
    loopi 4, a_loaded
    dma.ld x1, x2, x3, 64, 16, i8
    addi x1, x1, 1024
    addi x2, x2, 16
a_loaded:
    li x14, BIAS
    li x2, B
    li x4, 256
    dma.ld x14, x2, x4, 1, 64, i32
    sync.push mx, ld
    sync.push mx, ld
    sync.push st, mx         # credits: both output tiles start free
    sync.push st, mx
    li x10, WBUF
    li x11, W
    li x12, C
    li x15, 3                # requantization multiplier
    li x16, OUTBUF
    li x5, ACC
    loopi 4, tiles_done
    sync.pop mx, ld
    dma.ld x10, x11, x3, 64, 16, i8
    sync.push ld, mx
    sync.pop ld, mx
    li x7, 0
    mx.preload x10, 16, 16, i8
    mx.mm x5, x7, 64
    addi x8, x10, 256
    li x7, 1024
    mx.preload x8, 16, 16, i8
    mx.mma x5, x7, 64
    addi x8, x10, 512
    li x7, 2048
    mx.preload x8, 16, 16, i8
    mx.mma x5, x7, 64
    addi x8, x10, 768
    li x7, 3072
    mx.preload x8, 16, 16, i8
    mx.mma x5, x7, 64
    sync.push mx, ld
    sync.pop st, mx          # wait for a free output tile
    ep.cfg x14, x0, x15, 10, relu, bias, i8
    mx.drain x16, x5, 64, 16
    sync.push mx, st
    sync.pop mx, st
    dma.st x12, x16, x3, 64, 16, i8
    sync.push st, mx
    addi x11, x11, 16
    addi x12, x12, 16
    addi x14, x14, 64        # bias of the next 16 columns
    xori x10, x10, 0x30000
    xori x16, x16, 0x400
tiles_done:
    halt
.endkernel
.data
A: .zero 4096
W: .zero 4096
B: .zero 256
C: .zero 4096
