"""Token, patch and position embeddings of the encoder models.

Shapes: token sequences are (B, N, dim); images are (B, C, H, W) and become (B, N, dim)
patch tokens, N = (H / patch) · (W / patch). Padding masks are (B, N) bool, True = real.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from .._validate import value_range, values_readable


def sinusoidal_position_embedding(
    length: int, dim: int, *, device=None, dtype=None, base: float = 10000.0
) -> Tensor:
    """Fixed sine/cosine position embedding (Vaswani et al.), (length, dim).

    ``pe[p, 2i] = sin(p / base^(2i/dim))``, ``pe[p, 2i+1] = cos(p / base^(2i/dim))``; an
    odd ``dim`` drops the last cosine. Position p gets the same vector for every length, so
    sequences of any length (and padded batches) see consistent positions.
    """
    positions = torch.arange(length, device=device)
    return sinusoidal_at(positions, dim, dtype=dtype, base=base)


def sinusoidal_at(positions: Tensor, dim: int, *, dtype=None, base: float = 10000.0) -> Tensor:
    """The sinusoidal embedding of the given positions: (...) long -> (..., dim).

    Equal, entry for entry, to the rows of ``sinusoidal_position_embedding``; costs
    O(len(positions) · dim) whatever the positions (a decoding step far into a sequence).
    """
    dtype = dtype or torch.get_default_dtype()
    # float32 arithmetic for every dtype but float64, which gets its own precision (a
    # float64 model is a reference: its positions must not carry float32 rounding)
    work = torch.float64 if dtype == torch.float64 else torch.float32
    half = (dim + 1) // 2
    inv_freq = torch.exp(
        torch.arange(half, device=positions.device, dtype=work) * (-2.0 * math.log(base) / dim)
    )
    angle = positions.to(work)[..., None] * inv_freq
    pe = torch.stack((angle.sin(), angle.cos()), dim=-1).flatten(-2)[..., :dim]
    return pe.to(dtype)


class CosinePositionEmbedding(nn.Module):
    """Adds the fixed sinusoidal embedding to (B, N, dim); any N, no parameters."""

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        """x (B, N, dim); ``positions`` long (B, N) or (N,), default 0..N-1 (decoding, or a
        shard of a sequence, starts later)."""
        if positions is None:
            return x + sinusoidal_position_embedding(
                x.shape[1], self.dim, device=x.device, dtype=x.dtype
            )
        return x + sinusoidal_at(positions.to(x.device), self.dim, dtype=x.dtype)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class LearnedPositionEmbedding(nn.Module):
    """Adds a learned (max_len, dim) table to (B, N, dim); N > max_len is refused."""

    def __init__(self, max_len: int, dim: int, *, device=None, dtype=None):
        super().__init__()
        self.max_len = max_len
        self.weight = nn.Parameter(torch.zeros(max_len, dim, device=device, dtype=dtype))
        nn.init.trunc_normal_(self.weight, std=0.02)

    def forward(self, x: Tensor, positions: Tensor | None = None) -> Tensor:
        """x (B, N, dim); ``positions`` long (B, N) or (N,) in [0, max_len), default 0..N-1."""
        if positions is None:
            self._check_length(x.shape[1])
            return x + self.weight[: x.shape[1]].to(x.dtype)
        # (torch.compile cannot branch on values while tracing: the range check is
        # eager-only; a compiled graph fails in the lookup instead, as for token ids)
        if positions.numel() and values_readable():
            low, high = value_range(positions)
            if low < 0:
                raise ValueError(f"positions must be >= 0; got a position of {low}")
            self._check_length(high + 1)
        return x + self.weight[positions].to(x.dtype)

    def _check_length(self, n: int) -> None:
        if n > self.max_len:
            raise ValueError(
                f"learned position embeddings cover max_len={self.max_len} tokens; got a "
                f"sequence of {n} tokens (use pos_embedding='cosine' for any length)"
            )

    def extra_repr(self) -> str:
        return f"max_len={self.max_len}, dim={self.weight.shape[1]}"


class ConvTokenEmbedding(nn.Module):
    """A 3-layer 1-D CNN over embedded tokens (paper appendix D.5), (B, N, dim) -> same.

    Conv1d(dim, dim, kernel 3, padding 1) three times, GELU between the layers. Padded
    positions are set to zero before every convolution, so a real token next to padding
    sees the same zeros as at the end of an unpadded sequence: padding never leaks into
    real tokens, and a padded batch equals the sequences run one by one.
    """

    def __init__(self, dim: int, *, layers: int = 3, kernel_size: int = 3, device=None, dtype=None):
        super().__init__()
        self.convs = nn.ModuleList(
            nn.Conv1d(dim, dim, kernel_size, padding=kernel_size // 2, device=device, dtype=dtype)
            for _ in range(layers)
        )
        self.act = nn.GELU()

    def forward(self, x: Tensor, padding_mask: Tensor | None = None) -> Tensor:
        keep = None if padding_mask is None else padding_mask[:, None, :]  # (B, 1, N)
        x = x.transpose(1, 2)  # (B, dim, N)
        for i, conv in enumerate(self.convs):
            if keep is not None:
                x = x.masked_fill(~keep, 0.0)
            x = conv(x)
            if i < len(self.convs) - 1:
                x = self.act(x)
        return x.transpose(1, 2)


def _stem_strides(patch_size: int) -> tuple[int, int, int]:
    """Three strides whose product is ``patch_size``: 2, 2, p/4 where p allows."""
    s1 = 2 if patch_size % 2 == 0 else 1
    s2 = 2 if (patch_size // s1) % 2 == 0 else 1
    return s1, s2, patch_size // (s1 * s2)


class PatchEmbedding(nn.Module):
    """Images (B, C, H, W) -> patch tokens (B, (H/p)(W/p), dim), row-major patch order.

    Args:
        patch_size: p; H and W must be multiples of it.
        in_chans: image channels C.
        dim: token width.
        conv_stem: False: one p × p convolution with stride p (linear patch embedding, ViT).
            True: a 3-layer CNN (paper appendix D.5, 2-D): two 3 × 3 convolutions of
            stride 2 (width dim/4, dim/2, GELU after each) and a last convolution whose
            kernel and stride make the total stride p (strides 1 where p is odd).
        device, dtype: where and in which dtype parameters are created.
    """

    def __init__(
        self,
        patch_size: int,
        in_chans: int,
        dim: int,
        *,
        conv_stem: bool = False,
        device=None,
        dtype=None,
    ):
        super().__init__()
        fk = {"device": device, "dtype": dtype}
        self.patch_size, self.in_chans = patch_size, in_chans
        if not conv_stem:
            self.proj = nn.Conv2d(in_chans, dim, patch_size, stride=patch_size, **fk)
        else:
            s1, s2, s3 = _stem_strides(patch_size)
            c1, c2 = max(dim // 4, 1), max(dim // 2, 1)
            self.proj = nn.Sequential(
                nn.Conv2d(in_chans, c1, 3, stride=s1, padding=1, **fk),
                nn.GELU(),
                nn.Conv2d(c1, c2, 3, stride=s2, padding=1, **fk),
                nn.GELU(),
                nn.Conv2d(c2, dim, s3, stride=s3, **fk),
            )

    def forward(self, images: Tensor) -> Tensor:
        p = self.patch_size
        if images.dim() != 4 or images.shape[1] != self.in_chans:
            raise ValueError(
                f"images must be (B, in_chans={self.in_chans}, H, W); got shape "
                f"{tuple(images.shape)}"
            )
        if images.shape[-2] % p or images.shape[-1] % p:
            raise ValueError(
                f"image height and width must be multiples of patch_size={p}; got "
                f"{images.shape[-2]} x {images.shape[-1]}"
            )
        return self.proj(images).flatten(2).transpose(1, 2)  # (B, N, dim)
