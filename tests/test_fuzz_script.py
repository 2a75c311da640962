"""benchmarks/fuzz/fuzz.py, a few cases of each target (the op also compiled): the script
runs on today's API and fails a case whose result is off (the op's output, or a model's
decoded logits, scaled by 1 + 1e-3; a sequence-parallel model's)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "fuzz" / "fuzz.py"


@pytest.fixture(scope="module")
def fuzz():
    spec = importlib.util.spec_from_file_location("fuzz_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def same_threads():
    threads = torch.get_num_threads()  # (the cases set their own)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("what", ["op", "decode", "state", "model"])
def test_each_target_runs_and_passes(fuzz, what, capsys):
    assert fuzz.main([what, "--seed", "11", "--cases", "4"]) == 0
    assert f"{what}: 4 cases, seed 11, 0 failed" in capsys.readouterr().out


def test_compiled_op_runs_and_decode_refuses_compile(fuzz, capsys):
    assert fuzz.main(["op", "--seed", "11", "--cases", "2", "--compile", "aot_eager"]) == 0
    assert "op: 2 cases, seed 11, 0 failed" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        fuzz.main(["decode", "--compile", "aot_eager"])
    assert "--compile: the op, state and model targets only" in capsys.readouterr().err


@pytest.mark.parametrize("what", ["op", "state"])
def test_an_output_off_by_1e_3_fails(fuzz, what, monkeypatch, capsys):
    real = fuzz.taylor_shift_attention

    def off(*args, **kwargs):
        result = real(*args, **kwargs)
        if isinstance(result, tuple):
            return result[0] * (1 + 1e-3), *result[1:]
        return result * (1 + 1e-3)

    monkeypatch.setattr(fuzz, "taylor_shift_attention", off)
    assert fuzz.main([what, "--seed", "11", "--cases", "4"]) == 1
    out = capsys.readouterr().out
    assert "its error budget" in out and f"{what}: 4 cases, seed 11, 0 failed" not in out


def test_decoded_logits_off_by_1e_3_fail_the_model_target(fuzz, monkeypatch, capsys):
    real = fuzz.CausalLM.decode
    monkeypatch.setattr(fuzz.CausalLM, "decode", lambda *a, **k: real(*a, **k) * (1 + 1e-3))
    assert fuzz.main(["model", "--seed", "11", "--cases", "3"]) == 1
    out = capsys.readouterr().out
    assert "its error budget" in out and "model: 3 cases, seed 11, 0 failed" not in out


def test_seqpar_runs_and_fails_outputs_off_by_1e_3(fuzz, monkeypatch, capsys):
    """In one process (--ranks 1); tests/distributed/cases.py runs its cases on 2 ranks."""
    assert fuzz.main(["seqpar", "--seed", "11", "--cases", "3", "--ranks", "1"]) == 0
    assert "seqpar: 3 cases, seed 11, 1 ranks, 0 failed" in capsys.readouterr().out
    real = fuzz.convert_sequence_parallel

    def off(model):  # (one process: --ranks 1 runs the cases here)
        model = real(model)
        model.register_forward_hook(lambda module, args, out: out * (1 + 1e-3))
        return model

    monkeypatch.setattr(fuzz, "convert_sequence_parallel", off)
    assert fuzz.main(["seqpar", "--seed", "11", "--cases", "3", "--ranks", "1"]) == 1
    out = capsys.readouterr().out
    assert "its error budget" in out and "seqpar: 3 cases, seed 11, 1 ranks, 0 failed" not in out
