"""`taylorshift bench models`: rows, FLOPs, failures as results, Pareto fronts, files, CLI.

Every model is made tiny (width 16-32, one block, 16-64 tokens) and timing is cut to a
couple of calls; nothing asserts on time. Fresh-process memory points (~3 s each on the
CPU) are measured in one test only.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import replace

import pytest
import torch

from taylorshift.bench import machine, measure
from taylorshift.bench import models as bm
from taylorshift.bench.models import sweep as bm_sweep
from taylorshift.cli import build_parser, main

TINY = ("--set", "dim=16", "--set", "depth=1", "--seq-len", "16")
FAST = bm.Settings(
    max_batch=4, train_batch=2, target_s=1e-3, warmup_s=0.0, min_reps=1, max_reps=2, memory=False
)


def plan(*argv: str) -> list[bm.Case]:
    args = build_parser().parse_args(["bench", "models", *argv])
    cases, _ = bm.plan(args, args._bench_parser)
    return cases


def one_case(*argv: str) -> bm.Case:
    """A single tiny row; ``argv`` overrides the defaults (the last of a flag wins)."""
    defaults = ("--models", "cifar-pixel-small", "--kernels", "taylorshift", "--mode", "efficient")
    (case,) = plan(*defaults, *argv, *TINY, "--heads-sweep")
    return case


@pytest.mark.parametrize(
    "argv",
    [
        ("--models", "cifar-pixel-small", "--kernels", "taylorshift", "--mode", "efficient"),
        ("--models", "listops-small", "--kernels", "softmax", "--projections", "super"),
        ("--models", "vit-micro", "--kernels", "linear", "--projections", "optimized"),
    ],
    ids=["taylorshift-efficient", "softmax-super", "vit-linear-optimized"],
)
def test_row_structure_and_exact_parameter_count(argv):
    case = one_case(*argv)
    row = bm.measure_case(case, FAST)
    assert row["status"] == "ok"
    for key in ("flops_status", "throughput_status", "train_status"):
        assert row[key] == "ok", (key, row["errors"])
    assert row["train_memory_status"] == row["inference_memory_status"] == "skipped"
    model = bm.build_model(case.spec(), "cpu", torch.float32)
    assert row["params"] == sum(p.numel() for p in model.parameters())
    assert row["name"] == case.name and row["group"] == "models"
    assert row["dim"] == 16 and row["depth"] == 1 and row["head_dim"] == 16 // row["heads"]
    assert row["flops_train"] > row["flops_forward"] > 0
    batches = [p["batch"] for p in row["curve"]]
    assert batches == [2**i for i in range(len(batches))] and batches[-1] <= FAST.max_batch
    assert row["best_batch"] in batches
    best = max(p["samples_per_s"] for p in row["curve"] if p["status"] == "ok")
    assert row["throughput"] == best
    assert row["throughput_stop"] in ("no improvement", "max batch")
    assert row["train_step_s"] > 0 and row["train_batch"] == 2
    assert row["inference_state_bytes"] == 4 * row["params"]  # fp32, no buffers
    assert row["train_state_bytes"] >= 3 * row["inference_state_bytes"]  # + AdamW moments
    json.dumps(row)  # JSON-ready as is


def test_case_names_and_overrides():
    cases = plan(
        "--models", "listops-small", "--kernels", "taylorshift", "softmax", "--mode", "direct",
        "efficient", "--projections", "standard", "super", *TINY, "--heads-sweep", "2", "4",
        "--heads-model", "cifar-pixel-small",
    )  # fmt: skip
    names = [c.name for c in cases if c.group == "models"]
    assert names == [
        "listops-small/taylorshift-direct/standard",
        "listops-small/taylorshift-direct/super",
        "listops-small/taylorshift-efficient/standard",
        "listops-small/taylorshift-efficient/super",
        "listops-small/softmax/standard",
        "listops-small/softmax/super",
    ]
    sup = cases[1]
    assert sup.tokens == 17 and sup.overrides["context_len"] == 17  # 16 tokens + CLS
    assert sup.overrides["kernel_args"] == {"mode": "direct"}
    assert cases[4].overrides["kernel_args"] == {}  # softmax takes no TaylorShift options
    heads = [c for c in cases if c.group == "heads"]
    assert [c.name for c in heads] == [
        f"cifar-pixel-small/taylorshift-{m}/standard/h{h}"
        for h in (2, 4)
        for m in ("direct", "efficient")
    ]
    assert [c.overrides["num_heads"] for c in heads] == [2, 2, 4, 4]
    (vit,) = plan(
        "--models", "vit-micro", "--kernels", "model", "--mode", "efficient", "--seq-len", "4",
        "--heads-sweep",
    )  # fmt: skip
    assert vit.overrides["img_size"] == 2 * 4 and vit.seq_len == 4  # 2 x 2 patches of 4 px
    assert vit.kernel == "taylorshift" and vit.mode == "efficient"
    repeated = plan("--quick", "--kernels", "taylorshift", "model", "--heads-sweep")
    assert [c.kernel for c in repeated] == ["taylorshift", "taylorshift"]  # one per model


def test_flops_grow_with_length_and_count_cpu_sdpa():
    case = one_case("--models", "cifar-pixel-small", "--kernels", "taylorshift")
    model = bm.build_model(case.spec(), "cpu", torch.float32)
    flops = {}
    for n in (16, 64):
        inputs, targets = bm.make_inputs(model, 1, n, "cpu", torch.float32)
        flops[n] = (
            bm.count_flops(model, inputs, targets, train=False),
            bm.count_flops(model, inputs, targets, train=True),
        )
    assert 0 < flops[16][0] < flops[64][0] and 0 < flops[16][1] < flops[64][1]
    assert flops[16][1] > flops[16][0]
    assert all(p.grad is None for p in model.parameters())  # counting leaves no gradients
    # SDPA on the CPU (a kernel torch's counter lacks) counts as the materialised softmax
    fwd = {}
    for kernel in ("softmax", "softmax-naive"):
        model = bm.build_model(one_case("--kernels", kernel).spec(), "cpu", torch.float32)
        inputs, targets = bm.make_inputs(model, 1, 64, "cpu", torch.float32)
        fwd[kernel] = bm.count_flops(model, inputs, targets, train=False)
    assert fwd["softmax"] == fwd["softmax-naive"]


def test_out_of_memory_at_build_is_a_result(monkeypatch):
    def no_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB")

    monkeypatch.setattr(bm_sweep, "build_model", no_memory)
    row = bm.measure_case(one_case(), FAST)
    assert row["status"] == "oom" and "out of memory" in row["errors"]["build"]
    for stage in bm.STAGES:
        assert row[f"{stage}_status"] == "oom"
    assert row["params"] is None and row["curve"] == []


def test_out_of_memory_in_the_batch_sweep_keeps_the_curve(monkeypatch):
    real = bm.make_inputs

    def small_only(model, batch, *args):
        if batch >= 4:
            raise torch.OutOfMemoryError(f"out of memory at batch {batch}")
        return real(model, batch, *args)

    monkeypatch.setattr(bm_sweep, "make_inputs", small_only)
    settings = replace(FAST, max_batch=16, min_gain=-1.0)  # never stop for lack of gain
    row = bm.measure_case(one_case(), settings)
    assert [(p["batch"], p["status"]) for p in row["curve"]] == [(1, "ok"), (2, "ok"), (4, "oom")]
    assert row["throughput_stop"] == "oom" and row["throughput_status"] == "ok"
    assert row["best_batch"] in (1, 2)
    assert row["train_status"] == "ok"  # batch 2 still fits


def test_spent_budget_is_a_status():
    row = bm.measure_case(one_case(), FAST, bm.Budget(0.0))
    assert row["status"] == "over budget" and row["throughput_status"] == "over budget"


@pytest.mark.parametrize(
    ("seconds", "max_batch", "stop", "batches"),
    [
        ({1: 1.0, 2: 1.0, 4: 4.0, 8: 1.0}, 64, "no improvement", [1, 2, 4]),
        ({1: 1.0, 2: 1.0, 4: 1.0}, 4, "max batch", [1, 2, 4]),
    ],
    ids=["plateau", "max-batch"],
)
def test_sweep_stops(monkeypatch, seconds, max_batch, stop, batches):
    def fake_time_call(fn, **kwargs):
        median = seconds[fn()]
        return measure.TimeResult(status="ok", median_s=median, q1_s=median, q3_s=median, reps=1)

    monkeypatch.setattr(measure, "time_call", fake_time_call)
    settings = bm.Settings(max_batch=max_batch)
    curve, why = bm.sweep_throughput(lambda b: lambda: b, settings, bm.Budget(None))
    assert why == stop and [p["batch"] for p in curve] == batches
    assert curve[1]["samples_per_s"] == 2.0


def test_sweep_stops_before_a_batch_predicted_over_the_memory_limit(monkeypatch):
    # Each sample costs 10 MiB of peak extra memory; with 50 MiB to spend the sweep times
    # batches 1, 2 and 4 and stops before 8 (predicted 80 MiB) instead of running into the
    # OOM killer.
    class FakePeak:
        def __init__(self, device):
            self.batch = 0

        def reset(self):
            pass

        def extra_bytes(self):
            return self.batch * 10 * 2**20

    peaks = []

    def fake_peak(device):
        peaks.append(FakePeak(device))
        return peaks[-1]

    def call_at(batch):
        peaks[-1].batch = batch
        return lambda: batch

    monkeypatch.setattr(bm_sweep, "PeakMemory", fake_peak)
    monkeypatch.setattr(measure, "time_call", lambda fn, **kw: measure.TimeResult(
        status="ok", median_s=1.0 / fn(), q1_s=1.0, q3_s=1.0, reps=1))  # fmt: skip
    settings = bm.Settings(max_batch=64, max_memory_bytes=50 * 2**20)
    curve, why = bm.sweep_throughput(call_at, settings, bm.Budget(None))
    assert why == "over budget (memory)"
    assert [p["batch"] for p in curve] == [1, 2, 4, 8]
    assert curve[-1]["status"] == "over budget" and "predicted 0.08 GiB" in curve[-1]["error"]
    assert [p["status"] for p in curve[:3]] == ["ok"] * 3


def test_peak_memory_sees_an_allocation():
    peak = bm_sweep.PeakMemory(torch.device("cpu"))
    peak.reset()
    block = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched
    extra = peak.extra_bytes()
    del block
    assert extra is None or extra >= 60 * 2**20  # None where /proc cannot tell


def test_pareto_front_on_synthetic_points():
    points = [(1, 50), (2, 60), (3, 55), (2, 60), (None, 90), (0.5, 40), (1, 45), (4, math.nan)]
    assert bm.pareto_front(points) == [True, True, False, True, False, True, False, False]
    # throughput: higher is better
    assert bm.pareto_front([(100, 50), (200, 40), (50, 50), (200, 45)], better="higher") == [
        True,
        False,
        False,
        True,
    ]
    assert bm.pareto_front([]) == []
    with pytest.raises(ValueError, match="better must be 'lower' or 'higher'; got 'up'"):
        bm.pareto_front([(1, 2)], better="up")


def test_accuracy_files(tmp_path):
    (tmp_path / "a.json").write_text('{"x/softmax/standard": 44.7, "y": 47}')
    assert bm.load_accuracy(tmp_path / "a.json") == {"x/softmax/standard": 44.7, "y": 47.0}
    (tmp_path / "a.csv").write_text("name,accuracy,seed\nx,44.5,1\ny,47,1\n")
    assert bm.load_accuracy(tmp_path / "a.csv") == {"x": 44.5, "y": 47.0}
    bad = {
        "list.json": ("[1, 2]", "must hold a JSON object"),
        "cols.csv": ("model,acc\nx,1\n", "'name' and 'accuracy' columns"),
        "text.json": ('{"x": "high"}', "accuracy of 'x' must be a number in %; got 'high'"),
        "broken.json": ('{"x": ', "is not valid JSON"),
    }
    for name, (text, message) in bad.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(ValueError, match=message):
            bm.load_accuracy(tmp_path / name)


def test_recipe_builds_a_training_step():
    spec = one_case().spec()
    step = bm.build_step(spec, batch=2, train=True)
    loss = step()
    assert loss.shape == () and torch.isfinite(loss)
    logits = bm.build_step(spec, batch=3, train=False)()
    assert logits.shape == (3, 10) and not logits.requires_grad


def test_cli_quick_writes_every_file(tmp_path, capsys):
    acc = tmp_path / "acc.json"
    names = [
        "cifar-pixel-small/taylorshift-efficient/standard",
        "cifar-pixel-small/softmax/standard",
        "listops-small/softmax/standard",
    ]
    acc.write_text(json.dumps({names[0]: 47.6, names[1]: 44.7, names[2]: 40.0, "other": 1}))
    out = tmp_path / "out"
    argv = ["bench", "models", "--quick", "--out", str(out), "--no-memory", "--max-batch", "2"]
    assert main([*argv, "--target-s", "0.001", "--accuracy", str(acc)]) == 0
    stdout = capsys.readouterr().out
    assert "| row | params |" in stdout and "wrote results.json" in stdout
    results = json.loads((out / "results.json").read_text())
    rows = results["rows"]
    assert [r["group"] for r in rows] == ["models"] * 4 + ["heads"] * 2
    assert [r["heads"] for r in rows[4:]] == [2, 8]
    assert results["config"]["quick"] and results["machine"]["device"] == "cpu"
    assert results["command"] == machine.command_line()  # sys.argv: here pytest's
    assert {r["name"]: r["accuracy"] for r in rows if r["accuracy"] is not None} == {
        names[0]: 47.6,
        names[1]: 44.7,
        names[2]: 40.0,
    }
    assert results["accuracy"]["unmatched"] == ["other"]
    assert set(results["pareto"]) == {m.key for m in bm.METRICS}
    assert names[0] in results["pareto"]["params"]  # the most accurate is always on the front
    csv_lines = (out / "results.csv").read_text().splitlines()
    assert len(csv_lines) == 1 + len(rows) and csv_lines[0].startswith("name,group,model")
    report = (out / "report.md").read_text()
    for text in ("## Models", "## Heads at fixed width", "## Pareto fronts", "## Machine"):
        assert text in report
    assert results["command"] in report and "samples/s" in report and "MiB" in report
    pngs = {p.name for p in out.glob("*.png")}
    assert pngs == {m.file for m in bm.METRICS} | {"throughput-vs-batch.png", "heads-sweep.png"}
    assert not list(out.glob(".*.tmp"))  # atomic writes leave no temporaries


def test_cli_measures_peak_memory_in_a_fresh_process(tmp_path):
    out = tmp_path / "mem"
    argv = ["bench", "models", "--quick", "--out", str(out), "--models", "cifar-pixel-small"]
    argv += ["--kernels", "taylorshift", "--heads-sweep", "--max-batch", "1", "--no-plots"]
    assert main([*argv, "--target-s", "0.001"]) == 0
    (row,) = json.loads((out / "results.json").read_text())["rows"]
    assert row["memory_method"] == "fresh-process VmHWM"
    for prefix in ("train", "inference"):
        assert row[f"{prefix}_memory_status"] == "ok", row["errors"]
        extra, state = row[f"{prefix}_memory_extra_bytes"], row[f"{prefix}_state_bytes"]
        assert extra >= 0 and state > 0 and row[f"{prefix}_memory_bytes"] == extra + state
    assert not list(out.glob("*.png"))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--models", "cifar-pixle"), "--models: expected a registry model"),
        (("--models", "cifar-pixle"), "got 'cifar-pixle' (did you mean cifar-pixel"),
        (("--kernels", "flash"), "argument --kernels: invalid choice: 'flash'"),
        (("--mode", "fast"), "argument --mode: invalid choice: 'fast'"),
        (("--max-batch", "0"), "argument --max-batch: expected a positive integer, got 0"),
        (("--budget-s", "-1"), "argument --budget-s: expected a positive number, got -1"),
        (("--set", "dim"), "argument --set: expected FIELD=VALUE (e.g. dim=64), got 'dim'"),
        (("--set", "dim=33"), "--set: model 'cifar-pixel-small' does not accept these settings"),
        (("--set", "colour=1"), "has no setting 'colour'"),
        (("--set", "attn_kernel=softmax"), "--set attn_kernel: expected a size or model setting"),
        (
            ("--heads-sweep", "3", "8"),
            "--heads-sweep: expected head counts dividing cifar-pixel-small's dim 32; got 3",
        ),
        (
            ("--models", "vit-micro", "--seq-len", "10"),
            "--seq-len for the ViT 'vit-micro' counts patches: expected a square number",
        ),
        (("--accuracy", "/nonexistent/acc.json"), "--accuracy: expected a JSON object or CSV"),
        (("--device", "tpu:x"), "--device: expected cpu, cuda or cuda:<index>; got 'tpu:x'"),
    ],
    ids=[
        "model",
        "model-hint",
        "kernel",
        "mode",
        "max-batch",
        "budget",
        "set-form",
        "set-value",
        "set-unknown",
        "set-kernel",
        "heads",
        "vit-seq-len",
        "accuracy",
        "device",
    ],
)
def test_bad_options_name_flag_expected_and_actual(capsys, tmp_path, argv, message):
    with pytest.raises(SystemExit) as excinfo:
        main(["bench", "models", "--quick", "--out", str(tmp_path), *argv])
    assert excinfo.value.code == 2
    assert message in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # refused before measuring anything


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_unavailable_cuda_is_refused(capsys, tmp_path):
    with pytest.raises(SystemExit):
        main(["bench", "models", "--quick", "--out", str(tmp_path), "--device", "cuda"])
    assert "--device: expected an available device; got 'cuda'" in capsys.readouterr().err


def test_missing_bench_extra_is_a_message_not_an_exit(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm -> ImportError
    assert main(["bench", "models", "--quick", "--out", str(tmp_path), "--no-memory"]) == 1
    assert "pip install 'taylorshift[bench]'" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_other_errors_are_statuses_too(monkeypatch):
    def broken(*args, **kwargs):
        raise ValueError("inputs must be token ids")

    monkeypatch.setattr(bm_sweep, "make_inputs", broken)
    row = bm.measure_case(one_case(), FAST)
    assert row["status"] == "ok"  # the model was built
    assert (
        row["flops_status"]
        == row["throughput_status"]
        == row["train_status"]
        == ("error: ValueError")
    )
    assert row["curve"][0]["error"] == "inputs must be token ids"


def test_old_spellings_warn_and_name_the_new_ones(tmp_path):
    with pytest.warns(DeprecationWarning, match=r"render_report is now .*\.report_markdown"):
        assert bm.render_report is bm.report_markdown
    with pytest.warns(DeprecationWarning, match=r"render_summary is now .*\.summary"):
        assert bm.render_summary is bm.summary
    results = {
        "rows": [],
        "config": {"device": "cpu", "dtype": "float32", "train_batch": 1, "max_batch": 1},
        "machine": {},
        "command": "taylorshift bench models",
        "elapsed_s": 0.0,
    }
    with pytest.warns(DeprecationWarning, match=r"is now write_outputs\(results, out\)"):
        written = bm.write_outputs(tmp_path, results, plots=False)
    assert sorted(p.name for p in written) == ["report.md", "results.csv", "results.json"]
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        bm.nothing  # noqa: B018
