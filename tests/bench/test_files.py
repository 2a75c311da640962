"""Bench result folders: a second run never replaces the files of the first."""

from __future__ import annotations

import pytest

from taylorshift.bench.files import fresh_folder
from taylorshift.cli import main


def test_a_used_folder_gives_the_next_numbered_one(tmp_path, capsys):
    out = tmp_path / "bench-results"
    assert fresh_folder(out) == out  # missing: made
    assert out.is_dir()
    assert fresh_folder(out) == out  # empty
    (out / "results.json").write_text("{}")
    second = fresh_folder(out)
    assert second == tmp_path / "bench-results-2"
    assert "holds an earlier run; writing to" in capsys.readouterr().err
    (second / "report.md").write_text("")
    assert fresh_folder(out) == tmp_path / "bench-results-3"
    assert fresh_folder(out, overwrite=True) == out


@pytest.mark.parametrize("tool", [[], ["models"], ["scaling"], ["decode"]], ids=str)
def test_an_out_folder_that_cannot_be_written_fails_before_measuring(tool, tmp_path, capsys):
    """(It failed when the results were written, after the whole sweep.)"""
    import taylorshift.bench.decode
    import taylorshift.bench.op.cli
    import taylorshift.bench.scaling

    def never(*args, **kwargs):
        raise AssertionError("measured before checking --out")

    blocked = tmp_path / "a-file"
    blocked.write_text("")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(taylorshift.bench.op.cli, "run_sweep", never)
        patch.setattr(taylorshift.bench.decode, "run_sweep", never)
        patch.setattr(taylorshift.bench.scaling, "measure", never)
        with pytest.raises(SystemExit) as info:
            main(["bench", *tool, "--out", str(blocked / "results"), "--no-plot"])
    assert info.value.code == 2
    assert f"--out: cannot write into {str(blocked / 'results')!r}" in capsys.readouterr().err
