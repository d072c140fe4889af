# The twin of transpose_load.s: column j of A (16 elements, DRAM stride 64) becomes row j of B,
# one strided DMA per column, 16 one-byte rows each.
.kernel transpose
.input a: i8[16, 64] @ A
.output b: i8[64, 16] @ B
    li x1, 0
    li x2, A
    li x3, 64
    loopi 64, columns_done
    dma.ld x1, x2, x3, 16, 1, i8
    addi x1, x1, 16
    addi x2, x2, 1
columns_done:
    sync.push ld, st
    sync.pop ld, st
    li x1, 0
    li x2, B
    li x4, 16
    dma.st x2, x1, x4, 64, 16, i8
    halt
.endkernel
.data
A: .zero 1024
B: .zero 1024
