"""Export the small end-to-end test models to ONNX (run once; the .onnx/.npz files are committed test data).

    python tests/fusion/models/export_models.py

Each model is exported with torch.onnx.export(..., dynamo=True, external_data=False, opset_version=17) and saved
with a sample input and torch's output for it (`<name>.npz`, keys input / output), so tests can compare against
torch without torch installed. Seeds are fixed; re-running gives the same weights.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx_ir as ir
import torch
from onnxscript.optimizer import fold_constants, remove_unused_nodes
from torch import nn

HERE = Path(__file__).resolve().parent


class BasicBlock(nn.Module):
    """ResNet basic block: Conv-BN-ReLU-Conv-BN + identity residual, then ReLU."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + x)


@torch.no_grad()
def _randomise_norms(module: nn.Module, gen: torch.Generator) -> None:
    """Give BatchNorm/LayerNorm non-trivial statistics and affine parameters (defaults are 1/0: too easy)."""
    for norm in module.modules():
        if isinstance(norm, nn.BatchNorm2d | nn.LayerNorm):
            shape = norm.weight.shape
            norm.weight.copy_(torch.rand(shape, generator=gen) + 0.5)
            norm.bias.copy_(torch.randn(shape, generator=gen) * 0.1)
        if isinstance(norm, nn.BatchNorm2d):
            norm.running_mean.copy_(torch.randn(shape, generator=gen) * 0.1)
            norm.running_var.copy_(torch.rand(shape, generator=gen) + 0.5)


def encoder(d_model: int, ff: int, norm_first: bool, activation: str) -> nn.Module:
    layer = nn.TransformerEncoderLayer(
        d_model,
        nhead=4,
        dim_feedforward=ff,
        dropout=0.0,
        activation=activation,
        batch_first=True,
        norm_first=norm_first,
    )
    _randomise_norms(layer, torch.Generator().manual_seed(d_model + norm_first))
    return layer


def models() -> dict[str, tuple[nn.Module, tuple[int, ...]]]:
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 10))
    block = BasicBlock(8)
    _randomise_norms(block, torch.Generator().manual_seed(1))
    return {
        "mlp": (mlp, (4, 32)),
        "encoder_post_d64": (encoder(64, 128, False, "relu"), (2, 8, 64)),
        "encoder_pre_d64": (encoder(64, 128, True, "gelu"), (2, 8, 64)),
        "encoder_post_d128": (encoder(128, 256, False, "gelu"), (1, 16, 128)),
        "resnet_block": (block, (1, 8, 16, 16)),
    }


def _fold_constants_only(path: Path) -> None:
    """Fold constant subgraphs (Shape/Expand of weights) but keep BatchNormalization: dynfuse folds BN itself."""
    model = ir.load(path)
    fold_constants(model)
    remove_unused_nodes(model)
    ir.save(model, path)


def export(name: str, model: nn.Module, shape: tuple[int, ...], out_dir: Path) -> Path:
    model.eval()
    x = torch.randn(shape, generator=torch.Generator().manual_seed(42))
    path = out_dir / f"{name}.onnx"
    keep_batchnorm = any(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    with torch.no_grad():
        y = model(x)
        torch.onnx.export(
            model, (x,), str(path), dynamo=True, external_data=False, opset_version=17, optimize=not keep_batchnorm
        )
    if keep_batchnorm:
        _fold_constants_only(path)
    np.savez(out_dir / f"{name}.npz", input=x.numpy(), output=y.numpy())
    return path


def main(out_dir: Path = HERE) -> int:
    for name, (model, shape) in models().items():
        path = export(name, model, shape, out_dir)
        print(f"{path.name}: {path.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE))
