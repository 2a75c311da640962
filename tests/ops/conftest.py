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
# Its other lazily built sets (allowed and skipped callables, by id) likewise: a compiled
# call of torch.empty builds every one of them now, with the real function.
torch.compile(lambda x: torch.empty(2).fill_(1.0) + x, backend="eager", fullgraph=True)(
    torch.zeros(2)
)
torch._dynamo.reset()


def _poisoned_empty(*args, **kwargs):
    t = _empty(*args, **kwargs)
    if t.is_floating_point():
        t.fill_(float("nan"))
    return t


@pytest.fixture(autouse=True)
def poison_empty(monkeypatch):
    monkeypatch.setattr(torch, "empty", _poisoned_empty)
