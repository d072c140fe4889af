# Matrix -> vector streaming: C[M,N] (i32) = relu(A[M,N] @ W[N,N]) without an accumulator round trip.
#
# mx.mms streams each output row to the vector unit as it leaves the array; vc.lds consumes the stream
# while the matmul is still running, so the two units overlap. Twin: mm_stream_unfused.s.
.equ N, 16                   # tiny: 4
.equ M, 64                   # tiny: 16
.equ WBUF, 0x10000           # tiny: 0x2000
.equ OUT, 0x20000            # tiny: 0x2400
.kernel matmul_relu
.input a: i8[M, N] @ A
.input w: i8[N, N] @ W
.output c: i32[M, N] @ C
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
    mx.mms x1, M
    vc.lds v1, M * N
    vc.relu v2, v1
    li x5, OUT
    vc.st x5, v2
    sync.push vx, st
    sync.pop vx, st
    li x2, C
    li x3, 4 * M * N
    dma.st x2, x5, x3, 1, M * N, i32
    halt
.endkernel
.data
A: .zero M * N
W: .zero N * N
C: .zero 4 * M * N
