# The unfused twin of vector_chain_fused.s: three kernels (mul, add, sigmoid), each loading its input
# from DRAM, running one memory-to-memory vector op and storing its output back.
.equ E, 4096                 # tiny: 256
.equ ROW, 64                 # elements per DMA row
.kernel mul
.input x: f32[E] @ X
    li x1, 0
    li x2, X
    li x3, 4 * ROW
    dma.ld x1, x2, x3, E / ROW, ROW, f32
    sync.push ld, vx
    sync.pop ld, vx
    li x5, 0.5
    v.mul.vs x1, x1, x5, E, f32
    sync.push vx, st
    sync.pop vx, st
    li x2, T1
    dma.st x2, x1, x3, E / ROW, ROW, f32
    fence
.endkernel
.kernel add
    li x1, 0
    li x2, T1
    li x3, 4 * ROW
    dma.ld x1, x2, x3, E / ROW, ROW, f32
    sync.push ld, vx
    sync.pop ld, vx
    li x5, 0.25
    v.add.vs x1, x1, x5, E, f32
    sync.push vx, st
    sync.pop vx, st
    li x2, T2
    dma.st x2, x1, x3, E / ROW, ROW, f32
    fence
.endkernel
.kernel sigmoid
.output y: f32[E] @ Y
    li x1, 0
    li x2, T2
    li x3, 4 * ROW
    dma.ld x1, x2, x3, E / ROW, ROW, f32
    sync.push ld, vx
    sync.pop ld, vx
    v.sigmoid x1, x1, E, f32
    sync.push vx, st
    sync.pop vx, st
    li x2, Y
    dma.st x2, x1, x3, E / ROW, ROW, f32
    halt
.endkernel
.data
X: .zero 4 * E
T1: .zero 4 * E
T2: .zero 4 * E
Y: .zero 4 * E
