# Matrix -> vector streaming: C[64,16] (i32) = relu(A[64,16] @ W[16,16]) without an accumulator round trip.
#
# mx.mms streams each output row to the vector unit as it leaves the array; vc.lds consumes the stream
# while the matmul is still running, so the two units overlap. Twin: mm_stream_unfused.s.
.kernel matmul_relu
.input a: i8[64, 16] @ A
.input w: i8[16, 16] @ W
.output c: i32[64, 16] @ C
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
    mx.mms x1, 64
    vc.lds v1, 1024
    vc.relu v2, v1
    li x5, 0x20000
    vc.st x5, v2
    sync.push vx, st
    sync.pop vx, st
    li x2, C
    li x3, 4096
    dma.st x2, x5, x3, 1, 1024, i32
    halt
.endkernel
.data
A: .zero 1024
W: .zero 256
C: .zero 4096
