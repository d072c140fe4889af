`include "isa_pkg.vh"
// Carries each beat's valid bit and latency through LAT_MAX stages: hits[t-1]
// is high when the beat in stage t has been in flight exactly its latency, so
// that stage's value leaves the unit this cycle (out_valid).
module beat_pipe #(
    parameter LAT_MAX = `DF_MAX_UNIT_LATENCY
) (
    input                        clk,
    input                        rst,
    input                        in_valid,
    input  [`DF_LATENCY_W-1:0]   lat,
    output [LAT_MAX-1:0]         hits,
    output                       out_valid
);
    reg                     s_valid [1:LAT_MAX];
    reg [`DF_LATENCY_W-1:0] s_lat [1:LAT_MAX];
    integer k;
    always @(posedge clk) begin
        if (rst) begin
            for (k = 1; k <= LAT_MAX; k = k + 1) s_valid[k] <= 1'b0;
        end else begin
            s_valid[1] <= in_valid;
            s_lat[1] <= lat;
            for (k = 2; k <= LAT_MAX; k = k + 1) begin
                s_valid[k] <= s_valid[k-1];
                s_lat[k] <= s_lat[k-1];
            end
        end
    end
    genvar t;
    generate
        for (t = 1; t <= LAT_MAX; t = t + 1) begin : g_hit
            assign hits[t-1] = s_valid[t] && s_lat[t] == t;
        end
    endgenerate
    assign out_valid = |hits;
endmodule
