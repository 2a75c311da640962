"""The fused CPU kernels of the efficient form (non-causal) against the plain reference and
the torch form.

Outputs and gradients (query, key, value, tensor temperature) in float32 against float64
(tight relative tolerance), float16 and bfloat16 (SPEC §8: within a small multiple of the
reference's own error in that dtype), awkward shapes, key padding with fully masked rows,
thread counts (the work splits change no sum), the build (cache, failures, the switch),
the routing of ``taylor_shift_attention`` and the custom ops (opcheck, fake tensors,
torch.compile). The uninitialised-memory poison of tests/ops/conftest.py applies: a kernel
that leaves any output element unwritten fails.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading

import pytest
import torch

from taylorshift import taylor_shift_attention
from taylorshift.ops import cpu as cpu_ops
from taylorshift.ops.cpu import build
from taylorshift.ops.cpu.direct import cpu_direct_taylor_shift
from taylorshift.ops.cpu.efficient import cpu_efficient_taylor_shift
from taylorshift.ops.cpu.efficient_causal import cpu_causal_efficient_taylor_shift
from taylorshift.ops.cpu.wrapper import state_shape
from taylorshift.ops.taylor_shift import fused
from taylorshift.ops.taylor_shift.efficient import efficient_taylor_shift
from tests.ops.kernel_cases import (
    Case,
    check_broadcast_output_grad,
    check_compiles,
    check_default_dtype,
    check_float32,
    check_fully_masked,
    check_low_precision,
    check_nan_in_padded_keys,
    check_non_contiguous,
    check_thread_counts,
    key_mask_of,
    make_problem,
)
from tests.ops.kernel_spy import no_fallback

CASES = [
    Case(2, 2, 7, 65, 16, 16, mask="empty"),
    Case(2, 2, 65, 7, 17, 20, normalize=False),
    Case(2, 2, 1, 1, 16, 8, temperature="float"),
    Case(2, 2, 33, 40, 17, 17, mask="padding"),
    Case(1, 3, 50, 37, 1, 1),
    Case(1, 2, 9, 17, 64, 16, mask="padding", temperature="float"),
    Case(1, 1, 131, 300, 32, 70, mask="padding"),
    Case(1, 1, 20, 45, 128, 128),
    Case(1, 2, 40, 48, 16, 16, mask="padding"),  # whole 8 x 8 blocks of the tile transposes
    Case(1, 2, 24, 200, 16, 16, mask="padding"),  # the key state with the tokens in the lanes
]
SIXTEEN_BIT_CASES = [
    Case(2, 2, 40, 65, 16, 16, mask="padding", temperature="float"),
    Case(2, 2, 33, 40, 17, 20, normalize=False),
]
# bfloat16 rounds 8x coarser than float16: the bound of the relative RMS error
RMS_BOUND = 1e-2


def test_kernels_build_wherever_a_compiler_is_found():
    # CI and the project's machines have gcc: there the kernels must be available, so the
    # rest of this file runs them (a missing compiler is the one accepted reason).
    if build.compiler() is None:
        assert "no C compiler" in cpu_ops.unavailable_reason()
    else:
        assert cpu_ops.unavailable_reason() is None and cpu_ops.is_available()


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_float32_matches_reference_and_torch_form(case):
    check_float32(cpu_efficient_taylor_shift, efficient_taylor_shift, case)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", SIXTEEN_BIT_CASES, ids=lambda c: c.id)
def test_sixteen_bit_error_within_reference_error(case, dtype):
    check_low_precision(cpu_efficient_taylor_shift, case, dtype, rms_bound=RMS_BOUND)


@pytest.mark.parametrize("d", [16, 24, 40], ids=lambda d: f"d{d}")
@pytest.mark.parametrize("heads", [1, 3], ids=lambda h: f"BH{h}")
def test_thread_counts_give_the_same_sums(heads, d):
    # Threads split heads, then the pairs of a head's state (fewer heads than threads; two
    # pairs at a time up to d = 20 from 192 tokens, the 200 keys here, blocks of 16 pairs up
    # to d = 34 or below 192 tokens, the 70 queries, whole rows of the triangle above: the
    # state's three ways) and the tokens of the readout and gradients: no sum changes order.
    check_thread_counts(cpu_efficient_taylor_shift, Case(1, heads, 70, 200, d, 10, mask="padding"))


@pytest.mark.parametrize("n", [40, 200])  # the state's packed rows / tokens in the lanes
def test_nan_in_padded_keys_stays_out(n):
    check_nan_in_padded_keys(cpu_efficient_taylor_shift, n)


def test_float64_default_dtype_changes_nothing():
    check_default_dtype(cpu_efficient_taylor_shift)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("mode", ["direct", "efficient", "auto"])
def test_public_op_under_float64_default_dtype(c_calls, mode, causal):
    # float32 inputs route to the kernels whatever torch's default dtype: the same float32
    # result (main returned garbage here: float64 buffers filled with float32 sums)
    q, k, v = (torch.randn(1, 2, 300, 16, generator=torch.Generator().manual_seed(s))
               for s in range(3))  # fmt: skip
    want = taylor_shift_attention(q, k, v, mode=mode, is_causal=causal)
    c_calls.clear()
    before = torch.get_default_dtype()
    try:
        torch.set_default_dtype(torch.float64)
        got = taylor_shift_attention(q, k, v, mode=mode, is_causal=causal)
    finally:
        torch.set_default_dtype(before)
    forwards = [name for name in c_calls if name.endswith("_forward")]  # auto: either form's
    assert forwards, f"no kernel ran: {dict(c_calls)}"
    no_fallback()
    assert got.dtype == torch.float32 and torch.equal(got, want)


@pytest.mark.parametrize("shape", [(0, 2, 300, 16), (2, 0, 40, 16)], ids=["B0-N300", "H0-N40"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("mode", ["direct", "efficient", "auto"])
def test_empty_batch_gives_empty_outputs_and_gradients(mode, causal, shape):
    # No heads at all (B or H = 0): main before 2026-11-26 sent them to the kernels, whose
    # state update divided by the head count, and the process died of SIGFPE (efficient and
    # auto modes; N = 300 takes the tokens-in-lanes update, N = 40 the other).
    q = torch.randn(*shape, requires_grad=True)
    y = taylor_shift_attention(q, q, q, mode=mode, is_causal=causal)
    (grad,) = torch.autograd.grad(y.sum(), q)
    assert y.shape == shape and grad.shape == shape


@pytest.mark.parametrize("n", [40, 300])
@pytest.mark.parametrize("form", ["efficient", "causal", "direct"])
def test_kernel_forms_take_no_heads(form, n):
    # The public op keeps empty batches on the PyTorch forms (fused.is_empty); the kernels
    # themselves must not fault on them either (ts_state divided by the head count).
    q = torch.randn(0, 2, n, 16, requires_grad=True)
    if form == "direct":
        y = cpu_direct_taylor_shift(q, q, q, None, False, 1.0, None, True)
    elif form == "causal":
        y = cpu_causal_efficient_taylor_shift(q, q, q, None, 1.0, None, True)
    else:
        y = cpu_efficient_taylor_shift(q, q, q, None, 1.0, None, True)
    (grad,) = torch.autograd.grad(y.sum(), q)
    assert y.shape == q.shape and grad.shape == q.shape


def test_scratch_memory_failure_is_a_memory_error(monkeypatch):
    # A kernel that cannot allocate its scratch memory reports status 1, which the wrapper
    # raises instead of returning garbage.
    from taylorshift.ops.cpu import wrapper

    class OutOfMemory:
        def __getattr__(self, name):
            return lambda *args: 1

    monkeypatch.setattr(wrapper, "library", lambda: OutOfMemory())
    q = torch.randn(1, 1, 8, 4)
    with pytest.raises(MemoryError, match="could not allocate their scratch memory"):
        cpu_efficient_taylor_shift(q, q, q, None, 1.0, None, True)


def test_fully_masked_rows_give_zeros_and_finite_grads():
    check_fully_masked(cpu_efficient_taylor_shift)


def test_non_contiguous_inputs_match_contiguous():
    check_non_contiguous(cpu_efficient_taylor_shift, rtol=0)  # the kernels copy: bitwise


def test_broadcast_output_gradient_matches_a_dense_one():
    check_broadcast_output_grad(cpu_efficient_taylor_shift)


def test_refuses_float64_and_other_devices_naming_them():
    q = torch.randn(1, 1, 3, 16, dtype=torch.float64)
    with pytest.raises(TypeError, match=r"query must be float16, bfloat16 or float32.*float64"):
        cpu_efficient_taylor_shift(q, q, q, None, 1.0, None, True)
    m = torch.empty(1, 1, 3, 16, device="meta")
    with pytest.raises(ValueError, match=r"query must be on the CPU.*got device meta"):
        cpu_efficient_taylor_shift(m, m, m, None, 1.0, None, True)
    q, wide = torch.randn(1, 1, 3, 16), torch.randn(1, 1, 3, 129)
    with pytest.raises(ValueError, match=r"value's last dimension must be at most 128.*got 129"):
        cpu_efficient_taylor_shift(q, q, wide, None, 1.0, None, True)


def test_state_shape_matches_the_kernels():
    lib = build.library()
    for d, width in ((1, 2), (16, 17), (17, 21), (64, 65), (128, 129)):
        assert state_shape(d, width) == (lib.ts_state_rows(d), lib.ts_state_cols(width))


# The build: where it goes, what happens when it cannot.


@pytest.fixture
def fresh_build(monkeypatch, tmp_path):
    """An empty cache and no loaded library for the test; the process's library after it."""
    monkeypatch.setenv("TAYLORSHIFT_CACHE_DIR", str(tmp_path / "cache"))
    build.library.cache_clear()
    fused._warn_cpu_once.cache_clear()
    yield tmp_path / "cache" / "cpu-kernels"
    build.library.cache_clear()
    fused._warn_cpu_once.cache_clear()


