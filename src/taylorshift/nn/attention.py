"""Multi-head attention layers: a projection variant around a named attention kernel.

Projection variants (Hosseini et al., SPEC §4, who call ``query-only`` "Efficient
Attention"; the name was ``efficient`` here until it was renamed, so that "efficient" names
only TaylorShift's linear-time *form*; the old name still works, with a FutureWarning):

=============  =============================================  ============================
projection     what it learns                                 parameters (with biases)
=============  =============================================  ============================
``standard``   W_Q, W_K, W_V, W_O                             4 (d² + d)
``optimized``  W_Q, W_K, W_O; head i's values are its slice   3 (d² + d)
               of the input (no W_V)
``query-only`` W_Q, W_O; keys and values are slices          2 (d² + d)
``super``      ``query-only`` plus an alignment W_A (ℓ × ℓ,   2 (d² + d) + ℓ² + ℓ
               with bias) mixing values over tokens, shared
               by the heads, lower triangular when causal
=============  =============================================  ============================

``super`` fixes the context length ℓ (``context_len``): a longer sequence is refused; a
shorter one of length N uses the top-left N × N block of W_A and the first N biases (the
same as padding the values with zeros to ℓ and reading the first N rows). Padded keys'
values are zeroed before W_A mixes them.

``short_conv = k`` (any projection but ``super``) adds a depthwise convolution of k taps
over the sequence to the queries, keys and values, after their projections and before the
heads are split (channel by channel, with a bias; PyTorch's default Conv1d initialisation).
It gives every token its k − 1 predecessors (causal: left-aligned) or its neighbours
(non-causal: centred) before attention, the local precision that a Taylor kernel's flat
weights lack (docs/accuracy.md; Based and Mamba use such short convolutions for the same
reason). Tokens masked as key padding are zeroed before the convolution (replaced, so that
not even an inf or NaN in a padded token reaches the others), so padding never
leaks into real tokens and a padded batch equals its sequences run alone; with a mask of
any form, a token no query of any head attends counts as padding. Decoding keeps
the last k − 1 real projected tokens of each row in the cache (``conv``).

Padding anywhere. The short convolution, ``super``'s W_A and a kernel's local heads
(``local_heads``: a sliding window) read where the real tokens sit, not only which they
are. With key padding in self-attention (a (B, N) mask, or a mask of any form that is the
same for every head and query: (B, 1, 1, N), (1, 1, N), (B, H, 1, N) with equal heads, ...;
under torch.compile and on meta tensors, where its values cannot be read, only forms with
one head and one query row count), such a layer runs
on each row's real tokens moved to the front in their order and puts the rows back
(``ops.masks.real_tokens_first``): padding before or between real tokens then counts as
absent, as it does after them and in every other layer, and ``decode`` takes blocks padded
anywhere (e.g. left-padded prompts). On the CPU a right-padded mask skips the permutation
(one check of the mask); on an accelerator and under torch.compile the permutation always
runs (no device sync). Non-causal cross-attention with a short convolution or ``super``
does the same with its context (its real tokens first; the result, a sum over keys, needs
no putting back). Left as they stand: the context of causal cross-attention (query i
attends context tokens j <= i by slot), and local heads' windows in cross-attention, which
align query i with context slot i + M − N, padding included (``ops.window``).

``num_kv_heads = Hkv`` (projection ``standard``) gives keys and values Hkv < H heads,
grouped-query attention (Ainslie et al.): W_K and W_V project to Hkv · head_dim features,
and query head h reads key/value head ``h // (H / Hkv)``. It shrinks those projections and
every decoding cache by H / Hkv: TaylorShift's constant-size state, (d(d+1)/2 + d + 1) ×
(dv + 1) numbers per head, is kept per key/value head (``taylorshift.nn.kernels``).
"""

from __future__ import annotations

import inspect
import math
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._inference import inference_only
from .._validate import check_bool, check_choice, check_int, check_probability, values_readable
from ..ops.masks import as_4d, key_padding_of, padding_inside, permute_tokens, real_tokens_first
from ..ops.taylor_shift.checks import broadcasts_to
from .cache import check_decode_step
from .kernels import create_kernel

PROJECTIONS = ("standard", "optimized", "query-only", "super")
#: Old projection names -> their names now (accepted with a FutureWarning).
PROJECTION_RENAMES = {"efficient": "query-only"}


