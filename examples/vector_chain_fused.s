# A fused elementwise chain: y = sigmoid(x * 0.5 + 0.25) over E f32 values (E fits one vector register).
#
# One load, one pass of the vector unit through its registers (vc.* ops stream behind each other),
# one store. Twin: vector_chain_unfused.s runs each op as its own kernel through DRAM.
.equ E, 4096                 # tiny: 256
.equ ROW, 64                 # elements per DMA row
.equ OUT, 0x10000            # tiny: 0x2000
.kernel scale_shift_sigmoid
.input x: f32[E] @ X
.output y: f32[E] @ Y
    li x1, 0
    li x2, X
    li x3, 4 * ROW
    dma.ld x1, x2, x3, E / ROW, ROW, f32
    sync.push ld, vx
    sync.pop ld, vx
    li x5, 0.5
    li x6, 0.25
    vc.ld v1, x1, E, f32
    vc.mul.vs v2, v1, x5
    vc.add.vs v3, v2, x6
    vc.sigmoid v4, v3
    li x4, OUT
    vc.st x4, v4
    sync.push vx, st
    sync.pop vx, st
    li x2, Y
    dma.st x2, x4, x3, E / ROW, ROW, f32
    halt
.endkernel
.data
X: .zero 4 * E
Y: .zero 4 * E
