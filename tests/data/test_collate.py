"""Batching: padding, masks, labels, multiples; LM targets; image stacking; errors."""

from __future__ import annotations

import pytest
import torch

from taylorshift.data import IGNORE_INDEX, collate_images, collate_lm, collate_tokens


def test_collate_tokens_pads_and_masks():
    batch = [
        (torch.tensor([5, 6, 7]), 1),
        (torch.tensor([8]), 0),
        (torch.tensor([], dtype=torch.long), 2),
    ]
    tokens, mask, labels = collate_tokens(batch, pad_id=256)
    assert tokens.dtype == torch.long and mask.dtype == torch.bool and labels.dtype == torch.long
    assert tokens.tolist() == [[5, 6, 7], [8, 256, 256], [256, 256, 256]]
    assert mask.tolist() == [[True] * 3, [True, False, False], [False] * 3]
    assert labels.tolist() == [1, 0, 2]


def test_collate_tokens_pad_to_multiple_and_dtypes():
    batch = [(torch.arange(5, dtype=torch.uint8), torch.tensor(3)), (torch.arange(2), 4)]
    tokens, mask, labels = collate_tokens(batch, 0, pad_to_multiple=4)
    assert tokens.shape == mask.shape == (2, 8) and tokens.dtype == torch.long
    assert mask.sum(1).tolist() == [5, 2] and labels.tolist() == [3, 4]
    assert collate_tokens(batch, 0, pad_to_multiple=5)[0].shape == (2, 5)


@pytest.mark.parametrize(
    "batch, kwargs, match",
    [
        ([], {}, "batch must hold at least one item, got an empty batch"),
        (
            [(torch.zeros(2, 2, dtype=torch.long), 0)],
            {},
            r"with 1-D tokens, got torch.Size\(\[2, 2\]\) at 0",
        ),
        ([torch.tensor([1])], {}, "with 1-D tokens, got <class 'torch.Tensor'> at 0"),
        ([(torch.zeros(2), 0)], {}, "batch tokens must be integer ids, got torch.float32 at 0"),
        ([(torch.tensor([1]), "a")], {}, r"must be \(tokens, int label\) pairs"),
        (
            [(torch.tensor([1]), 0)],
            {"pad_to_multiple": 0},
            "pad_to_multiple must be a positive int; got 0",
        ),
    ],
)
def test_collate_tokens_errors(batch, kwargs, match):
    with pytest.raises(ValueError, match=match):
        collate_tokens(batch, 0, **kwargs)
    with pytest.raises(TypeError, match="pad_id must be an int; got None"):
        collate_tokens([(torch.tensor([1]), 0)], None)


def test_collate_lm_pads_tokens_and_targets():
    batch = [
        (torch.tensor([5, 6, 7]), torch.tensor([6, 7, -100])),
        (torch.tensor([8], dtype=torch.uint8), torch.tensor([9], dtype=torch.int32)),
        (torch.tensor([], dtype=torch.long), torch.tensor([], dtype=torch.long)),
    ]
    tokens, mask, targets = collate_lm(batch, pad_id=0)
    assert IGNORE_INDEX == -100
    assert tokens.dtype == targets.dtype == torch.long and mask.dtype == torch.bool
    assert tokens.tolist() == [[5, 6, 7], [8, 0, 0], [0, 0, 0]]
    assert mask.tolist() == [[True] * 3, [True, False, False], [False] * 3]
    assert targets.tolist() == [[6, 7, -100], [9, -100, -100], [-100] * 3]
    tokens, mask, targets = collate_lm(batch[:2], 256, pad_to_multiple=4)
    assert tokens.shape == mask.shape == targets.shape == (2, 4)
    assert tokens[:, 3].tolist() == [256, 256] and targets[:, 3].tolist() == [-100, -100]
    assert collate_lm(batch[:2], 256, pad_to_multiple=3)[2].shape == (2, 3)


@pytest.mark.parametrize(
    "batch, kwargs, match",
    [
        ([], {}, "batch must hold at least one item, got an empty batch"),
        (
            [(torch.tensor([1, 2]), 0)],
            {},
            r"items must be \(tokens \(N,\), targets \(N,\)\) with 1-D targets, got <class 'int'>",
        ),
        (
            [(torch.tensor([1]), torch.tensor([1])), (torch.zeros(1, 1).long(), torch.tensor([1]))],
            {},
            r"with 1-D tokens, got torch.Size\(\[1, 1\]\) at 1",
        ),
        (
            [(torch.tensor([1, 2]), torch.zeros(2))],
            {},
            "batch targets must be integer ids, got torch.float32 at 0",
        ),
        (
            [(torch.tensor([1, 2]), torch.tensor([2]))],
            {},
            "batch targets must have the length of their tokens, got 1 targets for 2 tokens at 0",
        ),
        (
            [(torch.tensor([1]), torch.tensor([1]))],
            {"pad_to_multiple": 0},
            "pad_to_multiple must be a positive int; got 0",
        ),
    ],
)
def test_collate_lm_errors(batch, kwargs, match):
    with pytest.raises(ValueError, match=match):
        collate_lm(batch, **{"pad_id": 0, **kwargs})


def test_collate_lm_pad_id_must_be_an_int():
    with pytest.raises(TypeError, match="pad_id must be an int; got None"):
        collate_lm([(torch.tensor([1]), torch.tensor([1]))], pad_id=None)


def test_collate_images():
    batch = [(torch.rand(3, 4, 4), 1), (torch.rand(3, 4, 4), 0)]
    images, labels = collate_images(batch)
    assert images.shape == (2, 3, 4, 4) and torch.equal(images[1], batch[1][0])
    assert labels.tolist() == [1, 0] and labels.dtype == torch.long
    with pytest.raises(ValueError, match=r"share one shape, got \(3, 4, 4\) and \(3, 4, 5\) at 1"):
        collate_images([batch[0], (torch.rand(3, 4, 5), 0)])
    with pytest.raises(
        ValueError, match=r"must be \(image \(C, H, W\), label\), got torch.Size\(\[4, 4\]\) at 0"
    ):
        collate_images([(torch.rand(4, 4), 0)])
    with pytest.raises(ValueError, match="batch must hold at least one item"):
        collate_images([])
