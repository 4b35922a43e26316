"""Discover cases in the BraTS dataset layouts: the one place that knows file names.

==========  ==========================================================  ================
layout      files                                                       labels
==========  ==========================================================  ================
msd         dataset.json + imagesTr/*.nii.gz (4D, channel order from    {0,1,2,3}
            dataset.json's ``modality``) + labelsTr/*.nii.gz
brats2021   CASE/CASE_{flair,t1,t1ce,t2,seg}.nii.gz (2018-2021;         {0,1,2,4}
            2018/19 HGG/ and LGG/ sub-folders too)
brats2023   CASE/CASE-{t2f,t1n,t1c,t2w,seg}.nii.gz (BraTS 2023+: GLI,   {0,1,2,3}
            MEN, MET, PED, SSA, e.g. BraTS-MET-00001-000)
brats2024   as brats2023 (BraTS 2024 GLI post-treatment)                {0,1,2,3,4}
==========  ==========================================================  ================

Whatever the layout, :class:`Case` lists image files so that the project's channel order
FLAIR, T1, T1ce, T2 can be read from them (msd: one 4D file and the index of each channel
along its 4th axis). A case without a label file is an unlabelled case (a test set): fine
for prediction, an error for training. :mod:`brats_seg.data.predict_inputs` resolves what
``scripts/predict.py input=`` names with the same rules, asking this module about file names
(:func:`folder_naming`, :func:`is_msd_root`, :func:`image_channels`).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from brats_seg.choices import check_choice, choice_values
from brats_seg.config import Layout
from brats_seg.data.errors import CaseError, DatasetError
from brats_seg.data.nifti import find_nifti, is_nifti, nifti_stem

__all__ = [
    "CHANNELS",
    "MSD_CHANNELS",
    "Case",
    "case_file_paths",
    "case_from_dir",
    "check_dataset_root",
    "discover_cases",
    "folder_naming",
    "image_channels",
    "is_msd_root",
    "msd_channel_order",
]

log = logging.getLogger(__name__)

# Per BraTS layout: file-name separator, modality suffixes in project channel order, label suffix.
_BRATS2021 = ("_", ("flair", "t1", "t1ce", "t2"), "seg")
_BRATS2023 = ("-", ("t2f", "t1n", "t1c", "t2w"), "seg")
_SUFFIXES = {"brats2021": _BRATS2021, "brats2023": _BRATS2023, "brats2024": _BRATS2023}
CHANNELS = _BRATS2021[1]  # the project's channel order and names: flair, t1, t1ce, t2

# Names a dataset.json may give each project channel (lower case), FLAIR, T1, T1ce, T2.
_CHANNEL_NAMES = (
    ("flair", "t2f", "t2-flair", "t2_flair", "t2flair"),
    ("t1", "t1w", "t1n", "t1-native", "native t1"),
    ("t1gd", "t1ce", "t1c", "t1-gd", "t1_gd", "t1 gd", "t1post", "t1-ce", "t1ce-w"),
    ("t2", "t2w"),
)
MSD_CHANNELS = (0, 1, 2, 3)  # MSD Task01's order: FLAIR, T1w, t1gd, T2w


@dataclass(frozen=True)
class Case:
    """One case's files.

    Attributes:
        case_id: the case's id (folder name, or MSD file stem).
        layout: a key of ``brats_seg.data.labels.LABELS``.
        images: brats*: four 3D files (FLAIR, T1, T1ce, T2); msd: one 4D file.
        label: the label file, or None for an unlabelled case.
        channels: 4D images only: the index along the 4th axis of FLAIR, T1, T1ce, T2.
    """

    case_id: str
    layout: str
    images: tuple[Path, ...]
    label: Path | None
    channels: tuple[int, ...] = MSD_CHANNELS

    @property
    def files(self) -> tuple[Path, ...]:
        return self.images + ((self.label,) if self.label is not None else ())


# ---------------------------------------------------------------------------------------
# BraTS case folders
# ---------------------------------------------------------------------------------------


def case_from_dir(folder: Path, layout: str, require_label: bool = False) -> Case:
    """Build the :class:`Case` of one BraTS-layout case folder.

    Raises:
        CaseError: a modality (or, with ``require_label``, the label) file is missing.
    """
    sep, modalities, seg = _SUFFIXES[layout]
    case_id = folder.name
    images = []
    for mod in modalities:
        p = find_nifti(folder, f"{case_id}{sep}{mod}")
        if p is None:
            raise CaseError(
                case_id,
                folder / f"{case_id}{sep}{mod}.nii.gz",
                f"missing {mod} modality file",
                "Restore the file, or remove the case folder (or run with data.on_error=skip).",
            )
        images.append(p)
    label = find_nifti(folder, f"{case_id}{sep}{seg}")
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
    return any(find_nifti(folder, f"{folder.name}{sep}{s}") for s in (*modalities, seg))


def _case_dirs(root: Path, layout: str):
    """Case folders at depth 1, or depth 2 (BraTS 2018/19 HGG/ and LGG/ sub-folders), in order,
    found one at a time (a check that needs one stops at the first)."""
    for child in sorted(p for p in root.iterdir() if p.is_dir()):
        if _looks_like_case_dir(child, layout):
            yield child
        else:
            yield from (g for g in sorted(p for p in child.iterdir() if p.is_dir()) if _looks_like_case_dir(g, layout))


def folder_naming(folder: Path, layout: str) -> str | None:
    """The BraTS layout whose file names ``<folder>/<folder name><sep>*`` the folder holds (``layout`` first)."""
    for name in dict.fromkeys([layout, *_SUFFIXES]):
        sep = _SUFFIXES[name][0] if name in _SUFFIXES else None
        if sep and any(is_nifti(p) for p in folder.glob(f"{folder.name}{sep}*")):
            return name
    return None


# ---------------------------------------------------------------------------------------
# MSD: dataset.json
# ---------------------------------------------------------------------------------------


def msd_channel_order(dataset_json: Path, meta: dict) -> tuple[int, ...]:
    """Index along the 4D images' 4th axis of FLAIR, T1, T1ce, T2, from dataset.json.

    Reads ``modality`` (MSD) or ``channel_names`` (nnU-Net v2): ``{"0": "FLAIR", "1": "T1w",
    "2": "t1gd", "3": "T2w"}`` in any order and letter case (also t2f/t1n/t1c/t2w, t1ce...).

    Raises:
        DatasetError: the entry is missing, or its names are not exactly the four
            contrasts, naming the file and the entry.
    """
    entry = meta.get("modality", meta.get("channel_names"))
    example = '"modality": {"0": "FLAIR", "1": "T1w", "2": "t1gd", "3": "T2w"}'
    if not isinstance(entry, dict):
        raise DatasetError(
            f"{dataset_json}: no 'modality' entry, so the channel order of the 4D images is unknown. "
            f"Add it in the order of the images' 4th axis, e.g. {example}."
        )
    order: dict[int, int] = {}
    try:
        for index, name in entry.items():
            channel = next(c for c, names in enumerate(_CHANNEL_NAMES) if str(name).strip().lower() in names)
            if channel in order:
                raise StopIteration
            order[channel] = int(index)
    except (StopIteration, ValueError):
        order = {}
    if sorted(order) != [0, 1, 2, 3] or sorted(order.values()) != [0, 1, 2, 3]:
        raise DatasetError(
            f"{dataset_json}: 'modality' {entry} is not the four contrasts FLAIR, T1, T1ce (T1gd), T2 at indices "
            f"0-3, so the images cannot be mapped to the project's channels. Fix the entry, e.g. {example}."
        )
    return tuple(order[c] for c in range(4))


def _resolve_inside(root: Path, rel: str, dataset_json: Path) -> Path:
    path = (root / rel).resolve()
    if not path.is_relative_to(root.resolve()):
        raise DatasetError(
            f"{dataset_json}: path {rel!r} escapes the dataset root {root}. "
            "dataset.json may only name files inside its own folder; fix the entry."
        )
    return path


def _msd_case(root: Path, dj: Path, i: int, entry, require_labels: bool, channels: tuple[int, ...]) -> Case:
    if not isinstance(entry, dict) or "image" not in entry:
        raise DatasetError(f"{dj}: training entry {i} should be {{'image': ..., 'label': ...}}, got {entry!r}.")
    image = _resolve_inside(root, entry["image"], dj)
    label = _resolve_inside(root, entry["label"], dj) if entry.get("label") else None
    case_id = nifti_stem(image)
    if not image.is_file():
        raise CaseError(
            case_id,
            image,
            "image file listed in dataset.json is missing",
            "Restore it or remove its entry from dataset.json (or run with data.on_error=skip).",
        )
    if label is None or not label.is_file():
        if require_labels:
            raise CaseError(
                case_id,
                label or dj,
                "label file listed in dataset.json is missing",
                "Restore it or remove its entry (or run with data.on_error=skip).",
            )
        label = None
    return Case(case_id, "msd", (image,), label, channels)


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


def is_msd_root(folder: Path) -> bool:
    """True if ``folder`` holds a dataset.json, i.e. is the root of an MSD-layout dataset."""
    return (folder / "dataset.json").is_file()


def image_channels(image: Path) -> tuple[int, ...]:
    """Channel order of a loose 4D image: from the dataset.json of its dataset (MSD imagesTs/), else MSD's."""
    for folder in (image.parent, image.parent.parent):
        dj = folder / "dataset.json"
        if dj.is_file():
            return msd_channel_order(dj, _load_dataset_json(folder)[1])
    return MSD_CHANNELS


