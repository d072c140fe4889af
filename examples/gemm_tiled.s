# Tiled int8 GEMM on the base 16x16 array: C[64,64] (i32) = A[64,64] (i8) @ W[64,64] (i8).
#
# A is loaded once as four 64x16 k-slices. A hardware loop walks the four 16-column tiles of C:
# the loader fills one W panel (64x16) into one of two buffers, the matrix unit runs preload + mm/mma
# over k into one of two accumulator tiles, the store unit writes the finished tile. Tokens order the
# units; two initial credits per buffer pair let loading, computing and storing overlap.
.equ ACC, 0x1000000
.equ WBUF, 0x10000           # W panels alternate between 0x10000 (bank 1) and 0x20000 (bank 2)
.kernel gemm
.input a: i8[64, 64] @ A
.input w: i8[64, 64] @ W
.output c: i32[64, 64] @ C
    li x3, 64                # A and W row stride in bytes
    li x1, 0
    li x2, A
    loopi 4, a_loaded        # A k-slice j (64 x 16) -> spad j * 1024
    dma.ld x1, x2, x3, 64, 16, i8
    addi x1, x1, 1024
    addi x2, x2, 16
a_loaded:
    sync.push mx, ld         # credits: both W buffers start free
    sync.push mx, ld
    sync.push st, mx         # credits: both accumulator tiles start free
    sync.push st, mx
    li x10, WBUF
    li x11, W
    li x12, C
    li x13, 256              # C row stride (64 x i32)
    li x5, ACC
    loopi 4, tiles_done
    sync.pop mx, ld          # wait for a free W buffer
    dma.ld x10, x11, x3, 64, 16, i8
    sync.push ld, mx
    sync.pop ld, mx          # W panel (and A) are in
    sync.pop st, mx          # wait for a free accumulator tile
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
    sync.push mx, ld         # W buffer free again
    sync.push mx, st         # C tile ready
    sync.pop mx, st
    dma.st x12, x5, x13, 64, 16, i32
    sync.push st, mx         # accumulator tile free again
    addi x11, x11, 16        # next W panel
    addi x12, x12, 64        # next C column block
    xori x10, x10, 0x30000   # swap W buffers
    xori x5, x5, 0x4000      # swap accumulator tiles
tiles_done:
    halt
.endkernel
.data
A: .zero 4096
W: .zero 4096
C: .zero 16384
