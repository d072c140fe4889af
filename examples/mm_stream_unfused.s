# The unfused twin of mm_stream_fused.s: a matmul kernel writes int32 C to DRAM, a relu kernel reads it back.
.equ ACC, 0x1000000
.kernel matmul
.input a: i8[64, 16] @ A
.input w: i8[16, 16] @ W
    li x1, 0
    li x2, A
    li x3, 1024
    dma.ld x1, x2, x3, 1, 1024, i8
    li x4, 0x10000
    li x2, W
    dma.ld x4, x2, x3, 1, 256, i8
    sync.push ld, mx
    sync.pop ld, mx
    mx.preload x4, 16, 16, i8
    li x5, ACC
    mx.mm x5, x1, 64
    sync.push mx, st
    sync.pop mx, st
    li x2, T
    li x3, 4096
    dma.st x2, x5, x3, 1, 1024, i32
    fence
.endkernel
.kernel relu
.output c: i32[64, 16] @ C
    li x1, 0x20000
    li x2, T
    li x3, 4096
    dma.ld x1, x2, x3, 1, 1024, i32
    sync.push ld, vx
    sync.pop ld, vx
    v.relu x1, x1, 1024, i32
    sync.push vx, st
    sync.pop vx, st
    li x2, C
    dma.st x2, x1, x3, 1, 1024, i32
    halt
.endkernel
.data
A: .zero 1024
W: .zero 256
T: .zero 4096
C: .zero 4096
