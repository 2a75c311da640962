"""The Python examples of the docs pages run as written, and what they claim holds.

Running a block (``run_example``) checks what its comments claim:

- A ``print(...)`` whose last line ends in a comment claims the comment shows what it
  prints: the comment is the printed text, or starts with it and goes on after ``:``, ``;``
  or `` and `` (``# [True, False]: the second is dominated``), or ends with it after a
  label and ``: `` (``# throughput: [False, True]``); ``# ... text`` claims the printed
  text holds ``text``. Runs of spaces count as one, a ``torch.Size`` may be written as a
  tuple and a tensor without its ``dtype=``, and a claim may show the first of several
  printed values only. A claimed print must run (one in an ``except`` branch: the error
  must come). Comments that describe a print instead of showing it are listed in ``PROSE``.
- Comment lines ``# LEVEL:logger:message`` (continued on lines ``#   ...``) show log
  records, ``...`` standing for any text. They are alternatives (``# or, with ...:``): one
  of them must be logged.
- A block whose comments claim nothing checkable has its claims checked here
  (``EXTRA_CHECKS``).

Every run block must check something: an ``assert``, an ``assert_*`` call, a claim or an
extra check. The logging set up by a block (``logging.basicConfig``, levels) is put back.

docs/models.md has its own test (tests/models/test_docs.py: timm examples, registry
isolation), through ``run_example``. A block whose first line is ``# not run`` is shown,
not executed: it must still parse, every name it imports from the package must exist, and
its calls of those names must use keywords they take. (Calls of objects the block builds,
``model(...)``, are not checked: docs/distributed.md once showed a model called with two
keywords it never had.)
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import importlib
import inspect
import io
import itertools
import logging
import re
import sys
import tokenize
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

DOCS = Path(__file__).resolve().parents[1] / "docs"
OWN_TESTS = {"models.md"}
PAGES = [
    (page, i, block)
    for page in sorted(DOCS.glob("*.md"))
    for i, block in enumerate(re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S))
]
BLOCKS = [
    pytest.param(block, f"{page.name}-{i}", id=f"{page.name}-{i}")
    for page, i, block in PAGES
    if page.name not in OWN_TESTS and not block.startswith("# not run")
]
SHOWN = [
    pytest.param(block, id=f"{page.name}-{i}")
    for page, i, block in PAGES
    if block.startswith("# not run")
]

# Comments on prints that say what the printed value means, not what it is.
PROSE = frozenset(
    {
        "per rank, one layer",  # distributed.md: bytes_per_rank's dict in MiB
        "ring sends less below N*",  # distributed.md: EXTRA_CHECKS checks it
        "-100 positions ignored",  # data.md: the loss of random logits
    }
)
CLAIM_SEPARATORS = (":", ";", " and ")
LOG_CLAIM = re.compile(r"#\s*(DEBUG|INFO|WARNING|ERROR|CRITICAL):[\w.]+:.*")
LOG_CONTINUED = re.compile(r"#\s{2,}\S.*")


def _normal(text: str) -> str:
    return " ".join(text.split())


def _renderings(value: object) -> list[str]:
    """The ways a claim may write a printed value: as printed, a Size as a tuple, a tensor
    without its dtype."""
    text = _normal(str(value))
    if isinstance(value, torch.Size):
        return [text, str(tuple(value))]
    if isinstance(value, torch.Tensor):
        return [text, re.sub(r", dtype=torch\.\w+\)$", ")", text)]
    return [text]


def _printed(args: tuple, sep: str | None) -> tuple[str, set[str]]:
    """What a print shows, and what a claim of it may say (the first k values, k >= 1)."""
    sep = " " if sep is None else sep
    shown = _normal(sep.join(map(str, args)))
    candidates = set()
    for k in range(1, len(args) + 1):
        for parts in itertools.product(*(_renderings(a) for a in args[:k])):
            candidates.add(_normal(sep.join(parts)))
    return shown, candidates


def _claim_holds(claim: str, shown: str, candidates: set[str]) -> bool:
    if claim.startswith("... "):
        return claim[4:] in shown
    for text in candidates:
        if claim == text or claim.endswith(": " + text):
            return True
        if any(claim.startswith(text + s) for s in CLAIM_SEPARATORS):
            return True
    return False


def _print_claims(block: str, tree: ast.AST) -> dict[tuple[int, int], str]:
    """(first line, last line) of each print with a comment after it -> the comment."""
    comments = {
        tok.start[0]: _normal(tok.string.removeprefix("#"))
        for tok in tokenize.generate_tokens(io.StringIO(block).readline)
        if tok.type == tokenize.COMMENT
    }
    claims = {}
    for node in ast.walk(tree):
        call = node.value if isinstance(node, ast.Expr) else None
        if not (isinstance(call, ast.Call) and getattr(call.func, "id", None) == "print"):
            continue
        comment = comments.get(node.end_lineno)
        if comment is not None and comment not in PROSE:
            claims[(node.lineno, node.end_lineno)] = comment
    return claims


def _log_claims(block: str) -> list[str]:
    """The log records a block's comments show, as ``LEVEL:logger:message``."""
    claims, open_claim = [], False
    for line in block.splitlines():
        text = line.strip()
        if LOG_CLAIM.fullmatch(text):
            claims.append(_normal(text[1:]))
            open_claim = True
        elif open_claim and LOG_CONTINUED.fullmatch(text):
            claims[-1] += " " + _normal(text[1:])
        else:
            open_claim = False
    return claims


