// The matrix -> vector stream FIFO (mx.mms pushes rows, vc.lds pops them), with
// valid/ready on both sides. When it is empty a row falls through in the cycle
// it arrives, so a consumer waiting for the last row takes it in the cycle the
// row is ready: the `last_row_out + 1` end of the chain_stream timing rule. It
// refuses a row (in_ready low) while it holds DEPTH rows, even in a cycle the
// consumer takes one: the `taken_depth_before + 1` of `timing.stream_row_out`.
module stream_fifo #(
    parameter WIDTH = 128,
    parameter DEPTH = 4
) (
    input                           clk,
    input                           rst,
    input                           in_valid,
    output                          in_ready,
    input  [WIDTH-1:0]              in_data,
    output                          out_valid,
    input                           out_ready,
    output [WIDTH-1:0]              out_data
);
    localparam PTR_W = (DEPTH > 1) ? $clog2(DEPTH) : 1;

    reg [$clog2(DEPTH+1)-1:0] count;
    reg [WIDTH-1:0] mem [0:DEPTH-1];
    reg [PTR_W-1:0] rd_ptr, wr_ptr;
    wire empty = count == 0;
    wire bypass = empty && in_valid && out_ready;  // the row goes straight through
    wire push = in_valid && in_ready && !bypass;
    wire pop = !empty && out_ready;

    assign in_ready = count != DEPTH;
    assign out_valid = !empty || in_valid;
    assign out_data = empty ? in_data : mem[rd_ptr];

    function [PTR_W-1:0] next_ptr;
        input [PTR_W-1:0] p;
        next_ptr = (p == DEPTH - 1) ? {PTR_W{1'b0}} : p + 1'b1;
    endfunction

    always @(posedge clk) begin
        if (rst) begin
            rd_ptr <= {PTR_W{1'b0}};
            wr_ptr <= {PTR_W{1'b0}};
            count <= 0;
        end else begin
            if (push) begin
                mem[wr_ptr] <= in_data;
                wr_ptr <= next_ptr(wr_ptr);
            end
            if (pop) rd_ptr <= next_ptr(rd_ptr);
            count <= count + push - pop;
        end
    end
endmodule
