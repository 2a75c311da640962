"""``taylorshift bench calibrate``: a tiny real calibration, the stored file, --show, --clear,
argument errors. (How mode="auto" uses a calibration: tests/ops/test_dispatch.py.)"""

from __future__ import annotations

import json

import pytest
import torch

from taylorshift.bench import calibrate
from taylorshift.bench.measure import TimeResult
from taylorshift.cli import main
from taylorshift.ops.taylor_shift import dispatch
from tests.helpers import write_calibration

CPU = dispatch.device_key("cpu")
TINY = ["--quick", "--d", "2", "4", "--n", "8", "32", "--heads", "1", "--budget-s", "20"]


def test_quick_calibration_writes_a_valid_file(isolated_cache_dir, capsys):
    argv = ["bench", "calibrate", *TINY, "--dtype", "float64", "--causal", "both"]
    assert main([*argv, "--pass", "forward"]) == 0
    out = capsys.readouterr().out
    assert "Stored in" in out and "N̂ measured" in out
    path = isolated_cache_dir / "calibration.json"
    data = json.loads(path.read_text())
    assert data["format"] == dispatch.CALIBRATION_FORMAT
    assert data["version"] == dispatch.CALIBRATION_VERSION
    key = dispatch.device_key("cpu")
    assert list(data["devices"]) == [key]
    device = data["devices"][key]
    assert device["device"] == "cpu" and "cpu_model" in device["machine"]
    entries = device["entries"]
    assert sorted(entries) == sorted(
        dispatch.entry_key(torch.float64, causal, "forward", d)
        for causal in (False, True)
        for d in (2, 4)
    )
    for entry in entries.values():
        assert entry["grid"] == [8, 32] and 1 <= len(entry["points"]) <= 2
        assert entry["crossover"]["status"] in ("crossed", "below", "above")
        assert entry["measured_at"] and entry["heads"] == 1
        for point in entry["points"]:
            assert point["efficient_status"] == point["direct_status"] == "ok"
            assert point["efficient_s"] > 0 and point["direct_s"] > 0
    assert dispatch.parse_calibration(data) is not None
    # the run reloads the calibration: auto now answers from it
    cal = dispatch.load_calibration()
    assert cal is not None and (key, "float64", True, "forward") in cal.ratios

    # a second run adds to the file and keeps what it does not measure
    assert main(["bench", "calibrate", *TINY, "--dtype", "float32", "--causal", "no"]) == 0
    entries = json.loads(path.read_text())["devices"][key]["entries"]
    assert len(entries) == 4 + 4  # float32: d 2 and 4, forward and forward+backward
    assert entries["float32/full/forward+backward/d=4"]["pass"] == "forward+backward"


def test_training_pass_times_forward_and_backward(isolated_cache_dir):
    for passes in ("forward+backward", "train"):  # (train: the older name)
        fn = calibrate.make_call("efficient", 8, 2, 1, torch.float64, "cpu", False, passes)
        grads = fn()
        assert len(grads) == 3 and all(g.shape == (1, 1, 8, 2) for g in grads)
    out = calibrate.make_call("direct", 8, 2, 1, torch.float64, "cpu", True, "forward")()
    assert out.shape == (1, 1, 8, 2) and not out.requires_grad  # inference: no graph


