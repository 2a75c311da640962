"""Files written so that a crash never leaves a truncated one under the final name.

``write_atomic`` fills a temporary file in the destination folder, flushes and fsyncs it,
gives it the usual mode, ``os.replace``s it over the destination (atomic on POSIX and
Windows) and fsyncs the folder so the rename itself survives a power loss. Checkpoints,
model weights, metrics rewrites and benchmark results all go through it.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["fsync_path", "write_atomic"]


def fsync_path(path: str | os.PathLike) -> None:
    """Flush a file's (or a folder's entries') data to disk; a no-op where folders cannot be
    opened (Windows)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file and ``os.replace``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; give the usual mode
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    fsync_path(path.parent)
    return path