def test_build_lands_in_the_cache_by_content_with_no_temporary_left(fresh_build):
    if build.compiler() is None:
        pytest.skip("no C compiler: test_kernels_build_wherever_a_compiler_is_found covers it")
    assert cpu_ops.unavailable_reason() is None
    built = sorted(p.name for p in fresh_build.iterdir())
    assert len(built) == 1 and built[0].startswith("kernels-") and built[0].endswith(".so")
    build.library.cache_clear()
    mtime = (fresh_build / built[0]).stat().st_mtime_ns
    build.library()  # a second process: loads the cached file, builds nothing
    assert (fresh_build / built[0]).stat().st_mtime_ns == mtime
    assert sorted(p.name for p in fresh_build.iterdir()) == built


def test_a_failing_compiler_is_reported_and_the_call_falls_back(fresh_build, monkeypatch, caplog):
    monkeypatch.setenv("CC", "false")  # runs, and fails every build
    reason = cpu_ops.unavailable_reason()
    assert reason is not None and "failed" in reason and "false" in reason
    assert not any(p.name.startswith(".build-") for p in fresh_build.iterdir())
    q, k, v = (torch.randn(1, 2, 9, 8) for _ in range(3))
    with caplog.at_level(logging.WARNING, logger="taylorshift.dispatch"):
        y = taylor_shift_attention(q, k, v, mode="efficient")
        taylor_shift_attention(q, k, v, mode="efficient")
    warned = [r.getMessage() for r in caplog.records if "CPU kernels unavailable" in r.getMessage()]
    assert len(warned) == 1 and "false" in warned[0]
    assert torch.equal(y, efficient_taylor_shift(q, k, v, None, 1.0, None, True))


