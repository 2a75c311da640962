"""The extras keep the user's torch: pip, asked to add ``.[timm]`` beside the torch that is
installed, resolves without replacing it (issue: ``pip install 'taylorshift[timm]'`` once
swapped a CPU torch for a 3 GB CUDA build through torchvision's pin).

The check is pip's own resolver in ``--dry-run`` mode against the package index, as the
README's install line would run it; it installs nothing. Without an index to ask (a machine
with no network and no local mirror) there is nothing to resolve against and it is skipped.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def resolve(*requirements: str, tmp_path: Path) -> list[dict]:
    """What ``pip install REQUIREMENTS`` would install here (name, version), installing
    nothing."""
    report = tmp_path / "report.json"
    # The project's metadata from the setuptools installed here where it is new enough (the
    # build-system's requirement): pip's isolated build environment would first fetch
    # setuptools from the index (11 s against 4 s here), and the metadata is the same.
    isolation = ["--no-build-isolation"] if _setuptools_version() >= (64,) else []
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet",
         *isolation, "--report", str(report), *requirements],
        capture_output=True, text=True, cwd=ROOT, timeout=600,
    )  # fmt: skip
    if result.returncode != 0:
        # no index at all (offline): every version list is empty or the connection fails;
        # a conflict between versions (ResolutionImpossible) is a failure, not a skip
        unreachable = ("(from versions: none)", "NewConnectionError", "Max retries exceeded")
        if any(text in result.stderr for text in unreachable):
            pytest.skip(f"pip cannot reach a package index here: {result.stderr[-300:]}")
        raise AssertionError(f"pip failed to resolve {requirements}:\n{result.stderr[-2000:]}")
    return [item["metadata"] for item in json.loads(report.read_text())["install"]]


@pytest.mark.slow
def test_timm_extra_keeps_the_installed_torch(tmp_path):
    # The README's rule: name the torch you have in the same command as the extra.
    pytest.importorskip("pip")
    version = torch.__version__.split("+")[0]
    plan = resolve(f"torch=={version}", "-e", ".[timm]", tmp_path=tmp_path)
    names = {meta["name"].lower(): meta["version"] for meta in plan}
    assert "timm" in names or _installed("timm"), f"timm is not part of the plan: {names}"
    assert "torch" not in names, (
        f"pip would replace torch {torch.__version__} by {names.get('torch')}: {names}"
    )


def _setuptools_version() -> tuple[int, ...]:
    """The installed setuptools' (major, minor, ...), or () where there is none."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        text = version("setuptools")
    except PackageNotFoundError:
        return ()
    return tuple(int(part) for part in text.split(".")[:2] if part.isdigit())


def _installed(name: str) -> bool:
    from importlib.metadata import PackageNotFoundError, version

    try:
        version(name)
    except PackageNotFoundError:
        return False
    return True
