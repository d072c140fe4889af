# The dense twin of sparse_zero_skip.s: C[M,N] (i32) = A[M,K] @ W[K,N], K = 4N, loading every W tile
# and running every matmul whether or not the A slice is all zero.
.equ N, 16                   # tiny: 4
.equ M, 64                   # tiny: 16
.equ K, 4 * N
.equ WBUF, 0x10000           # tiny: 0x2000
.equ ACC, 0x1000000
.kernel sparse_gemm
.input a: i8[M, K] @ A
.input w: i8[K, N] @ W
.output c: i32[M, N] @ C
    li x3, K                 # A row stride (and C's: K = 4N bytes of i32)
    li x1, 0
    li x2, A
    loopi 4, a_loaded
    dma.ld x1, x2, x3, M, N, i8
    addi x1, x1, M * N
    addi x2, x2, N
a_loaded:
    li x5, ACC
    v.sub x5, x5, x5, M * N, i32  # clear the accumulator tile
    sync.push vx, mx
    sync.pop vx, mx
    li x6, N                     # W row stride
    li x1, -(M * N)              # A slice, W tile in spad, W tile in DRAM: advanced first thing each pass
    li x4, WBUF - N * N
    li x2, W - N * N
    loopi 4, next
    addi x1, x1, M * N
    addi x4, x4, N * N
    addi x2, x2, N * N
    dma.ld x4, x2, x6, N, N, i8
    sync.push ld, mx
    sync.pop ld, mx
    mx.preload x4, N, N, i8
    mx.mma x5, x1, M
next:
    sync.push mx, st
    sync.pop mx, st
    li x2, C
    dma.st x2, x5, x3, M, N, i32
    halt
.endkernel
.data
A: .zero M * K
W: .zero K * N
C: .zero 4 * M * N
