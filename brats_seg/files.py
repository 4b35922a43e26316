"""Atomic file writes and disk-full errors: the helpers every file a later step reads goes through.

A file is written to a temporary name in its own folder, flushed and fsynced, renamed
over the target, and the folder is fsynced, so a crash leaves either the old file or the
new one, never a half-written file that a later step reads as valid (:func:`atomic_path`;
a folder of files, such as a cache entry, likewise with :func:`atomic_dir`). A write that
runs out of space raises :class:`DiskFullError` naming the file and the free space, and the
previous file is left as it was. A writer killed by SIGKILL leaves at most a temporary name
(``.tmp-*``, ``.old-*``; :func:`is_temporary`) that readers skip and the folder's owner deletes
while holding the folder's lock (:func:`brats_seg.locks.remove_stale_temporaries`).

Crash points (for tests): with ``BRATS_SEG_CRASH_AT=<file name pattern>[:<n>[:after[:stop]]]`` in
the environment, the process kills itself with SIGKILL at the ``n``-th (default first) atomic write
of a file whose name matches the pattern (``fnmatch``), once the temporary file is complete but
before it replaces the target (``after``: just after). Every write goes through here, so one
variable reaches every moment a file changes (``last.keras``, ``state.json``, a cache entry,
a prediction); tests use it to show that a run killed there and run again ends as an
uninterrupted one does. With ``:stop`` (``<pattern>:<n>:before:stop``) the process stops itself
(SIGSTOP) there instead: a test then sends the signal it means to test and SIGCONT, so the signal
lands at that moment however loaded the machine is (a test that polls for a file and then
signals can lose the race to a run that finishes first).
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import logging
import os
import re
import shutil
import signal
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

__all__ = [
    "DiskFullError",
    "atomic_dir",
    "atomic_path",
    "disk_full_error",
    "file_identity",
    "format_bytes",
    "free_bytes",
    "is_disk_full",
    "is_temporary",
    "write_bytes_atomic",
    "write_text_atomic",
]

log = logging.getLogger(__name__)

_NO_SPACE = {errno.ENOSPC, errno.EDQUOT}
_TEMPORARY_PREFIXES = (".tmp-", ".old-")  # names this module gives files and folders not (or no longer) in place
_NO_SPACE_WORDS = ("no space left on device", "disk quota exceeded", "database or disk is full")
_SHORT_WRITE = re.compile(r"\d+ requested and \d+ written")


class DiskFullError(OSError):
    """A write ran out of space (ENOSPC, or a quota); the message names the file and the free space.

    Attributes:
        path: the file being written.
        free_bytes: free bytes on its file system when the error was raised (None if unknown).
    """

    def __init__(self, path: str | os.PathLike, free_bytes: int | None, what: str = "") -> None:
        self.path, self.free_bytes, self.what = Path(path), free_bytes, what
        free = "unknown" if free_bytes is None else format_bytes(free_bytes)
        kept = f" {what}" if what else " The previous version of the file, if any, is intact."
        super().__init__(
            errno.ENOSPC,
            f"no space left on the device writing {self.path} ({free} free there).{kept} "
            "Free some space (or point the folder elsewhere) and run the same command again.",
        )

    def __str__(self) -> str:
        return self.strerror

    def __reduce__(self):  # picklable across worker processes
        return (type(self), (self.path, self.free_bytes, self.what))


def format_bytes(nbytes: float) -> str:
    """Bytes for a message, in SI units (1 GB = 1e9 bytes), as the plans print them: ``12.35 GB``,
    ``840.2 MB``, ``3.1 kB``, ``512 B``."""
    nbytes = float(nbytes)
    for unit, scale, digits in (("TB", 1e12, 2), ("GB", 1e9, 2), ("MB", 1e6, 1), ("kB", 1e3, 1)):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:.{digits}f} {unit}"
    return f"{int(nbytes)} B"


def free_bytes(path: Path) -> int | None:
    """Free bytes on the file system of ``path`` or of its nearest existing parent (None if unknown)."""
    for folder in (path, *path.parents):
        try:
            return shutil.disk_usage(folder).free
        except OSError:
            continue
    return None


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc``, or an exception that caused it, says the disk (or a quota) is full: ENOSPC,
    EDQUOT, or a library's own words for it (SQLite's "database or disk is full")."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, DiskFullError):
            return True
        if isinstance(exc, OSError) and exc.errno in _NO_SPACE:
            return True
        if any(w in str(exc).lower() for w in _NO_SPACE_WORDS):
            return True
        if isinstance(exc, OSError) and exc.errno is None and _SHORT_WRITE.search(str(exc)):
            return True  # numpy's tofile/np.save to a path: a short write, no errno
        exc = exc.__cause__ or exc.__context__
    return False


def disk_full_error(exc: BaseException, path: str | os.PathLike, what: str = "") -> DiskFullError | None:
    """A :class:`DiskFullError` for ``path`` if ``exc`` (or what caused it) is an out-of-space
    error, else None. Libraries wrap ENOSPC in their own exceptions (h5py, zipfile, SQLite's
    "database or disk is full"), so the chain and the message are both looked at."""
    if isinstance(exc, DiskFullError):
        return exc if not what or exc.what else DiskFullError(exc.path, exc.free_bytes, what)
    if not is_disk_full(exc):
        return None
    return DiskFullError(path, free_bytes(Path(path)), what)


def _file_mode() -> int:
    """The mode ``open()`` gives a new file here: 0o666 less the process's umask."""
    try:  # Linux reports it without changing it
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


