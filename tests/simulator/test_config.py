from dataclasses import replace

import pytest

from simulator import PRESETS, ConfigError, EnergyTable, MachineConfig, load_config
from simulator.config import config_from_dict


def test_presets_have_the_documented_arrays() -> None:
    assert {name: cfg.array_size for name, cfg in PRESETS.items()} == {"tiny": 4, "base": 16, "large": 32}
    assert load_config("base") is PRESETS["base"]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("array_size", 0, "array_size must be >= 1"),
        ("array_size", 300, "array_size must be at most"),
        ("spad_banks", 3, "spad_banks must be a power of two"),
        ("dram_bytes_per_cycle", 2.5, "dram_bytes_per_cycle must be an integer"),
        ("clock_mhz", -1.0, "clock_mhz must be a finite positive number"),
        ("clock_mhz", float("nan"), "clock_mhz must be a finite positive number"),
        ("clock_mhz", float("inf"), "clock_mhz must be a finite positive number"),
        ("acc_bytes", 1000, "acc_bytes (1000) must divide"),
        ("queue_depth", True, "queue_depth must be an integer"),
        ("stream_fifo_depth", 0, "stream_fifo_depth must be >= 1"),
        ("stream_fifo_depth", 2.0, "stream_fifo_depth must be an integer"),
    ],
)
def test_bad_values_name_the_field(field: str, value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        replace(PRESETS["base"], **{field: value})


def test_every_preset_streams_one_array_of_rows_and_toml_can_change_it(tmp_path) -> None:
    assert all(cfg.stream_fifo_depth == cfg.array_size for cfg in PRESETS.values())
    path = tmp_path / "deep.toml"
    path.write_text('preset = "tiny"\nstream_fifo_depth = 9\n')
    deep = load_config(path)
    assert deep.stream_fifo_depth == 9 and deep.array_size == 4
    assert deep.config_hash() != replace(deep, stream_fifo_depth=4).config_hash()


@pytest.mark.parametrize("value", [-1, float("nan"), float("inf")])
def test_energy_values_are_validated(value: float) -> None:
    with pytest.raises(ConfigError, match="energy.dram_byte must be a finite non-negative number"):
        EnergyTable(dram_byte=value)


def test_toml_overrides_a_preset_and_the_energy_table(tmp_path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text('preset = "base"\narray_size = 8\n[energy]\ndram_byte = 100.0\n')
    cfg = load_config(str(path))
    assert cfg.name == "mine" and cfg.array_size == 8 and cfg.vector_lanes == 16
    assert cfg.energy.dram_byte == 100.0 and cfg.energy.mac_int8 == PRESETS["base"].energy.mac_int8


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('preset = "base"\narray_sise = 8\n', "unknown config field 'array_sise'"),
        ('preset = "huge"\n', "preset must be one of"),
        ("array_size = 8\n", "missing config fields"),
        ('preset = "base"\n[energy]\nfoo = 1.0\n', "unknown energy field 'foo'"),
        ("array_size = [\n", "invalid TOML"),
        ('preset = ["base"]\n', "preset must be one of"),
        ('preset = "base"\nclock_mhz = nan\n', "clock_mhz must be a finite"),
        ('preset = "base"\n[energy]\ndram_byte = inf\n', "energy.dram_byte must be a finite"),
        (b'preset = "base"\n# \xff\n', "TOML must be UTF-8 text"),
    ],
)
def test_bad_toml_is_a_clear_error(tmp_path, text: str | bytes, message: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ConfigError, match=message):
        load_config(path)


def test_unknown_name_is_an_error() -> None:
    with pytest.raises(ConfigError, match="unknown machine config 'medium'"):
        load_config("medium")


def test_full_toml_without_preset() -> None:
    data = {k: v for k, v in PRESETS["tiny"].as_dict().items() if k not in ("name", "energy")}
    assert config_from_dict(data, "t") == replace(PRESETS["tiny"], name="t")


def test_config_hash_is_stable_and_sensitive() -> None:
    base = PRESETS["base"]
    again = MachineConfig(**{**base.as_dict(), "energy": EnergyTable(**base.as_dict()["energy"])})
    assert again.config_hash() == base.config_hash()
    assert replace(base, dram_latency=101).config_hash() != base.config_hash()
    assert replace(base, energy=replace(base.energy, dram_byte=1.0)).config_hash() != base.config_hash()
    assert len({cfg.config_hash() for cfg in PRESETS.values()}) == len(PRESETS)
