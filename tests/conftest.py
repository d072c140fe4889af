"""Suite-wide conventions.

Test modules are imported by basename (pytest's default `rootdir` mode, which the cocotb runner needs), so
every `test_*.py` basename must be unique across tests/: name a file after its package's subject
(`test_asm_cli.py`, not `test_cli.py`). The check below turns a clash into a clear collection error.

Hypothesis: under CI (`CI` set, as `.ci/run` is run) the `ci` profile draws the same examples on every run
(derandomized, no example database), so a red CI is a change's doing, not a new draw; everywhere else each run
explores new examples (hypothesis' default), which is how the property tests keep finding bugs. Choose one
explicitly with `pytest --hypothesis-profile=ci` (or `explore`).
"""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path

import pytest
from hypothesis import settings

settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("explore", print_blob=True)
settings.load_profile("ci" if os.environ.get("CI", "").lower() not in ("", "0", "false") else "explore")


def pytest_sessionstart(session: pytest.Session) -> None:
    places: dict[str, list[Path]] = defaultdict(list)
    for path in Path(__file__).parent.rglob("*.py"):
        if path.name.startswith("test_") or path.name.endswith("_helpers.py"):
            places[path.name].append(path)
    clashes = {name: paths for name, paths in places.items() if len(paths) > 1}
    if clashes:
        listing = "; ".join(f"{name}: {', '.join(map(str, paths))}" for name, paths in sorted(clashes.items()))
        raise pytest.UsageError(f"test module basenames must be unique across tests/ ({listing})")
