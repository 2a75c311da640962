"""The cases run on P processes (tests/distributed/test_sequence_parallel.py), float64.

Every rank builds the whole problem from the same seed, computes the single-process result
and its gradients (the plain reference, ``naive_taylor_shift_attention``, or the undivided
module), runs the sequence-parallel version on its own slice, and compares its slice of the
output and of the input gradients; parameter and temperature gradients are summed over the
ranks first. All collectives of a case run before any comparison, so a failing comparison
leaves the ranks in step for the next case; a case that raises ends the rank's run.
"""

from __future__ import annotations

import copy
import traceback
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from taylorshift import naive_taylor_shift_attention, taylor_shift_attention
from taylorshift.bench.seqpar import measure
from taylorshift.distributed import (
    convert_sequence_parallel,
    sequence_parallel_taylor_shift,
    sequence_shard,
)
from taylorshift.nn import Attention
from tests.helpers import assert_rel_close, rel_error
from tests.nn.cases import spread_temperature

F64 = torch.float64
RTOL = 1e-10
B, H, D, DV = 2, 3, 4, 5


@dataclass(frozen=True)
class OpCase:
    """One call of the op: shard lengths of the queries (and keys, if they differ)."""

    causal: bool
    normalize: bool
    padded: bool
    lengths: tuple[int, ...]
    key_lengths: tuple[int, ...] | None = None  # non-causal only: keys split otherwise
    chunk: int | None = None
    kv_heads: int = H  # fewer: grouped-query attention (enable_gqa)

    @property
    def id(self) -> str:
        parts = [
            "causal" if self.causal else "full",
            "norm" if self.normalize else "plain",
            "pad" if self.padded else "nopad",
            "q" + "_".join(map(str, self.lengths)),
        ]
        if self.key_lengths is not None:
            parts.append("k" + "_".join(map(str, self.key_lengths)))
        if self.chunk is not None:
            parts.append(f"chunk{self.chunk}")
        if self.kv_heads != H:
            parts.append(f"kv{self.kv_heads}")
        return "-".join(parts)


# Shard lengths of a 17-token sequence: balanced, uneven with small chunks (several chunks
# per shard and a chunk boundary off the shard boundary), and with empty shards.
LAYOUTS = {
    2: [((9, 8), None), ((3, 14), 4), ((0, 17), None)],
    4: [((5, 4, 4, 4), None), ((2, 9, 0, 6), 3), ((7, 6, 4, 0), 2)],
}


def op_cases(world_size: int) -> list[OpCase]:
    cases = [
        OpCase(causal, normalize, padded, lengths, chunk=chunk)
        for causal in (False, True)
        for normalize in (True, False)
        for padded in (False, True)
        for lengths, chunk in LAYOUTS[world_size]
    ]
    # Cross-attention: 11 queries and 17 keys, split differently.
    key_lengths = LAYOUTS[world_size][1][0]
    query_lengths = tuple(
        len(range(11)[sequence_shard(11, r, world_size)]) for r in range(world_size)
    )
    cases.append(OpCase(False, True, True, query_lengths, key_lengths, chunk=2))
    # Grouped-query attention: one key/value head for the H query heads, states per it.
    lengths, chunk = LAYOUTS[world_size][1]
    cases += [OpCase(c, True, True, lengths, chunk=chunk, kv_heads=1) for c in (False, True)]
    return cases


LOW_PRECISION_CASES = ["bfloat16-causal-pad", "float16-full-pad"]
MODULE_CASES = [
    "module-causal-pad",
    "module-full-nopad",
    "module-gqa-causal-pad",
    "module-gqa-full-pad",
    "module-conv3-causal-anywhere",
    "module-conv4-full-anywhere",
    "module-conv3-full-nopad",
    "module-local-causal-anywhere",
    "module-local-full-anywhere",
    "module-local-conv3-causal-pad",
]
# short convolutions and local heads (window 3): slices shorter than the taps or the window
# reach (and empty ones), so that a slice's neighbours span several ranks
CONV_SPLITS = {2: (2, 11), 4: (5, 1, 0, 7)}
DDP_CASES = {4: ["ddp-2x2-causal-pad"], 2: []}
ERROR_CASES = {4: ["error-not-a-member"], 2: []}
BENCH_CASES = {2: ["bench-measure-smoke"], 4: []}
FUZZ_CASES = {2: ["fuzz-seqpar"], 4: []}
HALO_CASES = ["halo-rows"]


