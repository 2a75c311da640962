"""A run killed with SIGKILL (between steps, or while writing a checkpoint) and resumed
computes bitwise what an uninterrupted run computes."""

from __future__ import annotations

import re
import signal

import pytest
from safetensors.torch import load_file

from taylorshift.cli import main
from taylorshift.train import latest_checkpoint, read_metrics, train
from taylorshift.train.checkpoint import KILL_ENV, DamagedCheckpointError

from .conftest import run_cli, tiny_argv, tiny_config

# Depth 2 so that the last block has drop path, and dropout: training draws random numbers.
# 4 steps per epoch, 3 epochs; checkpoints every 3 steps and at each epoch end.
SETTINGS = {
    "optim.epochs": 3,
    "run.checkpoint_every": 3,
    "model.overrides.depth": 2,
    "model.overrides.dropout": 0.1,
}


def summary(out_dir):
    """What must not change: every train and eval record (minus timings)."""
    keep = {"train": ("step", "epoch", "loss", "lr", "grad_norm"), "eval": ("step", "loss",
            "accuracy", "samples")}  # fmt: skip
    return [
        (r["event"], *(r[k] for k in keep[r["event"]]))
        for r in read_metrics(out_dir)
        if r["event"] in keep
    ]


def full_log(out_dir):
    """Every record of the metrics file but ``start``, without times and throughputs."""
    drop = {"time", "samples_per_s", "tokens_per_s", "path"}
    return [
        {k: v for k, v in r.items() if k not in drop}
        for r in read_metrics(out_dir)
        if r["event"] != "start"
    ]


def test_killed_and_resumed_runs_match_an_uninterrupted_one_bitwise(tmp_path):
    # log_every 5 with checkpoints every 3 steps and at each epoch's end (4, 8, 12): every
    # resume starts inside a log window. One run killed five times, at every kind of point.
    settings = {**SETTINGS, "run.log_every": 5}
    reference = tmp_path / "reference"
    result = train(tiny_config(reference, **{k.replace(".", "__"): v for k, v in settings.items()}))
    assert result.step == 12

    out = tmp_path / "killed"
    argv = tiny_argv(out, *(a for k, v in settings.items() for a in ("--set", f"{k}={v}")))
    stages = [
        # (kill point, latest checkpoint afterwards)
        ("step:5", "step-00000004"),  # mid-epoch, one step after a checkpoint
        ("checkpoint-files:6", "step-00000004"),  # files written, folder not renamed
        ("checkpoint-done:8", "step-00000008"),  # checkpoint complete, run not gone on
        ("checkpoint-pointer:9", "step-00000008"),  # folder renamed, `latest` not replaced
        ("step:11", "step-00000009"),  # after rewriting the orphan of the last kill
    ]
    for i, (point, latest) in enumerate(stages):
        run = run_cli([*argv, *(["--resume"] if i else [])], env={KILL_ENV: point})
        assert run.returncode == -signal.SIGKILL, (point, run.stderr[-2000:])
        assert latest_checkpoint(out).name == latest, point
    run = run_cli([*argv, "--resume"])
    assert run.returncode == 0, run.stderr[-2000:]

    assert summary(out) == summary(reference)
    assert full_log(out) == full_log(reference)
    assert [r["resumed_from"] for r in read_metrics(out) if r["event"] == "start"] == [
        None, 4, 4, 8, 8, 9
    ]  # fmt: skip
    final, expected = latest_checkpoint(out), latest_checkpoint(reference)
    assert final.name == expected.name == "step-00000012"
    a, b = load_file(final / "model.safetensors"), load_file(expected / "model.safetensors")
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].equal(b[name]), name
    leftovers = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert leftovers == ["latest", "step-00000009", "step-00000012"]  # keep_checkpoints=2


@pytest.mark.parametrize("point", ["checkpoint-pointer:3"])
def test_a_kill_during_the_first_checkpoint_leaves_no_checkpoint(tmp_path, point):
    out = tmp_path / "run"
    argv = tiny_argv(out, "--set", "run.checkpoint_every=3", "--set", "run.max_steps=3")
    run = run_cli(argv, env={KILL_ENV: point})
    assert run.returncode == -signal.SIGKILL
    assert latest_checkpoint(out) is None  # nothing to resume from: a fresh start is right


