"""Shared pieces of every TaylorShift form: score scaling, Taylor weights, feature maps.

Layout everywhere: (B, H, N, d). Arithmetic runs in float32 for float16/bfloat16/float32
inputs and in float64 for float64 inputs (``compute_dtype``).
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch
from torch import Tensor

from .workspace import scratch

# Floor on ‖q‖ and ‖k‖ before dividing (as torch.nn.functional.normalize): a zero vector
# stays zero, so its scores are 0 and its weights the constant term 1.
NORM_EPS = 1e-12

# ``features`` gathers the pairs while its input has at most this many elements (tokens in
# all, B · H · C, times d), and slices row by row above: the gather pays d² per token, the
# slices a fixed cost per row of the triangle, and benchmarks/features_cpu/switch.txt has
# them equal near 10k elements at d = 16, 32 and 64 (≈ 600 / 330 / 170 tokens). Inside the
# efficient form a larger outer product than 2^18 values (1 MiB in float32) costs more than it
# saves (d = 64, 128 tokens: 0.87x, benchmarks/features_cpu/efficient_paired.txt).
GATHER_MAX_ELEMENTS = 8192
GATHER_MAX_OUTER = 1 << 18


def backward_follows(*inputs: object) -> bool:
    """Whether autograd records a call on these inputs (a backward may follow): grad mode
    is on and one of the tensors among them requires grad."""
    return torch.is_grad_enabled() and any(
        isinstance(t, Tensor) and t.requires_grad for t in inputs
    )


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype sums are accumulated in: float64 for float64 input, else float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def split_factor(
    temperature: Tensor | float, scale: float | None, normalize: bool, d: int
) -> tuple[Tensor | None, float]:
    """The query-side factor as the autograd functions take it: (a tensor τ, 0.0) or
    (None, the float factor)."""
    factor = score_factor(temperature, scale, normalize, d)
    if isinstance(factor, Tensor):
        return factor, 0.0
    return None, float(factor)


def score_factor(temperature: Tensor | float, scale: float | None, normalize: bool, d: int):
    """The factor on the query side: τ when normalising, else ``scale`` (default 1/sqrt(d))."""
    if normalize:
        return temperature
    return scale if scale is not None else 1.0 / math.sqrt(d)


def scaled_query(q: Tensor, factor: Tensor | float, normalize: bool) -> Tensor:
    """q' with s_ij = q'_i · k'_j: τ q/‖q‖ (normalize) or scale · q. Shape (..., N, d)."""
    if normalize:
        q = q / torch.linalg.vector_norm(q, dim=-1, keepdim=True).clamp_min(NORM_EPS)
    return q * factor


def scaled_key(k: Tensor, normalize: bool) -> Tensor:
    """k' with s_ij = q'_i · k'_j: k/‖k‖ (normalize) or k unchanged. Shape (..., N, d)."""
    if normalize:
        k = k / torch.linalg.vector_norm(k, dim=-1, keepdim=True).clamp_min(NORM_EPS)
    return k


def scaled_input_grad(
    x: Tensor, grad: Tensor, factor: Tensor | float, normalize: bool
) -> tuple[Tensor, Tensor | None]:
    """The backward of x' = factor · x/max(‖x‖, eps) (normalize) or factor · x.

    x, grad (…, N, d) in the compute dtype; factor a float or a tensor broadcasting to
    (…, 1, 1). Returns ∂L/∂x and, for a tensor factor, ∂L/∂factor summed over tokens and
    features, (…, 1, 1). Written by hand so that backward passes need no autograd (and
    torch.compile can trace them): for ‖x‖ > eps, ∂x = (g − x̂ (x̂·g)) / ‖x‖ with
    g = factor · grad and x̂ = x/‖x‖; below eps the norm is the constant eps, ∂x = g / eps.
    """
    if not normalize:
        return grad * factor, None
    norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    floor = norm.clamp_min(NORM_EPS)
    unit = x / floor
    g_factor = (grad * unit).sum((-2, -1), keepdim=True) if isinstance(factor, Tensor) else None
    g = grad * factor
    along = torch.where(norm > NORM_EPS, (unit * g).sum(-1, keepdim=True), 0.0)
    return (g - along * unit) / floor, g_factor


