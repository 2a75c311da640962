"""Language-model training (task kind "lm"): per-token loss, the lm and recall presets,
checkpoints that ``taylorshift generate`` continues from."""

from __future__ import annotations

import json
import math
import random

import pytest
import torch
from safetensors.torch import load_file

from taylorshift.cli import main
from taylorshift.data import IGNORE_INDEX
from taylorshift.models import CausalLM
from taylorshift.train import ConfigError, TrainConfig, read_metrics, resolve_config, train
from taylorshift.train.evaluate import task_losses

QUICK = {
    "run.progress": False,
    "run.threads": 1,
    "run.log_every": 1,
    "data.test_split": None,
    "model.overrides.depth": 1,
    "model.overrides.dim": 32,
    "model.overrides.num_heads": 2,
}


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    rng = random.Random(0)
    words = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog"]
    path = tmp_path_factory.mktemp("text") / "text.txt"
    path.write_text(" ".join(rng.choice(words) for _ in range(2500)))
    return path


def lm_config(out_dir, text_file, **settings):
    overrides = {
        **QUICK,
        "data.task": "lm",
        "data.options.path": str(text_file),
        "data.options.seq_len": 32,
        "data.batch_size": 16,
        "data.train_limit": 256,
        "data.eval_limit": 32,
        "model.name": "lm-tiny",
        "optim.epochs": 8,
        "optim.lr": 1e-2,
        "run.out_dir": str(out_dir),
    }
    overrides.update(settings)
    return resolve_config(overrides=overrides)


def test_task_losses_score_targets_only():
    logits = torch.randn(2, 4, 7)
    targets = torch.tensor([[1, IGNORE_INDEX, 3, 0], [IGNORE_INDEX] * 3 + [6]])
    loss, correct, scored = task_losses(logits, targets, "lm")
    keep = targets != IGNORE_INDEX
    expected = torch.nn.functional.cross_entropy(logits[keep], targets[keep], reduction="sum")
    assert torch.allclose(loss, expected) and int(scored) == 4
    assert int(correct) == int((logits[keep].argmax(-1) == targets[keep]).sum())


def test_lm_training_lowers_the_loss_and_reports_perplexity(tmp_path, text_file, capsys):
    config = lm_config(tmp_path / "run", text_file)
    assert config.model.name == "lm-tiny" and config.optim.name == "adamw"  # the lm preset
    result = train(config)
    said = capsys.readouterr()  # the eval lines count scored target tokens
    assert f"({result.eval['samples']} target tokens)" in said.out + said.err
    assert result.losses[-1] < 0.6 * result.losses[0]
    assert math.isclose(result.eval["perplexity"], math.exp(result.eval["loss"]))
    assert result.eval["samples"] == (int(0.05 * text_file.stat().st_size) - 1) // 32 * 32
    # within a word the next letter is nearly always fixed: far above the 1/27 of chance
    assert result.eval["accuracy"] > 0.4
    # every eval record carries each TaylorShift layer's learned τ: here the final ones
    weights = load_file(result.checkpoint / "model.safetensors")
    taus = [weights[k].flatten().tolist() for k in sorted(weights) if k.endswith("temperature")]
    record = [r for r in read_metrics(tmp_path / "run") if r["event"] == "eval"][-1]
    assert len(record["temperatures"]) == len(taus) == 1  # depth 1
    assert record["temperatures"][0] == pytest.approx(taus[0], abs=1e-4)
    assert taus[0] != pytest.approx([1.0, 1.0], abs=1e-3)  # learned, not the start


def test_eval_records_carry_temperatures_of_taylor_heads_only(tmp_path, text_file):
    local = {"model.overrides.kernel_args.local_heads": 1, "optim.epochs": 1}
    train(lm_config(tmp_path / "local", text_file, **local))
    record = [r for r in read_metrics(tmp_path / "local") if r["event"] == "eval"][-1]
    assert [len(layer) for layer in record["temperatures"]] == [1]  # 2 heads, 1 local
    train(lm_config(tmp_path / "softmax", text_file, **{"model.kernel": "softmax",
                                                         "optim.epochs": 1}))  # fmt: skip
    record = [r for r in read_metrics(tmp_path / "softmax") if r["event"] == "eval"][-1]
    assert "temperatures" not in record


