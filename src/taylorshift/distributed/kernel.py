"""Sequence parallelism for modules: a TaylorShift kernel whose keys span every rank.

An attention layer's projections, norms and MLPs act token by token, so a model whose
``taylorshift`` kernels are replaced by :class:`SequenceParallelKernel` runs on a local
slice (B, N_r, dim) of the sequence unchanged: only the kernel communicates.
:func:`convert_sequence_parallel` makes that replacement in place, keeping each kernel's
temperature (the same parameter object, so the same ``state_dict`` keys and values).
Position offsets are the model's concern (``sequence_shard(...).start``).
"""

from __future__ import annotations

import torch
from torch import nn

from ..models.encoder import EncoderClassifier
from ..nn.attention import Attention
from ..nn.kernels import AttentionKernel, TaylorShiftKernel
from ..ops.masks import key_padding_of
from ..ops.window import sliding_window_attention
from .collectives import group_place
from .halo import with_neighbours
from .sequence_parallel import sequence_parallel_taylor_shift


class SequenceParallelKernel(TaylorShiftKernel):
    """TaylorShift (efficient form, order 2) over a sequence split across ``group``.

    Takes this rank's q (B, H, N_r, d), k, v and a key-padding ``attn_mask`` broadcastable to
    (B, H, 1, N_r); see ``sequence_parallel_taylor_shift``. ``attn_drop`` drops local keys
    (as the ``taylorshift`` kernel does); the count of kept keys is summed over the ranks.
    Local heads (``local_heads``) read the neighbouring ranks' real key/value rows that
    their window reaches (``neighbour_rows``; key padding only).

    Args:
        temperature, learn_temperature, normalize, local_heads, window: as the
            ``taylorshift`` kernel.
        group: the ranks that share one sequence, in sequence order (None: the default
            group, or a single process without ``torch.distributed``). Not saved in the
            ``state_dict``; :func:`convert_sequence_parallel` sets it.
    """

    name = "taylorshift-sp"

    def __init__(
        self,
        num_heads,
        head_dim,
        *,
        attn_drop=0.0,
        temperature=1.0,
        learn_temperature=True,
        normalize=True,
        local_heads=0,
        window=64,
        group=None,
    ):
        super().__init__(
            num_heads,
            head_dim,
            attn_drop=attn_drop,
            mode="efficient",
            order=2,
            temperature=temperature,
            learn_temperature=learn_temperature,
            normalize=normalize,
            local_heads=local_heads,
            window=window,
        )
        self.group = group

    @property
    def group(self):
        """The process group of the sequence (None: the default group)."""
        return self._group.value

    @group.setter
    def group(self, group) -> None:
        group_place(group)
        self._group = _SharedHandle(group)

    def attend(self, q, k, v, attn_mask, is_causal):
        if not self.local_heads or group_place(self.group)[0] == 1:
            return super().attend(q, k, v, attn_mask, is_causal)
        padding = key_padding_of(attn_mask) if attn_mask is not None else None
        if attn_mask is not None and (padding is None or padding.shape[-3] != 1):
            raise ValueError(
                "local heads across ranks take key padding only ((B, N) or (B, 1, 1, N)); got "
                f"attn_mask of shape {tuple(attn_mask.shape)}"
            )
        if k.shape[1] != q.shape[1] or q.shape[-2] != k.shape[-2]:
            raise ValueError(
                "local heads across ranks need self-attention with as many key/value heads as "
                f"query heads; got q {tuple(q.shape)} and k {tuple(k.shape)}"
            )
        ell = self.local_heads
        real = None if padding is None else padding.expand(q.shape[0], 1, 1, -1)[:, 0, 0, :]
        local = self._local_across_ranks(q[:, :ell], k[:, :ell], v[:, :ell], real, is_causal)
        rest = self._taylor_heads(q[:, ell:], k[:, ell:], v[:, ell:], attn_mask, is_causal)
        return torch.cat([local, rest.to(local.dtype)], dim=1)

    def _local_across_ranks(self, q, k, v, real, is_causal):
        """The local heads' sliding window on this rank's slice, its keys and values
        extended by the neighbouring ranks' real rows (``neighbour_rows``): one self-
        attention over [rows before, the slice, rows after] with key padding, where the
        rows after stand right behind each row's real tokens (``with_neighbours``), the
        outputs of the slice kept."""
        b, h, n, d = q.shape
        dv = v.shape[-1]
        before, after = self.window - 1, 0 if is_causal else self.window - 1
        kv = torch.cat([k, v], dim=-1).transpose(1, 2).reshape(b, n, h * (d + dv))
        ext, keep = with_neighbours(kv, real, before, after, self.group)
        ext = ext.view(b, before + n + after, h, d + dv).transpose(1, 2)
        q_ext = torch.cat([q.new_zeros((b, h, before, d)), q, q.new_zeros((b, h, after, d))], 2)
        out = sliding_window_attention(
            q_ext, ext[..., :d], ext[..., d:], self.window, keep[:, None, None, :], is_causal
        )
        return out[:, :, before : before + n]

    def _attention(self, q, k, v, attn_mask, is_causal):
        return sequence_parallel_taylor_shift(
            q,
            k,
            v,
            attn_mask,
            is_causal,
            temperature=self.tau,
            normalize=self.normalize,
            group=self.group,
            enable_gqa=k.shape[1] != q.shape[1],
        )


