# A fused elementwise chain: y = sigmoid(x * 0.5 + 0.25) over 4096 f32 values.
#
# One load, one pass of the vector unit through its registers (vc.* ops stream behind each other),
# one store. Twin: vector_chain_unfused.s runs each op as its own kernel through DRAM.
.kernel scale_shift_sigmoid
.input x: f32[4096] @ X
.output y: f32[4096] @ Y
    li x1, 0
    li x2, X
    li x3, 256
    dma.ld x1, x2, x3, 64, 64, f32
    sync.push ld, vx
    sync.pop ld, vx
    li x5, 0.5
    li x6, 0.25
    vc.ld v1, x1, 4096, f32
    vc.mul.vs v2, v1, x5
    vc.add.vs v3, v2, x6
    vc.sigmoid v4, v3
    li x4, 0x10000
    vc.st x4, v4
    sync.push vx, st
    sync.pop vx, st
    li x2, Y
    dma.st x2, x4, x3, 64, 64, f32
    halt
.endkernel
.data
X: .zero 16384
Y: .zero 16384
