"""Forward and backward of the efficient form with the prototype's kernels for all four
feature products, against the PyTorch form, in one process.

    python benchmarks/op_cpu/cpu-kernel-prototype/backward.py 16x256 16x1024 32x1024 \\
        64x1024 64x4096

The backward's two feature products are the forward's two kernels on other operands
(∂S = Σ_t φ(q_t) ∂Y_t is a state update, ∂[v, 1] = φ(k) ∂S a readout), and the gradients
of q and k from the packed states run in a third kernel (``pair_grad``); the
normalisation's backward and the set-up stay in torch. Checks q, k, v gradients against
the float64 form's autograd, then times forward + backward (B 1, H 4, dv = d, float32,
non-causal, no mask, τ = 1, 2 threads) in shuffled rounds: medians and the PyTorch /
prototype ratio paired by round, with SDPA's forward + backward on the same inputs.
"""

from __future__ import annotations

import math
import statistics
import sys

import torch
from forward import LIB, shuffled_rounds, unpacking

from taylorshift.ops.taylor_shift.efficient import efficient_taylor_shift
from taylorshift.ops.taylor_shift.features import scaled_input_grad

EPS = 1e-12


def token_major(x: torch.Tensor, stride: int) -> torch.Tensor:
    """(BH, N, d) -> (BH, N, stride) rows [x, 1, 0, ...] for the state update."""
    bh, n, d = x.shape
    out = torch.zeros(bh, n, stride)
    out[..., :d], out[..., d] = x, 1.0
    return out


def feature_major(x: torch.Tensor, n16: int) -> torch.Tensor:
    """(BH, N, d) -> (BH, d + 1, N16) rows of [x, 1] (tokens past N are zero) for the readout."""
    bh, n, d = x.shape
    out = torch.zeros(bh, d + 1, n16)
    out[:, :d, :n], out[:, d, :] = x.transpose(1, 2), 1.0
    return out


def update(x_rows: torch.Tensor, e: int, values: torch.Tensor) -> torch.Tensor:
    """Σ_t φ(x~_t) values_tᵀ, unpacked to (BH, E(E+1)/2, cols)."""
    bh, n, stride = x_rows.shape
    cols, padded = values.shape[-1], LIB.padded_pairs(e)
    state_t = torch.zeros(bh, cols, padded)
    LIB.state_update_b(bh, x_rows.data_ptr(), n, e, stride, values.contiguous().data_ptr(),
                       cols, state_t.data_ptr(), padded)  # fmt: skip
    index, _ = unpacking(e)
    return state_t.transpose(1, 2)[:, index, :]


def readout(x_cols: torch.Tensor, state: torch.Tensor, n: int) -> torch.Tensor:
    """φ(x~_t) state for every token: (BH, N, cols)."""
    bh, e, n16 = x_cols.shape
    cols = state.shape[-1]
    y_t = torch.empty(bh, cols, n16)
    state = state.contiguous()
    LIB.readout_b(bh, x_cols.data_ptr(), n16, e, state.data_ptr(), state.shape[1], cols,
                  y_t.data_ptr())  # fmt: skip
    return y_t[:, :, :n].transpose(1, 2)


_SIXES: dict[int, torch.Tensor] = {}


