"""The real-data presets train from a fresh folder with no ``--data``: digits-cpu and
text-bytes-cpu, which reports bits per byte beside its count baselines."""

from __future__ import annotations

import importlib.util
import json
import math

import pytest

from taylorshift.cli import main
from taylorshift.train import resolve_config, train
from taylorshift.train.metrics import read_metrics

# find_spec, not importorskip: collecting this module should not import scikit-learn
# (seconds, in every test worker); the digits preset imports it when it runs.
pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("sklearn") is None,
    reason="the digits task reads scikit-learn's bundled copy",
)


@pytest.mark.parametrize(
    "preset, task, model",
    [("digits-cpu", "digits", "cifar-pixel-small"), ("text-bytes-cpu", "text-bytes", "lm-tiny")],
)
def test_presets_train_from_a_fresh_folder_without_data(tmp_path, capsys, preset, task, model):
    out = tmp_path / "run"
    argv = ["train", "--preset", preset, "--out", str(out), "--max-steps", "2", "--no-progress",
            "--set", "run.threads=1"]  # fmt: skip
    assert main(argv) == 0
    saved = json.loads((out / "config.json").read_text())
    assert (saved["data"]["task"], saved["model"]["name"]) == (task, model)
    assert "path" not in saved["data"]["options"]
    assert (out / "checkpoints" / "latest").read_text().strip() == "step-00000002"
    # --task alone starts from the task's CPU preset
    assert resolve_config(overrides={"data.task": task}).model.name == model


def test_text_bytes_reports_bits_per_byte_beside_count_baselines(tmp_path, capsys):
    config = resolve_config(
        "text-bytes-cpu",
        overrides={
            "run.out_dir": str(tmp_path / "run"),
            "run.progress": False,
            "run.threads": 1,
            "run.max_steps": 3,
            "run.eval_every": 3,
            "data.eval_limit": 8,
            "model.overrides.dim": 32,
            "model.overrides.num_heads": 2,
        },
    )
    result = train(config)
    assert math.isclose(result.eval["bits_per_byte"], result.eval["loss"] / math.log(2))
    records = read_metrics(tmp_path / "run")
    baseline = next(r for r in records if r["event"] == "baseline")
    assert baseline["split"] == "val"
    assert 2.0 < baseline["bigram_bpb"] < baseline["unigram_bpb"] < 8.0
    captured = capsys.readouterr()
    out = captured.out + captured.err
    assert "count baselines: unigram" in out and "bits/byte" in out


@pytest.mark.parametrize("preset", ["text-bytes-cpu", "lm"])
def test_language_model_presets_train_the_temperature_ten_times_faster(preset):
    # the recipe of docs/accuracy.md; the paper's setting is one flag away
    from taylorshift.models import create_model
    from taylorshift.train.optim import build_optimizer

    model = create_model("lm-tiny", vocab_size=16, attn_kernel="taylorshift")
    for overrides, factor in (({}, 10.0), ({"optim.lr_multipliers.temperature": 1}, 1.0)):
        config = resolve_config(preset, overrides=overrides)
        groups = build_optimizer(model, config.optim).param_groups
        taus = [g for g in groups if g.get("lr_multiplier_of") == "temperature"]
        assert len(taus) == 1 and len(taus[0]["params"]) == 2  # one τ per block
        assert math.isclose(taus[0]["lr"], config.optim.lr * factor)
        assert taus[0]["weight_decay"] == 0.0
