"""Bench result folders: a second run never replaces the files of the first."""

from __future__ import annotations

from taylorshift.bench.files import fresh_folder


def test_a_used_folder_gives_the_next_numbered_one(tmp_path, capsys):
    out = tmp_path / "bench-results"
    assert fresh_folder(out) == out  # missing
    out.mkdir()
    assert fresh_folder(out) == out  # empty
    (out / "results.json").write_text("{}")
    second = fresh_folder(out)
    assert second == tmp_path / "bench-results-2"
    assert "holds an earlier run; writing to" in capsys.readouterr().err
    second.mkdir()
    (second / "report.md").write_text("")
    assert fresh_folder(out) == tmp_path / "bench-results-3"
    assert fresh_folder(out, overwrite=True) == out
