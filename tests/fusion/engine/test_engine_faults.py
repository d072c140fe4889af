"""Faults the engine must survive with right answers: a poisoned or misplaced disk-cache entry, a hostile cache
directory, a fused kernel that traps or never halts, NaN calibration data, a constant left GEMM operand, and the
kernel cache reaching the disk from the CLI."""

from __future__ import annotations

import os
import threading
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from engine_helpers import MODELS, linear_relu_graph

from assembler.source import assemble
from dynfuse.cli import main
from fusion.engine.cache import KernelCache, decode_entry, encode_kernel
from fusion.engine.engine import EngineOptions, FusionEngine, cycle_budget
from fusion.engine.errors import EngineError
from fusion.engine.kernel import build_kernel
from fusion.engine.plan import Group
from fusion.engine.validation import ValidationPolicy
from fusion.graph.builder import GraphBuilder
from fusion.graph.ops import OpType
from fusion.quant.params import QuantizationError
from fusion.reference.interpreter import run
from fusion.reference.quantized import run_quantized
from isa.encoding import decode, encode, make

ALWAYS = EngineOptions(policy="dynamic", validation=ValidationPolicy("always"), workers=1)


def _x(seed: int = 9) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal((64, 128)).astype(np.float32)}


def _word(line: str) -> int:
    return assemble(f".text\n.kernel k\n{line}\nhalt\n.endkernel\n").text[0]


def _injecting(line: str):
    """A builder whose fused kernels start with `line` (a trap, or a jump to itself)."""

    def build(mc, group, sparsity):
        kernel = build_kernel(mc, group, sparsity)
        if not group.fused:
            return kernel
        text = (_word(line), *kernel.program.text[1:])
        return replace(kernel, program=replace(kernel.program, text=text))

    return build


@pytest.mark.parametrize("line", ["lw x1, -4(x0)", "spin: jal x0, spin"], ids=["trap", "never_halts"])
def test_a_fused_kernel_that_traps_or_never_halts_falls_back_and_is_blocked(tmp_path: Path, line: str) -> None:
    graph, inputs = linear_relu_graph(), _x()
    cache = KernelCache(disk_dir=tmp_path)
    host = replace(ALWAYS, execution="host")  # (a builder replaces host-dispatched kernels; the program's faults
    # are injected into its generators: test_program_engine.py)
    engine = FusionEngine(graph, "base", "int8", host, cache=cache, samples=[inputs], builder=_injecting(line))
    want = run_quantized(graph, inputs, engine.mc.params)["relu"]
    res = engine.run(inputs)
    np.testing.assert_array_equal(res.outputs["relu"], want)
    (event,) = engine.events
    assert event.nodes == ("fc", "relu") and "evicted, blocked" in event.action
    assert ("trapped" if line.startswith("lw") else "over its cycle budget") in event.action
    (gemm,) = [r for r in res.records if "fc" in r.nodes]
    assert gemm.fallback.startswith("validation failed") and gemm.schedule == "unfused"
    fused_on_disk = [p for p in tmp_path.glob("*.dfk") if decode_entry(p.read_bytes(), p.stem).group.fused]
    assert not fused_on_disk  # evicted from the disk too: a later process does not meet it
    again = engine.run(inputs)
    np.testing.assert_array_equal(again.outputs["relu"], want)
    assert len(engine.events) == 1


def test_cycle_budget_is_a_bounded_multiple_of_the_prediction() -> None:
    assert cycle_budget(1e6, 10**9) == 16 * 10**6
    assert cycle_budget(10, 10**9) == 200_000  # a model predicting far too few still leaves room
    assert cycle_budget(1e12, 10**7) == 10**7  # never past the machine's watchdog


def _wrong_requant(kernel):
    """The kernel with every requantization shift one larger: outputs halved, the program still valid."""
    text = list(kernel.program.text)
    for pc, word in enumerate(text):
        ins = decode(word)
        if ins.mnemonic in ("ep.cfg", "v.rqnt"):
            fields = ins.by_name()
            fields["shift"] += 1
            text[pc] = encode(make(ins.mnemonic, *(fields[f.name] for f in ins.spec.fields)))
    assert text != list(kernel.program.text)
    return replace(kernel, program=replace(kernel.program, text=tuple(text)))


