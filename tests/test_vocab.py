"""The one vocabulary of passes and dtypes, and the old spellings it still understands."""

from __future__ import annotations

import pytest
import torch

from taylorshift import vocab


def test_passes_are_full_words():
    assert vocab.PASSES == ("forward", "forward+backward")


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("forward", "forward"),
        ("forward+backward", "forward+backward"),
        ("fwd", "forward"),
        ("fwd+bwd", "forward+backward"),
        ("train", "forward+backward"),
    ],
)
def test_pass_name(given, expected):
    assert vocab.pass_name(given) == expected


@pytest.mark.parametrize("bad", ["backward", "Forward", "", None])
def test_pass_name_refuses(bad):
    with pytest.raises(ValueError, match="pass must be one of 'forward', 'forward\\+backward'"):
        vocab.pass_name(bad)


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("float32", "float32"),
        ("fp32", "float32"),
        ("bf16", "bfloat16"),
        ("fp16", "float16"),
        ("fp64", "float64"),
        ("torch.bfloat16", "bfloat16"),
        (torch.float16, "float16"),
        (torch.float64, "float64"),
    ],
)
def test_dtype_name(given, expected):
    assert vocab.dtype_name(given) == expected


@pytest.mark.parametrize("bad", ["int8", "half", "fp8", torch.int32])
def test_dtype_name_refuses(bad):
    with pytest.raises(ValueError, match="dtype must be one of 'float32'"):
        vocab.dtype_name(bad)


def test_torch_dtype():
    assert vocab.torch_dtype("bf16") is torch.bfloat16
    assert vocab.torch_dtype("float32") is torch.float32
    assert vocab.torch_dtype(torch.float64) is torch.float64
