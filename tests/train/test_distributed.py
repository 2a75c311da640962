"""Two processes (torchrun, gloo on CPU) train like one process with the same global batch,
write one set of metrics and checkpoints, resume together, and evaluate every sample once;
a rank that hangs is named. Runs that only need two ranks, not the launcher, fork them with
torchrun's environment (``forked.fork_ranks``)."""

from __future__ import annotations

import re

import pytest
import torch
from safetensors.torch import load_file

from taylorshift.train import latest_checkpoint, read_metrics, train
from taylorshift.train.checkpoint import KILL_ENV

from .conftest import run_cli, tiny_argv, tiny_config

TORCHRUN = ["torch.distributed.run", "--standalone", "--nproc-per-node=2"]
# No drop path: it draws per process, so two processes would not match one.
SETTINGS = {"optim.epochs": 2, "model.overrides.drop_path": 0.0}
# The one line a rank whose collective ran out of run.collective_timeout_s=4 s writes.
TIMEOUT_ERROR = re.compile(
    r"taylorshift train: error: rank (?P<rank>[01]): a collective waited "
    r"run\.collective_timeout_s=4 s and (?:rank\(s\) (?P<silent>[\d, ]+)|another process) did "
    r"not answer: that process crashed, hangs or was stopped\. The last checkpoint is kept; "
    r"restart the job with --resume"
)


def test_two_processes_match_one_and_resume_together(tmp_path):
    overrides = {k.replace(".", "__"): v for k, v in SETTINGS.items()}
    reference = train(tiny_config(tmp_path / "one", **overrides))

    out = tmp_path / "two"
    argv = tiny_argv(out, *(a for k, v in SETTINGS.items() for a in ("--set", f"{k}={v}")))
    # killed at step 6: the ranks forked as torchrun starts them (fork_ranks, seconds
    # sooner); the resumed run under torchrun itself, the launcher users run
    killed = run_cli(argv, env={KILL_ENV: "step:6"}, ranks=2)
    assert killed.returncode != 0
    assert latest_checkpoint(out).name == "step-00000004"
    run = run_cli([*argv, "--resume"], module=TORCHRUN)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.count("trained 8 steps") == 1  # rank 0 reports

    records = read_metrics(out)
    starts = [r for r in records if r["event"] == "start"]
    assert [(r["world_size"], r["resumed_from"]) for r in starts] == [(2, None), (2, 4)]
    losses = [r["loss"] for r in records if r["event"] == "train"]
    assert len(losses) == 8  # one record per step: only rank 0 writes
    torch.testing.assert_close(losses, reference.losses, rtol=1e-5, atol=1e-6)

    evals = [r for r in records if r["event"] == "eval"]
    ref_evals = [r for r in read_metrics(tmp_path / "one") if r["event"] == "eval"]
    assert [r["samples"] for r in evals] == [32, 32]  # every val sample once, not twice
    assert [r["accuracy"] for r in evals] == [r["accuracy"] for r in ref_evals]
    torch.testing.assert_close(
        [r["loss"] for r in evals], [r["loss"] for r in ref_evals], rtol=1e-5, atol=1e-6
    )

    mine = load_file(latest_checkpoint(out) / "model.safetensors")
    theirs = load_file(reference.checkpoint / "model.safetensors")
    for name, tensor in mine.items():
        torch.testing.assert_close(tensor, theirs[name], rtol=1e-4, atol=1e-5, msg=name)


def test_a_rank_that_stops_answering_is_named_within_the_timeout(tmp_path):
    # Rank 1 freezes at step 3 (a hung node) for longer than the run takes: without the
    # timeout it would wake and the run succeed. Rank 0 must not wait torch's default 10-30
    # minutes in silence: after run.collective_timeout_s it stops, naming rank 1. On a loaded
    # machine rank 1 may time out first, waiting on a slow rank 0 before step 3, and then it
    # names rank 0. Whichever rank stops first: one error line names the other rank, and no
    # line names the rank that writes it.
    out = tmp_path / "run"
    argv = tiny_argv(out, "--set", "run.collective_timeout_s=4", "--set", "optim.epochs=3")
    run = run_cli(argv, env={KILL_ENV: "step:3@1/freeze:60"}, ranks=2)
    assert run.returncode != 0
    errors = list(TIMEOUT_ERROR.finditer(run.stderr))
    assert errors, run.stderr[-3000:]
    # (each mention of the timeout is such a line: none malformed)
    assert len(errors) == run.stderr.count("collective_timeout_s=4"), run.stderr[-3000:]
    silent = {}  # rank -> the ranks its error line names
    for found in errors:
        silent[int(found["rank"])] = [int(r) for r in re.findall(r"\d+", found["silent"] or "")]
    lines = [found[0] for found in errors]
    assert all(rank not in named for rank, named in silent.items()), lines
    assert any(named == [1 - rank] for rank, named in silent.items()), lines


def test_device_names_resolve_or_are_refused_before_use(monkeypatch):
    """auto takes CUDA where there is one; under torchrun, auto and cuda take the local
    rank's GPU; names of no device or of devices this machine lacks raise ValueError."""
    from taylorshift.train.distributed import resolve_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device("cpu", local_rank=1) == torch.device("cpu")
    for name in ("cuda", "cuda:0"):
        with pytest.raises(ValueError, match=rf"'{name}' is not available: torch sees no CUDA"):
            resolve_device(name)
    for name in ("gpu", "meta", "cuda:x", "CPU", "", 0):
        with pytest.raises(ValueError, match=r"expected auto, cpu, cuda\[:N\], mps or xpu"):
            resolve_device(name)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("auto") == torch.device("cuda")
    assert resolve_device("auto", local_rank=1) == torch.device("cuda:1")
    assert resolve_device("cuda", local_rank=1) == torch.device("cuda:1")
    assert resolve_device("cuda:1") == torch.device("cuda:1")
    with pytest.raises(ValueError, match=r"'cuda:2' is not available: torch sees 2 CUDA"):
        resolve_device("cuda:2")
