"""Suite-wide fixtures."""

from __future__ import annotations

import pytest

from taylorshift.ops.taylor_shift import dispatch


@pytest.fixture(autouse=True)
def isolated_cache_dir(tmp_path, monkeypatch):
    """Every test sees an empty cache directory of its own, never the user's calibration.

    ``mode="auto"`` reads the calibration once per process: the test starts with nothing read
    (the next auto call reads the test's directory) and the state before it comes back after.
    Returns the directory (created by whatever writes into it).
    """
    cache = tmp_path / "taylorshift-cache"
    monkeypatch.setenv(dispatch.CACHE_DIR_ENV, str(cache))
    monkeypatch.delenv(dispatch.CALIBRATION_ENV, raising=False)
    monkeypatch.setattr(dispatch, "_loaded", dispatch._UNSET)
    return cache
