// N x N grid of PEs built with a generate loop. Row r receives activation
// element r (and the switch token) on the left; column c's partial sum leaves at
// the bottom. Next weights enter each column at the top, skewed like the
// activations (column c c cycles later), one row per cycle, the last row first:
// in_w carries weight row N-1-k as the k-th row (w_index = k) of a preload. PE
// row r shifts only once the k-th row has reached it (k >= r), so the first new
// weight reaches PE(r, c) at preload start + r + c, never before the switch
// token of the matmul using the previous weights (which passes at its start +
// r + c); the last lands at start + N - 1 + c, before a matmul started N cycles
// after the preload switches there.
// Links are per-PE unpacked nets (a wide flattened bus is 25-500x slower in Icarus).
module systolic_array #(
    parameter N = 4,
    parameter DATA_W = 8,
    parameter ACC_W = 32
) (
    input                   clk,
    input                   rst,
    input                   en,      // low: every PE's compute side holds (a stalled array)
    input                   w_load,  // a weight row is on in_w
    input  [$clog2(N+1)-1:0] w_index, // its index k within the preload
    input  [N*DATA_W-1:0]   in_w,    // weight row N-1-k
    input  [N-1:0]          in_s,    // skewed switch tokens, bit r for PE row r
    input  [N*DATA_W-1:0]   in_a,    // skewed activations, element r for PE row r
    output [N*ACC_W-1:0]    out_p    // skewed partial sums leaving the bottom row
);
    localparam INDEX_W = $clog2(N + 1);

    wire signed [DATA_W-1:0] a_link [0:N*(N+1)-1];  // a_link[r*(N+1)+c]: into PE(r, c)
    wire                     s_link [0:N*(N+1)-1];  // switch tokens, alongside a_link
    wire signed [ACC_W-1:0]  p_link [0:(N+1)*N-1];  // p_link[r*N+c]: into PE(r, c) from above
    wire signed [DATA_W-1:0] w_link [0:(N+1)*N-1];  // w_link[r*N+c]: shadow weight into PE(r, c) from above
    wire                     col_load [0:N-1];       // column c's weight row is valid (skewed by c)
    wire [INDEX_W-1:0]       col_index [0:N-1];      // and its index k

    genvar r, c;
    generate
        for (c = 0; c < N; c = c + 1) begin : g_wskew
            wire [INDEX_W+DATA_W:0] col_q;
            delay_line #(.WIDTH(1 + INDEX_W + DATA_W), .DEPTH(c)) u_wskew (
                .clk(clk), .rst(rst), .en(1'b1),
                .d({w_load, w_index, in_w[c*DATA_W +: DATA_W]}),
                .q(col_q)
            );
            assign col_load[c] = col_q[INDEX_W+DATA_W];
            assign col_index[c] = col_q[DATA_W +: INDEX_W];
            assign w_link[c] = col_q[DATA_W-1:0];
            assign p_link[c] = {ACC_W{1'b0}};
            assign out_p[c*ACC_W +: ACC_W] = p_link[N*N+c];
        end
        for (r = 0; r < N; r = r + 1) begin : g_row
            assign a_link[r*(N+1)] = in_a[r*DATA_W +: DATA_W];
            assign s_link[r*(N+1)] = in_s[r];
            for (c = 0; c < N; c = c + 1) begin : g_col
                pe #(.DATA_W(DATA_W), .ACC_W(ACC_W)) u_pe (
                    .clk(clk),
                    .rst(rst),
                    .en(en),
                    .w_shift(col_load[c] && col_index[c] >= r),
                    .w_in(w_link[r*N+c]),
                    .w_out(w_link[(r+1)*N+c]),
                    .s_in(s_link[r*(N+1)+c]),
                    .s_out(s_link[r*(N+1)+c+1]),
                    .a_in(a_link[r*(N+1)+c]),
                    .a_out(a_link[r*(N+1)+c+1]),
                    .p_in(p_link[r*N+c]),
                    .p_out(p_link[(r+1)*N+c])
                );
            end
        end
    endgenerate
endmodule
