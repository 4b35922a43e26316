"""The preprocessing cache: one folder per case, written atomically, keyed by a fingerprint.

Layout under ``<cache_root>`` (one per dataset root and resolution)::

    <case_id>/image.npy     float16 (X, Y, Z, 4)  z-scored FLAIR, T1, T1ce, T2
    <case_id>/regions.npy   uint8   (X, Y, Z, R)  the layout's regions: WT, TC, ET[, RC] (absent unlabelled)
    <case_id>/meta.json     files, fingerprint, original grid, PreprocessRecord

An entry is built in a temporary folder renamed into place (:func:`brats_seg.files.atomic_dir`),
so a crash never leaves a half entry that is later read; it is valid only if its ``meta.json``
(written last) has the fingerprint of (layout, case files' size+mtime, preprocessing config):
a changed file or config rebuilds that entry and nothing else. Builders hold the cache's lock,
so the temporary folders (``.tmp-*``, ``.old-*``) the next holder finds are a dead builder's
and are removed at once.

Cases are prepared in spawned worker processes (``data.num_workers``), and the parent alone
decides when they stop: a worker ignores SIGINT (a terminal's Ctrl-C reaches the whole process
group), and SIGTERM -- sent by the parent when it is interrupted or fails, or on Linux when it
dies -- makes it remove the entry it was building and exit. A full disk ends in one
:class:`~brats_seg.files.DiskFullError` naming the entry and the free space (the entries built
stay valid; the next run builds only the missing ones); a case that runs out of memory gets a
:class:`~brats_seg.data.errors.CaseError` with its estimated memory, what was available and
the settings that would fit (:func:`preparation_memory_advice`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import multiprocessing
import os
import shutil
import signal
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from brats_seg.data.case_io import load_case_image, load_case_label
from brats_seg.data.errors import CaseError, DataError
from brats_seg.data.labels import labels_to_regions
from brats_seg.data.layouts import Case
from brats_seg.data.preprocess import estimate_preparation_bytes, preprocess_case
from brats_seg.files import DiskFullError, atomic_dir, format_bytes, is_temporary
from brats_seg.locks import LockedError, hold_lock, remove_stale_temporaries
from brats_seg.signals import report_progress

__all__ = [
    "IMAGE_FILE",
    "META_FILE",
    "REGIONS_FILE",
    "PREPROCESS_VERSION",
    "CacheEntry",
    "compute_fingerprint",
    "load_entry_meta",
    "STANDARD_RESOLUTIONS",
    "build_entry",
    "preparation_memory_advice",
    "prepare_cases",
]

log = logging.getLogger(__name__)

# An entry's files: this module writes them, CacheEntry and the input pipeline read them by these names.
IMAGE_FILE = "image.npy"  # float16 (x, y, z, 4): FLAIR, T1, T1ce, T2
REGIONS_FILE = "regions.npy"  # uint8 (x, y, z, R): the layout's regions, WT first
META_FILE = "meta.json"  # written last: marks the entry complete

PREPROCESS_VERSION = 2  # bump when preprocessing changes: every entry is rebuilt (2: z-score statistics summed in float64)

# configs/resolution (name, spacing in mm, network shape), finest first: what an out-of-memory
# message may suggest instead of the resolution that did not fit.
STANDARD_RESOLUTIONS = (
    ("2x", 0.5, (384, 448, 320)),
    ("full", 1.0, (192, 224, 160)),
    ("half", 2.0, (96, 112, 80)),
    ("tiny", 4.0, (48, 56, 40)),
)
_STOP_TIMEOUT_S = 10.0  # how long stopped workers get to remove their temporary folder before SIGKILL


@dataclass(frozen=True)
class CacheEntry:
    """A valid cache entry."""

    case_id: str
    path: Path
    has_label: bool

    @property
    def image_path(self) -> Path:
        return self.path / IMAGE_FILE

    @property
    def regions_path(self) -> Path:
        return self.path / REGIONS_FILE

    @property
    def meta(self) -> dict:
        return json.loads((self.path / META_FILE).read_text())


def compute_fingerprint(case: Case, spacing_mm: float, shape, allow_crop: bool) -> str:
    """Hash of what determines an entry: layout, each file's path/size/mtime, preprocessing config."""
    files = []
    for p in case.files:
        st = p.stat()
        files.append([str(p.resolve()), st.st_size, st.st_mtime_ns])
    key = {
        "version": PREPROCESS_VERSION,
        "layout": case.layout,
        "channels": list(case.channels),  # a 4D image's channel order (dataset.json's modality)
        "files": files,
        "spacing_mm": float(spacing_mm),
        "shape": [int(s) for s in shape],
        "allow_crop": bool(allow_crop),
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def load_entry_meta(entry_dir: Path) -> dict | None:
    """The entry's meta.json, or None if the entry is absent or incomplete."""
    try:
        return json.loads((Path(entry_dir) / META_FILE).read_text())
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError):
        return None