def _suite_build(monkeypatch, tmp_path, shared_kernel_builds):
    """The suite's shared build (built there if it was not yet): its path."""
    shared = tmp_path / "shared"
    (shared / "cpu-kernels").parent.mkdir()
    (shared / "cpu-kernels").symlink_to(shared_kernel_builds, target_is_directory=True)
    monkeypatch.setenv("TAYLORSHIFT_CACHE_DIR", str(shared))
    build.library.cache_clear()
    return shared_kernel_builds / os.path.basename(build.library()._name)


def test_processes_that_need_the_kernels_at_once_build_them_once(
    fresh_build, monkeypatch, tmp_path, shared_kernel_builds
):
    # Another process holds the folder's lock while it compiles (the ranks of a job, the
    # test workers, all starting at once): this one waits for its file and loads it instead
    # of compiling the same library beside it.
    if build.compiler() is None:
        pytest.skip("no C compiler: test_kernels_build_wherever_a_compiler_is_found covers it")
    done = _suite_build(monkeypatch, tmp_path, shared_kernel_builds)
    monkeypatch.setenv("TAYLORSHIFT_CACHE_DIR", str(fresh_build.parent))
    build.library.cache_clear()
    built, result = [], {}
    monkeypatch.setattr(build, "_build", lambda cc, flags, path: built.append(path))
    waiting = threading.Thread(target=lambda: result.update(reason=cpu_ops.unavailable_reason()))
    with build.build_lock(fresh_build):
        waiting.start()
        waiting.join(0.5)
        assert waiting.is_alive(), f"it did not wait for the lock: {result}, built {built}"
        shutil.copy(done, fresh_build / done.name)  # the other process's build lands
    waiting.join(60)
    assert result == {"reason": None} and built == []
    assert sorted(p.name for p in fresh_build.iterdir()) == [done.name]  # no lock file left


