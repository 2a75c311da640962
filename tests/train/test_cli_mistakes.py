"""User mistakes at ``taylorshift train`` / ``eval`` / ``generate``: one ``error:`` line
naming the setting, exit code 2, never a traceback; Ctrl-C in ``train`` says what was
saved and how to go on. Run through the real CLI in subprocesses (Ctrl-C: in a process
forked from the fork server, tests/train/forked.py)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

from .conftest import cli_env, tiny_argv
from .forked import signal_cli

# Runs every case through taylorshift.cli.main in one fresh interpreter (one torch import
# for the whole table) and prints, per case, the exit code, stderr, and whether anything
# escaped main as an exception (a traceback, for a user).
_HARNESS = r"""
import contextlib, io, json, sys, traceback
from taylorshift.cli import main
results = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as exit:
            code = exit.code
        except BaseException:
            code, err = "traceback", io.StringIO(traceback.format_exc())
    results.append({"code": code, "stderr": err.getvalue()})
print(json.dumps(results))
"""


def _mistakes(tmp: Path) -> list[tuple[list[str], str]]:
    """(argv, what the error line must say) per mistake; files made under ``tmp``."""
    empty = tmp / "empty.txt"
    empty.write_text("")
    regular = tmp / "a-file"
    regular.write_text("not a folder")
    tsv = tmp / "listops"
    tsv.mkdir()
    for split in ("train", "val", "test"):
        (tsv / f"basic_{split}.tsv").write_text("Source\tTarget\n[MAX 1 2 ]\t2\n[MAX 1 ZZ ]\t1\n")
    no_test = tmp / "listops-no-test"  # a split missing at the end: found before any step
    no_test.mkdir()
    for split in ("train", "val"):
        (no_test / f"basic_{split}.tsv").write_text("Source\tTarget\n[MAX 1 2 ]\t2\n")
    csv = tmp / "csv"
    csv.mkdir()
    for split in ("train", "val", "test"):
        (csv / f"{split}.csv").write_bytes(b"text,label\n\xff\xfe not utf-8,1\n")
    out = str(tmp / "run")
    tiny = ["--preset", "listops-tiny", "--out", out]
    return [
        (["train", "--task", "lm", "--data", str(tmp / "missing.txt"), "--out", out],
         "must be an existing file or folder"),
        (["train", "--task", "lm", "--data", str(empty), "--out", out],
         "must hold at least seq_len + 1"),
        (["train", "--task", "lm", "--data", str(tmp), "--out", out],
         "must be a text file for task 'lm', got the folder"),
        (["train", "--task", "lm", "--out", out], "--data PATH"),
        (["train", "--task", "listop", "--out", out], "did you mean 'listops'"),
        (["train", *tiny[:2], "--device", "cuda:7", "--out", out],
         "run.device: 'cuda:7' is not available"),
        (["train", *tiny[:2], "--device", "mps", "--out", out], "run.device: 'mps' is not"),
        (["train", *tiny[:2], "--device", "gpu", "--out", out],
         "run.device must be auto, cpu, cuda[:N], mps or xpu[:N]; got 'gpu'"),
        (["eval", "--checkpoint", str(tmp / "no-run"), "--device", "cuda:bogus"],
         "--device: expected auto, cpu, cuda[:N], mps or xpu[:N]; got 'cuda:bogus'"),
        (["generate", "--checkpoint", str(tmp / "no-run"), "--device", "cuda:7"],
         "--device: 'cuda:7' is not available"),
        (["generate", "--checkpoint", str(tmp / "no-run"), "--device", "meta"],
         "--device: expected auto, cpu, cuda[:N], mps or xpu[:N]; got 'meta'"),
        (["train", *tiny[:2], "--out", str(regular / "run")], "run.out_dir"),
        (["train", "--task", "listops-tsv", "--data", str(tsv), "--batch-size", "1",
          "--out", out], "basic_train.tsv line 3: expression tokens must be"),
        (["train", "--task", "listops-tsv", "--data", str(no_test), "--batch-size", "1",
          "--out", out], "split 'test' must be a file or a folder holding basic_test.tsv"),
        (["train", "--task", "text-csv", "--data", str(csv), "--batch-size", "1", "--out", out],
         "train.csv must be UTF-8 text"),
        (["train", *tiny, "--set", "optim.lr=fast"], "optim.lr"),
        (["train", *tiny, "--set", "model.kernel_args.taylorshift.windw=3"],
         "model.kernel_args.taylorshift: attention kernel 'taylorshift' has no option 'windw' ("),
        (["train", *tiny, "--set", "data.options.seed=abc"], "seed must be an int; got 'abc'"),
        (["train", *tiny, "--set", "model.overrides.qk_norm=1"], "qk_norm must be a bool; got 1"),
        (["train", *tiny, "--set", "model.overrides.dropout=1.5"],
         "dropout must be a number in [0, 1); got 1.5"),
        # (the preset's run options give its kernel a local head)
        (["train", "--preset", "text-bytes-cpu", "--out", out, "--set",
          "model.overrides.num_kv_heads=1"], "does not combine with local_heads"),
        (["eval", "--checkpoint", str(tmp / "no-run")], "no checkpoint at"),
        (["generate", "--checkpoint", str(tmp / "no-run"), "--ids", "1,2,3,4"],
         "no checkpoint at"),
        (["generate", "--checkpoint", str(tmp / "no-run"), "--ids", "1,,2"],
         "--ids must be comma-separated ints, e.g. 1,2,3; got '1,,2'"),
    ]  # fmt: skip


def test_every_mistake_is_one_error_line_with_exit_code_2(tmp_path):
    cases = _mistakes(tmp_path)
    argvs = json.dumps([argv for argv, _ in cases])
    done = subprocess.run(
        [sys.executable, "-c", _HARNESS, argvs],
        capture_output=True,
        text=True,
        env=cli_env(),
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout.strip().splitlines()[-1])
    for (argv, expected), result in zip(cases, results, strict=True):
        where = f"taylorshift {' '.join(argv)}:\n{result['stderr']}"
        assert result["code"] == 2, where
        errors = [line for line in result["stderr"].splitlines() if "error:" in line]
        assert len(errors) == 1 and expected in errors[0], where
        assert "Traceback" not in result["stderr"], where


def test_ctrl_c_in_train_says_what_was_saved_and_how_to_resume(tmp_path):
    out = tmp_path / "run"
    argv = tiny_argv(out, "--set", "optim.epochs=200", "--set", "run.checkpoint_every=1")
    # the CLI in a process forked from the test's fork server (tests/train/forked.py), with
    # Ctrl-C's usual handler, as a terminal's `python -m taylorshift` has it
    code, err = signal_cli(
        argv, cli_env(), tmp_path, (out / "checkpoints" / "latest").exists, signal.SIGINT
    )
    assert code == 130, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "interrupted; the last checkpoint is" in lines[0], err
    assert "--resume" in lines[0]
