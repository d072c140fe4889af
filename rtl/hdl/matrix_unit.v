// The matrix unit: systolic array plus the input skew and output de-skew.
// Preload: weight rows 0..N-1 on in_w with w_valid high, one per cycle; w_ready
// rises N cycles after the first row. Matmul: activation row i on in_a at cycle i
// (in_valid high); output row i is on out_p with out_valid at cycle i + 2N - 1.
// With acc_en high (mx.mma) the accumulator row presented on in_acc in that
// cycle is added to it (i32, wrapping): the accumulator's read-modify-write.
// With en low the whole unit (skew, array, de-skew, valid) holds for the cycle:
// inputs are not taken and the output row stays, so later rows slip by one.
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
    input  [N*DATA_W-1:0]   in_a,
    input                   acc_en,
    input  [N*ACC_W-1:0]    in_acc,
    output                  out_valid,
    output [N*ACC_W-1:0]    out_p
);
    localparam COUNT_W = $clog2(N + 1);

    wire [N*DATA_W-1:0] skewed;
    wire [N*ACC_W-1:0]  bottom;
    reg  [COUNT_W-1:0]  w_rows;

    // weights are usable once N consecutive rows have shifted in
    always @(posedge clk) begin
        if (rst) begin
            w_rows <= {COUNT_W{1'b0}};
            w_ready <= 1'b0;
        end else if (w_valid) begin
            w_rows <= (w_rows == N) ? 1 : w_rows + 1'b1;
            w_ready <= (w_rows == N - 1);
        end
    end

    genvar k;
    generate
        for (k = 0; k < N; k = k + 1) begin : g_skew
            delay_line #(.WIDTH(DATA_W), .DEPTH(k)) u_skew (
                .clk(clk), .rst(rst), .en(en),
                .d(in_valid ? in_a[k*DATA_W +: DATA_W] : {DATA_W{1'b0}}),
                .q(skewed[k*DATA_W +: DATA_W])
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
        .clk(clk), .rst(rst), .en(en), .w_load(w_valid), .in_w(in_w), .in_a(skewed), .out_p(bottom)
    );

    delay_line #(.WIDTH(1), .DEPTH(2 * N - 1)) u_valid (
        .clk(clk), .rst(rst), .en(en), .d(in_valid), .q(out_valid)
    );
endmodule
