"""Triton kernel tests. Without a CUDA device they run on the CPU under Triton's interpreter.

``TRITON_INTERPRET=1`` must be in the environment before ``triton.jit`` wraps a kernel (when
our kernel modules are imported), so it is set here, before any test module of this folder
is imported. Test modules skip themselves, with the reason, when triton is not installed
(``pytest.importorskip("triton")``); CI without the ``triton`` extra skips this folder.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

TRITON_MISSING = (
    "triton is not installed (pip install 'taylorshift[triton]'); the Triton kernel tests "
    "need it (on the CPU they run under TRITON_INTERPRET=1)"
)


@pytest.fixture
def launches(monkeypatch):
    """The Triton kernels' launches during the test, by kernel name, and an empty fallback
    record (tests/ops/kernel_spy.py)."""
    pytest.importorskip("triton", reason=TRITON_MISSING)
    from tests.ops.kernel_spy import spy_on_triton_launches

    return spy_on_triton_launches(monkeypatch)
