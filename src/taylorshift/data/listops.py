"""ListOps: a generator (LRA rules, and exact lengths), an evaluator, a tokenizer, TSV files.

An expression is a sequence of tokens: operators written ``[MIN``, ``[MAX``, ``[MED``,
``[SM``, ``[FIRST``, ``[LAST`` (the opening bracket belongs to the operator token), digits
``0``-``9`` and ``]``. Its *length* counts operators, closing brackets and digits, which
is also its number of token ids, e.g. ``[MAX 2 [SM 5 7 ] ]`` has length 7 and value 9.

Semantics: MIN, MAX; FIRST and LAST (first and last argument); SM = sum mod 10; MED = the
median as LRA computes it, ``int(numpy.median(args))``: the middle value of the sorted
arguments, and for an even count the mean of the two middle values rounded down (all
values are non-negative, so truncation is flooring): ``[MED 1 2 ]`` is 1, ``[MED 3 4 6 9 ]``
is 5.

Generation (LRA, ``lra_benchmarks/data/listops.py``): a node at depth 1 (the root) to
``max_depth - 1`` is an operator with probability ``OPERATOR_PROB`` = 0.25 and otherwise a
digit; nodes at ``max_depth`` are always digits; an operator takes 2..``max_args``
arguments and is drawn uniformly from the operators; digits are uniform. LRA keeps a tree
when ``min_len < length < max_len``. (LRA's code compares ``random() > 0.25`` to make a
*leaf*: a node is a digit with probability 0.75, an operator with probability 0.25, and
this module follows the code. With leaves at probability 0.25 an operator would have 4.5
operator children on average and nearly every tree would be far longer than 2000.)

Exact lengths (the TaylorShift variant, ``length=``): draw LRA trees, abandoning a draw as
soon as it grows past ``length + tol`` (``tol = max(2, length // 10)``), until one has
``|length_tree - length| <= tol``; then edit it to the exact length with small local
moves, each chosen uniformly at random: add a random digit at a random position of an
operator with fewer than ``max_args`` arguments (+1), or remove a digit argument from an
operator with more than 2 (-1); when no such operator exists, replace a digit above
``max_depth`` by a two-digit operator (+3) or an operator whose arguments are all digits by
a digit (-(k + 1)). At most 10 % of the tokens are edits, so the trees keep the shape of
LRA trees of that length, and a sample costs a few milliseconds in pure Python. The value
is computed after the edits. If no draw gets close (settings under which long trees are
rare), the closest draw is edited; settings under which a length is impossible are refused
when the dataset is built.

Tokens to ids (``data/vocab.py`` ``LISTOPS_TOKENS``): ``[OP`` and a bare ``OP`` -> the
operator's id, ``]`` -> the ``]`` id, digits -> their ids. The parentheses ``(`` ``)`` of
the official TSV files (LRA writes the binary tree it builds internally) carry no
information and are dropped, as LRA's own input pipeline drops every non-alphanumeric
character. So ids count exactly the length above, and the ``[`` id of the vocabulary is not
produced (``detokenize`` renders it as ``[``).
"""

from __future__ import annotations

import csv
import functools
import random
from collections.abc import Iterable, Sequence

import torch
from torch.utils.data import Dataset

from .._validate import check_bool, check_choice, check_int
from ._common import SPLITS, require_path, split_file
from .vocab import CLS, LISTOPS_OPERATORS, LISTOPS_TOKENS, PAD

__all__ = [
    "DEFAULT_OPERATORS",
    "LISTOPS_SPLIT_SIZES",
    "OPERATOR_PROB",
    "ListOpsDataset",
    "ListOpsTSV",
    "detokenize",
    "evaluate",
    "generate_expression",
    "reachable_lengths",
    "tokenize",
]

#: LRA's operators; FIRST and LAST are optional.
DEFAULT_OPERATORS = ("MIN", "MAX", "MED", "SM")
#: Probability that a node above ``max_depth`` is an operator (LRA's ``VALUE_P``).
OPERATOR_PROB = 0.25
#: LRA's numbers of samples per split (96k / 2k / 2k).
LISTOPS_SPLIT_SIZES = {"train": 96_000, "val": 2_000, "test": 2_000}

