"""The training loop in one process: learning, metrics, non-finite losses, eval, refusals."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from taylorshift.cli import main
from taylorshift.data import TaskSpec, registry
from taylorshift.train import (
    ConfigError,
    NonFiniteLossError,
    evaluate_checkpoint,
    latest_checkpoint,
    read_metrics,
    train,
)

from .conftest import tiny_config


class Majority(Dataset):
    """Sequences of 9 tokens among two ids (the ListOps digits 0 and 1), most of them (85 %
    on average) the label's id. Sample ``i`` of a split is fixed."""

    def __init__(self, split: str = "train", *, num_samples: int = 256) -> None:
        self.num_samples, self.offset = num_samples, {"train": 0, "val": 1, "test": 2}[split]
        self.num_classes = 2

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int):
        g = torch.Generator().manual_seed(index * 3 + self.offset)
        label = int(torch.randint(0, 2, (), generator=g))
        flips = torch.rand(9, generator=g) < 0.15
        return 2 + (flips ^ bool(label)).long(), label


@pytest.fixture
def majority_task(monkeypatch):
    spec = TaskSpec("test-majority", 2, 20, 9, 0, "tokens", "majority of two ids", Majority)
    monkeypatch.setitem(registry._TASKS, spec.name, spec)
    return spec.name


def test_a_short_run_learns_an_easy_task(tmp_path, majority_task):
    config = tiny_config(
        tmp_path / "run",
        data__task=majority_task,
        data__options={},
        data__split_options={"val": {"num_samples": 128}},
        data__batch_size=32,
        model__overrides__pooling="mean",
        optim__name="adamw",
        optim__lr=1e-2,
        optim__epochs=6,
        optim__warmup_epochs=1.0,
        run__log_every=8,
    )
    result = train(config)
    assert result.step == 6 * 8 and result.epoch == 6
    first, last = sum(result.losses[:8]) / 8, sum(result.losses[-8:]) / 8
    assert last < 0.5 * first, (first, last)
    assert result.eval["accuracy"] >= 0.95 and result.best_accuracy >= result.eval["accuracy"]
    model = json.loads((tmp_path / "run" / "config.json").read_text())
    assert model["data"]["task"] == majority_task


def test_an_empty_split_stops_the_run_before_any_step(tmp_path, majority_task):
    """A loader that builds a split of no samples (the file loaders refuse their empty files
    themselves) would be scored 0 and pass: refused, naming the split."""
    config = tiny_config(
        tmp_path / "run",
        data__task=majority_task,
        data__options={},
        data__split_options={"val": {"num_samples": 0}},
    )
    with pytest.raises(ConfigError, match=r"split 'val' of task 'test-majority' holds no"):
        train(config)
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_eval_on_data_of_other_classes_is_refused(tmp_path):
    """Classes read from the data (text-csv: the train file's labels) must be as many as
    the model's outputs (the data's labels would index past them, or mean other classes)."""
    for name, labels in (("two", ["neg", "pos"]), ("three", ["neg", "pos", "meh"])):
        (tmp_path / name).mkdir()
        rows = "".join(f"{'ab' * (i % 5 + 1)},{labels[i % len(labels)]}\n" for i in range(12))
        for split in ("train", "val", "test"):
            (tmp_path / name / f"{split}.csv").write_text("text,label\n" + rows)
    config = tiny_config(
        tmp_path / "run",
        data__task="text-csv",
        data__options={"path": str(tmp_path / "two"), "max_len": 16},
        data__split_options={},
        data__batch_size=4,
        run__max_steps=1,
    )
    train(config)
    assert evaluate_checkpoint(tmp_path / "run", data_path=tmp_path / "two")["samples"] == 12
    with pytest.raises(ConfigError, match=r"data has 3 classes \['meh', 'neg', 'pos'\], the"):
        evaluate_checkpoint(tmp_path / "run", data_path=tmp_path / "three")