def _discover_msd(root: Path, require_labels: bool, on_error: str):
    dj, meta = _load_dataset_json(root)
    channels = msd_channel_order(dj, meta)
    cases: list[Case] = []
    skipped: list[tuple[str, str]] = []
    for i, entry in enumerate(meta.get("training", [])):
        try:
            cases.append(_msd_case(root, dj, i, entry, require_labels, channels))
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
            cases.append(Case(nifti_stem(image), "msd", (image,), None, channels))
    return cases, skipped


# ---------------------------------------------------------------------------------------
# Datasets
# ---------------------------------------------------------------------------------------


def discover_cases(root: str | Path, layout: str, require_labels: bool = True, on_error: str = "raise"):
    """Find the cases of a dataset.

    Args:
        root: the dataset folder.
        layout: one of :class:`brats_seg.config.Layout`.
        require_labels: a case without a label file is an error (training/evaluation).
        on_error: ``raise`` | ``skip``: what a bad case does.

    Returns:
        ``(cases, skipped)``: the cases sorted by id, and ``[(case_id, message)]`` of
        the skipped ones (always empty with ``on_error=raise``).

    Raises:
        DatasetError: root missing, dataset.json missing or malformed, no case found.
        CaseError: a bad case, with ``on_error=raise``.
    """
    root = _dataset_folder(root, layout)
    if layout == "msd":
        cases, skipped = _discover_msd(root, require_labels, on_error)
    else:
        cases, skipped = [], []
        for folder in _case_dirs(root, layout):
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


