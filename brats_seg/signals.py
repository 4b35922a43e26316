"""SIGTERM and SIGINT outside the training loop: stop at once, keep nothing half-written.

Preparation, evaluation and prediction write every file atomically (:mod:`brats_seg.files`)
and keep what they finished (a cache entry, a case's prediction and its metrics), so the
right answer to a signal there is to stop now rather than finish the case: while
:func:`stop_on_signals` is entered, SIGTERM or SIGINT raises :class:`Interrupted` in the
main thread, the ``with`` blocks unwind (temporary files removed, locks released), and the
entry point exits with :data:`~brats_seg.training.preemption.EXIT_PREEMPTED`. Running the
same command again continues where it stopped.

The training loop has its own, gentler handler (:mod:`brats_seg.training.preemption`: finish
the step, save, exit), installed inside this one while it runs.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator

__all__ = ["Interrupted", "stop_on_signals"]

log = logging.getLogger(__name__)


class Interrupted(Exception):
    """A signal stopped preparation, evaluation or prediction; what was finished is kept.

    Attributes:
        signal_name: ``SIGTERM`` or ``SIGINT``.
        stage: what was stopped (``evaluation``, ``preparation``, ...).
    """

    def __init__(self, signal_name: str, stage: str) -> None:
        self.signal_name, self.stage = signal_name, stage
        super().__init__(f"{signal_name}: {stage} stopped; what it finished is kept and nothing half-written is. "
                         "Re-run the same command to continue where it stopped.")


@contextlib.contextmanager
def stop_on_signals(stage: str) -> Iterator[None]:
    """Turn SIGTERM and SIGINT into :class:`Interrupted` for the ``with`` block (main thread only;
    elsewhere the signals keep their behaviour). Nested blocks name the innermost stage."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handle(signum, frame):
        raise Interrupted(signal.Signals(signum).name, stage)

    previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
