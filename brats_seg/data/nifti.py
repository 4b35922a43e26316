"""NIfTI I/O with nibabel: load in RAS, keep the original grid, save masks back on it.

Inside the project every volume is a numpy array in RAS voxel order, ``(x, y, z[, c])``.
:func:`load_volume` reorients to RAS by axis flips/permutations only (no resampling)
and remembers how; :func:`save_mask` undoes that and writes the original affine and
header, so a saved mask sits on the original file's grid exactly.
"""

from __future__ import annotations

import gzip
import logging
from dataclasses import dataclass
from pathlib import Path

import nibabel as nib
import numpy as np
from nibabel import orientations as ornt

from brats_seg.data.errors import CaseError
from brats_seg.data.nifti_header import (
    READ_ERRORS,
    REEXPORT,
    bad_header,
    check_header,
    describe,
    one_line,
    unreadable,
    wrong_ndim,
)
from brats_seg.files import atomic_path

__all__ = [
    "NIFTI_SUFFIXES",
    "ORIENTATION",
    "Volume",
    "find_nifti",
    "is_nifti",
    "load_volume",
    "nifti_stem",
    "save_mask",
    "spacing_of",
    "to_original_orientation",
]

log = logging.getLogger(__name__)

NIFTI_SUFFIXES = (".nii.gz", ".nii")  # the file names the project reads and writes
ORIENTATION = "RAS"  # voxel axis order of every array inside the project (x to the right, y anterior, z superior)


def is_nifti(path: Path) -> bool:
    """True for an existing ``.nii``/``.nii.gz`` file."""
    return path.is_file() and path.name.endswith(NIFTI_SUFFIXES)


def nifti_stem(path: Path) -> str:
    """``CASE`` of ``CASE.nii.gz`` / ``CASE.nii`` (the plain stem of other names)."""
    for suffix in NIFTI_SUFFIXES:
        if path.name.endswith(suffix):
            return path.name[: -len(suffix)]
    return path.stem


def find_nifti(folder: Path, stem: str) -> Path | None:
    """``<folder>/<stem>.nii.gz`` or ``.nii``, whichever exists (gzip first), else None."""
    for suffix in NIFTI_SUFFIXES:
        path = folder / f"{stem}{suffix}"
        if path.is_file():
            return path
    return None


@dataclass
class Volume:
    """A volume in RAS voxel order and what is needed to put data back on its grid.

    Attributes:
        data: array in RAS order, ``(x, y, z)`` or ``(x, y, z, c)``.
        affine_ras: voxel-to-world affine of ``data``.
        spacing_mm: voxel size of ``data`` along x, y, z (mm).
        original_affine: affine of the file as stored.
        original_header: the file's header (for writing masks in its image).
        original_shape: spatial shape of the file as stored.
        path: the file.
    """

    data: np.ndarray
    affine_ras: np.ndarray
    spacing_mm: tuple[float, float, float]
    original_affine: np.ndarray
    original_header: nib.Nifti1Header
    original_shape: tuple[int, int, int]
    path: Path


def spacing_of(affine: np.ndarray) -> tuple[float, float, float]:
    """Voxel size (mm) along each voxel axis of ``affine``."""
    return tuple(float(v) for v in np.sqrt((np.asarray(affine)[:3, :3] ** 2).sum(axis=0)))


