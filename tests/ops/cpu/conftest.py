"""CPU kernel tests: the kernels as a user gets them, a record of what the router loads and
one of what the kernels ran."""

from __future__ import annotations

import pytest

from taylorshift.ops.cpu import build
from taylorshift.ops.taylor_shift import fused
from tests.ops.kernel_spy import Launches, spy_on_c_entry_points


@pytest.fixture(autouse=True)
def kernels_on(monkeypatch):
    """The switch unset (``TAYLORSHIFT_CPU_KERNELS``), whatever the caller's environment."""
    monkeypatch.delenv(build.ENV, raising=False)


@pytest.fixture
def routed(monkeypatch) -> list:
    """The names of the fused kernels ``fused.load_kernel`` hands out during the test (what
    the router chose, not that it ran: ``c_calls``)."""
    calls = []
    real = fused.load_kernel

    def spy(kernel):
        calls.append(kernel)
        return real(kernel)

    monkeypatch.setattr(fused, "load_kernel", spy)
    return calls


@pytest.fixture
def c_calls(monkeypatch) -> Launches:
    """The calls of the kernels' C functions during the test, by name (``ts_direct_forward``,
    ...), on an empty fallback record (tests/ops/kernel_spy.py)."""
    return spy_on_c_entry_points(monkeypatch)
