"""Folder locks: one process at a time trains a run folder, evaluates a split, writes a
prediction folder or builds a cache entry; the holder is named to whoever else tries.

:func:`hold_lock` takes ``<folder>/.lock`` with ``O_EXCL`` and records the holder (PID, its start
time, host, command, since when, and whatever the owner adds: :func:`update_lock`). A second
process is refused with one line naming the holder (or, for work the holder does for both,
waits); a lock left by a process that died on this host is taken over with a warning. While
holding it, the owner removes what writers killed by SIGKILL left
(:func:`remove_stale_temporaries`). :func:`file_lock` is a plain ``flock`` for short critical
sections (the MLflow SQLite store).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import socket
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from brats_seg.files import disk_full_error, is_temporary, write_text_atomic

__all__ = ["LockedError", "file_lock", "hold_lock", "remove_stale_temporaries", "update_lock"]

log = logging.getLogger(__name__)


def remove_stale_temporaries(folder: str | os.PathLike) -> list[Path]:
    """Delete the temporary files and folders (``.tmp-*``, ``.old-*``) that writers killed by
    SIGKILL (or a power cut) left under ``folder``, at any depth; returns what was deleted.

    Call it while holding ``folder``'s lock (:func:`hold_lock`): a live writer's temporary file
    looks the same as a dead one's. A sub-folder with its own lock held by a live process (an
    evaluation of the same run, a cache entry being built) is that process's and is left alone.
    Nothing a reader uses is touched: every final name is the writer's result, never a temporary.
    """
    folder = Path(folder)
    removed: list[Path] = []
    if not folder.is_dir():
        return removed
    stack = [folder]
    while stack:
        current = stack.pop()
        if current != folder and _held_by_another_live_process(current / ".lock"):
            log.debug("%s is locked by a live process; its temporaries are its own", current)
            continue
        try:
            children = sorted(current.iterdir())
        except OSError as e:
            log.debug("cannot list %s: %s", current, e)
            continue
        for child in children:
            if is_temporary(child):
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    child.unlink(missing_ok=True)
                removed.append(child)
            elif child.is_dir() and not child.is_symlink():
                stack.append(child)
    if removed:
        log.info(
            "removed %d temporary file(s) left by an interrupted writer under %s: %s",
            len(removed),
            folder,
            ", ".join(str(p.relative_to(folder)) for p in removed[:5]) + (" ..." if len(removed) > 5 else ""),
        )
    return removed


def _held_by_another_live_process(lock: Path) -> bool:
    try:
        holder = json.loads(lock.read_text() or "{}")
    except (OSError, ValueError):
        return False
    if not isinstance(holder, dict):
        return False
    if holder.get("host") != socket.gethostname():
        return bool(holder)  # another host's lock cannot be checked from here: leave its folder alone
    return holder.get("pid") != os.getpid() and _holder_is_alive(holder)


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


_RECORD_GRACE_S = 2.0  # s between a lock's O_EXCL create and its record, at most, for a live holder


def _age_s(path: Path) -> float:
    try:
        return time.time() - path.stat().st_mtime
    except OSError:
        return 0.0  # gone meanwhile: the next attempt creates it


def _holder_is_alive(holder: dict) -> bool:
    """The recorded holder still runs: same PID, started at the recorded time (not a reused PID)."""
    start = _process_start(int(holder.get("pid", -1)))
    recorded = holder.get("pid_start")  # None where the holder could not read its own start time
    return start is not None and (recorded is None or abs(start - float(recorded)) < 1.0)


@contextlib.contextmanager
def _folder_flock(folder: Path) -> Iterator[None]:
    """``flock`` on the folder itself for the ``with`` block (no file of its own is left behind)."""
    import fcntl

    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the flock


def _remove_dead_lock(lock: Path, dead: dict) -> bool:
    """Remove ``lock`` if it still holds the record ``dead`` (read and judged dead before); False if
    it changed meanwhile.

    Two processes can judge the same dead holder at once: without this, the second one's unlink
    removed the lock the first had just made, and both went on as holders (two sweep jobs removing
    each other's temporary folders in one cache). Takers therefore remove a dead lock one at a time,
    each after reading it again."""
    with _folder_flock(lock.parent):
        try:
            now = json.loads(lock.read_text() or "{}")
        except (OSError, ValueError):  # removed by the taker before us, or being written: look again
            return False
        if now != dead:
            return False
        lock.unlink(missing_ok=True)
        return True


@contextlib.contextmanager
def hold_lock(
    folder: str | os.PathLike,
    what: str,
    wait: bool = False,
    record: Mapping | None = None,
    on_takeover: Callable[[dict], None] | None = None,
) -> Iterator[Path]:
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
        record: more fields for the lock file (JSON-able), e.g. what the next start needs to
            tell why a holder died (:func:`update_lock` changes them while held).
        on_takeover: called with the dead holder's record when its lock is taken over.

    Raises:
        LockedError: a live process (or one on another host) holds the lock and ``wait`` is False.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    lock = folder / ".lock"
    host = socket.gethostname()
    me = {
        "pid": os.getpid(),
        "pid_start": _process_start(os.getpid()),
        "host": host,
        "command": " ".join(sys.argv)[:300],
        "since": time.strftime("%Y-%m-%d %H:%M:%S"),
        **(record or {}),
    }
    takeovers, told = 0, None
    while True:
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                holder = json.loads(lock.read_text() or "{}")
            except (OSError, ValueError):
                holder = {}
            if not isinstance(holder, dict):
                holder = {}
            if not holder and _age_s(lock) < _RECORD_GRACE_S:  # created this instant, its record not yet written
                time.sleep(0.05)
                continue
            if holder.get("pid") == os.getpid() and holder.get("host") == host:
                raise LockedError(f"{what} {folder} is already locked by this process ({lock}).") from None
            if holder.get("host") == host and not _holder_is_alive(holder):
                if not _remove_dead_lock(lock, holder):
                    continue  # another process took it over first: look again at who holds it now
                log.warning(
                    "%s %s: taking over the lock of PID %s (started %s, no longer running): %s",
                    what,
                    folder,
                    holder.get("pid", "?"),
                    holder.get("since", "?"),
                    lock,
                )
                if on_takeover is not None:
                    on_takeover(holder)
                takeovers += 1
                if takeovers > 3:
                    raise LockedError(
                        f"{what} {folder}: could not take {lock} (another process keeps taking it)."
                    ) from None
                continue
            where = "this host" if holder.get("host") == host else f"host {holder.get('host', '?')}"
            fix = (
                "wait for it to finish or stop it"
                if holder.get("host") == host
                else f"wait for it to finish or stop it; if that job is gone, delete {lock}"
            )
            busy = (
                f"{what} {folder} is in use by PID {holder.get('pid', '?')} on {where} since "
                f"{holder.get('since', '?')} ({holder.get('command', '?')})"
            )
            if not wait:
                raise LockedError(f"{busy}: {fix}, or use another folder.") from None
            if told is None or time.monotonic() - told >= 60.0:
                log.warning(
                    "%s: waiting for it%s",
                    busy,
                    "" if holder.get("host") == host else f" (if that job is gone, delete {lock})",
                )
                told = time.monotonic()
            time.sleep(0.5)
            continue
        try:
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps(me))
                f.flush()
                os.fsync(f.fileno())
        except OSError as e:
            lock.unlink(missing_ok=True)
            raise disk_full_error(e, lock) or e
        break
    try:
        yield lock
    finally:
        try:
            if json.loads(lock.read_text()).get("pid") == os.getpid():
                lock.unlink()
        except (OSError, ValueError):
            pass


def update_lock(lock: str | os.PathLike, **fields) -> None:
    """Add or change fields of a lock this process holds (atomically; the lock stays held).

    Does nothing if the lock is not this process's (taken over, or gone)."""
    lock = Path(lock)
    try:
        held = json.loads(lock.read_text())
    except (OSError, ValueError):
        return
    if held.get("pid") != os.getpid():
        return
    held.update(fields)
    try:
        write_text_atomic(lock, json.dumps(held))
    except OSError as e:  # the record is a diagnosis aid: a full disk must not stop the run here
        log.debug("lock %s not updated: %s", lock, e)