def test_a_build_lock_held_too_long_is_passed_by_with_a_warning(tmp_path, caplog):
    with (
        build.build_lock(tmp_path),
        caplog.at_level(logging.WARNING, "taylorshift.dispatch"),
        build.build_lock(tmp_path, wait_s=0.2),  # a second process: waits, then goes on
    ):
        pass
    assert f"{tmp_path} stayed locked; building without it" in caplog.text


def _unwritable_cache(monkeypatch, tmp_path, shared_kernel_builds):
    """The cache folder under a regular file, the temporary directory under tmp_path; builds
    copy the suite's shared build of the same name instead of compiling (seconds each)."""
    _suite_build(monkeypatch, tmp_path, shared_kernel_builds)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("TAYLORSHIFT_CACHE_DIR", str(blocker / "cache"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    built = []
    real = build._build

    def fake(cc, flags, path):
        built.append(path)
        if blocker in path.parents:
            real(cc, flags, path)  # raises: cannot write
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(shared_kernel_builds / path.name, path)

    build.library.cache_clear()
    monkeypatch.setattr(build, "_build", fake)
    return blocker, built


def test_a_cache_that_cannot_be_written_builds_in_a_private_temporary_folder(
    fresh_build, monkeypatch, tmp_path, shared_kernel_builds
):
    blocker, built = _unwritable_cache(monkeypatch, tmp_path, shared_kernel_builds)
    assert cpu_ops.unavailable_reason() is None
    private = tmp_path / "tmp" / f"taylorshift-{os.getuid()}"
    assert [p.parent for p in built] == [blocker / "cache" / "cpu-kernels", private / "cpu-kernels"]
    assert private.stat().st_mode & 0o777 == 0o700
    build.library.cache_clear()
    built.clear()
    assert cpu_ops.unavailable_reason() is None  # the next process loads it, builds nothing
    assert [p.parent for p in built] == [blocker / "cache" / "cpu-kernels"]


def test_a_temporary_folder_others_can_write_is_refused(
    fresh_build, monkeypatch, tmp_path, shared_kernel_builds
):
    blocker, _ = _unwritable_cache(monkeypatch, tmp_path, shared_kernel_builds)
    private = tmp_path / "tmp" / f"taylorshift-{os.getuid()}"
    private.mkdir()
    private.chmod(0o777)  # another user could plant a library there
    reason = cpu_ops.unavailable_reason()
    assert reason is not None and f"cannot write to {blocker / 'cache'}" in reason
    assert "set TAYLORSHIFT_CACHE_DIR to a writable folder" in reason
    assert f"{private} is not this user's private folder" in reason and "mode 777" in reason
    assert not (private / "cpu-kernels").exists()


def test_a_missing_compiler_and_the_switch_are_named(fresh_build, monkeypatch):
    monkeypatch.setenv("CC", os.path.join(str(fresh_build), "no-such-cc"))
    assert "does not run" in cpu_ops.unavailable_reason()
    monkeypatch.setenv(build.ENV, "off")
    assert cpu_ops.unavailable_reason() == f"turned off by {build.ENV}=off"


# Routing of the public op.


def test_public_op_routes_the_cpu_efficient_form_to_the_kernels(routed, c_calls, monkeypatch):
    q, k, v = (torch.randn(1, 2, 9, 8, requires_grad=True) for _ in range(3))
    mask = torch.ones(1, 1, 1, 9, dtype=torch.bool)
    mask[..., 7:] = False
    y = taylor_shift_attention(q, k, v, attn_mask=mask, mode="efficient")
    c_calls.ran("ts_efficient_forward")
    assert c_calls["ts_efficient_backward"] == 0
    grads = torch.autograd.grad(y.square().sum(), (q, k, v))
    c_calls.ran("ts_efficient_backward")
    assert routed == [fused.CPU_EFFICIENT]
    routed.clear()

    monkeypatch.setenv(build.ENV, "off")  # the reference: the PyTorch efficient form
    c_calls.clear()
    ref = taylor_shift_attention(q, k, v, attn_mask=mask, mode="efficient")
    ref_grads = torch.autograd.grad(ref.square().sum(), (q, k, v))
    c_calls.none()
    torch.testing.assert_close(y, ref, rtol=1e-4, atol=1e-5)
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-4)


def test_public_op_keeps_what_the_cpu_efficient_kernels_do_not_take_on_pytorch(
    routed, c_calls, monkeypatch
):
    q, k, v = (torch.randn(1, 2, 9, 8) for _ in range(3))
    taylor_shift_attention(q.double(), k.double(), v.double(), mode="efficient")  # float64
    rows = torch.rand(1, 1, 9, 9) > 0.5
    rows[..., 0] = True
    taylor_shift_attention(q, k, v, attn_mask=rows)  # varies over queries: auto -> torch direct
    monkeypatch.setenv(build.ENV, "off")
    taylor_shift_attention(q, k, v, mode="efficient")
    assert routed == []
    c_calls.none()


# The custom ops (the path torch.compile takes).


def _op_args(case: Case):
    low, _, mask, _ = make_problem(case, torch.float32)
    q, k, v = (x.detach().requires_grad_() for x in low[:3])
    factors = torch.rand(case.b * case.h, requires_grad=True)
    return q, k, v, key_mask_of(mask, case), factors


def test_custom_op_registration_passes_opcheck():
    q, k, v, key_mask, factors = _op_args(Case(1, 2, 5, 7, 16, 16, mask="padding"))
    op = torch.ops.taylorshift.cpu_forward.default
    torch.library.opcheck(op, ("efficient", 0, q, k, v, key_mask.contiguous(), factors, True))


def test_custom_op_refuses_an_unknown_form():
    q = torch.randn(1, 1, 4, 8)
    with pytest.raises(ValueError, match=r"form must be one of efficient, causal, direct .*'fast'"):
        torch.ops.taylorshift.cpu_forward("fast", 0, q, q, q, None, torch.ones(1), True)


def test_fake_tensor_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q, k = torch.empty(2, 3, 5, 33), torch.empty(2, 3, 7, 33)
        v = torch.empty(2, 3, 7, 20, dtype=torch.bfloat16)
        factors = torch.empty(6)
        out, den, count, state = torch.ops.taylorshift.cpu_forward(
            "efficient", 0, q, k, v, None, factors, True
        )
    assert out.shape == (2, 3, 5, 20) and out.dtype == torch.bfloat16 and count.shape == (6,)
    assert den.shape == (6, 5) and state.shape == (6, *state_shape(33, 21))


def test_torch_compile_traces_forward_and_backward():
    check_compiles(cpu_efficient_taylor_shift)
