"""Random edge cases of the public op and of decoding against the float64 reference.

    python benchmarks/fuzz/fuzz.py op --seed 1 --cases 250
    python benchmarks/fuzz/fuzz.py decode --seed 1 --cases 150

The test suite checks chosen shapes; this draws many at random, with the sizes where
kernels change their tiling or split their work: d in 1..128 (odd, the CPU kernels'
limits), Nq and Nk in {1, 2, 7, 191, 192, 193, 300} (the state update's token threshold is
192), 1-3 heads, 1-2 batch entries, 1, 2, 3 or 8 torch threads, every mode, causal or not,
no mask / key padding / a mask that varies over queries, float or per-head tensor
temperature, plain scores, float32, float64, float16 and bfloat16 inputs.

``op``: ``taylor_shift_attention`` and its gradients (query, key, value, a tensor
temperature) against ``naive_taylor_shift_attention`` run in float64.
``decode``: a prefix fed through ``taylor_shift_decode`` in one block, then one token at a
time (in place or not, with key padding or not) against one causal call over the whole
sequence in float64, the rows of real tokens compared.

Each result (output, each gradient) has an error budget, SPEC §8's rule: 10x the error of
the float64 reference's own code run in the case's dtype, plus OP_TOLERANCE of the dtype
(2e-5 float32, 1e-11 float64, 2e-3 float16, 2e-2 bfloat16) times the result's size, for a
gradient at least times |∂L/∂out| (1 + |v|), the size of the terms it sums: where they
cancel, the rounding of the output shows (the CPU kernels, as FlashAttention, take
δ = ∂L/∂out · out from the output in its dtype). A gradient that vanishes in exact
arithmetic (d = 1, a single attended key) is held to Nk times that. Decoding, against one
float64 causal call: DECODE_TOLERANCE times its size. A 1e-4 relative error in a float32
or float64 output fails. Every case runs; each one over its budget, non-finite, or raising
is printed with its parameters, and the last line counts them. Exit status 1 when any case
failed.
"""

from __future__ import annotations

import argparse
import random
import sys

import torch

from taylorshift import naive_taylor_shift_attention, taylor_shift_attention, taylor_shift_decode

LENGTHS = [1, 2, 7, 191, 192, 193, 300]
# float32 drawn twice as often: it is what reaches the CPU kernels' float32 paths; float16
# and bfloat16 reach them too (sums in float32), float64 stays on the PyTorch forms
OP_DTYPES = [torch.float32, torch.float32, torch.float64, torch.float16, torch.bfloat16]
# the budget's share of a result's size, beside 10x the reference's own error in the dtype
OP_TOLERANCE = {torch.float32: 2e-5, torch.float64: 1e-11, torch.float16: 2e-3,
                torch.bfloat16: 2e-2}  # fmt: skip
# decoding against one float64 causal call: a relative bound only (about 4x the rounding
# of the result itself in float16 and bfloat16)
DECODE_TOLERANCE = {torch.float32: 2e-5, torch.float64: 1e-10, torch.float16: 2e-3,
                    torch.bfloat16: 2e-2}  # fmt: skip


def _used(actual, reference, low, scale: float, tol: float) -> float:
    """The share of its error budget a result uses (over 1: failed). The budget (SPEC §8):
    10x the error of the reference itself run in the same dtype (``low``; none in float64),
    plus ``tol`` times the result's size or ``scale``, whichever is larger. For a gradient,
    ``scale`` is |∂L/∂out| (1 + |v|), the size of the terms it sums: a gradient much smaller
    than that is what is left where they cancel, and the rounding of the output shows there
    (the CPU kernels, as FlashAttention, take δ = ∂L/∂out · out from the output in its
    dtype).
    For a gradient that vanishes in exact arithmetic (the query and key gradients with
    d = 1 or a single attended key) the caller passes Nk times that: it is only rounding,
    of sums over up to Nk such terms."""
    if not reference.numel():
        return 0.0
    diff = (actual.double() - reference).abs().max().item()
    size = reference.abs().max().item()
    budget = 10 * (low.double() - reference).abs().max().item()
    budget += tol * max(size, scale)
    return diff / budget if budget > 0 else (0.0 if diff == 0 else float("inf"))


