"""The calibration recipes cover the engine: every registered strategy (but a host view, which has no program)
builds kernels on some recipe's groups, as the sweep enumerates them, so a strategy added without a recipe fails
here instead of being priced from other kinds' samples; and every recipe's groups mostly fit the sweep's work
budget, so none is drawn far less often than the others."""

from __future__ import annotations

import numpy as np
import pytest

from fusion.engine.context import ModelContext
from fusion.engine.kernel import try_build
from fusion.engine.strategies import REGISTRY
from fusion.graph.cost import group_cost
from fusion.hpm.recipes import RECIPES
from fusion.hpm.sweep import MAX_ROOFLINE_CYCLES, GroupSpec, candidate_groups, group_inputs
from fusion.quant.calibrate import calibrate
from simulator.config import load_config

SEEDS = 4  # per recipe and dtype: enough that each recipe's own kind builds at least once


def _built_strategies() -> dict[str, str]:
    """Strategy -> the first recipe (name/seed/dtype) one of whose candidate groups built a kernel of it; a group
    of a strategy already found is not built again."""
    found: dict[str, str] = {}
    config = load_config("base")
    for name, recipe in sorted(RECIPES.items()):
        for seed in range(SEEDS):
            for dtype in ("fp32", "int8"):
                graph = recipe(np.random.default_rng(seed))
                spec = GroupSpec(seed, name, graph, config, dtype, 0.0, False)
                params = calibrate(graph, [group_inputs(spec)]) if dtype == "int8" else None
                mc = ModelContext(graph, config, dtype, params)
                for _, group in candidate_groups(mc, np.random.default_rng(seed)):
                    if group.strategy in found:
                        continue
                    kernel = try_build(mc, group, "sparse" if REGISTRY[group.strategy].skips_zero_tiles else "any")
                    if not isinstance(kernel, str) and kernel.program is not None:
                        found[group.strategy] = f"{name}/{seed}/{dtype}"
    return found


def test_every_registered_strategy_has_a_recipe_building_its_kernels() -> None:
    found = _built_strategies()
    missing = [name for name, s in REGISTRY.items() if not s.host_view and name not in found]
    assert not missing, f"no calibration recipe builds kernels of {missing}: add one to fusion/hpm/recipes.py"


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_every_recipe_mostly_fits_the_work_budget(name: str) -> None:
    """The sweep redraws a group over the budget: a recipe mostly over it would be sampled far less than others."""
    rng = np.random.default_rng(0)
    config = load_config("base")
    fits = 0
    for _ in range(40):
        graph = RECIPES[name](rng)
        cost = group_cost(graph, [n.name for n in graph.nodes], config)
        fits += max(cost.compute_cycles, cost.memory_cycles) <= MAX_ROOFLINE_CYCLES
    assert fits >= 30, f"recipe {name!r}: only {fits} of 40 draws fit the sweep's work budget"
