"""Input shapes other than the model's: a specialisation per shape (the graph re-typed, planned on its own,
sharing the kernel cache and calibration), reported as drift; a model whose own shapes forbid it says why."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from engine_helpers import model

from dynfuse.cli import main
from fusion.engine.engine import FusionEngine
from fusion.engine.errors import EngineError
from fusion.errors import ShapeError
from fusion.graph.shapes import with_input_shapes
from fusion.reference.interpreter import evaluate
from fusion.reference.quantized import evaluate_quantized

MODELS = Path(__file__).resolve().parents[1] / "models"


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
def test_another_batch_size_is_a_cached_specialisation(dtype: str) -> None:
    graph, x = model("mlp")
    engine = FusionEngine(graph, "base", dtype)
    first = engine.run(x)
    batch9 = {"input": np.random.default_rng(5).standard_normal((9, 32)).astype(np.float32)}
    other = engine.run(batch9)
    wider = engine.for_inputs(batch9)
    assert wider is not engine and wider.graph.types[graph.outputs[0]].shape == (9, 10)
    assert [d.reason for d in other.drifts][:1] == ["shapes -> [[9, 32]]"]
    out = graph.outputs[0]
    retyped = with_input_shapes(graph, {"input": (9, 32)})  # the reference runs the re-typed graph independently
    if dtype == "int8":
        assert wider.mc.params is engine.mc.params  # the calibration made on the first call is shared
        want = evaluate_quantized(retyped, batch9, engine.mc.params)[out]
        np.testing.assert_array_equal(other.outputs[out], want.data.astype(np.float32) * np.float32(want.scale))
    else:
        np.testing.assert_allclose(other.outputs[out], evaluate(retyped, batch9)[out], rtol=1e-5, atol=1e-5)
    plan = engine.plan
    back = engine.run(x)  # the model's shape again: the same plan, every kernel from the cache
    assert engine.plan is plan and all(r.cache_hit for r in back.records)
    np.testing.assert_array_equal(back.outputs[out], first.outputs[out])
    again = engine.run(batch9)
    assert engine.for_inputs(batch9) is wider and all(r.cache_hit for r in again.records)
    assert engine.run(batch9).drifts == ()  # the same shapes as the call before: no drift


def test_a_shape_the_model_forbids_is_a_clear_error(tmp_path: Path, capsys) -> None:
    graph, x = model("encoder_post_d64")
    engine = FusionEngine(graph, "base", "fp32")
    longer = {graph.inputs[0]: np.zeros((2, 3, 64), np.float32)}
    with pytest.raises(EngineError, match=r"cannot run at input shapes .* node 'node_unsqueeze' \(Reshape\)"):
        engine.run(longer)
    np.save(tmp_path / "src.npy", longer[graph.inputs[0]])
    assert main(["fuse", str(MODELS / "encoder_post_d64.onnx"), "--input", f"src={tmp_path / 'src.npy'}"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "cannot run at input shapes" in err


def test_with_input_shapes_re_infers_every_node() -> None:
    graph, _ = model("resnet_block")
    bigger = with_input_shapes(graph, {"x": (1, 8, 24, 20)})
    assert bigger.types[graph.outputs[0]].shape == (1, 8, 24, 20)
    assert all(bigger.types[n.outputs[0]].shape[2:] == (24, 20) for n in bigger.nodes)
    with pytest.raises(ShapeError, match="no input"):
        with_input_shapes(graph, {"y": (1,)})
    with pytest.raises(ShapeError, match="Conv"):
        with_input_shapes(graph, {"x": (1, 3, 16, 16)})  # the weights have 8 input channels
