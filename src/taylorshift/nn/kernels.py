"""Attention kernels selectable by name: the part of an attention layer after projections.

A kernel maps q (B, H, Nq, d), k (B, Hkv, Nk, d), v (B, Hkv, Nk, dv), a bool mask
broadcastable to (B, H, Nq, Nk) (True = attend) and ``is_causal`` to (B, H, Nq, dv). Kernels
are modules so that they can own parameters (TaylorShift's per-head temperature). Every
module and model takes ``attn_kernel=<name>`` and ``kernel_args={...}``.

Grouped-query attention: key and value may have Hkv heads, Hkv dividing H (query head h
reads key/value head ``h // (H / Hkv)``). ``taylorshift`` and ``softmax`` take them as they
are (the ops' ``enable_gqa``; decoding keeps TaylorShift's state and every key/value cache
per key/value head); the other kernels repeat key and value to H heads first.

Attention dropout (``attn_drop``) by kernel:

- ``softmax``, ``softmax-naive``: dropout on the normalised attention weights (as timm).
- ``taylorshift``, ``linear``, ``holt``: the linear-time forms never form the weights, so
  ``attn_drop`` drops whole keys instead: during training each key is removed for each
  (batch, head) with probability p, through the key mask, so it leaves every key-side sum
  and the denominator renormalises the rest (no 1/(1-p) factor). The direct and efficient
  TaylorShift forms therefore compute the same function for the same dropped keys, and
  agree exactly when ``attn_drop = 0`` or in eval mode.
"""

from __future__ import annotations

import difflib
import inspect
import math
from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._inference import inference_only
from .._validate import check_bool, check_choice, check_int, check_number, check_probability
from ..ops.holt import holt_attention
from ..ops.linear_attention import linear_attention, linear_attention_decode
from ..ops.masks import as_4d
from ..ops.taylor_shift import taylor_shift_attention, taylor_shift_decode
from ..ops.taylor_shift.checks import check_options
from ..ops.taylor_shift.decode import decode_token
from ..ops.taylor_shift.features import attended_counts
from ..ops.window import sliding_window_attention, window_attention_of_cache
from .cache import CACHE_KINDS, KVCache, StateCache, check_decode_step

_KERNELS: dict[str, type[AttentionKernel]] = {}


def register_kernel(name: str) -> Callable[[type[AttentionKernel]], type[AttentionKernel]]:
    """Class decorator: make a kernel available as ``attn_kernel=name``."""

    def wrap(cls: type[AttentionKernel]) -> type[AttentionKernel]:
        if name in _KERNELS:
            raise ValueError(f"attention kernel {name!r} is registered already")
        cls.name = name
        _KERNELS[name] = cls
        return cls

    return wrap


def list_kernels() -> list[str]:
    """Names accepted by ``create_kernel`` and by ``attn_kernel=`` of modules and models."""
    return sorted(_KERNELS)


def create_kernel(
    name: str, num_heads: int, head_dim: int, attn_drop: float = 0.0, **kwargs
) -> AttentionKernel:
    """Build the kernel ``name``; ``kwargs`` are that kernel's own options."""
    check_kernel_options(name, kwargs)
    return _KERNELS[name](num_heads, head_dim, attn_drop=attn_drop, **kwargs)


def check_kernel_options(name: str, given: Iterable[str]) -> None:
    """Raise ``TypeError`` naming the first of the option names ``given`` that kernel
    ``name`` does not take, with the closest one and the kernel's options."""
    options = kernel_options(name)
    unknown = [] if options is None else sorted(set(given) - set(options))
    if unknown:
        close = difflib.get_close_matches(unknown[0], options, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise TypeError(
            f"attention kernel {name!r} has no option {unknown[0]!r}{hint}; its "
            f"options: {', '.join(options) or 'none'}"
        )


def kernel_options(name: str) -> list[str] | None:
    """The options of kernel ``name``, as ``kernel_args`` gives them: the keyword arguments
    of its constructor besides those every kernel takes from its layer (None: it takes any
    keyword)."""
    check_choice("attn_kernel", name, list_kernels())
    own = ("self", "num_heads", "head_dim", "attn_drop")
    parameters = inspect.signature(_KERNELS[name].__init__).parameters.values()
    if any(p.kind == p.VAR_KEYWORD for p in parameters):
        return None
    return [
        p.name
        for p in parameters
        if p.name not in own and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]


def repeat_kv(k: Tensor, v: Tensor, heads: int) -> tuple[Tensor, Tensor]:
    """Key and value of Hkv heads repeated to ``heads`` (each head G = heads / Hkv times in
    a row, as ``enable_gqa`` reads them)."""
    groups = heads // k.shape[1]
    return k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)


