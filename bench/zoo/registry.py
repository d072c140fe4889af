"""The zoo's models as data: name, family, exporter and input shapes (no torch import, so listing is cheap).

A model has a `small` input (the test suite runs it) and, for some, a `full` input (the bench's full-size
measurement, too slow for the suite). Adding a model: a `ZooSpec` here and its builder in `builders.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Exporter = Literal["legacy", "dynamo"]
SIZES = ("small", "full")


@dataclass(frozen=True)
class ZooSpec:
    """One zoo model: `shapes` maps a size name to the input shape of `x` (float32)."""

    name: str
    family: str
    exporter: Exporter
    shapes: tuple[tuple[str, tuple[int, ...]], ...]
    summary: str

    def shape(self, size: str) -> tuple[int, ...]:
        for known, shape in self.shapes:
            if known == size:
                return shape
        have = ", ".join(known for known, _ in self.shapes)
        raise KeyError(f"zoo model {self.name!r} has no {size!r} input (sizes: {have})")

    @property
    def sizes(self) -> tuple[str, ...]:
        return tuple(size for size, _ in self.shapes)


SPECS: tuple[ZooSpec, ...] = (
    ZooSpec(
        "resnet18",
        "cnn",
        "legacy",
        (("small", (1, 3, 64, 64)), ("full", (1, 3, 224, 224))),
        "torchvision resnet18, random weights, seeded BatchNorm statistics",
    ),
    ZooSpec(
        "resnet50",
        "cnn",
        "legacy",
        (("small", (1, 3, 64, 64)),),
        "torchvision resnet50 (bottleneck blocks), random weights, seeded BatchNorm statistics",
    ),
    ZooSpec(
        "mobilenet_v2",
        "cnn",
        "legacy",
        (("small", (1, 3, 64, 64)),),
        "torchvision mobilenet_v2: depthwise convs, ReLU6 (Clip), inverted residuals",
    ),
    ZooSpec(
        "vit",
        "transformer",
        "dynamo",
        (("small", (1, 3, 32, 32)),),
        "torchvision VisionTransformer: image 32, patch 8, 2 layers, hidden 64, 2 heads, 10 classes",
    ),
    ZooSpec(
        "bert",
        "transformer",
        "legacy",
        (("small", (1, 16, 128)),),
        "transformers BertModel: 2 layers, hidden 128, 2 heads, fed through inputs_embeds",
    ),
    ZooSpec(
        "gpt2",
        "transformer",
        "legacy",
        (("small", (1, 16, 128)),),
        "transformers GPT2Model: 2 layers, hidden 128, 2 heads, gelu_new, fed through inputs_embeds",
    ),
    ZooSpec(
        "llama",
        "transformer",
        "legacy",
        (("small", (1, 16, 128)),),
        "transformers LlamaModel: 2 layers, hidden 128, 4 query heads / 2 KV heads (GQA), RMSNorm, rotary, SiLU MLP",
    ),
    ZooSpec(
        "whisper_encoder",
        "speech",
        "legacy",
        (("small", (1, 16, 32)),),
        "transformers WhisperEncoder: 16 mel bins x 32 frames, Conv1d + GELU front end, 1 layer, hidden 64",
    ),
)

NAMES: tuple[str, ...] = tuple(spec.name for spec in SPECS)


def spec(name: str) -> ZooSpec:
    """The spec named `name`; a KeyError listing the zoo otherwise."""
    for candidate in SPECS:
        if candidate.name == name:
            return candidate
    raise KeyError(f"no zoo model {name!r} (the zoo: {', '.join(NAMES)})")