def test_a_poisoned_baseline_entry_with_a_valid_checksum_cannot_fail_a_correct_fused_kernel(tmp_path: Path) -> None:
    graph, inputs = linear_relu_graph(), _x()
    first = FusionEngine(graph, "base", "int8", ALWAYS, cache=KernelCache(disk_dir=tmp_path), samples=[inputs])
    want = run_quantized(graph, inputs, first.mc.params)["relu"]
    first.run(inputs)
    entries = {p.stem: decode_entry(p.read_bytes(), p.stem) for p in tmp_path.glob("*.dfk")}
    (key,) = [k for k, kernel in entries.items() if kernel.group == Group(("fc",), "unfused")]
    KernelCache(disk_dir=tmp_path).replace(key, _wrong_requant(entries[key]))  # a valid entry, wrong code
    second = FusionEngine(graph, "base", "int8", ALWAYS, cache=KernelCache(disk_dir=tmp_path), samples=[inputs])
    res = second.run(inputs)
    np.testing.assert_array_equal(res.outputs["relu"], want)
    assert not second.events and not second.blocked  # the fused kernel was right and stays in use
    assert any(r.schedule != "unfused" and "fc" in r.nodes and r.validated for r in res.records)
    healed = decode_entry((tmp_path / f"{key}.dfk").read_bytes(), key)
    assert healed.program == entries[key].program  # the poisoned entry was replaced by a fresh build


@pytest.fixture(scope="module")
def kernel():
    graph, inputs = linear_relu_graph(m=16, k=32, n=32), {"x": np.ones((16, 32), np.float32)}
    engine = FusionEngine(graph, "base", "fp32", EngineOptions(workers=1))
    engine.run(inputs)
    return build_kernel(engine.mc, Group(("fc",), "unfused"))


def test_an_entry_under_another_keys_name_is_rejected(tmp_path: Path, kernel) -> None:
    KernelCache(disk_dir=tmp_path).get_or_build("a" * 64, lambda: kernel)
    os.replace(tmp_path / f"{'a' * 64}.dfk", tmp_path / f"{'b' * 64}.dfk")
    cache = KernelCache(disk_dir=tmp_path)
    got, _ = cache.get_or_build("b" * 64, lambda: kernel)
    assert got is kernel and cache.stats.disk_rejected == 1 and cache.stats.disk_hits == 0


def _get_within(cache: KernelCache, key: str, kernel, seconds: float = 20.0):
    done = []
    t = threading.Thread(target=lambda: done.append(cache.get_or_build(key, lambda: kernel)), daemon=True)
    t.start()
    t.join(seconds)
    assert done, "the cache lookup hung"
    return done[0]


@pytest.mark.parametrize("entry", ["fifo", "dev_zero", "directory", "huge", "nested_json"])
def test_hostile_cache_entries_are_skipped_without_hanging(tmp_path: Path, kernel, entry: str) -> None:
    key = "c" * 64
    path = tmp_path / f"{key}.dfk"
    if entry == "fifo":
        os.mkfifo(path)
    elif entry == "dev_zero":
        path.symlink_to("/dev/zero")
    elif entry == "directory":
        path.mkdir()
    elif entry == "huge":
        with path.open("wb") as f:
            f.truncate((256 << 20) + 1)  # sparse: no disk used
    else:
        import hashlib

        from fusion.engine.cache import CACHE_VERSION, MAGIC

        head = b'{"key": "' + key.encode() + b'", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
        payload = len(head).to_bytes(4, "little") + head
        path.write_bytes(MAGIC + CACHE_VERSION.to_bytes(4, "little") + hashlib.sha256(payload).digest() + payload)
    cache = KernelCache(disk_dir=tmp_path)
    got, hit = _get_within(cache, key, kernel)
    assert got is kernel and not hit and cache.stats.disk_rejected == 1


def test_an_unwritable_cache_degrades_to_memory_with_one_warning(tmp_path: Path, kernel, monkeypatch) -> None:
    def full(*args, **kw):
        raise OSError(28, "No space left on device")

    cache = KernelCache(disk_dir=tmp_path)
    monkeypatch.setattr(os, "replace", full)
    with pytest.warns(RuntimeWarning, match="memory only") as caught:
        for i in range(3):
            cache.get_or_build(f"{i}" * 64, lambda: kernel)
    assert len(caught) == 1 and cache.disk is None and len(cache) == 3
    assert not list(tmp_path.iterdir())  # no .tmp-* left behind


def test_a_cache_directory_that_cannot_be_made_degrades_to_memory(tmp_path: Path, kernel) -> None:
    (tmp_path / "file").write_text("")
    with pytest.warns(RuntimeWarning, match="memory only"):
        cache = KernelCache(disk_dir=tmp_path / "file" / "cache")
    assert cache.get_or_build("k", lambda: kernel) == (kernel, False)


