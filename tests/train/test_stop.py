"""SIGTERM stops a training run after the step it arrives in, with a checkpoint."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from pathlib import Path

import pytest

from taylorshift.train import TrainingStopped, latest_checkpoint, read_metrics, train
from taylorshift.train.checkpoint import KILL_ENV
from taylorshift.train.stop import StopRequests

from .conftest import cli_env, run_cli, tiny_argv, tiny_config
from .forked import signal_cli


def _data_workers(pid: int) -> list[int]:
    """The DataLoader workers among the descendants of ``pid`` (Linux's /proc)."""
    found, todo = [], [pid]
    while todo:
        tasks = Path(f"/proc/{todo.pop()}/task")
        for task in tasks.iterdir() if tasks.is_dir() else ():
            for child in map(int, (task / "children").read_text().split()):
                todo.append(child)
                comm = Path(f"/proc/{child}/comm")
                if comm.is_file() and comm.read_text().strip() == "pt_data_worker":
                    found.append(child)
    return found


def _ignores_sigterm(pid: int) -> bool:
    """Whether process ``pid`` ignores SIGTERM (the SigIgn mask of /proc/PID/status)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:  # gone already
        return False
    mask = next(line.split()[1] for line in status.splitlines() if line.startswith("SigIgn:"))
    return bool(int(mask, 16) >> (signal.SIGTERM - 1) & 1)


def test_a_sigterm_is_noted_while_entered_and_the_handler_comes_back():
    before = signal.getsignal(signal.SIGTERM)
    with StopRequests() as stops:
        signal.raise_signal(signal.SIGTERM)  # would end this process without the handler
        assert stops.received == signal.SIGTERM and stops.signal_name == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is before


def _signal_self_then_wait():
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="forks")
def test_a_process_forked_during_the_run_still_ends_on_sigterm():
    with StopRequests() as stops:
        child = multiprocessing.get_context("fork").Process(target=_signal_self_then_wait)
        child.start()
        child.join(30)
    assert child.exitcode == -signal.SIGTERM and stops.received is None


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="finds the workers in /proc")
def test_train_stops_after_the_step_with_a_checkpoint_and_resumes(tmp_path, monkeypatch):
    from taylorshift.train import loop

    # One DataLoader worker, and the signal to it as well, as a signal to the process group
    # (Slurm's) sends it: torch gives its workers SIGTERM's default, so before the loader's
    # worker_init_fn (ignore_stop_signals) the worker died under the step and the run ended
    # in "DataLoader worker ... exited unexpectedly".
    config = tiny_config(
        tmp_path / "run", run__checkpoint_every=1000, optim__epochs=1, data__num_workers=1
    )
    step = loop.Trainer._step

    def step_then_sigterm(self, batch):  # the signal arrives during step 2 (of 4)
        if self.state.step == 1:
            workers = _data_workers(os.getpid())
            assert workers and all(_ignores_sigterm(w) for w in workers)
            for pid in (*workers, os.getpid()):
                os.kill(pid, signal.SIGTERM)
        step(self, batch)

    monkeypatch.setattr(loop.Trainer, "_step", step_then_sigterm)
    with pytest.raises(TrainingStopped, match="stopped by SIGTERM after step 2") as stopped:
        train(config)
    assert stopped.value.step == 2
    assert latest_checkpoint(tmp_path / "run") == stopped.value.checkpoint
    assert stopped.value.checkpoint.name == "step-00000002"
    records = read_metrics(tmp_path / "run")
    assert [r["step"] for r in records if r["event"] == "train"] == [1, 2]
    assert records[-1]["event"] == "stopped" and records[-1]["signal"] == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # given back

    monkeypatch.undo()
    result = train(config, resume=True)  # continues from step 2 to the end
    start = [r for r in read_metrics(tmp_path / "run") if r["event"] == "start"]
    assert start[-1]["resumed_from"] == 2 and result.step == start[-1]["total_steps"] > 2


def test_cli_says_what_was_saved_and_exits_143(tmp_path):
    out = tmp_path / "run"
    argv = tiny_argv(out, "--set", "optim.epochs=200", "--set", "run.checkpoint_every=100000")
    metrics = out / "metrics.jsonl"
    code, err = signal_cli(
        argv,
        cli_env(),
        tmp_path,
        lambda: metrics.exists() and '"train"' in metrics.read_text(),
        signal.SIGTERM,
    )
    assert code == 143, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "stopped by SIGTERM after step" in lines[0], err
    assert "--resume" in lines[0]
    assert latest_checkpoint(out) is not None


def test_a_sigterm_to_one_process_stops_the_whole_job_after_the_same_step(tmp_path):
    # rank 1 alone gets SIGTERM at the end of step 3; both learn of it in step 4's loss
    # all-reduce, so both stop after step 4, and rank 0 writes that step's checkpoint
    out = tmp_path / "run"
    argv = tiny_argv(out, "--set", "optim.epochs=3", "--set", "run.checkpoint_every=1000")
    run = run_cli(argv, env={KILL_ENV: "step:3@1/term"}, ranks=2)
    assert run.returncode == 143, run.stderr[-3000:]
    stops = [line for line in run.stderr.splitlines() if "stopped by" in line]
    assert len(stops) == 1, run.stderr[-3000:]  # the main process says it, once
    assert "stopped by a signal to another process of the job after step 4" in stops[0]
    assert latest_checkpoint(out).name == "step-00000004"
    events = [(r["event"], r["step"]) for r in read_metrics(out)]
    assert events[-2:] == [("checkpoint", 4), ("stopped", 4)]
