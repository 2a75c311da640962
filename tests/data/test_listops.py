"""ListOps: evaluator on known answers, generator against the evaluator, lengths,
determinism, tokenizer and TSV files."""

from __future__ import annotations

import pickle
import random

import pytest
import torch

from taylorshift.data import listops
from taylorshift.data.listops import (
    ListOpsDataset,
    ListOpsTSV,
    detokenize,
    evaluate,
    generate_expression,
    reachable_lengths,
    tokenize,
)
from taylorshift.data.vocab import LISTOPS_TOKENS, LISTOPS_VOCAB_SIZE


@pytest.mark.parametrize(
    "text, value",
    [
        ("[MAX 2 9 ]", 9),
        ("[MIN 4 1 7 ]", 1),
        ("[SM 5 7 ]", 2),
        ("[SM 9 9 9 ]", 7),
        ("[FIRST 3 8 1 ]", 3),
        ("[LAST 3 8 1 ]", 1),
        ("[MED 4 1 7 ]", 4),
        ("[MED 1 2 ]", 1),  # even count: mean of the two middle values, rounded down
        ("[MED 3 4 6 9 ]", 5),
        ("[MED 9 9 0 0 ]", 4),
        ("[MAX 2 [SM 5 7 ] ]", 2),
        ("[MIN [MAX 1 8 ] [MED 2 6 9 ] 7 ]", 6),
        ("[SM [MAX 2 9 ] [MIN 4 3 ] [FIRST 7 [LAST 1 5 ] ] ]", 9),  # 9 + 3 + 7 = 19
        ("7", 7),
        ("( ( ( [MAX 2 ) 9 ) ] )", 9),  # LRA's TSV form
        ("MAX 2 9 ]", 9),  # LRA's tokenizer form without '['
    ],
)
def test_evaluate_known_answers(text, value):
    assert evaluate(text) == value
    assert evaluate(text.split()) == value


@pytest.mark.parametrize(
    "text, match",
    [
        ("[MAX 2 9 ] ]", r"unmatched '\]' at token 4"),
        ("[MAX 2 [MIN 9 ]", r"leaves 1 operator\(s\) unclosed"),
        ("[MAX ]", "operator MAX without arguments"),
        ("[MAX 12 ]", r"must be operators, digits or '\]', got '12' at token 1"),
        ("[ADD 1 2 ]", "got '\\[ADD'"),
        ("1 2", "must be a single expression, more follows at 1"),
        ("", "must not be empty"),
    ],
)
def test_evaluate_errors(text, match):
    with pytest.raises(ValueError, match=match):
        evaluate(text)


def test_tokenize_ids_and_round_trip():
    ids = tokenize("( ( [MAX 2 ) [SM 5 7 ] ] )")
    assert ids.dtype == torch.long
    expected = ["MAX", "2", "SM", "5", "7", "]", "]"]
    assert ids.tolist() == [LISTOPS_TOKENS.index(t) for t in expected]
    assert detokenize(ids) == "[MAX 2 [SM 5 7 ] ]"
    assert detokenize([0, 1, *ids.tolist(), 0]) == "[MAX 2 [SM 5 7 ] ]"  # pad, cls skipped
    assert tokenize("MAX 2 9 ]").tolist() == tokenize("[MAX 2 9 ]").tolist()
    assert tokenize("[MAX 2 9 ]", max_len=2).tolist() == tokenize("[MAX 2").tolist()
    assert detokenize([18]) == "["


def test_tokenize_and_detokenize_errors():
    with pytest.raises(ValueError, match=r"must be operators, digits or '\]', got '\['"):
        tokenize("[ MAX 2 9 ]")
    with pytest.raises(ValueError, match="got '<pad>'"):
        tokenize(["<pad>"])
    with pytest.raises(ValueError, match=r"ids must be in \[0, 20\), got 20"):
        detokenize([20])


@pytest.mark.parametrize("exact", [False, True], ids=["lra", "exact"])
def test_generated_labels_match_the_evaluator(exact):
    ds = ListOpsDataset("train", num_samples=12, exact_length=exact)
    for i in range(len(ds)):
        tokens, value = ds.expression(i)
        assert evaluate(tokens) == value
        ids, label = ds[i]
        assert label == value and ids.dtype == torch.long and ids.dim() == 1
        assert int(ids.min()) >= 0 and int(ids.max()) < LISTOPS_VOCAB_SIZE
        assert detokenize(ids) == " ".join(tokens)
        assert 500 <= len(ids) <= 2000
        if not exact:
            assert 500 < len(ids) < 2000


def test_small_trees_all_operators_match_the_evaluator():
    """Many small trees reach every operator with odd and even argument counts."""
    ops = ("MIN", "MAX", "MED", "SM", "FIRST", "LAST")
    ds = ListOpsDataset(
        "test", num_samples=300, min_len=3, max_len=60, max_depth=4, max_args=5, operators=ops
    )
    seen = set()
    for i in range(len(ds)):
        tokens, value = ds.expression(i)
        assert evaluate(tokens) == value
        assert 3 < len(tokens) < 60
        assert max(_depths(tokens)) <= 3  # operators live above max_depth
        seen |= {t for t in tokens if t.startswith("[")}
    assert seen == {"[" + op for op in ops}


