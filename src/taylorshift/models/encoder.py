"""What the encoder models share: the config fields and the trunk after the embedding.

Trunk: position embedding -> dropout -> [CLS] prepended (``pooling="cls"``) -> ``depth``
pre-norm ``Block``s -> LayerNorm -> pooling -> linear head. Padding masks (B, N), True = real
token, go to every block as key padding; the CLS token is always attended; mean pooling
averages real tokens only. Padded queries are computed but never read, so a padded batch
gives the same logits as its sequences run one by one.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from .._validate import check_bool, check_choice, check_int, check_probability
from ..nn import PROJECTIONS, Block, canonical_projection, list_kernels
from ..nn.attention import check_kv_heads
from ..nn.block import mlp_width
from ..nn.kernels import check_kernel_options
from .embedding import CosinePositionEmbedding, LearnedPositionEmbedding

POS_EMBEDDINGS = ("cosine", "learned")
POOLINGS = ("cls", "mean")


def check_kernel_args(kernel_args: Any) -> None:
    """kernel_args must be a JSON-serialisable dict (it is saved with the weights)."""
    if not isinstance(kernel_args, dict):
        raise TypeError(f"kernel_args must be a dict; got {type(kernel_args).__name__}")
    try:
        json.dumps(kernel_args)
    except (TypeError, ValueError) as err:
        raise TypeError(
            f"kernel_args must be JSON-serialisable (it is saved with the weights); got "
            f"{kernel_args!r}: {err}"
        ) from None


class ModelConfigBase:
    """What every model config dataclass shares: checked ``replace`` and dict round trips.

    Subclasses are frozen dataclasses with a ``validate()`` called from ``__post_init__``;
    ``save_model`` stores ``to_dict()`` with the weights and ``load_model`` calls
    ``from_dict``.
    """

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def _check_keys(cls, keys) -> None:
        unknown = sorted(set(keys) - set(cls.field_names()))
        if unknown:
            raise TypeError(
                f"{cls.__name__} has no setting {', '.join(map(repr, unknown))}; valid "
                f"settings: {', '.join(sorted(cls.field_names()))}"
            )

    def replace(self, **overrides: Any):
        """A copy with ``overrides`` applied and validated; unknown keys raise TypeError."""
        self._check_keys(overrides)
        return dataclasses.replace(self, **overrides)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, settings: dict[str, Any]):
        """Build from a dict (e.g. parsed JSON); unknown keys raise TypeError."""
        cls._check_keys(settings)
        return cls(**settings)


@dataclass(frozen=True)
class TrunkConfig(ModelConfigBase):
    """The fields of every Transformer trunk (``EncoderConfig``'s and ``CausalLMConfig``'s).

    Frozen: ``config.replace(**overrides)`` returns a validated copy.

    Args:
        dim: model width d_emb.
        depth: number of Transformer blocks.
        num_heads: attention heads (``dim`` must be divisible by it).
        mlp_ratio: MLP hidden width / ``dim``.
        qkv_bias: biases on the q/k/v projections.
        qk_norm: LayerNorm on each head's queries and keys.
        attn_kernel: a name from ``taylorshift.nn.list_kernels()``.
        kernel_args: that kernel's options, e.g. ``{"mode": "efficient"}``; must be
            JSON-serialisable (it is saved in the weights file).
        projection: one of the subclass's ``projections`` (see ``taylorshift.nn.Attention``).
        pos_embedding: ``"cosine"`` (fixed sinusoidal, any length) or ``"learned"``.
        dropout: dropout after the embedding and in every block (after the attention
            output projection and in the MLP).
        attn_drop: attention dropout; its meaning depends on the kernel (``taylorshift.nn``).
        drop_path: stochastic depth of the last block; it rises linearly from 0 at the first.
        short_conv: taps of the short convolution on q, k, v over the sequence in every
            attention layer (``taylorshift.nn.Attention``); 0: none.
        num_kv_heads: key/value heads of every attention layer, a divisor of ``num_heads``
            (grouped-query attention, projection ``standard``: ``taylorshift.nn.Attention``);
            None: as many as ``num_heads``.
    """

    #: The projections this kind of model accepts.
    projections: ClassVar[tuple[str, ...]] = PROJECTIONS

    dim: int = 256
    depth: int = 4
    num_heads: int = 4
    mlp_ratio: float = 4.0
    qkv_bias: bool = True
    qk_norm: bool = False
    attn_kernel: str = "taylorshift"
    kernel_args: dict[str, Any] = field(default_factory=dict)
    projection: str = "standard"
    pos_embedding: str = "cosine"
    dropout: float = 0.0
    attn_drop: float = 0.0
    drop_path: float = 0.0
    short_conv: int = 0
    num_kv_heads: int | None = None

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ValueError/TypeError naming the first bad field, its expected and its value."""
        check_trunk(self, self.projections)