def combined_mask(
    attn_mask: Tensor | None, is_causal: bool, nq: int, nk: int, device
) -> Tensor | None:
    """attn_mask ∧ causal (upper-left aligned) as one bool mask, or None."""
    if not is_causal:
        return attn_mask
    causal = torch.ones(nq, nk, dtype=torch.bool, device=device).tril()
    return causal if attn_mask is None else attn_mask & causal


class AttentionKernel(nn.Module):
    """Base class. Subclasses implement ``attend``; ``forward`` applies key dropout."""

    name = ""
    key_dropout = True  # False: the kernel drops attention weights itself
    has_state = False  # True: decodes with a constant-size state (``decode_state``)
    grouped = False  # True: ``attend`` takes key and value of fewer heads than the query

    def __init__(self, num_heads: int, head_dim: int, *, attn_drop: float = 0.0):
        super().__init__()
        check_probability("attn_drop", attn_drop)
        self.num_heads, self.head_dim, self.attn_drop = num_heads, head_dim, attn_drop

    def forward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        attn_mask: Tensor | None = None,
        is_causal: bool = False,
    ) -> Tensor:
        if self.key_dropout and self.training and self.attn_drop > 0:
            # (per query head: with grouped heads each query head drops its own keys)
            b, h, nk = k.shape[0], q.shape[1], k.shape[2]
            keep = torch.rand(b, h, 1, nk, device=k.device) >= self.attn_drop
            attn_mask = keep if attn_mask is None else attn_mask & keep
        return self.attend_heads(q, k, v, attn_mask, is_causal)

    def attend_heads(self, q, k, v, attn_mask, is_causal) -> Tensor:
        """``attend`` for key and value of H or Hkv heads: repeated to H heads for kernels
        that are not ``grouped``."""
        if k.shape[1] != q.shape[1] and not self.grouped:
            k, v = repeat_kv(k, v, q.shape[1])
        return self.attend(q, k, v, attn_mask, is_causal)

    def attend(self, q, k, v, attn_mask, is_causal) -> Tensor:  # pragma: no cover
        raise NotImplementedError

    def new_cache(self, kind: str = "auto") -> KVCache | StateCache:
        """An empty decoding cache: ``"state"`` (constant size; TaylorShift and linear
        attention), ``"kv"`` (keys and values, any kernel), ``"auto"`` (state if the kernel
        has one)."""
        check_choice("cache", kind, CACHE_KINDS)
        if kind == "state" and not self.has_state:
            raise ValueError(
                f"cache='state' needs a kernel with a constant-size state; attn_kernel "
                f"{self.name!r}{self._why_no_state()} has none (use cache='kv')"
            )
        return StateCache() if kind == "state" or (kind == "auto" and self.has_state) else KVCache()

    def _why_no_state(self) -> str:
        return ""

    @inference_only
    def decode(
        self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None, cache
    ) -> Tensor:
        """Causal attention of T new tokens (B, H, T, ·) after the tokens in ``cache``.

        ``key_padding_mask`` (B, T), True = real token (padded tokens are never attended).
        Updates ``cache`` in place and returns (B, H, T, dv): row t equals row ``N + t`` of
        ``forward(..., is_causal=True)`` over the real tokens. Inference only.
        """
        check_decode_step(cache, q.shape[0], q.shape[2], key_padding_mask)
        return self.decode_unchecked(q, k, v, key_padding_mask, cache)

    def decode_unchecked(self, q, k, v, key_padding_mask, cache) -> Tensor:
        """``decode`` after ``check_decode_step`` (the layer's ``decode`` checks first, before
        its own part of the cache changes). Kernels override this, not ``decode``."""
        if isinstance(cache, KVCache):
            keys, values, mask = cache.extend(k, v, key_padding_mask)
            return self._decode_kv(q, keys, values, mask, cache.padded, self.attend_heads)
        if isinstance(cache, StateCache) and self.has_state:
            return self.decode_state(q, k, v, key_padding_mask, cache)
        raise TypeError(
            f"cache must come from new_cache() of this {self.name!r} kernel; got "
            f"{type(cache).__name__}"
        )

    @staticmethod
    def _decode_kv(q, keys, values, mask, padded: bool, attend) -> Tensor:
        """The last T = q.shape[-2] rows of causal attention over the cache's keys, values
        and real-token ``mask`` (B, N), by ``attend(q, k, v, attn_mask, is_causal)``."""
        t, n = q.shape[-2], keys.shape[-2]
        # Key padding (with causal for a prompt that has no past) is all a block needs
        # when it is one token or the whole sequence; forms that take key masks only
        # (efficient TaylorShift, linear-time holt) serve those. A block after a past
        # goes token by token, each seeing its prefix of the cache.
        if t == 1 or t == n:
            key_mask = mask[:, None, None, :] if padded else None
            # causal exactly when t == n > 1, written as t > 1: under
            # torch.compile(dynamic=True) t == n is a symbolic bool, which SDPA's
            # is_causal refuses, while t = 1 is specialised
            return attend(q, keys, values, key_mask, t > 1)
        past = n - t
        rows = [
            attend(q[..., i : i + 1, :], keys[..., : past + i + 1, :],
                   values[..., : past + i + 1, :], mask[:, None, None, : past + i + 1], False)
            for i in range(t)
        ]  # fmt: skip
        return torch.cat(rows, dim=-2)

    def decode_state(self, q, k, v, key_padding_mask, cache: StateCache) -> Tensor:
        raise NotImplementedError  # pragma: no cover

    def extra_repr(self) -> str:
        return f"name={self.name!r}, num_heads={self.num_heads}, attn_drop={self.attn_drop}"


