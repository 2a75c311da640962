"""The suite's guard (tests/conftest.py): a test that leaves a ``TAYLORSHIFT_*`` variable or
one of torch's global flags changed fails by name, and the tests after it see the state as
it was."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import torch

from tests.conftest import global_state, restore_global_state

ROOT = Path(__file__).resolve().parents[1]


def test_restore_names_and_undoes_each_change():
    before = global_state()
    os.environ["TAYLORSHIFT_GUARD_PROBE"] = "1"
    dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64 if dtype != torch.float64 else torch.float32)
    try:
        changes = restore_global_state(before)
    finally:  # the guard's own failure must not leak what it was shown
        os.environ.pop("TAYLORSHIFT_GUARD_PROBE", None)
        torch.set_default_dtype(dtype)
    assert len(changes) == 2, changes
    assert changes[0].startswith("$TAYLORSHIFT_GUARD_PROBE: None before the test, '1' after")
    assert changes[1].startswith("torch.get_default_dtype()")
    assert "TAYLORSHIFT_GUARD_PROBE" not in os.environ
    assert torch.get_default_dtype() == dtype
    assert restore_global_state(before) == []


def test_a_leaking_test_fails_by_name_and_the_next_one_runs_clean(tmp_path):
    (tmp_path / "conftest.py").write_text(
        "from tests.conftest import pytest_runtest_setup, pytest_runtest_teardown\n"
    )
    (tmp_path / "test_leak.py").write_text(
        textwrap.dedent(
            """
            import os

            import torch


            def test_leaks_a_variable():
                os.environ["TAYLORSHIFT_TRITON"] = "interpret"


            def test_leaks_tf32():
                torch.backends.cuda.matmul.allow_tf32 = not torch.backends.cuda.matmul.allow_tf32


            def test_sees_the_state_as_it_was():
                assert "TAYLORSHIFT_TRITON" not in os.environ
                assert torch.backends.cuda.matmul.allow_tf32 is False


            def test_restores_what_it_changes(monkeypatch):
                monkeypatch.setenv("TAYLORSHIFT_TRITON", "off")
            """
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TAYLORSHIFT_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-rA"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    assert "4 passed, 2 errors" in out, out  # (a teardown error beside its pass)
    assert "ERROR test_leak.py::test_leaks_a_variable" in out, out
    assert "ERROR test_leak.py::test_leaks_tf32" in out, out
    assert "$TAYLORSHIFT_TRITON: None before the test, 'interpret' after" in out, out
    assert "torch.backends.cuda.matmul.allow_tf32: False before the test, True after" in out
    assert "PASSED test_leak.py::test_sees_the_state_as_it_was" in out, out
    assert "PASSED test_leak.py::test_restores_what_it_changes" in out, out
