"""Op tests: poison uninitialised memory so a form that reads what it never wrote fails."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import forget_what_dynamo_saw

_empty = torch.empty


def _poisoned_empty(*args, **kwargs):
    t = _empty(*args, **kwargs)
    if t.is_floating_point():
        t.fill_(float("nan"))
    return t


@pytest.fixture(autouse=True)
def poison_empty(monkeypatch):
    monkeypatch.setattr(torch, "empty", _poisoned_empty)
    yield
    forget_what_dynamo_saw()