def check_dataset_root(root: str | Path, layout: str, key: str = "data.root") -> None:
    """What can be said of a dataset root in milliseconds, before anything heavy starts: it is
    set, it is a folder, and it holds the layout's cases (``dataset.json`` for msd, a case folder
    named as the layout names them for BraTS). Bad cases are :func:`discover_cases`'s, which
    reports all of them at once.

    Raises:
        DatasetError: naming ``key`` and the folder, and what to do.
    """
    folder = _dataset_folder(root, layout, key)
    if layout == "msd" and (folder / "dataset.json").is_file():
        return
    if layout != "msd" and next(_case_dirs(folder, layout), None) is not None:
        return
    raise DatasetError(_no_cases_message(folder, layout))


def _dataset_folder(root: str | Path, layout: str, key: str = "data.root") -> Path:
    """``root`` as a folder, checked: a known layout, set, an existing folder (``key`` names it)."""
    check_choice(layout, Layout, "data.layout", error=DatasetError)
    if not str(root).strip():
        raise DatasetError(f"{key} is not set: pass {key}=/path/to/your/dataset.")
    folder = Path(root).expanduser()
    if not folder.is_dir():
        raise DatasetError(f"data root {folder} does not exist or is not a folder: check {key}=.")
    return folder


def _no_cases_message(root: Path, layout: str) -> str:
    expected = {
        "msd": "dataset.json with a 'training' list",
        "brats2021": "CASE/CASE_flair.nii.gz, CASE_t1, CASE_t1ce, CASE_t2, CASE_seg",
        "brats2023": "CASE/CASE-t2f.nii.gz, CASE-t1n, CASE-t1c, CASE-t2w, CASE-seg",
        "brats2024": "CASE/CASE-t2f.nii.gz, CASE-t1n, CASE-t1c, CASE-t2w, CASE-seg",
    }[layout]
    hint = ""
    for other in ("brats2021", "brats2023"):
        if _SUFFIXES[other] != _SUFFIXES.get(layout) and next(_case_dirs(root, other), None) is not None:
            hint = f" The files look like the {other} layout: try data={other} (or data=brats2024 for post-treatment labels)."
    if (root / "dataset.json").is_file() and layout != "msd":
        hint = " There is a dataset.json: try data=msd."
    return f"no cases found under {root} for layout {layout} (expected {expected}).{hint}"


# ---------------------------------------------------------------------------------------
# Writing: where generators put a case's files
# ---------------------------------------------------------------------------------------


def case_file_paths(root: str | Path, case_id: str, layout: str, with_label: bool = True) -> dict[str, Path]:
    """Where case ``case_id``'s files go in ``layout``'s structure: what discovery reads back.

    Keys: the project's channel names (:data:`CHANNELS`) and ``seg`` for the BraTS layouts
    (``<root>/<id>/<id>_flair.nii.gz`` in 2021, ``<id>-t2f.nii.gz`` from 2023 on); ``image``
    (4D) and ``seg`` for ``msd`` (``imagesTr``/``labelsTr``, or ``imagesTs`` without labels).
    ``seg`` only if ``with_label``. Data generators write through this, so a layout's naming
    is stated once.

    Raises:
        ValueError: an unknown layout, naming the known ones.
    """
    root = Path(root)
    if layout in _SUFFIXES:
        sep, suffixes, label = _SUFFIXES[layout]
        files = {c: root / case_id / f"{case_id}{sep}{suffix}.nii.gz" for c, suffix in zip(CHANNELS, suffixes)}
        files["seg"] = root / case_id / f"{case_id}{sep}{label}.nii.gz"
    elif layout == "msd":
        images = "imagesTr" if with_label else "imagesTs"
        files = {"image": root / images / f"{case_id}.nii.gz", "seg": root / "labelsTr" / f"{case_id}.nii.gz"}
    else:
        raise ValueError(f"Unknown layout {layout!r}; expected one of {', '.join(choice_values(Layout))}.")
    if not with_label:
        del files["seg"]
    return files
