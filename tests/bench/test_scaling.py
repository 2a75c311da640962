"""``taylorshift bench scaling``: the intermediates against independent computations, the
growth the paper reports, the predicted sizes, the files and the command line."""

from __future__ import annotations

import csv
import json
import math
import sys

import pytest
import torch

from taylorshift import taylor_shift_attention
from taylorshift.bench import scaling
from taylorshift.cli import main


def unit_rows(n, d, seed):
    x = torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return x / x.norm(dim=-1, keepdim=True)


@pytest.mark.parametrize("n, d", [(1, 1), (5, 3), (7, 4)], ids=lambda x: str(x))
def test_plain_intermediates_match_the_quadratic_forms(n, d):
    q, k, v = (unit_rows(n, d, s) for s in range(3))
    got = scaling.intermediates(q, k, v, "plain", queries=n)
    s = q @ k.T  # (N, N)
    vp = torch.cat([torch.ones(n, 1, dtype=v.dtype), v], dim=-1)
    w = 1 + s + s**2 / 2
    a_mod = torch.einsum("ja,jb,jc->abc", k, k, vp)  # Σ_j (k_j ⊗ k_j) v'_jᵀ
    expected = {
        "A_mod": a_mod.norm(),
        "squared": ((s**2) @ vp).norm(dim=-1).mean(),
        "linear": (s @ vp).norm(dim=-1).mean(),
        "denominator": w.sum(-1).abs().mean(),
        "output": ((w @ v) / w.sum(-1, keepdim=True)).norm(dim=-1).mean(),
    }
    for name, value in expected.items():
        assert got[name][0] == pytest.approx(value.item(), rel=1e-12), name
    assert got["denominator"][1] == pytest.approx(w.sum(-1).max().item(), rel=1e-12)


@pytest.mark.parametrize("n, d", [(1, 2), (6, 3), (9, 5)], ids=lambda x: str(x))
def test_normalised_intermediates_follow_algorithm_1(n, d):
    gen = torch.Generator().manual_seed(n + d)
    q, k = (3 * torch.randn(n, d, generator=gen, dtype=torch.float64) for _ in range(2))
    v = unit_rows(n, d, 7)
    got = scaling.intermediates(q, k, v, "normalised", queries=n)
    qn, kn = q / q.norm(dim=-1, keepdim=True), k / k.norm(dim=-1, keepdim=True)
    s = qn @ kn.T
    vh = torch.cat([math.sqrt(d / n) * torch.ones(n, 1, dtype=v.dtype), v], dim=-1) / n
    # Q, K times d^¼: scores √d·s; coefficients ½, √d, d: every weight is d·w(s)
    w = 1 + s + s**2 / 2
    expected = {
        "A_mod": math.sqrt(d) * torch.einsum("ja,jb,jc->abc", kn, kn, vh).norm(),  # α² = √d
        "squared": ((d * s**2) @ vh).norm(dim=-1).mean(),
        "linear": ((math.sqrt(d) * s) @ vh).norm(dim=-1).mean(),
        "denominator": (d * w @ vh[:, 0]).abs().mean(),
    }
    for name, value in expected.items():
        assert got[name][0] == pytest.approx(value.item(), rel=1e-12), name
    # the output is the library's normalised TaylorShift (τ = 1): y · sqrt(N/d)
    y = taylor_shift_attention(q[None, None], k[None, None], v[None, None], mode="direct")
    assert got["output"][0] == pytest.approx(y[0, 0].norm(dim=-1).mean().item(), rel=1e-12)


def test_plain_sizes_grow_with_n_and_normalised_ones_stay_bounded():
    d = 4
    small, large = (
        scaling.intermediates(*(unit_rows(n, d, s) for s in range(3)), variant, queries=64)
        for n, variant in ((16, "plain"), (1024, "plain"))
    )
    # w(s) >= 1/2 and ‖KᵀK‖_F >= tr(KᵀK)/√d = N/√d for unit keys: lower bounds by math
    for n, found in ((16, small), (1024, large)):
        assert found["denominator"][0] >= n / 2
        assert found["A_mod"][0] >= n / math.sqrt(d) * (1 - 1e-12)
    for name in ("A_mod", "squared", "denominator"):
        assert large[name][0] > 10 * small[name][0], name
    # normalised, |s| <= 1 so w <= 5/2: Y_denom <= 5/2·d·sqrt(d/N), A_mod <= sqrt(d (d/N + 1))
    for n in (16, 1024):
        found = scaling.intermediates(*(unit_rows(n, d, s) for s in range(3)), "normalised", 64)
        assert found["denominator"][1] <= 2.5 * d * math.sqrt(d / n)
        assert found["A_mod"][0] <= math.sqrt(d * (d / n + 1))


