"""`taylorshift bench seqpar`: the bytes-per-layer formulas by hand, the tables, the command
line (a tiny gloo run), and the old module path."""

from __future__ import annotations

import json
import sys

import pytest

from taylorshift.bench.seqpar import (
    bytes_per_rank,
    crossover_tokens,
    measure,
    measured_table,
    paper_table,
    state_elements,
)
from taylorshift.cli import main


def test_state_size_is_features_times_values_and_ones():
    # d = 2: features [x0², x0 x1, x1², x0, x1, 1] (D = 6), values [v0, v1, 1] (3 columns).
    assert state_elements(2, 2) == 18
    assert state_elements(64, 64) == (64 * 65 // 2 + 65) * 65


def test_bytes_by_hand():
    # d = dv = 2, P = 4, N = 400, B = 1, H = 3: state 3·18 floats of 4 bytes = 216 bytes.
    full = bytes_per_rank(400, 2, 2, heads=3, ranks=4, causal=False)
    causal = bytes_per_rank(400, 2, 2, heads=3, ranks=4, causal=True)
    assert full["ours_forward"] == pytest.approx(2 * 3 / 4 * 216)  # ring all-reduce
    assert causal["ours_forward"] == 3 * 216  # all-gather: P − 1 buffers
    assert full["ours_backward"] == full["ours_forward"]
    ring = 3 * 3 * 100 * (2 + 2) * 2  # (P − 1) hops × B·H·(N/P)·(d + dv) × 2 bytes
    assert full["ring_forward"] == causal["ring_forward"] == ring
    assert full["ring_backward"] == 2 * ring


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("ranks", [2, 4, 8])
def test_crossover_is_where_the_bytes_are_equal(causal, ranks):
    c = crossover_tokens(32, 16, ranks=ranks, causal=causal)
    at = bytes_per_rank(c["forward"], 32, 16, ranks=ranks, causal=causal)
    assert at["ring_forward"] == pytest.approx(at["ours_forward"])
    at = bytes_per_rank(c["forward_backward"], 32, 16, ranks=ranks, causal=causal)
    assert at["ring_forward"] + at["ring_backward"] == pytest.approx(
        at["ours_forward"] + at["ours_backward"]
    )
    if not causal:  # both sides grow as P − 1: the crossover does not depend on P
        assert c == pytest.approx(crossover_tokens(32, 16, ranks=2, causal=False))


def test_tables_render():
    assert "| 64 | 544.6 KiB | 4 | 4,096 |" in paper_table()
    assert "short convolution" in paper_table()  # what the bytes leave out is said
    rows = [
        {"ranks": p, "causal": False, "n": 64, "forward_s": 0.01 / p,
         "forward_backward_s": 0.03 / p, "forward_cpu_s": 0.02 / p,
         "forward_backward_cpu_s": 0.04, "collective_s": 0.001}
        for p in (1, 2)
    ]  # fmt: skip
    table = measured_table(rows)
    assert "| forward | no | 64 | 10.0 | 5.0 (2.00×) | 1.00 |" in table
    assert "| forward+backward | no | 64 | 30.0 | 15.0 (2.00×) | 1.00 |" in table
    table = measured_table(rows, "cpu")
    assert "| forward | no | 64 | 20.0 | 10.0 (2.00×) | 1.00 |" in table
    assert "| forward+backward | no | 64 | 40.0 | 40.0 (1.00×) | 1.00 |" in table


def test_paper_table_on_the_command_line(capsys):
    assert main(["bench", "seqpar", "--paper"]) == 0
    assert "| 64 | 544.6 KiB | 4 | 4,096 |" in capsys.readouterr().out


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="spawns gloo processes")
def test_cli_measures_one_and_two_processes(tmp_path, capsys):
    out = tmp_path / "results.json"
    argv = ["--procs", "2", "--lengths", "64", "--repeats", "1", "--causal", "no"]
    assert main(["bench", "seqpar", *argv, "--out", str(out)]) == 0
    assert "| forward | no | 64 |" in capsys.readouterr().out
    result = json.loads(out.read_text())
    assert result["command"].startswith("taylorshift bench seqpar --procs 2")
    assert result["backend"] == "gloo" and result["machine"]["device"] == "cpu"
    assert result["settings"]["causal"] == [False] and result["settings"]["procs"] == [2]
    assert [(r["ranks"], r["n"]) for r in result["rows"]] == [(1, 64), (2, 64)]
    assert all(r["forward_s"] > 0 and r["forward_backward_s"] > 0 for r in result["rows"])


def test_old_module_keeps_its_names_and_points_to_the_command(capsys):
    from taylorshift.distributed import bench as old

    assert old.bytes_per_rank is bytes_per_rank and old.measure is measure
    assert old.main(["--paper"]) == 0
    captured = capsys.readouterr()
    assert "is now `taylorshift bench seqpar`" in captured.err
    assert "| 64 | 544.6 KiB | 4 | 4,096 |" in captured.out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--procs", "0"], "argument --procs: expected a positive integer, got 0"),
        (["--causal", "maybe"], "argument --causal: invalid choice: 'maybe'"),
    ],
    ids=["procs", "causal"],
)
def test_cli_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["bench", "seqpar", *argv])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
