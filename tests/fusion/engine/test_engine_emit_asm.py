"""`dynfuse fuse --emit-asm`: every dispatched kernel as assembly that re-assembles to the kernel's exact bytes
(checked against the on-disk cache's copy of the same kernels), and `dynfuse disasm` on cache entries."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from assembler.binary import to_bytes
from assembler.source import assemble, assemble_file
from dynfuse.cli import main
from fusion.engine.cache import decode_entry, read_entry

MLP = Path(__file__).resolve().parents[1] / "models" / "mlp.onnx"
ENCODER = Path(__file__).resolve().parents[1] / "models" / "encoder_post_d64.onnx"


def _entry_programs(cache_dir: Path) -> dict[bytes, Path]:
    """The cache's own bytes of each kernel it stored (read the way the cache reads them)."""
    programs = {}
    for path in cache_dir.glob("*.dfk"):
        kernel = decode_entry(read_entry(path), path.stem)
        assert kernel is not None, f"{path} did not decode"
        if kernel.program is not None:
            programs[to_bytes(kernel.program)] = path
    return programs


@pytest.mark.parametrize(("model", "dtype"), [(MLP, "int8"), (ENCODER, "fp32")])
def test_emitted_assembly_reassembles_to_the_dispatched_kernels(tmp_path, capsys, model: Path, dtype: str) -> None:
    emit, cache = tmp_path / "asm", tmp_path / "cache"
    argv = ["fuse", str(model), "--dtype", dtype, "--validate", "off", "--json"]
    assert main([*argv, "--emit-asm", str(emit), "--cache-dir", str(cache)]) == 0
    report = json.loads(capsys.readouterr().out)
    sources = sorted(emit.glob("*.s"))
    ran = [g for g in report["groups"] if g["strategy"] != "alias"]
    assert len(sources) == len(ran) > 1
    programs = _entry_programs(cache)
    for source in sources:
        assert to_bytes(assemble_file(source)) in programs, f"{source.name} is not a kernel the engine built"
    index = (emit / "kernels.tsv").read_text().splitlines()
    assert [row.split("\t")[0] for row in index[1:]] == [s.name for s in sources]
    assert [int(row.split("\t")[4]) for row in index[1:]] == [g["measured_cycles"] for g in ran]


def test_compare_writes_one_directory_per_policy(tmp_path, capsys) -> None:
    argv = ["fuse", str(MLP), "--validate", "off", "--compare", "none,dynamic", "--json", "--emit-asm", str(tmp_path)]
    assert main(argv) == 0
    none, dynamic = json.loads(capsys.readouterr().out)
    assert len(list((tmp_path / "none").glob("*.s"))) == len(none["groups"]) == 5  # Gemm Relu Gemm Gelu Gemm
    assert len(list((tmp_path / "dynamic").glob("*.s"))) == len(dynamic["groups"]) < 5


def test_disasm_reads_cache_entries(tmp_path, capsys) -> None:
    cache = tmp_path / "cache"
    assert main(["fuse", str(MLP), "--validate", "off", "--cache-dir", str(cache)]) == 0
    capsys.readouterr()
    programs = _entry_programs(cache)
    assert programs
    for blob, entry in programs.items():
        assert main(["disasm", str(entry)]) == 0
        assert to_bytes(assemble(capsys.readouterr().out)) == blob


def test_disasm_of_a_damaged_cache_entry_is_one_error_line(tmp_path, capsys) -> None:
    cache = tmp_path / "cache"
    assert main(["fuse", str(MLP), "--validate", "off", "--cache-dir", str(cache)]) == 0
    entry = next(cache.glob("*.dfk"))
    blob = entry.read_bytes()
    for name, damaged in (("truncated", blob[: len(blob) // 2]), ("flipped", blob[:-1] + bytes([blob[-1] ^ 1]))):
        bad = tmp_path / name / entry.name
        bad.parent.mkdir()
        bad.write_bytes(damaged)
        capsys.readouterr()
        assert main(["disasm", str(bad)]) == 1
        err = capsys.readouterr().err
        assert err.startswith("error:") and "not a valid kernel cache entry" in err and len(err.splitlines()) == 1
    renamed = tmp_path / "renamed.dfk"
    renamed.write_bytes(blob)
    assert main(["disasm", str(renamed)]) == 1
