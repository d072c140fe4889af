// The matrix unit: systolic array plus the input skew and output de-skew, with
// double-buffered weights. Preload: N weight rows on in_w with w_valid high, one
// per cycle, the last row (N-1) first; they shift into the array's shadow weights
// while it computes, and w_ready rises N cycles after the first row. Matmul:
// activation row i on in_a at cycle i (in_valid high), in_first high with row 0;
// output row i is on out_p with out_valid at cycle i + 2N - 1. A matmul's row 0
// switches the array to the weights preloaded since the last switch, if any
// (its switch token travels with it, so rows still in flight keep the old
// weights): the next matmul may enter the cycle after the previous one's last
// row and N cycles after its preload started, and a preload may start in the
// cycle the matmul switching to the previous weights starts.
// With acc_en high (mx.mma) the accumulator row presented on in_acc in that
// cycle is added to out_p (i32, wrapping): the accumulator's read-modify-write.
// With en low the compute side (skew, array, de-skew, valid) holds for the
// cycle: inputs are not taken and the output row stays, so later rows slip by
// one. The weight path keeps shifting.
module matrix_unit #(
    parameter N = 4,
    parameter DATA_W = 8,
    parameter ACC_W = 32
) (
    input                   clk,
    input                   rst,
    input                   en,
    input                   w_valid,
    input  [N*DATA_W-1:0]   in_w,
    output reg              w_ready,
    input                   in_valid,
    input                   in_first,
    input  [N*DATA_W-1:0]   in_a,
    input                   acc_en,
    input  [N*ACC_W-1:0]    in_acc,
    output                  out_valid,
    output [N*ACC_W-1:0]    out_p
);
    localparam COUNT_W = $clog2(N + 1);

    wire [N*DATA_W-1:0] skewed;
    wire [N-1:0]        tokens;
    wire [N*ACC_W-1:0]  bottom;
    reg  [COUNT_W-1:0]  w_rows;  // rows of the current preload taken (N: a whole one)
    reg                 fresh;   // weights were preloaded since the last switch
    wire [COUNT_W-1:0]  w_index = (w_rows == N) ? {COUNT_W{1'b0}} : w_rows;
    wire                w_start = w_valid && w_index == 0;
    wire                switch = in_valid && in_first && fresh;

    always @(posedge clk) begin
        if (rst) begin
            w_rows <= {COUNT_W{1'b0}};
            w_ready <= 1'b0;
            fresh <= 1'b0;
        end else begin
            if (w_valid) begin
                w_rows <= w_index + 1'b1;
                w_ready <= (w_index == N - 1);
            end
            if (w_start) fresh <= 1'b1;  // a new preload: the next matmul switches to it
            else if (switch && en) fresh <= 1'b0;
        end
    end

    genvar k;
    generate
        for (k = 0; k < N; k = k + 1) begin : g_skew
            delay_line #(.WIDTH(DATA_W + 1), .DEPTH(k)) u_skew (
                .clk(clk), .rst(rst), .en(en),
                .d(in_valid ? {switch, in_a[k*DATA_W +: DATA_W]} : {(DATA_W + 1){1'b0}}),
                .q({tokens[k], skewed[k*DATA_W +: DATA_W]})
            );
            wire [ACC_W-1:0] product;
            delay_line #(.WIDTH(ACC_W), .DEPTH(N - 1 - k)) u_deskew (
                .clk(clk), .rst(rst), .en(en),
                .d(bottom[k*ACC_W +: ACC_W]),
                .q(product)
            );
            assign out_p[k*ACC_W +: ACC_W] = product + (acc_en ? in_acc[k*ACC_W +: ACC_W] : {ACC_W{1'b0}});
        end
    endgenerate

    systolic_array #(.N(N), .DATA_W(DATA_W), .ACC_W(ACC_W)) u_array (
        .clk(clk), .rst(rst), .en(en), .w_load(w_valid), .w_index(w_index), .in_w(in_w), .in_s(tokens),
        .in_a(skewed), .out_p(bottom)
    );

    delay_line #(.WIDTH(1), .DEPTH(2 * N - 1)) u_valid (
        .clk(clk), .rst(rst), .en(en), .d(in_valid), .q(out_valid)
    );
endmodule
