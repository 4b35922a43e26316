"""The preprocessing cache: one folder per case, written atomically, keyed by a fingerprint.

Layout under ``<cache_root>`` (one per dataset root and resolution)::

    <case_id>/image.npy     float16 (X, Y, Z, 4)  z-scored FLAIR, T1, T1ce, T2
    <case_id>/regions.npy   uint8   (X, Y, Z, R)  the layout's regions: WT, TC, ET[, RC] (absent unlabelled)
    <case_id>/meta.json     files, fingerprint, original grid, PreprocessRecord, voxels per region

An entry is built in a temporary folder renamed into place (:func:`brats_seg.files.atomic_dir`),
so a crash never leaves a half entry that is later read; it is valid only if its ``meta.json``
(written last) has the fingerprint of (layout, case files' size+mtime, preprocessing config):
a changed file or config rebuilds that entry and nothing else. Builders hold the cache's lock,
so the temporary folders (``.tmp-*``, ``.old-*``) the next holder finds are a dead builder's
and are removed at once.

Cases are prepared in spawned worker processes (``data.num_workers``) that the parent alone
stops (:mod:`brats_seg.data.workers`). A full disk ends in one
:class:`~brats_seg.files.DiskFullError` naming the entry and the free space (the entries built
stay valid; the next run builds only the missing ones); a case that runs out of memory gets a
:class:`~brats_seg.data.errors.CaseError` with its estimated memory, what was available and
the settings that would fit (:mod:`brats_seg.data.prep_memory`).

What the entries will take is known before anything is written: every case is resampled onto the
resolution's fixed grid, so an entry's size is the grid's voxels times 8 bytes (float16, four
contrasts) plus one byte per region when labelled, and meta.json (:func:`entry_bytes`,
:func:`predict_cache_bytes`). :func:`prepare_cases` compares that with the disk's free space
before it creates anything and raises :class:`~brats_seg.data.errors.CacheSpaceError` if it does
not fit.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import logging
import os
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from brats_seg.data.case_io import load_case_image, load_case_label
from brats_seg.data.errors import CacheSpaceError, CaseError
from brats_seg.data.labels import labels_to_regions, region_names
from brats_seg.data.layouts import Case
from brats_seg.data.prep_memory import out_of_memory_error, workers_that_fit
from brats_seg.data.preprocess import preprocess_case
from brats_seg.data.workers import WorkerStopped, run_in_workers
from brats_seg.files import DiskFullError, atomic_dir, format_bytes, free_bytes, is_temporary, write_text_atomic
from brats_seg.locks import LockedError, hold_lock, remove_stale_temporaries
from brats_seg.signals import report_progress

__all__ = [
    "IMAGE_FILE",
    "META_FILE",
    "PREPROCESS_VERSION",
    "REGIONS_FILE",
    "CacheEntry",
    "build_entry",
    "cache_bytes_on_disk",
    "compute_fingerprint",
    "entry_bytes",
    "load_entry_meta",
    "predict_cache_bytes",
    "prepare_cases",
    "region_voxels",
]

log = logging.getLogger(__name__)

# An entry's files: this module writes them, CacheEntry and the input pipeline read them by these names.
IMAGE_FILE = "image.npy"  # float16 (x, y, z, 4): FLAIR, T1, T1ce, T2
REGIONS_FILE = "regions.npy"  # uint8 (x, y, z, R): the layout's regions, WT first
META_FILE = "meta.json"  # written last: marks the entry complete

PREPROCESS_VERSION = (
    2  # bump when preprocessing changes: every entry is rebuilt (2: z-score statistics summed in float64)
)


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


def _count_regions(regions: np.ndarray, layout: str) -> dict[str, int]:
    """Voxels of each region of a ``(x, y, z, R)`` regions array, by the layout's region names."""
    return {name: int(np.count_nonzero(regions[..., i])) for i, name in enumerate(region_names(layout))}