def load_volume(path: str | Path, case_id: str, expect_ndim: int = 3, dtype=np.float32) -> Volume:
    """Load a NIfTI file, reoriented to RAS.

    The header is checked before any voxel is read (:func:`~brats_seg.data.nifti_header.check_header`), so a corrupt
    or hostile header ends in a one-line :class:`CaseError` naming the file instead of a
    nibabel traceback, a hang, or an attempt to allocate the size it declares.

    Args:
        path: ``.nii`` or ``.nii.gz`` file.
        case_id: for error messages.
        expect_ndim: 3 for one modality or a label map, 4 for an MSD 4D image. A trailing
            singleton 4th axis counts as 3D.
        dtype: dtype of the returned data.

    Raises:
        CaseError: missing, truncated or non-NIfTI file; malformed header (dimensions, voxel
            sizes, data type, data offset, extensions, affine); wrong dimensionality; NaN/Inf voxels.
    """
    path = Path(path)
    if not path.is_file():
        raise CaseError(case_id, path, "file not found", "Restore it (or run with data.on_error=skip).")
    check_header(path, case_id, expect_ndim, dtype)
    try:
        img = nib.load(str(path))
        if not isinstance(img, (nib.Nifti1Image, nib.Nifti2Image)):
            raise nib.filebasedimages.ImageFileError(f"not a NIfTI image ({type(img).__name__})")
        data = np.asanyarray(img.dataobj).astype(dtype, copy=False)
    except READ_ERRORS as e:
        raise unreadable(case_id, path, f" ({describe(e)})") from e
    if data.ndim == 4 and data.shape[3] == 1 and expect_ndim == 3:
        data = data[..., 0]
    if data.ndim != expect_ndim:
        raise wrong_ndim(case_id, path, expect_ndim, data.shape)
    bad = int(np.size(data) - np.count_nonzero(np.isfinite(data)))
    if bad:
        raise CaseError(
            case_id,
            path,
            f"{bad} voxels are NaN or Inf",
            "Fix the file (e.g. re-export it from the source) or remove the case (or data.on_error=skip).",
        )
    affine = img.affine
    try:
        transform = ornt.ornt_transform(ornt.io_orientation(affine), ornt.axcodes2ornt(tuple(ORIENTATION)))
    except (ValueError, np.linalg.LinAlgError) as e:  # check_header rejects singular affines; a safety net
        raise bad_header(case_id, path, f"its affine has no axis orientation ({one_line(e)})", REEXPORT) from e
    data_ras = ornt.apply_orientation(data, transform)
    affine_ras = affine @ ornt.inv_ornt_aff(transform, data.shape[:3])
    return Volume(
        data=np.ascontiguousarray(data_ras),
        affine_ras=affine_ras,
        spacing_mm=spacing_of(affine_ras),
        original_affine=affine.copy(),
        original_header=img.header.copy(),
        original_shape=tuple(int(s) for s in data.shape[:3]),
        path=path,
    )


def to_original_orientation(data_ras: np.ndarray, original_affine: np.ndarray) -> np.ndarray:
    """Undo the RAS reorientation of :func:`load_volume` for an array on the RAS grid."""
    back = ornt.ornt_transform(ornt.axcodes2ornt(tuple(ORIENTATION)), ornt.io_orientation(original_affine))
    return np.ascontiguousarray(ornt.apply_orientation(data_ras, back))


def save_mask(
    mask_ras: np.ndarray,
    original_affine: np.ndarray,
    original_header: nib.Nifti1Header,
    path: str | Path,
) -> Path:
    """Write a label map given in RAS order on the original file's grid.

    The file gets the original affine (qform and sform) and header, with uint8 data and
    no intensity scaling. Written to a temporary name and renamed, so an interrupted
    write never leaves a half file.

    Args:
        mask_ras: integer label map ``(x, y, z)`` in RAS order.
        original_affine: affine of the reference file (as stored).
        original_header: header of the reference file.
        path: output ``.nii.gz``.
    """
    path = Path(path)
    data = to_original_orientation(np.asarray(mask_ras), original_affine).astype(np.uint8)
    header = original_header.copy()
    header.set_data_dtype(np.uint8)
    img = nib.Nifti1Image(data, original_affine, header=header)
    slope, inter = original_header.get_slope_inter()
    if slope not in (None, 1.0) or inter not in (None, 0.0):
        img.header.set_slope_inter(np.nan, np.nan)  # integer labels: never scaled
    img.set_qform(original_affine, code=int(original_header["qform_code"]))
    img.set_sform(original_affine, code=int(original_header["sform_code"]))
    with atomic_path(path, suffix=".nii.gz" if path.name.endswith(".gz") else ".nii") as tmp:
        nib.save(img, tmp)
    return path


def save_nifti(path: str | Path, data: np.ndarray, affine: np.ndarray, description: str) -> Path:
    """Write a generated volume reproducibly: .nii.gz at gzip level 1 with mtime 0 (same data,
    same bytes), qform and sform set to ``affine`` (mm), atomically."""
    img = nib.Nifti1Image(data, affine)
    img.header.set_xyzt_units("mm", "sec")
    img.set_qform(affine, code=1)
    img.set_sform(affine, code=1)
    img.header["descrip"] = description.encode()[:79]
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        with gzip.GzipFile(filename="", mode="wb", compresslevel=1, fileobj=f, mtime=0) as gz:
            img.to_file_map({"image": nib.FileHolder(fileobj=gz), "header": nib.FileHolder(fileobj=gz)})
    return Path(path)