def canonical_projection(projection: object) -> object:
    """``projection`` under its current name: an old name (``PROJECTION_RENAMES``) is mapped
    with a FutureWarning naming the new spelling; anything else comes back unchanged (the
    caller checks it)."""
    if isinstance(projection, str) and projection in PROJECTION_RENAMES:
        new = PROJECTION_RENAMES[projection]
        warnings.warn(
            f'projection={projection!r} is now called {new!r} ("efficient" names only the '
            f"linear-time form of TaylorShift); pass projection={new!r}",
            FutureWarning,
            stacklevel=3,
        )
        return new
    return projection


def _check_dims(dim: int, num_heads: int) -> int:
    check_int("dim", dim, ge=1)
    check_int("num_heads", num_heads, ge=1)
    if dim % num_heads:
        raise ValueError(
            f"dim must be divisible by num_heads; got dim={dim}, num_heads={num_heads}"
        )
    return dim // num_heads


def padding_to_mask(
    attn_mask: Tensor | None, batch: int, n_key: int, heads: int, n_query: int
) -> Tensor | None:
    """A module-level mask as the kernels take it (broadcastable to (B, H, Nq, Nk)).

    2-D (B, Nk) is key padding (True = attend); 3-D and 4-D masks are already in the
    kernel's (B, H, Nq, Nk) broadcast form and pass unchanged, once checked to broadcast
    (every kernel then reads them alike, SDPA included).
    """
    if attn_mask is None:
        return None
    if not isinstance(attn_mask, Tensor) or attn_mask.dtype != torch.bool:
        what = attn_mask.dtype if isinstance(attn_mask, Tensor) else type(attn_mask).__name__
        raise TypeError(f"attn_mask must be a bool tensor (True = attend); got {what}")
    if attn_mask.dim() == 2:
        if tuple(attn_mask.shape) != (batch, n_key):
            raise ValueError(
                f"a 2-D attn_mask is key padding of shape (B, Nk) = ({batch}, {n_key}); "
                f"got {tuple(attn_mask.shape)}"
            )
        return attn_mask[:, None, None, :]
    target = (batch, heads, n_query, n_key)
    if not broadcasts_to(attn_mask.shape, target):
        raise ValueError(
            f"attn_mask must be (B, Nk) key padding or broadcast to (B, H, Nq, Nk) = "
            f"{target}; got shape {tuple(attn_mask.shape)}"
        )
    return attn_mask


def _inner_padding(mask: Tensor | None) -> Tensor | None:
    """The (B | 1, N) key padding of a mask as ``padding_to_mask`` gives it, where the mask is
    the same for every head and query (whatever its shape) and has a padded token before a
    real one (``ops.masks.padding_inside``); else None. Where the values cannot be read
    (``key_padding_of``), a mask with several head or query rows counts as varying."""
    if mask is None:
        return None
    rows = key_padding_of(mask)  # (B | 1, H | 1, 1, N), or None: varies over queries
    if rows is not None and rows.shape[1] > 1:
        same = values_readable() and rows.device.type != "meta"
        rows = rows[:, :1] if same and bool((rows == rows[:, :1]).all()) else None
    if rows is None or not padding_inside(rows[:, 0, 0]):
        return None
    return rows[:, 0, 0]


def check_kv_heads(
    num_kv_heads: int | None, num_heads: int, projection: object, local_heads: object = 0
) -> int:
    """Key/value heads: ``num_heads`` for None; else a divisor of it, with projection
    standard and no local heads (``kernel_args`` local_heads) if fewer."""
    if num_kv_heads is None:
        return num_heads
    check_int("num_kv_heads", num_kv_heads, ge=1)
    if num_heads % num_kv_heads:
        raise ValueError(
            f"num_kv_heads must divide num_heads ({num_heads}); got num_kv_heads={num_kv_heads}"
        )
    if num_kv_heads != num_heads and projection != "standard":
        raise ValueError(
            f"num_kv_heads < num_heads needs projection='standard' (the others slice keys "
            f"or values out of the input, dim features); got projection={projection!r}"
        )
    if num_kv_heads != num_heads and local_heads:
        raise ValueError(
            f"num_kv_heads < num_heads does not combine with local_heads (the local heads "
            f"would share key/value heads with TaylorShift heads); got num_kv_heads="
            f"{num_kv_heads}, local_heads={local_heads}"
        )
    return num_kv_heads


