"""The RTL units the harness knows: toplevel, parameters from the machine config, ports.

One naming convention for every unit: `clk`, `rst`, `in_valid`/`out_valid`,
data ports `in_*`/`out_*`; parameters `N` (array size), `LANES`, `DATA_W`,
`ACC_W` (element widths), `WIDTH`/`DEPTH` (stream FIFO: row width, and rows it
holds = the config's `stream_fifo_depth`). `PARAMETERS` says where each
parameter's value comes from; `tests/rtl/test_conformance.py` parses `rtl/hdl`
with pyverilog and fails if a unit's parameters or port widths disagree with
these and the simulator's config.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from isa import DType
from isa.fields import FIELDS, WORD_BITS
from simulator.config import MachineConfig

# integer ops the vector lanes implement, by ISA op name (v.<op> and vc.<op>)
LANE_BINARY = ("add", "sub", "mul", "max", "min", "sll", "srl", "sra")
LANE_UNARY = ("relu", "neg", "abs", "copy")
LANE_REDUCE = ("rsum", "rmax", "rmin")
LANE_OTHER = ("clip", "rqnt", "ld", "st")  # ld/st: the chain moves; rqnt: also v.rqnt.vr / v.rqnt.vc (per channel)

ELEM_BITS = DType.i8.size * 8
ACC_BITS = DType.i32.size * 8


# parameter name -> its value for a machine config
PARAMETERS: dict[str, Callable[[MachineConfig], int]] = {
    "N": lambda cfg: cfg.array_size,
    "LANES": lambda cfg: cfg.vector_lanes,
    "DATA_W": lambda cfg: ELEM_BITS,
    "ACC_W": lambda cfg: ACC_BITS,
    "DEPTH": lambda cfg: cfg.stream_fifo_depth,
    "WIDTH": lambda cfg: cfg.array_size * ACC_BITS,
    "SPAD_ADDR_W": lambda cfg: (cfg.spad_bytes - 1).bit_length(),
}
# parameters whose default comes from the generated ISA header, not from the config
HEADER_PARAMETERS = frozenset({"LAT_MAX"})


@dataclass(frozen=True)
class Port:
    """A port as the harness packs it: `count` elements of `bits` bits (names of parameters or ints)."""

    name: str
    count: str | int = 1
    bits: str | int = 1

    def elements(self, params: dict[str, int]) -> int:
        return _value(self.count, params)

    def element_bits(self, params: dict[str, int]) -> int:
        return _value(self.bits, params)

    def width(self, params: dict[str, int]) -> int:
        return self.elements(params) * self.element_bits(params)


def _value(term: str | int, params: dict[str, int]) -> int:
    return params[term] if isinstance(term, str) else term


CONTROL = (Port("clk"), Port("rst"))
WORD = Port("instr", 1, WORD_BITS)


@dataclass(frozen=True)
class RtlUnit:
    toplevel: str
    parameters: tuple[str, ...]
    ports: tuple[Port, ...]
    combinational: bool = False  # some output follows an input in the same cycle
    keeps_state: bool = False  # items depend on earlier ones (preloaded weights), so never reset between them

    def params(self, cfg: MachineConfig) -> dict[str, int]:
        return {name: PARAMETERS[name](cfg) for name in self.parameters}

    def port(self, name: str) -> Port:
        return next(p for p in self.ports if p.name == name)


MATRIX = RtlUnit(
    "matrix_unit",
    ("N", "DATA_W", "ACC_W"),
    (
        *CONTROL,
        Port("en"),
        Port("w_valid"),
        Port("in_w", "N", "DATA_W"),
        Port("w_ready"),
        Port("in_valid"),
        Port("in_first"),
        Port("in_a", "N", "DATA_W"),
        Port("acc_en"),
        Port("in_acc", "N", "ACC_W"),
        Port("out_valid"),
        Port("out_p", "N", "ACC_W"),
    ),
    combinational=True,  # the accumulate adder on out_p
    keeps_state=True,  # matmul items use the weights a preload item left
)

MATRIX_FETCH = RtlUnit(
    "matrix_fetch",
    ("N", "DATA_W", "ACC_W", "SPAD_ADDR_W"),
    (
        *CONTROL,
        Port("w_valid"),
        Port("in_w", "N", "DATA_W"),
        Port("w_ready"),
        Port("mem_we"),
        Port("mem_addr", 1, "SPAD_ADDR_W"),
        Port("mem_wdata", "N", "DATA_W"),
        Port("start"),
        WORD,
        Port("rs1", 1, "ACC_W"),
        Port("rs2", 1, "ACC_W"),
        Port("k", 1, FIELDS["rows"].width),
        Port("acc_en"),
        Port("in_acc", "N", "ACC_W"),
        Port("out_valid"),
        Port("out_p", "N", "ACC_W"),
    ),
    combinational=True,  # the fetch's first row and the accumulate adder follow their inputs in the cycle
)

VECTOR = RtlUnit(
    "vector_unit",
    ("LANES", "DATA_W", "ACC_W"),
    (
        *CONTROL,
        Port("in_valid"),
        Port("in_mask", "LANES", 1),
        WORD,
        Port("reg_dtype", 1, FIELDS["dtype"].width),
        Port("rs2", 1, "ACC_W"),
        Port("rs3", 1, "ACC_W"),
        Port("in_a", "LANES", "ACC_W"),
        Port("in_b", "LANES", "ACC_W"),
        Port("in_c", "LANES", "ACC_W"),
        Port("out_valid"),
        Port("out_mask", "LANES", 1),
        Port("out_data", "LANES", "ACC_W"),
    ),
)
EPILOGUE = RtlUnit(
    "epilogue",
    ("N", "DATA_W", "ACC_W"),
    (
        *CONTROL,
        Port("cfg", 1, WORD_BITS),
        Port("scale", 1, "ACC_W"),
        Port("in_valid"),
        Port("in_acc", "N", "ACC_W"),
        Port("in_bias", "N", "ACC_W"),
        Port("in_res", "N", "ACC_W"),
        Port("in_mult", "N", "ACC_W"),
        Port("in_shift", "N", "ACC_W"),
        Port("out_valid"),
        Port("out_data", "N", "ACC_W"),
    ),
)
DRAIN_WRITE = RtlUnit(
    "drain_write",
    ("N", "DATA_W", "ACC_W"),
    (
        *CONTROL,
        Port("cfg", 1, WORD_BITS),
        Port("scale", 1, "ACC_W"),
        Port("in_bias", "N", "ACC_W"),
        Port("in_mult", "N", "ACC_W"),
        Port("in_shift", "N", "ACC_W"),
        Port("start"),
        WORD,
        Port("rd", 1, "ACC_W"),
        Port("rs2", 1, "ACC_W"),
        Port("in_valid"),
        Port("in_acc", "N", "ACC_W"),
        Port("in_res", "N", "ACC_W"),
        Port("out_valid"),
        Port("out_data", "N", "ACC_W"),
        Port("wr_en"),
        Port("wr_addr", 1, "ACC_W"),
        Port("wr_mask", "N", 1),
        Port("wr_data", "N", "ACC_W"),
    ),
)
FIFO = RtlUnit(
    "stream_fifo",
    ("WIDTH", "DEPTH"),
    (
        *CONTROL,
        Port("in_valid"),
        Port("in_ready"),
        Port("in_data", 1, "WIDTH"),
        Port("out_valid"),
        Port("out_ready"),
        Port("out_data", 1, "WIDTH"),
    ),
    combinational=True,  # an empty FIFO passes a row through in the same cycle
)

STREAM = RtlUnit(
    "stream_path",
    ("N", "LANES", "DATA_W", "ACC_W", "DEPTH"),
    (
        *CONTROL,
        Port("w_valid"),
        Port("in_w", "N", "DATA_W"),
        Port("w_ready"),
        Port("in_valid"),
        Port("in_first"),
        Port("in_ready"),
        Port("in_a", "N", "DATA_W"),
        Port("out_row_valid"),
        WORD,
        Port("lds_start"),
        Port("out_valid"),
        Port("out_mask", "LANES", 1),
        Port("out_data", "LANES", "ACC_W"),
    ),
    combinational=True,  # the FIFO passes a row to the vector unit in the cycle it arrives
)
ZERO_COUNTER = RtlUnit(
    "zero_counter",
    ("N", "ACC_W"),
    (
        *CONTROL,
        Port("start"),
        WORD,
        Port("in_valid"),
        Port("in_data", "N", "ACC_W"),
        Port("done"),
        Port("count", 1, "ACC_W"),
    ),
    keeps_state=True,  # the count adds up over stores until a zc.clr
)
UNITS: dict[str, RtlUnit] = {
    u.toplevel: u for u in (MATRIX, MATRIX_FETCH, VECTOR, EPILOGUE, DRAIN_WRITE, FIFO, STREAM, ZERO_COUNTER)
}
