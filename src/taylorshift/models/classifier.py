"""Transformer encoder classifier for token sequences and continuous inputs (LRA tasks)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from .._validate import check_choice, check_int, check_number, value_range, values_readable
from ..ops.masks import padding_inside, permute_tokens, real_tokens_first
from .embedding import ConvTokenEmbedding
from .encoder import EncoderClassifier, EncoderConfig, check_padding_mask
from .registry import register_model_class

TOKEN_EMBEDDINGS = ("vocab", "linear", "conv")


@dataclass(frozen=True)
class ClassifierConfig(EncoderConfig):
    """``TransformerClassifier`` settings: ``EncoderConfig``'s and the input's.

    Args:
        token_embedding: ``"vocab"``: token ids (B, N) through a ``vocab_size`` embedding
            table; ``"linear"``: features (B, N, ``in_features``) through a linear layer;
            ``"conv"``: either of the two (whichever of ``vocab_size`` / ``in_features`` is
            set) followed by a 3-layer 1-D CNN (paper appendix D.5).
        vocab_size: number of token ids (``"vocab"``, or ``"conv"`` on ids).
        in_features: features per position (``"linear"``, or ``"conv"`` on features).
        max_len: longest sequence; required by ``pos_embedding="learned"`` (cosine
            embeddings take any length and do not enforce it).
        token_init_std: standard deviation of the token ids' embedding table at
            initialisation, N(0, std²). 1 (default, ``nn.Embedding``'s own) matches the unit
            amplitude of the cosine position embedding; 0.02 (GPT-2's and the earlier
            default) lets the positions drown the tokens' identity, which left small models
            unable to match tokens (docs/accuracy.md). Learned positions start at 0.02.
    """

    token_embedding: str = "vocab"
    vocab_size: int | None = None
    in_features: int | None = None
    max_len: int | None = None
    token_init_std: float = 1.0

    def validate(self) -> None:
        super().validate()
        check_number("token_init_std", self.token_init_std, gt=0)
        check_choice("token_embedding", self.token_embedding, TOKEN_EMBEDDINGS)
        for name in ("vocab_size", "in_features", "max_len"):
            check_int(name, getattr(self, name), ge=1, allow_none=True)
        kind = self.token_embedding
        has_vocab, has_features = self.vocab_size is not None, self.in_features is not None
        if kind == "vocab" and (not has_vocab or has_features):
            raise ValueError(
                "token_embedding='vocab' takes token ids: set vocab_size and leave in_features "
                f"None; got vocab_size={self.vocab_size}, in_features={self.in_features}"
            )
        if kind == "linear" and (not has_features or has_vocab):
            raise ValueError(
                "token_embedding='linear' takes features: set in_features and leave vocab_size "
                f"None; got vocab_size={self.vocab_size}, in_features={self.in_features}"
            )
        if kind == "conv" and has_vocab == has_features:
            raise ValueError(
                "token_embedding='conv' needs exactly one of vocab_size (token ids) and "
                f"in_features (features); got vocab_size={self.vocab_size}, "
                f"in_features={self.in_features}"
            )
        if self.pos_embedding == "learned" and self.max_len is None:
            raise ValueError("pos_embedding='learned' needs max_len, the longest sequence")


@register_model_class
class TransformerClassifier(EncoderClassifier):
    """Transformer encoder classifier of token sequences (LRA ListOps, CIFAR pixel, IMDB byte).

    Built from a ``ClassifierConfig``, from keyword settings, or both (settings override the
    config). ``model.config`` holds every setting; ``taylorshift.models.save_model`` stores
    it with the weights.

    Args:
        config: a ``ClassifierConfig`` (or None: built from ``settings``).
        device, dtype: where and in which dtype parameters are created.
        **settings: ``ClassifierConfig`` fields; an unknown name raises TypeError listing
            the valid ones.

    Example::

        model = TransformerClassifier(vocab_size=20, num_classes=10, dim=64, num_heads=4)
        logits = model(tokens, padding_mask)        # (B, N) ids, (B, N) bool -> (B, 10)
    """

    config_class = ClassifierConfig
    config: ClassifierConfig

    def __init__(
        self, config: ClassifierConfig | None = None, *, device=None, dtype=None, **settings: Any
    ):
        config = self._config_from(config, settings)
        super().__init__(config, config.max_len, device=device, dtype=dtype)
        fk = {"device": device, "dtype": dtype}
        if config.vocab_size is not None:
            self.embed: nn.Module = nn.Embedding(config.vocab_size, config.dim, **fk)
        else:
            self.embed = nn.Linear(config.in_features, config.dim, **fk)
        conv = config.token_embedding == "conv"
        self.conv = ConvTokenEmbedding(config.dim, **fk) if conv else None
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """The encoder's initialisation, then the token table ~ N(0, token_init_std²)."""
        super().reset_parameters()
        if isinstance(getattr(self, "embed", None), nn.Embedding):
            nn.init.normal_(self.embed.weight, std=self.config.token_init_std)

    def _check_inputs(self, inputs: Tensor, padding_mask: Tensor | None) -> None:
        cfg = self.config
        if cfg.vocab_size is not None:
            if inputs.dim() != 2 or not _is_int_dtype(inputs.dtype):
                raise ValueError(
                    f"inputs must be integer token ids of shape (B, N); got dtype {inputs.dtype}, "
                    f"shape {tuple(inputs.shape)}"
                )
        elif inputs.dim() != 3 or inputs.shape[-1] != cfg.in_features:
            raise ValueError(
                f"inputs must be features of shape (B, N, in_features={cfg.in_features}); got "
                f"shape {tuple(inputs.shape)}"
            )
        check_padding_mask(padding_mask, inputs.shape[0], inputs.shape[1])

    def embed_tokens(self, inputs: Tensor, padding_mask: Tensor | None = None) -> Tensor:
        """Inputs -> (B, N, dim) before position embedding.

        Padded positions' inputs are replaced by zeros (id 0) first, so whatever they hold
        (a pad id, -100, NaN) never reaches a real token, a loss or a gradient.
        """
        if padding_mask is not None:
            keep = padding_mask if inputs.dim() == 2 else padding_mask[..., None]
            inputs = inputs.masked_fill(~keep, 0)
        # (on accelerators an out-of-range id trips a device-side assert instead of a sync;
        # a graph traced by torch.compile cannot branch on values and leaves it to the lookup)
        checked = inputs.device.type == "cpu" and values_readable()
        if self.config.vocab_size is not None and checked and inputs.numel():
            low, high = value_range(inputs)
            if low < 0 or high >= self.config.vocab_size:
                raise ValueError(
                    f"token ids must be in [0, vocab_size={self.config.vocab_size}); got ids "
                    f"from {low} to {high}"
                )
        x = self.embed(inputs)
        if self.conv is not None:
            x = self.conv(x, padding_mask)
        return x

    def forward_features(self, inputs: Tensor, padding_mask: Tensor | None = None) -> Tensor:
        """(B, N) ids or (B, N, in_features) -> (B, N (+1, CLS first), dim), after the norm.

        Padding may sit anywhere (right, left, between real tokens): the trunk runs on each
        row's real tokens moved to the front in their order (positions 0, 1, … and the
        convolutions see them as one unpadded sequence), and the rows are put back."""
        self._check_inputs(inputs, padding_mask)
        if padding_mask is None or not padding_inside(padding_mask):
            return self._encode(self.embed_tokens(inputs, padding_mask), padding_mask)
        order, inverse = real_tokens_first(padding_mask)
        inputs = inputs.gather(1, order) if inputs.dim() == 2 else permute_tokens(inputs, order)
        padding_mask = padding_mask.gather(1, order)
        features = self._encode(self.embed_tokens(inputs, padding_mask), padding_mask)
        cls = features.shape[1] - inverse.shape[1]  # (1 with a CLS token first)
        return torch.cat([features[:, :cls], permute_tokens(features[:, cls:], inverse)], 1)

    def forward(self, inputs: Tensor, padding_mask: Tensor | None = None) -> Tensor:
        """Logits (B, num_classes).

        Args:
            inputs: token ids (B, N) (``vocab_size`` set) or features (B, N, in_features).
            padding_mask: optional (B, N) bool, True = real token, padding anywhere.
                Padded positions do not change any output: the logits equal those of the
                unpadded sequences (``forward_features``).
        """
        features = self.forward_features(inputs, padding_mask)
        return self.head(self._pool(features, padding_mask))


def _is_int_dtype(dtype: torch.dtype) -> bool:
    return not dtype.is_floating_point and not dtype.is_complex and dtype != torch.bool