def case_ids(world_size: int) -> list[str]:
    return [
        *(c.id for c in op_cases(world_size)),
        *LOW_PRECISION_CASES,
        *MODULE_CASES,
        *DDP_CASES[world_size],
        *ERROR_CASES[world_size],
        *BENCH_CASES[world_size],
        *FUZZ_CASES[world_size],
        *HALO_CASES,
    ]


def _bounds(lengths: tuple[int, ...], rank: int) -> slice:
    start = sum(lengths[:rank])
    return slice(start, start + lengths[rank])


def _randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64)


def _sum_over_ranks(t: torch.Tensor, group=None) -> torch.Tensor:
    t = t.clone()
    dist.all_reduce(t, group=group)
    return t


def run_op_case(case: OpCase, rank: int) -> None:
    nq = sum(case.lengths)
    nk = nq if case.key_lengths is None else sum(case.key_lengths)
    hkv = case.kv_heads
    q, k, v = (
        _randn(B, H, nq, D, seed=1),
        _randn(B, hkv, nk, D, seed=2),
        _randn(B, hkv, nk, DV, seed=3),
    )
    g_out = _randn(B, H, nq, DV, seed=4)
    mask = None
    if case.padded:
        g = torch.Generator().manual_seed(5)
        per_head = case.key_lengths is not None  # (B, H, 1, Nk) here, (B, 1, 1, Nk) else
        mask = torch.rand(B, H if per_head else 1, 1, nk, generator=g) > 0.35
        mask[0] = False  # batch 0 attends nothing: zeros, finite gradients
    options = {"normalize": case.normalize}
    temperature = None
    if case.normalize:
        temperature = 0.5 + 1.5 * torch.rand(1, H, 1, 1, generator=torch.Generator().manual_seed(6))
        temperature = temperature.to(F64)
    elif case.padded:
        options["scale"] = 0.6

    def leaves(*tensors):
        return [None if t is None else t.clone().requires_grad_() for t in tensors]

    qf, kf, vf, tf = leaves(q, k, v, temperature)
    tau = {} if tf is None else {"temperature": tf}
    # the reference reads key/value head h // (H / Hkv) for query head h, repeated by hand
    kr, vr = (t.repeat_interleave(H // hkv, dim=1) for t in (kf, vf))
    expected = naive_taylor_shift_attention(qf, kr, vr, mask, case.causal, **tau, **options)
    (expected * g_out).sum().backward()

    qs = _bounds(case.lengths, rank)
    ks = qs if case.key_lengths is None else _bounds(case.key_lengths, rank)
    ql, kl, vl, tl = leaves(q[:, :, qs], k[:, :, ks], v[:, :, ks], temperature)
    local_mask = None if mask is None else mask[..., ks]
    tau = {} if tl is None else {"temperature": tl}
    out = sequence_parallel_taylor_shift(
        ql, kl, vl, local_mask, case.causal, **tau, **options, chunk_size=case.chunk,
        enable_gqa=hkv != H,
    )  # fmt: skip
    (out * g_out[:, :, qs]).sum().backward()
    t_grad = None if tl is None else _sum_over_ranks(tl.grad)

    assert_rel_close(out, expected[:, :, qs], RTOL, "output")
    assert_rel_close(ql.grad, qf.grad[:, :, qs], RTOL, "query grad")
    assert_rel_close(kl.grad, kf.grad[:, :, ks], RTOL, "key grad")
    assert_rel_close(vl.grad, vf.grad[:, :, ks], RTOL, "value grad")
    if t_grad is not None:
        assert_rel_close(t_grad, tf.grad, RTOL, "temperature grad (summed over ranks)")


def run_low_precision_case(case_id: str, rank: int, world_size: int) -> None:
    """16-bit inputs (states and collectives in float32): the error against the float64
    reference is at most 2× (outputs) and 3× (gradients) that of the single-process
    efficient form in the same dtype, plus a relative RMS bound (SPEC §8)."""
    dtype = getattr(torch, case_id.split("-")[0])
    causal = "causal" in case_id
    n = 301
    q, k, v = _randn(B, H, n, D, seed=11), _randn(B, H, n, D, seed=12), _randn(B, H, n, DV, seed=13)
    g_out = _randn(B, H, n, DV, seed=14)
    mask = torch.rand(B, 1, 1, n, generator=torch.Generator().manual_seed(15)) > 0.2
    tau = torch.tensor([0.6, 1.0, 2.0], dtype=F64).reshape(1, H, 1, 1)
    s = sequence_shard(n, rank, world_size)

    def run(op, q, k, v, t, m, rows=slice(None), **kw):
        leaves = [x.clone().requires_grad_() for x in (q, k, v, t)]
        y = op(*leaves[:3], m, causal, temperature=leaves[3], **kw)
        (y.double() * g_out[:, :, rows]).sum().backward()
        return y.double(), [x.grad.double() for x in leaves]

    exact = run(naive_taylor_shift_attention, q, k, v, tau, mask)
    low = [x.to(dtype) for x in (q, k, v, tau)]
    single = run(taylor_shift_attention, *low, mask, mode="efficient")
    local = run(
        sequence_parallel_taylor_shift, low[0][:, :, s], low[1][:, :, s], low[2][:, :, s],
        low[3], mask[..., s], rows=s,
    )  # fmt: skip
    summed_t = _sum_over_ranks(local[1][3])

    def check(ours, theirs, ref, factor, what):
        mine, baseline = rel_error(ours, ref), rel_error(theirs, ref)
        assert mine <= factor * baseline + 1e-6, f"{what}: {mine:.2e} > {factor} × {baseline:.2e}"

    check(local[0], single[0][:, :, s], exact[0][:, :, s], 2, "output")
    for i, name in enumerate("qkv"):
        check(local[1][i], single[1][i][:, :, s], exact[1][i][:, :, s], 3, f"grad {name}")
    check(summed_t, single[1][3], exact[1][3], 3, "grad temperature (summed)")
    assert rel_error(local[0], exact[0][:, :, s]) < 5e-3, "output relative RMS"


def _attention(seed: int = 0, local_heads: int = 0, **settings) -> Attention:
    torch.manual_seed(seed)
    args = {"mode": "efficient"}
    if local_heads:
        args.update(local_heads=local_heads, window=3)
    module = Attention(12, H, qkv_bias=True, dtype=F64, kernel_args=args, **settings)
    spread_temperature(module, seed)
    return module


def _grads(module) -> dict[str, torch.Tensor]:
    return {n: p.grad for n, p in module.named_parameters()}


def run_module_case(case_id: str, rank: int, world_size: int) -> None:
    """An Attention layer on a slice (B, N_r, dim): output, input and parameter grads. With
    ``convK`` a short convolution of K taps (its slices from CONV_SPLITS), ``anywhere``:
    padding before and between real tokens (compared at the real tokens)."""
    parts = case_id.split("-")
    causal = "causal" in parts
    n = 13
    x, g_out = _randn(B, n, 12, seed=7), _randn(B, n, 12, seed=8)
    mask = None
    if "pad" in parts:
        mask = torch.arange(n)[None, :] < torch.tensor([[n - 5], [n]])
    if "anywhere" in parts:
        mask = torch.ones(B, n, dtype=torch.bool)
        mask[0, [0, 3, 4, 9]] = False
        mask[1, :4] = False
        g_out = g_out * mask[..., None]
    conv = next((int(p[4:]) for p in parts if p.startswith("conv")), 0)
    gqa, local_heads = 1 if "gqa" in parts else None, int("local" in parts)
    whole = _attention(num_kv_heads=gqa, short_conv=conv, local_heads=local_heads)
    local = convert_sequence_parallel(copy.deepcopy(whole))
    assert type(local.kernel).__name__ == "SequenceParallelKernel"

    xf = x.clone().requires_grad_()
    expected = whole(xf, attn_mask=mask, is_causal=causal)
    (expected * g_out).sum().backward()

    reach = conv or "local" in parts  # (whose reach crosses the slices' ends)
    s = _bounds(CONV_SPLITS[world_size], rank) if reach else sequence_shard(n, rank, world_size)
    xl = x[:, s].clone().requires_grad_()
    out = local(xl, attn_mask=None if mask is None else mask[:, s], is_causal=causal)
    (out * g_out[:, s]).sum().backward()
    summed = {name: _sum_over_ranks(g) for name, g in _grads(local).items()}
    with torch.no_grad():  # inference: no backward collectives pending
        again = local(xl, attn_mask=None if mask is None else mask[:, s], is_causal=causal)

    real = torch.ones(B, n, dtype=torch.bool) if "anywhere" not in parts else mask
    assert_rel_close(out[real[:, s]], expected[:, s][real[:, s]], RTOL, "module output")
    assert_rel_close(again[real[:, s]], expected[:, s][real[:, s]], RTOL, "output, no_grad")
    assert_rel_close(xl.grad, xf.grad[:, s], RTOL, "input grad")
    for name, g in _grads(whole).items():
        assert_rel_close(summed[name], g, RTOL, f"grad of {name} (summed over ranks)")


def run_ddp_case(rank: int, groups: list) -> None:
    """Data × sequence parallel: 2 groups of 2 ranks, each group one half of the batch, DDP
    over all 4 ranks. Per rank: loss = P_sp · (sum of its tokens' losses) / (tokens in its
    group's half); DDP averages over the 4 ranks. Equals one process on the whole batch
    with loss = mean over the halves of each half's token mean."""
    p_sp, n = 2, 11
    x, g_tok = _randn(4, n, 12, seed=9), _randn(4, n, 12, seed=10)
    mask = torch.arange(n)[None, :] < torch.tensor([[n], [n - 3], [4], [n - 7]])

    def token_losses(y, g):
        return (y * g).sum(-1)  # (B, N): a loss per token, linear in y

    whole = _attention(seed=1)
    expected, losses = [], []
    for half in (slice(0, 2), slice(2, 4)):
        y = whole(x[half], attn_mask=mask[half], is_causal=True)
        expected.append(y)
        m = mask[half]
        losses.append(token_losses(y, g_tok[half])[m].sum() / m.sum())
    (sum(losses) / 2).backward()

    dp_rank, sp_rank = divmod(rank, p_sp)
    half = slice(2 * dp_rank, 2 * dp_rank + 2)
    s = sequence_shard(n, sp_rank, p_sp)
    local = DistributedDataParallel(convert_sequence_parallel(_attention(seed=1), groups[dp_rank]))
    m = mask[half]
    y = local(x[half, s], attn_mask=m[:, s], is_causal=True)
    loss = p_sp * token_losses(y, g_tok[half, s])[m[:, s]].sum() / m.sum()
    loss.backward()

    assert_rel_close(y, expected[dp_rank][:, s], RTOL, "output")
    for (name, g), (_, ref) in zip(
        _grads(local.module).items(), _grads(whole).items(), strict=True
    ):
        assert_rel_close(g, ref, RTOL, f"grad of {name} after DDP")


def run_error_case(rank: int, groups: list) -> None:
    """A rank outside the group is refused before any collective."""
    q = torch.zeros(1, 1, 2, 3, dtype=F64)
    other = groups[1 - rank // 2]
    try:
        sequence_parallel_taylor_shift(q, q, q, group=other)
    except ValueError as e:
        assert "is not a member of group" in str(e), str(e)
    else:
        raise AssertionError("no ValueError for a group this rank is not in")


def run_bench_case(rank: int, world_size: int) -> None:
    """The benchmark's measurement runs in a group and reports positive times."""
    times = measure(n=64, batch=1, heads=2, head_dim=4, causal=True, repeats=2, group=None)
    passes, kinds = ("forward", "forward_backward"), ("s", "min_s", "cpu_s")
    assert set(times) == {f"{p}_{k}" for p in passes for k in kinds}, times
    assert all(t > 0 for t in times.values()), times


def _neighbours_by_hand(x, real, start, stop, before, after):
    """The plain reference of ``neighbour_rows``: from the whole sequence, each row's real
    rows before ``start`` (the last ``before``) and from ``stop`` on (the first ``after``),
    zeros and False where there are fewer."""
    rows_b, rows_a, ok_b, ok_a = [], [], [], []
    for i in range(x.shape[0]):
        prev = x[i, :start][real[i, :start]]
        nxt = x[i, stop:][real[i, stop:]]
        prev, nxt = prev[prev.shape[0] - min(before, prev.shape[0]) :], nxt[:after]
        rows_b.append(torch.cat([x.new_zeros((before - prev.shape[0], x.shape[2])), prev]))
        rows_a.append(torch.cat([nxt, x.new_zeros((after - nxt.shape[0], x.shape[2]))]))
        ok_b.append(torch.arange(before) >= before - prev.shape[0])
        ok_a.append(torch.arange(after) < nxt.shape[0])
    return torch.stack(rows_b), torch.stack(rows_a), torch.stack(ok_b), torch.stack(ok_a)


def run_halo_case(rank: int, world_size: int) -> None:
    """``neighbour_rows`` against the rows picked by hand from the whole sequence, for
    uneven and empty slices, padding anywhere and 0-5 rows each side; and its gradient: a
    row's gradient, summed over the ranks, reaches its own rank."""
    from taylorshift.distributed.halo import neighbour_rows

    g = torch.Generator().manual_seed(3)
    n = 17
    x = torch.randn(3, n, 4, generator=g, dtype=F64)
    real = torch.rand(3, n, generator=g) < 0.6
    real[2] = False  # a row with no real token
    cuts = {2: [0, 2, n], 4: [0, 2, 9, 9, n]}[world_size]  # (rank 2 of 4 holds nothing)
    start, stop = cuts[rank], cuts[rank + 1]

    def rows_by_hand(r: int, before: int, after: int, whole: torch.Tensor):
        return _neighbours_by_hand(whole, real, cuts[r], cuts[r + 1], before, after)

    for before, after in ((0, 0), (1, 0), (3, 2), (5, 5), (0, 4)):
        xl = x[:, start:stop].clone().requires_grad_()
        got = neighbour_rows(xl, real[:, start:stop], before, after, None)
        want = rows_by_hand(rank, before, after, x)
        names = ["rows before", "rows after", "valid before", "valid after"]
        for a, b, what in zip(got, want, names, strict=True):
            assert torch.equal(a.detach(), b), f"{what}, {before} before, {after} after"
        # each rank weighs the rows it reads by rank + 1: a row's gradient is the sum of the
        # weights of the ranks that read it, whichever rank holds it
        (got[0].sum() + got[1].sum()).mul(rank + 1).backward()
        want_grad = torch.zeros_like(x)
        for r in range(world_size):
            whole = x.clone().requires_grad_()
            rows_before, rows_after, _, _ = rows_by_hand(r, before, after, whole)
            (rows_before.sum() + rows_after.sum()).mul(r + 1).backward()
            want_grad += whole.grad
        assert torch.equal(xl.grad, want_grad[:, start:stop]), f"gradient, {before}, {after}"


def run_fuzz_case(rank: int, world_size: int) -> None:
    """benchmarks/fuzz/fuzz.py's seqpar cases run in this group (the script's own runs start
    a process per rank; tests/test_fuzz_script.py shows in one process that they can fail)."""
    import importlib.util
    import random
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "fuzz" / "fuzz.py"
    spec = importlib.util.spec_from_file_location("fuzz_script", path)
    fuzz = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fuzz)
    rng = random.Random(11)
    for i in range(2):
        params: dict = {}
        used = fuzz.seqpar_case(rng, 1_100_000 + i, params, rank, world_size)
        assert used <= 1.0, f"case {i}: {used:.3g}x its error budget {params}"


def run_cases(rank: int, world_size: int) -> dict[str, str | None]:
    """Every case of this world size: {case id: None if passed, else the failure}."""
    groups = []
    if world_size == 4:  # every rank creates every group, in the same order
        groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    runs: list[tuple[str, Callable[[], None]]] = [
        (c.id, lambda c=c: run_op_case(c, rank)) for c in op_cases(world_size)
    ]
    runs += [
        (i, lambda i=i: run_low_precision_case(i, rank, world_size)) for i in LOW_PRECISION_CASES
    ]
    runs += [(i, lambda i=i: run_module_case(i, rank, world_size)) for i in MODULE_CASES]
    runs += [(i, lambda: run_ddp_case(rank, groups)) for i in DDP_CASES[world_size]]
    runs += [(i, lambda: run_error_case(rank, groups)) for i in ERROR_CASES[world_size]]
    runs += [(i, lambda: run_bench_case(rank, world_size)) for i in BENCH_CASES[world_size]]
    runs += [(i, lambda: run_fuzz_case(rank, world_size)) for i in FUZZ_CASES[world_size]]
    runs += [(i, lambda: run_halo_case(rank, world_size)) for i in HALO_CASES]
    results: dict[str, str | None] = {}
    for case_id, run in runs:
        try:
            run()
            results[case_id] = None
        except AssertionError as e:
            results[case_id] = f"rank {rank}: {e}"
        except Exception:
            results[case_id] = f"rank {rank} raised:\n{traceback.format_exc()}"
            break  # the other ranks may now wait in a collective: stop here
    for case_id, _ in runs:
        results.setdefault(case_id, f"rank {rank}: not run (an earlier case raised)")
    return results
