`include "isa_pkg.vh"
// L-lane vector unit. One beat of up to LANES elements enters per cycle while
// in_valid is high (in_mask marks the live lanes of a short last beat); the beat
// leaves lat cycles later, lat being the instruction's latency in the ISA table,
// so an instruction over n elements occupies the unit ceil(n / LANES) + lat cycles.
// The instruction word is decoded here with the generated header: the element
// type comes from its dtype field, or from reg_dtype for the chain (vc.*) forms
// whose vector register carries it. Reductions (rsum, rmax, rmin over rows of
// `period` elements) scan across the lanes and beats; out_mask marks the lanes
// that end a row. in_c carries a per-element operand the word has no room for:
// the shift of each element's channel in the per-channel requantize
// (v.rqnt.vr / v.rqnt.vc, whose multipliers come in on in_b).
module vector_unit #(
    parameter LANES = 4,
    parameter DATA_W = 8,
    parameter ACC_W = 32,
    parameter LAT_MAX = `DF_MAX_UNIT_LATENCY
) (
    input                        clk,
    input                        rst,
    input                        in_valid,
    input  [LANES-1:0]           in_mask,
    input  [`DF_WORD_BITS-1:0]   instr,
    input  [`DF_F_DTYPE_W-1:0]   reg_dtype,
    input  [ACC_W-1:0]           rs2,
    input  [ACC_W-1:0]           rs3,
    input  [LANES*ACC_W-1:0]     in_a,
    input  [LANES*ACC_W-1:0]     in_b,
    input  [LANES*ACC_W-1:0]     in_c,
    output                       out_valid,
    output [LANES-1:0]           out_mask,
    output [LANES*ACC_W-1:0]     out_data
);
    `include "isa_functions.vh"

    localparam PERIOD_W = `DF_F_PERIOD_W;

    wire [`DF_F_OPCODE_W-1:0] opcode = instr[`DF_F_OPCODE_LO +: `DF_F_OPCODE_W];
    wire [`DF_F_FUNCT_W-1:0]  funct  = instr[`DF_F_FUNCT_LO +: `DF_F_FUNCT_W];
    wire [`DF_F_MODE_W-1:0]   mode   = instr[`DF_F_MODE_LO +: `DF_F_MODE_W];
    wire [PERIOD_W-1:0]       period = instr[`DF_F_PERIOD_LO +: PERIOD_W];
    wire [`DF_LATENCY_W-1:0]  lat    = df_latency(instr);

    wire word_has_dtype = (opcode == `DF_OP_V_ADD) || (opcode == `DF_OP_V_RELU) || (opcode == `DF_OP_V_RSUM)
                       || (opcode == `DF_OP_V_CLIP && funct == `DF_FUNCT_V_CLIP)
                       || (opcode == `DF_OP_VC_LD && funct == `DF_FUNCT_VC_LD);
    wire [`DF_F_DTYPE_W-1:0] dtype = word_has_dtype ? instr[`DF_F_DTYPE_LO +: `DF_F_DTYPE_W] : reg_dtype;
    wire is_binary = (opcode == `DF_OP_V_ADD) || (opcode == `DF_OP_VC_ADD);
    wire scalar_b = is_binary && mode == `DF_MODE_V_ADD_VS;
    wire is_reduce = (opcode == `DF_OP_V_RSUM) || (opcode == `DF_OP_VC_RSUM);

    wire [LANES-1:0] lane_out_valid;

    // reduction scan: pos = position within the row of each lane's element
    reg  [PERIOD_W-1:0]    row_pos;   // position of lane 0's element in its row
    reg  signed [ACC_W-1:0] carry;    // partial result of the row left open by the last beat
    wire [PERIOD_W-1:0]    pos [0:LANES];
    wire signed [ACC_W-1:0] run [0:LANES];
    wire [LANES-1:0]       row_end;
    assign pos[0] = row_pos;
    assign run[0] = carry;

    genvar l;
    generate
        for (l = 0; l < LANES; l = l + 1) begin : g_lane
            wire signed [ACC_W-1:0] x = in_a[l*ACC_W +: ACC_W];
            wire signed [ACC_W-1:0] prev = run[l];
            wire starts = pos[l] == 0;
            reg  signed [ACC_W-1:0] joined;
            always @* begin
                case (funct)
                    `DF_FUNCT_V_RSUM: joined = prev + x;
                    `DF_FUNCT_V_RMAX: joined = (x > prev) ? x : prev;
                    default:          joined = (x < prev) ? x : prev;
                endcase
            end
            // masked (absent) elements leave the scan unchanged
            assign run[l+1] = !in_mask[l] ? prev : starts ? x : joined;
            assign pos[l+1] = !in_mask[l] ? pos[l] : (pos[l] + 1'b1 == period) ? {PERIOD_W{1'b0}} : pos[l] + 1'b1;
            assign row_end[l] = in_mask[l] && (pos[l] + 1'b1 == period);

            vector_lane #(.DATA_W(DATA_W), .ACC_W(ACC_W), .LAT_MAX(LAT_MAX)) u_lane (
                .clk(clk),
                .rst(rst),
                .in_valid(in_valid && (is_reduce ? row_end[l] : in_mask[l])),
                .instr(instr),
                .dtype(dtype),
                .lat(lat),
                .in_a(x),
                .in_b(scalar_b ? rs2 : in_b[l*ACC_W +: ACC_W]),
                .in_c(in_c[l*ACC_W +: ACC_W]),
                .in_r(run[l+1]),
                .rs2(rs2),
                .rs3(rs3),
                .out_valid(lane_out_valid[l]),
                .out_data(out_data[l*ACC_W +: ACC_W])
            );
        end
    endgenerate

    always @(posedge clk) begin
        if (rst || !in_valid) begin
            row_pos <= {PERIOD_W{1'b0}};
            carry <= {ACC_W{1'b0}};
        end else begin
            row_pos <= pos[LANES];
            carry <= run[LANES];
        end
    end

    // a beat leaves when its latency has elapsed, whether or not any lane carries a result
    beat_pipe #(.LAT_MAX(LAT_MAX)) u_beats (
        .clk(clk), .rst(rst), .in_valid(in_valid), .lat(lat), .hits(), .out_valid(out_valid)
    );
    assign out_mask = lane_out_valid;
endmodule
