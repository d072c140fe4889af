"""RTL tests need Icarus Verilog and cocotb; skip (saying which is missing) only when truly absent.

Tests marked `slow` (minute-long ones, e.g. the zoo models' engine kernels on the RTL) are moved to the front of
the session: with `pytest -n 2` the workers take tests in collection order, and a long test started last would
leave one worker running alone at the end. The hook sees the whole session's items, so this holds for every
`slow` test collected with tests/rtl."""

from __future__ import annotations

import pytest

from rtl.build import missing_tools


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = missing_tools()
    for item in items:
        if reason and item.get_closest_marker("rtl"):
            item.add_marker(pytest.mark.skip(reason=f"RTL simulation unavailable: {reason}"))
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable: slow first, order kept
