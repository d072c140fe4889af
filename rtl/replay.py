"""Run a batch of cases on one RTL unit (one simulation) and judge every one.

On any mismatch the batch is simulated again with a VCD dump, and the report
names the first differing cycle, signal, expected and actual value.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rtl import build as rtl_build
from rtl.check import Case, Verdict, compare
from rtl.jobs import Job
from rtl.stimulus import DRAIN_WRITE_IDLE, EPILOGUE_IDLE, FETCH_IDLE, MATRIX_IDLE, STREAM_IDLE, VECTOR_IDLE
from rtl.units import DRAIN_WRITE, EPILOGUE, MATRIX, MATRIX_FETCH, STREAM, VECTOR, RtlUnit
from simulator.config import MachineConfig

IDLE = {
    MATRIX.toplevel: MATRIX_IDLE,
    MATRIX_FETCH.toplevel: FETCH_IDLE,
    VECTOR.toplevel: VECTOR_IDLE,
    EPILOGUE.toplevel: EPILOGUE_IDLE,
    DRAIN_WRITE.toplevel: DRAIN_WRITE_IDLE,
    STREAM.toplevel: STREAM_IDLE,
}


@dataclass(frozen=True)
class BatchReport:
    unit: str
    verdicts: tuple[Verdict, ...]
    vcd: Path | None  # written when something mismatched

    @property
    def value_mismatches(self) -> int:
        return sum(v.value is not None for v in self.verdicts)

    @property
    def cycle_mismatches(self) -> int:
        return sum(v.cycle is not None for v in self.verdicts)

    @property
    def ok(self) -> bool:
        return all(v.ok for v in self.verdicts)

    def first_mismatch(self) -> str:
        for verdict in self.verdicts:
            for mismatch in (verdict.cycle, verdict.value):
                if mismatch is not None:
                    return f"{mismatch} (waveform: {self.vcd})"
        return ""


def run_cases(unit: RtlUnit, cfg: MachineConfig, cases: list[Case], vcd_dir: Path | None = None) -> BatchReport:
    """Replay `cases` back to back on `unit` built for `cfg`."""
    params = unit.params(cfg)
    built = rtl_build.build(unit.toplevel, params)
    job = Job(
        unit.toplevel,
        tuple(c.item for c in cases),
        IDLE.get(unit.toplevel, {}),
        settle=unit.combinational,
        reset_between=not unit.keeps_state,
    )
    results = rtl_build.run(built, job)
    verdicts = tuple(compare(unit, params, case, result) for case, result in zip(cases, results, strict=True))
    vcd = None
    if not all(v.ok for v in verdicts):
        vcd = (vcd_dir or built.directory) / f"{unit.toplevel}-{cfg.name}-mismatch.vcd"
        rtl_build.run(built, job, vcd=vcd)
    return BatchReport(unit.toplevel, verdicts, vcd)
