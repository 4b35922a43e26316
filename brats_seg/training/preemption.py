"""SIGTERM and SIGINT during training: finish the step, save, exit resumably.

SLURM sends SIGTERM at preemption and at the time limit (``--signal`` can send it earlier),
a user presses Ctrl-C (SIGINT). Either asks the training loop to stop after the current
step: every worker learns of it at the same step (the flag is summed over replicas inside
the step), the chief saves a checkpoint with the position in the epoch, the MLflow run is
marked KILLED, :class:`~brats_seg.signals.Preempted` is raised and the process exits with
:data:`brats_seg.signals.EXIT_PREEMPTED`. Re-running the same command resumes at that step.
A second Ctrl-C stops at once (KeyboardInterrupt; the last
completed epoch or saved step stays the resume point).

Under submitit (``hydra/launcher=slurm|local``), SLURM's warning signal is SIGUSR2, whose
handler (submitit's) requeues the job: while training, SIGUSR2 too asks for the save, and
:meth:`PreemptionFlag.pass_on` then hands it to that handler, which requeues and exits. A
SIGUSR2 after a SIGTERM (submitit's own preemption drill sends both) is passed on too: the
save is the same, and without it the job would end unrequeued.
"""

from __future__ import annotations

import logging
import signal
import threading

__all__ = ["PreemptionFlag"]

log = logging.getLogger(__name__)


class PreemptionFlag:
    """While entered, SIGTERM, SIGINT (and SIGUSR2 where a launcher handles it) set
    :attr:`requested` instead of ending the process.

    Handlers can only be installed from the main thread; elsewhere (a test runner's worker
    thread) the flag stays off and the signals keep their default behaviour.
    """

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self._previous: dict[int, object] = {}
        self._usr2_received = False
        self._usr2 = None  # submitit's handler, kept for pass_on()

    @property
    def requested(self) -> bool:
        return self.signal_name is not None

    def _handle(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if signum == signal.SIGUSR2:
            self._usr2_received = True  # whenever it comes: pass_on() gives it to the launcher after the save
        if self.signal_name is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: stop now
        if self.signal_name is None:
            log.warning(
                "%s received: finishing the current step, then saving a checkpoint (Ctrl-C again to stop at once)", name
            )
        self.signal_name = self.signal_name or name

    def __enter__(self) -> PreemptionFlag:
        if threading.current_thread() is threading.main_thread():
            signals = [signal.SIGTERM, signal.SIGINT]
            if callable(signal.getsignal(signal.SIGUSR2)):  # a launcher's (submitit's) requeue handler
                signals.append(signal.SIGUSR2)
            for sig in signals:
                self._previous[sig] = signal.signal(sig, self._handle)
            self._usr2 = self._previous.get(signal.SIGUSR2)
        return self

    def pass_on(self) -> None:
        """After saving: give a SIGUSR2 received (first or after another signal) to the
        launcher's handler it was meant for (submitit requeues the job and exits). Nothing for
        SIGTERM/SIGINT alone."""
        if self._usr2_received and callable(self._usr2):
            log.info("passing SIGUSR2 on to the launcher (requeue)")
            self._usr2(signal.SIGUSR2, None)

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
