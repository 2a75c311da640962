"""The efficient form never holds an N × d² tensor and saves only O(N d) for backward.

Deterministic structural checks (no timing): every tensor that forward and backward create
is recorded through a dispatch mode; the tensors autograd keeps are recorded through
saved-tensor hooks. Measured peak memory lives in benchmarks/op_cpu/.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from taylorshift import taylor_shift_attention
from taylorshift.ops.cpu.wrapper import state_shape
from taylorshift.ops.taylor_shift.efficient import CHUNK_ELEMENTS
from taylorshift.ops.taylor_shift.features import feature_dim


class LargestTensor(TorchDispatchMode):
    """Records the largest number of elements of any tensor an op returns."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_no_full_sequence_feature_tensor(causal):
    b, h, n, d = 1, 2, 16_384, 48
    q, k, v = (torch.randn(b, h, n, d, requires_grad=True) for _ in range(3))
    mask = torch.ones(b, 1, 1, n, dtype=torch.bool)
    full_features = b * h * n * d * (d + 1) // 2
    # Allowed: one chunk of features (an element budget) or a tensor of the inputs' size
    # (gradients, and the (N, dv + 1) gradient of numerator and denominator).
    allowed = max(CHUNK_ELEMENTS, b * h * n * (d + 1))
    assert full_features > 4 * allowed  # the check below can tell the two apart
    with LargestTensor() as probe:
        y = taylor_shift_attention(q, k, v, mask, causal, mode="efficient")
        y.sum().backward()
    assert probe.largest <= allowed, (probe.largest, allowed)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_saved_for_backward_is_inputs_output_and_small_state(causal):
    b, h, n, d = 1, 2, 2048, 16
    q, k, v = (torch.randn(b, h, n, d, requires_grad=True) for _ in range(3))
    t = torch.ones(1, h, 1, 1, requires_grad=True)
    saved = []

    def pack(x):
        saved.append(x)
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        taylor_shift_attention(q, k, v, is_causal=causal, temperature=t, mode="efficient")
    stored = {x.data_ptr(): x.numel() * x.element_size() for x in saved}
    inputs_and_output = 4 * b * h * n * d * 4 + t.numel() * 4
    denominators = b * h * n * 4
    # the state and key moments (PyTorch form) or the state in the CPU kernels' layout (its
    # pair rows and columns padded to multiples of 6) and the attended-key counts
    torch_state = feature_dim(d) * (d + 1) + d + d * d
    kernel_state = math.prod(state_shape(d, d + 1)) + 1
    state = b * h * max(torch_state, kernel_state) * 4
    assert sum(stored.values()) <= inputs_and_output + denominators + state
