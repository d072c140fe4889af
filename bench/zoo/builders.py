"""Torch modules of the zoo, built from seeded random weights (never downloaded): one float input, one output.

Imports torch, torchvision and transformers, so only the export process loads this module. torchvision's C
extension does not load with the local CPU torch; its model definitions are pure Python, so an empty
`torchvision._meta_registrations` is registered first (see /work/shared/TOOLCHAIN.md). transformers model
classes import torchvision too.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable

sys.modules.setdefault("torchvision._meta_registrations", types.ModuleType("torchvision._meta_registrations"))

import torch  # noqa: E402
from torch import nn  # noqa: E402


@torch.no_grad()
def randomise_norms(module: nn.Module, gen: torch.Generator) -> None:
    """Non-trivial normalisation parameters: torchvision's BatchNorms start as identities and HF norms at 1/0,
    which would let a wrong folding or a missing scale pass unnoticed."""
    for norm in module.modules():
        is_rms = type(norm).__name__.endswith("RMSNorm")
        if isinstance(norm, nn.BatchNorm2d | nn.BatchNorm1d | nn.LayerNorm) or is_rms:
            shape = norm.weight.shape
            norm.weight.copy_(torch.rand(shape, generator=gen) + 0.5)
            if getattr(norm, "bias", None) is not None:
                norm.bias.copy_(torch.randn(shape, generator=gen) * 0.1)
        if isinstance(norm, nn.BatchNorm2d | nn.BatchNorm1d):
            norm.running_mean.copy_(torch.randn(shape, generator=gen) * 0.1)
            norm.running_var.copy_(torch.rand(shape, generator=gen) + 0.5)


class InputsEmbeds(nn.Module):
    """An HF model called with a float `inputs_embeds` tensor; its `last_hidden_state` is the output.

    With `mask`, an all-ones attention mask is built from the input's shape, as a tokenizer's mask would be: HF
    decoders otherwise derive "packed sequence" indices from the position ids with `aten::diff`, which the
    legacy exporter cannot export.
    """

    def __init__(self, model: nn.Module, keyword: str = "inputs_embeds", mask: bool = False) -> None:
        super().__init__()
        self.model = model
        self.keyword = keyword
        self.mask = mask

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        extra = {"attention_mask": torch.ones(x.shape[:2], dtype=torch.long)} if self.mask else {}
        return self.model(**{self.keyword: x}, **extra).last_hidden_state


def _eager(config):
    config._attn_implementation = "eager"
    return config


def _torchvision(name: str, **kwargs) -> nn.Module:
    import torchvision.models as tvm

    return getattr(tvm, name)(weights=None, **kwargs)


def resnet18() -> nn.Module:
    return _torchvision("resnet18")


def resnet50() -> nn.Module:
    return _torchvision("resnet50")


def mobilenet_v2() -> nn.Module:
    return _torchvision("mobilenet_v2")


def vit() -> nn.Module:
    from torchvision.models.vision_transformer import VisionTransformer

    model = VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=64, mlp_dim=128)
    model.heads = nn.Linear(64, 10)  # torchvision zero-initialises the head: a seeded random one instead
    return model


def bert() -> nn.Module:
    from transformers import BertConfig, BertModel

    config = BertConfig(
        vocab_size=64,
        hidden_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=512,
        max_position_embeddings=64,
    )
    return InputsEmbeds(BertModel(_eager(config), add_pooling_layer=False))


def gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2Model

    config = GPT2Config(vocab_size=64, n_positions=64, n_embd=128, n_layer=2, n_head=2, activation_function="gelu_new")
    config.use_cache = False
    return InputsEmbeds(GPT2Model(_eager(config)), mask=True)


def llama() -> nn.Module:
    from transformers import LlamaConfig, LlamaModel

    config = LlamaConfig(
        vocab_size=64,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        use_cache=False,
    )
    return InputsEmbeds(LlamaModel(_eager(config)), mask=True)


def whisper_encoder() -> nn.Module:
    from transformers import WhisperConfig
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    config = WhisperConfig(
        num_mel_bins=16,
        d_model=64,
        encoder_layers=1,
        encoder_attention_heads=2,
        encoder_ffn_dim=128,
        max_source_positions=16,  # the input has twice as many frames: conv2 has stride 2
        vocab_size=64,
    )
    return InputsEmbeds(WhisperEncoder(_eager(config)), keyword="input_features")


BUILDERS: dict[str, Callable[[], nn.Module]] = {
    "resnet18": resnet18,
    "resnet50": resnet50,
    "mobilenet_v2": mobilenet_v2,
    "vit": vit,
    "bert": bert,
    "gpt2": gpt2,
    "llama": llama,
    "whisper_encoder": whisper_encoder,
}


def build(name: str, seed: int) -> nn.Module:
    """The model `name` in eval mode, every parameter drawn from `seed`."""
    torch.manual_seed(seed)
    model = BUILDERS[name]()
    randomise_norms(model, torch.Generator().manual_seed(seed + 1))
    return model.eval()
