# The unfused twin of gemm_bias_relu_fused.s: two kernels, as a framework without fusion runs them.
# Kernel 1 writes the int32 GEMM result to DRAM; kernel 2 reads it back and applies bias, relu and
# requantization on the vector unit, then writes the int8 result.
.equ ACC, 0x1000000
.equ WBUF, 0x10000
.kernel gemm
.input a: i8[64, 64] @ A
.input w: i8[64, 64] @ W
.output t: i32[64, 64] @ T
    li x3, 64
    li x1, 0
    li x2, A
    loopi 4, a_loaded
    dma.ld x1, x2, x3, 64, 16, i8
    addi x1, x1, 1024
    addi x2, x2, 16
a_loaded:
    sync.push mx, ld
    sync.push mx, ld
    sync.push st, mx
    sync.push st, mx
    li x10, WBUF
    li x11, W
    li x12, T
    li x13, 256
    li x5, ACC
    loopi 4, tiles_done
    sync.pop mx, ld
    dma.ld x10, x11, x3, 64, 16, i8
    sync.push ld, mx
    sync.pop ld, mx
    sync.pop st, mx
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
    sync.push mx, st
    sync.pop mx, st
    dma.st x12, x5, x13, 64, 16, i32
    sync.push st, mx
    addi x11, x11, 16
    addi x12, x12, 64
    xori x10, x10, 0x30000
    xori x5, x5, 0x4000
tiles_done:
    fence                    # kernel boundary: the result is in DRAM
.endkernel
.kernel bias_relu_requant
.input bias: i32[64] @ B
.output c: i8[64, 64] @ C
    li x1, 0
    li x2, T
    li x3, 256
    dma.ld x1, x2, x3, 64, 64, i32
    li x4, 0x10000
    li x2, B
    li x3, 256
    dma.ld x4, x2, x3, 1, 64, i32
    sync.push ld, vx
    sync.pop ld, vx
    v.add.vr x1, x1, x4, 4096, 64, i32
    v.relu x1, x1, 4096, i32
    li x5, 3
    li x6, 0x20000
    v.rqnt x6, x1, x5, 10, 4096
    sync.push vx, st
    sync.pop vx, st
    li x2, C
    li x3, 64
    dma.st x2, x6, x3, 64, 64, i8
    halt
.endkernel
.data
A: .zero 4096
W: .zero 4096
B: .zero 256
T: .zero 16384
C: .zero 4096
