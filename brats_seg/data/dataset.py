"""Discover -> validate -> preprocess -> cache -> split: a dataset ready for training.

:func:`prepare_dataset` is what ``scripts/prepare_data.py`` and ``train.py`` call: it
reports every bad case at once (naming case, file and fix), skips them with
``data.on_error=skip``, and otherwise raises after preparing the good ones, so nothing
already prepared is lost.
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from brats_seg.choices import check_choice
from brats_seg.config import DataConfig, OnError, ResolutionConfig
from brats_seg.data.cache import CacheEntry, prepare_cases, region_voxels
from brats_seg.data.errors import DataError
from brats_seg.data.layouts import discover_cases
from brats_seg.data.splits import load_split, make_split, save_split

__all__ = [
    "GENERATED",
    "PreparationFailed",
    "PreparedDataset",
    "compute_strata",
    "dataset_cache_dir",
    "ensure_synthetic",
    "prepare_dataset",
    "split_sizes",
]

log = logging.getLogger(__name__)


class PreparationFailed(DataError):
    """Some cases are bad and ``data.on_error=raise``; the message lists each of them."""

    def __init__(self, failures: list[tuple[str, str]], n_ok: int) -> None:
        self.failures = failures
        lines = "\n".join(f"  - {msg}" for _, msg in failures)
        super().__init__(
            f"{len(failures)} case(s) could not be prepared ({n_ok} prepared fine and are cached):\n{lines}\n"
            "Fix or remove these cases, or rerun with data.on_error=skip to leave them out."
        )


@dataclass
class PreparedDataset:
    """A dataset whose cases are cached at one resolution, with its split."""

    cache_root: Path
    entries: list[CacheEntry]
    split: dict
    split_path: Path
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (case_id, message)
    n_built: int = 0
    seconds: float = 0.0

    def entries_of(self, subset: str) -> list[CacheEntry]:
        """Entries of ``train`` | ``val`` | ``test`` | ``all``."""
        if subset == "all":
            return list(self.entries)
        ids = set(self.split[subset])
        return [e for e in self.entries if e.case_id in ids]


def dataset_cache_dir(data: DataConfig) -> Path:
    """``<cache_dir>/<name>_<hash of the root>``: one folder per dataset root."""
    root = str(Path(data.root).expanduser().resolve())
    return Path(data.cache_dir).expanduser() / f"{data.name}_{hashlib.sha256(root.encode()).hexdigest()[:8]}"


# data.name values whose root is generated on first use: the synthetic set and its cases of another seed
# no run trains on (synthetic_heldout), the MNI gliomas (seed 0), cases of another seed no run trains on
# (heldout), and each acquired as another scanner would (_shifted)
MNI_GLIOMAS = ("mni_gliomas", "mni_gliomas_shifted", "mni_gliomas_heldout", "mni_gliomas_heldout_shifted")
GENERATED = ("synthetic", "synthetic_heldout", *MNI_GLIOMAS)


def ensure_synthetic(data: DataConfig) -> None:
    """For ``data=synthetic``, ``data=mni_gliomas`` and ``data=mni_gliomas_shifted`` (the same cases
    acquired as another scanner would): generate the cases of ``data.root`` that are not there yet.

    Writing skips complete cases in milliseconds, and completes a case an interrupted
    run left half-written (each file is written atomically; the label file last).
    """
    if data.name in MNI_GLIOMAS:
        from brats_seg.data.phantoms.mni_gliomas import write_mni_glioma_dataset

        if data.layout != "brats2021":
            raise ValueError(f"data={data.name} is written in the brats2021 layout, got data.layout={data.layout!r}.")
        write_mni_glioma_dataset(
            Path(data.root), data.synthetic_cases, data.synthetic_seed, shift=data.name.endswith("_shifted")
        )
        return
    from brats_seg.data.phantoms.synthetic import write_synthetic_dataset

    write_synthetic_dataset(Path(data.root), data.layout, data.synthetic_cases, data.synthetic_seed)


def compute_strata(entries: list[CacheEntry]) -> dict[str, str]:
    """Each case's stratum: the regions its label map holds on the network grid, upper case in the
    layout's order (``"WT TC ET"``, ``"WT TC"`` for a tumour without enhancement, ``"none"``)."""
    strata = {}
    for e in entries:
        present = [name.upper() for name, n in region_voxels(e).items() if n > 0]
        strata[e.case_id] = " ".join(present) or "none"
    return strata


def split_sizes(data: DataConfig) -> tuple[int, int, int] | None:
    """``(train, val, test)`` case counts of ``data`` as preparing it would split it (the plain split's
    sizes; a stratified one's differ by a case or so), from its folder alone (nothing is read or
    written); None where ``data.root`` holds no dataset (yet)."""
    try:
        cases, _ = discover_cases(data.root, data.layout, require_labels=True, on_error="skip")
    except DataError:
        return None
    split = make_split([c.case_id for c in cases], data.val_fraction, data.test_fraction, data.split_seed)
    return len(split["train"]), len(split["val"]), len(split["test"])


def prepare_dataset(
    data: DataConfig,
    resolution: ResolutionConfig,
    progress: bool = True,
) -> PreparedDataset:
    """Prepare every labelled case of ``data`` at ``resolution`` and load or make the split.

    Raises:
        DatasetError: the dataset as a whole is unusable (root, dataset.json, no cases).
        PreparationFailed: bad cases with ``data.on_error=raise`` (the good ones are cached).
    """
    check_choice(
        data.on_error,
        OnError,
        "data.on_error",
        hint="raise stops at the first bad case; skip prepares the rest and lists the bad ones.",
    )
    t0 = time.perf_counter()
    if data.name in GENERATED:
        ensure_synthetic(data)
    cases, skipped = discover_cases(data.root, data.layout, require_labels=True, on_error=data.on_error)
    base = dataset_cache_dir(data)
    cache_root = base / resolution.name
    entries, errors, n_built = prepare_cases(
        cases, cache_root, resolution.spacing_mm, resolution.shape, data.allow_crop, data.num_workers, progress
    )
    failures = skipped + [(e.case_id, str(e)) for e in errors]
    if errors and data.on_error == "raise":
        raise PreparationFailed(failures, len(entries))
    for _case_id, msg in failures:
        log.warning("skipped %s", msg)
    if not entries:
        raise DataError(f"no case of {data.root} could be prepared; see the messages above.")

    # a file per kind of split, so runs with and without data.stratify never rewrite each other's
    split_path = base / f"split_seed{data.split_seed}{'_stratified' if data.stratify else ''}.json"
    split = make_split(
        [e.case_id for e in entries],
        data.val_fraction,
        data.test_fraction,
        data.split_seed,
        strata=compute_strata(entries) if data.stratify else None,
    )
    if not split_path.is_file() or load_split(split_path) != split:
        save_split(split, split_path)
    return PreparedDataset(
        cache_root=cache_root,
        entries=entries,
        split=split,
        split_path=split_path,
        skipped=failures,
        n_built=n_built,
        seconds=time.perf_counter() - t0,
    )