def _assertions(tree: ast.AST) -> int:
    """The block's own checks: ``assert`` statements and calls of ``assert*`` functions."""
    count = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Assert):
            count += 1
        elif isinstance(node, ast.Call):
            name = getattr(node.func, "attr", None) or getattr(node.func, "id", "")
            count += name.startswith("assert")
    return count


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.NOTSET)
        self.shown: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.shown.append(_normal(f"{record.levelname}:{record.name}:{record.getMessage()}"))


@contextlib.contextmanager
def _logging_put_back():
    """The root logger's handlers and level, and every logger's level, as they were."""
    loggers = logging.Logger.manager.loggerDict
    levels = {n: lg.level for n, lg in loggers.items() if isinstance(lg, logging.Logger)}
    root_level, root_handlers = logging.root.level, list(logging.root.handlers)
    try:
        yield
    finally:
        logging.root.handlers[:] = root_handlers
        logging.root.setLevel(root_level)
        for name, logger in list(loggers.items()):
            if isinstance(logger, logging.Logger) and logger.level != levels.get(name, 0):
                logger.setLevel(levels.get(name, logging.NOTSET))


def run_example(block: str, name: str, extra_check: Callable[[dict], None] | None = None):
    """Run a docs block, check what its comments claim, then ``extra_check(namespace)``.

    Returns the block's namespace. Fails if a claim is false, a claimed print never runs,
    or the block checks nothing.
    """
    filename = f"docs example {name}"
    tree = ast.parse(block)
    claims = _print_claims(block, tree)
    printed: dict[tuple[int, int], list[tuple[str, set[str]]]] = {span: [] for span in claims}

    def recording_print(*args, sep=None, end=None, file=None, flush=False):
        frame = sys._getframe(1)
        if frame.f_code.co_filename == filename:
            for first, last in claims:
                if first <= frame.f_lineno <= last:
                    printed[(first, last)].append(_printed(args, sep))
        builtins.print(*args, sep=sep, end=end, file=file, flush=flush)

    namespace = {"print": recording_print}
    records = _Records()
    with _logging_put_back():
        logging.root.addHandler(records)
        exec(compile(block, filename, "exec"), namespace)

    for span, claim in claims.items():
        where = f"{name}, line {span[0]}: the print claims {claim!r}"
        assert printed[span], f"{where}, but it never ran"
        for shown, candidates in printed[span]:
            assert _claim_holds(claim, shown, candidates), f"{where}; it printed {shown!r}"
    shown_records = _log_claims(block)
    if shown_records:
        patterns = [
            re.compile(".*".join(map(re.escape, record.split("..."))), re.S)
            for record in shown_records
        ]
        assert any(p.fullmatch(r) for p in patterns for r in records.shown), (
            f"{name}: logged none of the records its comments show, {shown_records}; it "
            f"logged {records.shown}"
        )
    if extra_check is not None:
        extra_check(namespace)
    checks = _assertions(tree) + len(claims) + bool(shown_records) + (extra_check is not None)
    assert checks, f"{name} checks nothing: add an assert or a claimed print, or EXTRA_CHECKS"
    return namespace


# ---- The claims of blocks that show no checkable output --------------------------------


def _ring_sends_less_below_the_crossover(ns: dict) -> None:
    """distributed.md: below ``crossover_tokens`` ring attention sends fewer bytes, above
    it more (forward alone, and forward + backward)."""
    star = ns["crossover_tokens"](64, 64, ranks=8, causal=True)
    for key, passes in (("forward", ["forward"]), ("forward_backward", ["forward", "backward"])):
        for n, ring_less in ((0.9 * star[key], True), (1.1 * star[key], False)):
            sent = ns["bytes_per_rank"](round(n), 64, 64, heads=8, ranks=8, causal=True)
            ring = sum(sent[f"ring_{p}"] for p in passes)
            ours = sum(sent[f"ours_{p}"] for p in passes)
            assert (ring < ours) == ring_less, f"{key} at N={round(n)}: {sent}"