_MAX_DRAWS = 10_000  # LRA-tree draws before falling back to editing the closest one
_MAX_DEPTH_LIMIT = 100  # the generator and the tree value recurse once per level
_TOKEN_ID = {tok: i for i, tok in enumerate(LISTOPS_TOKENS)}
_CLOSE_ID = _TOKEN_ID["]"]
_SPECIAL_IDS = {_TOKEN_ID[PAD], _TOKEN_ID[CLS]}

# A tree node: a digit (int) or a list [operator, arg, arg, ...].
Node = int | list


def _tokens(expression: str | Iterable[str]) -> list[str]:
    tokens = expression.split() if isinstance(expression, str) else list(expression)
    return [t for t in tokens if t not in ("(", ")")]


def _operator(token: str) -> str | None:
    """``"[MAX"`` or ``"MAX"`` -> ``"MAX"``; None for anything else."""
    name = token[1:] if token.startswith("[") else token
    return name if name in LISTOPS_OPERATORS else None


def _reduce(op: str, args: list[int]) -> int:
    if op == "MIN":
        return min(args)
    if op == "MAX":
        return max(args)
    if op == "FIRST":
        return args[0]
    if op == "LAST":
        return args[-1]
    if op == "SM":
        return sum(args) % 10
    # MED: find the values of rank (n-1)//2 and n//2 by counting digits.
    counts = [0] * 10
    for a in args:
        counts[a] += 1
    ranks, found, seen = ((len(args) - 1) // 2, len(args) // 2), [], 0
    for digit, count in enumerate(counts):
        seen += count
        while len(found) < 2 and ranks[len(found)] < seen:
            found.append(digit)
    return (found[0] + found[1]) // 2


def evaluate(expression: str | Iterable[str]) -> int:
    """The value (0-9) of a ListOps expression, parsed with a stack.

    Args:
        expression: text such as ``"[MAX 2 [SM 5 7 ] ]"`` or a list of its tokens; the
            parentheses of LRA's TSV files are ignored, bare operator names (``MAX``) are
            accepted.

    Raises:
        ValueError: an unknown token, an unmatched bracket, an operator without
            arguments, or not exactly one expression.
    """
    stack: list[tuple[str, list[int]]] = []
    result: int | None = None
    for pos, token in enumerate(_tokens(expression)):
        op = _operator(token)
        if op is not None:
            stack.append((op, []))
            continue
        if token == "]":
            if not stack:
                raise ValueError(f"expression has an unmatched ']' at token {pos}")
            op, args = stack.pop()
            if not args:
                raise ValueError(f"expression has an operator {op} without arguments")
            value = _reduce(op, args)
        elif len(token) == 1 and token.isdigit():
            value = int(token)
        else:
            raise ValueError(
                f"expression tokens must be operators, digits or ']', got {token!r} at token {pos}"
            )
        if stack:
            stack[-1][1].append(value)
        elif result is None:
            result = value
        else:
            raise ValueError(f"expression must be a single expression, more follows at {pos}")
    if stack:
        raise ValueError(f"expression leaves {len(stack)} operator(s) unclosed")
    if result is None:
        raise ValueError("expression must not be empty")
    return result


def tokenize(expression: str | Iterable[str], max_len: int | None = None) -> torch.Tensor:
    """Token ids (LongTensor (N,)) of ``LISTOPS_TOKENS`` for an expression.

    ``[OP`` and bare ``OP`` give the operator's id, ``(`` and ``)`` are dropped, the result
    is cut to ``max_len`` ids when given. Unknown tokens raise ValueError.
    """
    ids = []
    for token in _tokens(expression):
        op = _operator(token)
        key = op if op is not None else token
        if key not in _TOKEN_ID or key in (PAD, CLS, "["):
            raise ValueError(f"expression tokens must be operators, digits or ']', got {token!r}")
        ids.append(_TOKEN_ID[key])
    if max_len is not None:
        ids = ids[:max_len]
    return torch.tensor(ids, dtype=torch.long)


def detokenize(ids: torch.Tensor | Sequence[int]) -> str:
    """The text of token ids: ``[MAX 2 9 ]``; ``<pad>`` and ``<cls>`` ids are skipped."""
    values = ids.tolist() if isinstance(ids, torch.Tensor) else list(ids)
    words = []
    for i in values:
        if not 0 <= i < len(LISTOPS_TOKENS):
            raise ValueError(f"ids must be in [0, {len(LISTOPS_TOKENS)}), got {i}")
        if i in _SPECIAL_IDS:
            continue
        token = LISTOPS_TOKENS[i]
        words.append("[" + token if token in LISTOPS_OPERATORS else token)
    return " ".join(words)


Intervals = list[tuple[int, int]]  # sorted, disjoint, inclusive integer ranges


def _merge(ranges: Intervals, limit: int) -> Intervals:
    out: Intervals = []
    for lo, hi in sorted(ranges):
        if lo > limit:
            break
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], min(hi, limit)))
        else:
            out.append((lo, min(hi, limit)))
    return out


