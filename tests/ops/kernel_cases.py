"""Shared cases of the efficient-form kernel tests (non-causal and causal): the problem
description, its inputs in a low precision and in float64, and the calls."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from taylorshift import naive_taylor_shift_attention
from tests.helpers import key_padding


@dataclass(frozen=True)
class Case:
    b: int
    h: int
    nq: int
    nk: int
    d: int
    dv: int
    mask: str | None = None  # None, "padding" (random lengths) or "empty" (batch 0 all padded)
    normalize: bool = True
    temperature: str = "tensor"  # "tensor" (per head, requires grad) or "float"

    @property
    def id(self) -> str:
        parts = [f"B{self.b}-H{self.h}-Nq{self.nq}-Nk{self.nk}-d{self.d}-dv{self.dv}"]
        parts.append(self.mask or "nomask")
        parts.append(f"norm-{self.temperature}-temp" if self.normalize else "plain-scores")
        return "-".join(parts)


def make_problem(case: Case, dtype: torch.dtype, seed: int = 0):
    """Low-precision leaves, float64 leaves with the same values, the mask and the options."""
    g = torch.Generator().manual_seed(seed)
    shapes = [
        (case.b, case.h, case.nq, case.d),
        (case.b, case.h, case.nk, case.d),
        (case.b, case.h, case.nk, case.dv),
    ]
    low = [torch.randn(s, generator=g).to(dtype) for s in shapes]
    if case.normalize and case.temperature == "tensor":
        low.append(1.0 + torch.rand(1, case.h, 1, 1, generator=g))  # float32, per head
    high = [x.double().requires_grad_() for x in low]
    low = [x.requires_grad_() for x in low]

    mask = None
    if case.mask is not None:
        mask = key_padding(case.b, case.nk, seed=seed, empty_row=case.mask == "empty")
    if case.normalize:
        opts = dict(normalize=True, temperature=1.5 if case.temperature == "float" else None)
    else:
        opts = dict(normalize=False, temperature=1.0)
    return low, high, mask, opts


def temperature_of(inputs, opts):
    return inputs[3] if opts["temperature"] is None else opts["temperature"]


def call_reference(inputs, mask, opts, *, is_causal: bool = False):
    return naive_taylor_shift_attention(
        *inputs[:3],
        mask,
        is_causal=is_causal,
        temperature=temperature_of(inputs, opts),
        normalize=opts["normalize"],
    )


def key_mask_of(mask, case: Case):
    """The validated key mask: (B, H, Nk) bool, a broadcast view as check_inputs makes it."""
    return None if mask is None else mask[:, :, 0, :].expand(case.b, case.h, case.nk)


def call_form(form, inputs, mask, opts, case: Case, **kwargs):
    """A form (Triton or torch) on validated inputs."""
    key_mask = key_mask_of(mask, case)
    return form(
        *inputs[:3], key_mask, temperature_of(inputs, opts), None, opts["normalize"], **kwargs
    )


def grads(y, inputs, g):
    return torch.autograd.grad(y, inputs, g.to(y.dtype))