def _depths(tokens):
    depth, out = 0, []
    for t in tokens:
        if t.startswith("["):
            depth += 1
            out.append(depth)
        elif t == "]":
            depth -= 1
    return out


@pytest.mark.parametrize(
    "max_depth, max_args, lengths",
    [
        (3, 4, range(4, 27)),
        (10, 10, [4, 5, 17, 101, 500, 1999, 2000]),
        (6, 3, [4, 5, 7, 30]),
        (10, 2, [1, 4, 7, 31, 301]),  # binary trees: lengths 3n + 1
    ],
    ids=["D3-A4", "D10-A10", "D6-A3", "D10-A2"],
)
def test_exact_lengths(max_depth, max_args, lengths):
    rng = random.Random(0)
    for length in lengths:
        tokens, value = generate_expression(
            rng, length=length, max_depth=max_depth, max_args=max_args
        )
        assert len(tokens) == length
        assert evaluate(tokens) == value
        assert max(_depths(tokens), default=0) < max_depth


def test_exact_length_dataset_is_uniform_over_the_range():
    ds = ListOpsDataset(
        "val", num_samples=200, min_len=4, max_len=12, max_depth=3, exact_length=True
    )
    lengths = [len(ds.expression(i)[0]) for i in range(len(ds))]
    assert set(lengths) == set(range(4, 13))


def test_fallback_when_long_trees_are_rare(monkeypatch):
    """With too few draws the generator edits its closest tree instead of looping."""
    monkeypatch.setattr(listops, "_MAX_DRAWS", 1)
    rng = random.Random(1)
    for _ in range(20):
        tokens, value = generate_expression(rng, min_len=40, max_len=60, max_depth=5, max_args=5)
        assert 40 < len(tokens) < 60 and evaluate(tokens) == value
        tokens, value = generate_expression(rng, length=77, max_depth=5, max_args=5)
        assert len(tokens) == 77 and evaluate(tokens) == value


def _brute_lengths(levels, max_args, limit):
    """Plain set enumeration: lengths of trees with at most ``levels`` levels."""
    if levels == 1:
        return {1}
    below, out, sums = _brute_lengths(levels - 1, max_args, limit), {1}, {0}
    for k in range(1, max_args + 1):
        sums = {s + b for s in sums for b in below if s + b <= limit}
        if k >= 2:
            out |= {s + 2 for s in sums if s + 2 <= limit}
    return out


@pytest.mark.parametrize("max_depth", [1, 2, 3, 4])
@pytest.mark.parametrize("max_args", [2, 3, 4, 5])
def test_reachable_lengths_match_enumeration(max_depth, max_args):
    assert reachable_lengths(max_depth, max_args, 80) == _brute_lengths(max_depth, max_args, 80)


def test_reachable_lengths():
    assert reachable_lengths(1, 10, 50) == {1}
    assert reachable_lengths(2, 4, 50) == {1, 4, 5, 6}
    assert 6 not in reachable_lengths(10, 3, 50)  # one operator holds at most 3 digits
    assert set(range(4, 51)) <= reachable_lengths(10, 4, 50)
    assert max(reachable_lengths(3, 4, 100)) == 2 + 4 * 6


def test_determinism_and_disjoint_splits():
    kwargs = dict(num_samples=4, min_len=20, max_len=200, max_depth=6)
    a, b = ListOpsDataset("train", **kwargs), ListOpsDataset("train", **kwargs)
    assert all(torch.equal(a[i][0], b[i][0]) for i in range(4))
    assert torch.equal(a[3][0], a[-1][0])
    assert torch.equal(a[2][0], pickle.loads(pickle.dumps(a))[2][0])  # DataLoader workers
    other = [ListOpsDataset("val", **kwargs), ListOpsDataset("train", seed=1, **kwargs)]
    for ds in other:
        assert all(not torch.equal(a[i][0], ds[i][0]) for i in range(4))
    assert len({tuple(a[i][0].tolist()) for i in range(4)}) == 4


def test_samples_are_pinned():
    """The random streams are part of the data set: a change here changes every split."""
    ds = ListOpsDataset("train", num_samples=2, min_len=4, max_len=30, max_depth=3, max_args=4)
    assert ds.expression(0) == (["[MED", "[SM", "4", "3", "]", "6", "3", "]"], 6)
    assert ds.expression(1) == (["[MIN", "[MAX", "2", "7", "]", "6", "]"], 6)


