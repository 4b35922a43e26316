"""Discover cases in the three common BraTS dataset layouts.

==========  ========================================================  ================
layout      files                                                     labels
==========  ========================================================  ================
msd         dataset.json + imagesTr/*.nii.gz (4D: FLAIR,T1w,T1gd,T2w)  {0,1,2,3}
            + labelsTr/*.nii.gz
brats2021   CASE/CASE_{flair,t1,t1ce,t2,seg}.nii.gz (2018-2021;       {0,1,2,4}
            2018/19 HGG/ and LGG/ sub-folders too)
brats2023   CASE/CASE-{t2f,t1n,t1c,t2w,seg}.nii.gz (BraTS-GLI)        {0,1,2,3}
==========  ========================================================  ================

Whatever the layout, :class:`Case` lists image files in the project's channel order
FLAIR, T1, T1ce, T2 (msd: one 4D file in that order). A case without a label file is an
unlabelled case (a test set): fine for prediction, an error for training.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from brats_seg.data.errors import CaseError, DatasetError

__all__ = ["Case", "LAYOUTS", "discover_cases", "case_from_dir"]

log = logging.getLogger(__name__)

# Per-layout file suffix of each modality in project channel order, and of the label.
_SUFFIXES = {
    "brats2021": ("_", ("flair", "t1", "t1ce", "t2"), "seg"),
    "brats2023": ("-", ("t2f", "t1n", "t1c", "t2w"), "seg"),
}
LAYOUTS = ("msd", "brats2021", "brats2023")
_NIFTI_EXTS = (".nii.gz", ".nii")


@dataclass(frozen=True)
class Case:
    """One case's files.

    Attributes:
        case_id: the case's id (folder name, or MSD file stem).
        layout: ``msd`` | ``brats2021`` | ``brats2023``.
        images: brats*: four 3D files (FLAIR, T1, T1ce, T2); msd: one 4D file.
        label: the label file, or None for an unlabelled case.
    """

    case_id: str
    layout: str
    images: tuple[Path, ...]
    label: Path | None

    @property
    def files(self) -> tuple[Path, ...]:
        return self.images + ((self.label,) if self.label is not None else ())


def _find_file(folder: Path, stem: str) -> Path | None:
    for ext in _NIFTI_EXTS:
        p = folder / f"{stem}{ext}"
        if p.is_file():
            return p
    return None


def case_from_dir(folder: Path, layout: str, require_label: bool = False) -> Case:
    """Build the :class:`Case` of one BraTS-layout case folder.

    Raises:
        CaseError: a modality (or, with ``require_label``, the label) file is missing.
    """
    sep, modalities, seg = _SUFFIXES[layout]
    case_id = folder.name
    images = []
    for mod in modalities:
        p = _find_file(folder, f"{case_id}{sep}{mod}")
        if p is None:
            raise CaseError(
                case_id,
                folder / f"{case_id}{sep}{mod}.nii.gz",
                f"missing {mod} modality file",
                "Restore the file, or remove the case folder (or run with data.on_error=skip).",
            )
        images.append(p)
    label = _find_file(folder, f"{case_id}{sep}{seg}")
    if label is None and require_label:
        raise CaseError(
            case_id,
            folder / f"{case_id}{sep}{seg}.nii.gz",
            "missing label (segmentation) file, needed for training and evaluation",
            "Restore it, or use this case only with scripts/predict.py (or run with data.on_error=skip).",
        )
    return Case(case_id, layout, tuple(images), label)


def _looks_like_case_dir(folder: Path, layout: str) -> bool:
    sep, modalities, seg = _SUFFIXES[layout]
    return any(_find_file(folder, f"{folder.name}{sep}{s}") for s in (*modalities, seg))


def _discover_brats(root: Path, layout: str) -> list[Path]:
    """Case folders at depth 1, or depth 2 (BraTS 2018/19 HGG/ and LGG/ sub-folders)."""
    found = []
    for child in sorted(p for p in root.iterdir() if p.is_dir()):
        if _looks_like_case_dir(child, layout):
            found.append(child)
        else:
            found.extend(
                g for g in sorted(p for p in child.iterdir() if p.is_dir()) if _looks_like_case_dir(g, layout)
            )
    return found


def _resolve_inside(root: Path, rel: str, dataset_json: Path) -> Path:
    path = (root / rel).resolve()
    if not path.is_relative_to(root.resolve()):
        raise DatasetError(
            f"{dataset_json}: path {rel!r} escapes the dataset root {root}. "
            "dataset.json may only name files inside its own folder; fix the entry."
        )
    return path


def _stem(path: Path) -> str:
    name = path.name
    for ext in _NIFTI_EXTS:
        if name.endswith(ext):
            return name[: -len(ext)]
    return path.stem


def _msd_case(root: Path, dj: Path, i: int, entry, require_labels: bool) -> Case:
    if not isinstance(entry, dict) or "image" not in entry:
        raise DatasetError(f"{dj}: training entry {i} should be {{'image': ..., 'label': ...}}, got {entry!r}.")
    image = _resolve_inside(root, entry["image"], dj)
    label = _resolve_inside(root, entry["label"], dj) if entry.get("label") else None
    case_id = _stem(image)
    if not image.is_file():
        raise CaseError(case_id, image, "image file listed in dataset.json is missing",
                        "Restore it or remove its entry from dataset.json (or run with data.on_error=skip).")
    if label is None or not label.is_file():
        if require_labels:
            raise CaseError(case_id, label or dj, "label file listed in dataset.json is missing",
                            "Restore it or remove its entry (or run with data.on_error=skip).")
        label = None
    return Case(case_id, "msd", (image,), label)


def _load_dataset_json(root: Path) -> tuple[Path, dict]:
    dj = root / "dataset.json"
    if not dj.is_file():
        raise DatasetError(
            f"{dj} not found: an MSD dataset (data=msd) needs dataset.json beside imagesTr/ and "
            "labelsTr/. Point data.root at the Task01_BrainTumour folder, or pick the layout your "
            "files have (data=brats2021 or data=brats2023)."
        )
    try:
        meta = json.loads(dj.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DatasetError(f"{dj} is not valid JSON ({e}). Restore the file from the dataset download.") from e
    if not isinstance(meta, dict) or not isinstance(meta.get("training", []), list):
        raise DatasetError(f"{dj}: expected an object with a 'training' list, as in the MSD release.")
    return dj, meta


def _discover_msd(root: Path, require_labels: bool, on_error: str):
    dj, meta = _load_dataset_json(root)
    cases: list[Case] = []
    skipped: list[tuple[str, str]] = []
    for i, entry in enumerate(meta.get("training", [])):
        try:
            cases.append(_msd_case(root, dj, i, entry, require_labels))
        except CaseError as e:
            if on_error != "skip":
                raise
            log.warning("skipping %s", e)
            skipped.append((e.case_id, str(e)))
    if not require_labels:
        for i, rel in enumerate(meta.get("test", []) or []):
            if not isinstance(rel, str):
                raise DatasetError(f"{dj}: test entry {i} should be a path string, got {rel!r}.")
            image = _resolve_inside(root, rel, dj)
            cases.append(Case(_stem(image), "msd", (image,), None))
    return cases, skipped


def discover_cases(root: str | Path, layout: str, require_labels: bool = True, on_error: str = "raise"):
    """Find the cases of a dataset.

    Args:
        root: the dataset folder.
        layout: ``msd`` | ``brats2021`` | ``brats2023``.
        require_labels: a case without a label file is an error (training/evaluation).
        on_error: ``raise`` | ``skip``: what a bad case does.

    Returns:
        ``(cases, skipped)``: the cases sorted by id, and ``[(case_id, message)]`` of
        the skipped ones (always empty with ``on_error=raise``).

    Raises:
        DatasetError: root missing, dataset.json missing or malformed, no case found.
        CaseError: a bad case, with ``on_error=raise``.
    """
    if layout not in LAYOUTS:
        raise DatasetError(f"Unknown layout {layout!r}: use one of {', '.join(LAYOUTS)} (data.layout).")
    if not str(root).strip():
        raise DatasetError("data.root is not set: pass data.root=/path/to/your/dataset.")
    root = Path(root).expanduser()
    if not root.is_dir():
        raise DatasetError(f"data root {root} does not exist or is not a folder: check data.root=.")
    if layout == "msd":
        cases, skipped = _discover_msd(root, require_labels, on_error)
    else:
        cases, skipped = [], []
        for folder in _discover_brats(root, layout):
            try:
                cases.append(case_from_dir(folder, layout, require_label=require_labels))
            except CaseError as e:
                if on_error != "skip":
                    raise
                log.warning("skipping %s", e)
                skipped.append((e.case_id, str(e)))
    if not cases and not skipped:
        raise DatasetError(_no_cases_message(root, layout))
    ids = [c.case_id for c in cases]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise DatasetError(f"{root}: case ids {dupes} occur more than once (e.g. in both HGG/ and LGG/); rename one.")
    return sorted(cases, key=lambda c: c.case_id), skipped


def _no_cases_message(root: Path, layout: str) -> str:
    expected = {
        "msd": "dataset.json with a 'training' list",
        "brats2021": "CASE/CASE_flair.nii.gz, CASE_t1, CASE_t1ce, CASE_t2, CASE_seg",
        "brats2023": "CASE/CASE-t2f.nii.gz, CASE-t1n, CASE-t1c, CASE-t2w, CASE-seg",
    }[layout]
    hint = ""
    for other in ("brats2021", "brats2023"):
        if other != layout and _discover_brats(root, other):
            hint = f" The files look like the {other} layout: try data={other}."
    if (root / "dataset.json").is_file() and layout != "msd":
        hint = " There is a dataset.json: try data=msd."
    return f"no cases found under {root} for layout {layout} (expected {expected}).{hint}"
