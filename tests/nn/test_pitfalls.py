"""SPEC §7: the pitfalls seen in existing implementations, each as a test of our code.

- in-place edits of views (``unbind``) that break autograd: backward under anomaly detection;
- a variable defined under one flag combination only: the ``normalize=False`` path runs;
- Taylor options accepted but not passed on: they reach the kernel;
- attention dropout on the key-side state: ours drops keys, identically in both forms;
- padded keys leaking into the normaliser through the constant term;
- ``print(...); exit()`` in a library when an optional dependency is missing;
- direct and efficient forms disagreeing under some flag combination.
"""

from __future__ import annotations

import builtins
import importlib
import sys

import pytest
import torch

from taylorshift import naive_taylor_shift_attention
from taylorshift.nn import Block, TaylorShiftAttention, create_kernel
from tests.helpers import assert_rel_close, rel_error
from tests.nn.cases import (
    F64,
    KERNEL_IDS,
    KERNEL_SPECS,
    PROJECTION_IDS,
    make_attention,
    padding,
    param_grads,
    randn,
    spread_temperature,
)

RTOL = 1e-10
DIM, HEADS = 12, 3


@pytest.mark.filterwarnings("ignore:Anomaly Detection has been enabled")
@pytest.mark.parametrize("projection", PROJECTION_IDS)
@pytest.mark.parametrize("kernel_id", KERNEL_IDS)
def test_backward_under_anomaly_detection(kernel_id, projection):
    module = make_attention(kernel_id, projection, DIM, HEADS, qk_norm=True, scale_norm=True)
    x = randn(2, 6, DIM, seed=1, requires_grad=True)
    with torch.autograd.detect_anomaly(check_nan=True):
        for causal in (False, True):
            y = module(x, attn_mask=padding([6, 3], 6), is_causal=causal)
            y.pow(2).sum().backward()
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    for name, p in module.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("mode", ["auto", "direct", "efficient"])
def test_unnormalised_path_runs_and_matches_reference(mode, causal):
    torch.manual_seed(0)
    module = TaylorShiftAttention(DIM, HEADS, dtype=F64, mode=mode, normalize=False)
    assert "kernel.temperature" not in dict(module.named_parameters())
    x = randn(2, 7, DIM, seed=2, requires_grad=True)
    mask = padding([7, 4], 7)
    y = module(x, attn_mask=mask, is_causal=causal)

    def heads(t):
        return t.view(2, 7, HEADS, DIM // HEADS).transpose(1, 2)

    q, k, v = heads(module.q_proj(x)), heads(module.k_proj(x)), heads(module.v_proj(x))
    out = naive_taylor_shift_attention(q, k, v, mask[:, None, None], causal, normalize=False)
    expected = module.proj(out.transpose(1, 2).reshape(2, 7, DIM))
    assert_rel_close(y, expected, RTOL, "output")
    y.sum().backward()
    assert torch.isfinite(x.grad).all()


def test_taylor_options_reach_the_kernel():
    attn = TaylorShiftAttention(DIM, HEADS, mode="direct", order=6, temperature=0.3)
    block = Block(DIM, HEADS, kernel_args={"order": 6, "mode": "direct", "temperature": 0.3})
    for kernel in (attn.kernel, block.attn.kernel):
        assert (kernel.mode, kernel.order) == ("direct", 6)
        assert torch.equal(kernel.temperature, torch.full((1, HEADS, 1, 1), 0.3))


# ---------------------------------------------------------------------------------------
# Padded keys and the constant term.


@pytest.mark.parametrize("kernel_id", KERNEL_IDS)
def test_masked_zero_keys_do_not_reach_the_normaliser(kernel_id):
    # A zero key scores w(0) = 1 through the constant term: zeroing is not masking.
    name, kwargs = KERNEL_SPECS[kernel_id]
    kernel = create_kernel(name, HEADS, 4, **kwargs).to(F64)
    spread_temperature(kernel)
    q, k, v = randn(2, HEADS, 5, 4, seed=1), randn(2, HEADS, 5, 4, seed=2), randn(2, HEADS, 5, 3)
    k_pad = torch.cat([k, torch.zeros(2, HEADS, 4, 4, dtype=F64)], dim=2)
    v_pad = torch.cat([v, torch.zeros(2, HEADS, 4, 3, dtype=F64)], dim=2)
    mask = torch.arange(9)[None, None, None, :] < 5
    expected = kernel(q, k, v)
    assert_rel_close(kernel(q, k_pad, v_pad, mask), expected, RTOL, "masked")
    if name in ("taylorshift", "holt") and not kwargs.get("subtract_one"):
        # The leak this test guards against is real: unmasked, the zero keys count.
        assert rel_error(kernel(q, k_pad, v_pad), expected) > 1e-3


@pytest.mark.parametrize("projection", PROJECTION_IDS)
@pytest.mark.parametrize("kernel_id", ["taylorshift-direct", "taylorshift-efficient", "holt"])
def test_zero_padding_tokens_do_not_change_the_result(kernel_id, projection):
    module = make_attention(kernel_id, projection, DIM, HEADS)
    x = randn(1, 6, DIM, seed=3)
    x_pad = torch.cat([x, torch.zeros(1, 3, DIM, dtype=F64)], dim=1)
    y = module(x_pad, attn_mask=padding([6], 9))
    assert_rel_close(y[:, :6], module(x), RTOL, "padded run")


# ---------------------------------------------------------------------------------------
# No exit() or print in the library.


def _refuse_exit(*args, **kwargs):
    raise AssertionError(f"the library called exit{args}")


@pytest.mark.parametrize("blocked", [[], ["triton", "triton.language"]], ids=["as-is", "no-triton"])
def test_import_neither_exits_nor_prints(monkeypatch, capsys, blocked):
    monkeypatch.setattr(builtins, "exit", _refuse_exit, raising=False)
    monkeypatch.setattr(builtins, "quit", _refuse_exit, raising=False)
    monkeypatch.setattr(sys, "exit", _refuse_exit)
    for name in blocked:  # None in sys.modules makes ``import name`` raise ImportError
        monkeypatch.setitem(sys.modules, name, None)
    # Import afresh; monkeypatch puts the original modules back afterwards.
    original = sys.modules["taylorshift.nn"]
    for name in [m for m in sys.modules if m == "taylorshift" or m.startswith("taylorshift.")]:
        monkeypatch.delitem(sys.modules, name)
    nn_module = importlib.import_module("taylorshift.nn")
    ops_module = importlib.import_module("taylorshift.ops")
    assert nn_module is not original  # really imported again
    assert hasattr(nn_module, "Attention") and hasattr(ops_module, "taylor_shift_attention")
    assert set(nn_module.list_kernels()) >= {"taylorshift", "softmax", "linear", "holt"}
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == ("", "")


# ---------------------------------------------------------------------------------------
# Direct and efficient forms under every flag combination, at module level.

MASKS = {
    "no-mask": None,
    "padding": [9, 5, 7],
    "empty-item": [9, 0, 4],  # item 1 attends no key
}


@pytest.mark.parametrize("projection", PROJECTION_IDS)
@pytest.mark.parametrize("mask_kind", list(MASKS))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("normalize", [True, False], ids=["norm", "plain-scores"])
def test_direct_and_efficient_agree_under_every_flag(normalize, causal, mask_kind, projection):
    torch.manual_seed(0)
    module = TaylorShiftAttention(
        DIM,
        HEADS,
        qkv_bias=True,
        dtype=F64,
        mode="direct",
        normalize=normalize,
        projection=projection,
        context_len=10 if projection == "super" else None,
    )
    spread_temperature(module)
    x = randn(3, 9, DIM, seed=5, requires_grad=True)
    lengths = MASKS[mask_kind]
    mask = None if lengths is None else padding(lengths, 9)
    g_out = randn(3, 9, DIM, seed=6)
    results = {}
    for mode in ("direct", "efficient"):
        module.kernel.mode = mode
        y = module(x, attn_mask=mask, is_causal=causal)
        results[mode] = (y, param_grads(module, y, g_out, x))
    (y_d, g_d), (y_e, g_e) = results["direct"], results["efficient"]
    assert_rel_close(y_e, y_d, RTOL, "output")
    assert ("kernel.temperature" in g_d) == normalize
    for name in g_d:
        assert_rel_close(g_e[name], g_d[name], RTOL, f"grad of {name}")


@pytest.mark.parametrize("projection", PROJECTION_IDS)
def test_attention_dropout_is_the_same_in_both_forms(projection):
    # Dropout on a key-side state would differ from dropout in the direct form; ours drops
    # keys through the mask, so the two forms compute the same function.
    torch.manual_seed(0)
    module = TaylorShiftAttention(
        DIM,
        HEADS,
        attn_drop=0.3,
        dtype=F64,
        mode="direct",
        projection=projection,
        context_len=10 if projection == "super" else None,
    ).train()
    x = randn(2, 9, DIM, seed=7)
    mask = padding([9, 6], 9)
    outputs = {}
    for mode in ("direct", "efficient"):
        module.kernel.mode = mode
        torch.manual_seed(11)
        outputs[mode] = module(x, attn_mask=mask, is_causal=True)
    assert_rel_close(outputs["efficient"], outputs["direct"], RTOL, "output")
    assert rel_error(outputs["direct"], module.eval()(x, attn_mask=mask, is_causal=True)) > 1e-4
