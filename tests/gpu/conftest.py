"""CUDA tests: every fused kernel compiled and run on a GPU (benchmarks/gpu/run runs them).

On a machine with CUDA they run on ``cuda`` at full size, in float32, float16 and
bfloat16. Without CUDA they are skipped, with the reason, unless ``TAYLORSHIFT_GPU_DRY_RUN=1``
(``benchmarks/gpu/run --dry-run``, which CI runs): then the same tests run on the CPU
under Triton's interpreter (``TAYLORSHIFT_TRITON=interpret`` routes the public op to the
kernels as on CUDA) at tiny sizes, without bfloat16 (the interpreter has none), so that
a bug in them never costs GPU minutes.
"""

from __future__ import annotations

import os

import pytest
import torch

CUDA = torch.cuda.is_available()
if CUDA and os.environ.get("PYTEST_XDIST_WORKER"):
    # the float64 references run on the CPU: one share of the cores per worker
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // 8))
DRY_RUN = not CUDA and os.environ.get("TAYLORSHIFT_GPU_DRY_RUN") == "1"
DEVICE = "cuda" if CUDA else "cpu"
LOW_DTYPES = [torch.float16, torch.bfloat16] if CUDA else [torch.float16]
SKIP_REASON = (
    "CUDA tests: no CUDA device here (TAYLORSHIFT_GPU_DRY_RUN=1, as benchmarks/gpu/run "
    "--dry-run sets it, runs them on the CPU under the Triton interpreter)"
)


def size(full: int, dry: int) -> int:
    """A size of the GPU run, or its tiny stand-in in the dry run."""
    return full if CUDA else dry


def pytest_collection_modifyitems(config, items):
    if CUDA:
        # With pytest-xdist (benchmarks/gpu/run: -n 8, --dist loadgroup), a shape's tests
        # share one worker, so each worker compiles the kernels of its shapes once (float32
        # kernels took 10-40 s each to compile on an H200).
        for item in items:
            shape = getattr(getattr(item, "callspec", None), "params", {}).get("shape")
            if shape is not None:
                item.add_marker(pytest.mark.xdist_group(f"shape-{shape}"))
        return
    if DRY_RUN:
        return
    here = os.path.dirname(__file__)
    skip = pytest.mark.skip(reason=SKIP_REASON)
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def routed_to_the_kernels(monkeypatch):
    """The public op takes the fused kernels (on the CPU: through the interpreter), and a
    kernel failure is an error here, not a silent fallback."""
    pytest.importorskip("triton")
    from taylorshift.ops.taylor_shift import fused

    monkeypatch.setenv(fused.TRITON_ENV, "auto" if CUDA else "interpret")
    failed_before = dict(fused.FAILED)
    yield
    new = {k: v for k, v in fused.FAILED.items() if k not in failed_before}
    assert not new, f"a Triton kernel failed and fell back to PyTorch: {new}"
