`include "isa_pkg.vh"
// One vector lane: the integer elementwise ops of the ISA as a pipeline of
// LAT_MAX stages. Each op finishes in the stage its latency (from the ISA table,
// via df_latency) names; later stages pass the value on, and the result is taken
// from the stage equal to the beat's latency. Values are ACC_W-bit two's
// complement; i8 results saturate to DATA_W bits, i32 results wrap.
module vector_lane #(
    parameter DATA_W = 8,
    parameter ACC_W = 32,
    parameter LAT_MAX = `DF_MAX_UNIT_LATENCY
) (
    input                          clk,
    input                          rst,
    input                          in_valid,
    input  [`DF_WORD_BITS-1:0]     instr,
    input  [`DF_F_DTYPE_W-1:0]     dtype,
    input  [`DF_LATENCY_W-1:0]     lat,
    input  signed [ACC_W-1:0]      in_a,
    input  signed [ACC_W-1:0]      in_b,
    input  signed [ACC_W-1:0]      in_c,    // per-channel requantize: this element's shift
    input  signed [ACC_W-1:0]      in_r,    // this lane's reduction scan value
    input  signed [ACC_W-1:0]      rs2,
    input  signed [ACC_W-1:0]      rs3,
    output                         out_valid,
    output signed [ACC_W-1:0]      out_data
);
    localparam WIDE = 2 * ACC_W;

    wire [`DF_F_OPCODE_W-1:0] opcode = instr[`DF_F_OPCODE_LO +: `DF_F_OPCODE_W];
    wire [`DF_F_FUNCT_W-1:0]  funct  = instr[`DF_F_FUNCT_LO +: `DF_F_FUNCT_W];
    wire [`DF_F_SHIFT_W-1:0]  shift  = instr[`DF_F_SHIFT_LO +: `DF_F_SHIFT_W];

    wire is_binary = (opcode == `DF_OP_V_ADD) || (opcode == `DF_OP_VC_ADD);
    wire is_unary  = (opcode == `DF_OP_V_RELU) || (opcode == `DF_OP_VC_RELU);
    wire is_misc   = (opcode == `DF_OP_V_CLIP) || (opcode == `DF_OP_VC_CLIP);
    wire is_reduce = (opcode == `DF_OP_V_RSUM) || (opcode == `DF_OP_VC_RSUM);
    wire is_move   = (opcode == `DF_OP_VC_LD);  // vc.ld / vc.st / vc.lds pass data through
    wire is_mul    = is_binary && funct == `DF_FUNCT_V_MUL;
    wire is_rqnt   = is_misc && funct == `DF_FUNCT_V_RQNT;
    // per-channel requantize: the element's (mult, shift) come in on in_b / in_c
    wire is_pcq    = is_misc && (funct == `DF_FUNCT_V_RQNT_VR || funct == `DF_FUNCT_V_RQNT_VC);

    // fit a wide result to the element type: i8 saturates, i32 wraps
    function [WIDE-1:0] fit;
        input signed [WIDE-1:0] v;
        input [`DF_F_DTYPE_W-1:0] dt;
        reg signed [WIDE-1:0] hi, lo;
        begin
            hi = (1 <<< (DATA_W - 1)) - 1;
            lo = -(1 <<< (DATA_W - 1));
            if (dt == `DF_DTYPE_I8) fit = (v > hi) ? hi : (v < lo) ? lo : v;
            else fit = {{ACC_W{v[ACC_W-1]}}, v[ACC_W-1:0]};
        end
    endfunction

    // wrap a result to the element type (logical right shifts reinterpret, never saturate)
    function [WIDE-1:0] wrap;
        input signed [WIDE-1:0] v;
        input [`DF_F_DTYPE_W-1:0] dt;
        if (dt == `DF_DTYPE_I8) wrap = {{(WIDE-DATA_W){v[DATA_W-1]}}, v[DATA_W-1:0]};
        else wrap = {{ACC_W{v[ACC_W-1]}}, v[ACC_W-1:0]};
    endfunction

    // element bits of the dtype, for shift amounts and logical right shifts
    function [ACC_W-1:0] elem_mask;
        input [`DF_F_DTYPE_W-1:0] dt;
        elem_mask = (dt == `DF_DTYPE_I8) ? {{(ACC_W-DATA_W){1'b0}}, {DATA_W{1'b1}}} : {ACC_W{1'b1}};
    endfunction

    function [ACC_W-1:0] shift_amount;
        input [ACC_W-1:0] b;
        input [`DF_F_DTYPE_W-1:0] dt;
        shift_amount = b & ((dt == `DF_DTYPE_I8) ? (DATA_W - 1) : (ACC_W - 1));
    endfunction

    // min(max(a, lo), hi): hi wins when the bounds cross
    function [WIDE-1:0] clip;
        input signed [WIDE-1:0] v, lo, hi;
        reg signed [WIDE-1:0] raised;
        begin
            raised = (v < lo) ? lo : v;
            clip = (raised > hi) ? hi : raised;
        end
    endfunction

    wire signed [WIDE-1:0] a = in_a;
    wire signed [WIDE-1:0] b = in_b;
    wire signed [WIDE-1:0] lo_bound = rs2;
    wire signed [WIDE-1:0] hi_bound = rs3;
    wire [ACC_W-1:0] sh = shift_amount(in_b, dtype);

    reg signed [WIDE-1:0] first;
    always @* begin
        first = {WIDE{1'b0}};
        if (is_binary) begin
            case (funct)
                `DF_FUNCT_V_ADD: first = fit(a + b, dtype);
                `DF_FUNCT_V_SUB: first = fit(a - b, dtype);
                `DF_FUNCT_V_MUL: first = a * b;
                `DF_FUNCT_V_MAX: first = (a > b) ? a : b;
                `DF_FUNCT_V_MIN: first = (a < b) ? a : b;
                `DF_FUNCT_V_SLL: first = fit(a <<< sh, dtype);
                `DF_FUNCT_V_SRL: first = wrap($signed({{ACC_W{1'b0}}, (in_a & elem_mask(dtype)) >> sh}), dtype);
                `DF_FUNCT_V_SRA: first = a >>> sh;
                default: first = {WIDE{1'b0}};
            endcase
        end else if (is_unary) begin
            case (funct)
                `DF_FUNCT_V_RELU: first = (a > 0) ? a : {WIDE{1'b0}};
                `DF_FUNCT_V_NEG:  first = fit(-a, dtype);
                `DF_FUNCT_V_ABS:  first = fit((a < 0) ? -a : a, dtype);
                `DF_FUNCT_V_COPY: first = a;
                default: first = {WIDE{1'b0}};
            endcase
        end else if (is_misc) begin
            case (funct)
                `DF_FUNCT_V_CLIP: first = fit(clip(a, lo_bound, hi_bound), dtype);
                `DF_FUNCT_V_RQNT: first = a * lo_bound;  // x * mult in 2*ACC_W bits
                `DF_FUNCT_V_RQNT_VR, `DF_FUNCT_V_RQNT_VC: first = a * b;  // x * its channel's mult
                default: first = {WIDE{1'b0}};
            endcase
        end else if (is_reduce) begin
            first = in_r;
        end else if (is_move) begin
            first = a;
        end
    end

    // per-stage data and the control each later stage needs
    reg signed [WIDE-1:0]        s_data [1:LAT_MAX];
    reg                          s_mul [1:LAT_MAX];
    reg                          s_rqnt [1:LAT_MAX];
    reg [`DF_F_DTYPE_W-1:0]      s_dtype [1:LAT_MAX];
    reg [`DF_F_SHIFT_W-1:0]      s_shift [1:LAT_MAX];

    // stage 2 finishes mul (fit) and the rounding shift of rqnt; stage 3 saturates rqnt
    function [WIDE-1:0] advance;
        input [7:0] stage;  // the stage being written
        input signed [WIDE-1:0] v;
        input mul, rqnt;
        input [`DF_F_DTYPE_W-1:0] dt;
        input [`DF_F_SHIFT_W-1:0] shamt;
        reg signed [WIDE-1:0] round;
        begin
            round = {{(WIDE-1){1'b0}}, shamt != 0} <<< ((shamt == 0) ? 0 : shamt - 1);
            if (stage == 2 && mul) advance = fit(v, dt);
            else if (stage == 2 && rqnt) advance = (v + round) >>> shamt;
            else if (stage == 3 && rqnt) advance = fit(v, `DF_DTYPE_I8);
            else advance = v;
        end
    endfunction

    // data needs no reset: beat_pipe's valid bits say which stages hold a beat
    integer k;
    always @(posedge clk) begin
        s_data[1] <= first;
        s_mul[1] <= is_mul;
        s_rqnt[1] <= is_rqnt || is_pcq;
        s_dtype[1] <= dtype;
        s_shift[1] <= is_pcq ? in_c[`DF_F_SHIFT_W-1:0] : shift;
        for (k = 2; k <= LAT_MAX; k = k + 1) begin
            s_data[k] <= advance(k, s_data[k-1], s_mul[k-1], s_rqnt[k-1], s_dtype[k-1], s_shift[k-1]);
            s_mul[k] <= s_mul[k-1];
            s_rqnt[k] <= s_rqnt[k-1];
            s_dtype[k] <= s_dtype[k-1];
            s_shift[k] <= s_shift[k-1];
        end
    end

    // output tap: the stage whose beat has reached its latency
    wire [LAT_MAX-1:0] hits;
    beat_pipe #(.LAT_MAX(LAT_MAX)) u_beats (
        .clk(clk), .rst(rst), .in_valid(in_valid), .lat(lat), .hits(hits), .out_valid(out_valid)
    );
    wire signed [ACC_W-1:0] tap_data [1:LAT_MAX+1];
    assign tap_data[LAT_MAX+1] = {ACC_W{1'b0}};
    genvar t;
    generate
        for (t = 1; t <= LAT_MAX; t = t + 1) begin : g_tap
            assign tap_data[t] = hits[t-1] ? s_data[t][ACC_W-1:0] : tap_data[t+1];
        end
    endgenerate
    assign out_data = tap_data[1];
endmodule
