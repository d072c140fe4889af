`include "isa_pkg.vh"
// The matrix unit with its A-row fetch in front: the address generator and the scratchpad read port that feed the
// array one row per cycle, instead of the harness. `start` (one cycle, with the matmul's instruction word `instr`
// and its register values `rs1`, `rs2`) puts row 0, read at rs1, into the array in that same cycle; row i follows
// in cycle i, `stride` bytes after row i - 1. The stride is the only thing the strided forms change: mx.mm /
// mx.mma step by the row's K elements (`k`: the preloaded tile's rows; A dense), mx.mm.s / mx.mma.s by rs2 (a
// k-slice of a dense rows x D tile read in place). The read port is asynchronous (a row is read in the cycle its
// address is generated), so row i enters the array in the cycle the simulator's `matmul_cycles` has it enter;
// elements k..N-1 of a row are not read (zero: they meet the weights' zero padding). `mem_we` writes N bytes at
// `mem_addr`: how the harness fills the scratchpad. Weights, the accumulate path and the output are the matrix
// unit's.
module matrix_fetch #(
    parameter N = 4,
    parameter DATA_W = 8,
    parameter ACC_W = 32,
    parameter SPAD_ADDR_W = 14
) (
    input                        clk,
    input                        rst,
    input                        w_valid,
    input  [N*DATA_W-1:0]        in_w,
    output                       w_ready,
    input                        mem_we,
    input  [SPAD_ADDR_W-1:0]     mem_addr,
    input  [N*DATA_W-1:0]        mem_wdata,
    input                        start,
    input  [`DF_WORD_BITS-1:0]   instr,
    input  [ACC_W-1:0]           rs1,
    input  [ACC_W-1:0]           rs2,
    input  [`DF_F_ROWS_W-1:0]    k,
    input                        acc_en,
    input  [N*ACC_W-1:0]         in_acc,
    output                       out_valid,
    output [N*ACC_W-1:0]         out_p
);
    localparam ROWS_W = `DF_F_ROWS_W;
    localparam ELEM_BYTES = DATA_W / 8;

    wire [`DF_F_OPCODE_W-1:0] opcode = instr[`DF_F_OPCODE_LO +: `DF_F_OPCODE_W];
    wire [`DF_F_FUNCT_W-1:0]  funct  = instr[`DF_F_FUNCT_LO +: `DF_F_FUNCT_W];
    wire [ROWS_W-1:0]         rows   = instr[`DF_F_ROWS_LO +: ROWS_W];
    wire strided = opcode == `DF_OP_MX_MM_S
        && (funct == `DF_FUNCT_MX_MM_S || funct == `DF_FUNCT_MX_MMA_S);
    wire [SPAD_ADDR_W-1:0] dense = k * ELEM_BYTES;
    wire [SPAD_ADDR_W-1:0] step = strided ? rs2[SPAD_ADDR_W-1:0] : dense;

    reg                    busy;
    reg [SPAD_ADDR_W-1:0]  next;    // address of the next row
    reg [SPAD_ADDR_W-1:0]  stride;  // the running fetch's
    reg [ROWS_W-1:0]       left;    // rows still to fetch after the one entering the array
    reg [ROWS_W-1:0]       width;   // the running fetch's k
    wire [SPAD_ADDR_W-1:0] addr = start ? rs1[SPAD_ADDR_W-1:0] : next;
    wire [ROWS_W-1:0]      count = start ? k : width;

    wire row_valid = start ? rows != 0 : busy;
    wire row_first = start && rows != 0;

    always @(posedge clk) begin
        if (rst) begin
            busy <= 1'b0;
            next <= {SPAD_ADDR_W{1'b0}};
            stride <= {SPAD_ADDR_W{1'b0}};
            left <= {ROWS_W{1'b0}};
            width <= {ROWS_W{1'b0}};
        end else if (start) begin
            busy <= rows > 1;
            next <= addr + step;
            stride <= step;
            left <= rows - 1'b1;
            width <= k;
        end else if (busy) begin
            busy <= left > 1;
            next <= next + stride;
            left <= left - 1'b1;
        end
    end

    reg [DATA_W-1:0] mem [0:(1 << SPAD_ADDR_W) - 1];
    integer b;
    always @(posedge clk) begin
        if (mem_we) begin
            for (b = 0; b < N; b = b + 1) begin
                mem[mem_addr + b[SPAD_ADDR_W-1:0]] <= mem_wdata[b*DATA_W +: DATA_W];
            end
        end
    end

    wire [N*DATA_W-1:0] row_a;
    genvar j;
    generate
        for (j = 0; j < N; j = j + 1) begin : g_read
            wire [SPAD_ADDR_W-1:0] at = addr + j[SPAD_ADDR_W-1:0];
            assign row_a[j*DATA_W +: DATA_W] = (j < count) ? mem[at] : {DATA_W{1'b0}};
        end
    endgenerate

    matrix_unit #(.N(N), .DATA_W(DATA_W), .ACC_W(ACC_W)) u_matrix (
        .clk(clk), .rst(rst), .en(1'b1), .w_valid(w_valid), .in_w(in_w), .w_ready(w_ready), .in_valid(row_valid),
        .in_first(row_first), .in_a(row_a), .acc_en(acc_en), .in_acc(in_acc), .out_valid(out_valid), .out_p(out_p)
    );
endmodule
