"""One process: without torch.distributed, and in a group of one, the sequence-parallel op
and kernel are the single-process efficient form; module conversion keeps parameters."""

from __future__ import annotations

import copy
import datetime
import itertools

import pytest
import torch
import torch.distributed as dist

from taylorshift import taylor_shift_attention
from taylorshift.distributed import (
    SequenceParallelKernel,
    convert_sequence_parallel,
    sequence_parallel_taylor_shift,
    sequence_shard,
)
from taylorshift.nn import Attention
from tests.helpers import assert_rel_close, key_padding, random_qkv
from tests.nn.cases import make_attention, padding

RTOL = 1e-12


@pytest.fixture
def group_of_one(tmp_path):
    """The default group, initialized with this process alone (destroyed afterwards)."""
    assert not dist.is_initialized()
    dist.init_process_group(
        "gloo",
        store=dist.FileStore(str(tmp_path / "store"), 1),
        rank=0,
        world_size=1,
        timeout=datetime.timedelta(seconds=30),
    )
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


def _both(causal, normalize, group=None):
    q, k, v = random_qkv(2, 3, 11, 11, 4, 5)
    tau = torch.tensor([0.7, 1.0, 1.6], dtype=torch.float64).reshape(1, 3, 1, 1)
    options = {"temperature": tau.requires_grad_()} if normalize else {"normalize": False}
    mask = key_padding(2, 11, seed=2)
    results = []
    for op in (sequence_parallel_taylor_shift, taylor_shift_attention):
        extra = {"group": group} if op is sequence_parallel_taylor_shift else {"mode": "efficient"}
        y = op(q, k, v, mask, causal, **options, **extra)
        leaves = [q, k, v, *options.values()][: 4 if normalize else 3]
        results.append((y, torch.autograd.grad(y.square().sum(), leaves)))
    return results