def taylor_weight(s: Tensor, order: int) -> Tensor:
    """w(s) = Σ_{n=0..order} sⁿ/n!, by Horner's rule (positive for even order)."""
    w = torch.ones_like(s)
    for n in range(order, 0, -1):
        w = 1.0 + s * w / n
    return w


def output_factor(count: Tensor, normalize: bool, d: int) -> Tensor | None:
    """The paper's output factor sqrt(n_i/d) from the attended-key count n_i, or None."""
    if not normalize:
        return None
    return torch.sqrt(count / d)


def attended_counts(
    mask: Tensor | None, is_causal: bool, b: int, h: int, nq: int, nk: int, device
) -> Tensor:
    """n_i, the keys query i attends, float32 (B or 1, H or 1, Nq, 1).

    ``mask``: None or a bool mask (B, H, Nq or 1, Nk) (True = attend), combined with causal
    (key j for query i only if j <= i) when ``is_causal``.
    """
    if nk == 0:
        return torch.zeros((1, 1, nq, 1), dtype=torch.float32, device=device)
    if mask is None:
        if not is_causal:
            full = torch.full((1, 1, 1, 1), float(nk), dtype=torch.float32, device=device)
            return full.expand(1, 1, nq, 1)
        rows = torch.arange(1, nq + 1, device=device).clamp(max=nk)
        return rows.to(torch.float32).view(1, 1, nq, 1)
    if not is_causal:
        return mask.sum(-1, keepdim=True, dtype=torch.float32).expand(b, h, nq, 1)
    if mask.shape[2] == 1:  # key padding: a running count over the keys
        running = mask[:, :, 0, :].cumsum(-1, dtype=torch.float32)  # (B, H, Nk)
        index = torch.arange(nq, device=device).clamp(max=nk - 1)
        return running[..., index].unsqueeze(-1)
    causal = torch.ones(nq, nk, dtype=torch.bool, device=device).tril()
    return (mask & causal).sum(-1, keepdim=True, dtype=torch.float32)


@lru_cache(maxsize=64)
def _pair_index_cpu(d: int) -> tuple[Tensor, Tensor]:
    a, b = torch.triu_indices(d, d)
    return a, b


@lru_cache(maxsize=64)
def _feature_index(d: int, device: torch.device) -> Tensor:
    """Positions of φ(x)'s entries in the flattened (d + 1, d + 1) outer product of [x, 1]:
    the pairs a <= b, then (a, d) for the linear terms, then (d, d) for the constant."""
    with torch.inference_mode(False):  # usable in and out of inference mode
        a, b = _pair_index_cpu(d)
        linear = torch.arange(d) * (d + 1) + d
        index = torch.cat([a * (d + 1) + b, linear, torch.tensor([(d + 1) ** 2 - 1])])
        return index.to(device)


