"""Atomic file writes: the one helper every file a later step reads goes through.

A file is written to a temporary name in its own folder, flushed and fsynced, renamed
over the target, and the folder is fsynced, so a crash leaves either the old file or the
new one, never a half-written file that a later step reads as valid.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = ["LockedError", "atomic_path", "file_lock", "hold_lock", "write_bytes_atomic", "write_text_atomic"]

log = logging.getLogger(__name__)


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:  # some file systems do not open folders; the rename is still atomic
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = "") -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it replaces ``path`` atomically.

    Args:
        path: the final file; its folder is created.
        suffix: the temporary file's suffix, for writers that infer the format from it
            (``.nii.gz``, ``.keras``); default the final name's own suffixes.

    The writer inside the ``with`` block writes the temporary path; if the block raises,
    the temporary file is removed and ``path`` is untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".tmp-{path.name}.", suffix=suffix or "".join(path.suffixes))
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        with open(tmp_path, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp_path, path)
        _fsync_dir(path.parent)
    finally:
        tmp_path.unlink(missing_ok=True)


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically; returns the path."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8, newlines as given) to ``path`` atomically; returns the path."""
    return write_bytes_atomic(path, text.encode("utf-8"))


@contextlib.contextmanager
def file_lock(path: str | os.PathLike) -> Iterator[None]:
    """An exclusive advisory lock on ``path`` (created if missing) for the ``with`` block,
    across processes on this machine (``fcntl.flock``)."""
    import fcntl

    with open(path, "a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


class LockedError(RuntimeError):
    """Another live process holds the lock; the message names it and what to do."""


def _process_start(pid: int) -> float | None:
    """When process ``pid`` started (seconds since the epoch), or None if there is no such process."""
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return None


def _holder_is_alive(holder: dict) -> bool:
    """The recorded holder still runs: same PID, started at the recorded time (not a reused PID)."""
    start = _process_start(int(holder.get("pid", -1)))
    return start is not None and abs(start - float(holder.get("pid_start", start))) < 1.0


@contextlib.contextmanager
def hold_lock(folder: str | os.PathLike, what: str, wait: bool = False) -> Iterator[Path]:
    """Hold ``<folder>/.lock`` for the ``with`` block, or refuse if another live process holds it.

    The lock file records the holder (PID, its start time, host, command, since when). A lock
    left by a process that died (SIGKILL, a power cut) on this host is taken over with a
    warning; one held on another host cannot be checked from here and is refused, saying
    which file to delete if that job is gone.

    Args:
        folder: the folder to lock (created if missing).
        what: what the folder is, for the message (``run folder``, ``cache entry``).
        wait: wait for the holder instead of refusing (saying so when it starts and every
            minute): for work that the holder is doing for both, such as the jobs of a sweep
            building one cache entry.

    Raises:
        LockedError: a live process (or one on another host) holds the lock and ``wait`` is False.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    lock = folder / ".lock"
    host = socket.gethostname()
    me = {"pid": os.getpid(), "pid_start": _process_start(os.getpid()), "host": host,
          "command": " ".join(sys.argv)[:300], "since": time.strftime("%Y-%m-%d %H:%M:%S")}
    takeovers, told = 0, None
    while True:
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                holder = json.loads(lock.read_text() or "{}")
            except (OSError, ValueError):
                holder = {}
            if holder.get("pid") == os.getpid() and holder.get("host") == host:
                raise LockedError(f"{what} {folder} is already locked by this process ({lock}).") from None
            if holder.get("host") == host and not _holder_is_alive(holder):
                log.warning("%s %s: taking over the lock of PID %s (started %s, no longer running): %s",
                            what, folder, holder.get("pid", "?"), holder.get("since", "?"), lock)
                lock.unlink(missing_ok=True)
                takeovers += 1
                if takeovers > 3:
                    raise LockedError(f"{what} {folder}: could not take {lock} (another process keeps taking it).") \
                        from None
                continue
            where = "this host" if holder.get("host") == host else f"host {holder.get('host', '?')}"
            fix = ("wait for it to finish or stop it" if holder.get("host") == host else
                   f"wait for it to finish or stop it; if that job is gone, delete {lock}")
            busy = (f"{what} {folder} is in use by PID {holder.get('pid', '?')} on {where} since "
                    f"{holder.get('since', '?')} ({holder.get('command', '?')})")
            if not wait:
                raise LockedError(f"{busy}: {fix}, or use another folder.") from None
            if told is None or time.monotonic() - told >= 60.0:
                log.warning("%s: waiting for it%s", busy, "" if holder.get("host") == host else
                            f" (if that job is gone, delete {lock})")
                told = time.monotonic()
            time.sleep(0.5)
            continue
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(me))
            f.flush()
            os.fsync(f.fileno())
        break
    try:
        yield lock
    finally:
        try:
            if json.loads(lock.read_text()).get("pid") == os.getpid():
                lock.unlink()
        except (OSError, ValueError):
            pass
