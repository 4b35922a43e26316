"""What ``scripts/predict.py input=`` names: new cases, labelled or not, in any form a user has.

Prediction takes more than a dataset root: one case folder, one 4D image, a folder of 4D
images (MSD ``imagesTs/``) or a ``.txt`` list of those. This module resolves them into
:class:`~brats_seg.data.layouts.Case` objects with the rules discovery uses; it knows no file
names itself, and asks :mod:`brats_seg.data.layouts` which layout a folder is in
(:func:`~brats_seg.data.layouts.folder_naming`), whether it is an MSD root, and a loose
image's channel order.
"""

from __future__ import annotations

from pathlib import Path

from brats_seg.data.errors import DatasetError
from brats_seg.data.layouts import (
    Case,
    case_from_dir,
    discover_cases,
    folder_naming,
    image_channels,
    is_msd_root,
)
from brats_seg.data.nifti import is_nifti, nifti_stem
from brats_seg.files import is_temporary

__all__ = ["find_input_cases"]

_INPUT_HELP = "input=<case folder | MSD 4D .nii.gz | folder of 4D images | .txt list | dataset root>"


def _cases_at(path: Path, layout: str, allow_root: bool) -> list[Case]:
    """The cases at one input path; a dataset root only if ``allow_root`` (not for list entries)."""
    if path.is_file():
        if is_nifti(path):
            return [Case(nifti_stem(path), "msd", (path,), None, image_channels(path))]  # a 4D image
        raise DatasetError(f"input {path} is not a NIfTI image or a .txt list: pass {_INPUT_HELP}.")
    if not path.is_dir():
        raise DatasetError(f"input {path} does not exist: pass {_INPUT_HELP}.")
    if allow_root and is_msd_root(path):
        return discover_cases(path, "msd", require_labels=False)[0]
    naming = folder_naming(path, layout)
    if naming is not None:
        return [case_from_dir(path, naming)]
    images = sorted(p for p in path.iterdir() if is_nifti(p) and not is_temporary(p))  # not a killed writer's
    if images:  # e.g. MSD imagesTs/
        return [Case(nifti_stem(p), "msd", (p,), None, image_channels(p)) for p in images]
    if allow_root:
        named = [(sub, folder_naming(sub, layout)) for sub in sorted(p for p in path.iterdir() if p.is_dir())]
        if any(naming is not None for _, naming in named):  # a challenge's /input: each case in its naming
            return [case_from_dir(sub, naming) for sub, naming in named if naming is not None]
        return discover_cases(path, layout, require_labels=False)[0]
    raise DatasetError(f"{path} is neither a case folder nor a 4D image: list {_INPUT_HELP.split('=')[1]} entries.")


def _read_list(path: Path) -> list[Path]:
    """The entries of a ``.txt`` input list; a relative one is from the list's folder unless only the cwd has it."""
    entries = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        entry = Path(line).expanduser()
        if not entry.is_absolute():
            beside = path.parent / entry
            entry = beside if beside.exists() or not entry.exists() else entry
        entries.append(entry)
    if not entries:
        raise DatasetError(f"input list {path} names no case: write one case folder or 4D image per line.")
    return entries


def find_input_cases(source: str | Path, layout: str) -> list[Case]:
    """The cases named by ``scripts/predict.py input=``.

    Accepted: a BraTS case folder (brats2021 or brats2023 file names); a 4D image
    (``.nii``/``.nii.gz``; channel order from the dataset.json of its dataset if there is
    one, else MSD's FLAIR, T1, T1ce, T2); a folder of such images (e.g. MSD ``imagesTs/``);
    a dataset root (MSD with dataset.json, or case folders, each named as BraTS 2021 or
    2023+ names them whatever ``layout`` is: a challenge's ``/input``; labels not needed);
    or a ``.txt`` file listing case folders or 4D images, one per line (relative paths are
    taken from the list's folder; blank lines and ``#`` comments are ignored).

    Args:
        source: the ``input=`` value.
        layout: the run's ``data.layout`` (tried first for case folders and roots).

    Returns:
        Cases (images only; any label file is ignored by prediction), in input order.

    Raises:
        DatasetError: nothing usable at ``source``, or duplicate case ids.
        CaseError: a case folder lacks a modality file.
    """
    if not str(source).strip():
        raise DatasetError(f"input is not set: pass {_INPUT_HELP}.")
    path = Path(source).expanduser()
    if path.is_file() and path.suffix == ".txt":
        cases = [case for entry in _read_list(path) for case in _cases_at(entry, layout, allow_root=False)]
    else:
        cases = _cases_at(path, layout, allow_root=True)
    ids = [c.case_id for c in cases]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise DatasetError(
            f"input {path}: case ids {dupes} occur more than once; their masks would overwrite each other."
        )
    return cases