@functools.lru_cache(maxsize=64)
def reachable_lengths(max_depth: int, max_args: int, limit: int) -> frozenset[int]:
    """Lengths ``<= limit`` that trees of at most ``max_depth`` levels and 2..``max_args``
    arguments per operator can have.

    From the leaves up: a subtree one level higher is a digit (1), or an operator and ``]``
    (2) around 2..``max_args`` subtrees, whose length sums are iterated sum-sets of
    intervals ([a, b] + [c, d] = [a + c, b + d]).
    """
    if max_args == 2:  # binary trees: n operators and n + 1 digits, any n < 2 ** (depth - 1)
        top = 3 * (2 ** (max_depth - 1) - 1) + 1
        return frozenset(range(1, min(top, limit) + 1, 3))
    below: Intervals = [(1, 1)]  # lengths of trees rooted at the deepest level
    for _ in range(max_depth - 1):
        sums, level = below, [(1, 1)]
        for _ in range(2, max_args + 1):  # sums of k = 2..max_args subtree lengths
            sums = _merge([(a + c, b + d) for a, b in sums for c, d in below], limit)
            level += [(a + 2, b + 2) for a, b in sums]
        below = _merge(level, limit)
    return frozenset(n for lo, hi in below for n in range(lo, hi + 1))


def _reachable(max_depth: int, max_args: int, limit: int) -> frozenset[int]:
    # rounded up to a power of two so that per-sample checks hit the cache
    return reachable_lengths(max_depth, max_args, max(64, 1 << (limit - 1).bit_length()))


def _check_tree_settings(max_depth: int, max_args: int, operators) -> tuple[str, ...]:
    check_int("max_depth", max_depth, ge=1, le=_MAX_DEPTH_LIMIT)
    check_int("max_args", max_args, ge=2)
    if isinstance(operators, str) or not isinstance(operators, Iterable):
        raise ValueError(f"operators must be a sequence of names, got {operators!r}")
    operators = tuple(operators)
    if not operators or any(op not in LISTOPS_OPERATORS for op in operators):
        raise ValueError(
            f"operators must be a non-empty sequence of {', '.join(LISTOPS_OPERATORS)}, "
            f"got {operators!r}"
        )
    return operators


def _check_window(min_len: int, max_len: int, max_depth: int, max_args: int) -> None:
    check_int("min_len", min_len, ge=0)
    check_int("max_len", max_len, ge=1)
    if not any(min_len < n < max_len for n in _reachable(max_depth, max_args, max_len)):
        raise ValueError(
            f"min_len and max_len must leave a length min_len < n < max_len that trees with "
            f"max_depth={max_depth} and max_args={max_args} can have, got min_len={min_len}, "
            f"max_len={max_len}"
        )


def _check_length(name: str, length: int, max_depth: int, max_args: int) -> None:
    check_int(name, length, ge=1)
    if length not in _reachable(max_depth, max_args, length):
        raise ValueError(
            f"{name} must be a length that trees with max_depth={max_depth} and "
            f"max_args={max_args} can have, got {length}"
        )


def _draw(rng: random.Random, depth: int, max_depth, max_args, operators, budget: int):
    """An LRA tree and its length, or None as soon as it would exceed ``budget``."""
    if depth < max_depth and rng.random() < OPERATOR_PROB:
        num_args = rng.randint(2, max_args)
        node: list = [None]
        length = 2
        for _ in range(num_args):
            drawn = _draw(rng, depth + 1, max_depth, max_args, operators, budget - length)
            if drawn is None:
                return None
            node.append(drawn[0])
            length += drawn[1]
        if length > budget:
            return None
        node[0] = rng.choice(operators)
        return node, length
    if budget < 1:
        return None
    return rng.randrange(10), 1


