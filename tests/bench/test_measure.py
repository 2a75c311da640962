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


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc (Linux only)")
def test_a_worker_over_its_time_is_stopped_and_the_next_point_runs(importable_tests):
    slow = measure_memory("tests.bench.recipes:sleep_on_second_call", {"seconds": 60},
                          timeout_s=1.0)  # fmt: skip
    assert slow.status == "over budget" and "timed out after 1 s" in slow.error
    after = measure_memory("tests.bench.recipes:allocate", {"n_floats": 1 << 20})
    assert after.status == "ok", after.error


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc (Linux only)")
def test_a_worker_killed_by_sigkill_is_out_of_memory(importable_tests):
    killed = measure_memory("tests.bench.recipes:die_on_second_call", {})
    assert killed.status == "oom" and "exit code -9" in killed.error


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc (Linux only)")
def test_workers_take_the_callers_path_folder_and_environment(
    importable_tests, tmp_path, monkeypatch
):
    # this thread's server runs already: the module, the folder and the variable are new to it
    assert measure_memory("tests.bench.recipes:allocate", {"n_floats": 1}).status == "ok"
    (tmp_path / "late_recipes.py").write_text(
        "import os, torch\n"
        "def here(folder):\n"
        "    assert os.getcwd() == folder, os.getcwd()\n"
        "    assert os.environ['LATE_RECIPES'] == 'set', os.environ.get('LATE_RECIPES')\n"
        "    return lambda: torch.ones(4)\n"
    )
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(folder)
    monkeypatch.setenv("LATE_RECIPES", "set")
    result = measure_memory("late_recipes:here", {"folder": str(folder)})
    assert result.status == "ok", result.error


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc (Linux only)")
def test_threads_measure_at_the_same_time(importable_tests):
    from concurrent.futures import ThreadPoolExecutor

    sizes = [1 << 22, 1 << 23]  # 16 and 32 MiB
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(
            lambda n: measure_memory("tests.bench.recipes:allocate", {"n_floats": n}), sizes
        ))  # fmt: skip
    for n, r in zip(sizes, results, strict=True):
        assert r.status == "ok", r.error
        assert n * 4 - (1 << 20) <= r.peak_extra_bytes < n * 4 + (8 << 20)
