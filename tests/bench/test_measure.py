"""Timing and memory primitives: structure, failure handling, and a known allocation."""

import json
import os
import sys

import pytest
import torch

from taylorshift.bench.files import write_csv, write_json
from taylorshift.bench.measure import (
    is_oom,
    measure_memory,
    run_recipe,
    time_call,
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_time_call_statistics_are_ordered():
    calls = []
    r = time_call(lambda: calls.append(1), target_s=0.01, min_reps=4, max_reps=8)
    assert r.status == "ok" and r.clock == "perf_counter"
    assert 4 <= r.reps <= 8 and len(r.times_s) == r.reps
    assert r.min_s <= r.q1_s <= r.median_s <= r.q3_s <= r.max_s
    assert len(calls) == r.reps + r.warmup_calls


@pytest.mark.parametrize(
    "error, status",
    [
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"), "oom"),
        (RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried 1 TB"), "oom"),
        (MemoryError(), "oom"),
        (RuntimeError("shape mismatch"), "error: RuntimeError"),
    ],
    ids=["cuda", "cpu-allocator", "python", "other"],
)
def test_failures_are_results_not_crashes(error, status):
    def fail():
        raise error

    r = time_call(fail)
    assert r.status == status
    assert r.median_s != r.median_s  # NaN: no time for a failed point
    assert is_oom(error) == (status == "oom")


def test_recipe_names_its_format():
    with pytest.raises(ValueError, match=r"recipe must be 'module:function'; got 'nocolon'"):
        run_recipe("nocolon", {})


@pytest.fixture
def importable_tests(monkeypatch):
    # the worker is a fresh interpreter: it must find tests.bench.recipes
    monkeypatch.setenv("PYTHONPATH", ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    monkeypatch.chdir(ROOT)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc (Linux only)")
def test_fresh_process_sees_torch_allocations(importable_tests):
    n = 16 << 20  # 64 MiB of float32
    r = measure_memory("tests.bench.recipes:allocate", {"n_floats": n}, threads=1)
    assert r.status == "ok", r.error
    assert r.method == "fresh-process VmHWM"
    # the tensor is written (ones), so all its pages are resident
    # (within 1 MiB below: a few pages of the fresh process may be resident already)
    assert n * 4 - (1 << 20) <= r.peak_extra_bytes < n * 4 + (8 << 20)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc (Linux only)")
def test_fresh_process_reports_oom_and_errors(importable_tests):
    oom = measure_memory("tests.bench.recipes:fail_with", {"message": "CUDA out of memory"})
    assert oom.status == "oom"
    err = measure_memory("tests.bench.recipes:fail_with", {"message": "bad shape"})
    assert err.status.startswith("error") and "bad shape" in err.error


def test_result_files_are_complete_and_nan_free(tmp_path):
    path = write_json(tmp_path / "sub" / "r.json", {"a": [1.0, float("nan")], "b": float("inf")})
    assert json.loads(path.read_text()) == {"a": [1.0, None], "b": None}
    rows = [{"n": 64, "t": 0.5}, {"n": 128, "extra": None}]
    text = write_csv(tmp_path / "r.csv", rows).read_text().splitlines()
    assert text == ["n,t,extra", "64,0.5,", "128,,"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
