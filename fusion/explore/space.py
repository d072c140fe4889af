"""The design space: a preset, and per `MachineConfig` field a list or range of values (a TOML file).

    preset = "base"                                   # every field not swept keeps the preset's value
    policies = ["none", "dynamic"]                    # plan policies (default: dynamic)
    dtypes = ["fp32"]                                 # fp32 and/or int8 (default: fp32)
    [fields]
    array_size = [8, 16, 32]                          # a list
    vector_lanes = { from = 8, to = 32, step = 8 }    # 8, 16, 24, 32 (inclusive)
    spad_bytes = { from = 65536, to = 524288, times = 2 }   # 64 KiB .. 512 KiB, doubling

Every combination of the fields' values is a machine; a combination the machine cannot be (`MachineConfig`
validation: a bank count that is not a power of two, an array over 256) is kept as a point whose status says
why, not dropped, so the result shows where the space's edges are. Mistakes in the file itself (an unknown
field, a string where a number goes, an empty range) are errors naming the file and the field.
"""

from __future__ import annotations

import itertools
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from fusion.engine.planner import POLICIES
from fusion.explore.errors import ExploreError
from simulator.config import PRESETS, MachineConfig
from simulator.errors import ConfigError

DTYPES = ("fp32", "int8")
MAX_AXIS_VALUES = 1000
MAX_GRID_POINTS = 100_000  # machines in a grid; a budgeted search (--search) may draw from larger spaces
MAX_SEARCH_SPACE = 10**12
SWEEPABLE = {f.name: f.type for f in fields(MachineConfig) if f.name not in ("name", "energy")}
TOP_KEYS = ("preset", "policies", "dtypes", "fields")

Value = int | float


@dataclass(frozen=True)
class Axis:
    field: str
    values: tuple[Value, ...]


@dataclass(frozen=True)
class Space:
    source: str  # the file it came from, for messages
    preset: str
    policies: tuple[str, ...]
    dtypes: tuple[str, ...]
    axes: tuple[Axis, ...]

    @property
    def machines(self) -> int:
        count = 1
        for axis in self.axes:
            count *= len(axis.values)
        return count

    def grid(self) -> Iterator[dict[str, Value]]:
        """Every machine's overrides of the preset, in a fixed order (the axes' order, last varying fastest)."""
        if self.machines > MAX_GRID_POINTS:
            raise ExploreError(
                f"{self.source}: {self.machines} machines in the grid (at most {MAX_GRID_POINTS}): "
                "narrow the fields or use --search N"
            )
        names = [a.field for a in self.axes]
        for values in itertools.product(*(a.values for a in self.axes)):
            yield dict(zip(names, values, strict=True))


def machine(preset: str, overrides: dict[str, Value]) -> MachineConfig | str:
    """The machine of one point, or why it cannot be one (the `MachineConfig` validation message)."""
    name = "+".join([preset, *(f"{k}={v}" for k, v in overrides.items())])
    try:
        return replace(PRESETS[preset], name=name, **overrides)
    except ConfigError as err:
        return str(err)


def load_space(path: Path) -> Space:
    try:
        data = tomllib.loads(Path(path).read_text())
    except tomllib.TOMLDecodeError as err:
        raise ExploreError(f"{path}: invalid TOML: {err}") from None
    return space_from_dict(data, str(path))


def space_from_dict(data: dict[str, Any], source: str) -> Space:
    for key in data:
        if key not in TOP_KEYS:
            raise ExploreError(f"{source}: unknown key {key!r} (known: {', '.join(TOP_KEYS)})")
    preset = data.get("preset")
    if preset not in PRESETS:
        raise ExploreError(f"{source}: preset must be one of {', '.join(PRESETS)}, got {preset!r}")
    policies = _names(data.get("policies", ["dynamic"]), POLICIES, f"{source}: policies")
    dtypes = _names(data.get("dtypes", ["fp32"]), DTYPES, f"{source}: dtypes")
    table = data.get("fields", {})
    if not isinstance(table, dict):
        raise ExploreError(f"{source}: fields must be a table of MachineConfig fields")
    axes = tuple(Axis(name, _values(name, spec, f"{source}: fields.{name}")) for name, spec in table.items())
    space = Space(source, preset, policies, dtypes, axes)
    if space.machines > MAX_SEARCH_SPACE:
        raise ExploreError(f"{source}: {space.machines} machines is more than any sweep or search can use")
    return space


def _names(value: Any, known: tuple[str, ...], where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise ExploreError(f"{where}: expected a non-empty list of names ({', '.join(known)}), got {value!r}")
    for v in value:
        if v not in known:
            raise ExploreError(f"{where}: unknown {v!r} (known: {', '.join(known)})")
    if len(set(value)) != len(value):
        raise ExploreError(f"{where}: {value!r} lists a name twice")
    return tuple(value)


def _values(name: str, spec: Any, where: str) -> tuple[Value, ...]:
    if name not in SWEEPABLE:
        raise ExploreError(f"{where}: not a MachineConfig field (fields: {', '.join(sorted(SWEEPABLE))})")
    kind = float if SWEEPABLE[name] == "float" else int
    if isinstance(spec, list):
        values = [_number(v, kind, where) for v in spec]
    elif isinstance(spec, dict):
        values = _range(spec, kind, where)
    else:
        raise ExploreError(f"{where}: expected a list of values or a {{from, to, step|times}} table, got {spec!r}")
    if not values:
        raise ExploreError(f"{where}: no values")
    if len(set(values)) != len(values):
        raise ExploreError(f"{where}: a value is listed twice in {values}")
    return tuple(values)


def _number(value: Any, kind: type, where: str) -> Value:
    ok = isinstance(value, int) if kind is int else isinstance(value, int | float)
    if isinstance(value, bool) or not ok:
        raise ExploreError(f"{where}: expected {'an integer' if kind is int else 'a number'}, got {value!r}")
    return kind(value)


def _range(spec: dict[str, Any], kind: type, where: str) -> list[Value]:
    keys = set(spec)
    if not {"from", "to"} <= keys or len(keys & {"step", "times"}) != 1 or keys - {"from", "to", "step", "times"}:
        raise ExploreError(f"{where}: a range is {{from = A, to = B, step = S}} or {{from = A, to = B, times = F}}")
    start, stop = _number(spec["from"], kind, where), _number(spec["to"], kind, where)
    if stop < start:
        raise ExploreError(f"{where}: to ({stop}) is below from ({start})")
    values: list[Value] = []
    if "step" in spec:
        step = _number(spec["step"], kind, where)
        if step <= 0:
            raise ExploreError(f"{where}: step must be positive, got {step}")
        count = int((stop - start) / step + 1e-9) + 1
        if count > MAX_AXIS_VALUES:
            raise ExploreError(f"{where}: {count} values (at most {MAX_AXIS_VALUES})")
        values = [kind(start + i * step) for i in range(count)]
    else:
        factor = spec["times"]
        if isinstance(factor, bool) or not isinstance(factor, int | float) or factor <= 1 or start <= 0:
            raise ExploreError(f"{where}: times must be a number > 1 and from positive, got {factor!r}, {start!r}")
        value = start
        while value <= stop:
            values.append(kind(value))
            if len(values) > MAX_AXIS_VALUES:
                raise ExploreError(f"{where}: more than {MAX_AXIS_VALUES} values")
            value = value * factor
    return values