def _padded_keys_change_no_real_token(ns: dict) -> None:
    """nn.md: ``attn_mask`` True = real token: row 1's padded tokens change none of its
    real tokens' outputs, which are those of the row's real tokens alone."""
    attn, x, pad = ns["attn"], ns["x"], ns["pad"]
    real = int(pad[1].sum())
    assert pad[1, :real].all() and real < pad.shape[1]
    y = attn(x, attn_mask=pad)
    assert y.shape == x.shape  # (B, N, dim)
    torch.testing.assert_close(y[1, :real], attn(x[1:, :real])[0], rtol=1e-4, atol=1e-5)


def _causal_outputs_ignore_later_tokens(ns: dict) -> None:
    """nn.md: with ``is_causal=True`` no output depends on a later token."""
    attn, cut = ns["attn"], 60
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 100, 64, generator=g)
    later = x.clone()
    later[:, cut:] = torch.randn(2, 100 - cut, 64, generator=g)
    y, y_later = attn(x, is_causal=True), attn(later, is_causal=True)
    assert y.shape == x.shape  # (B, N, dim)
    torch.testing.assert_close(y_later[:, :cut], y[:, :cut])
    assert not torch.allclose(y_later[:, cut:], y[:, cut:])  # (the change is seen)


EXTRA_CHECKS: dict[str, Callable[[dict], None]] = {
    "distributed.md-4": _ring_sends_less_below_the_crossover,
    "nn.md-0": _padded_keys_change_no_real_token,
    "nn.md-1": _causal_outputs_ignore_later_tokens,
    "nn.md-2": _causal_outputs_ignore_later_tokens,
}


def test_nn_page_has_an_example():
    assert "```python" in (DOCS / "nn.md").read_text()


@pytest.mark.parametrize(("block", "name"), BLOCKS)
def test_example_runs_and_its_claims_hold(block, name):
    run_example(block, name, EXTRA_CHECKS.get(name))


def test_extra_checks_and_prose_name_what_the_docs_hold():
    names = {p.values[1] for p in BLOCKS}
    assert set(EXTRA_CHECKS) <= names, sorted(set(EXTRA_CHECKS) - names)
    comments = set()
    for _, _, block in PAGES:
        for tok in tokenize.generate_tokens(io.StringIO(block).readline):
            if tok.type == tokenize.COMMENT:
                comments.add(_normal(tok.string.removeprefix("#")))
    assert not PROSE - comments, sorted(PROSE - comments)


def test_claims_are_read_as_written():
    # the rules of the module docstring, each able to fail
    shown, candidates = _printed((torch.Size([2, 3]), 7), None)
    assert _claim_holds("(2, 3) 7", shown, candidates)
    assert _claim_holds("torch.Size([2, 3]): (B, N)", shown, candidates)
    assert not _claim_holds("(2, 4)", shown, candidates)
    assert not _claim_holds("(2, 3) 8", shown, candidates)
    shown, candidates = _printed((torch.tensor([12.0, 9.0], dtype=torch.float64),), None)
    assert _claim_holds("tensor([12., 9.]) and a constant size", shown, candidates)
    assert not _claim_holds("tensor([12., 8.])", shown, candidates)
    shown, candidates = _printed(([False, True],), None)
    assert _claim_holds("throughput: [False, True]", shown, candidates)
    assert not _claim_holds("[False, True, True]", shown, candidates)
    shown, candidates = _printed((False,), None)
    assert not _claim_holds("True", shown, candidates)
    shown, candidates = _printed((ValueError("f.st holds a model of depth 1"),), None)
    assert _claim_holds("... holds a model", shown, candidates)
    assert not _claim_holds("... holds a model of depth 2", shown, candidates)
    block = "print(1 + 1)  # 3\n"
    with pytest.raises(AssertionError, match=r"claims '3'; it printed '2'"):
        run_example(block, "probe")
    with pytest.raises(AssertionError, match=r"never ran"):
        run_example("if False:\n    print(2)  # 2\n", "probe")
    with pytest.raises(AssertionError, match=r"checks nothing"):
        run_example("x = 1\n", "probe")
    logged = "import logging\nlogging.getLogger('probe').warning('said %d', 2)\n"
    run_example(logged + "# WARNING:probe:said ...\n", "probe")
    with pytest.raises(AssertionError, match=r"logged none"):
        run_example(logged + "# WARNING:probe:said 3\n", "probe")


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
