// Weight-stationary MAC processing element: DATA_W x DATA_W -> ACC_W accumulate,
// with double-buffered weights. Activations move right and partial sums move down,
// each through one register, so a value entering PE(r, c) at cycle t reaches
// PE(r, c+1) / PE(r+1, c) at t+1. The next weights shift down the column's shadow
// chain (w_shift, from the PE above) while the PE keeps computing with its active
// weight; the switch token s_in, travelling with the first activation of a matmul,
// makes the PE use the shadow weight for that activation and keep it from then on.
// With en low the compute side holds (the matrix unit freezes while the stream FIFO
// is full); the shadow chain does not.
module pe #(
    parameter DATA_W = 8,
    parameter ACC_W = 32
) (
    input                            clk,
    input                            rst,
    input                            en,
    input                            w_shift,
    input      signed [DATA_W-1:0]   w_in,
    output     signed [DATA_W-1:0]   w_out,
    input                            s_in,
    output reg                       s_out,
    input      signed [DATA_W-1:0]   a_in,
    output reg signed [DATA_W-1:0]   a_out,
    input      signed [ACC_W-1:0]    p_in,
    output reg signed [ACC_W-1:0]    p_out
);
    reg signed [DATA_W-1:0] w;       // active weight
    reg signed [DATA_W-1:0] shadow;  // next weight, shifting in
    assign w_out = shadow;
    wire signed [DATA_W-1:0] w_use = s_in ? shadow : w;

    always @(posedge clk) begin
        if (rst) begin
            w <= {DATA_W{1'b0}};
            shadow <= {DATA_W{1'b0}};
            s_out <= 1'b0;
            a_out <= {DATA_W{1'b0}};
            p_out <= {ACC_W{1'b0}};
        end else begin
            if (w_shift) shadow <= w_in;
            if (en) begin
                if (s_in) w <= shadow;
                s_out <= s_in;
                a_out <= a_in;
                p_out <= p_in + a_in * w_use;  // signed, wraps at ACC_W bits
            end
        end
    end
endmodule
