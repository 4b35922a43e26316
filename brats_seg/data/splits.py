"""Deterministic, seeded train/val/test split, saved as JSON next to the cache.

Cases are ranked by a hash of ``(seed, case_id)``; the first ``round(n * test_fraction)``
are test, the next ``round(n * val_fraction)`` val, the rest train. The split is a pure
function of the case ids, the seed and (stratified) each case's stratum, and adding a case
moves at most a few others. The test split is never used for training or model selection:
training copies the split into its run folder and evaluation reads that copy.

Stratified (``data.stratify=true``, the default): cases are grouped by which regions their
label map holds (e.g. ``WT TC ET``, or ``WT TC`` for a glioma without enhancing tumour), and
each group gives val and test its share of cases (largest remainder; a group of three or more
cases gets at least one in each where the split has room), ranked by the same hash inside the
group. A random split of 40 cases can leave every case without enhancing tumour out of the 6
val cases, and post-processing chosen there then cannot learn what to do when there is none
(BraTS scores ET Dice 0 for one false voxel on such a case): nnU-Net's and most BraTS entries'
folds are random, but their validation sets are hundreds of cases, where this cannot happen.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from pathlib import Path

from brats_seg.files import write_text_atomic

__all__ = ["load_split", "make_split", "save_split", "validation_subset"]

log = logging.getLogger(__name__)


def _rank_key(seed: int, case_id: str) -> str:
    return hashlib.sha256(f"{seed}:{case_id}".encode()).hexdigest()


def _allocate(total: int, sizes: Mapping[str, int], floored: set[str]) -> dict[str, int]:
    """``total`` cases shared among groups of ``sizes`` in proportion (largest remainder; ties to
    the larger group, then the name); each group of ``floored`` gets at least one when ``total``
    allows one for each of them."""
    n = sum(sizes.values())
    share = dict.fromkeys(sizes, 0)
    if total <= 0 or n == 0:
        return share
    least = {g: int(g in floored and len(floored) <= total) for g in sizes}
    ideal = {g: total * k / n for g, k in sizes.items()}
    for g in sizes:
        share[g] = max(least[g], min(int(ideal[g]), sizes[g]))
    while sum(share.values()) > total:  # the floors overshot: take back from the most over-served
        g = max((g for g in sizes if share[g] > least[g]), key=lambda g: (share[g] - ideal[g], g))
        share[g] -= 1
    while sum(share.values()) < total:
        g = max((g for g in sizes if share[g] < sizes[g]), key=lambda g: (ideal[g] - share[g], sizes[g], g))
        share[g] += 1
    return share


def make_split(
    case_ids: list[str], val_fraction: float, test_fraction: float, seed: int, strata: Mapping[str, str] | None = None
) -> dict:
    """Split case ids into train/val/test.

    With 3 or more cases, val and test get at least one case each.

    Args:
        strata: each case's group (e.g. the regions its label holds, ``"WT TC"``); None = one
            group (a plain random split). Each group gives val and test its share.

    Returns:
        ``{"seed", "val_fraction", "test_fraction", "train": [...], "val": [...], "test": [...]}``
        with sorted id lists; stratified, also ``"strata"``: ``{group: {"train": n, "val": n,
        "test": n}}``.

    Raises:
        ValueError: a fraction outside [0, 1), or a case without a group in ``strata``.
    """
    if not 0 <= val_fraction < 1 or not 0 <= test_fraction < 1 or val_fraction + test_fraction >= 1:
        raise ValueError(
            f"data.val_fraction={val_fraction} and data.test_fraction={test_fraction} must each be in [0, 1) "
            "and leave cases for training."
        )
    ids = sorted(set(case_ids))
    n = len(ids)
    n_test, n_val = round(n * test_fraction), round(n * val_fraction)
    if n >= 3:
        n_test = max(n_test, 1 if test_fraction > 0 else 0)
        n_val = max(n_val, 1 if val_fraction > 0 else 0)
    if strata is None:
        ranked = sorted(ids, key=lambda c: _rank_key(seed, c))
        return {
            "seed": seed,
            "val_fraction": val_fraction,
            "test_fraction": test_fraction,
            "test": sorted(ranked[:n_test]),
            "val": sorted(ranked[n_test : n_test + n_val]),
            "train": sorted(ranked[n_test + n_val :]),
        }
    missing = [c for c in ids if c not in strata]
    if missing:
        raise ValueError(f"cases {missing[:5]} have no stratum; every case of the split needs one.")
    groups: dict[str, list[str]] = {}
    for c in ids:
        groups.setdefault(str(strata[c]), []).append(c)
    sizes = {g: len(members) for g, members in sorted(groups.items())}
    # a group of three or more keeps a case in each of test, val and train where the split has room
    test_share = _allocate(n_test, sizes, {g for g, k in sizes.items() if k >= 3})
    left = {g: k - test_share[g] for g, k in sizes.items()}
    val_share = _allocate(n_val, left, {g for g, k in sizes.items() if k >= 3 and left[g] >= 2})
    out = {"test": [], "val": [], "train": []}
    counts = {}
    for g, members in sorted(groups.items()):
        ranked = sorted(members, key=lambda c: _rank_key(seed, c))
        t, v = test_share[g], val_share[g]
        parts = {"test": ranked[:t], "val": ranked[t : t + v], "train": ranked[t + v :]}
        for name, part in parts.items():
            out[name] += part
        counts[g] = {name: len(part) for name, part in parts.items()}
    return {
        "seed": seed,
        "val_fraction": val_fraction,
        "test_fraction": test_fraction,
        "test": sorted(out["test"]),
        "val": sorted(out["val"]),
        "train": sorted(out["train"]),
        "strata": counts,
    }


def save_split(split: dict, path: str | Path) -> Path:
    """Write the split atomically (temporary file, fsync, rename; its folder is created).

    Raises:
        DiskFullError: no space left; an existing split file is left as it was.
    """
    return write_text_atomic(path, json.dumps(split, indent=1))


def load_split(path: str | Path) -> dict:
    """Read a split file, checking it has the three lists and no case in two of them."""
    path = Path(path)
    try:
        split = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(
            f"split file {path} not found: run scripts/prepare_data.py or train.py first."
        ) from None
    for key in ("train", "val", "test"):
        if not isinstance(split.get(key), list):
            raise ValueError(f"{path}: split file lacks a '{key}' list; delete it to have it rebuilt.")
    seen = set(split["train"]) & set(split["test"]) | set(split["val"]) & set(split["test"])
    if seen:
        raise ValueError(f"{path}: cases {sorted(seen)} are both in the test split and in train/val.")
    return split


def validation_subset(case_ids: list[str], n: int, seed: int) -> list[str]:
    """The ``n`` val cases validated on during training (``trainer.val_cases``; 0 or more than there
    are: all), sorted: the first ``n`` by the split's seeded hash, so a run validates on the same
    cases every epoch and runs of one split (the arms of a study) on the same ones."""
    ids = sorted(set(case_ids))
    if n <= 0 or n >= len(ids):
        return ids
    return sorted(sorted(ids, key=lambda c: _rank_key(seed, c))[:n])
