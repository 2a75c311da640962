"""Files written so that a crash never leaves a truncated one under the final name.

``write_atomic`` fills a temporary file in the destination folder, flushes and fsyncs it,
gives it the usual mode, ``os.replace``s it over the destination (atomic on POSIX and
Windows) and fsyncs the folder so the rename itself survives a power loss. Checkpoints,
model weights, metrics rewrites and benchmark results all go through it.

``interrupts_deferred`` holds Ctrl-C back while a write of several files (a checkpoint)
finishes: an interrupt in the middle of ``torch.save`` lets torch's zip writer raise its
own error while closing ("unexpected pos"), which hides the ``KeyboardInterrupt`` and
turns a clean stop into a traceback.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

__all__ = ["fsync_path", "interrupts_deferred", "write_atomic"]


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Delivers a Ctrl-C (SIGINT) that arrives inside the block when the block has finished.

    The first SIGINT is noted and the handler before the block put back, so a second one acts
    at once (a user who insists is never stuck). When the block ends normally, a noted SIGINT
    is raised again for that handler (Python's default: ``KeyboardInterrupt`` here); when
    the block raises, its exception goes on. Outside the main thread, or where the SIGINT
    handler is not Python's to change, the block runs as it is.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    if previous is None:  # installed from C: leave it alone
        yield
        return
    noted = []

    def note(signum: int, frame: object) -> None:
        noted.append(signum)
        signal.signal(signal.SIGINT, previous)

    signal.signal(signal.SIGINT, note)
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGINT) is note:
            signal.signal(signal.SIGINT, previous)
    if noted:
        signal.raise_signal(signal.SIGINT)


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
    """Write ``data`` to ``path`` through a temporary file and ``os.replace``; missing folders
    are made. An ``OSError`` names ``path`` (not the temporary file): a folder that stands at
    ``path`` is refused before anything is written."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, "a folder stands where the file goes", str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as err:  # (a folder without write permission)
        raise type(err)(
            err.errno, f"cannot write in its folder: {err.strerror}", str(path)
        ) from None
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
