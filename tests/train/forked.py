"""``python -m taylorshift`` in a process forked from a server that has imported torch and
the package already (the ``forkserver`` start method of multiprocessing, with preloaded
modules: ``tests.helpers.forkserver``).

A fresh interpreter spends about 4 s here before the CLI runs (torch, then ``torch._dynamo``,
which the first optimizer imports); a kill-and-resume test starts six. The forked process
is a process of its own all the same: SIGKILL ends it at the test's kill points, it writes
its own files and draws its own random numbers, and ``taylorshift.cli.main`` is the entry
point ``python -m taylorshift`` calls (tests/test_cli.py runs that one as a subprocess).
"""

from __future__ import annotations

import multiprocessing.connection
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from ..helpers import forkserver


def _main(argv: list[str], env: dict[str, str], out: str, err: str) -> None:
    """The child: the environment and the standard streams of ``env``, ``out`` and ``err``,
    Ctrl-C's usual handler (the fork server ignores SIGINT, and a shell's background job
    starts with it ignored), then the CLI; exits with its status."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.environ.clear()
    os.environ.update(env)
    with open(out, "w") as stdout, open(err, "w") as stderr:
        os.dup2(stdout.fileno(), 1)
        os.dup2(stderr.fileno(), 2)
    from taylorshift.cli import main

    with (
        open(1, "w", buffering=1, closefd=False) as sys.stdout,
        open(2, "w", buffering=1, closefd=False) as sys.stderr,
    ):
        try:
            code = main(argv)
        except SystemExit as exit_:  # as the interpreter reports it
            code = exit_.code
            if code is not None and not isinstance(code, int):
                print(code, file=sys.stderr)
                code = 1
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code or 0)


def start_cli(argv: list[str], env: dict[str, str], folder: Path):
    """``python -m taylorshift ARGV`` started, not awaited: (the process, its stdout file,
    its stderr file), the files in ``folder``."""
    out, err = folder / "stdout", folder / "stderr"
    process = forkserver().Process(target=_main, args=(argv, env, str(out), str(err)))
    process.start()
    return process, out, err


def signal_cli(
    argv: list[str], env: dict[str, str], folder: Path, ready, signum: int, timeout: float = 120
) -> tuple[int | None, str]:
    """Start ``python -m taylorshift ARGV`` (``start_cli``), send it ``signum`` once
    ``ready()`` is true (checked every 50 ms while it runs) and wait for it: (its exit
    status, its stderr)."""
    run, _, stderr = start_cli(argv, env, folder)
    try:
        deadline = time.monotonic() + timeout
        while not ready():
            assert run.is_alive() and time.monotonic() < deadline, "not ready in time"
            time.sleep(0.05)
        os.kill(run.pid, signum)
        run.join(60)
    finally:
        run.kill()
        run.join()
    return run.exitcode, stderr.read_text()


def fork_cli(argv: list[str], env: dict[str, str], timeout: float = 300):
    """What ``subprocess.run([python, "-m", "taylorshift", *argv], env=env,
    capture_output=True, text=True)`` returns (returncode: the exit status, or -signal)."""
    with tempfile.TemporaryDirectory() as tmp:
        process, out, err = start_cli(argv, env, Path(tmp))
        process.join(timeout)
        if process.is_alive():
            process.kill()
            process.join()
            raise subprocess.TimeoutExpired(argv, timeout)
        return subprocess.CompletedProcess(argv, process.exitcode, out.read_text(), err.read_text())


def fork_ranks(argv: list[str], env: dict[str, str], nproc: int, timeout: float = 300):
    """What ``torchrun --standalone --nproc-per-node=NPROC -m taylorshift ARGV`` returns, with
    the ranks forked from the server instead of started fresh by a launcher process.

    Each rank gets the environment torchrun gives its workers (``RANK``, ``LOCAL_RANK``,
    ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT`` of a free local
    port, ``OMP_NUM_THREADS=1``), and, as torchrun does, the other ranks are stopped
    (SIGTERM, then SIGKILL after 5 s) as soon as one fails. returncode: 0, or the status of
    the first rank that failed; stdout and stderr: the ranks' own, in rank order. Saves a
    torch import per rank and the launcher's (seconds each on two cores); the launcher itself
    is tested by the runs that use torchrun (tests/train/test_distributed.py).
    """
    with socket.socket() as probe:  # a free port for rank 0's store
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        streams = [(Path(tmp, f"out{r}"), Path(tmp, f"err{r}")) for r in range(nproc)]
        processes = []
        for rank, (out, err) in enumerate(streams):
            rank_env = {
                **env,
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "GROUP_RANK": "0",
                "WORLD_SIZE": str(nproc),
                "LOCAL_WORLD_SIZE": str(nproc),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "OMP_NUM_THREADS": "1",
            }
            process = forkserver().Process(target=_main, args=(argv, rank_env, str(out), str(err)))
            process.start()
            processes.append(process)
        deadline = time.monotonic() + timeout
        status = 0
        try:
            while any(p.is_alive() for p in processes):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise subprocess.TimeoutExpired(argv, timeout)
                alive = [p.sentinel for p in processes if p.is_alive()]
                multiprocessing.connection.wait(alive, timeout=min(left, 1.0))
                failed = [p.exitcode for p in processes if p.exitcode not in (None, 0)]
                if failed and not status:
                    status = failed[0]
                    _stop([p for p in processes if p.is_alive()])
        finally:
            _stop([p for p in processes if p.is_alive()], grace=0.0)
        return subprocess.CompletedProcess(
            argv,
            status,
            "".join(out.read_text() for out, _ in streams),
            "".join(err.read_text() for _, err in streams),
        )


def _stop(processes, grace: float = 5.0) -> None:
    """SIGTERM, then SIGKILL what still runs after ``grace`` seconds; reaps them."""
    for process in processes:
        process.terminate()
    end = time.monotonic() + grace
    for process in processes:
        process.join(max(0.0, end - time.monotonic()))
        if process.is_alive():
            process.kill()
            process.join()
