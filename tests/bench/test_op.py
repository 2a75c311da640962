"""`taylorshift bench` (the op sweep): structure of the results and files, failures and
budgets as results, crossovers, the command line and its errors.

Grids are tiny (N ∈ {8, 16, 32}, d = 4) and timing is cut to a couple of calls; nothing
asserts on time. One test measures a fresh-process memory point (~3 s on the CPU).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import sys

import pytest
import torch

from taylorshift.bench import op
from taylorshift.cli import main

IMPLS = ("sdpa", "softmax-naive", "direct", "efficient")
FAST = op.Settings(
    ns=(8, 16),
    ds=(4,),
    impls=IMPLS,
    memory=False,
    memory_ds=(4,),
    memory_ns=(64,),
    target_s=1e-3,
    warmup_s=0.0,
    min_reps=1,
    max_reps=2,
    quiet_wait_s=0.0,
    budget_s=120.0,
)
CLI_FAST = [
    "bench", "--n", "8", "16", "--d", "4", "--target-s", "0.001", "--no-memory",
    "--quiet-wait-s", "0",
]  # fmt: skip


def fake(name: str, fn, family: str = "taylorshift-efficient", exponent: float = 1.0):
    return op.Implementation(name, f"fake {name}", fn, family, exponent, module=__name__)


@pytest.fixture
def register(monkeypatch):
    """Register implementations for one test only."""

    def add(impl: op.Implementation) -> op.Implementation:
        monkeypatch.setitem(op.IMPLEMENTATIONS, impl.name, impl)
        return impl

    return add


def statuses(results: dict, impl: str, kind: str = "time") -> dict[tuple[str, int], str]:
    return {
        (p["pass"], p["n"]): p["status"]
        for p in results["points"]
        if p["impl"] == impl and p["kind"] == kind
    }


# pytest-xdist: the tests that read the module's sweep on one worker (it runs once)
pytestmark = pytest.mark.xdist_group("bench-op-sweep")


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
    """One tiny sweep with all four implementations, written with plots."""
    out = tmp_path_factory.mktemp("sweep")
    results = op.run_sweep(FAST)
    op.write_outputs(results, out)
    return out, results


def test_results_structure(sweep_dir):
    out, results = sweep_dir
    data = json.loads((out / "results.json").read_text())
    for key in (
        "schema", "command", "config", "machine", "implementations", "points",
        "sdpa_backends", "crossovers", "theory", "elapsed_s", "complete",
    ):  # fmt: skip
        assert key in data, key
    assert data["schema"] == op.SCHEMA and data["complete"] is True
    assert data["config"]["ns"] == [8, 16] and data["machine"]["device"] == "cpu"
    # which efficient form ran: the CPU kernels ("on") or the PyTorch form ("off: why")
    from taylorshift.ops import cpu

    reason = cpu.unavailable_reason()
    assert data["machine"]["cpu_kernels"] == ("on" if reason is None else f"off: {reason}")
    assert f"CPU kernels {data['machine']['cpu_kernels']}" in (out / "report.md").read_text()
    assert len(data["points"]) == op.count_points(FAST) == 4 * 2 * 2
    for p in data["points"]:
        assert p["status"] == "ok", p
        assert 0 < p["min_s"] <= p["median_s"] <= p["max_s"]
        assert p["family"] in op.FAMILIES and p["kind"] == "time"
    assert {(b["pass"], b["d"], b["dtype"]) for b in data["sdpa_backends"]} == {
        ("forward", 4, "float32"),
        ("forward+backward", 4, "float32"),
    }
    assert all(p["sdpa_backend"] for p in data["points"] if p["impl"] == "sdpa")
    # Crossovers: efficient vs direct and vs softmax, per pass; theory for d = 4.
    pairs = {(c["metric"], c["pass"], c["baseline"]) for c in data["crossovers"]}
    assert pairs == {("time", p, b) for p in op.PASSES for b in ("direct", "softmax")}
    (th,) = data["theory"]
    assert th["d"] == 4 and th["n0_a100_estimate"] == th["n0"] + 18 * 4
    json.dumps(results)  # JSON-ready as is


def test_csv_report_and_plots(sweep_dir):
    out, results = sweep_dir
    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(results["points"])
    assert set(op.CSV_COLUMNS) == set(rows[0])
    assert {r["impl"] for r in rows} == set(IMPLS)
    report = (out / "report.md").read_text()
    for section in (
        "## Machine", "## Command", "## Method", "## Crossovers (measured vs theory)",
        "## Findings", "## Figures", "## Time per call", "## SDPA backend",
        "## Points not measured",
    ):  # fmt: skip
        assert section in report, section
    assert "### d = 4, forward, float32" in report
    assert "## Achieved GFLOP/s" in report
    assert results["sdpa_backends"][0]["backend"] in report
    for name in ("time_forward_float32.png", "time_forward_backward_float32.png"):
        data = (out / name).read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 10_000, name
        assert f"![{name}]({name})" in report
    assert not list(out.glob("memory_*.png"))  # no memory sweep, no memory plot


def test_oom_is_a_result_and_ends_its_series(register):
    def fails_from_16(q, k, v):
        if q.shape[-2] >= 16:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return q + k + v

    register(fake("fake-oom", fails_from_16))
    s = dataclasses.replace(FAST, ns=(8, 16, 32), impls=("direct", "fake-oom"))
    results = op.run_sweep(s)
    assert results["complete"]
    got = statuses(results, "fake-oom")
    for pass_name in op.PASSES:
        assert got[(pass_name, 8)] == "ok"
        assert got[(pass_name, 16)] == "oom"
        assert got[(pass_name, 32)] == "skipped"
    skipped = [p for p in results["points"] if p["status"] == "skipped"]
    assert all(p["reason"] == "after oom at N=16" for p in skipped)
    assert set(statuses(results, "direct").values()) == {"ok"}  # the others go on
    # The crossovers use the points that were measured.
    c = next(c for c in results["crossovers"] if c["challenger"] == "fake-oom")
    assert c["points"] == 1


def test_error_is_a_result(register):
    def broken(q, k, v):
        raise ValueError("something else went wrong")

    register(fake("fake-broken", broken))
    s = dataclasses.replace(FAST, impls=("fake-broken",), passes=("forward",))
    results = op.run_sweep(s)
    assert statuses(results, "fake-broken") == {
        ("forward", 8): "error: ValueError",
        ("forward", 16): "skipped",
    }
    assert "something else" in results["points"][0]["reason"]


def test_sweep_budget_marks_the_rest_over_budget():
    s = dataclasses.replace(FAST, ns=(8, 16, 32), budget_s=1e-9)
    results = op.run_sweep(s)
    assert results["complete"]
    assert {p["status"] for p in results["points"]} == {"over budget"}
    assert "--budget-s" in results["points"][-1]["reason"]


def test_predicted_call_time_over_budget_then_skipped(register):
    # The time grows like N**60 (says the registry): the point after the first is predicted
    # to take far longer than --max-call-s.
    register(fake("fake-steep", lambda q, k, v: q * 2, exponent=60.0))
    s = dataclasses.replace(FAST, ns=(8, 16, 32), impls=("fake-steep",), passes=("forward",))
    results = op.run_sweep(s)
    points = [p for p in results["points"] if p["impl"] == "fake-steep"]
    assert [p["status"] for p in points] == ["ok", "over budget", "skipped"]
    assert points[1]["predicted_call_s"] > s.max_call_s
    assert "--max-call-s" in points[1]["reason"]


def test_predicted_memory_over_budget():
    s = dataclasses.replace(FAST, impls=("direct",), passes=("forward",), max_memory_bytes=1)
    results = op.run_sweep(s)
    points = results["points"]
    assert [p["status"] for p in points] == ["over budget", "skipped"]
    assert "--max-memory-gib" in points[0]["reason"]
    assert points[0]["predicted_peak_bytes"] > 1


def test_interrupted_sweep_saves_partial_results(register):
    def interrupt(q, k, v):
        raise KeyboardInterrupt

    register(fake("fake-interrupt", interrupt))
    saved = []
    s = dataclasses.replace(FAST, impls=("efficient", "fake-interrupt"))
    with pytest.raises(KeyboardInterrupt):
        op.run_sweep(s, save=lambda r: saved.append(json.loads(json.dumps(r))))
    assert saved and saved[-1]["complete"] is False
    assert [p["impl"] for p in saved[-1]["points"]] == ["efficient"]


def test_memory_point_in_a_fresh_process():
    s = dataclasses.replace(
        FAST, ns=(64,), impls=("direct",), passes=("forward",), memory=True, memory_ns=(64,),
        memory_passes=("forward",),
    )  # fmt: skip
    results = op.run_sweep(s)
    (mem,) = [p for p in results["points"] if p["kind"] == "memory"]
    assert mem["status"] == "ok", mem
    assert mem["method"] == "fresh-process VmHWM" and mem["peak_extra_bytes"] >= 0
    assert mem["predicted_call_s"] is not None  # predicted from the time sweep


def test_build_call_warms_up_on_small_inputs():
    call = op.build_call("efficient", n=32, d=4, warmup_n=8)
    assert call().shape == (1, 1, 8, 4)  # the first call: small inputs
    assert call().shape == (1, 1, 32, 4)
    grads = op.build_call("direct", n=16, d=4, heads=2, batch=3, pass_name="forward+backward")()
    assert [tuple(g.shape) for g in grads] == [(3, 2, 16, 4)] * 3


def test_naive_softmax_matches_sdpa():
    q, k, v, _ = op.make_inputs(33, 6, heads=2, batch=2)
    torch.testing.assert_close(op.softmax_naive(q, k, v), op.sdpa(q, k, v))


@pytest.mark.parametrize("mode", ["direct", "efficient"])
def test_compiled_implementations_are_the_op_under_fullgraph_compile(monkeypatch, mode):
    asked = []

    def fake_compile(fn, **options):  # records the options; runs the function eagerly
        asked.append(options)
        return fn

    from taylorshift.bench.op import cases

    monkeypatch.setattr(torch, "compile", fake_compile)
    monkeypatch.setattr(cases, "_COMPILED", {})
    q, k, v, _ = op.make_inputs(33, 6, heads=2, batch=2)
    impl = op.IMPLEMENTATIONS[f"{mode}-compiled"]
    assert impl.family == f"taylorshift-{mode}" and not impl.default  # only on request
    torch.testing.assert_close(impl.fn(q, k, v), op.IMPLEMENTATIONS[mode].fn(q, k, v))
    impl.fn(q, k, v)  # compiled once per shape, then reused
    assert asked == [{"fullgraph": True, "dynamic": False}]
    q2, k2, v2, _ = op.make_inputs(17, 6, heads=2, batch=2)
    torch.testing.assert_close(impl.fn(q2, k2, v2), op.IMPLEMENTATIONS[mode].fn(q2, k2, v2))
    assert len(asked) == 2


def point(impl, family, n, t, kind="time"):
    return {
        "kind": kind, "impl": impl, "family": family, "dtype": "float32", "pass": "forward",
        "d": 16, "n": n, "status": "ok", "median_s": t, "peak_extra_bytes": t,
    }  # fmt: skip


def test_crossovers_against_the_best_softmax():
    # efficient ∝ N, direct ∝ N², the softmax baseline is the faster of two at each N.
    ns = (256, 512, 1024, 2048)
    points = [point("efficient", "taylorshift-efficient", n, 4.0 * n) for n in ns]
    points += [point("direct", "taylorshift-direct", n, n * n / 256) for n in ns]
    points += [point("sdpa", "softmax", n, n * n / 200 if n < 1024 else 1e12) for n in ns]
    points += [point("softmax-naive", "softmax", n, n * n / 100) for n in ns]
    rows = {(c["metric"], c["baseline"]): c for c in op.analyse({"points": points})}
    direct = rows[("time", "direct")]
    assert direct["status"] == "crossed" and math.isclose(direct["n"], 1024)
    softmax = rows[("time", "softmax")]  # sdpa below 1024, naive from 1024 on
    assert softmax["status"] == "crossed" and softmax["n_below"] == 512
    assert softmax["n_above"] == 1024 and 512 < softmax["n"] < 1024
    assert softmax["text"].startswith("≈ ")


def test_a_crossover_timed_on_a_busy_machine_is_marked_unreliable():
    ns = (256, 512, 1024, 2048)
    points = [point("efficient", "taylorshift-efficient", n, 4.0 * n) for n in ns]
    points += [point("direct", "taylorshift-direct", n, n * n / 200) for n in ns]
    quiet = {c["baseline"]: c for c in op.analyse({"points": points}) if c["metric"] == "time"}
    assert quiet["direct"]["unreliable"] is False and "unreliable" not in quiet["direct"]["text"]
    # other processes used 60 % of the CPUs while the direct form was timed at N = 1024,
    # one side of the crossover (between 512 and 1024): the crossover is not to be trusted
    for p in points:
        if p["impl"] == "direct" and p["n"] == 1024:
            p["other_cpu_share"] = 0.6
    busy = {c["baseline"]: c for c in op.analyse({"points": points}) if c["metric"] == "time"}
    assert busy["direct"]["n"] == quiet["direct"]["n"]
    assert busy["direct"]["unreliable"] is True and busy["direct"]["text"].endswith("(unreliable)")


def test_registry():
    with pytest.raises(ValueError, match="registered already"):
        op.register_implementation(op.IMPLEMENTATIONS["sdpa"])
    with pytest.raises(ValueError, match="family must be one of"):
        op.register_implementation(fake("x", op.sdpa, family="quadratic"))
    assert list(op.IMPLEMENTATIONS)[:4] == list(IMPLS)


# Command line.


def test_cli_sweep_and_report_only(tmp_path, capsys):
    out = tmp_path / "res"
    assert main([*CLI_FAST, "--impl", "sdpa", "efficient", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert "Crossovers" in captured.out and str(out) in captured.out
    assert "bench" in captured.err  # the progress bar
    data = json.loads((out / "results.json").read_text())
    assert {p["impl"] for p in data["points"]} == {"sdpa", "efficient"}
    assert data["config"]["target_s"] == 0.001 and data["config"]["memory"] is False
    (out / "report.md").unlink()
    (out / "time_forward_float32.png").unlink()
    assert main(["bench", "--report-only", str(out)]) == 0
    assert "## Crossovers" in (out / "report.md").read_text()
    assert (out / "time_forward_float32.png").stat().st_size > 0
    assert json.loads((out / "results.json").read_text()) == data  # left as it was
    assert "rewrote" in capsys.readouterr().out


def test_report_only_reads_results_written_before_the_vocabulary(sweep_dir, tmp_path):
    # results.json of earlier versions (benchmarks/ keeps them): passes fwd / fwd+bwd, fp32
    _, results = sweep_dir
    old = json.loads(json.dumps(results))
    short = {"forward": "fwd", "forward+backward": "fwd+bwd"}
    for record in (*old["points"], *old["sdpa_backends"]):
        record["pass"], record["dtype"] = short[record["pass"]], "fp32"
    old["config"].update(passes=["fwd", "fwd+bwd"], dtypes=["fp32"], memory_passes=["fwd"])
    del old["crossovers"]
    (tmp_path / "results.json").write_text(json.dumps(old))
    assert main(["bench", "--report-only", str(tmp_path), "--no-plots"]) == 0
    report = (tmp_path / "report.md").read_text()
    assert "### d = 4, forward+backward, float32" in report
    assert "fwd" not in report and "fp32" not in report
    assert json.loads((tmp_path / "results.json").read_text()) == old  # a record: untouched


def test_cli_takes_the_old_spellings_of_passes_and_dtypes():
    from taylorshift.cli import build_parser

    argv = ["bench", "--pass", "fwd", "fwd+bwd", "--dtype", "fp32", "bf16", "--memory-pass", "fwd"]
    args = build_parser().parse_args(argv)
    s = op.settings_from_args(args, args._bench_parser)
    assert s.passes == ("forward", "forward+backward") and s.dtypes == ("float32", "bfloat16")
    assert s.memory_passes == ("forward",)
    assert op.model_flops("softmax", 8, 4, "fwd+bwd") == 3 * 1024  # old name, same count


def test_cli_quick_settings():
    from taylorshift.cli import build_parser

    args = build_parser().parse_args(["bench", "--quick", "--budget-s", "30"])
    s = op.settings_from_args(args, args._bench_parser)
    assert s.quick and s.ns == op.QUICK_N and s.memory_ns == op.QUICK_MEMORY_N
    assert s.budget_s == 30 and s.max_call_s == 1.0 and s.dtypes == ("float32",)
    assert s.memory_ds == (64,) and s.impls == IMPLS
    args = build_parser().parse_args(["bench", "--d", "8", "16", "--n", "32", "16", "16"])
    s = op.settings_from_args(args, args._bench_parser)
    assert s.ns == (16, 32) and s.memory_ds == (16,) and not s.quick and s.budget_s == 1200


def test_the_pytorch_efficient_form_beside_the_cpu_kernels_on_request():
    from taylorshift.cli import build_parser

    # on the CPU the public op's efficient form is the CPU kernels; the PyTorch form is an
    # extra implementation there (by name), a default one on CUDA (beside Triton's)
    assert not op.IMPLEMENTATIONS["efficient-pytorch"].is_default_on("cpu")
    assert op.IMPLEMENTATIONS["efficient-pytorch"].is_default_on("cuda")
    assert not op.IMPLEMENTATIONS["direct-pytorch"].is_default_on("cpu")
    assert op.IMPLEMENTATIONS["direct-pytorch"].is_default_on("cuda")
    assert not op.IMPLEMENTATIONS["efficient-triton"].is_default_on("cpu")
    args = build_parser().parse_args(["bench", "--impl", "efficient", "efficient-pytorch"])
    assert op.settings_from_args(args, args._bench_parser).impls == (
        "efficient", "efficient-pytorch"
    )  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--impl", "flash"], "--impl: expected names from sdpa, softmax-naive, direct, "),
        (["--n", "0"], "argument --n: expected a positive integer, got 0"),
        (["--d", "x"], "argument --d: expected a positive integer, got 'x'"),
        (["--max-call-s", "-1"], "argument --max-call-s: expected a positive number, got -1"),
        (["--budget-s", "nan"], "argument --budget-s: expected a positive number, got nan"),
        (["--quiet-wait-s", "-2"], "argument --quiet-wait-s: expected a number >= 0, got -2"),
        (["--pass", "bwd"], "argument --pass: invalid choice: 'bwd'"),
        (["--dtype", "fp8"], "argument --dtype: invalid choice: 'fp8'"),
        (["--device", "tpu"], "--device: expected cpu, cuda or cuda:<index>; got 'tpu'"),
        (["--report-only", "nowhere"], "--report-only: expected a folder holding results.json"),
        (["--report-only", ".", "--quick"], "expected no sweep options with it, got --quick"),
        (["--report-only", ".", "--n", "8"], "expected no sweep options with it, got --n"),
    ],
    ids=lambda x: x[0] if isinstance(x, list) else "",
)
def test_cli_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["bench", *argv])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cli_refuses_cuda_without_cuda(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--device", "cuda"])
    assert "--device: expected an available device; got 'cuda'" in capsys.readouterr().err


def test_report_only_refuses_foreign_json(tmp_path, capsys):
    (tmp_path / "results.json").write_text(json.dumps({"rows": []}))
    with pytest.raises(SystemExit):
        main(["bench", "--report-only", str(tmp_path)])
    assert "expected results.json written by taylorshift bench" in capsys.readouterr().err


def test_missing_tqdm_says_how_to_install(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm raises ImportError
    assert main([*CLI_FAST, "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "needs tqdm" in err and "pip install 'taylorshift[bench]'" in err
    assert not list(tmp_path.iterdir())


def test_noisy_point_is_timed_again(monkeypatch):
    # Quiet at the start, the first timing under load, the second quiet.
    shares = iter([0.0, 0.9, 0.05])
    monkeypatch.setattr(op.CpuLoad, "other_share", staticmethod(lambda a, b: next(shares)))
    monkeypatch.setattr(op.CpuLoad, "wait_quiet", lambda self, limit_s: 0.5)
    s = dataclasses.replace(FAST, ns=(8,), impls=("sdpa",), passes=("forward",), quiet_wait_s=5.0)
    results = op.run_sweep(s)
    (p,) = results["points"]
    assert p["other_cpu_share"] == 0.05 and p["remeasured"]["other_cpu_share"] == 0.9
    assert results["quiet_waited_s"] == 0.5 and results["other_cpu_share_start"] == 0.0


def test_model_flops_by_hand():
    # d = 4, N = 8: softmax 4 N² d; direct 4 N² d + 6 N²; efficient 2N (P + 2 D (d + 1)) with
    # P = d(d+1)/2 = 10 pairs and D = P + d + 1 = 15 symmetric features.
    assert op.model_flops("softmax", 8, 4, "forward") == 4 * 64 * 4 == 1024
    assert op.model_flops("taylorshift-direct", 8, 4, "forward") == 1024 + 6 * 64
    assert op.model_flops("taylorshift-efficient", 8, 4, "forward") == 16 * (10 + 2 * 15 * 5)
    assert op.model_flops("softmax", 8, 4, "forward+backward", rows=6) == 3 * 6 * 1024


def test_time_points_carry_model_flops_and_gflops(sweep_dir):
    _, results = sweep_dir
    for p in results["points"]:
        assert p["model_flops"] == op.model_flops(p["family"], p["n"], p["d"], p["pass"])
        assert p["gflops"] == pytest.approx(p["model_flops"] / p["median_s"] / 1e9)


def test_quiet_gate_waits_before_points_and_remeasures_after_the_sweep(monkeypatch):
    # Quiet at the start; N = 8 timed under load twice (during the sweep), quiet after it;
    # N = 16 quiet.
    shares = iter([0.0, 0.9, 0.8, 0.1, 0.05])
    monkeypatch.setattr(op.CpuLoad, "other_share", staticmethod(lambda a, b: next(shares)))
    waits = []
    monkeypatch.setattr(op.CpuLoad, "wait_quiet", lambda self, limit_s: waits.append(limit_s) or 1)
    s = dataclasses.replace(
        FAST, ns=(8, 16), impls=("sdpa",), passes=("forward",), quiet_wait_s=60.0,
        quiet_before_s=2.0, remeasure_noisy=True,
    )  # fmt: skip
    results = op.run_sweep(s)
    first, second = results["points"]
    # before N = 8, again after its noisy timing, before N = 16, before the re-measure
    assert waits == [2.0, 10.0, 2.0, 10.0]
    assert first["other_cpu_share"] == 0.05
    assert first["remeasured_after_sweep"]["other_cpu_share"] == 0.8
    assert first["remeasured"]["other_cpu_share"] == 0.9
    assert second["other_cpu_share"] == 0.1 and "remeasured_after_sweep" not in second
    assert results["quiet_waited_s"] == 4
    report = op.report_markdown(results)
    assert "- Quiet gate: before each time point the sweep waited up to 2 s" in report
    assert "1 time points were timed once more after the sweep" in report
