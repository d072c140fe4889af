"""The strategy registry: every record is complete (builds, prices, has an HPM slot), and an incomplete or
inconsistent one is refused at construction or by the registry's check."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from engine_helpers import context, gated_mlp_graph, model, rotary_graph
from test_codegen_patch_embed import patch_graph

from fusion.cost import AnalyticCostModel
from fusion.engine.candidates import enumerate_candidates, schedules, zero_skip_twin
from fusion.engine.features import kernel_features
from fusion.engine.kernel import try_build
from fusion.engine.plan import Group
from fusion.engine.planner import STATIC_FAMILIES, STATIC_STRATEGY
from fusion.engine.strategies import REGISTRY, Strategy, _check, strategy_of
from fusion.hpm.schema import FEATURE_NAMES, STRATEGIES, vectorize

BUNDLED = ("mlp", "encoder_post_d64", "resnet_block")


@pytest.fixture(scope="module")
def built() -> dict[str, list]:
    """Strategy name -> (context, kernel) of every group of it that builds on the bundled models (int8)."""
    out: dict[str, list] = {name: [] for name in REGISTRY}
    gated = gated_mlp_graph((1,), 16, 32, 32, "silu")  # a gated MLP (LLaMA's): no bundled model has one
    rotary = rotary_graph((2,), 16, 32, 16, False)  # rotary embeddings (LLaMA's): neither
    patches = patch_graph(1, 3, 16, (8, 8), (4, 4), True)  # a ViT patch embedding: neither
    extra = [(gated, {"x": np.ones((1, 16, 32), np.float32)}), (rotary, {"a": np.ones((2, 16, 8), np.float32)})]
    extra.append((patches, {"x": np.ones((1, 3, 8, 8), np.float32)}))
    for graph, x in [*map(model, BUNDLED), *extra]:
        mc = context(graph, x, "int8")
        for cand in enumerate_candidates(graph):
            for g in schedules(mc, cand):
                for group in (g, zero_skip_twin(g)):
                    if group is not None and len(out[group.strategy]) < 3:
                        kernel = try_build(mc, group, "sparse" if strategy_of(group).skips_zero_tiles else "any")
                        if not isinstance(kernel, str):
                            out[group.strategy].append((mc, kernel))
    return out


def test_every_registered_strategy_is_offered_and_builds(built: dict[str, list]) -> None:
    """A strategy missing its candidate rule or generator would never appear here."""
    for name, record in REGISTRY.items():
        assert built[name], f"strategy {name!r}: no group of it built on the bundled models"
        for _, kernel in built[name]:
            assert (kernel.program is None) == record.host_view
            if kernel.program is not None:
                assert kernel.program.kernels[0].attr("strategy") == name  # the stable name in the binary


def test_every_kernel_prices_and_counts_under_its_hpm_slot(built: dict[str, list]) -> None:
    for name, record in REGISTRY.items():
        assert record.hpm_feature in (*STRATEGIES, "other")
        for mc, kernel in built[name]:
            if record.host_view:
                continue
            f = kernel_features(mc, kernel, 0.5)
            estimate = AnalyticCostModel().predict(f, mc.config)
            assert estimate.cycles > 0 and 0 < estimate.spread < 1
            vec = dict(zip(FEATURE_NAMES, vectorize(f, mc.config), strict=True))
            hot = [k for k, v in vec.items() if k.startswith("strategy.") and v == 1.0]
            assert hot == [f"strategy.{record.hpm_feature}"]


def test_zero_skip_pricing_follows_the_record(built: dict[str, list]) -> None:
    """Only a strategy that skips zero tiles is priced at the zero-tile fraction."""
    for name, record in REGISTRY.items():
        for mc, kernel in built[name][:1]:
            if record.host_view:
                continue
            f = kernel_features(mc, kernel, 0.0)
            dense = AnalyticCostModel().predict(f, mc.config).cycles
            sparse = AnalyticCostModel().predict(replace(f, zero_tile_fraction=0.9), mc.config).cycles
            assert (sparse < dense) == (record.skips_zero_tiles and f.matmuls > 0), name


def test_static_policy_has_a_strategy_for_each_family() -> None:
    assert set(STATIC_FAMILIES) <= set(STATIC_STRATEGY)
    for family, name in STATIC_STRATEGY.items():
        assert family in REGISTRY[name].families


def test_unknown_strategy_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown strategy 'epilouge' \(known: alias, unfused"):
        Group(("a",), "epilouge")


def _registry(*records: Strategy) -> dict[str, Strategy]:
    return {**REGISTRY, **{r.name: r for r in records}}


@pytest.mark.parametrize(
    ("record", "message"),
    [
        (Strategy("fresh", None, "other", ("fresh",)), "host view .* cannot be pipelined"),
        (replace(REGISTRY["zero_skip"], name="fresh", pipelinable=True), "testing tiles at issue cannot be pipelined"),
        (replace(REGISTRY["epilogue"], name="fresh", families=(), sparse_twin="nope"), "sparse twin 'nope'"),
        (replace(REGISTRY["stream"], name="fresh", families=()), "no candidate offers it"),
        (replace(REGISTRY["stream"], name="fresh"), "shares a candidate family with (stream|fresh)"),
        (replace(REGISTRY["stream"], name="fresh", families=("x",), spread=1.5), "spread 1.5"),
    ],
)
def test_an_inconsistent_record_is_refused(record: Strategy, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _check(_registry(record))


def test_a_record_without_its_required_fields_does_not_construct() -> None:
    with pytest.raises(TypeError):
        Strategy("fresh", None)  # type: ignore[call-arg]


def test_the_registry_as_shipped_passes_its_check() -> None:
    _check(REGISTRY)
    assert np.all([strategy_of(name) is record for name, record in REGISTRY.items()])