@dataclass(frozen=True)
class EncoderConfig(TrunkConfig):
    """Settings shared by the encoder models; every field is saved with the weights.

    Frozen: ``config.replace(**overrides)`` returns a validated copy.

    Args:
        dim, depth, num_heads, mlp_ratio, qkv_bias, qk_norm, attn_kernel, kernel_args,
            pos_embedding, dropout, attn_drop, drop_path: as ``TrunkConfig``.
        projection: ``standard``, ``optimized``, ``query-only`` or ``super`` (see
            ``taylorshift.nn.Attention``).
        short_conv: as ``TrunkConfig``; centred in encoders.
        num_classes: outputs of the classification head.
        context_len: ℓ of ``projection="super"``: the most tokens it takes, CLS included.
        pooling: ``"cls"`` (a learned CLS token, its output feeds the head) or ``"mean"``
            (average of the real tokens' outputs).
    """

    num_classes: int = 10
    context_len: int | None = None
    pooling: str = "cls"

    def validate(self) -> None:
        check_int("num_classes", self.num_classes, ge=1)
        check_int("context_len", self.context_len, ge=1, allow_none=True)
        super().validate()
        check_choice("pooling", self.pooling, POOLINGS)


def check_trunk(config: Any, projections: tuple[str, ...]) -> None:
    """Check the fields every Transformer trunk config has (width, depth, heads, MLP, flags,
    kernel, projection, positions, dropouts); errors name the field."""
    for name in ("dim", "depth", "num_heads"):
        check_int(name, getattr(config, name), ge=1)
    if config.dim % config.num_heads:
        raise ValueError(
            f"dim must be divisible by num_heads; got dim={config.dim}, "
            f"num_heads={config.num_heads}"
        )
    mlp_width(config.dim, config.mlp_ratio)
    check_bool("qkv_bias", config.qkv_bias)
    check_bool("qk_norm", config.qk_norm)
    check_choice("attn_kernel", config.attn_kernel, list_kernels())
    if config.projection != (projection := canonical_projection(config.projection)):
        object.__setattr__(config, "projection", projection)  # an old name, renamed
    check_choice("projection", config.projection, projections)
    check_choice("pos_embedding", config.pos_embedding, POS_EMBEDDINGS)
    for name in ("dropout", "attn_drop", "drop_path"):
        check_probability(name, getattr(config, name))
    if check_int("short_conv", config.short_conv, ge=0) and config.projection == "super":
        raise ValueError("short_conv needs projection 'standard', 'optimized' or 'query-only'")
    check_kernel_args(config.kernel_args)
    check_kernel_options(config.attn_kernel, config.kernel_args)
    local_heads = config.kernel_args.get("local_heads", 0)
    check_kv_heads(config.num_kv_heads, config.num_heads, config.projection, local_heads)


def position_embedding(kind: str, dim: int, max_len: int | None, *, device=None, dtype=None):
    """``"cosine"`` (any length, no parameters) or ``"learned"`` (up to ``max_len``)."""
    if kind == "learned":
        if max_len is None:
            raise ValueError("pos_embedding='learned' needs max_len, the longest sequence")
        return LearnedPositionEmbedding(max_len, dim, device=device, dtype=dtype)
    return CosinePositionEmbedding(dim)


def transformer_blocks(config, *, context_len=None, device=None, dtype=None) -> nn.ModuleList:
    """``config.depth`` pre-norm ``Block``s from a model config's fields; stochastic depth
    rises linearly from 0 at the first block to ``config.drop_path`` at the last."""
    depth = config.depth
    rates = [config.drop_path * i / max(depth - 1, 1) for i in range(depth)]
    return nn.ModuleList(
        Block(
            config.dim,
            config.num_heads,
            config.mlp_ratio,
            qkv_bias=config.qkv_bias,
            qk_norm=config.qk_norm,
            attn_drop=config.attn_drop,
            proj_drop=config.dropout,
            drop_path=rate,
            attn_kernel=config.attn_kernel,
            kernel_args=dict(config.kernel_args),
            projection=config.projection,
            context_len=context_len,
            short_conv=config.short_conv,
            num_kv_heads=config.num_kv_heads,
            device=device,
            dtype=dtype,
        )
        for rate in rates
    )