_FILE_MODE = _file_mode()
_crash_counts: dict[str, int] = {}


def _crash_point(path: Path, moment: str) -> None:
    """SIGKILL this process if ``BRATS_SEG_CRASH_AT`` names this write (see the module doc)."""
    spec = os.environ.get("BRATS_SEG_CRASH_AT")
    if not spec:
        return
    pattern, _, rest = spec.partition(":")
    nth, _, rest = rest.partition(":")
    when, _, action = rest.partition(":")
    if not fnmatch.fnmatch(path.name, pattern):
        return
    if moment == "before":  # each write counted once
        _crash_counts[spec] = _crash_counts.get(spec, 0) + 1
    if (when or "before") == moment and _crash_counts.get(spec, 0) == int(nth or 1):
        stop = action == "stop"
        log.warning(
            "BRATS_SEG_CRASH_AT=%s: %s this process %s %s is replaced",
            spec,
            "stopping" if stop else "killing",
            moment,
            path,
        )
        for handler in logging.getLogger().handlers:
            handler.flush()
        os.kill(os.getpid(), signal.SIGSTOP if stop else signal.SIGKILL)


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
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(
            dir=path.parent, prefix=f".tmp-{path.name}.", suffix=suffix or "".join(path.suffixes)
        )
    except OSError as e:
        raise disk_full_error(e, path) or e
    os.fchmod(fd, _FILE_MODE)  # mkstemp makes 0600: the file gets what open() would give it (shared run folders)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        try:
            yield tmp_path
            with open(tmp_path, "rb+") as f:
                os.fsync(f.fileno())
        except Exception as e:
            full = disk_full_error(e, path)
            if full is None:
                raise
            tmp_path.unlink(missing_ok=True)  # give the space back before saying how much is free
            raise DiskFullError(path, free_bytes(path)) from e
        _crash_point(path, "before")
        _replace(tmp_path, path)
        _fsync_dir(path.parent)
        _crash_point(path, "after")
    finally:
        tmp_path.unlink(missing_ok=True)


def _replace(src: Path, dst: Path) -> None:
    """``os.replace``; a file system that needs a block for the new name says so as :class:`DiskFullError`."""
    try:
        os.replace(src, dst)
    except OSError as e:
        raise disk_full_error(e, dst) or e


def _fsync_tree(folder: Path) -> None:
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
    for d in sorted((p for p in folder.rglob("*") if p.is_dir()), reverse=True):
        _fsync_dir(d)
    _fsync_dir(folder)


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary folder beside ``path``; on success it replaces ``path`` (a folder) atomically.

    The writer fills the temporary folder; its files are fsynced, an existing ``path`` is moved
    aside, the new folder renamed into place and the old one removed, so a crash leaves the old
    folder, the new one, or a ``.tmp-``/``.old-`` folder that the owner cleans (never a half
    folder under the final name). Out of space: :class:`DiskFullError`, the old folder intact.
    """
    path = Path(path)
    tmp = path.parent / f".tmp-{path.name}-{uuid.uuid4().hex[:8]}"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
    except OSError as e:
        raise disk_full_error(e, path) or e
    try:
        try:
            yield tmp
            _fsync_tree(tmp)
        except Exception as e:
            if disk_full_error(e, path) is None:
                raise
            shutil.rmtree(tmp, ignore_errors=True)  # give the space back before saying how much is free
            raise DiskFullError(path, free_bytes(path)) from e
        _crash_point(path, "before")
        old = None
        if path.exists():
            old = path.parent / f".old-{path.name}-{uuid.uuid4().hex[:8]}"
            _replace(path, old)
        try:
            _replace(tmp, path)
        except BaseException:
            if old is not None:  # the old folder back under its name: never no folder at all
                os.replace(old, path)
            raise
        _fsync_dir(path.parent)
        _crash_point(path, "after")
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically; returns the path."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8, newlines as given) to ``path`` atomically; returns the path."""
    return write_bytes_atomic(path, text.encode("utf-8"))


def file_identity(path: str | os.PathLike) -> list[int] | None:
    """``[size, mtime_ns]`` of a file, None if it is missing: a rewritten file has another.

    A list (not a tuple) because it is stored in JSON records (an evaluation's ``cases/<id>.json``,
    ``predict.json``) and compared with what is read back from them."""
    try:
        st = Path(path).stat()
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns]


def is_temporary(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a temporary name of this module (``.tmp-*``, ``.old-*``): a write not (or
    no longer) in place, which readers listing a folder must skip. Its suffix may be the final file's
    (``.tmp-x.nii.gz.k3j2.nii.gz``), so a pattern such as ``*.nii.gz`` alone does not exclude it."""
    return Path(path).name.startswith(_TEMPORARY_PREFIXES)
