"""Every candidate family has one row of legality rules (`legality.FAMILIES`): a family a new matcher or strategy
introduces without one is refused by name, not judged by a default."""

from __future__ import annotations

import pytest
from engine_helpers import MODELS, model

from fusion.engine.candidates import enumerate_candidates
from fusion.engine.legality import FAMILIES, rules_of
from fusion.engine.strategies import REGISTRY


def test_every_strategys_families_have_rules() -> None:
    named = {f for s in REGISTRY.values() for f in s.families}
    assert named <= set(FAMILIES), sorted(named - set(FAMILIES))


@pytest.mark.parametrize("name", sorted(p.stem for p in MODELS.glob("*.onnx")))
def test_every_family_the_bundled_models_offer_has_rules(name: str) -> None:
    graph, _ = model(name)
    for cand in enumerate_candidates(graph):
        rules_of(cand.family)


def test_a_family_without_rules_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="'pipelined' has no legality rules"):
        rules_of("pipelined")