def test_default_split_sizes():
    assert [len(ListOpsDataset(s)) for s in ("train", "val", "test")] == [96_000, 2_000, 2_000]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(split="dev"), "split must be one of 'train', 'val', 'test'; got 'dev'"),
        (dict(num_samples=0), "num_samples must be a positive int; got 0"),
        (dict(max_depth=0), r"max_depth must be an int in \[1, 100\]; got 0"),
        (dict(max_depth=101), r"max_depth must be an int in \[1, 100\]; got 101"),
        (dict(max_args=1), "max_args must be an int >= 2; got 1"),
        (dict(operators="MAX"), "operators must be a sequence of names, got 'MAX'"),
        (dict(operators=("MAX", "ADD")), r"operators must be a non-empty sequence of MIN, .*"),
        (
            dict(min_len=30, max_len=100, max_depth=3, max_args=4),
            "must leave a length min_len < n < max_len .* got min_len=30, max_len=100",
        ),
        (
            dict(min_len=4, max_len=10, max_args=3, exact_length=True),
            r"max_args >= 4 .* got 1 impossible, e.g. \[6\]",
        ),
        (dict(min_len=50, max_len=40, exact_length=True), "max_len must be an int >= 50; got 40"),
    ],
)
def test_dataset_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ListOpsDataset(**kwargs)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(split=None), "split must be one of 'train', 'val', 'test'; got None"),
        (dict(min_len=1.5), "min_len must be an int >= 0; got 1.5"),
        (dict(max_depth=True), r"max_depth must be an int in \[1, 100\]; got True"),
        (dict(exact_length=1), "exact_length must be a bool; got 1"),
        (dict(seed="a"), "seed must be an int; got 'a'"),
    ],
)
def test_dataset_type_errors(kwargs, match):
    with pytest.raises(TypeError, match=match):
        ListOpsDataset(**kwargs)


def test_generate_expression_errors():
    with pytest.raises(ValueError, match=r"length must be a length that trees .* got 6"):
        generate_expression(random.Random(0), length=6, max_args=3)
    with pytest.raises(ValueError, match="length must be a positive int; got 0"):
        generate_expression(random.Random(0), length=0)
    with pytest.raises(IndexError, match=r"index must be in \[0, 2\), got 2"):
        ListOpsDataset(num_samples=2)[2]


def _write_tsv(path, rows, header="Source\tTarget"):
    path.write_text("\n".join([header, *(f"{s}\t{t}" for s, t in rows)]) + "\n")


def test_tsv_folder_and_file(tmp_path):
    rows = [("( ( ( [MAX 2 ) 9 ) ] )", 9), ("( ( [SM 5 ) 7 ) ]", 2)]
    for split in ("train", "val", "test"):
        _write_tsv(tmp_path / f"basic_{split}.tsv", rows if split == "val" else rows[:1])
    ds = ListOpsTSV("val", path=tmp_path)
    assert len(ds) == 2 and ds.num_classes == 10
    tokens, label = ds[1]
    assert label == 2 and detokenize(tokens) == "[SM 5 7 ]"
    assert all(evaluate(ds.sources[i]) == ds.labels[i] for i in range(len(ds)))
    assert len(ListOpsTSV("train", path=tmp_path / "basic_test.tsv")) == 1  # a file: any split
    assert ListOpsTSV("val", path=tmp_path, max_len=2)[0][0].tolist() == tokenize("[MAX 2").tolist()


def test_tsv_errors(tmp_path):
    bad_header = tmp_path / "h.tsv"
    _write_tsv(bad_header, [("[MAX 1 2 ]", 2)], header="expr\tlabel")
    with pytest.raises(ValueError, match=r"must start with the header 'Source\\tTarget'"):
        ListOpsTSV(path=bad_header)
    bad_row = tmp_path / "r.tsv"
    _write_tsv(bad_row, [("[MAX 1 2 ]", 2), ("[MAX 1 2 ]", 12)])
    with pytest.raises(ValueError, match=r"line 3 must be '<expression>\\t<digit>'"):
        ListOpsTSV(path=bad_row)
    cut = tmp_path / "c.tsv"  # every token valid, the row cut short (a damaged file)
    _write_tsv(cut, [("( [MAX 1 2 ] )", 2), ("( ( [MIN 4 ) 5 )", 4)])
    with pytest.raises(ValueError, match=r"line 3: the expression is not complete: 1 '\[' vs"):
        ListOpsTSV(path=cut)
    _write_tsv(cut, [("( ( [MIN 4 ) 5 ]", 4)])
    with pytest.raises(ValueError, match=r"line 2: .* 2 '\(' vs 1 '\)'"):
        ListOpsTSV(path=cut)
    header_only = tmp_path / "e.tsv"
    _write_tsv(header_only, [])
    with pytest.raises(ValueError, match=r"e\.tsv must hold at least one expression under"):
        ListOpsTSV(path=header_only)
    latin = tmp_path / "l.tsv"  # a long file: the bad byte is decoded chunks after line 1
    rows = "".join(f"[MAX {i % 10} 2 ]\t{max(i % 10, 2)}\n" for i in range(5000))
    latin.write_bytes(f"Source\tTarget\n{rows}[MIN caf\xe9 ]\t1\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"l\.tsv must be UTF-8 text \(after line \d{3,}\):"):
        ListOpsTSV(path=latin)
    with pytest.raises(ValueError, match=r"a folder holding basic_train.tsv, got the folder"):
        ListOpsTSV("train", path=tmp_path / ".")
    with pytest.raises(ValueError, match="path must be an existing file or folder, got"):
        ListOpsTSV(path=tmp_path / "missing.tsv")
    with pytest.raises(ValueError, match="task 'listops-tsv' needs the option path"):
        ListOpsTSV(path=None)