@pytest.mark.parametrize("values", scaling.VALUES)
def test_measured_sizes_match_the_predicted_ones(values):
    rows = scaling.measure([256], [8], 3, torch.float64, values, queries=256)
    assert len(rows) == len(scaling.VARIANTS) * len(scaling.INTERMEDIATES)
    for r in rows:
        # RMS predictions; a mean norm is a little lower (Jensen) and three draws are noisy
        assert 0.75 < r["measured_over_predicted"] < 1.15, r
        assert (r["paper"] is None) == (r["variant"] == "normalised")


def test_paper_table_1_at_a_point():
    assert scaling.paper_formula("A_mod", 99, 4) == pytest.approx(50.0)
    assert scaling.paper_formula("denominator", 100, 2) == pytest.approx(100.0)
    assert scaling.paper_formula("output", 4, 16) == pytest.approx(2.0)


def test_overflow_length_extrapolates_a_power_law():
    n_over, slope = scaling.overflow_length([(n, 2.0 * n) for n in (16, 64, 256, 1024)])
    assert slope == pytest.approx(1.0) and n_over == pytest.approx(32752)
    assert scaling.overflow_length([(16, 5.0), (64, 5.0), (256, 5.0)])[0] is None
    # passed inside the grid: interpolated between 16 and 64 in log-log
    expected = 16 * (65504 / 1e3) ** (math.log(4) / math.log(100))
    assert scaling.overflow_length([(16, 1e3), (64, 1e5), (256, 1e7)])[0] == pytest.approx(expected)
    assert scaling.overflow_length([(1, 7e4), (2, 8e4)])[0] == 1


def test_cli_writes_every_output(tmp_path, capsys):
    out = tmp_path / "res"
    argv = ["bench", "scaling", "--n", "1", "8", "32", "--d", "2", "3", "--seeds", "2"]
    assert main([*argv, "--out", str(out)]) == 0
    assert "float16 overflow" in capsys.readouterr().out
    result = json.loads((out / "results.json").read_text())
    assert result["settings"]["n"] == [1, 8, 32] and result["settings"]["d"] == [2, 3]
    assert {"cpu_model", "torch"} <= set(result["machine"]) and "scaling" in result["command"]
    assert len(result["rows"]) == 3 * 2 * len(scaling.VARIANTS) * len(scaling.INTERMEDIATES)
    assert len(result["overflow"]) == 2 * len(scaling.VARIANTS) * len(scaling.INTERMEDIATES)
    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(result["rows"]) and "mean_norm" in rows[0]
    report = (out / "report.md").read_text()
    assert "## plain, d = 3" in report and "float16 overflow" in report
    assert (out / "scaling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(out.glob(".*.tmp"))


def test_cli_without_matplotlib_says_how_to_get_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import raises ImportError
    argv = ["bench", "scaling", "--n", "4", "--d", "2", "--out", str(tmp_path / "x")]
    assert main(argv) == 1
    assert "pip install 'taylorshift[bench]'" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
    assert main([*argv, "--no-plot"]) == 0
    assert not (tmp_path / "x" / "scaling.png").exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--d", "0"], "argument --d: expected a positive integer, got 0"),
        (["--n", "x"], "argument --n: expected a positive integer, got 'x'"),
        (["--seeds", "-1"], "argument --seeds: expected a positive integer, got -1"),
        (["--d", "4", "300"], "--d expected head dims of at most 256; got 300"),
        (["--dtype", "float16"], "argument --dtype: invalid choice: 'float16'"),
        (["--values", "cube"], "argument --values: invalid choice: 'cube'"),
    ],
    ids=["d-zero", "n-text", "seeds", "d-large", "dtype", "values"],
)
def test_cli_errors_name_the_flag(capsys, tmp_path, argv, message):
    with pytest.raises(SystemExit) as excinfo:
        main(["bench", "scaling", *argv, "--out", str(tmp_path)])
    assert excinfo.value.code == 2
    assert message in capsys.readouterr().err


def test_old_plot_keyword_warns_and_names_plots(tmp_path):
    rows = scaling.measure([4], [4], 1, torch.float64, "sphere", queries=4)
    result = {
        "machine": {"cpu_model": "x", "torch": "y"},
        "command": "taylorshift bench scaling",
        "settings": {"n": [4], "d": [4], "seeds": 1, "dtype": "float64", "queries": 4,
                     "values_text": "uniform on the unit sphere"},
        "rows": rows,
        "overflow": scaling.overflow_table(rows),
    }  # fmt: skip
    with pytest.warns(DeprecationWarning, match=r"plot=\) is now write_outputs\(\.\.\., plots=\)"):
        written = scaling.write_outputs(result, tmp_path, plot=False)
    assert sorted(p.name for p in written) == ["report.md", "results.csv", "results.json"]
