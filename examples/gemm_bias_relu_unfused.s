# The unfused twin of gemm_bias_relu_fused.s: two kernels, as a framework without fusion runs them.
# Kernel 1 writes the int32 GEMM result to DRAM; kernel 2 reads it back and applies bias, relu and
# requantization on the vector unit, then writes the int8 result.
.equ N, 16                   # tiny: 4
.equ M, 64                   # tiny: 16
.equ K, 4 * N
.equ C, 64                   # tiny: 16
.equ ACC, 0x1000000
.equ WBUF, 0x10000           # tiny: 0x2000
.equ WSWAP, 0x30000          # tiny: 0x400
.equ ASWAP, 0x4000           # tiny: 0x800
.equ VBIAS, 0x10000          # tiny: 0x2000
.equ VOUT, 0x20000           # tiny: 0x3000
.kernel gemm
.input a: i8[M, K] @ A
.input w: i8[K, C] @ W
.output t: i32[M, C] @ T
    li x3, K
    li x4, C
    li x1, 0
    li x2, A
    loopi 4, a_loaded
    dma.ld x1, x2, x3, M, N, i8
    addi x1, x1, M * N
    addi x2, x2, N
a_loaded:
    sync.push mx, ld
    sync.push mx, ld
    sync.push st, mx
    sync.push st, mx
    li x10, WBUF
    li x11, W
    li x12, T
    li x13, 4 * C
    li x5, ACC
    loopi C / N, tiles_done
    sync.pop mx, ld
    dma.ld x10, x11, x4, K, N, i8
    sync.push ld, mx
    sync.pop ld, mx
    sync.pop st, mx
    li x7, 0
    mx.preload x10, N, N, i8
    mx.mm x5, x7, M
    addi x8, x10, N * N
    li x7, M * N
    mx.preload x8, N, N, i8
    mx.mma x5, x7, M
    addi x8, x10, 2 * N * N
    li x7, 2 * M * N
    mx.preload x8, N, N, i8
    mx.mma x5, x7, M
    addi x8, x10, 3 * N * N
    li x7, 3 * M * N
    mx.preload x8, N, N, i8
    mx.mma x5, x7, M
    sync.push mx, ld
    sync.push mx, st
    sync.pop mx, st
    dma.st x12, x5, x13, M, N, i32
    sync.push st, mx
    addi x11, x11, N
    addi x12, x12, 4 * N
    xori x10, x10, WSWAP
    xori x5, x5, ASWAP
tiles_done:
    fence                    # kernel boundary: the result is in DRAM
.endkernel
.kernel bias_relu_requant
.input bias: i32[C] @ B
.output c: i8[M, C] @ C_OUT
    li x1, 0
    li x2, T
    li x3, 4 * C
    dma.ld x1, x2, x3, M, C, i32
    li x4, VBIAS
    li x2, B
    dma.ld x4, x2, x3, 1, C, i32
    sync.push ld, vx
    sync.pop ld, vx
    v.add.vr x1, x1, x4, M * C, C, i32
    v.relu x1, x1, M * C, i32
    li x5, 3
    li x6, VOUT
    v.rqnt x6, x1, x5, 10, M * C
    sync.push vx, st
    sync.pop vx, st
    li x2, C_OUT
    li x3, C
    dma.st x2, x6, x3, M, C, i8
    halt
.endkernel
.data
A: .zero M * K
W: .zero K * C
B: .zero 4 * C
T: .zero 4 * M * C
C_OUT: .zero M * C
