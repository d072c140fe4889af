// N x N grid of PEs built with a generate loop. Row r receives activation
// element r on the left; column c's partial sum leaves at the bottom.
// Links are per-PE unpacked nets (a wide flattened bus is 25-500x slower in Icarus).
module systolic_array #(
    parameter N = 4,
    parameter DATA_W = 8,
    parameter ACC_W = 32
) (
    input                   clk,
    input                   rst,
    input                   en,     // low: every PE holds (a stalled array)
    input                   w_load,
    input  [N*DATA_W-1:0]   in_w,   // weight row shifted into the bottom PE row
    input  [N*DATA_W-1:0]   in_a,   // skewed activations, element r for PE row r
    output [N*ACC_W-1:0]    out_p   // skewed partial sums leaving the bottom row
);
    wire signed [DATA_W-1:0] a_link [0:N*(N+1)-1];  // a_link[r*(N+1)+c]: into PE(r, c)
    wire signed [ACC_W-1:0]  p_link [0:(N+1)*N-1];  // p_link[r*N+c]: into PE(r, c) from above
    wire signed [DATA_W-1:0] w_link [0:(N+1)*N-1];  // w_link[r*N+c]: weight held by PE(r, c)

    genvar r, c;
    generate
        for (r = 0; r < N; r = r + 1) begin : g_row
            assign a_link[r*(N+1)] = in_a[r*DATA_W +: DATA_W];
            for (c = 0; c < N; c = c + 1) begin : g_col
                pe #(.DATA_W(DATA_W), .ACC_W(ACC_W)) u_pe (
                    .clk(clk),
                    .rst(rst),
                    .en(en),
                    .w_load(w_load),
                    .w_in(w_link[(r+1)*N+c]),
                    .w_out(w_link[r*N+c]),
                    .a_in(a_link[r*(N+1)+c]),
                    .a_out(a_link[r*(N+1)+c+1]),
                    .p_in(p_link[r*N+c]),
                    .p_out(p_link[(r+1)*N+c])
                );
            end
        end
        for (c = 0; c < N; c = c + 1) begin : g_edge
            assign p_link[c] = {ACC_W{1'b0}};
            assign w_link[N*N+c] = in_w[c*DATA_W +: DATA_W];
            assign out_p[c*ACC_W +: ACC_W] = p_link[N*N+c];
        end
    endgenerate
endmodule