def test_a_file_written_before_is_read_and_renamed_on_the_next_run(isolated_cache_dir, capsys):
    # older versions named forward + backward "train" (in the entry and its key)
    path = write_calibration(isolated_cache_dir, {2: 1e6, 16: 50}, passes="train")
    assert "float64/full/train/d=2" in json.loads(path.read_text())["devices"][CPU]["entries"]
    assert main(["bench", "calibrate", "--show"]) == 0
    assert "forward+backward" in capsys.readouterr().out
    cal = dispatch.load_calibration()
    assert set(cal.measured) == {(CPU, "float64", False, "forward+backward")}
    # old spellings on the command line; the run measures d = 2 again and keeps d = 16
    argv = [*TINY, "--d", "2", "--dtype", "fp64", "--causal", "no", "--pass", "train"]
    assert main(["bench", "calibrate", *argv]) == 0
    entries = json.loads(path.read_text())["devices"][CPU]["entries"]
    assert sorted(entries) == [
        "float64/full/forward+backward/d=16",
        "float64/full/forward+backward/d=2",
    ]
    assert entries["float64/full/forward+backward/d=16"]["crossover"]["n"] == 50
    assert entries["float64/full/forward+backward/d=2"]["heads"] == 1  # measured now
    assert {e["pass"] for e in entries.values()} == {"forward+backward"}


def test_walk_stops_after_two_efficient_wins_and_extends_past_the_grid(monkeypatch):
    calls = []

    def fake_time_call(fn, **kw):  # efficient costs N, direct N²/64: crossover at 64
        n, form = fn.n, fn.form
        calls.append((form, n))
        cost = n if form == "efficient" else n * n / 64
        return TimeResult(status="ok", median_s=cost, q1_s=cost, q3_s=cost)

    def fake_make_call(form, n, *args):
        fn = lambda: None  # noqa: E731
        fn.n, fn.form = n, form
        return fn

    monkeypatch.setattr(calibrate, "time_call", fake_time_call)
    monkeypatch.setattr(calibrate, "make_call", fake_make_call)
    kw = dict(
        d=4,
        heads=1,
        dtype_name="float32",
        device=torch.device("cpu"),
        causal=False,
        passes="forward",
        deadline=float("inf"),
        target_s=0.01,
    )
    entry = calibrate.measure_case(grid=[16, 32, 128, 256, 512, 1024], **kw)
    assert entry["stopped"] == "confirmed" and [p["n"] for p in entry["points"]] == [
        16,
        32,
        128,
        256,
    ]
    assert entry["crossover"]["status"] == "crossed"
    assert entry["crossover"]["n"] == pytest.approx(64)
    entry = calibrate.measure_case(grid=[8, 16], extend=3, **kw)
    assert [p["n"] for p in entry["points"]] == [8, 16, 32, 64, 128]
    assert entry["stopped"] == "grid end"
    entry = calibrate.measure_case(grid=[8, 16], **{**kw, "deadline": 0.0})
    assert entry["stopped"] == "budget" and entry["crossover"]["status"] == "no data"
    # the direct form is skipped where its working set would pass the memory limit
    limit = calibrate.direct_bytes(100, 4, 1, False)
    monkeypatch.setattr(calibrate, "memory_limit", lambda device: limit)
    entry = calibrate.measure_case(grid=[16, 32, 128, 256], **kw)
    assert [p["direct_status"] for p in entry["points"]] == ["ok", "ok", "skipped: memory",
                                                            "skipped: memory"]  # fmt: skip


def test_direct_bytes_count_blocks_not_the_whole_score_matrix():
    # 128 heads at N = 4,096, d = 64: one copy of the (N, N) scores would be 8 GiB; the
    # blocks and the inputs with their gradients take about 1 GiB
    assert calibrate.direct_bytes(4096, 64, 128, False) < 128 * 4096 * 4096 * 4 / 4
    assert calibrate.direct_bytes(64, 16, 4, False) < calibrate.direct_bytes(4096, 16, 4, False)


def test_show_and_clear(isolated_cache_dir, capsys):
    assert main(["bench", "calibrate", "--show"]) == 0
    assert "No calibration at" in capsys.readouterr().out
    assert main(["bench", "calibrate", *TINY, "--causal", "no", "--pass", "forward"]) == 0
    capsys.readouterr()
    assert main(["bench", "calibrate", "--show"]) == 0
    out = capsys.readouterr().out
    assert dispatch.device_key("cpu") in out and "float32" in out and "forward" in out
    assert main(["bench", "calibrate", "--clear"]) == 0
    assert "Removed" in capsys.readouterr().out
    assert not (isolated_cache_dir / "calibration.json").exists()
    assert dispatch.load_calibration() is None
    assert main(["bench", "calibrate", "--clear"]) == 0
    assert "No calibration at" in capsys.readouterr().out


