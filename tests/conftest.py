"""Suite-wide fixtures, the global-state guard, and Triton's interpreter switched on before
anything imports Triton.

Triton reads ``TRITON_INTERPRET`` when its language module is imported: if another library
(transformers checks for Triton at import) loads it first without the variable, the
kernel tests under ``tests/ops/triton`` fail with "Cannot call @triton.jit'd outside of the
scope of a kernel". So it is set here, before any test module is imported, on machines
without CUDA (where those tests run interpreted).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
if os.environ.get("TRITON_INTERPRET") == "1":
    from tests.triton_interpreter import install

    install()  # the interpreter patches triton.language once a launch (tests/triton_interpreter.py)

from taylorshift.ops.taylor_shift import calibration, dispatch

# Under pytest-xdist (the default, -n auto) the workers share the cores: each takes its
# share of torch's threads instead of all of them.
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _workers > 1:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // _workers))


# What pip resolved for this run, at the top of pytest's output: CI installs the newest
# versions pyproject.toml allows into a fresh environment, so a failure can be read
# against the versions that produced it.
REPORTED_VERSIONS = ("torch", "triton", "pytest", "pytest-xdist", "hypothesis", "transformers",
                     "scikit-learn", "numpy", "safetensors")  # fmt: skip


def pytest_report_header(config):
    from importlib import metadata

    found = []
    for name in REPORTED_VERSIONS:
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            found.append(f"{name} (not installed)")
    return "versions: " + ", ".join(found)


@pytest.fixture(scope="session")
def shared_kernel_builds(tmp_path_factory):
    """One folder of built CPU kernels for the whole run, all xdist workers included.

    A build takes 6-10 s of a core (gcc -O3 of ops/cpu/*.c). In a test's own empty cache
    every process that calls a CPU kernel would build again: the xdist workers, and each
    CLI run, rank and memory worker the tests start (the suite did 9 builds in tests/train
    alone). Builds are atomic (a temporary file renamed into place), so the workers may share
    the folder. Tests of the build itself point the cache elsewhere (``fresh_build``).
    """
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    folder = root / "shared-cpu-kernels"
    folder.mkdir(exist_ok=True)
    return folder


@pytest.fixture(autouse=True)
def isolated_cache_dir(tmp_path_factory, monkeypatch, shared_kernel_builds):
    """Every test sees an empty cache directory of its own, never the user's calibration.

    ``mode="auto"`` reads the calibration once per process: the test starts with nothing read
    (the next auto call reads the test's directory) and the state before it comes back after.
    The built CPU kernels are the one thing shared (``cpu-kernels``, a link to
    ``shared_kernel_builds``). Returns the directory, which is not under ``tmp_path``: tests
    that check that a refused call wrote nothing find ``tmp_path`` empty.
    """
    cache = tmp_path_factory.mktemp("taylorshift-cache")
    (cache / "cpu-kernels").symlink_to(shared_kernel_builds, target_is_directory=True)
    monkeypatch.setenv(dispatch.CACHE_DIR_ENV, str(cache))
    monkeypatch.delenv(dispatch.CALIBRATION_ENV, raising=False)
    monkeypatch.setattr(calibration, "_loaded", calibration._UNSET)
    return cache


# The global state a test may change only if it puts it back: one test that leaves
# TAYLORSHIFT_TRITON=interpret set routes every later test of its worker through the Triton
# interpreter (minutes a test), one that leaves TF32 on loosens every float32 comparison.
# Each entry reads the state and sets it back.
GUARDED_STATE: dict[str, tuple[Callable[[], object], Callable[[object], None]]] = {
    "torch.backends.cuda.matmul.allow_tf32": (
        lambda: torch.backends.cuda.matmul.allow_tf32,
        lambda value: setattr(torch.backends.cuda.matmul, "allow_tf32", value),
    ),
    "torch.backends.cudnn.allow_tf32": (
        lambda: torch.backends.cudnn.allow_tf32,
        lambda value: setattr(torch.backends.cudnn, "allow_tf32", value),
    ),
    "torch.get_default_dtype()": (torch.get_default_dtype, torch.set_default_dtype),
    "torch.get_num_threads()": (torch.get_num_threads, torch.set_num_threads),
    "torch.is_grad_enabled()": (torch.is_grad_enabled, torch.set_grad_enabled),
    "torch.are_deterministic_algorithms_enabled()": (
        torch.are_deterministic_algorithms_enabled,
        torch.use_deterministic_algorithms,
    ),
}
GUARDED_ENV_PREFIX = "TAYLORSHIFT_"


def global_state() -> dict[str, object]:
    """The guarded state now: torch's flags, and every ``TAYLORSHIFT_*`` variable."""
    state: dict[str, object] = {name: read() for name, (read, _) in GUARDED_STATE.items()}
    for name, value in os.environ.items():
        if name.startswith(GUARDED_ENV_PREFIX):
            state[f"${name}"] = value
    return state


def restore_global_state(before: dict[str, object]) -> list[str]:
    """Put back what changed since ``before``; returns each change, described."""
    after = global_state()
    changes = []
    for key in sorted(before.keys() | after.keys()):
        old, new = before.get(key), after.get(key)
        if old == new:
            continue
        changes.append(f"{key}: {old!r} before the test, {new!r} after")
        if key.startswith("$"):
            if old is None:
                del os.environ[key[1:]]
            else:
                os.environ[key[1:]] = old
        else:
            GUARDED_STATE[key][1](old)
    return changes


_STATE_BEFORE = pytest.StashKey[dict]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    # before the test's fixtures: what they set must be undone by their teardown
    item.stash[_STATE_BEFORE] = global_state()
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    result = yield
    before = item.stash.get(_STATE_BEFORE, None)
    if before is not None:
        changes = restore_global_state(before)
        if changes:
            pytest.fail(
                f"{item.nodeid} left global state changed (put back now, so that later "
                "tests run as alone): " + "; ".join(changes),
                pytrace=False,
            )
    return result


# The modules holding the suite's longest tests (a test of 5-20 s, or a group that one
# worker runs whole), longest first. Under pytest-xdist they are handed out first, so that
# the last work each worker gets is short and both finish together (longest first is the
# classic greedy schedule); the order of tests within a module stays. A module missing here
# only runs in its usual place.
RUN_FIRST = (
    "tests/train/test_distributed.py",
    "tests/test_compile.py",
    "tests/ops/triton/test_efficient_causal_state.py",
    "tests/distributed/test_sequence_parallel.py",
    "tests/bench/test_op.py",
    "tests/integrations/test_huggingface.py",
    "tests/bench/test_compile_check.py",
    "tests/bench/test_calibrate.py",
    "tests/train/test_cli_mistakes.py",
    "tests/bench/test_models.py",
    "tests/bench/test_seqpar.py",
    "tests/test_global_state.py",
    "tests/train/test_forked.py",
    "tests/bench/test_measure.py",
    "tests/train/test_resume.py",
)


def pytest_collection_modifyitems(config, items):
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    rank = {path: i for i, path in enumerate(RUN_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))