@register_kernel("taylorshift")
class TaylorShiftKernel(AttentionKernel):
    """TaylorShift with a learnable per-head temperature τ (shape (1, H, 1, 1)).

    Args:
        mode: ``"auto"``, ``"direct"`` or ``"efficient"`` (see ``taylor_shift_attention``).
        order: even Taylor order (2 for the efficient form).
        temperature: initial τ of every head.
        learn_temperature: τ is a parameter (True) or a fixed buffer.
        normalize: the paper's normalisation (True) or plain ``1/sqrt(d)`` scores.
        log_temperature: learn log τ (the parameter ``log_temperature``, τ = its exp) in
            place of τ itself, so an optimizer step changes τ by a factor, not an amount,
            and τ stays positive.
        output_factor: keep the paper's output factor sqrt(n_i/d) of ``normalize=True``
            (default); False divides it out again, so each output is the plain weighted
            mean of the values (docs/accuracy.md measures both). No effect with
            ``normalize=False``, which has no factor.
        local_heads: how many of the heads (the first ones) attend by softmax over a
            sliding window of ``window`` positions instead (``ops.window``, as Based
            pairs its Taylor heads with local softmax; docs/local-heads.md). 0 (default):
            every head is TaylorShift. τ then belongs to the Taylor heads only, shape
            (1, num_heads - local_heads, 1, 1).
        window: the local heads' window (keys within ``window`` positions; causal: the
            query and its ``window - 1`` predecessors).
    """

    grouped = True

    def __init__(
        self,
        num_heads,
        head_dim,
        *,
        attn_drop=0.0,
        mode="auto",
        order=2,
        temperature=1.0,
        learn_temperature=True,
        normalize=True,
        log_temperature=False,
        output_factor=True,
        local_heads=0,
        window=64,
    ):
        super().__init__(num_heads, head_dim, attn_drop=attn_drop)
        check_options(normalize, order, mode)
        check_int("local_heads", local_heads, ge=0)
        check_int("window", window, ge=1)
        if local_heads >= num_heads:
            raise ValueError(
                f"local_heads must be an int < num_heads ({num_heads}), leaving at least one "
                f"TaylorShift head; got {local_heads}"
            )
        self.local_heads, self.window = local_heads, window
        check_number("temperature", temperature)
        check_bool("learn_temperature", learn_temperature)
        if not normalize and float(temperature) != 1.0:
            raise ValueError(
                f"temperature applies to the normalised form only; got temperature="
                f"{temperature} with normalize=False"
            )
        check_bool("log_temperature", log_temperature)
        check_bool("output_factor", output_factor)
        if log_temperature and not float(temperature) > 0:
            raise ValueError(
                f"log_temperature needs a temperature > 0; got temperature={temperature}"
            )
        self.mode, self.order, self.normalize = mode, order, normalize
        self.output_factor = output_factor or not normalize
        tau = torch.full((1, num_heads - local_heads, 1, 1), float(temperature))
        self.log_temperature_param = log_temperature and normalize
        if self.log_temperature_param:
            log_tau = tau.log()
            if learn_temperature:
                self.log_temperature = nn.Parameter(log_tau)
            else:
                self.register_buffer("log_temperature", log_tau)
        elif learn_temperature and normalize:
            self.temperature = nn.Parameter(tau)
        else:
            self.register_buffer("temperature", tau)

    @property
    def tau(self) -> Tensor | float:
        """τ as the op takes it: (1, H, 1, 1), or 1.0 with ``normalize=False``."""
        if not self.normalize:
            return 1.0
        return self.log_temperature.exp() if self.log_temperature_param else self.temperature

    @property
    def has_state(self) -> bool:  # type: ignore[override]
        return self.order == 2

    def _why_no_state(self) -> str:
        return f" with order={self.order}" if self.order != 2 else ""

    def extra_repr(self) -> str:
        text = super().extra_repr()
        if self.local_heads:
            text += f", local_heads={self.local_heads}, window={self.window}"
        return text

    def decode_unchecked(self, q, k, v, key_padding_mask, cache):
        if not (self.local_heads and isinstance(cache, KVCache)):
            return super().decode_unchecked(q, k, v, key_padding_mask, cache)
        keys, values, mask = cache.extend(k, v, key_padding_mask)
        ell = self.local_heads
        local = window_attention_of_cache(
            q[:, :ell], keys[:, :ell], values[:, :ell], mask, self.window
        )
        rest = self._decode_kv(
            q[:, ell:], keys[:, ell:], values[:, ell:], mask, cache.padded, self._taylor_heads
        )
        return torch.cat([local, rest.to(local.dtype)], dim=1)

    def decode_state(self, q, k, v, key_padding_mask, cache):
        if not self.local_heads:
            return self._taylor_decode_state(q, k, v, key_padding_mask, cache)
        ell = self.local_heads
        local = self._window_step(q[:, :ell], k[:, :ell], v[:, :ell], key_padding_mask, cache)
        rest = self._taylor_decode_state(
            q[:, ell:], k[:, ell:], v[:, ell:], key_padding_mask, cache
        )
        return torch.cat([local, rest.to(local.dtype)], dim=1)

    def _window_step(self, q, k, v, key_padding_mask, cache):
        """The local heads' rows of T new tokens from the cache's window: the last
        ``window - 1`` real tokens' keys and values (a constant size, like the state)."""
        mask = key_padding_mask
        if mask is None:
            mask = torch.ones(k.shape[0], k.shape[-2], dtype=torch.bool, device=k.device)
        keys, values = k, v
        if cache.window is not None:
            past_keys, past_values, past_mask = cache.window
            keys = torch.cat([past_keys, keys], dim=2)
            values = torch.cat([past_values, values], dim=2)
            mask = torch.cat([past_mask, mask], dim=1)
        out = window_attention_of_cache(q, keys, values, mask, self.window)
        keep, n = self.window - 1, keys.shape[-2]
        if n > keep:  # keep the last `keep` real tokens, in order (padding only to fill up)
            slot = torch.arange(1, n + 1, device=k.device)
            index = torch.where(mask, slot, 0).topk(keep, dim=-1).indices.sort(-1).values
            h = keys.shape[1]
            keys = keys.gather(2, index[:, None, :, None].expand(-1, h, -1, keys.shape[-1]))
            values = values.gather(2, index[:, None, :, None].expand(-1, h, -1, v.shape[-1]))
            mask = mask.gather(1, index)
        cache.window = (keys, values, mask)
        return out

    def _taylor_decode_state(self, q, k, v, key_padding_mask, cache):
        if (
            self.output_factor
            and cache.state is not None
            and key_padding_mask is None
            and q.shape[-2] == 1
            and not torch.compiler.is_compiling()
        ):
            # The decoding loop's step: the cache's own state, this layer's q, k, v (checked
            # by the first call, which made the state), no padding: no checks per token.
            # (Grouped heads: the state is per key/value head, read by its query heads.)
            return decode_token(q, k, v, cache.state, self.tau, self.normalize)
        # (the state is updated in place: keep the count before the block for the factor)
        before = None if cache.state is None or self.output_factor else cache.state.count.clone()
        out, cache.state = taylor_shift_decode(
            q,
            k,
            v,
            cache.state,
            key_padding_mask,
            temperature=self.tau,
            normalize=self.normalize,
            inplace=True,  # the cache owns its state: no new tensor per token
            enable_gqa=k.shape[1] != q.shape[1],
        )
        if self.output_factor:
            return out
        # n of new token t: the keys before the block plus the real ones up to t.
        real = torch.ones(q.shape[0], q.shape[-2], device=q.device, dtype=torch.float32)
        if key_padding_mask is not None:
            real = key_padding_mask.to(torch.float32)
        count = real.cumsum(-1)[:, None, :, None]  # (B, 1, T, 1)
        if before is not None:
            # (the count is kept per key/value head: to the query heads that read each)
            before = before.repeat_interleave(q.shape[1] // before.shape[1], dim=1)
            count = count + before[:, :, None, None].to(torch.float32)
        return self._without_factor(out, count)

    def attend(self, q, k, v, attn_mask, is_causal):
        if not self.local_heads:
            return self._taylor_heads(q, k, v, attn_mask, is_causal)
        if k.shape[1] != q.shape[1]:
            raise ValueError(
                f"local_heads need as many key/value heads as query heads; got {k.shape[1]} "
                f"key/value heads for {q.shape[1]} query heads"
            )
        if is_causal and q.shape[-2] != k.shape[-2]:
            raise ValueError(
                "local_heads with is_causal need self-attention (as many queries as keys); "
                f"got {q.shape[-2]} queries and {k.shape[-2]} keys"
            )
        ell = self.local_heads
        local_mask = taylor_mask = attn_mask
        if attn_mask is not None and attn_mask.dim() == 4 and attn_mask.shape[1] > 1:
            local_mask, taylor_mask = attn_mask[:, :ell], attn_mask[:, ell:]
        local = sliding_window_attention(
            q[:, :ell], k[:, :ell], v[:, :ell], self.window, local_mask, is_causal
        )
        rest = self._taylor_heads(q[:, ell:], k[:, ell:], v[:, ell:], taylor_mask, is_causal)
        return torch.cat([local, rest.to(local.dtype)], dim=1)

    def _taylor_heads(self, q, k, v, attn_mask, is_causal):
        y = self._attention(q, k, v, attn_mask, is_causal)
        if self.output_factor:
            return y
        b, h, nq, _ = q.shape
        nk = k.shape[-2]
        mask = attn_mask
        if mask is not None:
            mask = as_4d(mask)
            mask = mask.expand(b, h, mask.shape[2], nk)
        count = attended_counts(mask, is_causal, b, h, nq, nk, q.device)
        return self._without_factor(y, count)

    def _attention(self, q, k, v, attn_mask, is_causal) -> Tensor:
        return taylor_shift_attention(
            q,
            k,
            v,
            attn_mask,
            is_causal,
            temperature=self.tau,
            normalize=self.normalize,
            order=self.order,
            mode=self.mode,
            enable_gqa=k.shape[1] != q.shape[1],
        )

    def _without_factor(self, y: Tensor, count: Tensor) -> Tensor:
        """y / sqrt(n/d): undo the output factor (rows with n = 0 are zero already)."""
        dtype = torch.float64 if y.dtype == torch.float64 else torch.float32
        inverse = torch.rsqrt(count.to(dtype).clamp(min=1.0) / self.head_dim)
        return (y * inverse).to(y.dtype)


# SDPA's enable_gqa came with torch 2.5 (the package allows 2.4: the softmax kernel then
# repeats key and value itself).
_SDPA_HAS_GQA = torch.torch_version.TorchVersion(torch.__version__) >= (2, 5)


def _rows_with_keys(mask: Tensor | None) -> Tensor | None:
    return None if mask is None else mask.any(-1, keepdim=True)


@register_kernel("softmax")
class SoftmaxKernel(AttentionKernel):
    """Softmax attention through ``torch.nn.functional.scaled_dot_product_attention``.

    Causal and mask are combined into one bool mask (SDPA refuses both at once); a query
    with no attended key returns zeros, like every kernel here (SDPA alone gives NaN).
    """

    key_dropout = False
    grouped = _SDPA_HAS_GQA

    def attend(self, q, k, v, attn_mask, is_causal):
        p = self.attn_drop if self.training else 0.0
        gqa = {"enable_gqa": True} if k.shape[1] != q.shape[1] else {}
        if attn_mask is None:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=is_causal, **gqa)
        mask = combined_mask(attn_mask, is_causal, q.shape[-2], k.shape[-2], q.device)
        has_keys = _rows_with_keys(mask)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask | ~has_keys, dropout_p=p, **gqa)
        return y * has_keys


