"""Op tests: poison uninitialised memory so a form that reads what it never wrote fails."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo import trace_rules

_empty = torch.empty

# Dynamo maps torch's functions to its rules once per process, on first use, by looking each
# name up on the torch module (``get_torch_obj_rule_map`` is cached). Built while a test has
# ``torch.empty`` patched, the map would hold the patch, and every later compiled call of the
# real ``torch.empty`` would graph-break (seen as tests/test_compile.py failing only after
# the op tests). Building it here, before any patch, keeps the real function in it.
trace_rules.get_torch_obj_rule_map()


def _poisoned_empty(*args, **kwargs):
    t = _empty(*args, **kwargs)
    if t.is_floating_point():
        t.fill_(float("nan"))
    return t


@pytest.fixture(autouse=True)
def poison_empty(monkeypatch):
    monkeypatch.setattr(torch, "empty", _poisoned_empty)
