"""The real rows just before and after a rank's slice: short convolutions and local heads.

A short convolution of k taps gives each token its k - 1 predecessors (causal) or its
neighbours (centred); a local head's window of w its w - 1 (and, centred, w - 1 after).
On a slice of the sequence the first tokens' predecessors live on lower ranks, possibly on
several (a rank may hold fewer than k - 1 tokens, or none). And the predecessors are
*real* tokens: the layer counts padding as absent wherever it sits
(``taylorshift.nn.attention``, "Padding anywhere").

So every rank takes its last ``before`` real rows (its "tail") and its first ``after`` real
rows (its "head"), each row of the batch on its own, and one all-gather gives every rank
every other's (P · B · (before + after) rows per layer). Rank r's predecessors
are the last ``before`` real rows of the tails of ranks 0 .. r-1 taken in order: any real
row among them is within the last ``before`` real rows of its own rank, so the tails hold
them all. Its successors are, likewise, the first ``after`` real rows of the heads of ranks
r+1 .. P-1. Where the sequence has fewer, the rest are zeros, as the convolution's padding.

Backward: a tail or head feeds the neighbours' outputs, so the gradient w.r.t. the gathered
rows is summed over the ranks (an all-reduce) and each rank keeps its own part.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from .collectives import _all_gather, group_place


class AllGatherOverRanks(torch.autograd.Function):
    """x -> (P, *x.shape): every rank's x, stacked in rank order. Backward: the gradient
    of every rank's copy of x_r summed over the ranks (all-reduce), rank r's slot kept."""

    @staticmethod
    def forward(ctx, x: Tensor, group) -> Tensor:
        ctx.group, ctx.rank = group, dist.get_rank(group)
        return torch.stack(_all_gather(x, group))

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad[ctx.rank], None


def _ends(x: Tensor, real: Tensor, before: int, after: int) -> tuple[Tensor, Tensor]:
    """This rank's ends, per batch row: (the last ``before`` real rows, right-aligned, and the
    first ``after`` real rows, left-aligned, together (B, before + after, C); which of those
    slots hold a real row, (B, before + after) bool). Empty slots are zeros."""
    b, n, c = x.shape
    if n == 0:  # an empty slice: nothing to give (x kept in the graph, zero gradients)
        empty = torch.zeros((b, before + after), dtype=torch.bool, device=x.device)
        return x.new_zeros((b, before + after, c)) + x.sum() * 0, empty
    order = torch.sort((~real).to(torch.int8), dim=1, stable=True).indices  # real rows first
    count = real.sum(1, keepdim=True)  # (B, 1)
    slot = torch.arange(before + after, device=x.device)[None, :]
    # the tail's slot j holds real row count - before + j; the head's slot j real row j
    index = torch.where(slot < before, count - before + slot, slot - before)
    valid = (index >= 0) & (index < count)
    rows = order.gather(1, index.clamp(0, n - 1))
    picked = x.gather(1, rows[..., None].expand(-1, -1, c))
    return torch.where(valid[..., None], picked, 0.0), valid  # (not a product: NaN padding)


def _first_valid(rows: Tensor, valid: Tensor, k: int, last: bool) -> tuple[Tensor, Tensor]:
    """The first (or, ``last``, the last) ``k`` valid rows of (B, M, C) in order, zeros where
    fewer are valid (invalid rows are zeros), and which of the k are valid (B, k)."""
    key = valid if last else ~valid  # ascending stable sort: the wanted rows at that end
    order = torch.sort(key.to(torch.int8), dim=1, stable=True).indices
    ordered = rows.gather(1, order[..., None].expand(-1, -1, rows.shape[2]))
    flags = valid.gather(1, order)
    end = slice(ordered.shape[1] - k, None) if last else slice(0, k)
    return ordered[:, end], flags[:, end]


def neighbour_rows(
    x: Tensor, real: Tensor | None, before: int, after: int, group
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The ``before`` real rows that precede this rank's slice in the whole sequence and the
    ``after`` real rows that follow it, (B, before, C) and (B, after, C), zeros where the
    sequence has fewer (see the module docs); and which of them are rows of the sequence,
    (B, before) and (B, after) bool (the missing ones: the first before, the last after).

    Args:
        x: (B, N_r, C), this rank's rows (padding rows may hold anything).
        real: (B, N_r) bool, True = a real token, or None (all real).
        before, after: how many rows on each side.
        group: the ranks of the sequence, in sequence order (more than one).
    """
    b, _, c = x.shape
    if real is None:
        real = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)
    ends, valid = _ends(x, real, before, after)
    # one collective: which slots hold a row travels as one more channel
    packed = torch.cat([ends, valid[..., None].to(ends.dtype)], dim=-1)
    gathered = AllGatherOverRanks.apply(packed, group)  # (P, B, before + after, C + 1)
    gathered, flags = gathered[..., :c], gathered[..., c] > 0
    rank = dist.get_rank(group)

    def joined(parts: Tensor, part_flags: Tensor) -> tuple[Tensor, Tensor]:
        # (P', B, k, C) -> (B, P' k, C), the ranks in order
        return parts.transpose(0, 1).reshape(b, -1, c), part_flags.transpose(0, 1).reshape(b, -1)

    lower = joined(gathered[:rank, :, :before], flags[:rank, :, :before])
    higher = joined(gathered[rank + 1 :, :, before:], flags[rank + 1 :, :, before:])
    zeros = x.new_zeros((b, before + after, c))
    pad = torch.zeros((b, before + after), dtype=torch.bool, device=x.device)
    # (zeros in front or behind: a sequence start or end with fewer rows than asked)
    first, first_valid = _first_valid(torch.cat([zeros[:, :before], lower[0]], 1),
                                      torch.cat([pad[:, :before], lower[1]], 1), before,
                                      last=True)  # fmt: skip
    second, second_valid = _first_valid(torch.cat([higher[0], zeros[:, :after]], 1),
                                        torch.cat([higher[1], pad[:, :after]], 1), after,
                                        last=False)  # fmt: skip
    return first, second, first_valid, second_valid


