"""Discover -> validate -> preprocess -> cache -> split: a dataset ready for training.

:func:`prepare_dataset` is what ``scripts/prepare_data.py`` and ``train.py`` call: it
reports every bad case at once (naming case, file and fix), skips them with
``data.on_error=skip``, and otherwise raises after preparing the good ones, so nothing
already prepared is lost.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from brats_seg.choices import check_choice
from brats_seg.config import DataConfig, OnError, ResolutionConfig
from brats_seg.data.cache import CacheEntry, prepare_cases, region_voxels
from brats_seg.data.errors import DataError
from brats_seg.data.folds import FOLDS_KIND, SplitFileError, check_fold, fold_split, make_folds, read_split_file
from brats_seg.data.layouts import discover_cases
from brats_seg.data.splits import make_split, save_split
from brats_seg.data.workers import preparation_workers

__all__ = [
    "GENERATED",
    "PreparationFailed",
    "PreparedDataset",
    "compute_strata",
    "dataset_cache_dir",
    "ensure_synthetic",
    "prepare_dataset",
    "run_split",
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


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def dataset_cache_dir(data: DataConfig) -> Path:
    """``<cache_dir>/<name>_<hash of the root>``: one folder per dataset root."""
    root = str(Path(data.root).expanduser().resolve())
    return Path(data.cache_dir).expanduser() / f"{data.name}_{hashlib.sha256(root.encode()).hexdigest()[:8]}"


# data.name values whose root is generated on first use: the synthetic set and its cases of another seed
# no run trains on (synthetic_heldout), the MNI gliomas (seed 0), cases of another seed no run trains on
# (heldout), and each acquired as another scanner would (_shifted)
MNI_GLIOMAS = (
    "mni_gliomas",
    "mni_gliomas_shifted",
    "mni_gliomas_heldout",
    "mni_gliomas_heldout_shifted",
    "mni_gliomas_heldout2",
)
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
    """``(train, val, test)`` case counts of ``data`` as preparing it would split it (a fold's, a split
    file's, or the plain split's; a stratified one's differ by a case or so), from its folder alone
    (nothing is written); None where ``data.root`` holds no dataset (yet)."""
    try:
        cases, _ = discover_cases(data.root, data.layout, require_labels=True, on_error="skip")
    except DataError:
        return None
    split, _, _ = run_split(data, [c.case_id for c in cases], None, dataset_cache_dir(data))
    return len(split["train"]), len(split["val"]), len(split["test"])


def _split_path(data: DataConfig, base: Path) -> Path:
    # a file per kind of split, so runs with and without data.stratify never rewrite each other's
    return base / f"split_seed{data.split_seed}{'_stratified' if data.stratify else ''}.json"


def run_split(
    data: DataConfig, case_ids: list[str], strata: dict[str, str] | None, base: Path
) -> tuple[dict, Path, list[tuple[Path, dict]]]:
    """The split a run of ``data`` trains on (:mod:`brats_seg.data.folds`): ``(split, the file it
    comes from, [(path, record)] to write beside the cache)``; nothing is written here.

    Raises:
        SplitFileError: a bad ``data.split_file`` or ``data.fold``.
    """
    fold = str(data.fold).strip() if data.fold is not None else ""
    if data.split_file:
        path = Path(data.split_file).expanduser()
        given = read_split_file(path, case_ids)
        source = {"split_file": str(path), "format": given["format"]}
        if "folds" in given:
            if not fold:
                n = len(given["folds"])
                raise SplitFileError(
                    f"data.split_file={path} holds {n} folds: choose one with data.fold=0..{n - 1} or all."
                )
            return fold_split(given["folds"], given["test"], fold, source), path, []
        if not fold:
            return {**source, **{k: given[k] for k in ("train", "val", "test")}}, path, []
        check_fold(fold, data.num_folds)
        pool = given["train"] + given["val"]
        folds = make_folds(pool, data.num_folds, data.split_seed, _restrict(strata, pool))
        return fold_split(folds, given["test"], fold, {**source, "seed": data.split_seed}), path, []
    if fold:
        check_fold(fold, data.num_folds)
    split = make_split(case_ids, data.val_fraction, data.test_fraction, data.split_seed, strata=strata)
    split_path = _split_path(data, base)
    writes = [(split_path, split)]
    if not fold:
        return split, split_path, writes
    pool = split["train"] + split["val"]
    folds = make_folds(pool, data.num_folds, data.split_seed, _restrict(strata, pool))
    record = {
        "kind": FOLDS_KIND,
        "seed": data.split_seed,
        "val_fraction": data.val_fraction,
        "test_fraction": data.test_fraction,
        "stratified": strata is not None,
        "n_folds": data.num_folds,
        "test": split["test"],
        "folds": folds,
    }
    folds_path = base / f"folds_seed{data.split_seed}_k{data.num_folds}{'_stratified' if data.stratify else ''}.json"
    writes.append((folds_path, record))
    return fold_split(folds, split["test"], fold, {k: record[k] for k in ("seed", "stratified")}), folds_path, writes


def _restrict(strata: dict[str, str] | None, ids: list[str]) -> dict[str, str] | None:
    return None if strata is None else {c: strata[c] for c in ids}


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
    # a bad split file or fold is refused before anything is written (checked again on the cases
    # that prepare, which a split file must name only)
    run_split(data, [c.case_id for c in cases], None, base)
    cache_root = base / resolution.name
    entries, errors, n_built = prepare_cases(
        cases,
        cache_root,
        resolution.spacing_mm,
        resolution.shape,
        data.allow_crop,
        preparation_workers(data.num_workers),
        progress,
    )
    failures = skipped + [(e.case_id, str(e)) for e in errors]
    if errors and data.on_error == "raise":
        raise PreparationFailed(failures, len(entries))
    for _case_id, msg in failures:
        log.warning("skipped %s", msg)
    if not entries:
        raise DataError(f"no case of {data.root} could be prepared; see the messages above.")

    split, split_path, writes = run_split(
        data, [e.case_id for e in entries], compute_strata(entries) if data.stratify else None, base
    )
    for path, record in writes:
        if not path.is_file() or _read_json(path) != record:
            save_split(record, path)
    return PreparedDataset(
        cache_root=cache_root,
        entries=entries,
        split=split,
        split_path=split_path,
        skipped=failures,
        n_built=n_built,
        seconds=time.perf_counter() - t0,
    )
