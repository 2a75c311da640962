"""Vision Transformer: patch embedding, then the shared encoder trunk (paper's ImageNet Ti/S)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor

from .._validate import check_choice, check_int
from .embedding import PatchEmbedding
from .encoder import EncoderClassifier, EncoderConfig
from .registry import register_model_class

PATCH_EMBEDDINGS = ("linear", "conv")


@dataclass(frozen=True)
class ViTConfig(EncoderConfig):
    """``VisionTransformer`` settings: ``EncoderConfig``'s (ViT-Ti defaults) and the image's.

    Args:
        img_size: square image side in pixels; a multiple of ``patch_size``. Learned position
            embeddings fix it; cosine ones take any multiple of ``patch_size``.
        patch_size: square patch side p; each patch is one token.
        in_chans: image channels.
        patch_embedding: ``"linear"`` (one p × p convolution of stride p, as ViT) or
            ``"conv"`` (a 3-layer CNN stem of total stride p, paper appendix D.5).
    """

    num_classes: int = 1000
    dim: int = 192
    depth: int = 12
    num_heads: int = 3
    pos_embedding: str = "learned"
    img_size: int = 224
    patch_size: int = 16
    in_chans: int = 3
    patch_embedding: str = "linear"

    def validate(self) -> None:
        super().validate()
        for name in ("img_size", "patch_size", "in_chans"):
            check_int(name, getattr(self, name), ge=1)
        check_choice("patch_embedding", self.patch_embedding, PATCH_EMBEDDINGS)
        if self.img_size % self.patch_size:
            raise ValueError(
                f"img_size must be a multiple of patch_size; got img_size={self.img_size}, "
                f"patch_size={self.patch_size}"
            )

    @property
    def num_patches(self) -> int:
        return (self.img_size // self.patch_size) ** 2


@register_model_class
class VisionTransformer(EncoderClassifier):
    """Vision Transformer (ViT) with any attention kernel: images (B, C, H, W) -> logits.

    Patches -> tokens (row-major), position embedding, the shared encoder trunk (CLS or
    mean pooling) and a linear head. Built from a ``ViTConfig``, keyword settings, or both.

    Args:
        config: a ``ViTConfig`` (or None: built from ``settings``).
        device, dtype: where and in which dtype parameters are created.
        **settings: ``ViTConfig`` fields; an unknown name raises TypeError listing the
            valid ones.
    """

    config_class = ViTConfig
    config: ViTConfig

    def __init__(
        self, config: ViTConfig | None = None, *, device=None, dtype=None, **settings: Any
    ):
        config = self._config_from(config, settings)
        super().__init__(config, config.num_patches, device=device, dtype=dtype)
        self.patch_embed = PatchEmbedding(
            config.patch_size,
            config.in_chans,
            config.dim,
            conv_stem=config.patch_embedding == "conv",
            device=device,
            dtype=dtype,
        )
        self.reset_parameters()

    def forward_features(self, images: Tensor) -> Tensor:
        """(B, C, H, W) -> (B, patches (+1, CLS first), dim), after the final norm."""
        cfg = self.config
        tokens = self.patch_embed(images)  # checks the shape
        if cfg.pos_embedding == "learned" and tuple(images.shape[-2:]) != (cfg.img_size,) * 2:
            raise ValueError(
                f"learned position embeddings fix the image size to {cfg.img_size} x "
                f"{cfg.img_size}; got {tuple(images.shape[-2:])}"
            )
        return self._encode(tokens, None)

    def forward(self, images: Tensor) -> Tensor:
        """Logits (B, num_classes) of images (B, in_chans, H, W)."""
        return self.head(self._pool(self.forward_features(images), None))
