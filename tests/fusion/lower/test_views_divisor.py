"""`widest_divisor` (how a long contiguous DMA run is split) against a brute-force search."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fusion.lower.views import MAX_COLS, widest_divisor


@given(st.integers(1, 2_000_000), st.integers(1, MAX_COLS))
def test_widest_divisor_is_the_largest_divisor_within_the_limit(n: int, limit: int) -> None:
    assert widest_divisor(n, limit) == max(d for d in range(1, min(n, limit) + 1) if n % d == 0)