class Attention(nn.Module):
    """Multi-head self- or cross-attention on (B, N, dim) with a named kernel.

    The constructor takes timm's ``Attention`` arguments, so the class works as timm's
    ``attn_layer``; the keyword-only arguments after them are ours.

    Args:
        dim: model width; heads get ``dim // num_heads`` features each.
        num_heads: number of heads.
        qkv_bias: biases on the query/key/value projections.
        qk_norm: LayerNorm (``norm_layer``) on each head's queries and keys.
        scale_norm: ``norm_layer`` on the attention output before the output projection.
        proj_bias: bias on the output projection.
        attn_drop: attention dropout; its meaning depends on the kernel (see ``kernels``).
        proj_drop: dropout after the output projection.
        norm_layer: the norm for ``qk_norm`` / ``scale_norm`` (default ``nn.LayerNorm``).
        device, dtype: where and in which dtype parameters are created.
        attn_kernel: a name from ``taylorshift.nn.list_kernels()``.
        kernel_args: options of that kernel (e.g. ``{"mode": "efficient"}``).
        projection: ``standard``, ``optimized``, ``query-only`` or ``super`` (module
            docstring; the old name ``efficient`` is accepted with a FutureWarning).
        context_len: ℓ, the fixed context length of ``super``.
        context_dim: width of ``context`` for cross-attention (default ``dim``).
        short_conv: taps of the depthwise convolution on q, k and v over the sequence (see
            the module docs); 0 (default) has none.
        num_kv_heads: heads of the keys and values, a divisor of ``num_heads`` (grouped-query
            attention, projection ``standard``; see the module docs); None (default): as
            many as the queries.
    """

    # timm calls attn_layer positionally: these names, their order and defaults stay timm's.
    # Subclasses that fix some arguments reuse this signature (takes_attention_arguments).
    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        qkv_bias: bool = False,
        qk_norm: bool = False,
        scale_norm: bool = False,
        proj_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        norm_layer: type[nn.Module] | None = None,
        device=None,
        dtype=None,
        *,
        attn_kernel: str = "taylorshift",
        kernel_args: dict | None = None,
        projection: str = "standard",
        context_len: int | None = None,
        context_dim: int | None = None,
        short_conv: int = 0,
        num_kv_heads: int | None = None,
    ):
        super().__init__()
        self.head_dim = _check_dims(dim, num_heads)
        for name, flag in (
            ("qkv_bias", qkv_bias), ("qk_norm", qk_norm), ("scale_norm", scale_norm),
            ("proj_bias", proj_bias),
        ):  # fmt: skip
            check_bool(name, flag)
        check_probability("proj_drop", proj_drop)
        check_int("context_dim", context_dim, ge=1, allow_none=True)
        check_int("short_conv", short_conv, ge=0)
        projection = canonical_projection(projection)
        if short_conv and projection == "super":
            raise ValueError(
                "short_conv applies to projections 'standard', 'optimized' and 'query-only'; "
                "got projection='super' (its W_A mixes the values over tokens already)"
            )
        check_choice("projection", projection, PROJECTIONS)
        context_dim = dim if context_dim is None else context_dim
        local_heads = (kernel_args or {}).get("local_heads", 0)
        num_kv_heads = check_kv_heads(num_kv_heads, num_heads, projection, local_heads)
        if projection != "standard" and context_dim != dim:
            raise ValueError(
                f"projection={projection!r} slices keys or values out of the context, so "
                f"context_dim must equal dim ({dim}); got context_dim={context_dim}"
            )
        if projection == "super":
            if isinstance(context_len, bool) or not isinstance(context_len, int) or context_len < 1:
                raise ValueError(
                    f"projection='super' needs context_len, a positive int; got {context_len!r}"
                )
        elif context_len is not None:
            raise ValueError(
                f"context_len applies to projection='super' only; got context_len={context_len} "
                f"with projection={projection!r}"
            )
        fk = {k: v for k, v in {"device": device, "dtype": dtype}.items() if v is not None}
        norm_layer = norm_layer or nn.LayerNorm
        self.dim, self.num_heads, self.projection = dim, num_heads, projection
        self.num_kv_heads = num_kv_heads
        self.kv_dim = num_kv_heads * self.head_dim  # width of the projected keys and values
        self.context_len, self.context_dim = context_len, context_dim

        self.q_proj = nn.Linear(dim, dim, bias=qkv_bias, **fk)
        self.k_proj = (
            nn.Linear(context_dim, self.kv_dim, bias=qkv_bias, **fk)
            if projection in ("standard", "optimized")
            else None
        )
        self.v_proj = (
            nn.Linear(context_dim, self.kv_dim, bias=qkv_bias, **fk)
            if projection == "standard"
            else None
        )
        if projection == "super":
            self.align_weight = nn.Parameter(torch.empty(context_len, context_len, **fk))
            self.align_bias = nn.Parameter(torch.empty(context_len, **fk))
            self._reset_alignment()
        self.q_norm = norm_layer(self.head_dim, **fk) if qk_norm else nn.Identity()
        self.k_norm = norm_layer(self.head_dim, **fk) if qk_norm else nn.Identity()
        self.kernel = create_kernel(
            attn_kernel, num_heads, self.head_dim, attn_drop=attn_drop, **(kernel_args or {})
        )
        self.kernel.to(**fk)
        self.norm = norm_layer(dim, **fk) if scale_norm else nn.Identity()
        self.proj = nn.Linear(dim, dim, bias=proj_bias, **fk)
        self.proj_drop = nn.Dropout(proj_drop)
        self.short_conv = short_conv
        # One depthwise filter per channel of q, k and v (in that order: dim, kv_dim and
        # kv_dim channels).
        width = dim + 2 * self.kv_dim
        self.conv = nn.Conv1d(width, width, short_conv, groups=width, **fk) if short_conv else None
        # Under sequence parallelism (taylorshift.distributed.convert_sequence_parallel):
        # (x, real, before, after) -> x (B, N, C) with the real rows of the neighbouring
        # ranks around it, (B, before + N + after, C), for the convolution's taps (real rows
        # first in x, padding zeroed; distributed.halo.with_neighbours); None in one process.
        self.neighbours: Callable | None = None

    def _reset_alignment(self) -> None:
        # Start at the identity (plus a small perturbation): values pass through unmixed.
        with torch.no_grad():
            ell = self.context_len
            self.align_weight.copy_(torch.eye(ell) + torch.randn(ell, ell) / (10 * math.sqrt(ell)))
            self.align_bias.zero_()

    def _heads(self, x: Tensor, heads: int | None = None, norm: nn.Module | None = None):
        """(B, N, heads · d) -> (B, heads, N, d), ``norm`` (q/k norm) applied per head first.

        The norm runs on the projection's own (B, N, heads, d) layout, before the heads are
        transposed out: on the transposed view, a compiled backward of LayerNorm (whose
        real and traced output strides then differ, torch 2.13) failed in the softmax-naive
        kernel with qk_norm ("view size is not compatible")."""
        b, n, _ = x.shape
        x = x.view(b, n, heads or self.num_heads, self.head_dim)
        return (x if norm is None else norm(x)).transpose(1, 2)

    def _qkv_heads(self, q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Queries (B, N, dim), keys and values (B, M, kv_dim) -> (B, H | Hkv, ·, d), the
        q/k norms applied."""
        kv = self.num_kv_heads
        return self._heads(q, norm=self.q_norm), self._heads(k, kv, self.k_norm), self._heads(v, kv)

    def _align(self, v: Tensor, key_mask: Tensor | None, is_causal: bool) -> Tensor:
        """Super's W_A from the left on values (B, H, N, d), shared by the heads."""
        n = v.shape[-2]
        if n > self.context_len:
            raise ValueError(
                f"projection='super' has a fixed context length of {self.context_len} tokens; "
                f"got a sequence of {n} tokens"
            )
        w = self.align_weight[:n, :n]
        if is_causal:
            w = w.tril()
        if key_mask is not None:  # (replaced: an inf or NaN in padding reaches no row)
            v = v.masked_fill(~key_mask.transpose(-2, -1), 0)  # (B, 1|H, Nk, 1)
        return w.to(v.dtype) @ v + self.align_bias[:n, None].to(v.dtype)

    def forward(
        self,
        x: Tensor,
        attn_mask: Tensor | None = None,
        is_causal: bool = False,
        context: Tensor | None = None,
    ) -> Tensor:
        """x (B, N, dim); context (B, M, context_dim) for cross-attention -> (B, N, dim).

        attn_mask: bool, True = attend: (B, Nk) key padding, or broadcastable to
        (B, H, N, Nk). ``is_causal`` combines with it.
        """
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"x must be (B, N, dim={self.dim}); got shape {tuple(x.shape)}")
        source = x if context is None else context
        if context is not None and (context.dim() != 3 or context.shape[0] != x.shape[0]):
            raise ValueError(
                f"context must be (B={x.shape[0]}, M, context_dim); got {tuple(context.shape)}"
            )
        if context is not None and context.shape[-1] != self.context_dim:
            raise ValueError(
                f"context must be (B, M, context_dim={self.context_dim}); "
                f"got {tuple(context.shape)}"
            )
        mask = padding_to_mask(attn_mask, x.shape[0], source.shape[1], self.num_heads, x.shape[1])
        inverse = None
        if context is None:
            reorders = self._counts_positions
        else:
            reorders = not is_causal and (self.conv is not None or self.projection == "super")
        padding = _inner_padding(mask) if reorders else None
        if padding is not None:
            # padding before or between real tokens: the real tokens first (module docs);
            # with a context, its real tokens first for the taps and W_A (the result, a sum
            # over the keys, needs no putting back; local heads align by slot in
            # cross-attention, see the module docs)
            order, inverse = real_tokens_first(padding)
            source = permute_tokens(source, order)
            if context is None:
                x = source
            else:
                inverse = None
            mask = padding.gather(-1, order)[:, None, None, :]  # (the same mask, as padding)
        q, k, v = self.heads_in(x, source, mask, is_causal, self_attention=context is None)
        y = self.kernel(q, k, v, mask, is_causal)  # (B, H, N, d)
        y = y.transpose(1, 2).reshape(x.shape[0], x.shape[1], self.dim)
        y = self.proj_drop(self.proj(self.norm(y)))
        return y if inverse is None else permute_tokens(y, inverse)

    @property
    def _counts_positions(self) -> bool:
        """Whether a token's result depends on where the other real tokens sit, not only on
        which they are: the short convolution's taps, W_A's rows, the local heads' windows."""
        local_heads = getattr(self.kernel, "local_heads", 0)
        return self.conv is not None or self.projection == "super" or bool(local_heads)

    def heads_in(
        self,
        x: Tensor,
        source: Tensor,
        mask: Tensor | None,
        is_causal: bool,
        self_attention: bool = True,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """The kernel's inputs: q (B, H, N, d), k and v (B, Hkv, M, d) from x (B, N, dim) and
        source (B, M, context_dim) — projections, short convolution, W_A, q/k norms. ``mask``
        as ``padding_to_mask`` gives it. (Also what tools that inspect attention read.)"""
        q = self.q_proj(x)
        k = source if self.k_proj is None else self.k_proj(source)
        v = source if self.v_proj is None else self.v_proj(source)
        if self.conv is not None:
            q, k, v = self._local_mix(q, k, v, mask, is_causal, self_attention)
        q, k, v = self._qkv_heads(q, k, v)
        if self.projection == "super":
            # A key is padding when no query attends to it: zero its value before W_A
            # mixes it into the others (whatever form the mask came in).
            key_mask = None if mask is None else mask.any(dim=-2, keepdim=True)  # (B,1|H,1,Nk)
            v = self._align(v, key_mask, is_causal)
        return q, k, v

    def _local_mix(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool,
        self_attention: bool,
    ) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
        """The short convolution over the sequence of q (B, N, dim) and k, v (B, M, kv_dim)."""
        # (B or 1, M, 1): which tokens are real, i.e. attended by some query of some head
        # (as projection "super" reads a mask of any form): the taps read no padding
        real = None
        if mask is not None:
            keys = as_4d(mask).any(1).any(1)
            real = keys[..., None]  # (B | 1, M, 1) bool
        weight, bias = self.conv.weight, self.conv.bias
        taps = self.short_conv
        left = taps - 1 if causal else (taps - 1) // 2
        if self.neighbours is not None and taps > 1:
            if not self_attention:
                raise ValueError(
                    "a sequence-parallel layer's short convolution needs self-attention; got "
                    "a context (cross-attention)"
                )
            return self._local_mix_across_ranks(q, k, v, real, left)

        def mix(t: Tensor, start: int, real: Tensor | None) -> Tensor:
            if real is not None:  # (replaced, not multiplied: 0 · inf and 0 · NaN are NaN)
                t = t.masked_fill(~real, 0)
            n, width = t.shape[-2:]
            # An empty sequence (a rank's slice under sequence parallelism) gets one zero
            # token more, cut off again: conv1d refuses inputs shorter than its kernel, and
            # the weights stay in the graph (zero gradients, as DDP expects of every rank).
            t = F.pad(t.transpose(1, 2), (left, taps - 1 - left + (1 if n == 0 else 0)))
            sl = slice(start, start + width)
            out = F.conv1d(t, weight[sl], bias[sl], groups=width)[..., :n]
            # Back to (B, N, width) in memory: with the feature axis strided, SDPA leaves its
            # fused CPU kernel for the math path (1.2-3.8x slower at N = 64-1,024:
            # benchmarks/short_conv_cpu).
            return out.transpose(1, 2).contiguous()

        q = mix(q, 0, real if self_attention else None)
        return q, mix(k, self.dim, real), mix(v, self.dim + self.kv_dim, real)

    def _local_mix_across_ranks(
        self, q: Tensor, k: Tensor, v: Tensor, real: Tensor | None, left: int
    ) -> tuple[Tensor, Tensor, Tensor]:
        """``_local_mix`` of self-attention on a slice of a sequence split over ranks: the
        taps that reach past the slice read the neighbouring ranks' real rows
        (``self.neighbours``) where one process pads with zeros (real tokens come first in
        each row here: ``forward`` moved them)."""
        qkv = torch.cat([q, k, v], dim=-1)  # (B, N, width)
        n, c = qkv.shape[1:]
        rows = None if real is None else real[..., 0]
        ext = self.neighbours(qkv, rows, left, self.short_conv - 1 - left)
        if n == 0:  # (an empty slice: one zero row more, cut off again, as in _local_mix)
            ext = F.pad(ext, (0, 0, 0, 1))
        out = F.conv1d(ext.transpose(1, 2), self.conv.weight, self.conv.bias, groups=c)
        out = out[..., :n].transpose(1, 2)
        return tuple(t.contiguous() for t in out.split([self.dim, self.kv_dim, self.kv_dim], -1))

    def _local_mix_step(self, q: Tensor, k: Tensor, v: Tensor, cache, mask: Tensor | None):
        """The causal short convolution of T new tokens after the cached ones (decoding)."""
        qkv = torch.cat([q, k, v], dim=-1)  # (B, T, 3 dim)
        if mask is not None:
            qkv = qkv.masked_fill(~mask[..., None], 0)
        b, t, c = qkv.shape
        past = cache.conv
        if past is None:
            past = qkv.new_zeros((b, self.short_conv - 1, c))
        seq = torch.cat([past, qkv], dim=1)  # (B, k - 1 + T, 3 dim)
        out = F.conv1d(seq.transpose(1, 2), self.conv.weight, self.conv.bias, groups=c)
        # The last k - 1 real tokens of each row (real tokens come first: decode put them there).
        real = t if mask is None else mask.sum(1)
        keep = torch.arange(self.short_conv - 1, device=qkv.device)
        index = (torch.as_tensor(real, device=qkv.device).view(-1, 1) + keep).expand(b, -1)
        cache.conv = seq.gather(1, index[..., None].expand(-1, -1, c))
        return out.transpose(1, 2).split([self.dim, self.kv_dim, self.kv_dim], dim=-1)

    def new_cache(self, kind: str = "auto"):
        """An empty decoding cache for ``decode`` (see ``AttentionKernel.new_cache``)."""
        if self.projection == "super" or self.context_dim != self.dim:
            raise ValueError(
                "decode needs causal self-attention with projection 'standard', 'optimized' or "
                f"'query-only'; this layer has projection={self.projection!r} and context_dim="
                f"{self.context_dim} (dim={self.dim})"
            )
        return self.kernel.new_cache(kind)

    @inference_only
    def decode(self, x: Tensor, cache, key_padding_mask: Tensor | None = None) -> Tensor:
        """Causal self-attention of T new tokens x (B, T, dim) after those in ``cache``.

        ``cache`` comes from ``new_cache`` and is updated in place; ``key_padding_mask``
        (B, T), True = real token, padding anywhere in the block. Row t (a real token)
        equals row ``N + t`` of ``forward(..., is_causal=True)`` over all real tokens so
        far. Inference only.
        """
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"x must be (B, T, dim={self.dim}); got shape {tuple(x.shape)}")
        check_decode_step(cache, x.shape[0], x.shape[1], key_padding_mask)  # (before changes)
        inverse = None
        if (
            self._counts_positions
            and key_padding_mask is not None
            and padding_inside(key_padding_mask)
        ):
            # padding before or between real tokens: the real tokens first (module docs)
            order, inverse = real_tokens_first(key_padding_mask)
            x, key_padding_mask = permute_tokens(x, order), key_padding_mask.gather(-1, order)
        q = self.q_proj(x)
        k = x if self.k_proj is None else self.k_proj(x)
        v = x if self.v_proj is None else self.v_proj(x)
        if self.conv is not None:
            q, k, v = self._local_mix_step(q, k, v, cache, key_padding_mask)
        q, k, v = self._qkv_heads(q, k, v)
        y = self.kernel.decode_unchecked(q, k, v, key_padding_mask, cache)  # (checked above)
        y = y.transpose(1, 2).reshape(x.shape[0], x.shape[1], self.dim)
        y = self.proj(self.norm(y))
        return y if inverse is None else permute_tokens(y, inverse)


