"""Designed multi-lesion cases on which score.py is checked against the official BraTS code.

Label maps ``(x, y, z)`` in RAS, with several lesions per region, missed lesions, false-positive
blobs, merged lesions, lesions under the volume threshold, empty masks and a resection cavity,
on voxels of 1 mm and of anisotropic sizes, written as NIfTI files stored RAS, LPS or ASL
(an axis-permuted storage). :func:`write_designed_cases` writes ``n`` of them as a dataset of a layout with
``<preds>/<case_id>.nii.gz`` predictions (``scripts/check_official_metrics.py``);
:func:`write_small_cases` writes the three small ones of :data:`SMALL_CASES`, built without random
numbers, whose official values are test data (``tests/unit/test_official_metrics.py``).
"""

from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np
import scipy.ndimage as ndi
from nibabel import orientations as ornt

from brats_seg.data.labels import LABELS
from brats_seg.data.phantoms.synthetic import case_files, write_synthetic_dataset
from brats_seg.files import atomic_path

__all__ = [
    "SMALL_CASES",
    "SMALL_SHAPE",
    "SPACINGS",
    "STORAGES",
    "design",
    "fold_cavity",
    "save",
    "small_case",
    "write_designed_cases",
    "write_small_cases",
]

SHAPE = (72, 80, 56)  # voxels: small enough to score quickly, large enough for several lesions
# Voxel sizes (x, y, z) mm of the cases, in turn; all but 1 mm differ on at least two axes.
SPACINGS = (
    (1.0, 1.0, 1.0),
    (1.2, 0.9, 2.0),
    (0.9, 1.1, 1.5),
    (1.0, 1.0, 1.0),
    (0.8, 1.0, 3.0),
    (1.5, 0.7, 1.1),
    (0.9375, 0.9375, 2.5),
)
# How the files store the voxels, in turn: nibabel axis codes of the stored axes (i, j, k).
STORAGES = ("RAS", "LPS", "ASL")


# --- case design ------------------------------------------------------------------------


def ball(shape, c, r, spacing):
    zz = np.indices(shape).astype(float)
    d = sum(((zz[i] - c[i]) * spacing[i] / r[i]) ** 2 for i in range(3))
    return d <= 1.0


def lesion(shape, c, r_mm, spacing, lab):
    """WT ellipsoid: edema shell, core with ET rim and necrotic centre."""
    out = np.zeros(shape, np.uint8)
    out[ball(shape, c, r_mm, spacing)] = lab["edema"]
    core = ball(shape, c, [x * 0.6 for x in r_mm], spacing)
    out[core] = lab["et"]
    out[ball(shape, c, [x * 0.35 for x in r_mm], spacing)] = lab["core"]
    return out


def paint(dst, src):
    dst[src > 0] = src[src > 0]


def perturb(label, rng):
    """A plausible prediction of ``label``: per-label dilate/erode, a shift."""
    out = np.zeros_like(label)
    for v in sorted(np.unique(label))[1:]:
        m = label == v
        op = rng.integers(0, 3)
        if op == 1:
            m = ndi.binary_dilation(m)
        elif op == 2:
            m = ndi.binary_erosion(m)
        out[m] = v
    return np.roll(out, tuple(rng.integers(-1, 2, 3)), axis=(0, 1, 2))


