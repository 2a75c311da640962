"""Shared cases for the nn tests: kernels by name with their options, modules in float64."""

from __future__ import annotations

import torch

from taylorshift.nn import PROJECTIONS, Attention

F64 = torch.float64

# id -> (attn_kernel, kernel_args): every kernel, and the options that change its code path.
KERNEL_SPECS = {
    "taylorshift-direct": ("taylorshift", {"mode": "direct"}),
    "taylorshift-efficient": ("taylorshift", {"mode": "efficient"}),
    "softmax": ("softmax", {}),
    "softmax-naive": ("softmax-naive", {}),
    "linear": ("linear", {}),
    "holt": ("holt", {}),
    "holt-subtract-one": ("holt", {"subtract_one": True}),
}
KERNEL_IDS = list(KERNEL_SPECS)
# Kernels that drop whole keys for attn_drop (the others drop attention weights).
KEY_DROPOUT_IDS = ["taylorshift-direct", "taylorshift-efficient", "linear", "holt"]
# Kernels that take masks varying over queries (holt and the efficient form refuse them).
GENERAL_MASK_IDS = ["taylorshift-direct", "softmax", "softmax-naive", "linear"]
PROJECTION_IDS = list(PROJECTIONS)


def spread_temperature(module: torch.nn.Module, seed: int = 0) -> None:
    """Give each TaylorShift head its own τ, so that a mix-up of heads shows."""
    g = torch.Generator().manual_seed(seed + 100)
    for m in module.modules():
        t = getattr(m, "temperature", None)
        if isinstance(t, torch.Tensor) and t.dim() == 4:
            with torch.no_grad():
                t.copy_(0.5 + 1.5 * torch.rand(t.shape, generator=g, dtype=t.dtype))


def make_attention(
    kernel_id: str = "taylorshift-direct",
    projection: str = "standard",
    dim: int = 12,
    num_heads: int = 3,
    context_len: int | None = 10,
    seed: int = 0,
    **kwargs,
) -> Attention:
    """A float64 ``Attention`` with seeded weights (context_len only for ``super``)."""
    name, kernel_args = KERNEL_SPECS[kernel_id]
    torch.manual_seed(seed)
    module = Attention(
        dim,
        num_heads,
        qkv_bias=True,
        attn_kernel=name,
        kernel_args=dict(kernel_args),
        projection=projection,
        context_len=context_len if projection == "super" else None,
        dtype=F64,
        **kwargs,
    )
    spread_temperature(module, seed)
    return module


def randn(*shape: int, seed: int = 0, requires_grad: bool = False) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=F64).requires_grad_(requires_grad)


def padding(lengths: list[int], n: int) -> torch.Tensor:
    """(B, N) key padding, True = real token."""
    return torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]


def param_grads(module: torch.nn.Module, y: torch.Tensor, g_out: torch.Tensor, *extra):
    """{name: gradient} of <y, g_out> for every parameter of ``module`` and the ``extra``
    tensors (named ``input0``, ...); an unused parameter gets zeros."""
    named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    named += [(f"input{i}", t) for i, t in enumerate(extra)]
    grads = torch.autograd.grad(y, [t for _, t in named], g_out, allow_unused=True)
    return {
        n: torch.zeros_like(t) if g is None else g for (n, t), g in zip(named, grads, strict=True)
    }
