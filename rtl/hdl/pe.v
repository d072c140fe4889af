// Weight-stationary MAC processing element: DATA_W x DATA_W -> ACC_W accumulate.
// Activations move right and partial sums move down, each through one register,
// so a value entering PE(r, c) at cycle t reaches PE(r, c+1) / PE(r+1, c) at t+1.
// Weights shift up one PE per cycle while w_load is high (preload). With en low the
// PE holds everything (the matrix unit freezes while the stream FIFO is full).
module pe #(
    parameter DATA_W = 8,
    parameter ACC_W = 32
) (
    input                            clk,
    input                            rst,
    input                            en,
    input                            w_load,
    input      signed [DATA_W-1:0]   w_in,
    output     signed [DATA_W-1:0]   w_out,
    input      signed [DATA_W-1:0]   a_in,
    output reg signed [DATA_W-1:0]   a_out,
    input      signed [ACC_W-1:0]    p_in,
    output reg signed [ACC_W-1:0]    p_out
);
    reg signed [DATA_W-1:0] w;
    assign w_out = w;

    always @(posedge clk) begin
        if (rst) begin
            w <= {DATA_W{1'b0}};
            a_out <= {DATA_W{1'b0}};
            p_out <= {ACC_W{1'b0}};
        end else if (en) begin
            if (w_load) w <= w_in;
            a_out <= a_in;
            p_out <= p_in + a_in * w;  // signed, wraps at ACC_W bits
        end
    end
endmodule
