`include "isa_pkg.vh"
// The fused matrix -> vector stream: matrix unit (mx.mms) -> stream FIFO ->
// vector unit executing vc.lds. Output rows of the array enter the FIFO as they
// leave the de-skew; from the cycle lds_start pulses, the vector side takes one
// row per cycle as one beat (rows are N wide and the unit LANES wide, N = LANES)
// until ceil(n / LANES) beats, n being the vc.lds word's element count. When a
// row leaves the array while the FIFO holds DEPTH rows, the matrix unit freezes
// (in_ready low: the presented input row is not taken) until the vector side
// has taken one: mx.mms stalls on a full stream (`timing.stream_row_out`).
module stream_path #(
    parameter N = 4,
    parameter LANES = 4,
    parameter DATA_W = 8,
    parameter ACC_W = 32,
    parameter DEPTH = 4
) (
    input                        clk,
    input                        rst,
    input                        w_valid,
    input  [N*DATA_W-1:0]        in_w,
    output                       w_ready,
    input                        in_valid,
    input                        in_first,
    output                       in_ready,
    input  [N*DATA_W-1:0]        in_a,
    output                       out_row_valid,
    input  [`DF_WORD_BITS-1:0]   instr,
    input                        lds_start,
    output                       out_valid,
    output [LANES-1:0]           out_mask,
    output [LANES*ACC_W-1:0]     out_data
);
    localparam COUNT_W = `DF_F_N_W;
    localparam [31:0] I32 = `DF_DTYPE_I32;

    generate
        if (N != LANES) begin : g_rows_are_not_beats
            stream_path_needs_array_size_equal_to_lanes u_error ();
        end
    endgenerate

    wire             row_valid, row_ready, fifo_valid, fifo_ready;
    wire [N*ACC_W-1:0] row, fifo_row;
    wire stall = row_valid && !row_ready;  // a finished row has nowhere to go: the array waits
    assign in_ready = !stall;
    assign out_row_valid = row_valid && row_ready;  // a row leaves the array (into or through the FIFO)
    matrix_unit #(.N(N), .DATA_W(DATA_W), .ACC_W(ACC_W)) u_matrix (
        .clk(clk), .rst(rst), .en(!stall), .w_valid(w_valid), .in_w(in_w), .w_ready(w_ready), .in_valid(in_valid),
        .in_first(in_first), .in_a(in_a), .acc_en(1'b0), .in_acc({N*ACC_W{1'b0}}), .out_valid(row_valid), .out_p(row)
    );
    stream_fifo #(.WIDTH(N * ACC_W), .DEPTH(DEPTH)) u_fifo (
        .clk(clk), .rst(rst), .in_valid(row_valid), .in_ready(row_ready), .in_data(row),
        .out_valid(fifo_valid), .out_ready(fifo_ready), .out_data(fifo_row)
    );

    // vc.lds: beats still to take (loaded from the word's n when it starts)
    wire [COUNT_W-1:0] n = instr[`DF_F_N_LO +: `DF_F_N_W];
    wire [COUNT_W-1:0] beats = (n + LANES - 1) / LANES;
    reg  [COUNT_W-1:0] remaining;
    wire [COUNT_W-1:0] left = lds_start ? beats : remaining;
    assign fifo_ready = left != 0;
    wire taking = fifo_ready && fifo_valid;
    always @(posedge clk) begin
        if (rst) remaining <= {COUNT_W{1'b0}};
        else remaining <= left - taking;
    end

    vector_unit #(.LANES(LANES), .DATA_W(DATA_W), .ACC_W(ACC_W)) u_vector (
        .clk(clk), .rst(rst), .in_valid(taking), .in_mask({LANES{1'b1}}), .instr(instr),
        .reg_dtype(I32[`DF_F_DTYPE_W-1:0]), .rs2({ACC_W{1'b0}}), .rs3({ACC_W{1'b0}}), .in_a(fifo_row),
        .in_b({LANES*ACC_W{1'b0}}), .in_c({LANES*ACC_W{1'b0}}),
        .out_valid(out_valid), .out_mask(out_mask), .out_data(out_data)
    );
endmodule
