"""Registered presets: the paper's models (Table 6), small CPU-sized variants, one per kernel.

========================  =====  =====  =====  ===  ===========  ==========================
name                      depth  dim    heads  MLP  pos. embed.  input
========================  =====  =====  =====  ===  ===========  ==========================
``listops``               4      512    8      2    cosine       20 tokens, ≤ 2000 long
``cifar-pixel``           1      256    4      1    cosine       256 gray levels, 1024 long
``imdb-byte``             4      256    4      4    cosine       258 byte ids, ≤ 4000 long
``vit-tiny``              12     192    3      4    learned      224 px RGB, patch 16
``vit-small``             12     384    6      4    learned      224 px RGB, patch 16
``listops-small``         2      64     4      2    cosine       as ``listops``
``cifar-pixel-small``     1      64     4      1    cosine       as ``cifar-pixel``
``imdb-byte-small``       2      64     4      2    cosine       as ``imdb-byte``
``vit-micro``             4      64     4      2    learned      32 px RGB, patch 4, 10 classes
``lm-tiny``               2      64     4      2    cosine       causal LM, 258 byte ids
``lm-small``              4      128    4      4    cosine       causal LM, 258 byte ids
``lm-base``               6      256    8      4    cosine       causal LM, 258 byte ids
========================  =====  =====  =====  ===  ===========  ==========================

All use dropout 0 and drop path 0.05 (Table 6) and the ``taylorshift`` kernel; the kernel
is an argument (``create_model("listops", attn_kernel="softmax")``), and the old spelling
``<name>-<kernel>`` still works in ``create_model`` (it is not listed). The causal LMs
(``CausalLM``) use dropout and drop path 0. The paper's Table 6 prints
348 for ViT-S's width; 384 (DeiT-S, which it follows) is meant: 348 is not divisible by its 6 heads.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ..data.vocab import BYTE_VOCAB_SIZE, LISTOPS_VOCAB_SIZE, PIXEL_VOCAB_SIZE
from .causal_lm import CausalLM, CausalLMConfig
from .classifier import ClassifierConfig, TransformerClassifier
from .encoder import EncoderClassifier, EncoderConfig, ModelConfigBase
from .registry import register_model
from .vit import VisionTransformer, ViTConfig

_COMMON: dict[str, Any] = {"dropout": 0.0, "drop_path": 0.05}

_LISTOPS = {"vocab_size": LISTOPS_VOCAB_SIZE, "num_classes": 10, "max_len": 2000}
_CIFAR = {"vocab_size": PIXEL_VOCAB_SIZE, "num_classes": 10, "max_len": 1024}
_IMDB = {"vocab_size": BYTE_VOCAB_SIZE, "num_classes": 2, "max_len": 4000}

_Preset = tuple[type[EncoderClassifier], EncoderConfig]


def _classifier(task: dict[str, Any], **size: Any) -> _Preset:
    """A TransformerClassifier for ``task`` (vocabulary, classes, length), Table 6's dropouts."""
    return TransformerClassifier, ClassifierConfig(**size, **task, **_COMMON)


def _vit(**size: Any) -> _Preset:
    """A VisionTransformer with Table 6's dropouts."""
    return VisionTransformer, ViTConfig(**size, **_COMMON)


_PAPER: dict[str, _Preset] = {
    "listops": _classifier(_LISTOPS, depth=4, dim=512, num_heads=8, mlp_ratio=2),
    "cifar-pixel": _classifier(_CIFAR, depth=1, dim=256, num_heads=4, mlp_ratio=1),
    "imdb-byte": _classifier(_IMDB, depth=4, dim=256, num_heads=4, mlp_ratio=4),
    "vit-tiny": _vit(depth=12, dim=192, num_heads=3),
    "vit-small": _vit(depth=12, dim=384, num_heads=6),
}

_SMALL: dict[str, _Preset] = {
    "listops-small": _classifier(_LISTOPS, depth=2, dim=64, num_heads=4, mlp_ratio=2),
    "cifar-pixel-small": _classifier(_CIFAR, depth=1, dim=64, num_heads=4, mlp_ratio=1),
    "imdb-byte-small": _classifier(_IMDB, depth=2, dim=64, num_heads=4, mlp_ratio=2),
    "vit-micro": _vit(
        depth=4, dim=64, num_heads=4, mlp_ratio=2, img_size=32, patch_size=4, num_classes=10
    ),
}


_LM: dict[str, tuple[type[nn.Module], CausalLMConfig]] = {
    "lm-tiny": (CausalLM, CausalLMConfig(depth=2, dim=64, num_heads=4, mlp_ratio=2)),
    "lm-small": (CausalLM, CausalLMConfig(depth=4, dim=128, num_heads=4, mlp_ratio=4)),
    "lm-base": (CausalLM, CausalLMConfig(depth=6, dim=256, num_heads=8, mlp_ratio=4)),
}


def _register(name: str, model_cls: type[nn.Module], config: ModelConfigBase) -> None:
    def entry(*, device=None, dtype=None, **overrides: Any) -> nn.Module:
        return model_cls(config.replace(**overrides), device=device, dtype=dtype)

    entry.__name__ = entry.__qualname__ = name.replace("-", "_")
    entry.__doc__ = f"{model_cls.__name__} preset {name!r}: {config}"
    register_model(name)(entry)


def _register_all() -> None:
    for name, (model_cls, config) in {**_PAPER, **_SMALL, **_LM}.items():
        _register(name, model_cls, config)


_register_all()