_Init = TypeVar("_Init", bound=Callable[..., None])


def takes_attention_arguments(*bound: str) -> Callable[[_Init], _Init]:
    """Decorates a subclass's ``__init__(self, *args, <own keyword-only>, **kwargs)`` that
    passes ``args`` and ``kwargs`` on to ``Attention.__init__`` and sets the ``bound``
    arguments itself: its signature (as ``inspect`` and help() show it) becomes Attention's
    less ``bound``, with its own keyword-only arguments before Attention's.

    Attention's arguments are written once, in ``Attention.__init__``; a caller passing a
    bound one gets Python's TypeError (a second value for it) from ``Attention.__init__``.
    """

    def decorate(init: _Init) -> _Init:
        own = inspect.signature(init).parameters.values()
        parent = inspect.signature(Attention.__init__)
        inherited = [p for p in parent.parameters.values() if p.name not in bound]
        keyword_only = inspect.Parameter.KEYWORD_ONLY
        init.__signature__ = parent.replace(  # type: ignore[attr-defined]
            parameters=[p for p in inherited if p.kind is not keyword_only]
            + [p for p in own if p.kind is keyword_only]
            + [p for p in inherited if p.kind is keyword_only]
        )
        return init

    return decorate


class TaylorShiftAttention(Attention):
    """Multi-head TaylorShift attention, a drop-in for timm's ``Attention``.

    timm's arguments first (``dim, num_heads, qkv_bias, qk_norm, scale_norm, proj_bias,
    attn_drop, proj_drop, norm_layer, device, dtype``), then ours:

    Args:
        mode: ``"auto"``, ``"direct"`` or ``"efficient"``.
        order: even Taylor order.
        temperature: initial value of the learnable per-head temperature τ.
        normalize: the paper's normalisation (default) or plain scaled scores.
        local_heads, window: the first ``local_heads`` heads attend by softmax over a
            sliding window of ``window`` positions (docs/local-heads.md); 0: none.
        projection, context_len, context_dim, short_conv: as ``Attention``.

    ``attn_drop`` drops whole keys (see ``taylorshift.nn.kernels``), the same way in the
    direct and the efficient form.
    """

    @takes_attention_arguments("attn_kernel", "kernel_args")
    def __init__(
        self,
        *args: Any,
        mode: str = "auto",
        order: int = 2,
        temperature: float = 1.0,
        normalize: bool = True,
        local_heads: int = 0,
        window: int = 64,
        **kwargs: Any,
    ):
        super().__init__(
            *args,
            **kwargs,
            attn_kernel="taylorshift",
            kernel_args={
                "mode": mode,
                "order": order,
                "temperature": temperature,
                "normalize": normalize,
                "local_heads": local_heads,
                "window": window,
            },
        )
