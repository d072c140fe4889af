// A WIDTH-bit shift register DEPTH cycles long (DEPTH = 0: a wire).
// Used for the matrix unit's input skew, output de-skew and valid tracking; it
// shifts only while en is high.
module delay_line #(
    parameter WIDTH = 1,
    parameter DEPTH = 1
) (
    input              clk,
    input              rst,
    input              en,
    input  [WIDTH-1:0] d,
    output [WIDTH-1:0] q
);
    generate
        if (DEPTH == 0) begin : g_wire
            assign q = d;
        end else begin : g_regs
            reg [WIDTH-1:0] stage [0:DEPTH-1];
            integer i;
            always @(posedge clk) begin
                if (rst) begin
                    for (i = 0; i < DEPTH; i = i + 1) stage[i] <= {WIDTH{1'b0}};
                end else if (en) begin
                    stage[0] <= d;
                    for (i = 1; i < DEPTH; i = i + 1) stage[i] <= stage[i-1];
                end
            end
            assign q = stage[DEPTH-1];
        end
    endgenerate
endmodule
