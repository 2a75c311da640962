"""The ``taylorshift`` command line: output, JSON and argument errors."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from taylorshift import theory
from taylorshift.cli import SUBCOMMANDS, main

SRC = Path(__file__).resolve().parents[1] / "src"


def run_ok(capsys, *argv: str) -> str:
    assert main(list(argv)) == 0
    return capsys.readouterr().out


def run_error(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as excinfo:
        main(list(argv))
    assert excinfo.value.code == 2
    return capsys.readouterr().err


def test_theory_table_has_the_paper_and_symmetric_numbers(capsys):
    out = run_ok(capsys, "theory")
    for number in ("4161", "2174", "16513", "8446", "2145", "1163", "5313"):
        assert number in out
    assert "A100" in out
    assert "Heads analysis" not in out


def test_theory_json_default_dims(capsys):
    report = json.loads(run_ok(capsys, "theory", "--json"))
    assert report == {"crossovers": [dataclasses.asdict(r) for r in theory.crossover_table()]}


def test_theory_json_one_dim(capsys):
    report = json.loads(run_ok(capsys, "theory", "--d", "64", "--json"))
    assert report["crossovers"] == [
        {
            "d": 64,
            "n0": 4161,
            "n1": 2174,
            "n0_symmetric": 2145,
            "n1_symmetric": 1163,
            "n0_a100_estimate": 5313,
        }
    ]


def test_theory_heads_analysis_text(capsys):
    out = run_ok(capsys, "theory", "--d", "8", "--d-emb", "64")
    assert "Heads analysis: d_emb = 64, N = 1024" in out
    assert "0.530" in out
    row = next(line.split() for line in out.splitlines() if line.split()[:2] == ["8", "8"])
    r = theory.heads_analysis(64, 1024, heads=[8])[0]
    assert row == [str(v) for v in dataclasses.astuple(r)]


def test_theory_heads_analysis_json(capsys):
    report = json.loads(run_ok(capsys, "theory", "--d-emb", "96", "--json"))
    heads = report["heads_analysis"]
    assert heads["d_emb"] == 96 and heads["n"] == 1024
    assert [r["heads"] for r in heads["rows"]] == theory.divisors(96)
    assert heads["rows"] == [dataclasses.asdict(r) for r in theory.heads_analysis(96, 1024)]
    assert heads["optimal_head_dim_ops"] == pytest.approx(0.5300, abs=1e-4)
    assert 0 < heads["optimal_head_dim_entries"] < 1


def test_theory_heads_restricted_and_length(capsys):
    argv = ("theory", "--d-emb", "64", "--heads", "8", "4", "--n", "4096", "--json")
    heads = json.loads(run_ok(capsys, *argv))["heads_analysis"]
    assert heads["n"] == 4096
    assert [r["heads"] for r in heads["rows"]] == [4, 8]
    assert heads["rows"][0]["ops_direct"] == theory.ops_direct_mhsa(4096, 64, 4)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("theory", "--heads", "4"), "--heads needs --d-emb"),
        (("theory", "--n", "512"), "--n needs --d-emb"),
        (
            ("theory", "--d-emb", "64", "--heads", "3", "4", "5"),
            "--heads must divide --d-emb 64 (expected one of [1, 2, 4, 8, 16, 32, 64]); got 3, 5",
        ),
        (("theory", "--d", "0"), "argument --d: expected a positive integer, got 0"),
        (("theory", "--d", "eight"), "argument --d: expected a positive integer, got 'eight'"),
        (("theory", "--d-emb", "-4"), "argument --d-emb: expected a positive integer, got -4"),
        ((), "the following arguments are required: COMMAND"),
        (("nonsense",), "invalid choice: 'nonsense'"),
    ],
    ids=[
        "heads-alone",
        "n-alone",
        "heads-not-dividing",
        "d-zero",
        "d-text",
        "demb-negative",
        "no-command",
        "unknown-command",
    ],
)
def test_bad_arguments_exit_2_with_a_message(capsys, argv, message):
    assert message in run_error(capsys, *argv)


def test_help_lists_every_subcommand(capsys):
    with pytest.raises(SystemExit) as excinfo:
        main(["--help"])
    assert excinfo.value.code == 0
    out = capsys.readouterr().out
    for command in SUBCOMMANDS:
        assert command.name in out


def test_module_entry_point_runs_as_a_subprocess():
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
    }
    result = subprocess.run(
        [sys.executable, "-m", "taylorshift", "theory", "--d", "64", "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    row = json.loads(result.stdout)["crossovers"][0]
    assert (row["d"], row["n0"], row["n1"]) == (64, 4161, 2174)
