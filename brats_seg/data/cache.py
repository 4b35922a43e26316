"""The preprocessing cache: one folder per case, written atomically, keyed by a fingerprint.

Layout under ``<cache_root>`` (one per dataset root and resolution)::

    <case_id>/image.npy     float16 (X, Y, Z, 4)  z-scored FLAIR, T1, T1ce, T2
    <case_id>/regions.npy   uint8   (X, Y, Z, R)  the layout's regions: WT, TC, ET[, RC] (absent unlabelled)
    <case_id>/meta.json     files, fingerprint, original grid, PreprocessRecord

An entry is built in ``.tmp-<case_id>-<random>/`` and renamed into place, so a crash
never leaves a half entry that is later read. It is valid only if its ``meta.json``
fingerprint equals the fingerprint of (layout, case files' size+mtime, preprocessing
config): a changed file or config rebuilds that entry and nothing else.
"""

from __future__ import annotations

import hashlib
import json
import logging
import multiprocessing
import os
import shutil
import time
import uuid
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from brats_seg.data.case_io import load_case_image, load_case_label
from brats_seg.data.errors import CaseError
from brats_seg.data.labels import labels_to_regions
from brats_seg.data.layouts import Case
from brats_seg.data.preprocess import estimate_preparation_bytes, preprocess_case
from brats_seg.files import hold_lock

__all__ = [
    "IMAGE_FILE",
    "META_FILE",
    "REGIONS_FILE",
    "PREPROCESS_VERSION",
    "CacheEntry",
    "compute_fingerprint",
    "load_entry_meta",
    "build_entry",
    "prepare_cases",
]

log = logging.getLogger(__name__)

# An entry's files: this module writes them, CacheEntry and the input pipeline read them by these names.
IMAGE_FILE = "image.npy"  # float16 (x, y, z, 4): FLAIR, T1, T1ce, T2
REGIONS_FILE = "regions.npy"  # uint8 (x, y, z, R): the layout's regions, WT first
META_FILE = "meta.json"  # written last: marks the entry complete

PREPROCESS_VERSION = 2  # bump when preprocessing changes: every entry is rebuilt (2: z-score statistics summed in float64)


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


def _write_npy(path: Path, array: np.ndarray) -> None:
    with open(path, "wb") as f:
        np.save(f, array)
        f.flush()
        os.fsync(f.fileno())


