"""The Python examples of the docs pages run as written.

docs/models.md has its own test (tests/models/test_docs.py: timm examples, registry
isolation). A block whose first line is ``# not run`` is shown, not executed.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
OWN_TESTS = {"models.md"}
BLOCKS = [
    pytest.param(block, id=f"{page.name}-{i}")
    for page in sorted(DOCS.glob("*.md"))
    if page.name not in OWN_TESTS
    for i, block in enumerate(re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S))
    if not block.startswith("# not run")
]


def test_nn_page_has_an_example():
    assert "```python" in (DOCS / "nn.md").read_text()


@pytest.mark.parametrize("block", BLOCKS)
def test_example_runs(block):
    exec(compile(block, "docs example", "exec"), {})