def build_entry(case: Case, cache_root: Path, spacing_mm: float, shape, allow_crop: bool, fingerprint: str) -> Path:
    """Preprocess one case and install its cache entry atomically.

    Raises:
        CaseError: the case's files are bad (nothing is written then).
        DiskFullError: no space left for the entry (the previous entry, if any, is intact).
    """
    image, ref = load_case_image(case)
    label_vol = load_case_label(case, ref)
    label = None if label_vol is None else label_vol.data.astype(np.uint8)
    out_image, out_label, record = preprocess_case(
        case.case_id, image, ref.spacing_mm, spacing_mm, shape, label=label, allow_crop=allow_crop
    )
    grid_src = label_vol if label_vol is not None else ref
    meta = {
        "case_id": case.case_id,
        "layout": case.layout,
        "images": [str(p.resolve()) for p in case.images],
        "channels": list(case.channels),
        "label": str(case.label.resolve()) if case.label is not None else None,
        "fingerprint": fingerprint,
        "preprocess_version": PREPROCESS_VERSION,
        "original_affine": grid_src.original_affine.tolist(),
        "original_shape": list(grid_src.original_shape),
        "record": record.to_dict(),
        "has_label": out_label is not None,
    }
    final = Path(cache_root) / case.case_id
    with atomic_dir(final) as tmp:
        with open(tmp / IMAGE_FILE, "wb") as f:
            np.save(_Stream(f), out_image.astype(np.float16))
        if out_label is not None:
            with open(tmp / REGIONS_FILE, "wb") as f:
                np.save(_Stream(f), labels_to_regions(out_label, case.layout))
        (tmp / META_FILE).write_text(json.dumps(meta, indent=1))  # last: marks the entry complete
    return final


class _Stream:
    """A file that NumPy writes with ``write`` (16 MB chunks) rather than C ``fwrite``: a full disk
    then raises OSError(ENOSPC), where ``fwrite``'s short write is reported without an errno
    ("N requested and M written") and could not be told from another failure."""

    def __init__(self, f) -> None:
        self.write = f.write


# ---------------------------------------------------------------------------------------
# Out of memory: what a case needs, what was there, what would fit
# ---------------------------------------------------------------------------------------


def _case_native_grid(case: Case) -> tuple[tuple, tuple] | None:
    """``(shape, zooms)`` of a case's first image, from its header (no voxels read), or None."""
    import nibabel as nib

    try:
        header = nib.load(str(case.images[0])).header
        return tuple(int(n) for n in header.get_data_shape()), tuple(float(z) for z in header.get_zooms())
    except Exception:  # noqa: BLE001 - a bad file is reported by its preparation, with its name
        return None


