"""Shared test helpers: float64 comparisons by relative norm, random problems."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import multiprocessing
import sys

import torch


@contextlib.contextmanager
def tf32_matmuls(enabled: bool):
    """``torch.backends.cuda.matmul.allow_tf32`` set for the block, then put back.

    Not ``monkeypatch.setattr``: the flag lives behind the module's ``__getattr__``, so
    pytest (9.2) finds no attribute to restore and its undo raises, skipping the undos
    after it (environment variables included).
    """
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


@contextlib.contextmanager
def script_module(path, name: str):
    """A script outside the package (benchmarks/...) imported as module ``name``, in
    ``sys.modules`` for the block (dataclasses look their module up there), then removed."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(name, None)


def rel_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """‖actual − expected‖ / ‖expected‖ in float64 (absolute when expected is zero)."""
    a, e = actual.double(), expected.double()
    den = e.norm().item()
    err = (a - e).norm().item()
    return err / den if den > 0 else err


def assert_rel_close(actual, expected, rtol: float, what: str = "", atol: float = 1e-13) -> None:
    """‖actual − expected‖ <= rtol ‖expected‖ + atol sqrt(numel).

    The absolute floor (per element, RMS) covers values that are zero in exact arithmetic
    (a gradient through a single attended key, say), where a relative error means nothing.
    """
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    assert torch.isfinite(actual).all(), f"{what}: non-finite values"
    err = (actual.double() - expected.double()).norm().item()
    bound = rtol * expected.double().norm().item() + atol * expected.numel() ** 0.5
    assert err <= bound, (
        f"{what}: error {err:.3e} > bound {bound:.3e} (relative {rel_error(actual, expected):.3e})"
    )


def random_qkv(b, h, nq, nk, d, dv, dtype=torch.float64, seed=0, requires_grad=True):
    g = torch.Generator().manual_seed(seed)
    tensors = [
        torch.randn(b, h, nq, d, generator=g, dtype=torch.float64),
        torch.randn(b, h, nk, d, generator=g, dtype=torch.float64),
        torch.randn(b, h, nk, dv, generator=g, dtype=torch.float64),
    ]
    return [t.to(dtype).requires_grad_(requires_grad) for t in tensors]


def key_padding(b: int, nk: int, seed: int = 0, empty_row: bool = True) -> torch.Tensor:
    """(B, 1, 1, Nk) bool mask: random lengths, batch 0 fully padded when asked."""
    g = torch.Generator().manual_seed(seed + 1)
    lengths = torch.randint(1, nk + 1, (b,), generator=g)
    mask = torch.arange(nk)[None, :] < lengths[:, None]
    if empty_row and b > 1:
        mask[0] = False
    return mask[:, None, None, :]


def write_calibration(
    directory, crossovers, *, device="cpu", dtype="float64", causal=False, passes="forward"
):
    """Add crossovers N̂ by head dim (dv = d) for one (device, dtype, causal, pass) to the
    calibration file in ``directory`` (created if missing); returns its path. ``passes``:
    "forward" or "forward+backward" (or "train", the older name of forward + backward).
    ``crossovers``: {d: N̂}."""
    from taylorshift.bench.files import write_json
    from taylorshift.ops.taylor_shift import dispatch

    entries = {  # keys spelled out: passes="train" writes an entry as older versions did
        f"{dtype}/{'causal' if causal else 'full'}/{passes}/d={d}": {
            "dtype": dtype,
            "causal": causal,
            "pass": passes,
            "d": d,
            "dv": d,
            "crossover": {"status": "crossed", "n": float(n), "n_below": 1, "n_above": 2},
            "theory_n": float(n),  # (printed by --show, not read by mode="auto")
            "points": [],
        }
        for d, n in crossovers.items()
    }
    path = dispatch.calibration_path(directory)
    data = {
        "format": dispatch.CALIBRATION_FORMAT,
        "version": dispatch.CALIBRATION_VERSION,
        "devices": {},
    }
    if path.exists():  # add to what an earlier call wrote
        data = json.loads(path.read_text())
    device_entries = data["devices"].setdefault(dispatch.device_key(device), {"entries": {}})
    device_entries["entries"].update(entries)
    return write_json(path, data)


def forget_what_dynamo_saw() -> None:
    """Drop Dynamo's lazily built tables of torch's functions (the rule map and the sets of
    allowed and skipped callables, keyed by the objects they saw when built). Built while an
    op test had torch.empty patched (tests/ops/conftest.py), they would hold the patch, and
    every later compiled call of the real torch.empty would graph-break (tests/test_compile.py
    failed after the op tests); dropped, the next compilation rebuilds them from what torch
    holds then. Called after every op test and before every compile test."""
    from torch._dynamo import trace_rules

    trace_rules.get_torch_obj_rule_map.cache_clear()
    for name in dir(trace_rules):
        table = getattr(trace_rules, name)
        if type(table).__name__ == "FunctionIdSet":
            table.function_ids = table.function_names = None
    torch._dynamo.reset()


# What the test processes' fork server imports before it forks any child: each child then
# starts with torch and the package loaded (a fresh interpreter spends 3-4 s on them, more
# on a loaded 2-core machine).
FORKSERVER_PRELOAD = [
    "torch",
    "torch._dynamo",
    "taylorshift.cli",
    "taylorshift.train",
    "tests.train.forked",
    "tests.distributed.spawn",
]


def forkserver():
    """multiprocessing's ``forkserver`` context, its server preloading FORKSERVER_PRELOAD
    (set before the server starts; one server per test process). The server is forked from
    nothing but imports, so no OpenMP or other thread pool is alive in it (those do not
    survive a fork)."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(FORKSERVER_PRELOAD)
    return context
