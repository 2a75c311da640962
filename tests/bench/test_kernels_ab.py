"""benchmarks/gpu/kernels_ab.py, the focused GPU command: its chunked float64 reference
against the plain one, its FLOP counts against taylorshift.theory, its point predictions,
and its report's verdicts against the issue's targets on a GPU-shaped record (the dry run,
which runs every step under the interpreter, is a step of ``benchmarks/gpu/run --dry-run``)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch

from taylorshift import naive_taylor_shift_attention
from taylorshift.theory import impl_ops_efficient
from tests.helpers import script_module

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu" / "kernels_ab.py"


@pytest.fixture(scope="module")
def kab():
    with script_module(SCRIPT, "kernels_ab") as module:
        yield module


@pytest.mark.parametrize("causal", [False, True], ids=["noncausal", "causal"])
@pytest.mark.parametrize("rows", [7, 24, 100], ids=["rows7", "rows24", "rows100"])
def test_chunked_reference_matches_the_plain_one(kab, causal, rows):
    gen = torch.Generator().manual_seed(0)
    q, k, v, g = (torch.randn(2, 3, 23, 5, generator=gen, dtype=torch.float64) for _ in range(4))
    y, grads = kab.chunked_naive(q, k, v, g, causal, rows)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    expected = naive_taylor_shift_attention(*leaves, None, causal)
    expected_grads = torch.autograd.grad(expected, leaves, g)
    torch.testing.assert_close(y, expected.detach(), rtol=1e-12, atol=1e-12)
    for got, want in zip(grads, expected_grads, strict=True):
        assert got.dtype == torch.float64
        torch.testing.assert_close(got, want, rtol=1e-11, atol=1e-12)


def test_flop_counts(kab):
    per_head = impl_ops_efficient(4096, 4096, 64, 64, False, 256)
    assert kab.efficient_flops(32, 4096, 64, False, False) == 32 * per_head
    assert kab.efficient_flops(32, 4096, 64, False, True) == 3 * 32 * per_head
    assert kab.efficient_flops(1, 4096, 64, True, False) > per_head  # the diagonal blocks
    assert kab.sdpa_flops(2, 1024, 64, False, False) == 2 * 4 * 1024**2 * 64
    assert kab.sdpa_flops(2, 1024, 64, True, True) == 3.5 * 4 * 1024**2 * 64
    assert kab.tflops(2e12, {"status": "ok", "ms": 1000.0}) == pytest.approx(2.0)
    assert kab.tflops(2e12, {"status": "oom"}) is None


def test_points_predicted_too_long_or_past_the_deadline_are_refused(kab, tmp_path):
    args = argparse.Namespace(
        dry_run=True, deadline_at=None, out=tmp_path, before_src=None, step="op"
    )
    ctx = kab.Ctx(args)
    ctx.sizes = kab.GPU
    key = ("sdpa", False, True, 64)
    assert ctx.refuse(key, 1024, 2) == ""  # nothing to predict from: timed
    ctx.last[key] = (32768, 0.3)
    assert ctx.refuse(key, 65536, 2) == ""  # 1.2 s a call
    assert "predicted at 4.8 s" in ctx.refuse(key, 131072, 2)
    ctx.deadline = kab.time.time() + 4
    assert "s left" in ctx.refuse(key, 65536, 2)  # 5 calls of 1.2 s
    ctx.deadline = kab.time.time() + 1
    assert ctx.refuse(key, 1024, 2).startswith("deadline")


def _op_points(kab, ms_of):
    points = []
    for n in (1024, 2048, 4096, 8192, 16384, 32768, 65536):
        for causal in (False, True):
            for impl in ("sdpa", "efficient", "direct"):
                point = {"impl": impl, "n": n, "d": 64, "causal": causal, "backward": True}
                ms = ms_of(impl, n, causal)
                point.update(
                    {"status": "ok", "ms": ms}
                    if ms
                    else {
                        "status": "over budget",
                        "reason": "a call predicted at 9.0 s (limit 2.5 s)",
                    }
                )
                points.append(point)
    return points


def test_report_verdicts_on_a_gpu_shaped_record(kab):
    def ms_of(impl, n, causal):
        if impl == "sdpa":  # N², causal half
            return 2e-7 * n * n / (2 if causal else 1)
        if impl == "efficient":  # N, causal 4x dearer: wins from 4,096 non-causal, 16,384 causal
            return 7e-4 * n * (4 if causal else 1)
        return None if n > 16384 else 4e-7 * n * n

    op = {"status": "ok", "seconds": 120.0, "limit_s": 190.0, "points": _op_points(kab, ms_of)}
    op["summary"] = kab.summary(op["points"])
    case = op["summary"]["non-causal forward+backward, d 64"]
    assert case["efficient_wins"]["status"] == "crossed"
    assert case["efficient_wins"]["n_above"] == 4096
    kernels = {
        "status": "ok",
        "seconds": 60.0,
        "limit_s": 100.0,
        "dtype": "bfloat16",
        "launch": {"new": {"block_n": 32}},
        "points": [
            {
                "rev": rev,
                "n": 16384,
                "d": 64,
                "backward": backward,
                "status": "ok",
                "ms": ms,
                "tflops": 300.0,
                "kernels_ms": ms * 0.9,
                "kernels_tflops": tf,
                "kernels_of_matmul": tf / 800,
                "kernel_ms": {"_apply_kernel": ms * 0.5},
            }
            for rev, backward, ms, tf in (
                ("new", False, 1.0, 400.0),
                ("old", False, 2.0, 200.0),
                ("new", True, 3.0, 200.0),
                ("old", True, 5.0, 120.0),
            )
        ],
    }
    graph = {
        "status": "ok",
        "seconds": 20.0,
        "limit_s": 40.0,
        "points": [
            {
                "impl": "sdpa",
                "n": 1024,
                "d": 64,
                "causal": False,
                "status": "ok",
                "eager_ms": 0.2,
                "graph_ms": 0.1,
                "eager_over_graph": 2.0,
            },
            {
                "impl": "efficient",
                "n": 1024,
                "d": 64,
                "causal": False,
                "status": "error: RuntimeError",
                "eager_ms": 0.5,
                "error": "operation not permitted when stream is capturing",
                "capture_failed": True,
            },
        ],
    }
    error = {
        "status": "ok",
        "seconds": 9.0,
        "limit_s": 55.0,
        "points": [
            {
                "n": 4096,
                "b": 4,
                "h": 2,
                "causal": False,
                "status": "ok",
                "kernel": dict.fromkeys(("out", "grad_q", "grad_k", "grad_v"), 2e-3),
                "reference": dict.fromkeys(("out", "grad_q", "grad_k", "grad_v"), 4e-3),
            },
            {
                "n": 65536,
                "b": 1,
                "h": 2,
                "causal": False,
                "status": "over budget",
                "reason": "predicted 80 s, 20 s left",
            },
        ],
    }
    results = {
        "dry_run": False,
        "started": "2026-12-01 12:00:00",
        "command": "kernels_ab.py OUT",
        "budget_s": 480.0,
        "sizes": {**vars(kab.GPU)},
        "steps": {
            "environment": {
                "status": "ok",
                "seconds": 5.0,
                "limit_s": 27.0,
                "gpu": "NVIDIA H200",
                "matmul_tflops": 800.0,
                "points": [],
            },
            "kernels": kernels,
            "op": op,
            "op_graph": graph,
            "error": error,
            "d128": {
                "status": "timeout",
                "seconds": 50.0,
                "limit_s": 50.0,
                "reason": "killed at its limit of 50 s (points so far kept)",
                "points": [],
            },
        },
    }
    text = kab.report(results)
    verdicts = {}
    for line in text.splitlines():
        for key, template in kab.TARGETS:
            if line.startswith("| " + template.format(**kab.GPU.targets)):
                verdicts[key] = line.rstrip(" |").rsplit("| ", 1)[-1]
    assert verdicts == {
        "fwd_bwd_from": "yes",  # wins from 4,096 on
        "ratio_at": "yes",  # 0.2·65536² / (0.7·65536) / 1e3 = 18.7
        "kernels_fwd": "yes",  # 400 / 800 = 50 %
        "kernels_fwd_bwd": "no",  # 200 / 800 = 25 %
        "causal_from": "no",  # causal wins from 16,384 only
    }
    assert "| 16,384 | fwd | 2 | 1 | 2 |" in text  # old ÷ new
    assert "operation not permitted when stream is capturing" in text
    assert "| d128 | d = 128, non-causal | timeout |" in text
    assert "| 65,536 | non-causal | 2 | over budget |" in text
