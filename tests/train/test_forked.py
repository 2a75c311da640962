"""The forked CLI runs of the training tests (``forked.fork_cli``) report what a fresh
``python -m taylorshift`` reports."""

from __future__ import annotations

import signal
import subprocess
import sys

from taylorshift.train.checkpoint import KILL_ENV

from .conftest import cli_env, tiny_argv
from .forked import fork_cli


def test_a_mistake_gives_the_subprocess_status_and_message(tmp_path):
    argv = tiny_argv(tmp_path / "run", "--set", "optim.lr=-1")
    env = cli_env()
    forked = fork_cli(argv, env)
    fresh = subprocess.run(
        [sys.executable, "-m", "taylorshift", *argv], capture_output=True, text=True, env=env
    )
    assert forked.returncode == fresh.returncode == 2
    assert forked.stderr == fresh.stderr
    assert "optim.lr" in forked.stderr


def test_a_kill_point_ends_the_forked_run_with_sigkill(tmp_path):
    forked = fork_cli(tiny_argv(tmp_path / "run"), {**cli_env(), KILL_ENV: "step:2"})
    assert forked.returncode == -signal.SIGKILL
    assert (tmp_path / "run" / "metrics.jsonl").exists()
