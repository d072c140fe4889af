"""Does the RTL agree with the simulator's machine config and the harness's port layout?

Every RTL unit's parameters must be exactly those the harness derives from the
config (plus ones defined by the generated ISA header), its ports exactly the
ones the harness drives, each as wide as the config says, and its defaults must
describe the `tiny` machine.
"""

from __future__ import annotations

from rtl.introspect import ModuleInfo, WidthError, evaluate
from rtl.units import HEADER_PARAMETERS, PARAMETERS, UNITS, RtlUnit
from simulator.config import PRESETS, MachineConfig

DEFAULT_CONFIG = "tiny"


def unit_mismatches(unit: RtlUnit, module: ModuleInfo | None, cfg: MachineConfig) -> list[str]:
    """Human-readable disagreements between one RTL module and the config; empty when they agree."""
    if module is None:
        return [f"{unit.toplevel}: no such module in rtl/hdl"]
    problems = []
    declared = set(module.defaults)
    extra = declared - set(unit.parameters) - HEADER_PARAMETERS
    missing = set(unit.parameters) - declared
    if extra:
        problems.append(f"{unit.toplevel}: parameters {sorted(extra)} are not derived from the machine config")
    if missing:
        problems.append(f"{unit.toplevel}: lacks parameters {sorted(missing)} the config sets")
    wanted_ports = {p.name for p in unit.ports}
    if set(module.ports) != wanted_ports:
        problems.append(f"{unit.toplevel}: ports {sorted(set(module.ports) ^ wanted_ports)} differ from the harness")
    if missing:
        return problems
    try:
        params = module.parameters(unit.params(cfg))
        for port in unit.ports:
            info = module.ports.get(port.name)
            if info is not None and info.width(params) != port.width(params):
                problems.append(
                    f"{unit.toplevel}.{port.name}: {info.width(params)} bits in RTL, "
                    f"{port.width(params)} for config {cfg.name}"
                )
        defaults = module.parameters({})
    except WidthError as err:
        return [*problems, f"{unit.toplevel}: {err}"]
    tiny = unit.params(PRESETS[DEFAULT_CONFIG])
    for name, value in tiny.items():
        if defaults[name] != value:
            problems.append(
                f"{unit.toplevel}: default {name}={defaults[name]}, the {DEFAULT_CONFIG} machine has {value}"
            )
    return problems


# parameters that mean the same in every module (PE, array, lanes...): their defaults must match the config
SHARED_PARAMETERS = ("N", "LANES", "DATA_W", "ACC_W")


def shared_default_mismatches(modules: dict[str, ModuleInfo]) -> list[str]:
    """Inner modules (pe, systolic_array, vector_lane) too must default to the tiny machine's values."""
    tiny = PRESETS[DEFAULT_CONFIG]
    problems = []
    for module in modules.values():
        defaults = module.parameters({})
        for name in SHARED_PARAMETERS:
            if name in defaults and defaults[name] != PARAMETERS[name](tiny):
                problems.append(
                    f"{module.name}: default {name}={defaults[name]}, the {DEFAULT_CONFIG} machine has "
                    f"{PARAMETERS[name](tiny)}"
                )
    return problems


def instance_mismatches(modules: dict[str, ModuleInfo], cfg: MachineConfig) -> list[str]:
    """Inside each unit, every instance must receive the config's values (e.g. the stream FIFO's DEPTH)."""
    problems: list[str] = []

    def visit(module: ModuleInfo, params: dict[str, int], path: str) -> None:
        for inst in module.instances:
            child = modules.get(inst.module)
            if child is None:  # e.g. the deliberately undefined module of a generate-time assertion
                continue
            given, unknown = {}, set()
            for name, expr in inst.params.items():
                try:
                    given[name] = evaluate(expr, params)
                except WidthError:  # depends on a genvar (a skew line k cycles long): not a config value
                    unknown.add(name)
            values = child.parameters(given)
            checked = UNITS[child.name].parameters if child.name in UNITS else SHARED_PARAMETERS
            for name in sorted(set(checked) - unknown):
                if name in values and values[name] != PARAMETERS[name](cfg):
                    problems.append(
                        f"{path}.{inst.name} ({child.name}): {name}={values[name]}, config {cfg.name} has "
                        f"{PARAMETERS[name](cfg)}"
                    )
            visit(child, values, f"{path}.{inst.name}")

    for unit in UNITS.values():
        module = modules.get(unit.toplevel)
        if module is not None and set(unit.parameters) <= set(module.defaults):
            visit(module, module.parameters(unit.params(cfg)), unit.toplevel)
    return problems


def config_mismatches(modules: dict[str, ModuleInfo], cfg: MachineConfig) -> list[str]:
    units = [p for unit in UNITS.values() for p in unit_mismatches(unit, modules.get(unit.toplevel), cfg)]
    return units + shared_default_mismatches(modules) + instance_mismatches(modules, cfg)
