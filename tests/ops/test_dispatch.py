"""mode="auto": which form it picks and why."""

from __future__ import annotations

import json
import logging
import math
import subprocess
import sys
import warnings

import pytest
import torch

from taylorshift import taylor_shift_attention, theory
from taylorshift.ops.taylor_shift import calibration, dispatch, interface
from taylorshift.ops.taylor_shift.dispatch import (
    Decision,
    choose_mode,
    decide_mode,
    switch_length,
)
from taylorshift.ops.taylor_shift.efficient_causal import DEFAULT_CAUSAL_CHUNK
from tests.helpers import write_calibration


def test_auto_picks_direct_for_short_and_efficient_for_long_sequences():
    kw = dict(causal=False, order=2, mask_varies=False)
    assert choose_mode(64, 64, 64, 64, **kw) == "direct"
    assert choose_mode(16_384, 16_384, 64, 64, **kw) == "efficient"
    assert choose_mode(4096, 4096, 8, 8, **kw) == "efficient"


# Where theory switches forms, worked out by hand from the accounting in theory.py (per
# head, self-attention, dv = d, order 2): direct costs c = 2d + 2dv + 6 per (query, key)
# pair, efficient P = d(d+1)/2 + 2·D·(dv+1) per token with D = d(d+1)/2 + d + 1, so they
# are equal at N* = 2P/c. d = 8: D = 45, P = 36 + 810 = 846, c = 38, N* = 44.5;
# d = 16: D = 153, P = 136 + 5202 = 5338, c = 70, N* = 152.5; d = 32: D = 561,
# P = 528 + 37026 = 37554, c = 134, N* = 560.5; d = 64: D = 2145, P = 2080 + 278850 =
# 280930, c = 262, N* = 2144.5. The efficient form is chosen from the next integer on.
THEORY_SWITCH = {8: 45, 16: 153, 32: 561, 64: 2145}


@pytest.mark.parametrize(("d", "switch"), THEORY_SWITCH.items(), ids=lambda x: str(x))
def test_auto_crossover_follows_the_operation_counts(d, switch):
    kw = dict(causal=False, order=2, mask_varies=False)
    assert choose_mode(switch - 1, switch - 1, d, d, **kw) == "direct"
    assert choose_mode(switch, switch, d, d, **kw) == "efficient"


@pytest.mark.parametrize(("d", "switch"), THEORY_SWITCH.items(), ids=lambda x: str(x))
def test_switch_length_is_the_hand_worked_switch(d, switch):
    # the length that graphs traced with symbolic sizes compare with (interface.py)
    assert switch_length(d, d, causal=False, order=2, mask_varies=False) == switch


