# The branch-chain twin of dispatch_table.s: the selector is compared with each case in turn.
.kernel select_op
.input sel: i32[1] @ S
.input x: i8[256] @ X
.output y: i8[256] @ Y
    li x1, 0
    li x2, X
    li x3, 256
    dma.ld x1, x2, x3, 1, 256, i8
    sync.push ld, vx
    sync.pop ld, vx
    li x4, S
    lw x5, 0(x4)
    li x6, 1024
    beq x5, x0, case_relu
    li x7, 1
    beq x5, x7, case_neg
    li x7, 2
    beq x5, x7, case_abs
    li x7, 3
    beq x5, x7, case_copy
    jal x0, done
case_relu:
    v.relu x6, x1, 256, i8
    jal x0, store
case_neg:
    v.neg x6, x1, 256, i8
    jal x0, store
case_abs:
    v.abs x6, x1, 256, i8
    jal x0, store
case_copy:
    v.copy x6, x1, 256, i8
store:
    sync.push vx, st
    sync.pop vx, st
    li x2, Y
    dma.st x2, x6, x3, 1, 256, i8
done:
    halt
.endkernel
.data
S: .zero 4
X: .zero 256
Y: .zero 256
