`include "isa_pkg.vh"
// The fused drain epilogue: one N-wide accumulator row per cycle through
// bias/residual add -> activation -> requantize. The configuration is the
// ep.cfg instruction word (decoded with the generated header) and the value of
// its rs3 register (the requantize multiplier). With the epflags pc bit, each
// column c is requantized by its own (in_mult[c], in_shift[c]) pair instead
// (per-output-channel int8: the table rs3 points to, read once per drain like
// the bias; no extra cycle). A row entering at cycle i leaves
// at cycle i + LAT, LAT being mx.drain's latency in the ISA table, so draining
// `rows` rows takes rows + LAT cycles. Integer paths only (i8 and i32 out).
module epilogue #(
    parameter N = 4,
    parameter DATA_W = 8,
    parameter ACC_W = 32
) (
    input                       clk,
    input                       rst,
    input  [`DF_WORD_BITS-1:0]  cfg,
    input  [ACC_W-1:0]          scale,
    input                       in_valid,
    input  [N*ACC_W-1:0]        in_acc,
    input  [N*ACC_W-1:0]        in_bias,
    input  [N*ACC_W-1:0]        in_res,
    input  [N*ACC_W-1:0]        in_mult,
    input  [N*ACC_W-1:0]        in_shift,
    output                      out_valid,
    output [N*ACC_W-1:0]        out_data
);
    localparam LAT = `DF_LAT_MX_DRAIN;
    localparam STAGES = 3;  // add, activate, requantize
    localparam WIDE = 2 * ACC_W;

    wire [`DF_F_ACT_W-1:0]     act   = cfg[`DF_F_ACT_LO +: `DF_F_ACT_W];
    wire [`DF_F_EPFLAGS_W-1:0] flags = cfg[`DF_F_EPFLAGS_LO +: `DF_F_EPFLAGS_W];
    wire [`DF_F_DTYPE_W-1:0]   dtype = cfg[`DF_F_DTYPE_LO +: `DF_F_DTYPE_W];
    wire [`DF_F_SHIFT_W-1:0]   shift = cfg[`DF_F_SHIFT_LO +: `DF_F_SHIFT_W];
    wire use_bias = (flags & `DF_EPF_BIAS) != 0;
    wire use_res  = (flags & `DF_EPF_RES) != 0;
    wire use_pc   = (flags & `DF_EPF_PC) != 0;
    wire signed [WIDE-1:0] sat_hi = (1 <<< (DATA_W - 1)) - 1;
    wire signed [WIDE-1:0] sat_lo = -(1 <<< (DATA_W - 1));

    wire [N*ACC_W-1:0] stage3;
    genvar c;
    generate
        if (LAT < STAGES) begin : g_latency_too_short
            // the table promises fewer cycles than this pipeline needs: refuse to elaborate
            epilogue_latency_shorter_than_pipeline u_error ();
        end
        for (c = 0; c < N; c = c + 1) begin : g_col
            reg signed [ACC_W-1:0] added, activated, quantized;
            reg signed [WIDE-1:0] scaled;
            wire signed [WIDE-1:0] mult = use_pc ? $signed(in_mult[c*ACC_W +: ACC_W]) : $signed(scale);
            wire [`DF_F_SHIFT_W-1:0] sh = use_pc ? in_shift[c*ACC_W +: `DF_F_SHIFT_W] : shift;
            wire signed [WIDE-1:0] round = {{(WIDE-1){1'b0}}, sh != 0} <<< ((sh == 0) ? 0 : sh - 1);
            always @* scaled = (($signed(activated) * mult + round) >>> sh);
            always @(posedge clk) begin
                added <= $signed(in_acc[c*ACC_W +: ACC_W])
                       + (use_bias ? $signed(in_bias[c*ACC_W +: ACC_W]) : 0)
                       + (use_res ? $signed(in_res[c*ACC_W +: ACC_W]) : 0);
                activated <= (act == `DF_ACT_RELU && added < 0) ? {ACC_W{1'b0}} : added;
                if (dtype == `DF_DTYPE_I8)
                    quantized <= (scaled > sat_hi) ? sat_hi[ACC_W-1:0]
                               : (scaled < sat_lo) ? sat_lo[ACC_W-1:0] : scaled[ACC_W-1:0];
                else
                    quantized <= activated;
            end
            assign stage3[c*ACC_W +: ACC_W] = quantized;
        end
    endgenerate

    delay_line #(.WIDTH(N * ACC_W), .DEPTH(LAT - STAGES)) u_extra (
        .clk(clk), .rst(rst), .en(1'b1), .d(stage3), .q(out_data)
    );
    delay_line #(.WIDTH(1), .DEPTH(LAT)) u_valid (
        .clk(clk), .rst(rst), .en(1'b1), .d(in_valid), .q(out_valid)
    );
endmodule