@pytest.mark.parametrize("normalize", [True, False], ids=["norm", "plain"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("initialized", [False, True], ids=["no-dist", "group-of-one"])
def test_one_process_equals_the_plain_op(causal, normalize, initialized, request):
    group = request.getfixturevalue("group_of_one") if initialized else None
    (y, grads), (y_ref, grads_ref) = _both(causal, normalize, group)
    assert_rel_close(y, y_ref, RTOL, "output")
    for g, g_ref, name in zip(grads, grads_ref, "qkvt", strict=False):
        assert_rel_close(g, g_ref, RTOL, f"grad {name}")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("initialized", [False, True], ids=["no-dist", "group-of-one"])
def test_grouped_heads_equal_key_and_value_repeated(causal, initialized, request):
    """enable_gqa: the states per key/value head; query head h reads head h // (H / Hkv)."""
    group = request.getfixturevalue("group_of_one") if initialized else None
    q, _, _ = random_qkv(2, 4, 11, 11, 4, 5)
    _, k, v = random_qkv(2, 2, 11, 11, 4, 5, seed=1)
    tau = torch.tensor([0.7, 1.0, 1.6, 0.9], dtype=torch.float64).reshape(1, 4, 1, 1)
    tau.requires_grad_()
    mask = key_padding(2, 11, seed=2)
    leaves = [q, k, v, tau]
    y = sequence_parallel_taylor_shift(
        q, k, v, mask, causal, temperature=tau, group=group, enable_gqa=True
    )
    got = torch.autograd.grad(y.square().sum(), leaves)
    kr, vr = (t.repeat_interleave(2, dim=1) for t in (k, v))
    y_ref = taylor_shift_attention(q, kr, vr, mask, causal, temperature=tau, mode="efficient")
    want = torch.autograd.grad(y_ref.square().sum(), leaves)
    assert_rel_close(y, y_ref, RTOL, "output")
    for g, g_ref, name in zip(got, want, "qkvt", strict=True):
        assert_rel_close(g, g_ref, RTOL, f"grad {name}")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_padded_key_content_never_matters(causal, group_of_one):
    q, k, v = random_qkv(2, 3, 11, 11, 4, 5, requires_grad=False)
    mask = key_padding(2, 11, seed=2, empty_row=False)
    k_bad, v_bad = (torch.where(mask[:, :, 0, :, None], x, float("nan")) for x in (k, v))
    y = sequence_parallel_taylor_shift(q, k, v, mask, causal, group=group_of_one)
    y_bad = sequence_parallel_taylor_shift(q, k_bad, v_bad, mask, causal, group=group_of_one)
    assert_rel_close(y_bad, y, RTOL, "output")


def test_a_destroyed_group_is_refused(tmp_path):
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    group = dist.group.WORLD
    dist.destroy_process_group()
    q = torch.zeros(1, 1, 2, 3)
    with pytest.raises(
        ValueError, match=r"group was given but torch.distributed is not initialized"
    ):
        sequence_parallel_taylor_shift(q, q, q, group=group)


def test_converted_module_keeps_its_parameters_and_function():
    module = make_attention("taylorshift-direct")
    temperature = module.kernel.temperature
    keys = list(module.state_dict())
    x = torch.randn(2, 9, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    mask = padding([9, 4], 9)
    expected = module(x, attn_mask=mask, is_causal=True)

    assert convert_sequence_parallel(module) is module
    assert isinstance(module.kernel, SequenceParallelKernel)
    assert module.kernel.temperature is temperature  # the optimizer's tensor, not a copy
    assert list(module.state_dict()) == keys
    assert_rel_close(module(x, attn_mask=mask, is_causal=True), expected, 1e-11, "converted")
    assert "taylorshift-sp" in repr(module.kernel)


def test_conversion_keeps_a_fixed_temperature_a_buffer_and_the_training_flag():
    module = Attention(
        8, 2, attn_kernel="taylorshift", kernel_args={"learn_temperature": False}
    ).eval()
    convert_sequence_parallel(module)
    assert "temperature" in dict(module.kernel.named_buffers())
    assert not module.kernel.training


def test_conversion_takes_over_a_log_temperature():
    module = Attention(8, 2, attn_kernel="taylorshift", kernel_args={"log_temperature": True})
    module = module.double()
    log_tau = module.kernel.log_temperature
    x = torch.randn(1, 6, 8, dtype=torch.float64)
    expected = module(x, is_causal=True)
    convert_sequence_parallel(module)
    assert module.kernel.log_temperature is log_tau
    assert [n for n, _ in module.kernel.named_parameters()] == ["log_temperature"]
    assert_rel_close(module(x, is_causal=True), expected, 1e-11, "converted")


def test_conversion_refuses_a_kernel_without_the_output_factor():
    module = Attention(8, 2, attn_kernel="taylorshift", kernel_args={"output_factor": False})
    with pytest.raises(ValueError, match=r"kernel has output_factor=False; the sequence-paral"):
        convert_sequence_parallel(module)


def test_conversion_retargets_an_already_parallel_kernel(group_of_one):
    module = convert_sequence_parallel(make_attention())
    assert module.kernel.group is None
    kernel = module.kernel
    convert_sequence_parallel(module, group_of_one)
    assert module.kernel is kernel and kernel.group is group_of_one


def test_a_copy_of_a_converted_model_shares_the_group(group_of_one):
    module = convert_sequence_parallel(make_attention(), group_of_one)
    twin = copy.deepcopy(module)  # as an EMA or a frozen reference copy is made
    assert twin.kernel.group is group_of_one
    assert twin.kernel.temperature is not module.kernel.temperature


def test_a_kernel_converts_by_itself():
    kernel = make_attention().kernel
    converted = convert_sequence_parallel(kernel)
    assert isinstance(converted, SequenceParallelKernel)
    assert converted.temperature is kernel.temperature


def test_sequence_shard_splits_in_order_and_balances():
    for n in (0, 1, 5, 17):
        for world in (1, 2, 3, 4, 7):
            parts = [sequence_shard(n, r, world) for r in range(world)]
            assert parts[0].start == 0 and parts[-1].stop == n
            assert all(a.stop == b.start for a, b in itertools.pairwise(parts))
            sizes = [p.stop - p.start for p in parts]
            assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


def test_plain_attention_module_works_after_conversion_in_one_process():
    torch.manual_seed(0)
    module = Attention(8, 2, attn_kernel="taylorshift", kernel_args={"mode": "efficient"})
    x = torch.randn(1, 6, 8)
    expected = module(x)
    convert_sequence_parallel(module)
    torch.testing.assert_close(module(x), expected, rtol=1e-5, atol=1e-6)
