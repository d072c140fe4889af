"""What the engine generated, as assembly a researcher can read, edit, re-assemble and simulate.

`dynfuse fuse --emit-asm DIR` writes each kernel a call dispatched as `DIR/NNN_<strategy>_<node>.s` (in dispatch
order; `assembler.disasm` output, which assembles back to the kernel's exact bytes) and `DIR/kernels.tsv`
listing each file's nodes, schedule, data class and measured cycles. `dynfuse disasm` reads on-disk kernel
cache entries (`--cache-dir`, `*.dfk`) as well as binaries: the entry's program is in the assembler's own
object format, and the reader is registered from here so the assembler never imports fusion.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from assembler.disasm import disassemble
from assembler.objfile import ObjectFile
from fusion.engine.cache import KernelCache, decode_entry, read_entry
from fusion.engine.engine import KernelRecord
from fusion.engine.errors import EngineError
from fusion.engine.kernel import Kernel
from fusion.engine.pipelined import pair_schedule

INDEX = "kernels.tsv"


class RecordingCache(KernelCache):
    """A kernel cache that remembers the order kernels were last asked for: after a call, a group's most recent
    kernel is the one that call dispatched (dense or zero-skip variant alike)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.used: OrderedDict[str, Kernel] = OrderedDict()

    def get_or_build(self, key: str, build: Callable[[], Kernel]) -> tuple[Kernel, bool]:
        kernel, hit = super().get_or_build(key, build)
        self.used.pop(key, None)
        self.used[key] = kernel
        return kernel, hit


def kernel_identity(kernel: Kernel) -> tuple[frozenset[str], str]:
    """(nodes, schedule) as a `KernelRecord` names the kernel it dispatched (a pipelined pair: both groups')."""
    pair = kernel.pipelined_with
    if pair is None:
        return frozenset(kernel.group.nodes), kernel.group.schedule
    return frozenset((*kernel.group.nodes, *pair.nodes)), pair_schedule(kernel.group, pair)


@dataclass(frozen=True)
class EmittedKernel:
    path: Path
    record: KernelRecord
    program: ObjectFile


def dispatched(records: Sequence[KernelRecord], used: OrderedDict[str, Kernel]) -> list[tuple[KernelRecord, Kernel]]:
    """Each record's kernel: the latest one asked for with the record's nodes and schedule (alias groups run on
    the host and unfused fallbacks run the nodes' baseline kernels: neither has one program of its own)."""
    latest: dict[tuple[frozenset[str], str], Kernel] = {kernel_identity(k): k for k in used.values()}
    out = []
    for record in records:
        kernel = latest.get((frozenset(record.nodes), record.schedule))
        if kernel is not None and kernel.program is not None and not record.fallback:
            out.append((record, kernel))
    return out


def _file_name(index: int, record: KernelRecord) -> str:
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{record.schedule}_{record.nodes[0]}").strip("._")[:80]
    return f"{index:03d}_{stem}.s"


def emit_kernels(
    records: Sequence[KernelRecord], used: OrderedDict[str, Kernel], directory: Path
) -> list[EmittedKernel]:
    """Write the dispatched kernels' assembly and the index into `directory` (created)."""
    directory.mkdir(parents=True, exist_ok=True)
    emitted, rows = [], ["file\tnodes\tschedule\tdata_class\tmeasured_cycles"]
    for index, (record, kernel) in enumerate(dispatched(records, used)):
        assert kernel.program is not None
        path = directory / _file_name(index, record)
        path.write_text(disassemble(kernel.program))
        emitted.append(EmittedKernel(path, record, kernel.program))
        fields = (path.name, ",".join(record.nodes), record.schedule, record.data_class, str(record.measured_cycles))
        rows.append("\t".join(fields))
    (directory / INDEX).write_text("\n".join(rows) + "\n")
    return emitted


def read_cache_entry(path: Path) -> ObjectFile:
    """The program of an on-disk kernel cache entry (`<key>.dfk`), checked as the cache checks it."""
    blob = read_entry(path)
    if blob is None:
        raise EngineError(f"{path}: not a regular kernel cache file (or larger than the cache ever writes)")
    kernel = decode_entry(blob, path.stem)
    if kernel is None:
        raise EngineError(
            f"{path}: not a valid kernel cache entry (truncated, corrupted, from another cache or ISA version, "
            "or renamed: an entry's file name is its key)"
        )
    if kernel.program is None:
        raise EngineError(f"{path}: the entry is an alias group (a view done on the host): it has no program")
    return kernel.program
