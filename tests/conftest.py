"""Suite-wide conventions.

Test modules are imported by basename (pytest's default `rootdir` mode, which the cocotb runner needs), so
every `test_*.py` basename must be unique across tests/: name a file after its package's subject
(`test_asm_cli.py`, not `test_cli.py`). The check below turns a clash into a clear collection error.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest


def pytest_sessionstart(session: pytest.Session) -> None:
    places: dict[str, list[Path]] = defaultdict(list)
    for path in Path(__file__).parent.rglob("*.py"):
        if path.name.startswith("test_") or path.name.endswith("_helpers.py"):
            places[path.name].append(path)
    clashes = {name: paths for name, paths in places.items() if len(paths) > 1}
    if clashes:
        listing = "; ".join(f"{name}: {', '.join(map(str, paths))}" for name, paths in sorted(clashes.items()))
        raise pytest.UsageError(f"test module basenames must be unique across tests/ ({listing})")