def test_fuse_cache_dir_reaches_the_disk_and_api_limits_are_kept(tmp_path: Path, capsys) -> None:
    cache_dir = tmp_path / "kc"
    model = MODELS / "mlp.onnx"
    assert main(["fuse", str(model), "--cache-dir", str(cache_dir), "--workers", "1"]) == 0
    written = sorted(p.name for p in cache_dir.glob("*.dfk"))
    assert written and not list(cache_dir.glob(".tmp-*"))
    for p in cache_dir.glob("*.dfk"):
        assert decode_entry(p.read_bytes(), p.stem) is not None
    assert main(["fuse", str(model), "--cache-dir", str(cache_dir), "--workers", "1", "--json"]) == 0
    assert '"disk_hits": 0' not in capsys.readouterr().out
    small = KernelCache(max_entries=2)
    engine = FusionEngine(linear_relu_graph(), "base", "fp32", EngineOptions(workers=1), cache=small)
    assert engine.cache is small
    engine.run(_x())
    assert len(small) <= 2


def test_non_finite_int8_calibration_data_is_an_error_naming_the_input() -> None:
    graph = linear_relu_graph()
    for bad in (np.nan, np.inf):
        x = _x()["x"]
        x[3, 5] = bad
        with pytest.raises(QuantizationError, match=r"input 'x' has 1 non-finite"):
            FusionEngine(graph, "base", "int8", EngineOptions(workers=1)).run({"x": x})


@pytest.mark.parametrize("op", ["MatMul", "Gemm"])
@pytest.mark.parametrize("dtype", ["fp32", "int8"])
def test_a_constant_left_operand_runs_under_every_policy(op: str, dtype: str) -> None:
    rng = np.random.default_rng(0)
    b = GraphBuilder("w_at_x")
    x = b.input("x", (48, 32))
    w = b.constant(rng.standard_normal((40, 48)).astype(np.float32), "W")
    args = (w, x) if op == "MatMul" else (w, x, b.constant(rng.standard_normal(32).astype(np.float32), "bias"))
    b.output(b.op(OpType.Relu, b.op(getattr(OpType, op), *args, name="mm"), name="relu"))
    graph = b.build()
    inputs = {"x": rng.standard_normal((48, 32)).astype(np.float32)}
    for policy in ("none", "static", "dynamic"):
        engine = FusionEngine(graph, "base", dtype, EngineOptions(policy=policy, workers=1))
        got = engine.run(inputs).outputs["relu"]
        if dtype == "int8":
            np.testing.assert_array_equal(got, run_quantized(graph, inputs, engine.mc.params)["relu"])
        else:
            np.testing.assert_allclose(got, run(graph, inputs)["relu"], rtol=1e-4, atol=1e-4)


def test_encode_kernel_names_its_key(kernel) -> None:
    assert b'"key": "k1"' in encode_kernel("k1", kernel)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        KernelCache()  # no disk, no warning


def _matmul_model(path: Path, m: int, k: int, n: int) -> Path:
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "b"], ["y"])],
        "mm",
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, [m, k]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, [k, n]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_fuse_refuses_a_model_too_big_for_dram_before_allocating_inputs(tmp_path: Path, capsys) -> None:
    import resource

    model = _matmul_model(tmp_path / "big.onnx", 1, 1_000_000, 1000)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert main(["fuse", str(model), "--workers", "1"]) == 1
    err = capsys.readouterr().err
    assert "graph input 'b' (3.73 GiB) does not fit the base machine's 512 MiB of DRAM" in err
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 512 << 10  # KiB: no 7 GiB of inputs
    with pytest.raises(EngineError, match="does not fit the tiny machine"):
        FusionEngine(model, "tiny", "fp32", EngineOptions(workers=1))


@pytest.mark.parametrize("value", [3e38, -3.4e38, 1e-45])
def test_inputs_near_the_float32_limits_are_profiled(tmp_path: Path, capsys, value: float) -> None:
    model = _matmul_model(tmp_path / "small.onnx", 8, 16, 8)
    np.save(tmp_path / "a.npy", np.full((8, 16), value, np.float32))
    assert main(["fuse", str(model), "--workers", "1", "--input", f"a={tmp_path / 'a.npy'}"]) == 0
    assert "Traceback" not in capsys.readouterr().err


def test_fuse_with_an_unusable_cache_dir_warns_once_in_one_line(tmp_path: Path, capsys) -> None:
    (tmp_path / "file").write_text("")
    assert main(["fuse", str(MODELS / "mlp.onnx"), "--workers", "1", "--cache-dir", str(tmp_path / "file" / "kc")]) == 0
    warned = [line for line in capsys.readouterr().err.splitlines() if "warning" in line.lower()]
    assert warned == [
        f"warning: kernel cache {tmp_path / 'file' / 'kc'} is not usable (Not a directory); continuing in memory only"
    ]