def preparation_memory_advice(native_shape, native_spacing_mm, spacing_mm: float, shape, num_workers: int,
                              available_bytes: int) -> tuple[str, str]:
    """``(what happened, what to do)`` for a case whose preparation ran out of memory, computed
    from its estimated memory (:func:`~brats_seg.data.preprocess.estimate_preparation_bytes`).

    ``available_bytes`` is measured while the other ``num_workers - 1`` workers hold their cases,
    so the workers had about ``available_bytes + (num_workers - 1) * need`` between them. The
    advice: as many workers as that holds (fewer than now); for a case that failed alone, the
    finest standard resolution whose case fits in what was available.

    Args:
        native_shape, native_spacing_mm: the case's grid (its first image's header).
        spacing_mm, shape: the resolution it was prepared at.
        num_workers: the cases prepared at once when it failed.
        available_bytes: memory available then.
    """
    need = estimate_preparation_bytes(native_shape, native_spacing_mm, spacing_mm, shape)
    num_workers = max(1, int(num_workers))
    room = int(available_bytes) + (num_workers - 1) * need
    grid = "x".join(str(int(n)) for n in native_shape[:3])
    zooms = "x".join(f"{float(z):g}" for z in native_spacing_mm[:3])
    at_once = (f"{num_workers} cases prepared at once (data.num_workers={num_workers})" if num_workers > 1
               else "one case prepared at a time")
    problem = (f"out of memory preparing it at {spacing_mm:g} mm: a case needs about {format_bytes(need)} "
               f"(estimated from its header: {grid} voxels of {zooms} mm) and {format_bytes(int(available_bytes))} "
               f"was available, with {at_once}")
    hints = []
    if num_workers > 1:  # the others' share alone holds a case, so fewer workers always fit
        workers = min(int(room // max(need, 1)), num_workers - 1)
        hints.append(f"data.num_workers={workers} (about {format_bytes(workers * need)} for {workers} "
                     f"case{'s' if workers > 1 else ''} at once)")
    else:
        for name, mm, net_shape in STANDARD_RESOLUTIONS:  # finest first
            nbytes = estimate_preparation_bytes(native_shape, native_spacing_mm, mm, net_shape)
            if mm > spacing_mm and nbytes <= room:
                hints.append(f"resolution={name} (about {format_bytes(nbytes)} a case at {mm:g} mm)")
                break
    if not hints:
        hints.append(f"none: no standard resolution coarser than {spacing_mm:g} mm fits in {format_bytes(room)}")
    note = ""
    if need <= available_bytes:  # the estimate fits what is free now: something else set the bound
        note = (f" By the estimate one more case fits in the {format_bytes(int(available_bytes))} available now, so a limit "
                "on this process (ulimit -v, a container's or job's memory limit) may be below the machine's "
                "free memory, or another program used it meanwhile.")
    fix = (f"Settings that would fit: {'; or '.join(hints)}. Or free memory (other programs) or use a machine with "
           f"more.{note} The cases already prepared are kept.")
    return problem, fix


def _out_of_memory_error(case: Case, spacing_mm: float, shape, num_workers: int) -> CaseError:
    """The :class:`CaseError` of a case whose preparation raised MemoryError, with the advice."""
    import psutil

    available = psutil.virtual_memory().available
    grid = _case_native_grid(case)
    if grid is None:
        return CaseError(case.case_id, case.images[0], f"out of memory preparing it ({format_bytes(available)} "
                         "available)", "Use fewer data.num_workers or a coarser resolution.")
    problem, fix = preparation_memory_advice(grid[0], grid[1], spacing_mm, shape, num_workers, available)
    return CaseError(case.case_id, None, problem, fix)


def _workers_that_fit(case: Case, spacing_mm: float, shape, num_workers: int) -> int:
    """``num_workers``, lowered so that the workers' cases fit in half the RAM available now.

    A case's memory is estimated from its first image's header (no voxels read): at 0.5 mm
    about 2.6 GB, so a 24 GB machine prepares 2x resolution one or a few cases at a time.
    """
    if num_workers <= 1:
        return max(num_workers, 1)
    import psutil

    grid = _case_native_grid(case)
    if grid is None:
        return num_workers
    per_case = estimate_preparation_bytes(grid[0], grid[1], spacing_mm, shape)
    fit = max(1, int(0.5 * psutil.virtual_memory().available // max(per_case, 1)))
    if fit < num_workers:
        log.info("preparing %d case(s) at a time instead of data.num_workers=%d: a case at %.2g mm needs "
                 "about %.1f GB", fit, num_workers, spacing_mm, per_case / 1e9)
    return min(num_workers, fit)


# ---------------------------------------------------------------------------------------
# Worker processes: the parent decides when they stop
# ---------------------------------------------------------------------------------------


class _WorkerStopped(SystemExit):
    """Raised in a worker by SIGTERM: unwinds the entry being built (its temporary folder is removed)."""


def _stop_worker(signum, frame):
    raise _WorkerStopped(128 + signum)


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
            raise _WorkerStopped(128 + signal.SIGTERM)
    except _WorkerStopped:
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


def _build_or_error(case: Case, cache_root: Path, spacing_mm, shape, allow_crop, fingerprint, num_workers: int = 1):
    """Build one entry: ``(case_id, None)``, or ``(case_id, CaseError)`` for a bad case or one that
    ran out of memory. A full disk raises :class:`DiskFullError`."""
    try:
        build_entry(case, cache_root, spacing_mm, shape, allow_crop, fingerprint)
        return case.case_id, None
    except CaseError as e:
        return case.case_id, e
    except MemoryError:
        pass  # the advice is computed below, once the case's arrays (held by the traceback) are freed
    except _WorkerStopped:
        os._exit(128 + signal.SIGTERM)  # the parent is stopping the pool: out of it at once
    return case.case_id, _out_of_memory_error(case, spacing_mm, shape, num_workers)


def _stop_workers(pool: ProcessPoolExecutor, workers: list) -> None:
    """Stop the pool now: SIGTERM each worker (it removes the entry it was building and exits),
    SIGKILL those still running after :data:`_STOP_TIMEOUT_S`."""
    for p in workers:
        if p.is_alive():
            p.terminate()
    pool.shutdown(wait=False, cancel_futures=True)
    deadline = time.monotonic() + _STOP_TIMEOUT_S
    for p in workers:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            log.warning("preparation worker %d did not stop within %.0f s: killing it", p.pid, _STOP_TIMEOUT_S)
            p.kill()
            p.join(5.0)


def _pool_workers(pool: ProcessPoolExecutor) -> list:
    """The pool's worker processes (no public handle before Python 3.14; the pool forgets them once broken)."""
    return list((getattr(pool, "_processes", None) or {}).values())


def _worker_died(workers: list, cache_root: Path) -> DataError:
    """The error for a worker that died (the OOM killer, a stray ``kill -9``): which, and how."""
    ends = []
    for p in workers:
        p.join(1.0)
        if p.exitcode is not None and p.exitcode < 0:
            ends.append(f"PID {p.pid} killed by {signal.Signals(-p.exitcode).name}")
        elif p.exitcode and p.exitcode != 128 + signal.SIGTERM:  # not one the broken pool stopped
            ends.append(f"PID {p.pid} exited with status {p.exitcode}")
    how = "; ".join(ends) or "it ended abruptly"
    return DataError(f"a process preparing cases into {cache_root} died ({how}): killed from outside, or by the "
                     "system for want of memory. The entries finished are kept; run the same command again, with "
                     "fewer data.num_workers if memory is short.")


def _has_leftovers(cache_root: Path) -> bool:
    try:
        return any(is_temporary(p) for p in cache_root.iterdir())
    except OSError:
        return False


# ---------------------------------------------------------------------------------------
# Preparing cases
# ---------------------------------------------------------------------------------------


def _stale(cases: list[Case], cache_root: Path, fingerprints: dict[str, str]) -> list[Case]:
    """The cases whose entry is missing or was made from other inputs or settings."""
    return [c for c in cases
            if (meta := load_entry_meta(cache_root / c.case_id)) is None or meta.get("fingerprint") != fingerprints[c.case_id]]



def _disk_full(exc: DiskFullError, cache_root: Path, n_done: int, n_todo: int) -> DiskFullError:
    """One error for a full disk: the entry and the free space (measured now that the workers'
    temporary folders are gone), and what is kept."""
    try:
        free = shutil.disk_usage(cache_root).free
    except OSError:
        free = exc.free_bytes
    built = "1 cache entry built before it is" if n_done == 1 else f"{n_done} cache entries built before it are"
    return DiskFullError(exc.path, free, f"The {built} complete and kept; the next run builds only the "
                         f"{n_todo - n_done} missing.")


def _build(todo: list[Case], n_cases: int, cache_root: Path, spacing_mm: float, shape, allow_crop: bool,
           fingerprints: dict[str, str], num_workers: int, progress: bool) -> list[CaseError]:
    """Build ``todo``'s entries (in ``num_workers`` spawned processes); the errors of the cases that failed.

    Raises:
        DiskFullError: no space for an entry (the pool is stopped; the entries built are kept).
        DataError: a worker process died (killed by the system, e.g. out of memory).
    """
    from tqdm.auto import tqdm

    errors: list[CaseError] = []
    if not todo:
        return errors
    num_workers = min(_workers_that_fit(todo[0], spacing_mm, shape, num_workers), len(todo))
    log.info("preprocessing %d of %d cases into %s (%d worker(s))", len(todo), n_cases, cache_root, num_workers)
    bar = tqdm(total=len(todo), desc="preparing cases", unit="case", disable=not progress)
    args = [(c, cache_root, spacing_mm, shape, allow_crop, fingerprints[c.case_id], num_workers) for c in todo]
    done = 0

    def finished(err: CaseError | None) -> None:
        nonlocal done
        if err is not None:
            errors.append(err)
        done += 1
        report_progress(f"{n_cases - len(todo) + done - len(errors)} of {n_cases} cases prepared")
        bar.update()

    report_progress(f"{n_cases - len(todo)} of {n_cases} cases prepared")
    try:
        if num_workers <= 1:
            for a in args:
                finished(_build_or_error(*a)[1])
        else:
            _build_in_workers(args, num_workers, cache_root, finished)
    except DiskFullError as e:
        raise _disk_full(e, cache_root, done - len(errors), len(todo)) from None
    finally:
        bar.close()
    return errors


def _build_in_workers(args: list[tuple], num_workers: int, cache_root: Path, finished) -> None:
    """Run :func:`_build_or_error` over ``args`` in spawned processes (safe even if the parent has
    imported TensorFlow), calling ``finished(error)`` as each ends; stopped on any exception."""
    ctx = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(max_workers=num_workers, mp_context=ctx, initializer=_init_worker,
                               initargs=(os.getpid(),))
    workers: list = []
    try:
        with _signals_blocked():  # the workers are started by these submits
            futures = [pool.submit(_build_or_error, *a) for a in args]
        workers = _pool_workers(pool)
        for fut in as_completed(futures):
            try:
                _, err = fut.result()
            except BrokenProcessPool:
                raise _worker_died(workers, cache_root) from None
            finished(err)
    except BaseException:
        _stop_workers(pool, workers or _pool_workers(pool))  # an error, or SIGTERM/SIGINT: no worker goes on alone
        remove_stale_temporaries(cache_root)  # a worker that had to be killed left its folder (the lock is held)
        raise
    pool.shutdown()


def prepare_cases(
    cases: list[Case],
    cache_root: str | Path,
    spacing_mm: float,
    shape,
    allow_crop: bool = False,
    num_workers: int = 2,
    progress: bool = True,
):
    """Make sure every case has a valid cache entry, building stale or missing ones in parallel.

    Args:
        cases: cases to prepare.
        cache_root: folder of this dataset+resolution's entries.
        spacing_mm, shape, allow_crop: preprocessing config.
        num_workers: worker processes (1 = in this process).
        progress: show a tqdm bar.

    Returns:
        ``(entries, errors, n_built)``: valid entries (sorted by case id), the
        :class:`CaseError` of each failed case, and how many entries were (re)built.

    Raises:
        DiskFullError: no space for an entry; the message names it and the free space (the
            entries built are kept, and the next run builds only the missing ones).

    Another process building entries in ``cache_root`` (a sweep's jobs start together) is
    waited for, then only what it left stale is built. SIGTERM/SIGINT (:mod:`brats_seg.signals`)
    stop the workers at once; the entries finished are kept.
    """
    cache_root = Path(cache_root)
    cache_root.mkdir(parents=True, exist_ok=True)
    fingerprints = {c.case_id: compute_fingerprint(c, spacing_mm, shape, allow_crop) for c in cases}
    errors: list[CaseError] = []  # of the cases built here
    todo = _stale(cases, cache_root, fingerprints)
    if todo:
        with hold_lock(cache_root, "cache entry", wait=True):  # another job building it: wait (a sweep's jobs share it)
            remove_stale_temporaries(cache_root)  # builders hold the lock: these are dead builders'
            todo = _stale(cases, cache_root, fingerprints)  # what another process built meanwhile is done
            errors = _build(todo, len(cases), cache_root, spacing_mm, shape, allow_crop, fingerprints, num_workers, progress)
    elif _has_leftovers(cache_root):
        with contextlib.suppress(LockedError), hold_lock(cache_root, "cache entry"):  # a live builder's are its own
            remove_stale_temporaries(cache_root)
    failed = {e.case_id for e in errors}
    entries = [
        CacheEntry(c.case_id, cache_root / c.case_id, c.label is not None) for c in cases if c.case_id not in failed
    ]
    return sorted(entries, key=lambda e: e.case_id), sorted(errors, key=lambda e: e.case_id), len(todo) - len(errors)