def op_case(rng: random.Random, seed: int, params: dict) -> float:
    """One random call; its parameters go into ``params`` before it runs (so that a call
    that raises can be reported); returns the share of its error budget used."""
    d = rng.choice([1, 2, 3, 8, 16, 17, 32, 64, 65, 128])
    dv = rng.choice([1, d, 5, 64])
    nq = rng.choice(LENGTHS)
    causal = rng.random() < 0.4
    nk = nq if causal else rng.choice(LENGTHS)
    b, h = rng.choice([1, 2]), rng.choice([1, 3])
    mode = rng.choice(["auto", "efficient", "direct"])
    threads = rng.choice([1, 2, 3, 8])
    normalize = rng.random() < 0.8
    dtype = rng.choice(OP_DTYPES)
    masks = [None, "padding", "general"] if mode != "efficient" else [None, "padding"]
    mask_kind = rng.choice(masks)
    tensor_tau = normalize and rng.random() < 0.5
    params.update(d=d, dv=dv, nq=nq, nk=nk, b=b, h=h, mode=mode, causal=causal,
                  mask=mask_kind, threads=threads, normalize=normalize,
                  dtype=str(dtype).removeprefix("torch."), tensor_tau=tensor_tau)  # fmt: skip

    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, nq, d, generator=g, dtype=dtype)
    k = torch.randn(b, h, nk, d, generator=g, dtype=dtype)
    v = torch.randn(b, h, nk, dv, generator=g, dtype=dtype)
    mask = None
    if mask_kind == "padding":
        mask = torch.rand(b, 1, 1, nk, generator=g) < 0.7
    elif mask_kind == "general":
        mask = torch.rand(b, h, nq, nk, generator=g) < 0.7
    tau = (torch.rand(1, h, 1, 1, generator=g, dtype=dtype) * 3 + 0.5) if tensor_tau else 1.0

    def run(inputs, tau_, out_dtype, mode_):
        leaves = [x.to(out_dtype).requires_grad_() for x in inputs]
        tau_leaf = tau_.detach().to(out_dtype).requires_grad_() if tensor_tau else tau_
        kwargs = {"normalize": normalize}
        if normalize:
            kwargs["temperature"] = tau_leaf
        if mode_ is None:
            out = naive_taylor_shift_attention(*leaves, mask, causal, **kwargs)
        else:
            out = taylor_shift_attention(*leaves, mask, causal, mode=mode_, **kwargs)
        grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed + 1),
                               dtype=torch.float64)  # fmt: skip
        wrt = leaves + ([tau_leaf] if tensor_tau else [])
        return [out, *torch.autograd.grad(out, wrt, grad_out.to(out_dtype))], grad_out

    got, grad_out = run((q, k, v), tau, dtype, mode)
    want, _ = run((q, k, v), tau, torch.float64, None)
    low = run((q, k, v), tau, dtype, None)[0] if dtype != torch.float64 else want
    if not all(torch.isfinite(x).all() for x in got):
        return float("inf")
    tol = OP_TOLERANCE[dtype]
    # the size of the terms a gradient sums (the output's budget is its own size only);
    # d = 1 (q/|q| = ±1 has no direction to move in) or a single attended key: the query
    # and key gradients vanish in exact arithmetic, sums of up to Nk such terms cancelled
    size = grad_out.abs().max().item() * (1 + v.abs().max().item()) if v.numel() else 0.0
    scales = [0.0]
    for r in want[1:]:
        vanishes = r.numel() and r.abs().max().item() < 1e-9 * size
        scales.append(size * nk if vanishes else size)
    used = [_used(*x, tol) for x in zip(got, want, low, scales, strict=True)]
    return max(used)


