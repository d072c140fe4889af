# The unfused twin of mm_stream_fused.s: a matmul kernel writes int32 C to DRAM, a relu kernel reads it back.
.equ N, 16                   # tiny: 4
.equ M, 64                   # tiny: 16
.equ WBUF, 0x10000           # tiny: 0x2000
.equ VBUF, 0x20000           # tiny: 0x2400
.equ ACC, 0x1000000
.kernel matmul
.input a: i8[M, N] @ A
.input w: i8[N, N] @ W
    li x1, 0
    li x2, A
    li x3, M * N
    dma.ld x1, x2, x3, 1, M * N, i8
    li x4, WBUF
    li x2, W
    dma.ld x4, x2, x3, 1, N * N, i8
    sync.push ld, mx
    sync.pop ld, mx
    mx.preload x4, N, N, i8
    li x5, ACC
    mx.mm x5, x1, M
    sync.push mx, st
    sync.pop mx, st
    li x2, T
    li x3, 4 * M * N
    dma.st x2, x5, x3, 1, M * N, i32
    fence
.endkernel
.kernel relu
.output c: i32[M, N] @ C
    li x1, VBUF
    li x2, T
    li x3, 4 * M * N
    dma.ld x1, x2, x3, 1, M * N, i32
    sync.push ld, vx
    sync.pop ld, vx
    v.relu x1, x1, M * N, i32
    sync.push vx, st
    sync.pop vx, st
    li x2, C
    dma.st x2, x1, x3, 1, M * N, i32
    halt
.endkernel
.data
A: .zero M * N
W: .zero N * N
T: .zero 4 * M * N
C: .zero 4 * M * N