def six_padding(e: int) -> torch.Tensor:
    """Rows of the packed state, each row a of the triangle padded to a multiple of 6 pairs
    with the zero row appended at index E(E+1)/2 (the layout ``pair_grad`` reads)."""
    if e not in _SIXES:
        index, start, zero = [], 0, e * (e + 1) // 2
        for a in range(e):
            length = e - a
            index += [start + j if j < length else zero for j in range((length + 5) // 6 * 6)]
            start += length
        _SIXES[e] = torch.tensor(index)
    return _SIXES[e]


def pair_grad(x: torch.Tensor, g: torch.Tensor, packed: torch.Tensor, e: int) -> torch.Tensor:
    """∂/∂x~ of Σ_c g_c Σ_p packed[p, c] f_p(x~) for every token, in the C kernel
    (``pair_grad`` of kernels.c: ∂x_a = Σ_b (Σ_c packed[(a, b), c] g_c) x_b over both orders
    of each pair). x (BH, N, E), g (BH, N, cols), packed (BH, E(E+1)/2, cols)."""
    bh, n, _ = x.shape
    cols, n16 = g.shape[-1], (n + 15) // 16 * 16
    x_cols = torch.zeros(bh, e + 8, n16)
    x_cols[:, :e, :n] = x.transpose(1, 2)
    g_cols = torch.zeros(bh, cols, n16)
    g_cols[:, :, :n] = g.transpose(1, 2)
    padded = torch.cat([packed, packed.new_zeros(bh, 1, cols)], 1)[:, six_padding(e)]
    padded = padded.contiguous()
    gx = torch.zeros(bh, e + 8, n16)
    LIB.pair_grad_b(bh, x_cols.data_ptr(), n16, e, g_cols.data_ptr(), cols, padded.data_ptr(),
                    padded.shape[1], gx.data_ptr())  # fmt: skip
    return gx[:, :e, :n].transpose(1, 2)


class Prototype(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v):
        b, h, n, d = q.shape
        dv, bh, e = v.shape[-1], b * h, d + 1
        stride, cols, n16 = e + 16, (dv + 1 + 5) // 6 * 6, (n + 15) // 16 * 16
        qn = q.reshape(bh, n, d) / q.reshape(bh, n, d).norm(dim=-1, keepdim=True).clamp_min(EPS)
        kn = k.reshape(bh, n, d) / k.reshape(bh, n, d).norm(dim=-1, keepdim=True).clamp_min(EPS)
        values = torch.zeros(bh, n, cols)
        values[..., :dv], values[..., dv] = v.reshape(bh, n, dv), 1.0
        _, weight = unpacking(e)
        state = update(token_major(kn, stride), e, values) * weight
        q_cols = feature_major(qn, n16)
        y = readout(q_cols, state, n) + 0.5 * values.sum(1, keepdim=True)
        den = y[..., dv]
        scale = math.sqrt(n / d) / den
        out = y[..., :dv] * scale.unsqueeze(-1)
        ctx.save_for_backward(q, k, qn, kn, values, state, out, den, scale)
        return out.reshape(b, h, n, dv)

    @staticmethod
    def backward(ctx, grad):
        q, k, qn, kn, values, state, out, den, scale = ctx.saved_tensors
        b, h, n, d = q.shape
        bh, e, dv, cols = b * h, d + 1, out.shape[-1], values.shape[-1]
        g = grad.reshape(bh, n, dv)
        g_y = torch.zeros(bh, n, cols)
        g_y[..., :dv] = g * scale.unsqueeze(-1)
        g_y[..., dv] = -(g * out).sum(-1) / den
        _, weight = unpacking(e)
        q_ext = torch.cat([qn, torch.ones(bh, n, 1)], -1)
        k_ext = torch.cat([kn, torch.ones(bh, n, 1)], -1)
        g_q = pair_grad(q_ext, g_y, state, e)[..., :d]
        g_state = update(token_major(qn, e + 16), e, g_y) * weight  # ∂ of the unweighted S
        g_values = readout(feature_major(kn, (n + 15) // 16 * 16), g_state, n)
        g_values = g_values + 0.5 * g_y.sum(1, keepdim=True)
        g_k = pair_grad(k_ext, values, g_state, e)[..., :d]
        gq, _ = scaled_input_grad(q.reshape(bh, n, d), g_q, 1.0, True)
        gk, _ = scaled_input_grad(k.reshape(bh, n, d), g_k, 1.0, True)
        return gq.reshape(q.shape), gk.reshape(k.shape), g_values[..., :dv].reshape(b, h, n, dv)


def main() -> None:
    torch.set_num_threads(2)
    gen = torch.Generator().manual_seed(0)
    q, k, v, g = (torch.randn(1, 4, 300, 32, generator=gen, dtype=torch.float64)
                  for _ in range(4))  # fmt: skip
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    exact = torch.autograd.grad(efficient_taylor_shift(*leaves, None, 1.0, None, True), leaves, g)
    leaves = [t.float().requires_grad_() for t in (q, k, v)]
    mine = torch.autograd.grad(Prototype.apply(*leaves), leaves, g.float())
    errors = ", ".join(
        f"{name} {(m.double() - x).abs().max().item():.1e}"
        for name, m, x in zip("qkv", mine, exact, strict=True)
    )
    print(f"torch {torch.__version__}, 2 threads; gradients' max error against float64 at "
          f"(1, 4, 300, 32): {errors}")  # fmt: skip
    print("| d | N | PyTorch form fwd+bwd ms | prototype ms | PyTorch / prototype (paired) "
          "| SDPA ms |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|")
    for d, n in (tuple(map(int, point.split("x"))) for point in sys.argv[1:]):
        q, k, v, g = (torch.randn(1, 4, n, d, generator=gen) for _ in range(4))
        leaves = [t.requires_grad_() for t in (q, k, v)]

        def theirs(leaves=leaves, g=g):
            torch.autograd.grad(efficient_taylor_shift(*leaves, None, 1.0, None, True), leaves, g)

        def prototype(leaves=leaves, g=g):
            torch.autograd.grad(Prototype.apply(*leaves), leaves, g)

        def sdpa(leaves=leaves, g=g):
            out = torch.nn.functional.scaled_dot_product_attention(*leaves)
            torch.autograd.grad(out, leaves, g)

        fns = {"torch": theirs, "prototype": prototype, "sdpa": sdpa}
        for fn in fns.values():
            fn()
        times = shuffled_rounds(fns, 5 if n >= 4096 else 15)
        med = {key: statistics.median(ts) for key, ts in times.items()}
        pairs = zip(times["torch"], times["prototype"], strict=True)
        ratio = statistics.median(x / y for x, y in pairs)
        print(f"| {d} | {n} | {med['torch'] * 1e3:.1f} | {med['prototype'] * 1e3:.1f} "
              f"| {ratio:.2f} | {med['sdpa'] * 1e3:.1f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
