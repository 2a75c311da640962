"""Pre-norm Transformer block: x + DropPath(Attn(LN(x))), then x + DropPath(MLP(LN(x)))."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .._inference import inference_only
from .._validate import check_number, check_probability
from .attention import Attention


class DropPath(nn.Module):
    """Stochastic depth: drop the whole residual branch per sample with probability p."""

    def __init__(self, p: float = 0.0):
        super().__init__()
        check_probability("drop_path", p)
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        keep = torch.rand((x.shape[0],) + (1,) * (x.dim() - 1), device=x.device) >= self.p
        return x * keep.to(x.dtype) / (1.0 - self.p)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class Mlp(nn.Module):
    """Linear -> activation -> dropout -> Linear -> dropout."""

    def __init__(
        self, dim: int, hidden: int, act_layer=nn.GELU, drop: float = 0.0, device=None, dtype=None
    ):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden, device=device, dtype=dtype)
        self.act = act_layer()
        self.fc2 = nn.Linear(hidden, dim, device=device, dtype=dtype)
        self.drop = nn.Dropout(drop)

    def forward(self, x: Tensor) -> Tensor:
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


def mlp_width(dim: int, mlp_ratio: float) -> int:
    """The MLP's hidden width, ``int(dim * mlp_ratio)``; a ratio that leaves it 0 wide is
    refused (the block would have no MLP at all, and no error until its weights)."""
    width = int(dim * check_number("mlp_ratio", mlp_ratio, gt=0))
    if width < 1:
        raise ValueError(
            f"mlp_ratio must leave the MLP at least 1 wide (int(dim * mlp_ratio) >= 1); got "
            f"mlp_ratio={mlp_ratio} for dim={dim}"
        )
    return width


class Block(nn.Module):
    """Pre-norm Transformer block with any attention kernel and projection variant.

    Args:
        dim: model width.
        num_heads: attention heads.
        mlp_ratio: MLP hidden width / dim.
        qkv_bias, qk_norm, proj_bias, attn_drop, proj_drop: as ``Attention``.
        drop_path: stochastic-depth probability of both residual branches.
        norm_layer: the norm before attention and MLP (default ``nn.LayerNorm``).
        act_layer: the MLP activation (default ``nn.GELU``).
        attn_kernel, kernel_args, projection, context_len, short_conv, num_kv_heads: as
            ``Attention``.
        device, dtype: where and in which dtype parameters are created.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        qk_norm: bool = False,
        proj_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        drop_path: float = 0.0,
        norm_layer=None,
        act_layer=None,
        *,
        attn_kernel: str = "taylorshift",
        kernel_args: dict | None = None,
        projection: str = "standard",
        context_len: int | None = None,
        short_conv: int = 0,
        num_kv_heads: int | None = None,
        device=None,
        dtype=None,
    ):
        super().__init__()
        fk = {"device": device, "dtype": dtype}
        norm_layer = norm_layer or nn.LayerNorm
        hidden = mlp_width(dim, mlp_ratio)
        self.norm1 = norm_layer(dim, **fk)
        self.attn = Attention(
            dim,
            num_heads,
            qkv_bias=qkv_bias,
            qk_norm=qk_norm,
            proj_bias=proj_bias,
            attn_drop=attn_drop,
            proj_drop=proj_drop,
            norm_layer=norm_layer,
            attn_kernel=attn_kernel,
            kernel_args=kernel_args,
            projection=projection,
            context_len=context_len,
            short_conv=short_conv,
            num_kv_heads=num_kv_heads,
            **fk,
        )
        self.drop_path = DropPath(drop_path)
        self.norm2 = norm_layer(dim, **fk)
        self.mlp = Mlp(dim, hidden, act_layer or nn.GELU, proj_drop, **fk)

    def forward(
        self, x: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False
    ) -> Tensor:
        x = x + self.drop_path(self.attn(self.norm1(x), attn_mask=attn_mask, is_causal=is_causal))
        return x + self.drop_path(self.mlp(self.norm2(x)))

    @inference_only
    def decode(self, x: Tensor, cache, key_padding_mask: Tensor | None = None) -> Tensor:
        """Causal block for T new tokens (B, T, dim) after those in ``cache`` (see
        ``Attention.decode``); inference only."""
        x = x + self.attn.decode(self.norm1(x), cache, key_padding_mask)
        return x + self.mlp(self.norm2(x))
