"""SIGTERM and SIGINT outside the training loop: stop at once, keep nothing half-written.

Preparation, evaluation and prediction write every file atomically (:mod:`brats_seg.files`)
and keep what they finished (a cache entry, a case's prediction and its metrics), so the
right answer to a signal there is to stop now rather than finish the case: while
:func:`stop_on_signals` is entered, SIGTERM or SIGINT raises :class:`Interrupted` in the
main thread, the ``with`` blocks unwind (temporary files removed, locks released), and the
entry point exits with :data:`EXIT_PREEMPTED`. Running the
same command again continues where it stopped. The stage says how far it got with
:func:`report_progress` (``3 of 8 cases``), and the message of :class:`Interrupted` repeats it.

The training loop has its own, gentler handler (:mod:`brats_seg.training.preemption`: finish
the step, save, exit), installed inside this one while it runs; it ends in :class:`Preempted`.
Both outcomes of a signal, and their exit status, are declared here, below every entry point's
glue (``cli.user_errors``).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator

__all__ = ["EXIT_PREEMPTED", "Interrupted", "Preempted", "report_progress", "stop_on_signals"]

log = logging.getLogger(__name__)

#: Exit status of a run stopped by SIGTERM/SIGINT after saving (sysexits' EX_TEMPFAIL:
#: "try again later"); a job script can requeue on it.
EXIT_PREEMPTED = 75


class Preempted(Exception):
    """Training stopped on a signal after saving; re-running the command resumes.

    Attributes:
        signal_name: ``SIGTERM`` or ``SIGINT``.
        where: what was done and saved (``step 3 of epoch 2``, ``epoch 2``).
        run_dir: the run folder holding the checkpoint.
    """

    def __init__(self, signal_name: str, where: str, run_dir: str) -> None:
        self.signal_name, self.where, self.run_dir = signal_name, where, run_dir
        super().__init__(
            f"{signal_name}: training stopped after {where}, saved in {run_dir}. "
            "Re-run the same command to resume from there."
        )


class Interrupted(Exception):
    """A signal stopped preparation, evaluation or prediction; what was finished is kept.

    Attributes:
        signal_name: ``SIGTERM`` or ``SIGINT``.
        stage: what was stopped (``evaluation``, ``preparation``, ...).
        progress: how far it got (``3 of 8 cases``), or ``""`` if it did not say.
    """

    def __init__(self, signal_name: str, stage: str, progress: str = "") -> None:
        self.signal_name, self.stage, self.progress = signal_name, stage, progress
        after = f" after {progress}" if progress else ""
        super().__init__(
            f"{signal_name}: {stage} stopped{after}; what it finished is kept and nothing half-written "
            "is. Re-run the same command to continue where it stopped."
        )

    def __reduce__(self):
        return (type(self), (self.signal_name, self.stage, self.progress))


class _Progress:
    text = ""
    stopping = False  # Interrupted raised: the block is unwinding


# How far each entered stop_on_signals block got (innermost last); report_progress sets the last.
_progress: list[_Progress] = []


def report_progress(text: str) -> None:
    """Say how far the stage running under :func:`stop_on_signals` got, e.g. ``3 of 8 cases``;
    a signal's :class:`Interrupted` message then reads ``evaluation stopped after 3 of 8 cases``.
    Outside any block (a library call, a worker process) it does nothing."""
    if _progress:
        _progress[-1].text = text


@contextlib.contextmanager
def stop_on_signals(stage: str) -> Iterator[None]:
    """Turn SIGTERM and SIGINT into :class:`Interrupted` for the ``with`` block (main thread only;
    elsewhere the signals keep their behaviour). Nested blocks name the innermost stage.

    Only the first signal raises: a second one (Ctrl-C pressed twice, SIGTERM after SIGINT) while
    the block unwinds would cut short the removal of a temporary file or the stopping of worker
    processes, so it is logged and ignored; SIGKILL stops at once."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    progress = _Progress()

    def handle(signum, frame):
        name = signal.Signals(signum).name
        if progress.stopping:
            log.warning("%s received: %s is already stopping (cleaning up)", name, stage)
            return
        progress.stopping = True
        raise Interrupted(name, stage, progress.text)

    previous = {sig: signal.signal(sig, handle) for sig in (signal.SIGTERM, signal.SIGINT)}
    _progress.append(progress)
    try:
        yield
    finally:
        _progress.remove(progress)  # by identity
        for sig, handler in previous.items():
            signal.signal(sig, handler)
