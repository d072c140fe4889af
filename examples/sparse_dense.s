# The dense twin of sparse_zero_skip.s: C[64,16] (i32) = A[64,64] @ W[64,16], loading every W tile
# and running every matmul whether or not the A slice is all zero.
.equ ACC, 0x1000000
.kernel sparse_gemm
.input a: i8[64, 64] @ A
.input w: i8[64, 16] @ W
.output c: i32[64, 16] @ C
    li x3, 64
    li x1, 0
    li x2, A
    loopi 4, a_loaded
    dma.ld x1, x2, x3, 64, 16, i8
    addi x1, x1, 1024
    addi x2, x2, 16
a_loaded:
    li x5, ACC
    v.sub x5, x5, x5, 1024, i32  # clear the accumulator tile
    sync.push vx, mx
    sync.pop vx, mx
    li x6, 16                    # W row stride
    li x1, -1024                 # A slice, W tile in spad, W tile in DRAM: advanced first thing each pass
    li x4, 0x10000 - 256
    li x2, W - 256
    loopi 4, next
    addi x1, x1, 1024
    addi x4, x4, 256
    addi x2, x2, 256
    dma.ld x4, x2, x6, 16, 16, i8
    sync.push ld, mx
    sync.pop ld, mx
    mx.preload x4, 16, 16, i8
    mx.mma x5, x1, 64
next:
    sync.push mx, st
    sync.pop mx, st
    li x2, C
    dma.st x2, x5, x3, 64, 16, i32
    halt
.endkernel
.data
A: .zero 4096
W: .zero 1024
C: .zero 4096
