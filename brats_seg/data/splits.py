"""Deterministic, seeded train/val/test split, saved as JSON next to the cache.

Cases are ranked by a hash of ``(seed, case_id)``; the first ``round(n * test_fraction)``
are test, the next ``round(n * val_fraction)`` val, the rest train. The split is a pure
function of the case ids and the seed, and adding a case moves at most a few others.
The test split is never used for training or model selection: training copies the
split into its run folder and evaluation reads that copy.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

from brats_seg.files import write_text_atomic

__all__ = ["make_split", "save_split", "load_split"]

log = logging.getLogger(__name__)


def _rank_key(seed: int, case_id: str) -> str:
    return hashlib.sha256(f"{seed}:{case_id}".encode()).hexdigest()


def make_split(case_ids: list[str], val_fraction: float, test_fraction: float, seed: int) -> dict:
    """Split case ids into train/val/test.

    With 3 or more cases, val and test get at least one case each.

    Returns:
        ``{"seed", "val_fraction", "test_fraction", "train": [...], "val": [...], "test": [...]}``
        with sorted id lists.
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
    ranked = sorted(ids, key=lambda c: _rank_key(seed, c))
    return {
        "seed": seed,
        "val_fraction": val_fraction,
        "test_fraction": test_fraction,
        "test": sorted(ranked[:n_test]),
        "val": sorted(ranked[n_test : n_test + n_val]),
        "train": sorted(ranked[n_test + n_val :]),
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
        raise FileNotFoundError(f"split file {path} not found: run scripts/prepare_data.py or train.py first.") from None
    for key in ("train", "val", "test"):
        if not isinstance(split.get(key), list):
            raise ValueError(f"{path}: split file lacks a '{key}' list; delete it to have it rebuilt.")
    seen = set(split["train"]) & set(split["test"]) | set(split["val"]) & set(split["test"])
    if seen:
        raise ValueError(f"{path}: cases {sorted(seen)} are both in the test split and in train/val.")
    return split
