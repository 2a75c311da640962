"""One training process per run folder: a second launch is refused, naming the holder."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from taylorshift.cli import main
from taylorshift.train import RunLock, RunLockedError, read_metrics, train
from taylorshift.train.lock import LOCK_FILE

from .conftest import tiny_argv, tiny_config

pytest.importorskip("fcntl")  # POSIX only: elsewhere no lock is taken (train/lock.py)


def test_a_second_run_into_a_locked_folder_is_refused_and_touches_nothing(tmp_path):
    out = tmp_path / "run"
    train(tiny_config(out, run__max_steps=2, optim__epochs=2))
    before = (out / "metrics.jsonl").read_bytes()
    refused = pytest.raises(RunLockedError, match=rf"in use by .*pid {os.getpid()} on host")
    with RunLock(out), refused:  # another training process, as far as train can tell
        train(tiny_config(out, optim__epochs=2), resume=True)
    assert (out / "metrics.jsonl").read_bytes() == before
    # released: the resume goes on
    assert train(tiny_config(out, optim__epochs=2), resume=True).step > 2
    assert read_metrics(out)[-1]["event"] == "end"


def test_a_lock_held_by_another_process_is_refused_at_the_cli(tmp_path, capsys):
    out = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from taylorshift.train import RunLock; "
         f"RunLock({str(out)!r}).acquire(); print('held', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(SystemExit) as info:
            main(tiny_argv(out))
        assert info.value.code == 2
        assert f"in use by another training process (pid {holder.pid}" in capsys.readouterr().err
    finally:
        holder.kill()
        holder.wait()
    # The holder was killed without releasing: its lock went with it (no stale lock).
    assert (out / LOCK_FILE).exists()
    assert main(tiny_argv(out)) == 0
