"""The Python examples of the docs pages run as written.

docs/models.md has its own test (tests/models/test_docs.py: timm examples, registry
isolation). A block whose first line is ``# not run`` is shown, not executed: it must
still parse, every name it imports from the package must exist, and its calls of those
names must use keywords they take. (Calls of objects the block builds, ``model(...)``, are
not checked: docs/distributed.md once showed a model called with two keywords it never
had.)
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
OWN_TESTS = {"models.md"}
PAGES = [
    (page, i, block)
    for page in sorted(DOCS.glob("*.md"))
    for i, block in enumerate(re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S))
]
BLOCKS = [
    pytest.param(block, id=f"{page.name}-{i}")
    for page, i, block in PAGES
    if page.name not in OWN_TESTS and not block.startswith("# not run")
]
SHOWN = [
    pytest.param(block, id=f"{page.name}-{i}")
    for page, i, block in PAGES
    if block.startswith("# not run")
]


def test_nn_page_has_an_example():
    assert "```python" in (DOCS / "nn.md").read_text()


@pytest.mark.parametrize("block", BLOCKS)
def test_example_runs(block):
    exec(compile(block, "docs example", "exec"), {})


def test_some_examples_are_only_shown():
    assert len(SHOWN) >= 5  # (the test below must have blocks to read)


@pytest.mark.parametrize("block", SHOWN)
def test_shown_example_names_what_exists(block):
    tree = ast.parse(block)
    imported = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("taylorshift"):
            module = importlib.import_module(node.module)
            for alias in node.names:
                assert hasattr(module, alias.name), f"{node.module} has no {alias.name}"
                imported[alias.asname or alias.name] = getattr(module, alias.name)
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
            continue
        target = imported.get(node.func.id)
        if target is None or not callable(target):
            continue
        parameters = inspect.signature(target).parameters
        if any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
            continue
        for keyword in node.keywords:
            if keyword.arg is not None:
                assert keyword.arg in parameters, f"{node.func.id} takes no {keyword.arg}="
