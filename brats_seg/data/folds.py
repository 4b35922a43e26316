"""Cross-validation folds and split files: which cases a run trains and validates on.

A run's split is one of:

- the seeded split (``data.fold`` unset, no ``data.split_file``): :func:`~brats_seg.data.splits.make_split`;
- **fold k** of k-fold cross-validation (``data.fold=0..k-1``): the folds partition the training cases
  (the seeded split's train and val, or a split file's), the test cases stay out of every fold; fold
  k validates on its part and trains on the others. ``data.num_folds`` (5) folds, stratified like the
  split (each fold gets its share of each group of cases, e.g. those without enhancing tumour), dealt
  by the same seeded hash, so adding a case moves few others;
- **all** (``data.fold=all``): trains on every training case, as for a challenge submission; its
  validation cases are fold 0's, which it also trains on (``val_trained_on``: the checkpoint chosen
  on them and post-processing chosen on them are optimistic; choose post-processing on the folds'
  predictions together, :mod:`brats_seg.evaluation.postprocess_folds`);
- a **split file** (``data.split_file=``): this project's ``{"train", "val", "test"}``, its folds
  file ``{"test": [...], "folds": [{"train", "val"}, ...]}`` (what preparing with ``data.fold`` writes
  beside the cache, to ship or edit), or nnU-Net's ``splits_final.json`` (a list of ``{"train",
  "val"}``, one per fold; the dataset's cases no fold names are the test cases).

A split file naming cases the dataset does not have, folds whose validation parts overlap, a case both
trained and validated on in one fold, a test case inside a fold or a fold out of range: a
:class:`SplitFileError` naming the file and the cases (the CLI prints one ``error:`` line, exit 2);
nothing is written.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Collection, Mapping
from pathlib import Path

from brats_seg.data.errors import DataError

__all__ = [
    "FOLDS_KIND",
    "SplitFileError",
    "check_fold",
    "fold_split",
    "make_folds",
    "read_split_file",
]

log = logging.getLogger(__name__)

#: ``kind`` of this project's folds file
FOLDS_KIND = "brats_seg_folds"


class SplitFileError(DataError):
    """A split file or ``data.fold`` that cannot give a run its split."""


def _rank_key(seed: int, case_id: str) -> str:
    return hashlib.sha256(f"{seed}:fold:{case_id}".encode()).hexdigest()


def make_folds(
    case_ids: Collection[str], n_folds: int, seed: int, strata: Mapping[str, str] | None = None
) -> list[dict[str, list[str]]]:
    """``n_folds`` folds over ``case_ids``: each ``{"train": [...], "val": [...]}`` (sorted), the val
    parts a partition of the cases, their sizes within one of each other.

    Cases are ordered by group (``strata``; None = one group) and inside it by a seeded hash, then
    dealt to the folds in turn, the turn running on across groups: each fold gets its share of each
    group (within one case) and the folds' sizes differ by at most one.

    Raises:
        SplitFileError: fewer than two folds, or fewer cases than folds.
    """
    ids = sorted(set(case_ids))
    if n_folds < 2:
        raise SplitFileError(f"data.num_folds={n_folds}: cross-validation needs at least 2 folds.")
    if len(ids) < n_folds:
        raise SplitFileError(
            f"{len(ids)} training cases cannot make data.num_folds={n_folds} folds: use fewer folds or more cases."
        )
    if strata is not None:
        missing = [c for c in ids if c not in strata]
        if missing:
            raise ValueError(f"cases {missing[:5]} have no stratum; every case of the folds needs one.")
    group = (lambda c: str(strata[c])) if strata is not None else (lambda c: "")
    order = sorted(ids, key=lambda c: (group(c), _rank_key(seed, c)))
    val: list[list[str]] = [[] for _ in range(n_folds)]
    for i, c in enumerate(order):
        val[i % n_folds].append(c)
    return [{"train": sorted(set(ids) - set(part)), "val": sorted(part)} for part in val]


def _case_list(path: Path, value, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(c, str) for c in value):
        raise SplitFileError(f"{path}: {where} must be a list of case ids.")
    return value


def read_split_file(path: str | Path, case_ids: Collection[str]) -> dict:
    """A split file checked against the dataset's cases, as ``{"format", "test", "folds"}`` (folds
    files and nnU-Net's) or ``{"format", "train", "val", "test"}`` (a plain split).

    Raises:
        SplitFileError: no such file, not JSON, another shape, cases the dataset does not have,
            a case in two validation parts, in one fold's train and val, or a test case in a fold.
    """
    path = Path(path).expanduser()
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise SplitFileError(f"data.split_file={path}: no such file.") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SplitFileError(f"data.split_file={path} cannot be read as JSON ({e}).") from None
    known = set(case_ids)
    if isinstance(raw, list):  # nnU-Net's splits_final.json
        fmt = "nnunet"
        folds = [_fold_of(path, f, i) for i, f in enumerate(raw)]
        named = {c for f in folds for part in f.values() for c in part}
        out = {"format": fmt, "test": sorted(known - named), "folds": folds}
    elif isinstance(raw, dict) and "folds" in raw:
        fmt = FOLDS_KIND
        if not isinstance(raw["folds"], list):
            raise SplitFileError(f"{path}: 'folds' must be a list of {{train, val}} objects.")
        folds = [_fold_of(path, f, i) for i, f in enumerate(raw["folds"])]
        out = {"format": fmt, "test": sorted(_case_list(path, raw.get("test", []), "'test'")), "folds": folds}
    elif isinstance(raw, dict) and all(k in raw for k in ("train", "val", "test")):
        out = {
            "format": "brats_seg",
            **{k: sorted(_case_list(path, raw[k], f"'{k}'")) for k in ("train", "val", "test")},
        }
        _check_disjoint(path, {k: out[k] for k in ("train", "val", "test")}, "the split")
    else:
        raise SplitFileError(
            f"{path} is not a split file: expected {{train, val, test}} lists, a folds file "
            "{test, folds: [{train, val}, ...]} or nnU-Net's splits_final.json (a list of {train, val})."
        )
    named = set(out.get("test", [])) | {
        c for part in out.get("folds", [out]) for k in ("train", "val") for c in part[k]
    }
    unknown = sorted(named - known)
    if unknown:
        raise SplitFileError(
            f"{path} names {len(unknown)} case(s) the dataset does not have or could not prepare: "
            f"{', '.join(unknown[:5])}{' ...' if len(unknown) > 5 else ''}; fix the file or the dataset "
            "(data.root=, data.on_error=)."
        )
    if "folds" in out:
        _check_folds(path, out["folds"], set(out["test"]))
        left = sorted(known - named)
        if left:
            log.warning(
                "%s: %d case(s) of the dataset are in no fold and not in test; they are not used", path, len(left)
            )
    return out


def _fold_of(path: Path, fold, i: int) -> dict[str, list[str]]:
    if not isinstance(fold, dict) or "train" not in fold or "val" not in fold:
        raise SplitFileError(f"{path}: fold {i} must be an object with 'train' and 'val' lists.")
    return {k: sorted(_case_list(path, fold[k], f"fold {i}'s '{k}'")) for k in ("train", "val")}


def _check_disjoint(path: Path, parts: Mapping[str, list[str]], what: str) -> None:
    names = list(parts)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            both = sorted(set(parts[a]) & set(parts[b]))
            if both:
                raise SplitFileError(
                    f"{path}: {what} has case(s) both in '{a}' and in '{b}': {', '.join(both[:5])}"
                    f"{' ...' if len(both) > 5 else ''}."
                )


def _check_folds(path: Path, folds: list[dict[str, list[str]]], test: set[str]) -> None:
    if len(folds) < 2:
        raise SplitFileError(f"{path} holds {len(folds)} fold(s); cross-validation needs at least 2.")
    seen: dict[str, int] = {}
    for i, f in enumerate(folds):
        _check_disjoint(path, f, f"fold {i}")
        if not f["train"] or not f["val"]:
            raise SplitFileError(f"{path}: fold {i} has no {'train' if not f['train'] else 'val'} cases.")
        in_test = sorted((set(f["train"]) | set(f["val"])) & test)
        if in_test:
            raise SplitFileError(f"{path}: fold {i} uses test case(s) {', '.join(in_test[:5])}.")
        for c in f["val"]:
            if c in seen:
                raise SplitFileError(
                    f"{path}: case {c} is validated on in fold {seen[c]} and in fold {i}: the folds' val parts must not overlap."
                )
            seen[c] = i


def check_fold(fold: str, n_folds: int) -> int | None:
    """``data.fold`` as a fold index, None for ``all``.

    Raises:
        SplitFileError: anything but ``0..n_folds-1`` or ``all``.
    """
    text = str(fold).strip().lower()
    if text == "all":
        return None
    if text.isdigit() and int(text) < n_folds:
        return int(text)
    raise SplitFileError(f"data.fold={fold}: the split has {n_folds} folds, choose 0..{n_folds - 1} or all.")


def fold_split(folds: list[dict[str, list[str]]], test: list[str], fold: str, source: Mapping) -> dict:
    """The split of ``data.fold`` (a run's ``split.json``): ``train``, ``val``, ``test`` and what it
    came from (``fold``, ``n_folds`` and ``source``'s seed, fractions or file)."""
    k = check_fold(fold, len(folds))
    if k is None:
        train = sorted({c for f in folds for part in f.values() for c in part})
        val, extra = list(folds[0]["val"]), {"val_trained_on": True}
    else:
        train, val, extra = list(folds[k]["train"]), list(folds[k]["val"]), {}
    return {
        **{key: v for key, v in source.items() if key not in ("train", "val", "test", "folds", "strata")},
        "fold": "all" if k is None else k,
        "n_folds": len(folds),
        **extra,
        "train": train,
        "val": val,
        "test": sorted(test),
    }