def region_voxels(entry: CacheEntry) -> dict[str, int]:
    """Voxels of each region on the network grid (``{"WT": n, "TC": n, "ET": n}``); ``{}`` unlabelled.

    Recorded in ``meta.json`` when the entry is built; an entry built before that is counted
    from its ``regions.npy`` once, and the count added to its ``meta.json`` (rewritten
    atomically: the entry stays valid throughout), so a split of 1,251 full-resolution cases
    does not read 25 GB each time it is made.
    """
    meta = entry.meta
    if "region_voxels" in meta:
        return dict(meta["region_voxels"])
    if not entry.has_label:
        return {}
    counts = _count_regions(np.load(entry.regions_path, mmap_mode="r"), meta["layout"])
    write_text_atomic(entry.path / META_FILE, json.dumps({**meta, "region_voxels": counts}, indent=1))
    return counts


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
    regions = None if out_label is None else labels_to_regions(out_label, case.layout)
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
        "region_voxels": {} if regions is None else _count_regions(regions, case.layout),  # the split's strata
    }
    final = Path(cache_root) / case.case_id
    with atomic_dir(final) as tmp:
        with open(tmp / IMAGE_FILE, "wb") as f:
            np.save(_Stream(f), out_image.astype(np.float16))
        if regions is not None:
            with open(tmp / REGIONS_FILE, "wb") as f:
                np.save(_Stream(f), regions)
        (tmp / META_FILE).write_text(json.dumps(meta, indent=1))  # last: marks the entry complete
    return final


class _Stream:
    """A file that NumPy writes with ``write`` (16 MB chunks) rather than C ``fwrite``: a full disk
    then raises OSError(ENOSPC), where ``fwrite``'s short write is reported without an errno
    ("N requested and M written") and could not be told from another failure."""

    def __init__(self, f) -> None:
        self.write = f.write


# ---------------------------------------------------------------------------------------
# What entries take on disk
# ---------------------------------------------------------------------------------------

_BLOCK = 4096  # a file system block: files and folders take whole blocks
_META_BYTES = 4096  # meta.json: paths and the preprocessing record, 1-3 kB; one block


def _blocks(nbytes: int) -> int:
    return -(-int(nbytes) // _BLOCK) * _BLOCK


def _npy_bytes(shape, dtype) -> int:
    """Bytes of the ``.npy`` file ``np.save`` writes for an array of ``shape`` and ``dtype``."""
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        header, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False, "shape": tuple(shape)}
    )
    return len(header.getvalue()) + int(np.prod(shape)) * np.dtype(dtype).itemsize


def entry_bytes(shape, n_channels: int = 4, n_regions: int | None = 3) -> int:
    """Disk bytes of one cache entry on the grid ``shape``: ``image.npy`` (float16), ``regions.npy``
    (uint8, ``n_regions`` channels; None for an unlabelled case), ``meta.json`` and the folder."""
    image = _blocks(_npy_bytes(tuple(shape) + (n_channels,), np.float16))
    regions = 0 if n_regions is None else _blocks(_npy_bytes(tuple(shape) + (n_regions,), np.uint8))
    return image + regions + _META_BYTES + _BLOCK


def _case_bytes(case: Case, shape) -> int:
    n_regions = len(region_names(case.layout)) if case.label is not None else None
    return entry_bytes(shape, 4, n_regions)


def predict_cache_bytes(cases: list[Case], shape) -> int:
    """What the entries of ``cases`` will take on disk at a resolution whose grid is ``shape``."""
    return sum(_case_bytes(c, shape) for c in cases)


def cache_bytes_on_disk(cache_root: str | Path) -> int:
    """Bytes the entries under ``cache_root`` take on disk now (allocated blocks, folders included)."""
    total = 0
    for path in Path(cache_root).rglob("*"):
        with contextlib.suppress(OSError):
            total += path.stat().st_blocks * 512
    return total


def _check_space(todo: list[Case], cache_root: Path, shape) -> int:
    """The bytes ``todo``'s entries will take; :class:`CacheSpaceError` if the disk has less free
    (checked before anything is written: an entry rebuilt is counted whole, as its old version is
    removed only once the new one is in place)."""
    need = predict_cache_bytes(todo, shape)
    free = free_bytes(cache_root)
    if todo:
        log.info(
            "%d cache entr%s to build: %s (%s each) into %s, %s free there",
            len(todo),
            "y" if len(todo) == 1 else "ies",
            format_bytes(need),
            format_bytes(need / len(todo)),
            cache_root,
            "unknown" if free is None else format_bytes(free),
        )
    if free is not None and need > free:
        raise CacheSpaceError(cache_root, need, free, len(todo), _case_bytes(todo[0], shape), shape)
    return need


# ---------------------------------------------------------------------------------------
# Building entries
# ---------------------------------------------------------------------------------------


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
    except WorkerStopped:
        os._exit(128 + signal.SIGTERM)  # the parent is stopping the pool: out of it at once
    return case.case_id, out_of_memory_error(case, spacing_mm, shape, num_workers)


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
    return [
        c
        for c in cases
        if (meta := load_entry_meta(cache_root / c.case_id)) is None
        or meta.get("fingerprint") != fingerprints[c.case_id]
    ]


