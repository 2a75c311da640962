"""mode="auto": which form it picks and why."""

from __future__ import annotations

import logging

import pytest
import torch

from taylorshift import taylor_shift_attention
from taylorshift.ops.taylor_shift.dispatch import choose_mode, direct_ops, efficient_ops


def test_auto_picks_direct_for_short_and_efficient_for_long_sequences():
    kw = dict(causal=False, order=2, mask_varies=False)
    assert choose_mode(64, 64, 64, 64, **kw) == "direct"
    assert choose_mode(16_384, 16_384, 64, 64, **kw) == "efficient"
    assert choose_mode(4096, 4096, 8, 8, **kw) == "efficient"


def test_auto_crossover_follows_the_operation_counts():
    for d in (8, 16, 32, 64):
        switch = next(
            n
            for n in range(1, 20_000)
            if efficient_ops(n, n, d, d, False, 128) < direct_ops(n, n, d, d)
        )
        kw = dict(causal=False, order=2, mask_varies=False)
        assert choose_mode(switch - 1, switch - 1, d, d, **kw) == "direct"
        assert choose_mode(switch, switch, d, d, **kw) == "efficient"


def test_auto_uses_direct_when_efficient_cannot():
    assert choose_mode(10**5, 10**5, 8, 8, causal=False, order=4, mask_varies=False) == "direct"
    assert choose_mode(10**5, 10**5, 8, 8, causal=False, order=2, mask_varies=True) == "direct"


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_auto_logs_its_choice_and_matches_both_forms(caplog, causal):
    q, k, v = (torch.randn(1, 2, 600, 4, dtype=torch.float64) for _ in range(3))
    with caplog.at_level(logging.DEBUG, logger="taylorshift.dispatch"):
        y = taylor_shift_attention(q, k, v, is_causal=causal)
    assert "auto -> efficient" in caplog.text and "theory" in caplog.text
    for mode in ("direct", "efficient"):
        other = taylor_shift_attention(q, k, v, is_causal=causal, mode=mode)
        torch.testing.assert_close(y, other, rtol=1e-10, atol=1e-12)


def test_auto_with_query_varying_mask_runs_direct(caplog):
    q, k, v = (torch.randn(1, 1, 300, 4, dtype=torch.float64) for _ in range(3))
    mask = torch.rand(300, 300) > 0.5
    with caplog.at_level(logging.DEBUG, logger="taylorshift.dispatch"):
        taylor_shift_attention(q, k, v, mask)
    assert "auto -> direct (the mask varies over queries)" in caplog.text
