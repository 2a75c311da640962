"""Key-padding detection, the one copy every op uses (ops/masks.py)."""

from __future__ import annotations

import torch

from taylorshift.ops.masks import key_padding_of


def test_equal_rows_are_key_padding_whatever_the_shape():
    pad = torch.tensor([[True, True, False]])  # (B=1, Nk=3)
    full = pad[:, None, None, :].expand(1, 2, 4, 3)  # the same row for 4 queries, 2 heads
    for mask in (pad[:, None, None, :], full, full[0, 0]):  # 4-D, full 4-D, 2-D (Nq, Nk)
        rows = key_padding_of(mask)
        assert rows is not None and rows.dim() == 4 and rows.shape[-2] == 1
        assert torch.equal(rows.reshape(-1, 3)[0], pad[0])


def test_rows_that_differ_are_not_key_padding():
    causal_like = torch.ones(3, 3, dtype=torch.bool).tril()
    assert key_padding_of(causal_like) is None


def test_meta_tensors_with_a_full_mask_give_shapes_not_an_error():
    from taylorshift import taylor_shift_attention

    q = torch.empty(1, 2, 5, 4, device="meta")
    mask = torch.empty(1, 1, 5, 5, dtype=torch.bool, device="meta")
    assert key_padding_of(mask) is None  # the data cannot be looked at: counts as varying
    assert taylor_shift_attention(q, q, q, mask).shape == (1, 2, 5, 4)
