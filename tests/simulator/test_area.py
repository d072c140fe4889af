"""The area model: the published per-component figures, summed over what a configuration holds."""

from __future__ import annotations

from dataclasses import replace

import pytest

from simulator.area import AreaTable, area, sram_bits
from simulator.config import PRESETS
from simulator.errors import ConfigError


def test_base_machine_area_from_the_published_figures() -> None:
    base = PRESETS["base"]  # 16 x 16 array, 16 lanes, 256 KiB + 64 KiB, 8 x 4096 fp32 vregs, FIFO 16 x 16, 5 x 8 queues
    bits = 8 * (256 + 64) * 1024 + 8 * 4096 * 32 + 16 * 16 * 32 + 5 * 8 * 64
    assert sram_bits(base) == bits
    got = area(base)
    assert got.array_mm2 == pytest.approx(256 * (282 + 137 + 7700 + 4184) / 1e6)
    assert got.vector_mm2 == pytest.approx(16 * (7700 + 4184 + 137) / 1e6)
    assert got.sram_mm2 == pytest.approx(bits * 0.346 / 0.7 / 1e6)
    assert got.total_mm2 == pytest.approx(got.array_mm2 + got.vector_mm2 + got.sram_mm2)


def test_bigger_machines_are_bigger_and_bandwidth_is_free() -> None:
    base = PRESETS["base"]
    for name, value in (("array_size", 32), ("vector_lanes", 32), ("spad_bytes", 512 * 1024), ("vreg_elems", 8192)):
        assert area(replace(base, **{name: value})).total_mm2 > area(base).total_mm2, name
    assert area(replace(base, dram_bytes_per_cycle=64)) == area(base), "the DRAM interface is not modelled"
    assert area(PRESETS["tiny"]).total_mm2 < area(base).total_mm2 < area(PRESETS["large"]).total_mm2


def test_overrides_are_checked() -> None:
    assert area(PRESETS["base"], AreaTable(sram_array_efficiency=1.0)).sram_mm2 < area(PRESETS["base"]).sram_mm2
    with pytest.raises(ConfigError, match="area.sram_cell"):
        AreaTable(sram_cell=0)
    with pytest.raises(ConfigError, match="at most 1"):
        AreaTable(sram_array_efficiency=1.5)
