"""What the fused kernels really ran, for the routing tests: launches counted where they
happen, not the router's choice, its log line or ``fused.load_kernel`` (a router that
chooses, logs and loads a kernel, then runs the PyTorch form, passes all three).

- ``spy_on_c_entry_points``: every ``ts_*`` function of the loaded CPU kernels
  (``build.library()``, the one library every C call of ``ops/cpu`` goes through), wrapped
  on the library object itself, counted per C name;
- ``spy_on_triton_launches``: every ``*_kernel`` of ``ops/triton`` launched
  (``kernel[grid](...)`` calls the kernel object's ``run``, compiled or interpreted),
  counted per kernel name; warm-ups are not launches.

Both call through to the real kernels, start the test on an empty fallback record
(``fused.FAILED``: a kernel that failed and left the call to the PyTorch form, by shape
class; an earlier test's failure must not keep this one off its kernel) and undo it all with
the test's ``monkeypatch``. ``Launches.ran`` asserts that kernels ran and nothing fell back.
"""

from __future__ import annotations

import collections
import ctypes
import importlib

import pytest

from taylorshift.ops.taylor_shift import fused

TRITON_MODULES = ("direct", "efficient", "efficient_causal")


class Launches(collections.Counter):
    """Launches (C calls, Triton kernel launches) by name since the spy began or ``clear``."""

    def ran(self, *names: str) -> None:
        """Each of ``names`` launched at least once, and no kernel fell back to PyTorch."""
        missing = [name for name in names if self[name] == 0]
        assert not missing, f"never launched: {missing}; launched: {dict(self)}"
        no_fallback()

    def none(self) -> None:
        """Nothing launched (a call the PyTorch forms compute)."""
        assert not self, f"kernels launched: {dict(self)}"


def no_fallback() -> None:
    """No kernel failed and left its call to the PyTorch form (``fused.disable``'s record)."""
    assert fused.FAILED == {}, f"a kernel fell back to the PyTorch form: {fused.FAILED}"


def _fresh_fallback_record(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fused, "FAILED", {})


def spy_on_c_entry_points(monkeypatch: pytest.MonkeyPatch) -> Launches:
    """Count the calls of the CPU kernels' C functions (``ts_efficient_forward``,
    ``ts_direct_backward``, ...) by name; builds the kernels if they are not yet."""
    from taylorshift.ops.cpu import build

    lib = build.library()
    calls = Launches()
    # ctypes keeps each declared function on the library object (``build._declare``); the
    # wrappers look them up there per call (``getattr(library(), name)``)
    for name, entry in list(vars(lib).items()):
        if name.startswith("ts_") and isinstance(entry, ctypes._CFuncPtr):
            monkeypatch.setattr(lib, name, _counted_c(calls, name, entry))
    _fresh_fallback_record(monkeypatch)
    return calls


def _counted_c(calls: Launches, name: str, entry):
    def call(*args):
        calls[name] += 1
        return entry(*args)

    return call


def spy_on_triton_launches(monkeypatch: pytest.MonkeyPatch) -> Launches:
    """Count the launches of the Triton kernels (``_direct_fwd_kernel``, ``_grad_kernel``,
    ...) by name; imports Triton."""
    from triton.runtime.jit import KernelInterface

    launches = Launches()
    seen = set()
    for module_name in TRITON_MODULES:
        module = importlib.import_module(f"taylorshift.ops.triton.{module_name}")
        for name, kernel in vars(module).items():
            if (
                name.endswith("_kernel")
                and isinstance(kernel, KernelInterface)
                and id(kernel) not in seen
            ):
                seen.add(id(kernel))
                # on the instance, over the class's ``run``: undone by deleting it again
                monkeypatch.setitem(vars(kernel), "run", _counted_launch(launches, name, kernel))
    assert seen, "no Triton kernel found to spy on"
    _fresh_fallback_record(monkeypatch)
    return launches


def _counted_launch(launches: Launches, name: str, kernel):
    run = kernel.run

    def launch(*args, grid, warmup, **kwargs):
        if not warmup:
            launches[name] += 1
        return run(*args, grid=grid, warmup=warmup, **kwargs)

    return launch