@pytest.mark.parametrize("backward", [False, True], ids=["fwd", "fwd+bwd"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_switch_length_is_where_the_cpu_priors_change_form(causal, backward):
    for d, heads in [(8, 2), (16, 4), (32, 64), (64, 256)]:
        kw = dict(causal=causal, order=2, mask_varies=False, device="cpu", backward=backward)
        kw.update(dtype=torch.float32, batch_heads=heads)
        switch = switch_length(d, d, **kw)
        assert choose_mode(switch - 1, switch - 1, d, d, **kw) == "direct", (d, heads)
        assert choose_mode(switch, switch, d, d, **kw) == "efficient", (d, heads)


def test_switch_length_is_none_where_auto_never_runs_efficient():
    assert switch_length(8, 8, causal=False, order=4, mask_varies=False) is None
    assert switch_length(8, 8, causal=False, order=2, mask_varies=True) is None
    assert switch_length(8, 8, causal=False, order=2, mask_varies=False) == THEORY_SWITCH[8]


def test_auto_uses_direct_when_efficient_cannot():
    n = 10**5
    decision = decide_mode(n, n, 8, 8, causal=False, order=4, mask_varies=False)
    assert decision == Decision("direct", "order")
    decision = decide_mode(n, n, 8, 8, causal=False, order=2, mask_varies=True)
    assert decision == Decision("direct", "mask")


@pytest.fixture
def forms_run(monkeypatch) -> list[str]:
    """The names of the forms ``taylor_shift_attention`` calls, in order (a spy on each)."""
    calls: list[str] = []
    for name in ("direct_taylor_shift", "efficient_taylor_shift", "causal_efficient_taylor_shift"):
        form = getattr(interface, name)

        def spy(*args, _form=form, _name=name, **kwargs):
            calls.append(_name)
            return _form(*args, **kwargs)

        monkeypatch.setattr(interface, name, spy)
    return calls


EFFICIENT = {False: "efficient_taylor_shift", True: "causal_efficient_taylor_shift"}


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_auto_runs_the_chosen_form_and_matches_both_forms(forms_run, causal):
    q, k, v = (torch.randn(1, 2, 600, 4, dtype=torch.float64) for _ in range(3))
    kw = dict(causal=causal, order=2, mask_varies=False, device="cpu", dtype=torch.float64)
    assert decide_mode(600, 600, 4, 4, **kw, batch_heads=2) == Decision("efficient", "theory")
    y = taylor_shift_attention(q, k, v, is_causal=causal)
    assert forms_run == [EFFICIENT[causal]]
    # positive control: the spy sees the other form when it is asked for
    other = taylor_shift_attention(q, k, v, is_causal=causal, mode="direct")
    assert forms_run[1:] == ["direct_taylor_shift"]
    torch.testing.assert_close(y, other, rtol=1e-10, atol=1e-12)


def test_auto_logs_its_choice(caplog):
    q, k, v = (torch.randn(1, 2, 600, 4, dtype=torch.float64) for _ in range(3))
    with caplog.at_level(logging.DEBUG, logger="taylorshift.dispatch"):
        taylor_shift_attention(q, k, v)
    assert "auto -> efficient" in caplog.text


def test_auto_with_query_varying_mask_runs_direct(forms_run):
    q, k, v = (torch.randn(1, 1, 300, 4, dtype=torch.float64) for _ in range(3))
    mask = torch.rand(300, 300) > 0.5
    assert decide_mode(300, 300, 4, 4, causal=False, order=2, mask_varies=True).basis == "mask"
    taylor_shift_attention(q, k, v, mask)
    assert forms_run == ["direct_taylor_shift"]
    taylor_shift_attention(q, k, v, mask[0:1].expand(300, -1))  # key padding: efficient
    assert forms_run[1:] == ["efficient_taylor_shift"]


# Calibration: a measured crossover N̂ per device, dtype, causal and pass (tests/conftest.py
# points every test at an empty cache directory of its own).

CPU64 = dict(device="cpu", dtype=torch.float64)
FULL = dict(causal=False, order=2, mask_varies=False)


@pytest.mark.parametrize("n_hat, mode", [(1e6, "direct"), (8, "efficient")], ids=str)
def test_calibration_decides_against_the_theory(isolated_cache_dir, forms_run, n_hat, mode):
    # theory: efficient from N ≈ 15 (d = 4), so N = 600 is efficient and N = 12 direct
    n = 600 if mode == "direct" else 12
    q, k, v = (torch.randn(1, 2, n, 4, dtype=torch.float64) for _ in range(3))
    assert choose_mode(n, n, 4, 4, **FULL) != mode
    write_calibration(isolated_cache_dir, {4: n_hat})
    assert decide_mode(n, n, 4, 4, **FULL, **CPU64) == Decision(mode, "calibration")
    y = taylor_shift_attention(q, k, v)
    assert forms_run == [f"{mode}_taylor_shift"]
    other = taylor_shift_attention(q, k, v, mode="efficient" if mode == "direct" else "direct")
    torch.testing.assert_close(y, other, rtol=1e-10, atol=1e-12)  # only the form changed


def test_the_calibrated_choice_is_logged_with_its_entry(isolated_cache_dir, caplog):
    write_calibration(isolated_cache_dir, {4: 1e6})
    q, k, v = (torch.randn(1, 2, 600, 4, dtype=torch.float64) for _ in range(3))
    with caplog.at_level(logging.DEBUG, logger="taylorshift.dispatch"):
        taylor_shift_attention(q, k, v)
    assert "auto -> direct (calibration [cpu: " in caplog.text
    assert "float64 | full | forward" in caplog.text


def test_no_calibration_means_theory():
    assert decide_mode(32, 32, 4, 4, **FULL, **CPU64).basis == "theory"
    assert decide_mode(32, 32, 4, 4, **FULL).basis == "theory"


def test_calibration_of_another_dtype_or_device_is_not_used(isolated_cache_dir):
    write_calibration(isolated_cache_dir, {4: 1e6}, dtype="float32")
    assert decide_mode(600, 600, 4, 4, **FULL, **CPU64) == Decision("efficient", "theory")
    other = dict(device="cpu", dtype=torch.float32)
    assert decide_mode(600, 600, 4, 4, **FULL, **other) == Decision("direct", "calibration")
    dispatch.reload_calibration()
    write_calibration(isolated_cache_dir, {4: 1e6}, device="meta")
    dispatch.reload_calibration()
    assert decide_mode(600, 600, 4, 4, **FULL, **CPU64) == Decision("efficient", "theory")


def test_calibration_without_device_or_when_switched_off_is_not_used(
    isolated_cache_dir, monkeypatch
):
    write_calibration(isolated_cache_dir, {4: 1e6})
    assert decide_mode(600, 600, 4, 4, **FULL, **CPU64) == Decision("direct", "calibration")
    assert decide_mode(600, 600, 4, 4, **FULL) == Decision("efficient", "theory")  # no device
    monkeypatch.setenv(dispatch.CALIBRATION_ENV, "off")
    assert decide_mode(600, 600, 4, 4, **FULL, **CPU64) == Decision("efficient", "theory")


def _edited_entry(directory, field: str, value: object) -> bytes:
    """A calibration file whose one entry has ``field`` (of the entry, or of its crossover)
    edited by hand, as JSON text (Python's json writes and reads Infinity)."""
    path = write_calibration(directory, {4: 1e6})
    data = json.loads(path.read_text())
    (entry,) = data["devices"][dispatch.device_key("cpu")]["entries"].values()
    (entry["crossover"] if field == "status" else entry)[field] = value
    return json.dumps(data).encode()


@pytest.mark.parametrize(
    "content, why",
    [
        ('{"format": "taylorshift-calibration", "version": 1, "devices": {"x": 3}}', "malformed"),
        ("{not json", "not valid JSON"),
        # each of these once raised from every mode="auto" call of the process
        (lambda folder: _edited_entry(folder, "d", 0).decode().encode("utf-16"), "not UTF-8"),
        (lambda folder: _edited_entry(folder, "d", float("inf")), "d must be a positive int"),
        (lambda folder: _edited_entry(folder, "d", 10**400), "d must be a positive integer"),
        ("[" * 100_000 + "]" * 100_000, "RecursionError"),
        # ... and these were read as something else
        (lambda folder: _edited_entry(folder, "causal", "false"), "causal must be true or false"),
        (lambda folder: _edited_entry(folder, "dv", 16.5), "dv must be a positive integer"),
        (lambda folder: _edited_entry(folder, "status", "crosed"), "unknown crossover status"),
    ],
    ids=[
        "malformed", "not-json", "utf-16", "d-infinity", "d-huge", "deep", "causal-text",
        "dv-float", "status",
    ],
)  # fmt: skip
def test_corrupt_calibration_warns_once_and_falls_back(isolated_cache_dir, content, why):
    if callable(content):
        content = content(isolated_cache_dir)
    if isinstance(content, str):
        content = content.encode()
    (isolated_cache_dir / "calibration.json").write_bytes(content)
    q, k, v = (torch.randn(1, 1, 600, 4, dtype=torch.float64) for _ in range(3))
    with pytest.warns(
        RuntimeWarning, match="ignoring the calibration file .*calibration.json"
    ) as w:
        taylor_shift_attention(q, k, v)
    assert why in str(w[0].message)
    assert w[0].filename == __file__  # the caller's line (a fixed stacklevel named dispatch.py)
    assert decide_mode(600, 600, 4, 4, **FULL, **CPU64) == Decision("efficient", "theory")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # read once per process: no second warning
        taylor_shift_attention(q, k, v)


def test_calibration_of_another_format_version_is_ignored_quietly(isolated_cache_dir):
    path = write_calibration(isolated_cache_dir, {4: 1e6})
    data = json.loads(path.read_text())
    data["version"] = 999
    path.write_text(json.dumps(data))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert choose_mode(600, 600, 4, 4, **FULL, **CPU64) == "efficient"


def test_reload_reads_a_new_calibration(isolated_cache_dir):
    assert choose_mode(600, 600, 4, 4, **FULL, **CPU64) == "efficient"
    write_calibration(isolated_cache_dir, {4: 1e6})
    assert choose_mode(600, 600, 4, 4, **FULL, **CPU64) == "efficient"  # read once: cached
    assert dispatch.reload_calibration() is not None
    assert choose_mode(600, 600, 4, 4, **FULL, **CPU64) == "direct"


def test_cross_attention_uses_the_harmonic_mean_of_the_lengths(isolated_cache_dir):
    write_calibration(isolated_cache_dir, {4: 100})
    # 2·Nq·Nk/(Nq + Nk) >= N̂: 2·75·150/225 = 100 -> efficient; 2·60·200/260 ≈ 92 -> direct
    assert choose_mode(75, 150, 4, 4, **FULL, **CPU64) == "efficient"
    assert choose_mode(150, 75, 4, 4, **FULL, **CPU64) == "efficient"
    assert choose_mode(60, 200, 4, 4, **FULL, **CPU64) == "direct"
    assert choose_mode(99, 101, 4, 4, **FULL, **CPU64) == "direct"  # harmonic mean 99.98
    assert choose_mode(100, 100, 4, 4, **FULL, **CPU64) == "efficient"


def test_head_dims_between_calibrated_ones_interpolate_the_correction(isolated_cache_dir):
    rho4, rho16 = 2.0, 8.0

    def t(d, dv, causal):
        return theory.impl_crossover(d, dv, causal, DEFAULT_CAUSAL_CHUNK)

    write_calibration(isolated_cache_dir, {4: rho4 * t(4, 4, False), 16: rho16 * t(16, 16, False)})
    cal = dispatch.load_calibration()
    key = (dispatch.device_key("cpu"), "float64", False, "forward")
    assert cal.estimate(key, 4, 4) == pytest.approx(rho4 * t(4, 4, False))
    assert cal.estimate(key, 16, 16) == pytest.approx(rho16 * t(16, 16, False))
    # geometric midpoint in d -> geometric mean of the ratios; outside: the nearest ratio
    assert cal.estimate(key, 8, 8) == pytest.approx(4.0 * t(8, 8, False))
    assert cal.estimate(key, 2, 2) == pytest.approx(rho4 * t(2, 2, False))
    assert cal.estimate(key, 64, 64) == pytest.approx(rho16 * t(64, 64, False))
    # dv != d scales with the theory's crossover at (d, dv)
    assert cal.estimate(key, 4, 32) == pytest.approx(rho4 * t(4, 32, False))
    n_hat = cal.estimate(key, 8, 8)
    assert choose_mode(math.ceil(n_hat), math.ceil(n_hat), 8, 8, **FULL, **CPU64) == "efficient"
    assert choose_mode(math.floor(n_hat), math.floor(n_hat), 8, 8, **FULL, **CPU64) == "direct"


def test_training_calls_use_the_forward_backward_calibration(isolated_cache_dir, forms_run):
    write_calibration(isolated_cache_dir, {4: 1e6}, passes="forward")
    write_calibration(isolated_cache_dir, {4: 8}, passes="train")
    for backward, mode in ((False, "direct"), (True, "efficient")):
        decision = decide_mode(64, 64, 4, 4, **FULL, **CPU64, backward=backward)
        assert decision == Decision(mode, "calibration")
    q, k, v = (torch.randn(1, 1, 64, 4, dtype=torch.float64) for _ in range(3))
    with torch.no_grad():
        taylor_shift_attention(q, k, v.requires_grad_(True))  # no autograd: forward
    assert forms_run == ["direct_taylor_shift"]
    q.requires_grad_(True)
    y = taylor_shift_attention(q, k, v)
    assert forms_run[1:] == ["efficient_taylor_shift"]
    y.sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()


def test_a_missing_pass_borrows_the_other(isolated_cache_dir):
    write_calibration(isolated_cache_dir, {4: 1e6}, passes="train")
    assert choose_mode(600, 600, 4, 4, **FULL, **CPU64, backward=False) == "direct"


def test_causal_calibration_is_separate(isolated_cache_dir):
    write_calibration(isolated_cache_dir, {4: 1e6}, causal=True)
    causal = dict(causal=True, order=2, mask_varies=False)
    assert choose_mode(5000, 5000, 4, 4, **causal, **CPU64) == "direct"
    assert choose_mode(5000, 5000, 4, 4, **FULL, **CPU64) == "efficient"


def test_calibration_is_read_once_per_process(isolated_cache_dir, monkeypatch):
    # (its speed per decision is a benchmark's matter; here: no file access per call)
    write_calibration(isolated_cache_dir, {4: 100, 16: 400})
    reads = []
    real = calibration._read_calibration
    monkeypatch.setattr(
        calibration, "_read_calibration", lambda path: reads.append(path) or real(path)
    )
    for _ in range(100):
        choose_mode(600, 600, 8, 8, **FULL, **CPU64)
    assert len(reads) == 1


def test_auto_never_picks_a_form_over_the_memory_budget_when_the_other_fits():
    # d = 512: each (batch, head) needs a (131,841 x 513) float32 state, 258 MiB; 32 of them
    # are 8.1 GiB. At N = 200,000 the counts favour the efficient form; with 4 GiB to spend
    # only the direct form fits (blocks of 2^18 scores and row sums: 27 MiB; efficient 26 GiB).
    kw = dict(causal=False, order=2, mask_varies=False, device="cpu", dtype=torch.float32)
    n, d, bh = 200_000, 512, 32
    state = bh * (d * (d + 1) // 2 + d + 1) * (d + 1) * 4
    assert state > 8 * 2**30
    assert choose_mode(n, n, d, d, **kw, batch_heads=bh, memory_budget=2**62) == "efficient"
    budget = 4 * 2**30
    assert decide_mode(n, n, d, d, **kw, batch_heads=bh, memory_budget=budget) == Decision(
        "direct", "memory"
    )
    # neither fits: time decides
    assert choose_mode(n, n, d, d, **kw, batch_heads=bh, memory_budget=2**20) == "efficient"


def test_the_memory_budget_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv(dispatch.MEMORY_BUDGET_ENV, "12345")
    assert dispatch.default_memory_budget("cpu") == 12345
    monkeypatch.delenv(dispatch.MEMORY_BUDGET_ENV)
    assert 0 < dispatch.default_memory_budget("cpu") < 2**62  # half of MemAvailable


# Without a calibration file, float32 non-causal calls on a CPU use the measured prior
# (dispatch.CPU_PRIOR): the theory's switch N* (THEORY_SWITCH's 152.5 / 560.5 / 2144.5)
# times ρ = 2.85 / 1.75 / 1.05, by hand: 434.6 / 980.9 / 2251.7.
CPU_PRIOR_SWITCH = {16: 435, 32: 981, 64: 2252}


@pytest.fixture
def no_cpu_kernels(monkeypatch):
    """The PyTorch forms only (no C compiler, or TAYLORSHIFT_CPU_KERNELS=off)."""
    monkeypatch.setattr(dispatch, "_cpu_kernels_ready", lambda: False)


@pytest.mark.parametrize(("d", "switch"), CPU_PRIOR_SWITCH.items(), ids=lambda x: str(x))
def test_cpu_without_calibration_switches_where_cpus_measured(d, switch, no_cpu_kernels):
    cpu32 = dict(device="cpu", dtype=torch.float32)
    assert decide_mode(switch - 1, switch - 1, d, d, **FULL, **cpu32) == Decision(
        "direct", "cpu prior"
    )
    assert decide_mode(switch, switch, d, d, **FULL, **cpu32) == Decision("efficient", "cpu prior")


# With the CPU kernels (dispatch.CPU_KERNEL_PRIOR): ρ = 0.57 / 0.62 / 0.70 times the
# theory's switch (152.5 / 560.5 / 2144.5), by hand: 86.9 / 347.5 / 1501.2.
CPU_KERNEL_PRIOR_SWITCH = {16: 87, 32: 348, 64: 1502}


@pytest.mark.parametrize(("d", "switch"), CPU_KERNEL_PRIOR_SWITCH.items(), ids=lambda x: str(x))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_cpu_kernels_move_the_switch_down(d, switch, dtype, monkeypatch):
    monkeypatch.setattr(dispatch, "_cpu_kernels_ready", lambda: True)
    cpu = dict(device="cpu", dtype=dtype)
    if switch > 1:
        assert decide_mode(switch - 1, switch - 1, d, d, **FULL, **cpu) == Decision(
            "direct", "cpu prior"
        )
    assert decide_mode(switch, switch, d, d, **FULL, **cpu) == Decision("efficient", "cpu prior")
    # the same call decided again after the kernels went away: the PyTorch forms' prior
    # (float32) or the theory (bfloat16), both of which switch later
    monkeypatch.setattr(dispatch, "_cpu_kernels_ready", lambda: False)
    assert choose_mode(switch, switch, d, d, **FULL, **cpu) == "direct"


# ... and with 128 heads or more: ρ = 0.77 / 0.83 / 0.68, by hand 117.4 / 465.2 / 1458.3.
CPU_KERNEL_PRIOR_SWITCH_128 = {16: 118, 32: 466, 64: 1459}


@pytest.mark.parametrize(("d", "switch"), CPU_KERNEL_PRIOR_SWITCH_128.items(), ids=str)
def test_cpu_kernel_prior_follows_the_head_count(d, switch, monkeypatch):
    monkeypatch.setattr(dispatch, "_cpu_kernels_ready", lambda: True)
    cpu = dict(device="cpu", dtype=torch.float32)
    for bh in (128, 512):  # held beyond the largest measured count
        below = decide_mode(switch - 1, switch - 1, d, d, **FULL, **cpu, batch_heads=bh)
        at = decide_mode(switch, switch, d, d, **FULL, **cpu, batch_heads=bh)
        assert (below.mode, at.mode) == ("direct", "efficient"), bh
    # between 4 and 128 heads the switch lies between the two counts' switches
    low, high = sorted((CPU_KERNEL_PRIOR_SWITCH[d], switch))
    mid = [choose_mode(n, n, d, d, **FULL, **cpu, batch_heads=23) for n in (low - 1, high)]
    assert mid == ["direct", "efficient"]


# Causal calls with the CPU kernels (dispatch.CPU_KERNEL_CAUSAL_PRIOR, per pass) times the
# causal theory's switch (415.83 / 820.33 / 2402.46), by hand: forward, 4 heads, ρ = 0.57 /
# 1.03 / 1.12 -> 237.0 / 844.9 / 2690.8; forward + backward, 4 heads, 1.24 / 1.26 / 1.47 ->
# 515.6 / 1033.6 / 3531.6; forward + backward, 128 heads, 1.50 / 2.11 / 1.46 -> 623.7 /
# 1730.9 / 3507.6.
CPU_KERNEL_CAUSAL_SWITCH = {
    (False, 4): {16: 238, 32: 845, 64: 2691},
    (True, 4): {16: 516, 32: 1034, 64: 3532},
    (True, 128): {16: 624, 32: 1731, 64: 3508},
}


@pytest.mark.parametrize(("backward", "heads"), CPU_KERNEL_CAUSAL_SWITCH, ids=str)
@pytest.mark.parametrize("d", [16, 32, 64])
def test_cpu_kernels_have_a_causal_prior_per_pass(d, backward, heads, monkeypatch):
    monkeypatch.setattr(dispatch, "_cpu_kernels_ready", lambda: True)
    causal = dict(FULL, causal=True)
    cpu = dict(device="cpu", dtype=torch.float32, batch_heads=heads, backward=backward)
    switch = CPU_KERNEL_CAUSAL_SWITCH[backward, heads][d]
    assert decide_mode(switch - 1, switch - 1, d, d, **causal, **cpu) == Decision(
        "direct", "cpu prior"
    )
    assert decide_mode(switch, switch, d, d, **causal, **cpu) == Decision("efficient", "cpu prior")


def test_cpu_prior_only_for_what_was_measured(isolated_cache_dir, monkeypatch, no_cpu_kernels):
    n = 300  # between the theory's switch at d = 16 (153) and the prior's (435)
    cpu32 = dict(device="cpu", dtype=torch.float32)
    assert choose_mode(n, n, 16, 16, **FULL, **cpu32) == "direct"
    assert choose_mode(n, n, 16, 16, **FULL, device="cpu", dtype=torch.float64) == "efficient"
    assert choose_mode(n, n, 16, 16, **FULL) == "efficient"  # no device
    causal = dict(FULL, causal=True)
    assert choose_mode(4 * n, 4 * n, 16, 16, **causal, **cpu32) == choose_mode(
        4 * n, 4 * n, 16, 16, **causal
    )  # causal: theory
    write_calibration(isolated_cache_dir, {16: 100.0}, dtype="float32")
    dispatch.reload_calibration()
    assert choose_mode(n, n, 16, 16, **FULL, **cpu32) == "efficient"  # a calibration wins
    monkeypatch.setenv(dispatch.CALIBRATION_ENV, "off")
    write_calibration(isolated_cache_dir, {16: 1e6}, dtype="float32")
    dispatch.reload_calibration()
    assert choose_mode(n, n, 16, 16, **FULL, **cpu32) == "efficient"  # off: theory only


def test_gpu_without_calibration_switches_at_the_measured_bounds():
    # dispatch.GPU_PRIOR = 4 times the counted switch (2,144.5 at d = 64): 8,578 by hand; the
    # H200 runs put the real switch at about 9,200 (forward) and 7,200 (forward + backward),
    # the H100 run at 8,550 and 7,400.
    gpu16 = dict(device="cuda", dtype=torch.bfloat16)
    assert decide_mode(8577, 8577, 64, 64, **FULL, **gpu16) == Decision("direct", "gpu prior")
    assert decide_mode(8579, 8579, 64, 64, **FULL, **gpu16) == Decision("efficient", "gpu prior")
    assert decide_mode(4096, 4096, 64, 64, **FULL, device="cuda", dtype=torch.float16).mode == (
        "direct"
    )
    # float32: GPU_FLOAT32_PRIOR 2.6 (forward) and 0.22 (forward + backward) times 2,144.5 =
    # 5,575.7 and 471.8 (the PyTorch efficient form against the direct kernel on an H100:
    # level at about 5,600 forward, 2.2x faster forward + backward at 1,024)
    gpu32 = dict(device="cuda", dtype=torch.float32)
    assert decide_mode(5575, 5575, 64, 64, **FULL, **gpu32) == Decision("direct", "gpu prior")
    assert decide_mode(5576, 5576, 64, 64, **FULL, **gpu32).mode == "efficient"
    assert decide_mode(471, 471, 64, 64, **FULL, **gpu32, backward=True).mode == "direct"
    assert decide_mode(472, 472, 64, 64, **FULL, **gpu32, backward=True).mode == "efficient"
    # causal: GPU_CAUSAL_PRIOR 38 (forward) and 24 (forward + backward) times the counted
    # 2,402.46: 91,293 and 57,659 (the causal efficient kernels took 4.65x and 1.35x the
    # direct kernel's time forward at 16,384 and 65,536, 2.95x and 0.90x forward + backward)
    causal = dict(FULL, causal=True)
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        gpu = dict(device="cuda", dtype=dtype)
        assert decide_mode(91293, 91293, 64, 64, **causal, **gpu) == Decision("direct", "gpu prior")
        assert decide_mode(91294, 91294, 64, 64, **causal, **gpu).mode == "efficient"
        assert decide_mode(57658, 57658, 64, 64, **causal, **gpu, backward=True).mode == "direct"
        assert decide_mode(57659, 57659, 64, 64, **causal, **gpu, backward=True).mode == (
            "efficient"
        )
    # float64 (no kernel) or another device: not measured, the counts decide
    for other in (
        dict(device="cuda", dtype=torch.float64),
        dict(device="meta", dtype=torch.bfloat16),
    ):
        assert decide_mode(4096, 4096, 64, 64, **FULL, **other) == Decision("efficient", "theory")
    assert decide_mode(20000, 20000, 64, 64, **causal, device="meta", dtype=torch.bfloat16) == (
        Decision("efficient", "theory")
    )


@pytest.mark.parametrize(
    ("old", "new"),
    [("direct_ops", "impl_ops_direct"), ("efficient_ops", "impl_ops_efficient")],
)
def test_the_counts_moved_to_theory_and_the_old_names_still_work(old, new):
    with pytest.warns(DeprecationWarning, match=f"taylorshift.theory.{new}"):
        moved = getattr(dispatch, old)
    assert moved is getattr(theory, new)


def test_the_old_theory_crossover_keeps_its_default_chunk():
    with pytest.warns(DeprecationWarning, match="taylorshift.theory.impl_crossover"):
        old = dispatch.theory_crossover
    assert old(16, 16, False) == pytest.approx(2 * 5338 / 70)  # worked out by hand above
    assert old(8, 8, True) == 314.0  # (2·846 + 256·40) / 38, see tests/test_theory.py
    assert old(8, 8, True, 1000) == pytest.approx((2 * 846 + 1000 * 40) / 38)


def test_entry_keys_use_the_vocabulary_whatever_the_spelling():
    assert dispatch.entry_key(torch.float32, True, "forward+backward", 64) == (
        "float32/causal/forward+backward/d=64"
    )
    assert dispatch.entry_key("fp32", True, "train", 64) == "float32/causal/forward+backward/d=64"
    assert dispatch.entry_key("bfloat16", False, "fwd", 8) == "bfloat16/full/forward/d=8"


def test_a_calibration_written_before_reads_train_as_forward_backward(isolated_cache_dir):
    # older versions wrote "train" for forward + backward, in the key and the entry
    write_calibration(isolated_cache_dir, {4: 1e6}, passes="forward")
    write_calibration(isolated_cache_dir, {4: 8}, passes="train")
    cal = dispatch.load_calibration()
    key = dispatch.device_key("cpu")
    assert set(cal.measured) == {
        (key, "float64", False, "forward"),
        (key, "float64", False, "forward+backward"),
    }
    assert choose_mode(64, 64, 4, 4, **FULL, **CPU64, backward=True) == "efficient"
    assert choose_mode(64, 64, 4, 4, **FULL, **CPU64, backward=False) == "direct"


def test_a_calibration_entry_with_an_unknown_pass_is_refused():
    data = {
        "format": dispatch.CALIBRATION_FORMAT,
        "version": dispatch.CALIBRATION_VERSION,
        "devices": {"cpu: x": {"entries": {"e": {
            "dtype": "float32", "causal": False, "pass": "backward", "d": 4, "dv": 4,
            "crossover": {"status": "crossed", "n": 10.0},
        }}}},
    }  # fmt: skip
    with pytest.raises(dispatch.CalibrationError, match="pass 'backward'"):
        dispatch.parse_calibration(data)


@pytest.fixture
def decisions_made(monkeypatch) -> list[tuple]:
    """The calls that decide_mode actually worked out (not answered from its kept ones)."""
    made = []
    real = dispatch._decide
    monkeypatch.setattr(dispatch, "_decide", lambda *a: made.append(a) or real(*a))
    monkeypatch.setattr(dispatch, "_decisions", {})
    return made


def test_decisions_are_kept_per_call(decisions_made):
    for _ in range(3):
        assert decide_mode(600, 600, 4, 4, **FULL, **CPU64) == Decision("efficient", "theory")
    assert len(decisions_made) == 1
    decide_mode(600, 600, 4, 4, **FULL, **CPU64, backward=True)  # another call: decided
    decide_mode(601, 600, 4, 4, **FULL, **CPU64)
    assert len(decisions_made) == 3


def test_kept_decisions_follow_a_new_calibration_and_the_switch(
    isolated_cache_dir, monkeypatch, decisions_made
):
    assert decide_mode(600, 600, 4, 4, **FULL, **CPU64) == Decision("efficient", "theory")
    write_calibration(isolated_cache_dir, {4: 1e6})
    dispatch.reload_calibration()
    assert decide_mode(600, 600, 4, 4, **FULL, **CPU64) == Decision("direct", "calibration")
    monkeypatch.setenv(dispatch.CALIBRATION_ENV, "off")
    assert decide_mode(600, 600, 4, 4, **FULL, **CPU64) == Decision("efficient", "theory")
    monkeypatch.delenv(dispatch.CALIBRATION_ENV)
    assert decide_mode(600, 600, 4, 4, **FULL, **CPU64) == Decision("direct", "calibration")
    assert len(decisions_made) == 4


def test_decisions_that_read_the_free_memory_are_not_kept(monkeypatch, decisions_made):
    kw = dict(FULL, device="cpu", dtype=torch.float32, batch_heads=32)
    monkeypatch.setenv(dispatch.MEMORY_BUDGET_ENV, str(4 * 2**30))
    assert decide_mode(200_000, 200_000, 512, 512, **kw) == Decision("direct", "memory")
    monkeypatch.setenv(dispatch.MEMORY_BUDGET_ENV, str(2**62))
    assert decide_mode(200_000, 200_000, 512, 512, **kw).mode == "efficient"
    assert len(decisions_made) == 2


def test_kept_decisions_stay_bounded(monkeypatch, decisions_made):
    monkeypatch.setattr(dispatch, "MAX_KEPT_DECISIONS", 3)
    for n in range(600, 610):
        decide_mode(n, n, 4, 4, **FULL)
    assert 1 <= len(dispatch._decisions) <= 3


def test_marking_the_choice_constant_matches_torch_without_importing_dynamo():
    # interface.assume_constant_result sets the attribute torch's decorator sets, so that
    # importing the package does not import torch._dynamo (2.4 s); if torch changes its
    # mechanism, this fails.
    def ours():
        return 1

    def theirs():
        return 1

    torch.compiler.assume_constant_result(theirs)
    interface.mark_constant(ours)  # what the package does while torch._dynamo is not imported
    marked = dict(vars(theirs))
    assert marked == {"_dynamo_marked_constant": True}
    assert vars(ours) == marked
    code = "import sys, taylorshift, taylorshift.train.cli; print('torch._dynamo' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr[-2000:]