def test_metrics_records(tmp_path):
    config = tiny_config(
        tmp_path / "run", run__log_every=3, optim__epochs=2, data__test_split="test"
    )
    result = train(config)
    records = read_metrics(tmp_path / "run")
    events = [r["event"] for r in records]
    assert events[0] == "start" and events[-1] == "end"
    for r in records:
        assert isinstance(r["step"], int) and isinstance(r["time"], float)
    start = records[0]
    assert (start["world_size"], start["steps_per_epoch"], start["total_steps"]) == (1, 4, 8)
    assert start["resumed_from"] is None and start["config"] == config.to_dict()
    assert start["model"]["vocab_size"] == 20 and start["model"]["kernel_args"] == {
        "mode": "direct"
    }
    train_records = [r for r in records if r["event"] == "train"]
    # every log_every steps, at each epoch end and at the last step
    assert [r["step"] for r in train_records] == [3, 4, 6, 8]
    for r in train_records:
        assert set(r) >= {"epoch", "loss", "lr", "grad_norm", "samples_per_s", "tokens_per_s"}
        assert r["loss"] > 0 and r["samples_per_s"] > 0 and r["grad_norm"] >= 0
    # the mean of the steps since the previous record
    assert train_records[0]["loss"] == pytest.approx(sum(result.losses[:3]) / 3)
    evals = [r for r in records if r["event"] == "eval"]
    assert [(r["step"], r["split"]) for r in evals] == [(4, "val"), (8, "val"), (8, "test")]
    assert all(r["samples"] == 32 and 0 <= r["accuracy"] <= 1 for r in evals[:2])
    assert [r["step"] for r in records if r["event"] == "checkpoint"] == [4, 8]
    assert result.test == {k: evals[2][k] for k in ("loss", "accuracy", "samples")}


def test_eval_every_steps(tmp_path):
    config = tiny_config(tmp_path / "run", run__eval_every=3, optim__epochs=2)
    train(config)
    steps = [r["step"] for r in read_metrics(tmp_path / "run") if r["event"] == "eval"]
    assert steps == [3, 4, 6, 8]


