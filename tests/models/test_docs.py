"""The Python examples of docs/models.md run as written and their printed claims hold
(``tests.test_docs.run_example``; the timm ones only where timm imports)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from taylorshift.models import registry
from tests.test_docs import run_example

DOC = Path(__file__).resolve().parents[2] / "docs" / "models.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def _timm_importable() -> bool:
    if importlib.util.find_spec("timm") is None:
        return False
    try:
        import timm  # noqa: F401
    except ImportError:
        return False
    return True


def test_the_page_has_examples():
    assert len(BLOCKS) >= 5


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_example_runs_and_its_claims_hold(index, monkeypatch):
    block = BLOCKS[index]
    if block.startswith("# needs timm") and not _timm_importable():
        pytest.skip("this example needs timm, which is not importable here")
    monkeypatch.setattr(registry, "_MODELS", dict(registry._MODELS))  # examples register
    run_example(block, f"models.md-{index}")