def design(i, layout, rng):
    """Case ``i``: reference and prediction ``(x, y, z)`` in RAS, and the voxel size."""
    t = LABELS[layout]
    lab = {"edema": t.edema, "core": t.core, "et": t.enhancing}
    spacing = SPACINGS[i % len(SPACINGS)]
    ref = np.zeros(SHAPE, np.uint8)
    pred = np.zeros(SHAPE, np.uint8)
    s = i % 10
    if s in (0, 1, 2, 5, 6, 9):
        centres = [(20, 22, 18), (50, 55, 36), (52, 20, 20)][: 2 + (s % 2)]
        for c in centres:
            r = rng.uniform(6, 11, 3)
            paint(ref, lesion(SHAPE, c, r, spacing, lab))
        pred = perturb(ref, rng)
        if s in (1, 6):  # a missed lesion
            pred[40:, 40:, :] = 0
        if s in (2, 6, 9):  # false positives: one large, one small blob
            paint(pred, lesion(SHAPE, (60, 60, 10), (5, 5, 5), spacing, lab))
            pred[5:7, 70:72, 45:47] = lab["et"]
        if s in (5, 9):  # reference lesions under the 50 mm3 threshold, one found, one missed
            ref[64:66, 8:10, 48:50] = lab["edema"]
            pred[64:66, 8:10, 48:50] = lab["edema"]
            ref[10:12, 66:68, 4:6] = lab["et"]
    elif s == 3:  # lesions 2-3 voxels apart: merged by the 2023 dilation
        paint(ref, lesion(SHAPE, (25, 40, 28), (7, 7, 7), spacing, lab))
        paint(ref, lesion(SHAPE, (42, 40, 28), (7, 7, 7), spacing, lab))
        pred = perturb(ref, rng)
        pred[33:35, 37:43, 25:31] = lab["edema"]  # predicted as one lesion
    elif s == 4:  # empty prediction
        paint(ref, lesion(SHAPE, (30, 30, 25), (9, 8, 7), spacing, lab))
    elif s == 7:  # empty reference, false positives
        paint(pred, lesion(SHAPE, (30, 30, 25), (6, 6, 6), spacing, lab))
    # s == 8: both empty
    if t.cavity is not None:
        if s in (0, 2, 3, 5):
            ref[5:15, 60:70, 5:12] = t.cavity
            pred[6:15, 60:71, 5:12] = t.cavity
        if s in (1, 6):
            ref[5:15, 60:70, 5:12] = t.cavity  # missed cavity
        if s in (7, 9):
            pred[60:66, 5:12, 40:50] = t.cavity  # false-positive cavity
    return ref, pred, spacing


def fold_cavity(labels):
    """brats2024 -> brats2023: the resection cavity (4) becomes necrosis (1)."""
    return np.where(labels == 4, 1, labels).astype(np.uint8)


# The small cases of the CI test: voxel size (x, y, z) mm and storage; see small_case.
SMALL_SHAPE = (30, 34, 20)
SMALL_CASES = (((1.2, 0.9, 2.0), "LPS"), ((0.8, 1.1, 1.6), "RAS"), ((1.5, 0.7, 1.1), "ASL"))


def small_case(index: int, layout: str):
    """Small case ``index`` of :data:`SMALL_CASES` in ``layout`` (brats2024 or brats2023):
    reference and prediction ``(x, y, z)`` in RAS, voxel size, storage. No random numbers:
    the cases are the same on every machine and numpy version.

    Three reference lesions (each with edema, ET and necrosis, so WT, TC and ET have three
    lesions) and a small one the prediction misses; the prediction moves one lesion by a
    voxel along x, grows one, moves and shrinks one, adds a false-positive lesion; the
    resection cavity is predicted one voxel off along y (folded into label 1 in brats2023).
    """
    spacing, storage = SMALL_CASES[index]
    lab = {"edema": 2, "core": 1, "et": 3}
    ref = np.zeros(SMALL_SHAPE, np.uint8)
    pred = np.zeros(SMALL_SHAPE, np.uint8)
    lesions = (((8, 9, 6), (6.0, 5.0, 5.0)), ((20, 23, 12), (7.0, 6.5, 6.0)), ((22, 8, 6), (4.5, 5.0, 4.5)))
    moves = (((1, 0, 0), 1.0), ((0, 0, 0), 1.15), ((0, 1, 1), 0.85))  # centre shift (voxels), radius scale
    for (c, r), (shift, scale) in zip(lesions, moves):
        paint(ref, lesion(SMALL_SHAPE, c, r, spacing, lab))
        paint(
            pred, lesion(SMALL_SHAPE, tuple(a + b for a, b in zip(c, shift)), tuple(x * scale for x in r), spacing, lab)
        )
    paint(ref, lesion(SMALL_SHAPE, (5, 28, 15), (3.0, 3.0, 3.0), spacing, lab))  # missed
    paint(pred, lesion(SMALL_SHAPE, (26, 29, 4), (3.5, 3.5, 3.5), spacing, lab))  # false positive
    ref[2:6, 24:29, 14:18] = np.where(ref[2:6, 24:29, 14:18] == 0, 4, ref[2:6, 24:29, 14:18])
    pred[2:6, 25:30, 14:18] = np.where(pred[2:6, 25:30, 14:18] == 0, 4, pred[2:6, 25:30, 14:18])
    if layout == "brats2023":
        ref, pred = fold_cavity(ref), fold_cavity(pred)
    elif layout != "brats2024":
        raise ValueError(f"small cases are brats2024 or brats2023, not {layout!r}")
    return ref, pred, spacing, storage