def build_entry(case: Case, cache_root: Path, spacing_mm: float, shape, allow_crop: bool, fingerprint: str) -> Path:
    """Preprocess one case and install its cache entry atomically.

    Raises:
        CaseError: the case's files are bad (nothing is written then).
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
    cache_root.mkdir(parents=True, exist_ok=True)
    final = cache_root / case.case_id
    tmp = cache_root / f".tmp-{case.case_id}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        _write_npy(tmp / IMAGE_FILE, out_image.astype(np.float16))
        if out_label is not None:
            _write_npy(tmp / REGIONS_FILE, labels_to_regions(out_label, case.layout))
        (tmp / META_FILE).write_text(json.dumps(meta, indent=1))  # last: marks the entry complete
        old = None
        if final.exists():
            old = cache_root / f".old-{case.case_id}-{uuid.uuid4().hex[:8]}"
            os.replace(final, old)
        os.replace(tmp, final)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def _build_or_error(case: Case, cache_root: Path, spacing_mm, shape, allow_crop, fingerprint):
    try:
        build_entry(case, cache_root, spacing_mm, shape, allow_crop, fingerprint)
        return case.case_id, None
    except CaseError as e:
        return case.case_id, e
    except MemoryError as e:
        return case.case_id, CaseError(case.case_id, None, f"out of memory while preprocessing ({e})",
                                       "Use fewer data.num_workers or a coarser resolution.")


def _workers_that_fit(case: Case, spacing_mm: float, shape, num_workers: int) -> int:
    """``num_workers``, lowered so that the workers' cases fit in half the RAM available now.

    A case's memory is estimated from its first image's header (no voxels read): at 0.5 mm
    about 2.6 GB, so a 24 GB machine prepares 2x resolution one or a few cases at a time.
    """
    if num_workers <= 1:
        return max(num_workers, 1)
    import nibabel as nib
    import psutil

    try:
        header = nib.load(str(case.images[0])).header
        native_shape, zooms = header.get_data_shape(), header.get_zooms()
    except Exception:  # noqa: BLE001 - a bad file is reported by its preparation, with its name
        return num_workers
    per_case = estimate_preparation_bytes(native_shape, zooms, spacing_mm, shape)
    fit = max(1, int(0.5 * psutil.virtual_memory().available // max(per_case, 1)))
    if fit < num_workers:
        log.info("preparing %d case(s) at a time instead of data.num_workers=%d: a case at %.2g mm needs "
                 "about %.1f GB", fit, num_workers, spacing_mm, per_case / 1e9)
    return min(num_workers, fit)


def _clean_stale(cache_root: Path, max_age_s: float = 3600.0) -> None:
    if not cache_root.is_dir():
        return
    now = time.time()
    for p in cache_root.iterdir():
        if p.name.startswith((".tmp-", ".old-")) and now - p.stat().st_mtime > max_age_s:
            shutil.rmtree(p, ignore_errors=True)


def _stale(cases: list[Case], cache_root: Path, fingerprints: dict[str, str]) -> list[Case]:
    """The cases whose entry is missing or was made from other inputs or settings."""
    return [c for c in cases
            if (meta := load_entry_meta(cache_root / c.case_id)) is None or meta.get("fingerprint") != fingerprints[c.case_id]]


def _build(todo: list[Case], n_cases: int, cache_root: Path, spacing_mm: float, shape, allow_crop: bool,
           fingerprints: dict[str, str], num_workers: int, progress: bool) -> list[CaseError]:
    """Build ``todo``'s entries (in ``num_workers`` spawned processes); the errors of the cases that failed."""
    from tqdm.auto import tqdm

    errors: list[CaseError] = []
    if not todo:
        return errors
    num_workers = _workers_that_fit(todo[0], spacing_mm, shape, num_workers)
    log.info("preprocessing %d of %d cases into %s (%d worker(s))", len(todo), n_cases, cache_root, num_workers)
    bar = tqdm(total=len(todo), desc="preparing cases", unit="case", disable=not progress)
    args = [(c, cache_root, spacing_mm, shape, allow_crop, fingerprints[c.case_id]) for c in todo]
    if num_workers <= 1 or len(todo) == 1:
        for _, err in (_build_or_error(*a) for a in args):
            if err is not None:
                errors.append(err)
            bar.update()
    else:
        # spawn: safe even if the parent has already imported TensorFlow.
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=min(num_workers, len(todo)), mp_context=ctx) as pool:
            for fut in as_completed([pool.submit(_build_or_error, *a) for a in args]):
                _, err = fut.result()
                if err is not None:
                    errors.append(err)
                bar.update()
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

    Another process building entries in ``cache_root`` (a sweep's jobs start together) is
    waited for, then only what it left stale is built.
    """
    cache_root = Path(cache_root)
    cache_root.mkdir(parents=True, exist_ok=True)
    _clean_stale(cache_root)
    fingerprints = {c.case_id: compute_fingerprint(c, spacing_mm, shape, allow_crop) for c in cases}
    errors: list[CaseError] = []  # of the cases built here
    todo = _stale(cases, cache_root, fingerprints)
    if todo:
        with hold_lock(cache_root, "cache entry", wait=True):  # another job building it: wait (a sweep's jobs share it)
            todo = _stale(cases, cache_root, fingerprints)  # what another process built meanwhile is done
            errors = _build(todo, len(cases), cache_root, spacing_mm, shape, allow_crop, fingerprints, num_workers, progress)
    failed = {e.case_id for e in errors}
    entries = [
        CacheEntry(c.case_id, cache_root / c.case_id, c.label is not None) for c in cases if c.case_id not in failed
    ]
    return sorted(entries, key=lambda e: e.case_id), sorted(errors, key=lambda e: e.case_id), len(todo) - len(errors)
