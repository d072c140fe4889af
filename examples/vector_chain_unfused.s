# The unfused twin of vector_chain_fused.s: three kernels (mul, add, sigmoid), each loading its input
# from DRAM, running one memory-to-memory vector op and storing its output back.
.kernel mul
.input x: f32[4096] @ X
    li x1, 0
    li x2, X
    li x3, 256
    dma.ld x1, x2, x3, 64, 64, f32
    sync.push ld, vx
    sync.pop ld, vx
    li x5, 0.5
    v.mul.vs x1, x1, x5, 4096, f32
    sync.push vx, st
    sync.pop vx, st
    li x2, T1
    dma.st x2, x1, x3, 64, 64, f32
    fence
.endkernel
.kernel add
    li x1, 0
    li x2, T1
    li x3, 256
    dma.ld x1, x2, x3, 64, 64, f32
    sync.push ld, vx
    sync.pop ld, vx
    li x5, 0.25
    v.add.vs x1, x1, x5, 4096, f32
    sync.push vx, st
    sync.pop vx, st
    li x2, T2
    dma.st x2, x1, x3, 64, 64, f32
    fence
.endkernel
.kernel sigmoid
.output y: f32[4096] @ Y
    li x1, 0
    li x2, T2
    li x3, 256
    dma.ld x1, x2, x3, 64, 64, f32
    sync.push ld, vx
    sync.pop ld, vx
    v.sigmoid x1, x1, 4096, f32
    sync.push vx, st
    sync.pop vx, st
    li x2, Y
    dma.st x2, x1, x3, 64, 64, f32
    halt
.endkernel
.data
X: .zero 16384
T1: .zero 16384
T2: .zero 16384
Y: .zero 16384