# --- files ------------------------------------------------------------------------------


def save(path: Path, data_ras: np.ndarray, spacing, storage: str, dtype=np.uint8) -> None:
    """Write ``data_ras`` ``(x, y, z)`` (voxel size ``spacing``) stored as ``storage`` (e.g.
    ``LPS``: i runs to the left, j to the back, k up), qform and sform both set."""
    affine = np.diag([*spacing, 1.0])
    affine[:3, 3] = -np.asarray(spacing) * (np.asarray(data_ras.shape[:3]) - 1) / 2  # centred
    img = nib.Nifti1Image(np.asarray(data_ras, dtype=dtype), affine)
    if storage != "RAS":
        img = img.as_reoriented(ornt.ornt_transform(ornt.axcodes2ornt("RAS"), ornt.axcodes2ornt(tuple(storage))))
    stored = img.affine
    img = nib.Nifti1Image(np.asarray(img.dataobj, dtype=dtype), stored)
    img.set_qform(stored, code=1)
    img.set_sform(stored, code=1)
    with atomic_path(path) as tmp:  # read by score.py and the official code
        nib.save(img, str(tmp))


def write_small_cases(root: Path, preds: Path, layout: str) -> list[dict]:
    """The small cases as a BraTS-layout dataset (label files; the images are zeros, scoring
    never reads them) and ``<preds>/<case_id>.nii.gz`` masks; returns their file table."""
    cases = []
    for i in range(len(SMALL_CASES)):
        ref, pred, spacing, storage = small_case(i, layout)
        files = case_files(root, layout, i)
        for key, path in files.items():
            if key != "seg":
                save(path, np.zeros(SMALL_SHAPE), spacing, storage, dtype=np.int16)
        save(files["seg"], ref, spacing, storage)
        cid = files["seg"].parent.name
        save(preds / f"{cid}.nii.gz", pred, spacing, storage)
        cases.append(
            {
                "case_id": cid,
                "ref": str(files["seg"]),
                "pred": str(preds / f"{cid}.nii.gz"),
                "voxel_mm": list(spacing),
                "storage": storage,
            }
        )
    return cases


def write_designed_cases(work: Path, layout: str, n: int) -> tuple[Path, Path, list[dict]]:
    """``n`` designed cases (:func:`design`, in turn) in ``layout``: a dataset under
    ``<work>/<layout>/ref`` (synthetic images, the designed label files) and the predictions
    ``<work>/<layout>/pred/<case_id>.nii.gz``; returns both folders and the file table (case id,
    reference, prediction, voxel size, storage). brats2023 cases are the brats2024 designs with
    the resection cavity folded into necrosis."""
    root, preds = work / layout / "ref", work / layout / "pred"
    source = "brats2024" if layout == "brats2023" else layout
    ids = write_synthetic_dataset(root, layout, n_cases=n, seed=1)  # images; the labels are replaced
    rng = np.random.default_rng(7)
    cases = []
    for i, cid in enumerate(ids):
        ref, pred, spacing = design(i, source, rng)
        if layout == "brats2023":
            ref, pred = fold_cavity(ref), fold_cavity(pred)
        storage = STORAGES[i % len(STORAGES)]
        seg = case_files(root, layout, i)["seg"]
        save(seg, ref, spacing, storage)
        save(preds / f"{cid}.nii.gz", pred, spacing, storage)
        cases.append(
            {
                "case_id": cid,
                "ref": str(seg),
                "pred": str(preds / f"{cid}.nii.gz"),
                "voxel_mm": list(spacing),
                "storage": storage,
            }
        )
    return root, preds, cases
