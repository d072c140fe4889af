# Tiled int8 GEMM on the N x N array: C[M,C] (i32) = A[M,K] (i8) @ W[K,C] (i8), K = 4N.
#
# A is loaded once as four M x N k-slices. A hardware loop walks the C / N column tiles of C:
# the loader fills one W panel (K x N) into one of two buffers, the matrix unit runs preload + mm/mma
# over k into one of two accumulator tiles, the store unit writes the finished tile. Tokens order the
# units; two initial credits per buffer pair let loading, computing and storing overlap.
# Sizes and buffers are .equ parameters; `# tiny:` gives the value examples/tiny/ uses (variants.py).
.equ N, 16                   # tiny: 4
.equ M, 64                   # tiny: 16
.equ K, 4 * N
.equ C, 64                   # tiny: 16
.equ ACC, 0x1000000
.equ WBUF, 0x10000           # tiny: 0x2000
.equ WSWAP, 0x30000          # tiny: 0x400
.equ ASWAP, 0x4000           # tiny: 0x800
# base: W panels alternate between 0x10000 (bank 1) and 0x20000 (bank 2); accumulator tiles 16 KiB apart
.kernel gemm
.input a: i8[M, K] @ A
.input w: i8[K, C] @ W
.output c: i32[M, C] @ C_OUT
    li x3, K                 # A row stride in bytes
    li x4, C                 # W row stride
    li x1, 0
    li x2, A
    loopi 4, a_loaded        # A k-slice j (M x N) -> spad j * M * N
    dma.ld x1, x2, x3, M, N, i8
    addi x1, x1, M * N
    addi x2, x2, N
a_loaded:
    sync.push mx, ld         # credits: both W buffers start free
    sync.push mx, ld
    sync.push st, mx         # credits: both accumulator tiles start free
    sync.push st, mx
    li x10, WBUF
    li x11, W
    li x12, C_OUT
    li x13, 4 * C            # C row stride (i32)
    li x5, ACC
    loopi C / N, tiles_done
    sync.pop mx, ld          # wait for a free W buffer
    dma.ld x10, x11, x4, K, N, i8
    sync.push ld, mx
    sync.pop ld, mx          # W panel (and A) are in
    sync.pop st, mx          # wait for a free accumulator tile
    li x7, 0
    mx.preload x10, N, N, i8
    mx.mm x5, x7, M
    addi x8, x10, N * N
    li x7, M * N
    mx.preload x8, N, N, i8
    mx.mma x5, x7, M
    addi x8, x10, 2 * N * N
    li x7, 2 * M * N
    mx.preload x8, N, N, i8
    mx.mma x5, x7, M
    addi x8, x10, 3 * N * N
    li x7, 3 * M * N
    mx.preload x8, N, N, i8
    mx.mma x5, x7, M
    sync.push mx, ld         # W buffer free again
    sync.push mx, st         # C tile ready
    sync.pop mx, st
    dma.st x12, x5, x13, M, N, i32
    sync.push st, mx         # accumulator tile free again
    addi x11, x11, N         # next W panel
    addi x12, x12, 4 * N     # next C column block
    xori x10, x10, WSWAP     # swap W buffers
    xori x5, x5, ASWAP       # swap accumulator tiles
tiles_done:
    halt
.endkernel
.data
A: .zero M * K
W: .zero K * C
C_OUT: .zero 4 * M * C
