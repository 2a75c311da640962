"""``taylorshift bench decode``: cache sizes against their formulas, files, the command line."""

from __future__ import annotations

import json

import pytest

from taylorshift.bench import decode
from taylorshift.bench.core import OK
from taylorshift.bench.measure import TimeResult
from taylorshift.cli import main

ARGS = ["--dim", "16", "--depth", "2", "--heads", "2", "--vocab", "11", "--target", "0.01",
        "--no-plot"]  # fmt: skip


def test_decode_bench_rows_and_cache_sizes(tmp_path, capsys):
    out = tmp_path / "bd"
    argv = ["bench", "decode", "--context", "8", "32", "--out", str(out), *ARGS]
    assert main(argv) == 0
    assert "taylorshift:state" in capsys.readouterr().out
    result = json.loads((out / "decode.json").read_text())
    rows = {(r["kernel"], r["cache"], r["context"]): r for r in result["rows"]}
    assert len(rows) == 4 * 2 and all(r["status"] == "ok" for r in rows.values())
    depth, b, h, d = 2, 1, 2, 8
    big_d = d * (d + 1) // 2 + d + 1
    state = depth * b * h * (big_d * (d + 1) + 1) * 4  # float32 sums and count
    for n in (8, 32):
        assert rows["taylorshift", "state", n]["cache_bytes"] == state
        kv = depth * (2 * b * h * n * d * 4 + b * n)  # keys, values (float32), bool mask
        assert rows["taylorshift", "kv", n]["cache_bytes"] == kv
        assert rows["softmax", "kv", n]["cache_bytes"] == kv
        assert rows["linear", "state", n]["cache_bytes"] == depth * b * h * d * (d + 1) * 4
        assert rows["softmax", "kv", n]["tokens_per_s"] > 0
    assert (out / "decode.csv").is_file() and (out / "decode.md").is_file()
    assert "| taylorshift | state | 32 |" in (out / "decode.md").read_text()
    # the cases of a context timed in interleaved rounds (default 5), each against the first
    assert result["settings"]["rounds"] == 5
    for (kernel, cache, _), row in rows.items():
        assert row["rounds"] == 5
        if (kernel, cache) == ("taylorshift", "state"):  # the first case
            assert "step_vs_first" not in row
        else:
            low, high = row["step_vs_first_range"]
            assert low <= row["step_vs_first"] <= high


def test_step_fields_pool_the_rounds_and_take_the_median_ratio():
    first = [TimeResult(OK, median_s=m, times_s=[m, m]) for m in (1.0, 2.0, 4.0)]
    mine = [TimeResult(OK, median_s=2.0, times_s=[1.0, 3.0]) for _ in range(3)]
    row = decode.step_fields(mine, first)
    assert row["step_s"] == 2.0 and row["reps"] == 6 and row["rounds"] == 3
    assert row["step_vs_first"] == 1.0  # the ratios 2, 1, 0.5
    assert row["step_vs_first_range"] == (0.5, 2.0)
    assert "step_vs_first" not in decode.step_fields(first, first)
    failed = [*first[:1], TimeResult("oom", error="out of memory")]
    assert decode.step_fields(failed, first)["status"] == "oom"
    assert "step_vs_first" not in decode.step_fields(mine, failed)


def test_decode_bench_kv_heads_shrink_every_cache(tmp_path):
    # --kv-heads 1 of 2 heads: the TaylorShift state and the key/value caches per key/value
    # head (half); linear attention's state stays per query head
    out = tmp_path / "bd"
    argv = ["bench", "decode", "--context", "8", "--kv-heads", "1", "--out", str(out), *ARGS]
    assert main(argv) == 0
    result = json.loads((out / "decode.json").read_text())
    assert result["settings"]["kv_heads"] == 1
    rows = {(r["kernel"], r["cache"]): r for r in result["rows"]}
    depth, b, kv, h, d, n = 2, 1, 1, 2, 8, 8
    big_d = d * (d + 1) // 2 + d + 1
    assert rows["taylorshift", "state"]["cache_bytes"] == depth * b * kv * (big_d * (d + 1) + 1) * 4
    assert rows["softmax", "kv"]["cache_bytes"] == depth * (2 * b * kv * n * d * 4 + b * n)
    assert rows["linear", "state"]["cache_bytes"] == depth * b * h * d * (d + 1) * 4
    assert "2 heads (head dim 8, 1 key/value heads)" in (out / "decode.md").read_text()


def test_decode_bench_errors(tmp_path, capsys):
    base = ["bench", "decode", "--out", str(tmp_path / "x"), "--context", "4", *ARGS]
    with pytest.raises(SystemExit):
        main([*base, "--cases", "softmax:state"])
    assert "cache='state' needs a kernel with a constant-size state" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*base, "--cases", "softmax"])
    assert "expected KERNEL:CACHE" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*base, "--heads", "3"])
    assert "--dim must be divisible by --heads" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*base, "--kv-heads", "3"])
    assert "--kv-heads must divide --heads; got --kv-heads 3 and --heads 2" in (
        capsys.readouterr().err
    )