def test_cache_dir_option_and_unusable_file(tmp_path, capsys):
    own = tmp_path / "own"
    own.mkdir()
    (own / "calibration.json").write_text("{broken")
    assert main(["bench", "calibrate", "--show", "--cache-dir", str(own)]) == 1
    assert "unusable" in capsys.readouterr().err
    argv = ["bench", "calibrate", *TINY, "--causal", "no", "--pass", "forward"]
    assert main([*argv, "--cache-dir", str(own)]) == 0
    assert "replacing the unusable calibration" in capsys.readouterr().out
    assert calibrate.read_file(own / "calibration.json")[0] is not None


def test_show_reads_a_file_with_only_what_the_op_reads(tmp_path, capsys):
    # A hand-made file with the fields mode="auto" reads and no more: the op takes it, and
    # --show once failed on it with a KeyError ('theory_n').
    path = write_calibration(tmp_path, {16: 200.0}, dtype="float32")
    data = json.loads(path.read_text())
    for entry in data["devices"][dispatch.device_key("cpu")]["entries"].values():
        del entry["theory_n"], entry["points"]
    path.write_text(json.dumps(data))
    assert main(["bench", "calibrate", "--show", "--cache-dir", str(tmp_path)]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if "≈ 200" in line)
    assert row.split()[6:9] == ["153", "1.31", "0"]  # N̂ theory (docs/theory.md), ratio, points


def test_clear_that_cannot_remove_is_one_error_line(tmp_path, capsys):
    (tmp_path / "calibration.json").mkdir()
    assert main(["bench", "calibrate", "--clear", "--cache-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: cannot remove the calibration ") and err.count("\n") == 1


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv(dispatch.CACHE_DIR_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert dispatch.cache_dir() == tmp_path / "xdg" / "taylorshift"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert dispatch.cache_dir() == tmp_path / "home" / ".cache" / "taylorshift"
    monkeypatch.setenv(dispatch.CACHE_DIR_ENV, str(tmp_path / "own"))
    assert dispatch.calibration_path() == tmp_path / "own" / "calibration.json"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--device", "bogus"], "--device: expected cpu, cuda or cuda:<index>; got 'bogus'"),
        (["--device", "meta"], "--device: expected cpu, cuda or cuda:<index>; got 'meta'"),
        (["--dtype", "float8"], "argument --dtype: invalid choice: 'float8'"),
        (["--d", "0"], "argument --d: expected a positive integer, got 0"),
        (["--n", "1.5"], "argument --n: expected a positive integer, got '1.5'"),
        (["--heads", "0"], "argument --heads: expected a positive integer, got 0"),
        (["--budget-s", "0"], "argument --budget-s: expected a positive number, got 0"),
        (["--budget-s", "soon"], "argument --budget-s: expected a positive number, got 'soon'"),
        (["--causal", "maybe"], "argument --causal: invalid choice: 'maybe'"),
        (["--pass", "backward"], "argument --pass: invalid choice: 'backward'"),
        (["--show", "--clear"], "argument --clear: not allowed with argument --show"),
    ],
    ids=lambda x: x if isinstance(x, str) else "-".join(x),
)
def test_cli_errors_name_the_flag(capsys, argv, message):
    with pytest.raises(SystemExit) as excinfo:
        main(["bench", "calibrate", *argv])
    assert excinfo.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_device_without_cuda_is_a_parser_error(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "calibrate", "--device", "cuda"])
    assert (
        "--device: expected an available device; got 'cuda' but CUDA is not available"
        in capsys.readouterr().err
    )
