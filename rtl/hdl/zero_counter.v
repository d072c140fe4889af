`include "isa_pkg.vh"
// The store path's zero-tile counter (dma.stz, zc.clr; zc.rd reads `count`).
// A store streams its rows x cols block out of local memory one N-element row
// chunk per beat, row-major, each element in an ACC_W-bit lane (a row's last
// chunk may be partial: lanes past cols are ignored). `start` presents the
// store unit's next word: a dma.stz is counted, a dma.st passes uncounted, a
// zc.clr clears the count. The block is tiled in N x N tiles from its first
// row and column; band_nz keeps, per chunk column, whether the tile of the
// current band of N rows has shown a non-zero element; on the band's last row
// (or the block's) each beat completes one tile and adds 1 when it is all zero
// (f32: the sign bit is ignored, so -0.0 is zero; a NaN is not). Every beat is
// taken in the cycle it is valid (no back-pressure): counting adds no cycle to
// the store, and the count is final the cycle after the last beat (`done`).
module zero_counter #(
    parameter N = 4,
    parameter ACC_W = 32
) (
    input                        clk,
    input                        rst,
    input                        start,
    input  [`DF_WORD_BITS-1:0]   instr,
    input                        in_valid,
    input  [N*ACC_W-1:0]         in_data,
    output reg                   done,
    output reg [ACC_W-1:0]       count
);
    localparam ROWS_W = `DF_F_ROWS_W;
    localparam COLS_W = `DF_F_COLS_W;
    localparam CHUNKS = ((1 << COLS_W) - 1 + N - 1) / N;  // chunk columns of the widest store
    localparam [31:0] F32 = `DF_DTYPE_F32;

    wire [`DF_F_OPCODE_W-1:0] opcode = instr[`DF_F_OPCODE_LO +: `DF_F_OPCODE_W];
    wire [`DF_F_FUNCT_W-1:0]  funct = instr[`DF_F_FUNCT_LO +: `DF_F_FUNCT_W];
    wire is_stz = opcode == `DF_OP_DMA_STZ && funct == `DF_FUNCT_DMA_STZ;
    wire is_clr = opcode == `DF_OP_ZC_CLR && funct == `DF_FUNCT_ZC_CLR;

    reg                     counting;
    reg                     f32;
    reg  [ROWS_W-1:0]       rows, row;   // the block's rows; row of the current beat
    reg  [COLS_W-1:0]       cols;
    reg  [COLS_W+1:0]       col;         // first column of the current beat's chunk
    reg  [COLS_W-1:0]       chunk;       // its chunk column
    reg  [CHUNKS-1:0]       band_nz;

    // any element of this beat (inside the row) non-zero
    reg nz;
    integer j;
    always @* begin
        nz = 1'b0;
        for (j = 0; j < N; j = j + 1)
            if (col + j < cols)
                nz = nz | (f32 ? in_data[j*ACC_W +: ACC_W-1] != 0 : in_data[j*ACC_W +: ACC_W] != 0);
    end
    wire last_chunk = col + N >= cols;
    wire last_row = row + 1 == rows;
    wire band_end = (row % N) == N - 1 || last_row;

    always @(posedge clk) begin
        done <= 1'b0;
        if (rst) begin
            count <= {ACC_W{1'b0}};
            counting <= 1'b0;
            f32 <= 1'b0;
            rows <= {ROWS_W{1'b0}};
            cols <= {COLS_W{1'b0}};
            row <= {ROWS_W{1'b0}};
            col <= {(COLS_W+2){1'b0}};
            chunk <= {COLS_W{1'b0}};
            band_nz <= {CHUNKS{1'b0}};
        end else if (start) begin
            if (is_clr) count <= {ACC_W{1'b0}};
            counting <= is_stz;
            f32 <= instr[`DF_F_DTYPE_LO +: `DF_F_DTYPE_W] == F32[`DF_F_DTYPE_W-1:0];
            rows <= instr[`DF_F_ROWS_LO +: ROWS_W];
            cols <= instr[`DF_F_COLS_LO +: COLS_W];
            row <= {ROWS_W{1'b0}};
            col <= {(COLS_W+2){1'b0}};
            chunk <= {COLS_W{1'b0}};
            band_nz <= {CHUNKS{1'b0}};
        end else if (in_valid) begin
            if (counting) begin
                if (band_end) begin
                    if (!(nz || band_nz[chunk])) count <= count + 1'b1;
                    band_nz[chunk] <= 1'b0;
                end else begin
                    band_nz[chunk] <= band_nz[chunk] | nz;
                end
            end
            if (last_chunk) begin
                col <= {(COLS_W+2){1'b0}};
                chunk <= {COLS_W{1'b0}};
                row <= row + 1'b1;
                done <= last_row;
            end else begin
                col <= col + N;
                chunk <= chunk + 1'b1;
            end
        end
    end
endmodule
