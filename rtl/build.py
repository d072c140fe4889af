"""Build and run an RTL unit under cocotb + Icarus, with one simulation per job.

Builds are cached outside the source tree, one directory per (toplevel,
parameters, source text), so parallel pytest workers never share one; a lock
file serialises two workers asking for the same build.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from isa.errors import DynfuseError
from rtl.jobs import ItemResult, Job, read_results, write_job

HDL_DIR = Path(__file__).parent / "hdl"
GENERATED_DIR = Path(__file__).parent / "generated"
CACHE_ENV = "DYNFUSE_RTL_CACHE"
TIMESCALE = ("1ns", "1ps")
DRIVER_MODULE = "rtl.tb.driver"
VCD_MODULE = "vcd_dump"


class RtlToolError(DynfuseError):
    """Icarus Verilog or cocotb is missing or failed."""


def missing_tools() -> str | None:
    """Why RTL simulation cannot run here, or None when it can."""
    for tool in ("iverilog", "vvp"):
        if shutil.which(tool) is None:
            return f"{tool} (Icarus Verilog) is not on PATH"
    try:
        import cocotb_tools.runner  # noqa: F401
    except ImportError:
        return "cocotb is not installed (pip install 'cocotb>=2,<3')"
    return None


def hdl_sources() -> list[Path]:
    return sorted(HDL_DIR.glob("*.v"))


def cache_root() -> Path:
    root = os.environ.get(CACHE_ENV)
    return Path(root) if root else Path(tempfile.gettempdir()) / f"dynfuse-rtl-{os.getuid()}"


@dataclass(frozen=True)
class Build:
    toplevel: str
    parameters: tuple[tuple[str, int], ...]
    directory: Path


def _vcd_module(toplevel: str) -> str:
    """A second root module that dumps a VCD only when run with +vcd=PATH."""
    return (
        f"module {VCD_MODULE};\n"
        "    reg [8*1024-1:0] path;\n"
        '    initial if ($value$plusargs("vcd=%s", path)) begin\n'
        "        $dumpfile(path);\n"
        f"        $dumpvars(0, {toplevel});\n"
        "    end\n"
        "endmodule\n"
    )


def build(toplevel: str, parameters: Mapping[str, int]) -> Build:
    """Compile `toplevel` with `parameters` (cached by content)."""
    reason = missing_tools()
    if reason:
        raise RtlToolError(reason)
    from cocotb_tools.runner import get_runner

    sources = hdl_sources()
    params = tuple(sorted((k, int(v)) for k, v in parameters.items()))
    digest = hashlib.sha256(repr((toplevel, params)).encode())
    for path in [*sources, *sorted(GENERATED_DIR.glob("*.vh"))]:
        digest.update(path.read_bytes())
    directory = cache_root() / f"{toplevel}-{digest.hexdigest()[:16]}"
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (directory / "sim.vvp").exists():
            dump = directory / f"{VCD_MODULE}.v"
            dump.write_text(_vcd_module(toplevel))
            runner = get_runner("icarus")
            runner.build(
                sources=[*sources, dump],
                includes=[GENERATED_DIR],
                hdl_toplevel=toplevel,
                parameters=dict(params),
                build_args=["-s", VCD_MODULE],
                build_dir=directory,
                timescale=TIMESCALE,
                log_file=directory / "build.log",
            )
    return Build(toplevel, params, directory)


def _runner(vcd: bool):
    """cocotb's Icarus runner; with `vcd` it lets vvp write VCD (the stock runner passes -none or -fst)."""
    from cocotb_tools.runner import Icarus

    class VcdIcarus(Icarus):
        def _test_command(self):
            return [[("-vcd" if arg == "-none" else arg) for arg in cmd] for cmd in super()._test_command()]

    return VcdIcarus() if vcd else Icarus()


def run(built: Build, job: Job, vcd: Path | None = None) -> list[ItemResult]:
    """Simulate one job (one simulator start-up for all its items) and return the recorded events."""
    work = Path(tempfile.mkdtemp(prefix="run-", dir=built.directory))
    job_path, result_path = work / "job.json", work / "results.json"
    write_job(job, job_path)
    runner = _runner(vcd is not None)
    try:
        runner.test(
            test_module=DRIVER_MODULE,
            hdl_toplevel=built.toplevel,
            hdl_toplevel_lang="verilog",
            build_dir=built.directory,
            test_dir=work,
            plusargs=[f"+vcd={vcd}"] if vcd else [],
            extra_env={
                "DYNFUSE_RTL_JOB": str(job_path),
                "DYNFUSE_RTL_RESULT": str(result_path),
                "COCOTB_LOG_LEVEL": "WARNING",
            },
            log_file=work / "sim.log",
        )
    except SystemExit as err:
        raise RtlToolError(f"RTL simulation of {built.toplevel} failed; log: {work / 'sim.log'}") from err
    results = read_results(result_path)
    shutil.rmtree(work, ignore_errors=True)
    return results
