"""The two collectives of sequence-parallel TaylorShift, as autograd functions.

Each forward is one ``torch.distributed`` collective on the given group, and so is each
backward. Every rank of the group must therefore run the forward and, if any rank does, the
backward of every call, in the same order (as DDP requires of its model): a rank that skips
a backward leaves the others waiting in theirs.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor


def group_place(group: object) -> tuple[int, int]:
    """(world size, rank) of this process in ``group``; (1, 0) without a process group.

    ``group=None`` means the default group when ``torch.distributed`` is initialized, and a
    single process when it is not.

    Raises:
        TypeError: ``group`` is neither None nor a ``torch.distributed.ProcessGroup``.
        ValueError: a group without an initialized ``torch.distributed``, or a group that
            this process is not a member of.
    """
    initialized = dist.is_available() and dist.is_initialized()
    # torch.distributed.new_group gives the processes outside the new group this marker.
    if initialized and type(group) is int and group == dist.GroupMember.NON_GROUP_MEMBER:
        raise ValueError(
            f"this process (global rank {dist.get_rank()}) is not a member of group (it got "
            "torch.distributed.GroupMember.NON_GROUP_MEMBER from new_group); every rank that "
            "holds a part of the sequence must be"
        )
    if group is not None and not (dist.is_available() and isinstance(group, dist.ProcessGroup)):
        raise TypeError(
            f"group must be a torch.distributed.ProcessGroup or None; got {type(group).__name__}"
        )
    if not initialized:
        if group is not None:
            raise ValueError(
                "group was given but torch.distributed is not initialized; call "
                "torch.distributed.init_process_group first (or pass group=None to run in "
                "one process)"
            )
        return 1, 0
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError(
            f"this process (global rank {dist.get_rank()}) is not a member of group; every "
            "rank that holds a part of the sequence must be"
        )
    return dist.get_world_size(group), rank


def _all_gather(x: Tensor, group) -> list[Tensor]:
    """[x of rank 0, x of rank 1, ...] of the group, on every rank."""
    x = x.contiguous()
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x, group=group)
    return parts


def _sum_in_rank_order(parts: list[Tensor], like: Tensor) -> Tensor:
    """Σ parts in list order (the same order, so the same rounding, on every rank)."""
    total = torch.zeros_like(like)
    for p in parts:
        total += p
    return total


class SumOverRanks(torch.autograd.Function):
    """x -> Σ_ranks x (all-reduce). Backward: the gradient is summed over ranks as well,
    since every rank's output is the same sum of every rank's input."""

    @staticmethod
    def forward(ctx, x: Tensor, group) -> Tensor:
        ctx.group = group
        out = x.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        grad = grad.clone(memory_format=torch.contiguous_format)
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class ExclusivePrefixOverRanks(torch.autograd.Function):
    """x -> Σ_{ranks r' < r} x_r' on rank r (all-gather, then a sum over the lower ranks).

    Backward: x_r feeds the outputs of every higher rank, so its gradient is
    Σ_{r' > r} grad_r' (all-gather of the output gradients, then a suffix sum).
    Rank 0 gets zeros, and the last rank's input gets a zero gradient.
    """

    @staticmethod
    def forward(ctx, x: Tensor, group) -> Tensor:
        rank = dist.get_rank(group)
        ctx.group, ctx.rank = group, rank
        return _sum_in_rank_order(_all_gather(x, group)[:rank], x)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        parts = _all_gather(grad, ctx.group)
        return _sum_in_rank_order(parts[ctx.rank + 1 :], grad), None