def test_generate_command_continues_the_text(tmp_path, text_file, capsys):
    train(lm_config(tmp_path / "run", text_file, **{"run.max_steps": 2}))
    argv = ["generate", "--checkpoint", str(tmp_path / "run"), "--prompt", "the ",
            "--max-new-tokens", "12", "--seed", "3"]  # fmt: skip
    assert main(argv) == 0
    first = capsys.readouterr().out
    assert first.startswith("the ") and len(first) >= len("the ") + 1
    assert main(argv) == 0
    assert capsys.readouterr().out == first  # seeded
    # --eos-id: each row of a batch printed up to its own end (generate repeats it after)
    greedy_ids = [*argv[:3], "--temperature", "0", "--max-new-tokens", "12"]
    alone = []
    for prompt in ("97,98", "100"):
        assert main([*greedy_ids, "--ids", prompt]) == 0
        alone.append([int(t) for t in capsys.readouterr().out.split(",")])
    eos = alone[0][2]
    ended = [row[: row.index(eos) + 1] if eos in row else row for row in alone]
    assert main([*greedy_ids, "--ids", "97,98", "--ids", "100", "--eos-id", str(eos)]) == 0
    assert capsys.readouterr().out == "".join(",".join(map(str, r)) + "\n" for r in ended)
    assert main([*argv, "--top-p", "1e-6"]) == 0  # the nucleus of one token: greedy
    nucleus = capsys.readouterr().out
    assert main([*argv, "--temperature", "0"]) == 0
    assert nucleus == capsys.readouterr().out
    assert main([*argv[:3], "--ids", "97,98", "--temperature", "0"]) == 0
    ids = [int(t) for t in capsys.readouterr().out.strip().split(",")]
    assert len(ids) == 200 and all(0 <= i < 258 for i in ids)
    # prompts of other lengths in one (left-padded) batch: greedy, each as if alone
    greedy = [*argv[:3], "--temperature", "0", "--max-new-tokens", "6"]
    alone = []
    for text in ("the ", "a quick brown"):
        assert main([*greedy, "--prompt", text]) == 0
        alone.append(capsys.readouterr().out)
    assert main([*greedy, "--prompt", "the ", "--prompt", "a quick brown"]) == 0
    assert capsys.readouterr().out == "".join(alone)
    assert main([*greedy, "--ids", "97,98,99", "--ids", "100"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert main([*greedy, "--ids", "100"]) == 0
    assert len(lines) == 2 and lines[1] == capsys.readouterr().out.strip()


def test_generate_command_errors(tmp_path, text_file, capsys):
    with pytest.raises(SystemExit):
        main(["generate", "--checkpoint", str(tmp_path / "none")])
    assert "no checkpoint at" in capsys.readouterr().err
    train(lm_config(tmp_path / "run", text_file, **{"run.max_steps": 1}))
    with pytest.raises(SystemExit):
        main(["generate", "--checkpoint", str(tmp_path / "run"), "--ids", "1,x"])
    assert "--ids must be comma-separated ints, e.g. 1,2,3; got '1,x'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["generate", "--checkpoint", str(tmp_path / "run"), "--ids", "999"])
    assert "--ids: token ids must be in [0, 258)" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # the ids given as the user did: one way only
        main(["generate", "--checkpoint", str(tmp_path / "run"), "--ids", "1,2", "--prompt", "a"])
    assert "not allowed with argument" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["generate", "--checkpoint", str(tmp_path / "run"), "--eos-id", "258"])
    assert "error: --eos-id: expected a token id in [0, 258), got 258" in capsys.readouterr().err
    for top_p in ("0", "1.5", "nan"):
        with pytest.raises(SystemExit):
            main(["generate", "--checkpoint", str(tmp_path / "run"), "--top-p", top_p])
        err = capsys.readouterr().err
        assert f"argument --top-p: expected a number in (0, 1], got {top_p}" in err
    with pytest.raises(SystemExit):
        main(["generate", "--checkpoint", str(tmp_path / "run"), "--prompt", "a", "--prompt", ""])
    assert "--prompt must hold at least one token" in capsys.readouterr().err


def test_recall_preset_trains_with_its_own_vocabulary(tmp_path):
    config = resolve_config(
        overrides={
            **QUICK,
            "data.task": "recall",
            "data.options.vocab_size": 40,
            "data.options.seq_len": 24,
            "data.options.num_pairs": 4,
            "data.split_options.train.num_samples": 64,
            "data.split_options.val.num_samples": 32,
            "optim.epochs": 1,
            "run.out_dir": str(tmp_path / "run"),
        }
    )
    result = train(config)
    assert result.eval["samples"] == 32 * 4  # one scored target per query
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["data"]["task"] == "recall"
    start = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert start["model"]["vocab_size"] == 40


def test_model_and_task_kinds_must_match(tmp_path, text_file):
    with pytest.raises(ConfigError, match=r"task 'lm' \(kind 'lm'\) needs a causal language"):
        train(lm_config(tmp_path / "a", text_file, **{"model.name": "listops-small"}))
    overrides = {**QUICK, "model.name": "lm-tiny", "run.out_dir": str(tmp_path / "b")}
    config = resolve_config("listops-tiny", overrides=overrides)
    with pytest.raises(ConfigError, match=r"task 'listops' \(kind 'tokens'\) needs a classifier"):
        train(config)


def test_causal_lm_checkpoint_loads_as_causal_lm(tmp_path, text_file):
    from taylorshift.models import load_model

    train(lm_config(tmp_path / "run", text_file, **{"run.max_steps": 1}))
    files = list((tmp_path / "run" / "checkpoints").glob("step-*/model.safetensors"))
    assert isinstance(load_model(files[0]), CausalLM)


def test_a_relative_data_path_is_recorded_absolute(tmp_path, text_file, monkeypatch, capsys):
    """eval and --resume find a run's data from any folder, not only from the one it
    started in; eval says so and takes --data where the data is not there."""
    (tmp_path / "start").mkdir()
    (tmp_path / "start" / "text.txt").write_bytes(text_file.read_bytes())
    monkeypatch.chdir(tmp_path / "start")
    train(lm_config(tmp_path / "run", "text.txt", **{"run.max_steps": 2}))
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert config["data"]["options"]["path"] == str(tmp_path / "start" / "text.txt")
    monkeypatch.chdir(tmp_path)
    assert main(["eval", "--checkpoint", "run", "--split", "val", "--limit", "2"]) == 0
    out = capsys.readouterr().out  # an LM's eval counts scored target tokens
    assert out.startswith("val: accuracy") and "(64 target tokens, run/checkpoints/" in out
    train(lm_config(tmp_path / "run", "start/text.txt", **{"run.max_steps": 3}), resume=True)

    (tmp_path / "start" / "text.txt").rename(tmp_path / "moved.txt")
    with pytest.raises(SystemExit):
        main(["eval", "--checkpoint", "run", "--split", "val", "--limit", "2"])
    err = capsys.readouterr().err
    assert "error: data (task 'lm', as the run recorded it; other: --data PATH): path must " in err
    assert main(["eval", "--checkpoint", "run", "--limit", "2", "--data", "moved.txt"]) == 0
    with pytest.raises(SystemExit):
        main(["eval", "--checkpoint", "run", "--data", "gone.txt"])
    assert "error: data (task 'lm'): path must be an existing file or folder, got 'gone.txt'" in (
        capsys.readouterr().err
    )


def test_a_run_that_recorded_a_relative_data_path_resumes(tmp_path, text_file, monkeypatch):
    """Runs of earlier versions recorded the path as given: a resume from the folder it
    was given in takes it as those versions did."""
    (tmp_path / "text.txt").write_bytes(text_file.read_bytes())
    monkeypatch.chdir(tmp_path)
    with monkeypatch.context() as old:
        old.setattr(TrainConfig, "with_absolute_data_paths", lambda config: config)
        train(lm_config(tmp_path / "run", "text.txt", **{"run.max_steps": 1}))
    assert (
        json.loads((tmp_path / "run" / "config.json").read_text())["data"]["options"]["path"]
        == "text.txt"
    )
    result = train(lm_config(tmp_path / "run", "text.txt", **{"run.max_steps": 2}), resume=True)
    assert len(result.losses) == 1