class NeighbourRows:
    """``Attention.neighbours`` under sequence parallelism: ``with_neighbours`` on ``group``
    (zeros in one process). ``copy.deepcopy`` shares the group, as ``_SharedHandle``."""

    def __init__(self, group) -> None:
        self.group = group

    def __call__(self, x, real, before: int, after: int):
        return with_neighbours(x, real, before, after, self.group)[0]

    def __deepcopy__(self, memo) -> NeighbourRows:
        return self


class _SharedHandle:
    """Holds a process group so that ``copy.deepcopy`` of a model (EMA, a reference copy)
    shares it: a group is a handle to communicators, not data (and cannot be copied)."""

    def __init__(self, value) -> None:
        self.value = value

    def __deepcopy__(self, memo) -> _SharedHandle:
        return self


def convert_sequence_parallel(model: nn.Module, group=None) -> nn.Module:
    """Replace every ``taylorshift`` kernel of ``model`` by a :class:`SequenceParallelKernel`.

    In place (and returned), like ``torch.nn.SyncBatchNorm.convert_sync_batchnorm``: call it
    before building the optimizer and before wrapping the model in DDP. An ``Attention``
    with a short convolution gets ``NeighbourRows``: its taps at the slice's ends read the
    neighbouring ranks' real rows (one more all-gather per layer, of a few rows). Each new kernel
    takes over the old one's temperature tensor itself, so parameters, ``state_dict`` keys
    and checkpoints are unchanged; the direct and efficient modes compute the same function,
    so a kernel of any ``mode`` converts. Kernels already sequence-parallel get ``group``.

    Raises:
        ValueError: a kernel that cannot attend across ranks (softmax, linear, holt; a
            TaylorShift order other than 2), an ``Attention`` with ``projection='super'``
            (its W_A mixes values over the whole sequence), an encoder classifier
            (``TransformerClassifier``, ``VisionTransformer``: a CLS token and pooling over
            the whole sequence; convert its ``blocks``), or no TaylorShift kernel at all.
    """
    group_place(group)
    if isinstance(model, EncoderClassifier):
        raise ValueError(
            f"model is a {type(model).__name__}, which adds a CLS token and positions and "
            "pools over the whole sequence: on a slice each rank would pool its own tokens. "
            "Convert its trunk (convert_sequence_parallel(model.blocks, group)) and pool "
            "across the ranks yourself"
        )
    if isinstance(model, AttentionKernel):
        return _converted(model, "model", group)
    replaced = 0
    for path, parent in list(model.named_modules()):
        if isinstance(parent, Attention) and parent.projection == "super":
            raise ValueError(
                f"{path or 'model'} has projection='super', whose W_A mixes values over the "
                "whole sequence: it cannot run on a slice; use another projection"
            )
        if isinstance(parent, Attention) and parent.short_conv > 1:
            # the taps at the slice's ends read the neighbouring ranks' real rows (halo.py)
            parent.neighbours = NeighbourRows(group)
        for name, child in parent.named_children():
            if isinstance(child, AttentionKernel):
                setattr(parent, name, _converted(child, f"{path}.{name}".lstrip("."), group))
                replaced += 1
    if not replaced:
        raise ValueError(
            f"model ({type(model).__name__}) has no attention kernel to make sequence-parallel"
        )
    return model


def _converted(kernel: AttentionKernel, path: str, group) -> SequenceParallelKernel:
    if isinstance(kernel, SequenceParallelKernel):
        kernel.group = group
        return kernel
    if not isinstance(kernel, TaylorShiftKernel):
        raise ValueError(
            f"{path} is the {kernel.name!r} kernel, which cannot attend across ranks; only "
            "'taylorshift' kernels can be made sequence-parallel"
        )
    if kernel.order != 2:
        raise ValueError(
            f"{path} has Taylor order {kernel.order}; sequence parallelism uses the efficient "
            "form, which supports order 2 only"
        )
    if not kernel.output_factor:
        raise ValueError(
            f"{path} has output_factor=False; the sequence-parallel form keeps the paper's "
            "output factor (its counts span the ranks): convert a kernel with the factor"
        )
    kept = {k: getattr(kernel, k) for k in ("attn_drop", "normalize", "local_heads", "window")}
    new = SequenceParallelKernel(kernel.num_heads, kernel.head_dim, group=group, **kept)
    # Take over the kernel's own temperature tensor (parameter or buffer, τ or log τ), so
    # parameters, state_dict keys and checkpoints are unchanged.
    name = "log_temperature" if kernel.log_temperature_param else "temperature"
    del new.temperature
    new.log_temperature_param = kernel.log_temperature_param
    value = getattr(kernel, name)
    if isinstance(value, nn.Parameter):
        setattr(new, name, value)
    else:
        new.register_buffer(name, value)
    return new.train(kernel.training)
