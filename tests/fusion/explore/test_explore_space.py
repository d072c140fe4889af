"""Space files: lists and ranges expand as documented; every mistake names the file and the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from fusion.explore.errors import ExploreError
from fusion.explore.space import load_space, machine
from simulator.config import PRESETS


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "space.toml"
    path.write_text(text)
    return path


def test_lists_and_ranges_expand_into_a_grid(tmp_path: Path) -> None:
    space = load_space(
        write(
            tmp_path,
            'preset = "base"\npolicies = ["none", "dynamic"]\ndtypes = ["int8"]\n[fields]\n'
            "array_size = [8, 16]\nvector_lanes = { from = 8, to = 30, step = 8 }\n"
            "spad_bytes = { from = 65536, to = 300000, times = 2 }\nclock_mhz = [500, 1000.5]\n",
        )
    )
    assert space.policies == ("none", "dynamic") and space.dtypes == ("int8",)
    axes = {a.field: a.values for a in space.axes}
    assert axes["vector_lanes"] == (8, 16, 24)
    assert axes["spad_bytes"] == (65536, 131072, 262144)
    assert axes["clock_mhz"] == (500.0, 1000.5) and all(isinstance(v, float) for v in axes["clock_mhz"])
    grid = list(space.grid())
    assert len(grid) == space.machines == 2 * 3 * 3 * 2
    assert grid[0] == {"array_size": 8, "vector_lanes": 8, "spad_bytes": 65536, "clock_mhz": 500.0}
    assert grid[1]["clock_mhz"] == 1000.5, "the last axis varies fastest"


def test_defaults_are_the_dynamic_policy_in_fp32_on_the_preset(tmp_path: Path) -> None:
    space = load_space(write(tmp_path, 'preset = "tiny"\n'))
    assert (space.policies, space.dtypes, space.axes, list(space.grid())) == (("dynamic",), ("fp32",), (), [{}])


def test_a_machine_the_config_cannot_be_is_a_reason_not_an_error() -> None:
    assert "power of two" in machine("base", {"spad_banks": 3})
    assert "array_size must be at most 256" in machine("base", {"array_size": 512})
    config = machine("base", {"array_size": 8})
    assert config.array_size == 8 and config.vector_lanes == PRESETS["base"].vector_lanes


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('preset = "huge"\n', "preset must be one of"),
        ('preset = "base"\ncolour = 1\n', "unknown key 'colour'"),
        ('preset = "base"\n[fields]\narray_sise = [8]\n', r"fields.array_sise: not a MachineConfig field"),
        ('preset = "base"\n[fields]\narray_size = ["8"]\n', r"fields.array_size: expected an integer"),
        ('preset = "base"\n[fields]\narray_size = [8.5]\n', r"fields.array_size: expected an integer"),
        ('preset = "base"\n[fields]\narray_size = [true]\n', r"fields.array_size: expected an integer"),
        ('preset = "base"\n[fields]\narray_size = []\n', r"fields.array_size: no values"),
        ('preset = "base"\n[fields]\narray_size = [8, 8]\n', r"fields.array_size: a value is listed twice"),
        ('preset = "base"\n[fields]\narray_size = { from = 8, to = 4, step = 1 }\n', "below from"),
        ('preset = "base"\n[fields]\narray_size = { from = 8, to = 16 }\n', "a range is"),
        ('preset = "base"\n[fields]\narray_size = { from = 8, to = 16, step = 0 }\n', "step must be positive"),
        ('preset = "base"\n[fields]\narray_size = { from = 1, to = 99999, step = 1 }\n', r"at most 1000"),
        ('preset = "base"\n[fields]\nname = ["x"]\n', r"fields.name: not a MachineConfig field"),
        ('preset = "base"\npolicies = ["fastest"]\n', r"policies: unknown 'fastest'"),
        ('preset = "base"\ndtypes = "fp32"\n', r"dtypes: expected a non-empty list"),
        ('preset = "base"\n[fields\n', "invalid TOML"),
    ],
)
def test_mistakes_name_the_file_and_field(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ExploreError, match=message) as err:
        load_space(path)
    assert str(path) in str(err.value)


def test_a_grid_too_large_to_run_points_to_search(tmp_path: Path) -> None:
    names = ("dram_latency", "branch_penalty", "queue_depth", "vreg_elems")
    text = 'preset = "base"\n[fields]\n' + "".join(f"{n} = {{ from = 1, to = 20, step = 1 }}\n" for n in names)
    space = load_space(write(tmp_path, text))
    with pytest.raises(ExploreError, match="--search"):
        next(space.grid())
