"""Zoo fixtures: the exports (made once per machine, cached outside git; see bench/zoo) and the CLI runs on them,
shared by every assertion of a session so each model goes through each command once."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # `bench` is a directory of the project, not an installed package

from bench.zoo import NAMES, ZooEntry, prefetch, zoo_model  # noqa: E402


@pytest.fixture(scope="session")
def zoo() -> dict[str, ZooEntry]:
    """Every zoo model at its small input (one export process for all the missing ones)."""
    prefetch(NAMES, "small")
    return {name: zoo_model(name) for name in NAMES}
