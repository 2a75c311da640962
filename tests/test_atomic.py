"""taylorshift.atomic: Ctrl-C held back while a write of several files finishes; errors of
write_atomic that name the destination."""

from __future__ import annotations

import signal
import tempfile
import threading

import pytest

from taylorshift.atomic import interrupts_deferred, write_atomic


@pytest.fixture(autouse=True)
def ctrl_c_raises():
    """Python's own SIGINT handler during the test (a worker may have it otherwise)."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def test_a_ctrl_c_inside_the_block_is_raised_when_it_ends():
    before = signal.getsignal(signal.SIGINT)
    finished = []
    with pytest.raises(KeyboardInterrupt), interrupts_deferred():
        signal.raise_signal(signal.SIGINT)
        finished.append("block")
    assert finished == ["block"]
    assert signal.getsignal(signal.SIGINT) is before


def test_a_second_ctrl_c_acts_at_once():
    finished = []
    with pytest.raises(KeyboardInterrupt), interrupts_deferred():
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGINT)
        finished.append("block")
    assert finished == []


def test_without_ctrl_c_nothing_is_raised_and_the_handler_comes_back():
    before = signal.getsignal(signal.SIGINT)
    with interrupts_deferred():
        assert signal.getsignal(signal.SIGINT) is not before
    assert signal.getsignal(signal.SIGINT) is before


def test_the_blocks_own_error_goes_on_and_the_handler_comes_back():
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(OSError, match="disk full"), interrupts_deferred():
        signal.raise_signal(signal.SIGINT)
        raise OSError("disk full")
    assert signal.getsignal(signal.SIGINT) is before


def test_outside_the_main_thread_the_block_just_runs():
    seen = []

    def work():
        with interrupts_deferred():  # signal.signal would raise ValueError in a thread
            seen.append("block")

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert seen == ["block"]


def test_an_error_names_the_destination_not_the_temporary_file(tmp_path, monkeypatch):
    folder = tmp_path / "taken"
    folder.mkdir()
    with pytest.raises(IsADirectoryError, match=r"a folder stands where the file goes") as err:
        write_atomic(folder, b"x")
    assert err.value.filename == str(folder)

    def denied(*args, **kwargs):  # (a folder without write permission; root ignores modes)
        raise PermissionError(13, "Permission denied", str(tmp_path / ".f.tmp"))

    monkeypatch.setattr(tempfile, "mkstemp", denied)
    with pytest.raises(PermissionError, match=r"cannot write in its folder: Permission denied"):
        write_atomic(tmp_path / "f", b"x")
    assert list(tmp_path.iterdir()) == [folder]