@torch.no_grad()
def init_linear_layers(model: nn.Module) -> None:
    """Linear and embedding weights ~ N(0, 0.02²) truncated, biases 0; other layers keep
    their own initialisation."""
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.trunc_normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)


class EncoderClassifier(nn.Module):
    """Base of the encoder models: the trunk after the token/patch embedding.

    Subclasses set ``config_class``, build their embedding after ``super().__init__`` and
    then call ``reset_parameters()``.
    """

    config_class: ClassVar[type[EncoderConfig]] = EncoderConfig

    def __init__(self, config: EncoderConfig, max_len: int | None, *, device=None, dtype=None):
        super().__init__()
        fk = {"device": device, "dtype": dtype}
        self.config = config = copy.deepcopy(config)  # kernel_args is a dict: own it
        dim = config.dim
        self.pos_embed = position_embedding(config.pos_embedding, dim, max_len, **fk)
        self.pos_drop = nn.Dropout(config.dropout)
        self.cls_token = (
            nn.Parameter(torch.zeros(1, 1, dim, **fk)) if config.pooling == "cls" else None
        )
        self.blocks = transformer_blocks(config, context_len=config.context_len, **fk)
        self.norm = nn.LayerNorm(dim, **fk)
        self.head = nn.Linear(dim, config.num_classes, **fk)

    @classmethod
    def _config_from(cls, config: EncoderConfig | None, settings: dict[str, Any]):
        """A subclass's config from its ``__init__(config=None, **settings)``: built from
        ``settings`` when ``config`` is None, else ``config`` with ``settings`` applied;
        TypeError when it is not a ``config_class``."""
        if config is None:
            config = cls.config_class.from_dict(settings)
        elif settings:
            config = config.replace(**settings)
        if not isinstance(config, cls.config_class):
            name = cls.config_class.__name__
            raise TypeError(f"config must be a {name}; got {type(config).__name__}")
        return config

    @classmethod
    def from_config(cls, config: EncoderConfig | dict[str, Any], *, device=None, dtype=None):
        """Build from a config object or a dict of its fields."""
        if isinstance(config, dict):
            config = cls.config_class.from_dict(config)
        return cls(config, device=device, dtype=dtype)

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Linear and embedding weights ~ N(0, 0.02²) truncated, biases 0, CLS ~ N(0, 0.02²).

        Convolutions, norms, TaylorShift temperatures and ``super``'s alignment matrix keep
        their own initialisation.
        """
        init_linear_layers(self)
        if self.cls_token is not None:
            nn.init.trunc_normal_(self.cls_token, std=0.02)

    def _encode(self, x: Tensor, padding_mask: Tensor | None) -> Tensor:
        """Embedded tokens (B, N, dim) -> normalised outputs (B, N (+1 CLS first), dim)."""
        x = self.pos_drop(self.pos_embed(x))
        if self.cls_token is not None:
            b = x.shape[0]
            x = torch.cat((self.cls_token.expand(b, -1, -1).to(x.dtype), x), dim=1)
            if padding_mask is not None:
                padding_mask = torch.cat((padding_mask.new_ones(b, 1), padding_mask), dim=1)
        for block in self.blocks:
            x = block(x, attn_mask=padding_mask)
        return self.norm(x)

    def _pool(self, features: Tensor, padding_mask: Tensor | None) -> Tensor:
        """(B, N', dim) -> (B, dim): the CLS output, or the mean over real tokens."""
        if self.cls_token is not None:
            return features[:, 0]
        if padding_mask is None:
            return features.mean(dim=1)
        weights = padding_mask.to(features.dtype)[..., None]  # (B, N, 1)
        return (features * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)

    def extra_repr(self) -> str:
        return f"attn_kernel={self.config.attn_kernel!r}"


def check_padding_mask(
    padding_mask: Tensor | None, batch: int, length: int, name: str = "padding_mask"
) -> None:
    if padding_mask is None:
        return
    if not isinstance(padding_mask, Tensor) or padding_mask.dtype != torch.bool:
        what = padding_mask.dtype if isinstance(padding_mask, Tensor) else type(padding_mask)
        raise TypeError(f"{name} must be a bool tensor (True = real token); got {what}")
    if tuple(padding_mask.shape) != (batch, length):
        raise ValueError(
            f"{name} must be (B, N) = ({batch}, {length}); got {tuple(padding_mask.shape)}"
        )
