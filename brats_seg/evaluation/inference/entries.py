"""A run's cases: the ids of a split and their cache entries, for evaluation and for choosing its post-processing.

Nothing here imports TensorFlow.
"""

from __future__ import annotations

from pathlib import Path

from brats_seg.choices import check_choice
from brats_seg.config import Split, TrainConfig
from brats_seg.data.cache import CacheEntry, prepare_cases
from brats_seg.data.errors import DataError, DatasetError
from brats_seg.data.layouts import discover_cases
from brats_seg.data.splits import load_split
from brats_seg.data.workers import preparation_workers
from brats_seg.run_dir import RunError, RunFolder

__all__ = ["prepare_run_entries", "split_case_ids"]


def prepare_run_entries(config: TrainConfig, case_ids: list[str], progress: bool) -> list[CacheEntry]:
    """Cache entries of ``case_ids`` (prepared now only if missing or stale), in id order."""
    from brats_seg.data.dataset import GENERATED, dataset_cache_dir, ensure_synthetic

    data = config.data
    if data.name in GENERATED:
        ensure_synthetic(data)
    try:
        cases, skipped = discover_cases(data.root, data.layout, require_labels=False, on_error="skip")
    except DatasetError as e:
        raise DatasetError(
            f"{e} (data.root comes from the run's config.json; if the dataset moved, edit it there.)"
        ) from e
    by_id = {c.case_id: c for c in cases}
    problems = dict(skipped)
    missing = [i for i in case_ids if i not in by_id or by_id[i].label is None]
    if missing:
        lines = "\n".join(f"  - {problems.get(i, f'case {i}: no such case, or no label file')}" for i in missing[:10])
        raise DatasetError(
            f"{len(missing)} case(s) of the run's split cannot be evaluated from {data.root}:\n{lines}\n"
            "Restore them, or point data.root in the run's config.json at the dataset the run was trained on."
        )
    cache_root = dataset_cache_dir(data) / config.resolution.name
    entries, errors, _ = prepare_cases(
        [by_id[i] for i in case_ids],
        cache_root,
        config.resolution.spacing_mm,
        config.resolution.shape,
        data.allow_crop,
        preparation_workers(data.num_workers),
        progress,
    )
    if errors:
        lines = "\n".join(f"  - {e}" for e in errors)
        raise DataError(f"{len(errors)} case(s) to evaluate could not be prepared:\n{lines}")
    return entries


def split_case_ids(run_dir: str | Path, split: str) -> list[str]:
    """Case ids of ``split`` (``val`` | ``test`` | ``all``) in ``<run_dir>/split.json``.

    Raises:
        RunError: a bad split name, or no split.json.
    """
    check_choice(split, Split, "split", error=RunError)
    path = RunFolder(Path(run_dir).expanduser()).split_path
    if not path.is_file():
        raise RunError(
            f"{path} not found: the run does not say which cases it held out; train first: "
            f"python train.py run_dir={run_dir}"
        )
    try:
        split_ids = load_split(path)
    except ValueError as e:
        raise RunError(str(e)) from e
    if split == "all":
        return sorted(set(split_ids["train"]) | set(split_ids["val"]) | set(split_ids["test"]))
    return sorted(split_ids[split])
