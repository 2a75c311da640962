"""Suite-wide fixtures, and Triton's interpreter switched on before anything imports Triton.

Triton reads ``TRITON_INTERPRET`` when its language module is imported: if another library
(transformers checks for Triton at import) loads it first without the variable, the
kernel tests under ``tests/ops/triton`` fail with "Cannot call @triton.jit'd outside of the
scope of a kernel". So it is set here, before any test module is imported, on machines
without CUDA (where those tests run interpreted).
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from taylorshift.ops.taylor_shift import dispatch

# Under pytest-xdist (the default, -n auto) the workers share the cores: each takes its
# share of torch's threads instead of all of them.
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _workers > 1:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // _workers))


@pytest.fixture(autouse=True)
def isolated_cache_dir(tmp_path, monkeypatch):
    """Every test sees an empty cache directory of its own, never the user's calibration.

    ``mode="auto"`` reads the calibration once per process: the test starts with nothing read
    (the next auto call reads the test's directory) and the state before it comes back after.
    Returns the directory (created by whatever writes into it).
    """
    cache = tmp_path / "taylorshift-cache"
    monkeypatch.setenv(dispatch.CACHE_DIR_ENV, str(cache))
    monkeypatch.delenv(dispatch.CALIBRATION_ENV, raising=False)
    monkeypatch.setattr(dispatch, "_loaded", dispatch._UNSET)
    return cache
