"""Task kinds: collate, unpack and losses of each kind; the flags training asks."""

from __future__ import annotations

import pickle

import pytest
import torch
import torch.nn.functional as F

from taylorshift.data import IGNORE_INDEX, TaskKind, get_kind, get_task, list_tasks
from taylorshift.data.kinds import KINDS


def test_every_task_has_the_behaviour_of_its_kind():
    assert KINDS == ("tokens", "image", "lm")
    for name in list_tasks():
        spec = get_task(name)
        assert isinstance(spec.behaviour, TaskKind) and spec.behaviour.name == spec.kind
        assert spec.behaviour is get_kind(spec.kind)
    flags = {k: (get_kind(k).takes_tokens, get_kind(k).per_token, get_kind(k).causal_lm)
             for k in KINDS}  # fmt: skip
    assert flags == {
        "tokens": (True, False, False),
        "image": (False, False, False),
        "lm": (True, True, True),
    }
    with pytest.raises(ValueError, match=r"kind must be one of \('tokens', 'image', 'lm'\), "
                       r"got 'text'"):  # fmt: skip
        get_kind("text")


@pytest.mark.parametrize("name", KINDS)
def test_collate_then_unpack_gives_inputs_labels_and_real_tokens(name):
    kind = get_kind(name)
    if name == "image":
        items = [(torch.rand(3, 4, 4), 1), (torch.rand(3, 4, 4), 0)]
    elif name == "tokens":
        items = [(torch.tensor([1, 2, 3]), 1), (torch.tensor([4]), 0)]
    else:
        items = [(torch.tensor([1, 2, 3]), torch.tensor([2, 3, IGNORE_INDEX])),
                 (torch.tensor([4]), torch.tensor([5]))]  # fmt: skip
    collate = pickle.loads(pickle.dumps(kind.collate(9, pad_to_multiple=4)))
    inputs, labels, tokens = kind.unpack(collate(items), torch.device("cpu"))
    if name == "image":
        assert len(inputs) == 1 and inputs[0].shape == (2, 3, 4, 4) and tokens is None
        assert labels.tolist() == [1, 0]
        return
    ids, mask = inputs
    assert ids.shape == mask.shape == (2, 4) and int(tokens) == 4
    assert ids[1].tolist() == [4, 9, 9, 9]
    if name == "tokens":
        assert labels.tolist() == [1, 0]
    else:
        assert labels.tolist() == [[2, 3, IGNORE_INDEX, IGNORE_INDEX], [5] + [IGNORE_INDEX] * 3]


def test_losses_per_sample_and_per_token():
    torch.manual_seed(0)
    logits, labels = torch.randn(4, 5), torch.tensor([0, 3, IGNORE_INDEX, 1])
    loss, correct, scored = get_kind("tokens").losses(logits.bfloat16(), labels)
    assert loss.dtype == torch.float32 and int(scored) == 3
    expected = F.cross_entropy(
        logits.bfloat16().float()[[0, 1, 3]], labels[[0, 1, 3]], reduction="sum"
    )
    assert torch.allclose(loss, expected)
    assert int(correct) == int((logits[[0, 1, 3]].argmax(-1) == labels[[0, 1, 3]]).sum())

    lm_logits, targets = torch.randn(2, 3, 5), torch.tensor([[1, 2, IGNORE_INDEX], [0, 4, 4]])
    loss, correct, scored = get_kind("lm").losses(lm_logits, targets)
    flat = get_kind("tokens").losses(lm_logits.flatten(0, 1), targets.flatten())
    assert int(scored) == 5 and all(
        torch.equal(a, b) for a, b in zip((loss, correct, scored), flat, strict=True)
    )