def _disk_full(exc: DiskFullError, cache_root: Path, n_valid: int, n_cases: int) -> DiskFullError:
    """One error for a full disk: the entry, the free space and the entries kept, both measured now
    that the workers are stopped and their temporary folders gone (counted from the disk: with
    several workers, which finished first and which result the parent saw first are races)."""
    try:
        free = shutil.disk_usage(cache_root).free
    except OSError:
        free = exc.free_bytes
    return DiskFullError(
        exc.path,
        free,
        f"{n_valid} of the {n_cases} cache entries are complete and kept; the next "
        f"run builds only the {n_cases - n_valid} missing.",
    )


def _build(
    todo: list[Case],
    n_cases: int,
    cache_root: Path,
    spacing_mm: float,
    shape,
    allow_crop: bool,
    fingerprints: dict[str, str],
    num_workers: int,
    progress: bool,
) -> list[CaseError]:
    """Build ``todo``'s entries (in ``num_workers`` spawned processes); the errors of the cases that failed.

    Raises:
        DiskFullError: no space for an entry (the pool is stopped; the entries built are kept).
        DataError: a worker process died (killed by the system, e.g. out of memory).
    """
    from tqdm.auto import tqdm

    errors: list[CaseError] = []
    if not todo:
        return errors
    num_workers = min(workers_that_fit(todo[0], spacing_mm, shape, num_workers), len(todo))
    log.info("preprocessing %d of %d cases into %s (%d worker(s))", len(todo), n_cases, cache_root, num_workers)
    bar = tqdm(total=len(todo), desc="preparing cases", unit="case", disable=not progress)
    need = predict_cache_bytes(todo, shape)  # the bar shows cases/s and the ETA, and the bytes written
    bar.set_postfix_str(f"0 B of {format_bytes(need)}", refresh=False)
    args = [(c, cache_root, spacing_mm, shape, allow_crop, fingerprints[c.case_id], num_workers) for c in todo]
    done = 0

    def finished(err: CaseError | None) -> None:
        nonlocal done
        if err is not None:
            errors.append(err)
        done += 1
        bar.set_postfix_str(f"{format_bytes(need * done / len(todo))} of {format_bytes(need)}", refresh=False)
        report_progress(f"{n_cases - len(todo) + done - len(errors)} of {n_cases} cases prepared")
        bar.update()

    report_progress(f"{n_cases - len(todo)} of {n_cases} cases prepared")
    try:
        if num_workers <= 1:
            for a in args:
                finished(_build_or_error(*a)[1])
        else:
            run_in_workers(_build_or_error, args, num_workers, cache_root, finished)
    except DiskFullError as e:
        raise _disk_full(e, cache_root, n_cases - len(_stale(todo, cache_root, fingerprints)), n_cases) from None
    finally:
        bar.close()
    return errors


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
        CacheSpaceError: the entries to build take more than the disk has free (predicted from
            the grid; nothing is written).
        DiskFullError: no space for an entry; the message names it and the free space (the
            entries built are kept, and the next run builds only the missing ones).

    Another process building entries in ``cache_root`` (a sweep's jobs start together) is
    waited for, then only what it left stale is built. SIGTERM/SIGINT (:mod:`brats_seg.signals`)
    stop the workers at once; the entries finished are kept.
    """
    cache_root = Path(cache_root)
    fingerprints = {c.case_id: compute_fingerprint(c, spacing_mm, shape, allow_crop) for c in cases}
    errors: list[CaseError] = []  # of the cases built here
    todo = _stale(cases, cache_root, fingerprints) if cache_root.is_dir() else list(cases)
    _check_space(todo, cache_root, shape)  # before anything is written
    cache_root.mkdir(parents=True, exist_ok=True)
    if todo:
        with hold_lock(cache_root, "cache entry", wait=True):  # another job building it: wait (a sweep's jobs share it)
            remove_stale_temporaries(cache_root)  # builders hold the lock: these are dead builders'
            todo = _stale(cases, cache_root, fingerprints)  # what another process built meanwhile is done
            errors = _build(
                todo, len(cases), cache_root, spacing_mm, shape, allow_crop, fingerprints, num_workers, progress
            )
    elif _has_leftovers(cache_root):
        with contextlib.suppress(LockedError), hold_lock(cache_root, "cache entry"):  # a live builder's are its own
            remove_stale_temporaries(cache_root)
    failed = {e.case_id for e in errors}
    entries = [
        CacheEntry(c.case_id, cache_root / c.case_id, c.label is not None) for c in cases if c.case_id not in failed
    ]
    return sorted(entries, key=lambda e: e.case_id), sorted(errors, key=lambda e: e.case_id), len(todo) - len(errors)
