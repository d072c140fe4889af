"""A seeded, time-bounded fuzz loop shared by the fuzzers in tests/fuzz.

Case i draws from `np.random.default_rng([seed, i])`, so any failure is reproduced by its seed and index alone
(the message names both). In the suite each fuzzer runs `DYNFUSE_FUZZ_SECONDS` (default 3) from seed 0;
`make fuzz` runs them for minutes and appends each fuzzer's counts to `DYNFUSE_FUZZ_REPORT` (docs/robustness.md
records a run). A case returns its outcome ("accepted", "rejected", ...); an exception outside `allowed` fails.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np

SECONDS = float(os.environ.get("DYNFUSE_FUZZ_SECONDS", "3"))
SEED = int(os.environ.get("DYNFUSE_FUZZ_SEED", "0"))
MIN_CASES = 20  # even on a slow machine a fuzzer tries this many


def fuzz(name: str, case: Callable[[np.random.Generator], str], allowed: tuple[type[BaseException], ...]) -> Counter:
    """Run cases until the time budget is spent; returns the outcome counts (also appended to the report)."""
    counts: Counter[str] = Counter()
    deadline = time.monotonic() + SECONDS
    i = 0
    while i < MIN_CASES or time.monotonic() < deadline:
        try:
            counts[case(np.random.default_rng([SEED, i]))] += 1
        except allowed:
            counts["rejected"] += 1
        except BaseException as err:
            raise AssertionError(f"{name}: fuzz case {i} (seed {SEED}) raised {type(err).__name__}: {err}") from err
        i += 1
    report = os.environ.get("DYNFUSE_FUZZ_REPORT")
    if report:
        with Path(report).open("a") as f:
            f.write(f"| {name} | {i} | {' / '.join(f'{k} {v}' for k, v in sorted(counts.items()))} | {SECONDS:g} s |\n")
    return counts


def mutate_bytes(blob: bytes, rng: np.random.Generator, edits: int = 4) -> bytes:
    """Flip bits, truncate, insert and overwrite runs of bytes."""
    out = bytearray(blob)
    for _ in range(int(rng.integers(1, edits + 1))):
        action = int(rng.integers(0, 4))
        at = int(rng.integers(0, len(out) + 1))
        if action == 0 and out:
            at = min(at, len(out) - 1)
            out[at] ^= 1 << int(rng.integers(0, 8))
        elif action == 1:
            del out[at:]
        elif action == 2:
            out[at:at] = rng.bytes(int(rng.integers(1, 9)))
        elif out:
            at = min(at, len(out) - 1)
            out[at : at + 4] = rng.bytes(4)[: len(out) - at]
    return bytes(out)


def pick(rng: np.random.Generator, items: list):
    return items[int(rng.integers(0, len(items)))]
