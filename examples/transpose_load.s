# Transposing load: B[64,16] = A[16,64]^T in one dma.ldt (the transpose happens in flight).
# Twin: transpose_by_columns.s gathers each column with its own strided DMA.
.kernel transpose
.input a: i8[16, 64] @ A
.output b: i8[64, 16] @ B
    li x1, 0
    li x2, A
    li x3, 64
    dma.ldt x1, x2, x3, 16, 64, i8
    sync.push ld, st
    sync.pop ld, st
    li x2, B
    li x4, 16
    dma.st x2, x1, x4, 64, 16, i8
    halt
.endkernel
.data
A: .zero 1024
B: .zero 1024