def pair_index(d: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Index pairs (a, b) with a <= b, in the order of ``features``: row a holds b = a..d-1."""
    if torch.compiler.is_compiling():  # traced: built in the graph, not read from a cache
        a, b = torch.triu_indices(d, d, device=device)
        return a, b
    a, b = _pair_index_cpu(d)
    return a.to(device), b.to(device)


def feature_dim(d: int) -> int:
    """Length of the feature vector φ(x) = [x_a x_b (a <= b), x, 1]."""
    return d * (d + 1) // 2 + d + 1


@torch.no_grad()
def features(x: Tensor) -> Tensor:
    """φ(x) = [x_a x_b for a <= b, x, 1]: (..., N, d) -> (..., N, d(d+1)/2 + d + 1).

    With the state weights of ``state_weights``, φ(q)ᵀ diag(c) φ(k) = 1 + q·k + (q·k)²/2:
    the symmetric form of the row-wise tensor product (SPEC §2.2). Not differentiable:
    backward passes go through ``quadratic_grad`` instead, which needs no features.
    """
    d = x.shape[-1]
    if torch.compiler.is_compiling():
        # Traced by torch.compile: out-of-place products that the compiler fuses into one
        # kernel (the eager paths below write into slices, which it cannot trace).
        a, b = pair_index(d, x.device)
        quad = x.index_select(-1, a) * x.index_select(-1, b)
        return torch.cat([quad, x, torch.ones_like(x[..., :1])], dim=-1)
    if x.device.type != "cpu" or (
        x.numel() <= GATHER_MAX_ELEMENTS and x.numel() * d <= GATHER_MAX_OUTER
    ):
        # Few tokens (a decoding step, a short chunk): the outer product, then its upper
        # triangle picked by one index, beats d small multiplies (and two gathers, 2x,
        # benchmarks/decode_cpu). Off the CPU always: d multiplies are d launches (a GPU
        # has the memory for the outer product, about twice the features).
        # The products are the same, so every path agrees bitwise.
        # With x extended by a 1, the outer product holds x_a x_b, x_a and 1 alike, so one
        # index picks the whole of φ(x) (no concatenation after it: 2x on a decoding step).
        ext = torch.nn.functional.pad(x, (0, 1), value=1.0)
        outer = (ext.unsqueeze(-1) * ext.unsqueeze(-2)).flatten(-2)  # (..., N, (d + 1)²)
        return outer[..., _feature_index(d, x.device)]
    out = torch.empty((*x.shape[:-1], feature_dim(d)), dtype=x.dtype, device=x.device)
    # Row a of the upper triangle, x_a · x[a:], as one contiguous slice of the output:
    # for long chunks d strided multiplies beat a gather of the pairs several times over on
    # the CPU (benchmarks/features_cpu).
    start = 0
    for a in range(d):
        torch.mul(x[..., a : a + 1], x[..., a:], out=out[..., start : start + d - a])
        start += d - a
    out[..., start : start + d] = x
    out[..., -1] = 1.0
    return out


def _batch_shape(a: torch.Size, b: torch.Size) -> torch.Size:
    """The broadcast of two leading shapes; equal ones (the usual case) without
    ``torch.broadcast_shapes``, which costs ~50 µs a call (5 % of a short efficient call)."""
    return a if a == b else torch.broadcast_shapes(a, b)


def chunk_features(x: Tensor) -> Tensor:
    """``features(x)`` for the chunk loops of the efficient forms: the same values,
    (…, C, D), but on the CPU laid out feature-major (the transpose of a contiguous
    (…, D, C) tensor) for chunks above the gather size, and written into this thread's
    scratch buffer from 2^20 elements (``workspace.scratch``: valid until the next call).
    Off the CPU: ``features(x)`` itself, one gather, token-major.

    Feature-major, each row a of the upper triangle is d − a contiguous rows of C products,
    and φ(k)ᵀ V' is a plain product: the feature map was 1.7–3x and the chunk's two products
    together 1.04–1.2x faster so at d = 16 … 64 (docs/efficient-form.md §2).
    """
    d = x.shape[-1]
    big_d = feature_dim(d)
    if (
        torch.compiler.is_compiling()
        or x.device.type != "cpu"
        or (x.numel() <= GATHER_MAX_ELEMENTS and x.numel() * d <= GATHER_MAX_OUTER)
    ):
        return features(x)  # token-major; off the CPU by one gather
    shape = (*x.shape[:-2], big_d, x.shape[-2])
    out = scratch("features", shape, x.dtype, x.device)
    if out is None:
        out = torch.empty(shape, dtype=x.dtype, device=x.device)
    with torch.no_grad():
        xt = x.transpose(-2, -1).contiguous()  # (…, d, C)
        start = 0
        for a in range(d):
            torch.mul(xt[..., a : a + 1, :], xt[..., a:, :], out=out[..., start : start + d - a, :])
            start += d - a
        out[..., start : start + d, :] = xt
        out[..., -1, :] = 1.0
    return out.transpose(-2, -1)


def feature_product(f: Tensor, m: Tensor) -> Tensor:
    """f @ m, (…, C, D) @ (…, D, c), into a scratch buffer (valid until the next call)."""
    shape = (*_batch_shape(f.shape[:-2], m.shape[:-2]), f.shape[-2], m.shape[-1])
    buffer = scratch("product", shape, f.dtype, f.device)
    return f @ m if buffer is None else torch.matmul(f, m, out=buffer)


def add_feature_product(acc: Tensor | None, f: Tensor, m: Tensor) -> Tensor:
    """acc + fᵀ m for f (…, C, D) and m (…, C, c), in place into acc (which the caller
    owns) when eager; a new tensor when acc is None. (An in-place ``baddbmm_`` measured
    5-10 % slower than the product and an add at N <= 512, benchmarks/op_cpu/workspace.)"""
    step = f.transpose(-2, -1) @ m
    if acc is None:
        return step
    return acc + step if torch.compiler.is_compiling() else acc.add_(step)


def symmetric_state(packed: Tensor, d: int) -> Tensor:
    """Unpack the quadratic rows of a state: (..., P, c) -> (..., d, d, c), P = d(d+1)/2.

    T[a, b] = T[b, a] = packed[(a, b)] off the diagonal and T[a, a] = 2 packed[(a, a)], so
    that ∂/∂x Σ_{a<=b} x_a x_b u_ab = T x for u = packed @ g.
    """
    a, b = pair_index(d, packed.device)
    t = packed.new_zeros((*packed.shape[:-2], d, d, packed.shape[-1]))
    t[..., a, b, :] = packed
    return t + t.transpose(-3, -2)


def quadratic_grad(x: Tensor, g: Tensor, sym: Tensor) -> Tensor:
    """∂/∂x of Σ_c g_c Σ_{a<=b} x_a x_b S[(a, b), c] for every token, without features.

    x (..., C, d), g (..., C, c), sym = symmetric_state(S) (..., d, d, c) -> (..., C, d):
    gx_a = Σ_{b, c} T[a, b, c] x_b g_c, one matmul over the (b, c) pairs.
    """
    shape = (*_batch_shape(x.shape[:-1], g.shape[:-1]), x.shape[-1], g.shape[-1])
    buffer = scratch("grad-outer", shape, x.dtype, x.device)
    if buffer is None:
        z = (x.unsqueeze(-1) * g.unsqueeze(-2)).flatten(-2)  # (..., C, d·c)
    else:  # the same products, written into a scratch buffer
        z = torch.mul(x.unsqueeze(-1), g.unsqueeze(-2), out=buffer).flatten(-2)
    return z @ sym.flatten(-2).transpose(-2, -1)


def state_weights(d: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """c with Σ_{a<=b} c_ab q_a q_b k_a k_b = (q·k)²/2 and 1 on the linear and constant rows.

    (q·k)² counts each off-diagonal pair twice, so c = 1/2 on the diagonal and 1 off it.
    Shape (D, 1), to scale the rows of a (D, dv + 1) state. Built once per (d, dtype,
    device) and kept (a decoding step would otherwise spend a fifth of its time here);
    traced by torch.compile, it is built in the graph. Read-only: never modify it in place.
    """
    if torch.compiler.is_compiling():
        return _state_weights(d, dtype, device)
    return _cached_state_weights(d, dtype, torch.device(device))


@lru_cache(maxsize=64)
def _cached_state_weights(d: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    with torch.inference_mode(False):  # usable in and out of inference mode
        return _state_weights(d, dtype, device)


def _state_weights(d: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    a, b = pair_index(d, device)
    quad = torch.where(a == b, 0.5, 1.0).to(dtype)
    rest = torch.ones(d + 1, dtype=dtype, device=device)
    return torch.cat([quad, rest]).unsqueeze(-1)


def values_with_ones(v: Tensor, key_mask: Tensor | None) -> Tensor:
    """V' = [v, 1], rows of masked keys zeroed: (..., N, dv) -> (..., N, dv + 1).

    The ones column yields the denominator; zeroing the whole row removes a masked key from
    every key-side sum, its constant term included.
    """
    vp = torch.cat([v, v.new_ones((*v.shape[:-1], 1))], dim=-1)
    if key_mask is not None:
        vp = vp * key_mask.unsqueeze(-1).to(vp.dtype)
    return vp


def drop_masked_content(key: Tensor, value: Tensor, keep: Tensor | None) -> tuple[Tensor, Tensor]:
    """Keys and values with every masked position replaced by zeros; ``keep`` (B, H, Nk) bool
    (broadcastable), True = some query attends the key, or None (nothing masked).

    A masked key's weight is zero, but 0 · NaN is NaN: a NaN or Inf in a padded key or value
    would still reach the sums of the efficient forms (and the matmul of the direct one).
    Replacing, not multiplying, makes the content of a masked position irrelevant to every
    form, its gradient included (zero).
    """
    if keep is None:
        return key, value
    keep = keep.unsqueeze(-1)
    return torch.where(keep, key, 0.0), torch.where(keep, value, 0.0)
