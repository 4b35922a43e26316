"""One writer for every generated dataset: a case's NIfTI files in a layout, and MSD's dataset.json.

The generators (:mod:`.synthetic`, :mod:`.mni_gliomas`) make arrays; this module writes them
where :func:`brats_seg.data.layouts.case_file_paths` says the layout keeps them. Images are
stored as int16 (as scanners' exports are), labels as uint8 in the layout's values; each file
is written atomically and the label last, so a case whose label exists is complete.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from brats_seg.data.layouts import CHANNELS
from brats_seg.data.nifti import save_nifti
from brats_seg.files import write_text_atomic

__all__ = ["check_generator_args", "write_case", "write_msd_json"]

log = logging.getLogger(__name__)


def check_generator_args(n_cases: int, seed: int) -> None:
    """Refuse a case count below 1 or a negative seed, naming the value (every generator)."""
    if int(n_cases) < 1:
        raise ValueError(f"n_cases should be >= 1, got {n_cases}.")
    if int(seed) < 0:
        raise ValueError(f"seed should be >= 0 (it seeds np.random.default_rng), got {seed}.")


def write_case(
    files: Mapping[str, Path],
    images: Mapping[str, np.ndarray],
    labels: np.ndarray | None,
    affine: np.ndarray,
    description: str,
) -> None:
    """Write one case: its channels (one file each, or one 4D ``image`` for msd), then its label.

    Args:
        files: :func:`~brats_seg.data.layouts.case_file_paths` of the case (``seg`` absent: no label written).
        images: channel name (:data:`~brats_seg.data.layouts.CHANNELS`) -> 3D array.
        labels: the label map in the layout's values (ignored without ``files["seg"]``).
        affine: voxel -> world (RAS) of every file.
        description: the NIfTI header's ``descrip``.
    """
    as_int16 = {c: np.asarray(images[c]).astype(np.int16) for c in CHANNELS}
    if "image" in files:  # msd: one 4D file, channels last
        save_nifti(files["image"], np.stack([as_int16[c] for c in CHANNELS], axis=-1), affine, description)
    else:
        for c in CHANNELS:
            save_nifti(files[c], as_int16[c], affine, description)
    if "seg" in files and labels is not None:
        save_nifti(files["seg"], labels, affine, description)


def write_msd_json(out: Path, case_ids: Sequence[str], with_labels: bool, description: str, reference: str) -> None:
    """Write (or update) an MSD Task01_BrainTumour-style ``dataset.json`` listing ``case_ids``."""
    path = Path(out) / "dataset.json"
    meta = {
        "name": "BRATS",
        "description": description,
        "reference": reference,
        "licence": "CC-BY-SA 4.0",
        "release": "1.0",
        "tensorImageSize": "4D",
        "modality": {"0": "FLAIR", "1": "T1w", "2": "t1gd", "3": "T2w"},
        "labels": {"0": "background", "1": "edema", "2": "non-enhancing tumor", "3": "enhancing tumour"},
        "numTraining": 0,
        "numTest": 0,
        "training": [],
        "test": [],
    }
    if path.exists():
        try:
            old = json.loads(path.read_text())
            meta["training"], meta["test"] = list(old.get("training", [])), list(old.get("test", []))
        except (json.JSONDecodeError, AttributeError):
            log.warning("%s is not valid JSON; rewriting it.", path)
    if with_labels:
        entries = {e["image"]: e for e in meta["training"]}
        entries.update(
            {
                f"./imagesTr/{c}.nii.gz": {"image": f"./imagesTr/{c}.nii.gz", "label": f"./labelsTr/{c}.nii.gz"}
                for c in case_ids
            }
        )
        meta["training"] = [entries[k] for k in sorted(entries)]
    else:
        meta["test"] = sorted(set(meta["test"]) | {f"./imagesTs/{c}.nii.gz" for c in case_ids})
    meta["numTraining"], meta["numTest"] = len(meta["training"]), len(meta["test"])
    write_text_atomic(path, json.dumps(meta, indent=4) + "\n")
