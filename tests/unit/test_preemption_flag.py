"""PreemptionFlag: signals set the flag instead of ending the process; handlers are restored;
SIGUSR2 reaches a launcher's own handler (submitit's requeue) only after the save."""

from __future__ import annotations

import os
import signal

import pytest

from brats_seg.signals import EXIT_PREEMPTED, Preempted
from brats_seg.training.preemption import PreemptionFlag


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_sets_the_flag_and_the_handlers_come_back(sig):
    before = signal.getsignal(sig)
    with PreemptionFlag() as flag:
        assert not flag.requested
        os.kill(os.getpid(), sig)
        assert flag.requested and flag.signal_name == signal.Signals(sig).name
        flag.pass_on()  # nothing to pass on for SIGTERM / SIGINT
    assert signal.getsignal(sig) is before


def test_a_second_ctrl_c_stops_at_once():
    with PreemptionFlag() as flag:
        os.kill(os.getpid(), signal.SIGINT)
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert flag.signal_name == "SIGINT"


@pytest.fixture
def launcher_calls():
    """A launcher's SIGUSR2 handler (as submitit installs one) that records its calls; the
    previous handler comes back after the test."""
    calls = []
    previous = signal.signal(signal.SIGUSR2, lambda signum, frame: calls.append(signum))
    try:
        yield calls
    finally:
        signal.signal(signal.SIGUSR2, previous)


def test_sigusr2_is_saved_first_then_passed_to_the_launchers_handler(launcher_calls):
    with PreemptionFlag() as flag:
        os.kill(os.getpid(), signal.SIGUSR2)
        assert flag.requested and launcher_calls == []  # the launcher does not requeue mid-step
        flag.pass_on()
    assert launcher_calls == [signal.SIGUSR2]


def test_sigusr2_after_a_sigterm_still_reaches_the_launcher_after_the_save(launcher_calls):
    # submitit's preemption drill (Job._interrupt) sends SIGTERM, then SIGUSR2: one save, then the requeue
    with PreemptionFlag() as flag:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGUSR2)
        assert flag.signal_name == "SIGTERM" and launcher_calls == []
        flag.pass_on()
    assert launcher_calls == [signal.SIGUSR2]
    with PreemptionFlag() as flag:  # SIGTERM alone: nothing for the launcher
        os.kill(os.getpid(), signal.SIGTERM)
        flag.pass_on()
    assert launcher_calls == [signal.SIGUSR2]


def test_sigusr2_is_left_alone_without_a_launcher_handler():
    previous = signal.signal(signal.SIGUSR2, signal.SIG_DFL)
    try:
        with PreemptionFlag():
            assert signal.getsignal(signal.SIGUSR2) == signal.SIG_DFL
    finally:
        signal.signal(signal.SIGUSR2, previous)


def test_the_message_says_where_and_how_to_resume():
    e = Preempted("SIGTERM", "step 3 of epoch 2", "/runs/a")
    assert "step 3 of epoch 2" in str(e) and "/runs/a" in str(e) and "same command" in str(e)
    assert EXIT_PREEMPTED == 75