def _ops(root: list) -> list[list]:
    """All operator nodes below the holder ``root`` (``[None, tree]``)."""
    found, todo = [], [root]
    while todo:
        node = todo.pop()
        for child in node[1:]:
            if isinstance(child, list):
                found.append(child)
                todo.append(child)
    return found


def _expand_leaf(rng, root, max_depth, operators) -> bool:
    """Replace a random digit above ``max_depth`` by a two-digit operator (+3)."""
    spots, todo = [], [(root, 0)]
    while todo:
        node, depth = todo.pop()
        for i, child in enumerate(node[1:], 1):
            if isinstance(child, list):
                todo.append((child, depth + 1))
            elif depth + 1 < max_depth:
                spots.append((node, i))
    if not spots:
        return False
    node, i = rng.choice(spots)
    node[i] = [rng.choice(operators), rng.randrange(10), rng.randrange(10)]
    return True


def _collapse_op(rng, root) -> int:
    """Replace a random operator whose arguments are all digits by a digit; the length lost."""
    spots = [
        (node, i)
        for node in [root, *_ops(root)]
        for i, child in enumerate(node[1:], 1)
        if isinstance(child, list) and not any(isinstance(c, list) for c in child[1:])
    ]
    if not spots:
        return 0
    node, i = rng.choice(spots)
    lost = len(node[i])  # operator + ']' + k digits become one digit: k + 1 fewer
    node[i] = rng.randrange(10)
    return lost


def _edit_to_length(rng, root: list, length: int, target: int, max_depth, max_args, operators):
    """Edit the tree under ``root`` in place to ``target`` tokens; False if stuck."""
    for _ in range(4 * abs(target - length) + 64):
        if length == target:
            return True
        if length < target:
            grow = [op for op in _ops(root) if len(op) - 1 < max_args]
            while grow and length < target:
                i = rng.randrange(len(grow))
                op = grow[i]
                op.insert(rng.randint(1, len(op)), rng.randrange(10))
                length += 1
                if len(op) - 1 == max_args:
                    grow[i] = grow[-1]
                    grow.pop()
            if length < target:
                if not _expand_leaf(rng, root, max_depth, operators):
                    return False
                length += 3
        else:

            def shrinkable(op):
                return len(op) > 3 and any(not isinstance(c, list) for c in op[1:])

            shrink = [op for op in _ops(root) if shrinkable(op)]
            while shrink and length > target:
                i = rng.randrange(len(shrink))
                op = shrink[i]
                digits = [j for j, c in enumerate(op[1:], 1) if not isinstance(c, list)]
                del op[rng.choice(digits)]
                length -= 1
                if not shrinkable(op):
                    shrink[i] = shrink[-1]
                    shrink.pop()
            if length > target:
                lost = _collapse_op(rng, root)
                if not lost:
                    return False
                length -= lost
    return length == target


def _value(node: Node) -> int:
    """The value of a tree, recursively (the generator's own semantics; ``evaluate`` is the
    independent check)."""
    if not isinstance(node, list):
        return node
    op, args = node[0], [_value(c) for c in node[1:]]
    if op == "MED":
        s, n = sorted(args), len(args)
        return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) // 2
    return {
        "MIN": min,
        "MAX": max,
        "SM": lambda a: sum(a) % 10,
        "FIRST": lambda a: a[0],
        "LAST": lambda a: a[-1],
    }[op](args)


def _flatten(node: Node, out: list[str]) -> list[str]:
    if isinstance(node, list):
        out.append("[" + node[0])
        for child in node[1:]:
            _flatten(child, out)
        out.append("]")
    else:
        out.append(str(node))
    return out


