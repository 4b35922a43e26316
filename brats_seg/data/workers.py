"""Worker processes that prepare cases: the parent alone decides when they stop.

A worker ignores SIGINT (a terminal's Ctrl-C reaches the whole process group) and on SIGTERM --
sent by the parent when it is interrupted or fails, or on Linux when it dies -- unwinds the entry
it was building (its temporary folder is removed) and exits. The parent starts them with the
signals blocked (so a Ctrl-C while they start prints no tracebacks), stops them all on any
exception, SIGKILLs those that do not stop within :data:`STOP_TIMEOUT_S`, removes what they left,
and names a worker that died from outside (the OOM killer) instead of a ``BrokenProcessPool``.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from brats_seg.data.errors import DataError
from brats_seg.locks import remove_stale_temporaries

__all__ = ["STOP_TIMEOUT_S", "WorkerStopped", "run_in_workers"]

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 10.0  # how long stopped workers get to remove their temporary folder before SIGKILL
EXIT_WAIT_S = 5.0  # how long a dead pool's workers get to end and have their exit codes recorded, for the message
EXIT_POLL_S = 0.01  # how often a worker's exit code is asked for meanwhile


class WorkerStopped(SystemExit):
    """Raised in a worker by SIGTERM: unwinds the entry being built (its temporary folder is removed)."""


def _stop_worker(signum, frame):
    raise WorkerStopped(128 + signum)


def _init_worker(parent_pid: int) -> None:
    """A preparation worker's signals (it starts with SIGINT and SIGTERM blocked, see
    :func:`_signals_blocked`; one that came meanwhile is handled once they are unblocked here).

    SIGINT is ignored: a terminal's Ctrl-C reaches the whole process group, and the parent
    stops the pool. SIGTERM -- the parent stopping the pool, or (Linux) the parent's death --
    unwinds the entry being built and exits.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _stop_worker)
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):  # best effort: a live parent stops its workers itself
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
        if os.getppid() != parent_pid:  # the parent died before the death signal was set up
            raise WorkerStopped(128 + signal.SIGTERM)
    except WorkerStopped:
        os._exit(128 + signal.SIGTERM)


@contextlib.contextmanager
def _signals_blocked():
    """SIGINT and SIGTERM blocked in this thread for the block: the worker processes started in
    it inherit the mask, so a Ctrl-C while they start cannot print their tracebacks; a signal
    to this process meanwhile is delivered when the block ends."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _stop_workers(pool: ProcessPoolExecutor, workers: list) -> None:
    """Stop the pool now: SIGTERM each worker (it removes the entry it was building and exits),
    SIGKILL those still running after :data:`STOP_TIMEOUT_S`."""
    for p in workers:
        if p.is_alive():
            p.terminate()
    pool.shutdown(wait=False, cancel_futures=True)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for p in workers:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            log.warning("preparation worker %d did not stop within %.0f s: killing it", p.pid, STOP_TIMEOUT_S)
            p.kill()
            p.join(5.0)


def _pool_workers(pool: ProcessPoolExecutor) -> list:
    """The pool's worker processes (no public handle before Python 3.14; the pool forgets them once broken)."""
    return list((getattr(pool, "_processes", None) or {}).values())


def _recorded_exit_code(process, deadline: float) -> int | None:
    """``process``'s exit code once it has ended and been reaped, waiting until ``deadline`` (monotonic).

    A broken pool's own thread terminates and joins its workers while this thread asks: of two
    ``waitpid`` calls on one child only one gets its status, and the other's ``Process.exitcode``
    stays None until the winner has recorded it. So ask again until it is there, rather than once.
    None: still running at the deadline, or reaped by something that records nothing (a
    ``SIGCHLD`` ignored by the process).
    """
    while True:
        code = process.exitcode  # reaps it if no one has (WNOHANG), or reads the winner's record
        if code is not None or time.monotonic() >= deadline:
            return code
        time.sleep(EXIT_POLL_S)


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:  # a real-time signal has no name
        return f"signal {signum}"


def _known_workers(snapshot: list, pool: ProcessPoolExecutor) -> list:
    """The workers taken after the submits and any the pool records now (one it started later), once each."""
    return list({p.pid: p for p in [*snapshot, *_pool_workers(pool)]}.values())


def _worker_died(workers: list, cache_root: Path) -> DataError:
    """The error for a worker that died (the OOM killer, a stray ``kill -9``): which, and how."""
    deadline = time.monotonic() + EXIT_WAIT_S
    ends = []
    for p in workers:
        code = _recorded_exit_code(p, deadline)
        if code is not None and code < 0:
            ends.append(f"PID {p.pid} killed by {_signal_name(-code)}")
        elif code and code != 128 + signal.SIGTERM:  # not one the broken pool stopped
            ends.append(f"PID {p.pid} exited with status {code}")
    how = "; ".join(ends) or "it ended abruptly"
    return DataError(f"a process preparing cases into {cache_root} died ({how}): killed from outside, or by the "
                     "system for want of memory. The entries finished are kept; run the same command again, with "
                     "fewer data.num_workers if memory is short.")


def run_in_workers(fn, args: list[tuple], num_workers: int, cache_root: Path, finished) -> None:
    """Run ``fn(*a)`` for each ``a`` of ``args`` in ``num_workers`` spawned processes (safe even if the
    parent has imported TensorFlow; ``fn`` returns ``(case_id, error or None)``), calling
    ``finished(error)`` as each ends; on any exception (a signal's too) the workers are stopped and
    what they left in ``cache_root`` is removed, then it is raised."""
    ctx = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(max_workers=num_workers, mp_context=ctx, initializer=_init_worker,
                               initargs=(os.getpid(),))
    workers: list = []
    try:
        with _signals_blocked():  # the workers are started by these submits
            futures = [pool.submit(fn, *a) for a in args]
        workers = _pool_workers(pool)
        for fut in as_completed(futures):
            try:
                _, err = fut.result()
            except BrokenProcessPool:
                raise _worker_died(_known_workers(workers, pool), cache_root) from None
            finished(err)
    except BaseException:
        _stop_workers(pool, _known_workers(workers, pool))  # an error, or SIGTERM/SIGINT: no worker goes on alone
        remove_stale_temporaries(cache_root)  # a worker that had to be killed left its folder (the lock is held)
        raise
    pool.shutdown()
