"""Worker processes that prepare cases: the parent alone decides when they stop.

A worker ignores SIGINT (a terminal's Ctrl-C reaches the whole process group) and on SIGTERM --
sent by the parent when it is interrupted or fails, or on Linux when it dies -- unwinds the entry
it was building (its temporary folder is removed) and exits. The parent starts them with the
signals blocked (so a Ctrl-C while they start prints no tracebacks), stops them all on any
exception, SIGKILLs those that do not stop within :data:`STOP_TIMEOUT_S`, removes what they left,
and names a worker that died from outside (the OOM killer) instead of a ``BrokenProcessPool``.

Whether a worker has ended is read from its sentinel, never from one ``waitpid``: the pool's own
thread reaps the same processes, and it does not always watch them all (see :func:`_results`).
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor
from concurrent.futures import wait as wait_futures
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.connection import wait
from pathlib import Path

from brats_seg.data.errors import DataError
from brats_seg.locks import remove_stale_temporaries

__all__ = ["STOP_TIMEOUT_S", "WorkerStopped", "run_in_workers"]

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 10.0  # how long stopped workers get to remove their temporary folder before SIGKILL
RECORD_WAIT_S = 1.0  # how long a worker seen dead gets for its exit code to be recorded (microseconds, normally)
EXIT_POLL_S = 0.01  # how often its exit code is asked for meanwhile
WATCH_S = 0.5  # how often the workers are checked while their results are awaited


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


def _ended(process, timeout: float = 0.0) -> bool:
    """Whether ``process`` has ended, from its sentinel (which no ``waitpid`` race can hide: a
    process reaped by the pool's own thread reads as running in ``is_alive`` until that thread has
    recorded its exit code)."""
    try:
        return bool(wait([process.sentinel], timeout))
    except (ValueError, OSError):  # closed: nothing left to stop
        return True


def _stop_workers(pool: ProcessPoolExecutor, workers: list) -> None:
    """Stop the pool now: SIGTERM each worker (it removes the entry it was building and exits),
    SIGKILL those still running after :data:`STOP_TIMEOUT_S`, then shut the pool down.

    The pool goes last: a broken pool's own thread (Python 3.12+) holds the lock ``shutdown``
    needs while it joins its workers without a timeout, so shutting it down first would wait for a
    worker that ignores SIGTERM instead of killing it."""
    for p in workers:
        if not _ended(p):
            p.terminate()
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for p in workers:
        if not _ended(p, max(0.0, deadline - time.monotonic())):
            log.warning("preparation worker %d did not stop within %.0f s: killing it", p.pid, STOP_TIMEOUT_S)
            p.kill()
            _ended(p, 5.0)
    pool.shutdown(wait=False, cancel_futures=True)


def _pool_workers(pool: ProcessPoolExecutor) -> list:
    """The pool's worker processes (no public handle before Python 3.14; the pool forgets them once broken)."""
    return list((getattr(pool, "_processes", None) or {}).values())


def _recorded_exit_code(process) -> int | None:
    """The exit code of a worker that has ended; None if it is running, or if its end was recorded
    by nobody within :data:`RECORD_WAIT_S`.

    A broken pool's own thread terminates and joins its workers while this thread asks: of two
    ``waitpid`` calls on one child only one gets its status, and the other's ``Process.exitcode``
    stays None until the winner has recorded it. So ask again until it is there, rather than once.
    Nothing is recorded if something else reaped it (``SIGCHLD`` ignored by the process).
    """
    if not _ended(process):
        return None
    deadline = time.monotonic() + RECORD_WAIT_S
    while (code := process.exitcode) is None and time.monotonic() < deadline:  # reaps it (WNOHANG), or
        time.sleep(EXIT_POLL_S)  # reads the winner's record once it is written
    return code


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
    ends = []
    for p in workers:
        code = _recorded_exit_code(p)
        if code is not None and code < 0:
            ends.append(f"PID {p.pid} killed by {_signal_name(-code)}")
        elif code and code != 128 + signal.SIGTERM:  # not one the broken pool stopped
            ends.append(f"PID {p.pid} exited with status {code}")
    how = "; ".join(ends) or "it ended abruptly"
    return DataError(
        f"a process preparing cases into {cache_root} died ({how}): killed from outside, or by the "
        "system for want of memory. The entries finished are kept; run the same command again, with "
        "fewer data.num_workers if memory is short."
    )


def _results(futures: list, pool: ProcessPoolExecutor, snapshot: list, cache_root: Path):
    """Each future's error (None if it succeeded) as it completes; :func:`_worker_died`'s error as
    soon as a worker has ended while work is pending.

    The pool's own thread may not be watching every worker: it builds its list of workers to
    watch when it starts to wait, and a worker the submits start just after (each submit wakes it,
    then starts a worker) is missing from it until the next result comes; a worker that dies
    meanwhile broke nothing the pool could see. So the workers are watched here too, every
    :data:`WATCH_S`.
    """
    pending = set(futures)
    while pending:
        done, pending = wait_futures(pending, timeout=WATCH_S, return_when=FIRST_COMPLETED)
        for fut in done:
            try:
                yield fut.result()[1]
            except BrokenProcessPool:
                raise _worker_died(_known_workers(snapshot, pool), cache_root) from None
        if pending and any(_ended(p) for p in _known_workers(snapshot, pool)):
            raise _worker_died(_known_workers(snapshot, pool), cache_root)


def preparation_workers(value) -> int:
    """``data.num_workers`` as a count of processes: ``auto`` = the cores this process may use (its
    affinity and cgroup quota: :func:`brats_seg.cpu.usable_cores`), else the positive integer given
    (``brats_seg.checks`` refused anything else). Preparation lowers it further to what memory holds
    (:func:`brats_seg.data.prep_memory.workers_that_fit`)."""
    if str(value).strip().lower() == "auto":
        from brats_seg.cpu import usable_cores

        return usable_cores()
    return max(1, int(value))


def run_in_workers(fn, args: list[tuple], num_workers: int, cache_root: Path, finished) -> None:
    """Run ``fn(*a)`` for each ``a`` of ``args`` in ``num_workers`` spawned processes (safe even if the
    parent has imported TensorFlow; ``fn`` returns ``(case_id, error or None)``), calling
    ``finished(error)`` as each ends; on any exception (a signal's too) the workers are stopped and
    what they left in ``cache_root`` is removed, then it is raised."""
    ctx = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(
        max_workers=num_workers, mp_context=ctx, initializer=_init_worker, initargs=(os.getpid(),)
    )
    workers: list = []
    try:
        with _signals_blocked():  # the workers are started by these submits
            try:
                futures = [pool.submit(fn, *a) for a in args]
            except BrokenProcessPool:  # one died already
                raise _worker_died(_pool_workers(pool), cache_root) from None
        workers = _pool_workers(pool)
        for err in _results(futures, pool, workers, cache_root):
            finished(err)
    except BaseException:
        _stop_workers(pool, _known_workers(workers, pool))  # an error, or SIGTERM/SIGINT: no worker goes on alone
        remove_stale_temporaries(cache_root)  # a worker that had to be killed left its folder (the lock is held)
        raise
    pool.shutdown()
