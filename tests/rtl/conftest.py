"""RTL tests need Icarus Verilog and cocotb; skip (saying which is missing) only when truly absent."""

from __future__ import annotations

import pytest

from rtl.build import missing_tools


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = missing_tools()
    for item in items:
        if reason and item.get_closest_marker("rtl"):
            item.add_marker(pytest.mark.skip(reason=f"RTL simulation unavailable: {reason}"))
