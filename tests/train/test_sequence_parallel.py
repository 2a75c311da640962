"""Sequence-parallel training (run.sequence_parallel) under torchrun (gloo, CPU): a causal
LM (with a short convolution and grouped key/value heads) whose sequences are split over 2
processes, and over 2 × 2 (data × sequence), trains like one process: same losses,
evaluations and weights."""

from __future__ import annotations

import random

import pytest
import torch
from safetensors.torch import load_file

from taylorshift.train import ConfigError, latest_checkpoint, read_metrics, resolve_config, train

from .conftest import run_cli

# pytest-xdist: both runs on one worker, so the single-process reference runs once
pytestmark = pytest.mark.xdist_group("sequence-parallel-training")

SETTINGS = {
    "data.task": "lm",
    "data.options.seq_len": 24,
    "data.batch_size": 4,
    "data.train_limit": 16,
    "data.eval_limit": 8,
    "data.test_split": "none",
    "model.name": "lm-tiny",
    "model.overrides.depth": 2,
    "model.overrides.dim": 16,
    "model.overrides.num_heads": 2,
    # a short convolution (its taps cross the slices) and grouped key/value heads
    "model.overrides.short_conv": 3,
    "model.overrides.num_kv_heads": 1,
    "optim.epochs": 2,
    "optim.lr": 1e-2,
    "run.progress": "false",
    "run.threads": 1,
    "run.log_every": 1,
}


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    rng = random.Random(1)
    path = tmp_path_factory.mktemp("sp") / "text.txt"
    path.write_text(" ".join(rng.choice(["ab", "bca", "cab"]) for _ in range(1200)))
    return path


def _argv(out, text_file, **extra):
    settings = {**SETTINGS, "data.options.path": str(text_file), **extra}
    argv = ["train", "--out", str(out)]
    for key, value in settings.items():
        argv += ["--set", f"{key}={value}"]
    return argv


def _check_same_run(out, reference):
    losses = [r["loss"] for r in read_metrics(out) if r["event"] == "train"]
    ref = [r["loss"] for r in read_metrics(reference) if r["event"] == "train"]
    assert len(losses) == len(ref) == 8
    torch.testing.assert_close(losses, ref, rtol=1e-5, atol=1e-6)
    evals = [r for r in read_metrics(out) if r["event"] == "eval"]
    ref_evals = [r for r in read_metrics(reference) if r["event"] == "eval"]
    assert [r["samples"] for r in evals] == [r["samples"] for r in ref_evals]
    torch.testing.assert_close(
        [r["loss"] for r in evals], [r["loss"] for r in ref_evals], rtol=1e-5, atol=1e-6
    )
    mine = load_file(latest_checkpoint(out) / "model.safetensors")
    theirs = load_file(latest_checkpoint(reference) / "model.safetensors")
    for name, tensor in mine.items():
        torch.testing.assert_close(tensor, theirs[name], rtol=1e-4, atol=1e-5, msg=name)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, text_file):
    """The same training in one process (the CLI, as the parallel runs), run once."""
    out = tmp_path_factory.mktemp("sp-reference") / "one"
    one = run_cli(_argv(out, text_file))
    assert one.returncode == 0, one.stderr[-3000:]
    return out


@pytest.mark.parametrize(("procs", "sp"), [(2, 2), (4, 2)], ids=["sp2", "dp2xsp2"])
def test_sequence_parallel_training_matches_one_process(tmp_path, text_file, reference, procs, sp):
    out = tmp_path / "many"
    # the ranks as torchrun starts them, forked (tests/train/forked.py: fork_ranks)
    run = run_cli(_argv(out, text_file, **{"run.sequence_parallel": sp}), ranks=procs)
    assert run.returncode == 0, run.stderr[-3000:]
    starts = [r for r in read_metrics(out) if r["event"] == "start"]
    assert starts[0]["world_size"] == procs
    _check_same_run(out, reference)


def test_sequence_parallel_needs_a_language_model_and_a_divisor(tmp_path, text_file):
    with pytest.raises(ConfigError, match=r"run.sequence_parallel must divide the number of"):
        train(resolve_config(overrides=_settings(tmp_path / "a", text_file, 2)))
    config = resolve_config(
        "listops-tiny",
        overrides={"run.sequence_parallel": 2, "run.out_dir": str(tmp_path / "b"),
                   "run.progress": False},
    )  # fmt: skip
    with pytest.raises(ConfigError, match=r"needs a causal language-model task \(kind 'lm'\)"):
        train(config)
    with pytest.raises(ConfigError, match=r"run.sequence_parallel must be a positive int; got 0"):
        resolve_config(overrides={"run.sequence_parallel": 0})


def _settings(out, text_file, sp):
    settings = {**SETTINGS, "data.options.path": str(text_file), "run.out_dir": str(out)}
    settings["run.sequence_parallel"] = sp
    settings["data.test_split"] = None
    settings["run.progress"] = False
    return settings