@register_kernel("softmax-naive")
class NaiveSoftmaxKernel(AttentionKernel):
    """Softmax attention with the (Nq, Nk) matrix materialised: the paper's baseline."""

    key_dropout = False

    def attend(self, q, k, v, attn_mask, is_causal):
        s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
        mask = combined_mask(attn_mask, is_causal, q.shape[-2], k.shape[-2], q.device)
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
            has_keys = _rows_with_keys(mask)
            s = s.masked_fill(~has_keys, 0.0)
        a = torch.softmax(s, dim=-1)
        if self.training and self.attn_drop > 0:
            a = F.dropout(a, self.attn_drop)
        y = a @ v
        return y if mask is None else y * has_keys


@register_kernel("linear")
class LinearKernel(AttentionKernel):
    """Linear attention, φ(x) = elu(x) + 1 (Katharopoulos et al.), linear time."""

    has_state = True

    def attend(self, q, k, v, attn_mask, is_causal):
        return linear_attention(q, k, v, attn_mask, is_causal)

    def decode_state(self, q, k, v, key_padding_mask, cache):
        if k.shape[1] != q.shape[1]:  # (its state per query head)
            k, v = repeat_kv(k, v, q.shape[1])
        out, cache.state = linear_attention_decode(q, k, v, cache.state, key_padding_mask)
        return out


@register_kernel("holt")
class HoltKernel(AttentionKernel):
    """Higher-order linear transformer: LayerNorm q/k, scores q̃·k̃/(α√d), linear time.

    Args:
        alpha: the score divisor α (3 in the paper).
        subtract_one: drop the constant Taylor term (weights may then be negative; the
            denominator is guarded).
    """

    def __init__(self, num_heads, head_dim, *, attn_drop=0.0, alpha=3.0, subtract_one=False):
        super().__init__(num_heads, head_dim, attn_drop=attn_drop)
        self.alpha = check_number("alpha", alpha, gt=0)
        self.subtract_one = check_bool("subtract_one", subtract_one)

    def attend(self, q, k, v, attn_mask, is_causal):
        return holt_attention(
            q, k, v, attn_mask, is_causal, alpha=self.alpha, subtract_one=self.subtract_one
        )
