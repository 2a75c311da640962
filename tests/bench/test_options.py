"""Every bench tool takes a dtype by torch's name and by the older short one."""

from __future__ import annotations

import pytest

from taylorshift.cli import build_parser


@pytest.mark.parametrize(
    ("tool", "given", "expected"),
    [
        (["models"], "bf16", "bfloat16"),
        (["models"], "float16", "float16"),
        (["scaling"], "fp32", "float32"),
        (["decode"], "fp16", "float16"),
        (["seqpar"], "bf16", "bfloat16"),
        (["calibrate"], "fp64", ["float64"]),
        ([], "bf16", ["bfloat16"]),
    ],
    ids=lambda x: " ".join(x) if isinstance(x, list) else str(x),
)
def test_dtype_option_takes_both_spellings(tool, given, expected):
    args = build_parser().parse_args(["bench", *tool, "--dtype", given])
    assert args.dtype == expected


@pytest.mark.parametrize("tool", [["models"], ["scaling"], ["decode"], ["seqpar"], []])
def test_dtype_option_refuses_other_names(tool, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", *tool, "--dtype", "fp8"])
    assert "invalid choice: 'fp8'" in capsys.readouterr().err


def test_pass_options_take_both_spellings():
    args = build_parser().parse_args(["bench", "calibrate", "--pass", "train"])
    assert args.passes == "forward+backward"
    args = build_parser().parse_args(["bench", "calibrate", "--pass", "forward+backward"])
    assert args.passes == "forward+backward"
    args = build_parser().parse_args(["bench", "--pass", "fwd+bwd", "forward"])
    assert args.passes == ["forward+backward", "forward"]


@pytest.mark.parametrize("tool", [[], ["models"], ["scaling"], ["decode"]], ids=str)
@pytest.mark.parametrize("flag", ["--no-plot", "--no-plots"])
def test_every_tool_takes_both_spellings_of_no_plot(tool, flag):
    args = build_parser().parse_args(["bench", *tool, flag])
    assert args.no_plots is True