@pytest.mark.parametrize("damage", ["weights-bit", "state-bit", "garbage-latest"])
def test_resume_skips_a_damaged_checkpoint_for_the_newest_intact_one(tmp_path, damage):
    overrides = {k.replace(".", "__"): v for k, v in SETTINGS.items()}
    reference = train(tiny_config(tmp_path / "reference", **overrides))
    out = tmp_path / "damaged"
    train(tiny_config(out, run__max_steps=7, **overrides))  # keeps step-6 and step-7
    latest = latest_checkpoint(out)
    assert latest.name == "step-00000007"
    if damage == "garbage-latest":
        (out / "checkpoints" / "latest").write_bytes(b"\x00\xffnot a checkpoint name")
        expected = "step-00000007"  # the newest kept checkpoint is intact
    else:  # one flipped bit in the data, which still loads
        path = latest / ("model.safetensors" if damage == "weights-bit" else "state.pt")
        data = bytearray(path.read_bytes())
        data[-40] ^= 0x01
        path.write_bytes(bytes(data))
        expected = "step-00000006"
    with pytest.warns(UserWarning, match=f"resuming from {expected} instead") as caught:
        result = train(tiny_config(out, **overrides), resume=True)
    said = str(caught[0].message)
    if damage == "garbage-latest":  # (named the file: was the codec's message alone)
        assert said.startswith(f"{out / 'checkpoints' / 'latest'} must name a checkpoint")
    else:  # each damaged file said once (was twice: as latest's and as a candidate)
        assert said.count("differs from the checksum") == 1, said
    assert result.step == reference.step == 12
    assert summary(out) == summary(tmp_path / "reference")


def test_no_intact_checkpoint_is_a_clear_error(tmp_path):
    out = tmp_path / "run"
    train(tiny_config(out, run__max_steps=3, run__checkpoint_every=3))
    weights = latest_checkpoint(out) / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01
    weights.write_bytes(bytes(data))
    with pytest.raises(DamagedCheckpointError, match=r"no intact checkpoint in .*differs from"):
        train(tiny_config(out), resume=True)


@pytest.mark.parametrize("name", ["model.safetensors", "state.pt"])
def test_a_cut_file_of_a_checkpoint_without_checksums_is_named(tmp_path, capsys, name):
    """Checkpoints written before checksums cannot be verified: a file cut short is then
    found when it is read, by resume and eval alike (a traceback before)."""
    out = tmp_path / "run"
    train(tiny_config(out, run__max_steps=2, run__checkpoint_every=2))
    folder = latest_checkpoint(out)
    (folder / "checksums.json").unlink()
    path = folder / name
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    match = rf"{name} is not a readable"
    with pytest.raises(DamagedCheckpointError, match=match):
        train(tiny_config(out, run__max_steps=3), resume=True)
    with pytest.raises(SystemExit) as info:
        main(["eval", "--checkpoint", str(out)])
    assert info.value.code == 2
    assert re.search(match, capsys.readouterr().err)


def test_runs_stopped_by_max_steps_or_finished_resume_to_the_same_log(tmp_path):
    """A run stopped early by run.max_steps (inside a log window) and resumed logs as an
    uninterrupted one: its partial train record and ``end`` give way to the resumed steps'.
    Resuming a finished run adds no second test evaluation or ``end``."""
    settings = {k.replace(".", "__"): v for k, v in {**SETTINGS, "run.log_every": 5}.items()}
    reference = tmp_path / "reference"
    train(tiny_config(reference, **settings))
    out = tmp_path / "stopped"
    for max_steps in (2, 7, None):  # 2 and 7: inside windows, neither a checkpoint step
        train(tiny_config(out, run__max_steps=max_steps, **settings), resume=max_steps != 2)

    def records(run):  # (the stops' own checkpoints are extra records, and rightly so)
        return [r for r in full_log(run) if r["event"] != "checkpoint"]

    assert records(out) == records(reference)
    assert [r["step"] for r in read_metrics(out) if r["event"] == "checkpoint"] == [
        2, 3, 4, 6, 7, 8, 9, 12
    ]  # fmt: skip
    train(tiny_config(out, **settings), resume=True)  # finished already
    assert records(out) == records(reference)
    assert [r["event"] for r in read_metrics(out)].count("start") == 4
