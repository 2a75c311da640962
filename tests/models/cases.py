"""Shared builders for model tests: tiny configs and random inputs."""

from __future__ import annotations

import torch

from taylorshift.models import ClassifierConfig, TransformerClassifier, VisionTransformer

F64 = torch.float64

# (attn_kernel, kernel_args) of every kernel, TaylorShift in both forms
KERNEL_SPECS = [
    ("taylorshift", {"mode": "direct"}),
    ("taylorshift", {"mode": "efficient"}),
    ("softmax", {}),
    ("softmax-naive", {}),
    ("linear", {}),
    ("holt", {}),
]
KERNEL_IDS = [k + (f"-{a['mode']}" if a else "") for k, a in KERNEL_SPECS]

TINY_CLASSIFIER = {"depth": 1, "dim": 16, "num_heads": 2}
TINY_VIT = {"depth": 1, "dim": 16, "num_heads": 2, "img_size": 16, "patch_size": 4}


def tiny_overrides(name: str) -> dict:
    return dict(TINY_VIT if name.startswith("vit") else TINY_CLASSIFIER)


def classifier(seed: int = 0, dtype=F64, **settings) -> TransformerClassifier:
    base = {
        "vocab_size": 11,
        "num_classes": 3,
        "dim": 24,
        "depth": 2,
        "num_heads": 3,
        "mlp_ratio": 2,
        "drop_path": 0.0,
    }
    if settings.get("in_features") is not None:
        base.pop("vocab_size")
    base.update(settings)
    torch.manual_seed(seed)
    return TransformerClassifier(ClassifierConfig(**base), dtype=dtype).eval()


def inputs_for(model, batch: int, length: int, seed: int = 0) -> torch.Tensor:
    """Random inputs of the model's kind: ids (B, N), features (B, N, F) or images."""
    g = torch.Generator().manual_seed(seed)
    cfg = model.config
    dtype = next(model.parameters()).dtype
    if isinstance(model, VisionTransformer):
        shape = (batch, cfg.in_chans, cfg.img_size, cfg.img_size)
        return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    if cfg.vocab_size is not None:
        return torch.randint(0, cfg.vocab_size, (batch, length), generator=g)
    return torch.randn(batch, length, cfg.in_features, generator=g, dtype=torch.float64).to(dtype)


def lengths_mask(lengths: list[int], length: int) -> torch.Tensor:
    """(B, N) bool padding mask, True = real token, sequence b has lengths[b] tokens."""
    return torch.arange(length)[None, :] < torch.tensor(lengths)[:, None]