def test_a_nan_loss_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch, capsys):
    calls = {"n": 0}
    cross_entropy = F.cross_entropy

    def poisoned(logits, labels, *args, **kwargs):
        loss = cross_entropy(logits, labels, *args, **kwargs)
        if torch.is_grad_enabled():  # training, not evaluation (no_grad)
            calls["n"] += 1
            if calls["n"] == 6:
                return loss * float("nan")
        return loss

    monkeypatch.setattr(F, "cross_entropy", poisoned)
    out = tmp_path / "run"
    argv = ["train", "--preset", "listops-tiny", "--out", str(out), "--no-progress"]
    argv += ["--set", "run.checkpoint_every=3", "--set", "data.test_split=none"]
    argv += ["--set", "data.split_options.train.num_samples=64", "--set", "run.threads=1"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "the loss is nan at step 6 (epoch 1)" in err
    assert f"the last good checkpoint is {out / 'checkpoints' / 'step-00000004'}" in err
    assert latest_checkpoint(out).name == "step-00000004"
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [
        "latest",
        "step-00000003",
        "step-00000004",
    ]
    records = read_metrics(out)
    assert records[-1]["event"] == "nonfinite" and records[-1]["step"] == 6
    assert max(r["step"] for r in records if r["event"] == "train") == 5

    calls["n"] = -100  # no more NaN: the run continues from the good checkpoint
    assert main([*argv, "--resume"]) == 0
    assert latest_checkpoint(out).name == "step-00000008"
    starts = [r for r in read_metrics(out) if r["event"] == "start"]
    assert [r["resumed_from"] for r in starts] == [None, 4]


def test_nonfinite_error_carries_the_step(tmp_path, monkeypatch):
    def always_inf(logits, labels, *args, **kwargs):
        return logits.sum() * float("inf")

    monkeypatch.setattr(F, "cross_entropy", always_inf)
    with pytest.raises(NonFiniteLossError, match=r"at step 1 \(epoch 0\).*no checkpoint") as info:
        train(tiny_config(tmp_path / "run"))
    assert (info.value.step, info.value.epoch, info.value.checkpoint) == (1, 0, None)


def test_existing_runs_are_not_overwritten_and_resume_checks_the_config(tmp_path):
    out = tmp_path / "run"
    train(tiny_config(out, run__max_steps=2, optim__epochs=2))
    with pytest.raises(FileExistsError, match="pass --resume"):
        train(tiny_config(out, optim__epochs=2))
    with pytest.raises(ConfigError, match=r"config differs in optim\.lr \(0\.002, 0\.01\)"):
        train(tiny_config(out, optim__lr=1e-2, optim__epochs=2), resume=True)
    other = tiny_config(out, model__kernel="linear", model__mode=None, optim__epochs=2)
    with pytest.raises(ConfigError, match=r"differs in model\.kernel \('taylorshift', 'linea"):
        train(other, resume=True)
    # runtime settings may change, and the kernel may be named that the run used (its
    # model's own, None in its config); the run goes on from step 2
    named = tiny_config(out, optim__epochs=2, run__log_every=2, model__kernel="taylorshift")
    result = train(named, resume=True)
    assert result.step == 8 and len(result.losses) == 6
    # the mode the run used (its kernel's own: "auto"), named, is the same run too
    unset = tmp_path / "mode-unset"
    train(tiny_config(unset, model__mode=None, run__max_steps=1, optim__epochs=2))
    assert train(tiny_config(unset, model__mode="auto", optim__epochs=2), resume=True).step == 8
    with pytest.raises(ConfigError, match=r"differs in model\.mode \('auto', 'efficient'\)"):
        train(tiny_config(unset, model__mode="efficient", optim__epochs=2), resume=True)
    # --resume without a checkpoint starts afresh
    fresh = train(tiny_config(tmp_path / "other", run__max_steps=1), resume=True)
    assert fresh.step == 1


def test_eval_command_reproduces_the_last_evaluation(tmp_path, capsys):
    out = tmp_path / "run"
    result = train(tiny_config(out, optim__epochs=1))
    assert main(["eval", "--checkpoint", str(out), "--split", "val", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["step"] == 4 and report["split"] == "val" and report["samples"] == 32
    assert report["accuracy"] == result.eval["accuracy"]
    assert report["loss"] == pytest.approx(result.eval["loss"], rel=1e-6)
    # a checkpoint folder or a file in it works too; text output
    folder = latest_checkpoint(out)
    assert main(["eval", "--checkpoint", str(folder / "model.safetensors"), "--limit", "8"]) == 0
    assert "test: accuracy" in capsys.readouterr().out
    assert evaluate_checkpoint(folder, "val", batch_size=5)["accuracy"] == result.eval["accuracy"]


def test_eval_command_errors(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        main(["eval", "--checkpoint", str(tmp_path)])
    assert info.value.code == 2 and "no checkpoint at" in capsys.readouterr().err


@pytest.mark.parametrize("task", ["text-csv", "listops-tsv"])
def test_a_single_data_file_is_not_also_the_evaluation_split(tmp_path, task):
    # One file given as `path` would be train, val and test at once: refused by name.
    if task == "text-csv":
        data = tmp_path / "all.csv"
        data.write_text("text,label\n" + "".join(f"row {i},{i % 2}\n" for i in range(8)))
    else:
        data = tmp_path / "all.tsv"
        data.write_text("Source\tTarget\n" + "".join(f"[MAX {i} 1 ]\t{i}\n" for i in range(8)))
    config = tiny_config(
        tmp_path / "run", data__task=task, data__options={"path": str(data)}, data__split_options={}
    )
    with pytest.raises(ConfigError, match=r"must be a folder with one file per split.*single file"):
        train(config)


def test_eval_of_damaged_weights_fails(tmp_path, capsys):
    # An exponent flip in a saved weight gives a non-finite loss: eval says so, exit 1.
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    out = tmp_path / "run"
    train(tiny_config(out, optim__epochs=1))
    weights = latest_checkpoint(out) / "model.safetensors"
    with safe_open(weights, "pt") as f:
        metadata = f.metadata()
    tensors = load_file(weights)
    name = next(n for n, t in tensors.items() if t.is_floating_point() and t.dim() == 2)
    tensors[name][0, 0] = float("inf")
    save_file(tensors, weights, metadata=metadata)
    with pytest.raises(SystemExit) as info:  # the checksum finds it before anything runs
        main(["eval", "--checkpoint", str(out), "--json"])
    assert info.value.code == 2
    assert "model.safetensors differs from the checksum" in capsys.readouterr().err
    # without a checksum (a checkpoint from before them), the loss shows it: exit 1
    (weights.parent / "checksums.json").unlink()
    assert main(["eval", "--checkpoint", str(out), "--json"]) == 1
    printed = capsys.readouterr()
    assert "not finite" in printed.err

    def refuse(constant):  # strict JSON: no NaN or Infinity
        raise AssertionError(f"{constant} in {printed.out!r}")

    assert json.loads(printed.out, parse_constant=refuse)["loss"] is None