def with_neighbours(
    x: Tensor, real: Tensor | None, before: int, after: int, group
) -> tuple[Tensor, Tensor]:
    """This rank's rows with the neighbouring ranks' real rows around them, (B, before + N_r
    + after, C), and which rows are real tokens, (B, before + N_r + after) bool.

    The rows before come first; the rows after stand right behind each batch row's real
    rows, so ``x`` must hold its real rows first (``Attention.forward`` moves them there),
    and its padding rows come out zero. One process (a group of one, or none): zeros
    around, marked not real. Used by the short convolution (``Attention.neighbours``) and
    the local heads (``SequenceParallelKernel``) of a converted layer.
    """
    b, n, c = x.shape
    if real is None:
        real = torch.ones((b, n), dtype=torch.bool, device=x.device)
    if group_place(group)[0] == 1:
        rows_before, rows_after = x.new_zeros((b, before, c)), x.new_zeros((b, after, c))
        valid_before, valid_after = real.new_zeros((b, before)), real.new_zeros((b, after))
    else:
        rows_before, rows_after, valid_before, valid_after = neighbour_rows(
            x, real, before, after, group
        )
    # (padding zero, not a product: a NaN in a padded row stays out; the rows after add on)
    x = torch.where(real[..., None], x, 0.0)
    ext = torch.cat([rows_before, x, x.new_zeros((b, after, c))], dim=1)
    keep = torch.cat([valid_before, real, real.new_zeros((b, after))], dim=1)
    if after:
        at = before + real.sum(1, keepdim=True) + torch.arange(after, device=x.device)
        ext = ext.scatter_add(1, at[..., None].expand(-1, -1, c), rows_after)
        keep = keep.scatter(1, at, valid_after)
    return ext, keep