def _exact_tree(rng, target, max_depth, max_args, operators) -> Node:
    tol = max(2, target // 10)
    for _ in range(100):
        best, best_len = 0, 1  # a digit, if no draw gets anywhere
        for _ in range(_MAX_DRAWS):
            drawn = _draw(rng, 1, max_depth, max_args, operators, target + tol)
            if drawn is None:
                continue
            if drawn[1] > best_len:
                best, best_len = drawn
            if best_len >= target - tol:
                break
        root = [None, best]
        if _edit_to_length(rng, root, best_len, target, max_depth, max_args, operators):
            return root[1]
    raise RuntimeError(  # pragma: no cover - the edits reach every reachable length
        f"could not build a tree of length {target} (max_depth={max_depth}, max_args={max_args})"
    )


def _generate(rng, min_len, max_len, length, max_depth, max_args, operators):
    """``generate_expression`` without the argument checks."""
    if length is None:
        for _ in range(_MAX_DRAWS):
            drawn = _draw(rng, 1, max_depth, max_args, operators, max_len - 1)
            if drawn is not None and drawn[1] > min_len:
                return _flatten(drawn[0], []), _value(drawn[0])
        # long trees are rare under these settings: edit one to a random allowed length
        allowed = _reachable(max_depth, max_args, max_len)
        length = rng.choice(sorted(n for n in allowed if min_len < n < max_len))
    tree = _exact_tree(rng, length, max_depth, max_args, operators)
    return _flatten(tree, []), _value(tree)


def generate_expression(
    rng: random.Random,
    *,
    min_len: int = 500,
    max_len: int = 2000,
    length: int | None = None,
    max_depth: int = 10,
    max_args: int = 10,
    operators: Sequence[str] = DEFAULT_OPERATORS,
) -> tuple[list[str], int]:
    """One random ListOps expression and its value.

    Args:
        rng: the source of randomness (``random.Random``); the same state gives the same
            expression.
        min_len, max_len: LRA's rule, keep a tree when ``min_len < length < max_len``.
        length: instead, an exact length (the TaylorShift variant; ``min_len`` and
            ``max_len`` are then ignored).
        max_depth: levels of the tree (the root is level 1; level ``max_depth`` holds digits).
        max_args: most arguments of an operator (at least 2).
        operators: names drawn from, uniformly (``"MIN"``, ``"MAX"``, ``"MED"``, ``"SM"``,
            ``"FIRST"``, ``"LAST"``).

    Returns:
        ``(tokens, value)``: tokens such as ``["[MAX", "2", "9", "]"]``, value in 0-9.

    Raises:
        ValueError: bad settings, or lengths that no tree of these settings has.
    """
    operators = _check_tree_settings(max_depth, max_args, operators)
    if length is None:
        _check_window(min_len, max_len, max_depth, max_args)
    else:
        _check_length("length", length, max_depth, max_args)
    return _generate(rng, min_len, max_len, length, max_depth, max_args, operators)


class ListOpsDataset(Dataset):
    """ListOps samples generated on the fly: ``(tokens (N,) long, label)``.

    Sample ``i`` of a split is a pure function of ``(seed, split, i)`` and the settings (its
    random stream is seeded with that text), so every worker and rank sees the same data
    and the splits draw from disjoint streams.

    Args:
        split: ``"train"``, ``"val"`` or ``"test"``.
        num_samples: samples in the split; default LRA's 96k / 2k / 2k.
        min_len, max_len: LRA's length rule ``min_len < length < max_len``; with
            ``exact_length`` the lengths are exactly uniform over ``[min_len, max_len]``.
        exact_length: the TaylorShift variant (exact lengths, see the module docs).
        max_depth, max_args, operators: as in ``generate_expression``.
        seed: selects the data set.
    """

    def __init__(
        self,
        split: str = "train",
        *,
        num_samples: int | None = None,
        min_len: int = 500,
        max_len: int = 2000,
        exact_length: bool = False,
        max_depth: int = 10,
        max_args: int = 10,
        operators: Sequence[str] = DEFAULT_OPERATORS,
        seed: int = 0,
    ) -> None:
        self.split = check_choice("split", split, SPLITS)
        if num_samples is None:
            num_samples = LISTOPS_SPLIT_SIZES[split]
        self.num_samples = check_int("num_samples", num_samples, ge=1)
        self.exact_length = check_bool("exact_length", exact_length)
        self.operators = _check_tree_settings(max_depth, max_args, operators)
        if self.exact_length:
            check_int("min_len", min_len, ge=1)
            check_int("max_len", max_len, ge=min_len)
            allowed = _reachable(max_depth, max_args, max_len)
            missing = [n for n in range(min_len, max_len + 1) if n not in allowed]
            if missing:
                raise ValueError(
                    f"min_len..max_len must hold only lengths that trees with max_depth="
                    f"{max_depth} and max_args={max_args} can have (max_args >= 4 and a deep "
                    f"enough tree reach every length >= 4), got {len(missing)} impossible, "
                    f"e.g. {missing[:5]}"
                )
        else:
            _check_window(min_len, max_len, max_depth, max_args)
        self.min_len, self.max_len = min_len, max_len
        self.max_depth, self.max_args = max_depth, max_args
        self.seed = check_int("seed", seed)
        self.num_classes = 10

    def __len__(self) -> int:
        return self.num_samples

    def expression(self, index: int) -> tuple[list[str], int]:
        """Sample ``index`` as text tokens and its value."""
        if not -self.num_samples <= index < self.num_samples:
            raise IndexError(f"index must be in [0, {self.num_samples}), got {index}")
        index %= self.num_samples
        rng = random.Random(f"taylorshift-listops/{self.seed}/{self.split}/{index}")
        length = rng.randint(self.min_len, self.max_len) if self.exact_length else None
        return _generate(
            rng, self.min_len, self.max_len, length, self.max_depth, self.max_args, self.operators
        )

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        tokens, value = self.expression(index)
        return torch.tensor([_TOKEN_ID[_operator(t) or t] for t in tokens]), value


class ListOpsTSV(Dataset):
    """The official LRA ListOps files: ``(tokens (N,) long, label)``.

    Args:
        path: a TSV file, or a folder with ``basic_train.tsv``, ``basic_val.tsv`` and
            ``basic_test.tsv`` (LRA's ``lra_release/listops-1000``).
        split: which file of a folder.
        max_len: tokens kept per expression (LRA: 2000); None keeps all.

    The file starts with the header ``Source<TAB>Target``; each row holds an expression
    and its value 0-9. Rows are tokenized when read (``tokenize``).
    """

    def __init__(self, split: str = "train", *, path=None, max_len: int | None = 2000) -> None:
        check_choice("split", split, SPLITS)
        folder = require_path("listops-tsv", path)
        self.path = split_file("listops-tsv", folder, split, [f"basic_{split}.tsv"])
        self.single_file = folder.is_file()  # the same file serves any split asked for
        self.max_len = check_int("max_len", max_len, ge=1, allow_none=True)
        self.sources: list[str] = []
        self.ids: list[torch.Tensor] = []
        self.labels: list[int] = []
        try:
            self._read()
        except UnicodeDecodeError as err:
            where = f" (after line {self._line})" if self._line else ""
            raise ValueError(f"{self.path} must be UTF-8 text{where}: {err}") from None
        if not self.labels:
            raise ValueError(
                f"{self.path} must hold at least one expression under its header; got none"
            )
        self.num_classes = 10

    def _read(self) -> None:
        """Read and tokenize the rows (``self._line``: the last line read whole)."""
        self._line = 0
        with open(self.path, newline="", encoding="utf-8") as f:
            rows = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
            header = next(rows, None)
            if header is None or [h.strip() for h in header] != ["Source", "Target"]:
                raise ValueError(
                    f"{self.path} must start with the header 'Source\\tTarget', got {header!r}"
                )
            self._line = 1
            for line, row in enumerate(rows, 2):
                self._line = line
                if not row:
                    continue
                if len(row) != 2 or row[1].strip() not in tuple("0123456789"):
                    raise ValueError(
                        f"{self.path} line {line} must be '<expression>\\t<digit>', got {row!r}"
                    )
                try:  # tokenized once, here: a bad token names its file and line
                    ids = tokenize(row[0], self.max_len)
                except ValueError as err:
                    raise ValueError(f"{self.path} line {line}: {err}") from None
                for left, right in ("[]", "()"):  # a cut or garbled row (cheap: str.count)
                    opened, closed = row[0].count(left), row[0].count(right)
                    if opened != closed:
                        raise ValueError(
                            f"{self.path} line {line}: the expression is not complete: "
                            f"{opened} '{left}' vs {closed} '{right}'"
                        )
                self.sources.append(row[0])
                self.ids.append(ids.to(torch.uint8))  # (LISTOPS_TOKENS has < 256 ids)
                self.labels.append(int(row[1]))

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.ids[index].long(), self.labels[index]
