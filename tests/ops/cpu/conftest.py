"""CPU kernel tests: the kernels as a user gets them, and a record of what the router loads."""

from __future__ import annotations

import pytest

from taylorshift.ops.cpu import build
from taylorshift.ops.taylor_shift import fused


@pytest.fixture(autouse=True)
def kernels_on(monkeypatch):
    """The switch unset (``TAYLORSHIFT_CPU_KERNELS``), whatever the caller's environment."""
    monkeypatch.delenv(build.ENV, raising=False)


@pytest.fixture
def routed(monkeypatch) -> list:
    """The names of the fused kernels ``fused.load_kernel`` hands out during the test."""
    calls = []
    real = fused.load_kernel

    def spy(kernel):
        calls.append(kernel)
        return real(kernel)

    monkeypatch.setattr(fused, "load_kernel", spy)
    return calls
