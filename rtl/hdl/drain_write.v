`include "isa_pkg.vh"
// The drain epilogue with its write side: the address generator and the scratchpad write port its rows leave
// through, instead of the harness. `start` (one cycle, with the drain's instruction word `instr` and its register
// values `rd`: the output's local address, `rs2`: a strided form's row stride) comes with row 0 of the drain
// entering the epilogue; row i leaves it LAT cycles after it entered and is written in that cycle at rd + i *
// stride. The stride is the only thing the strided form changes: mx.drain steps by the row's size (`cols` elements
// of the output type from the ep.cfg word `cfg`: the output dense), mx.drain.s by rs2 (a column panel written in
// place in a dense rows x D tile). One row a cycle either way, so the drain's timing is the epilogue's. The write
// port: `wr_addr` (the row's first byte), `wr_mask` (column c written, at wr_addr + c * elem bytes: the first
// cols columns, never the bytes between rows) and `wr_data` (column c's element in its low bits: i8 one byte,
// i32 four).
module drain_write #(
    parameter N = 4,
    parameter DATA_W = 8,
    parameter ACC_W = 32
) (
    input                       clk,
    input                       rst,
    input  [`DF_WORD_BITS-1:0]  cfg,
    input  [ACC_W-1:0]          scale,
    input  [N*ACC_W-1:0]        in_bias,
    input  [N*ACC_W-1:0]        in_mult,
    input  [N*ACC_W-1:0]        in_shift,
    input                       start,
    input  [`DF_WORD_BITS-1:0]  instr,
    input  [ACC_W-1:0]          rd,
    input  [ACC_W-1:0]          rs2,
    input                       in_valid,
    input  [N*ACC_W-1:0]        in_acc,
    input  [N*ACC_W-1:0]        in_res,
    output                      out_valid,
    output [N*ACC_W-1:0]        out_data,
    output                      wr_en,
    output [ACC_W-1:0]          wr_addr,
    output [N-1:0]              wr_mask,
    output [N*ACC_W-1:0]        wr_data
);
    localparam COLS_W = `DF_F_COLS_W;

    wire [`DF_F_OPCODE_W-1:0] opcode = instr[`DF_F_OPCODE_LO +: `DF_F_OPCODE_W];
    wire [`DF_F_FUNCT_W-1:0]  funct  = instr[`DF_F_FUNCT_LO +: `DF_F_FUNCT_W];
    wire [COLS_W-1:0]         cols   = instr[`DF_F_COLS_LO +: COLS_W];
    wire [`DF_F_DTYPE_W-1:0]  dtype  = cfg[`DF_F_DTYPE_LO +: `DF_F_DTYPE_W];
    wire strided = opcode == `DF_OP_MX_DRAIN_S && funct == `DF_FUNCT_MX_DRAIN_S;
    wire [ACC_W-1:0] elem = (dtype == `DF_DTYPE_I8) ? DATA_W / 8 : ACC_W / 8;
    wire [ACC_W-1:0] dense = cols * elem;

    reg [ACC_W-1:0]  next;    // address of the next row to leave the epilogue
    reg [ACC_W-1:0]  stride;  // the running drain's
    reg [COLS_W-1:0] width;   // the running drain's cols

    always @(posedge clk) begin
        if (rst) begin
            next <= {ACC_W{1'b0}};
            stride <= {ACC_W{1'b0}};
            width <= {COLS_W{1'b0}};
        end else if (start) begin
            next <= rd;
            stride <= strided ? rs2 : dense;
            width <= cols;
        end else if (out_valid) begin
            next <= next + stride;
        end
    end

    epilogue #(.N(N), .DATA_W(DATA_W), .ACC_W(ACC_W)) u_epilogue (
        .clk(clk), .rst(rst), .cfg(cfg), .scale(scale), .in_valid(in_valid), .in_acc(in_acc), .in_bias(in_bias),
        .in_res(in_res), .in_mult(in_mult), .in_shift(in_shift), .out_valid(out_valid), .out_data(out_data)
    );

    assign wr_en = out_valid;
    assign wr_addr = next;
    genvar c;
    generate
        for (c = 0; c < N; c = c + 1) begin : g_col
            assign wr_mask[c] = out_valid && c < width;
            assign wr_data[c*ACC_W +: ACC_W] = wr_mask[c]
                ? ((dtype == `DF_DTYPE_I8) ? {{(ACC_W - DATA_W){1'b0}}, out_data[c*ACC_W +: DATA_W]}
                                           : out_data[c*ACC_W +: ACC_W])
                : {ACC_W{1'b0}};
        end
    endgenerate
endmodule