def decode_case(rng: random.Random, seed: int, params: dict) -> float:
    """One random decoding, as ``op_case``."""
    d = rng.choice([1, 2, 5, 16, 17, 32, 64])
    dv = rng.choice([1, 3, d, 64])
    b, h = rng.choice([1, 2]), rng.choice([1, 3])
    n = rng.choice([1, 2, 9, 40, 130, 300])
    prefix = rng.randint(0, n)
    dtype = rng.choice(list(DECODE_TOLERANCE))
    normalize = rng.random() < 0.8
    threads = rng.choice([1, 2, 3])
    padded = rng.random() < 0.3
    inplace = rng.random() < 0.5
    tau_kind = rng.choice(["1", "2.5", "tensor"]) if normalize else "plain"
    params.update(d=d, dv=dv, b=b, h=h, n=n, prefix=prefix, dtype=str(dtype).removeprefix("torch."),
                  threads=threads, padded=padded, inplace=inplace, tau=tau_kind)  # fmt: skip

    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, h, n, x, generator=g, dtype=dtype) for x in (d, d, dv))
    pad = torch.rand(b, n, generator=g) < 0.8 if padded else None
    kwargs: dict = {"normalize": normalize}
    if tau_kind == "tensor":
        kwargs["temperature"] = torch.rand(1, h, 1, 1, generator=g, dtype=dtype) + 0.5
    elif normalize:
        kwargs["temperature"] = float(tau_kind)

    as64 = {key: x.double() if isinstance(x, torch.Tensor) else x for key, x in kwargs.items()}
    mask = None if pad is None else pad[:, None, None, :]
    want = taylor_shift_attention(
        q.double(), k.double(), v.double(), mask, True, mode="direct", **as64
    )
    outs, state = [], None
    if prefix:
        block = None if pad is None else pad[:, :prefix]
        out, state = taylor_shift_decode(
            q[:, :, :prefix], k[:, :, :prefix], v[:, :, :prefix], state, block, **kwargs
        )
        outs.append(out)
    for t in range(prefix, n):
        step = None if pad is None else pad[:, t : t + 1]
        out, state = taylor_shift_decode(
            q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1], state, step,
            inplace=inplace, **kwargs,
        )  # fmt: skip
        outs.append(out)
    got = torch.cat(outs, 2)
    real = torch.ones(b, n, dtype=torch.bool) if pad is None else pad  # padded rows: unused
    rows = real[:, None, :].expand(b, h, n)
    if not torch.isfinite(got[rows]).all():
        return float("inf")
    # the decoding steps against one causal call: same sums in another order, so the
    # budget is a relative bound only
    tol = DECODE_TOLERANCE[dtype]
    return _used(got[rows], want[rows], want[rows], 0.0, tol)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["op", "decode"])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--cases", type=int, default=200)
    args = parser.parse_args(argv)
    case = op_case if args.what == "op" else decode_case
    rng = random.Random(args.seed)
    failed = 0
    worst: dict[str, float] = {}
    for i in range(args.cases):
        params: dict = {}
        try:
            used = case(rng, args.seed * 100_000 + i, params)
        except Exception as err:  # a crash is a finding: report it and go on
            failed += 1
            print(f"case {i}: raised {err!r:.300} {params}", flush=True)
            continue
        key = params["dtype"]
        worst[key] = max(worst.get(key, 0.0), used)
        if not used <= 1.0:
            failed += 1
            print(f"case {i}: {used:.3g}x its error budget {params}", flush=True)
    spread = ", ".join(f"{dtype} {value:.3f}" for dtype, value in sorted(worst.items()))
    print(f"{args.what}: {args.cases} cases, seed {args.seed}, {failed} failed; "
          f"largest share of the error budget used: {spread}")  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
