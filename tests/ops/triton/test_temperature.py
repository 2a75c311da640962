"""A per-head float32 temperature with float16 inputs in the Triton kernels (direct, full and
causal; efficient, non-causal and causal), the temperature's gradient included, against the
same kernel on float32 inputs with the same τ (tests/ops/cpu/test_temperature.py says why
and how; its ``check_temperature`` runs here). Float16 only: Triton's interpreter, which
runs these tests on the CPU, has no bfloat16.

The float16 run rounds more than its result here (q' and k' before the direct kernel, the
operands of the kernels' products), so the output is held to SPEC §8's rule rather than to
the float32 run rounded, and the per-head gradient scales to u, the unit roundoff of
float16 (measured up to 0.37 u on this problem; a τ rounded to bfloat16 moves them by 7 u).
"""

from __future__ import annotations

import pytest
import torch

from tests.ops.cpu.test_temperature import (
    NEAR_ONE,
    UNIT_ROUNDOFF,
    Problem,
    check_temperature,
    kernel_key_mask,
)
from tests.ops.triton.conftest import TRITON_MISSING

pytest.importorskip("triton", reason=TRITON_MISSING)

from taylorshift.ops.triton.direct import triton_direct_taylor_shift
from taylorshift.ops.triton.efficient import triton_efficient_taylor_shift
from taylorshift.ops.triton.efficient_causal import triton_causal_efficient_taylor_shift

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
CHUNK = 16  # two chunks of the causal form over 32 tokens: the prefix state is read
# B·N·d = 512 entries a head for the gradient scales; interpreted, each run takes ~1 s
PROBLEM = Problem(1, 3, 32, 16, 8, NEAR_ONE, padded=True)
U = UNIT_ROUNDOFF[torch.float16]
# ∂L/∂τ = Σ ∂L/∂q'·q/‖q‖ sums terms of both signs, each from a float16 ∂L/∂q': measured
# within 5.3e-4 of the float32 run's here (3.2e-4 in the CPU kernels, which round less)
TAU_GRAD_BOUND = 4 * U


def direct(q, k, v, mask, tau):
    return triton_direct_taylor_shift(q, k, v, mask, False, tau, None, True)


def direct_causal(q, k, v, mask, tau):
    return triton_direct_taylor_shift(q, k, v, mask, True, tau, None, True)


def efficient(q, k, v, mask, tau):
    return triton_efficient_taylor_shift(q, k, v, kernel_key_mask(mask, q, k), tau, None, True)


def causal(q, k, v, mask, tau):
    key_mask = kernel_key_mask(mask, q, k)
    return triton_causal_efficient_taylor_shift(q, k, v, key_mask, tau, None, True, CHUNK)


FORMS = {  # name: (form(q, k, v, mask (B, 1, 1, Nk) or None, τ), is_causal)
    "direct": (direct, False),
    "direct-causal": (direct_causal, True),
    "efficient": (efficient, False),
    "causal": (causal, True),
}


@pytest.mark.parametrize("name", list(FORMS))
def test_float16_inputs_take_the_float32_temperature(name):
    form, is_causal = FORMS[name]
    check_temperature(
        form, PROBLEM, torch.float16, is_causal=is_causal, exact_output=False,
        scale_bound=U, tau_grad_bound=TAU_GRAD_BOUND, device=DEVICE,
    )  # fmt: skip
