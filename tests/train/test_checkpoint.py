"""Checkpoint writing: a Ctrl-C in the middle of it (train/checkpoint.py)."""

from __future__ import annotations

import signal
from collections import OrderedDict

import pytest

from taylorshift.models import create_model
from taylorshift.train import latest_checkpoint, load_state
from taylorshift.train.checkpoint import save_checkpoint


@pytest.fixture(autouse=True)
def ctrl_c_raises():
    """Python's own SIGINT handler during the test (a worker may have it otherwise)."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


class _PressesCtrlC:
    """Pickles as an empty OrderedDict (which ``weights_only`` loading takes), sending this
    process SIGINT while ``torch.save`` writes it."""

    def __reduce__(self):
        signal.raise_signal(signal.SIGINT)
        return (OrderedDict, ())


def test_ctrl_c_during_a_checkpoint_write_stops_once_the_checkpoint_is_complete(tmp_path):
    # Before: the KeyboardInterrupt rose inside torch.save and no checkpoint was left; in
    # `taylorshift train` torch's zip writer could then fail while closing ("unexpected
    # pos"), hiding the interrupt: a traceback and exit code 1 in place of 130.
    model = create_model("lm-tiny", depth=1, dim=8, num_heads=2)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(
            tmp_path, step=3, model=model, state={"x": _PressesCtrlC(), "y": 5}, config={}
        )
    saved = latest_checkpoint(tmp_path)
    assert saved is not None and saved.name == "step-00000003"
    state = load_state(saved)
    assert state["x"] == {} and state["y"] == 5
    assert sorted(p.name for p in saved.parent.iterdir()) == ["latest", "step-00000003"]
