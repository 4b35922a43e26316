"""NIfTI header checks: a malformed or hostile header refused before any voxel is read.

nibabel trusts the header: it allocates what dim x datatype declares before reading,
reads an extension of whatever size esize says, and raises its own (sometimes
multi-line) errors. :func:`check_header` reads only the header and extension sizes, with
the file's real size at hand, and raises a one-line :class:`CaseError` naming the file:
dimensions, voxel sizes, data type and scaling, the data offset and size (against the file,
a gzip stream's largest expansion and the free memory), extensions and the affine.
:func:`brats_seg.data.nifti.load_volume` calls it first; the error builders here word every
unreadable file the same way.
"""

from __future__ import annotations

import gzip
import math
import struct
import zlib
from pathlib import Path

import nibabel as nib
import numpy as np
import psutil
from nibabel.nifti1 import data_type_codes
from nibabel.spatialimages import HeaderDataError

from brats_seg.data.errors import CaseError

__all__ = ["READ_ERRORS", "REEXPORT", "bad_header", "check_header", "describe", "one_line", "unreadable", "wrong_ndim"]

#
# nibabel trusts the header: it allocates what dim x datatype declares before reading,
# reads an extension of whatever size esize says, and raises its own (sometimes
# multi-line) errors. These checks read only the header and extension sizes, with the
# file's real size at hand, so a bad file is refused before any voxel is touched.

READ_ERRORS = (
    nib.filebasedimages.ImageFileError,
    HeaderDataError,
    EOFError,
    zlib.error,
    gzip.BadGzipFile,
    OSError,
    ValueError,
    np.linalg.LinAlgError,
)
_GZIP_MAGIC = b"\x1f\x8b"
_MAX_DEFLATE_RATIO = 1032  # deflate expands at most ~1032:1, so a .nii.gz of n bytes holds <= 1032 n bytes
_HEADER_CLASSES = {348: nib.Nifti1Header, 540: nib.Nifti2Header}  # sizeof_hdr -> NIfTI-1, NIfTI-2
_SINGLE_FILE_MAGIC = {348: "n+1", 540: "n+2"}  # a .nii holds header and voxels; "ni1"/"ni2" is a .hdr/.img pair
_EXTENSION_FLAG_BYTES = 4  # after the header: non-zero first byte = extensions follow
REEXPORT = "Re-download or re-export it from the source (or run with data.on_error=skip)."
REEXPORT_TRUNCATED = (
    "The file is truncated or not a NIfTI file: re-download or re-export it (or run with data.on_error=skip)."
)


def one_line(e: BaseException) -> str:
    """An exception's text on one line (nibabel's messages can span several)."""
    return " ".join(str(e).split())


def describe(e: BaseException) -> str:
    """``Type: text`` on one line; zlib's bare ``error`` is named ``zlib.error``."""
    name = "zlib.error" if isinstance(e, zlib.error) else type(e).__name__
    return f"{name}: {one_line(e)}"


def unreadable(case_id: str, path: Path, why: str, hint: str = REEXPORT_TRUNCATED) -> CaseError:
    """``why`` starts with ": " or " (": every unreadable file reads 'cannot be read as NIfTI...'."""
    return CaseError(case_id, path, f"cannot be read as NIfTI{why}", hint)


def bad_header(case_id: str, path: Path, why: str, hint: str = REEXPORT) -> CaseError:
    return CaseError(case_id, path, f"invalid NIfTI header: {why}", hint)


def wrong_ndim(case_id: str, path: Path, expect_ndim: int, shape: tuple) -> CaseError:
    what = {3: "a 3D volume (one modality or label map)", 4: "a 4D image (x, y, z, modality)"}[expect_ndim]
    return CaseError(
        case_id,
        path,
        f"expected {what}, found {len(shape)}D with shape {tuple(shape)}",
        "Check the dataset layout (data=msd expects 4D images, data=brats2021/brats2023 3D files).",
    )


def _available_memory_bytes() -> int:
    return int(psutil.virtual_memory().available)


def check_header(path: Path, case_id: str, expect_ndim: int = 3, dtype=np.float32) -> None:
    """Refuse a file whose header cannot describe a readable image, reading no voxel.

    Checks, in order: not empty; gzip-compressed exactly when named ``.gz``; a complete
    NIfTI-1/2 single-file header (sizeof_hdr, magic); 1 to 7 dimensions of at least one
    voxel each, ``expect_ndim`` of them; a real integer or float data type; finite positive
    voxel sizes; a defined intensity scaling; voxel data that fit in the file (for
    ``.nii.gz`` in what deflate can expand its bytes to) and in free memory; extensions
    that end before the voxel data; a finite, non-singular affine.

    Raises:
        CaseError: the first problem found, naming the file and what to do.
    """
    file_bytes = path.stat().st_size
    if file_bytes == 0:
        raise unreadable(case_id, path, ": the file is empty (0 bytes)")
    with open(path, "rb") as f:
        gzipped = f.read(2) == _GZIP_MAGIC
    named_gz = path.name.lower().endswith(".gz")
    if named_gz and not gzipped:
        raise unreadable(
            case_id,
            path,
            ": it is named .nii.gz but is not gzip-compressed",
            "If it is an uncompressed NIfTI file, rename it to .nii; otherwise re-download or "
            "re-export it (or run with data.on_error=skip).",
        )
    if gzipped and not named_gz:
        raise unreadable(
            case_id,
            path,
            ": it is gzip-compressed but named .nii",
            "Rename it to .nii.gz (or run with data.on_error=skip).",
        )
    capacity_bytes = file_bytes * (_MAX_DEFLATE_RATIO if gzipped else 1)
    try:
        with gzip.open(path, "rb") if gzipped else open(path, "rb") as f:
            header, flag = _read_header(f, case_id, path)
            _check_shape_and_spacing(header, case_id, path, expect_ndim)
            n_voxels, itemsize = _check_datatype_and_scaling(header, case_id, path)
            offset = _check_data_fits(header, case_id, path, n_voxels * itemsize, file_bytes, capacity_bytes)
            _check_memory(case_id, path, n_voxels, itemsize, np.dtype(dtype).itemsize)
            if flag:
                _check_extensions(f, header, case_id, path, offset)
    except (EOFError, zlib.error, gzip.BadGzipFile, OSError) as e:
        raise unreadable(case_id, path, f" ({describe(e)})") from e
    _check_affine(header, case_id, path)


def _read_header(f, case_id: str, path: Path):
    """The header (unchecked by nibabel) and whether the extension flag is set."""
    raw = f.read(max(_HEADER_CLASSES) + _EXTENSION_FLAG_BYTES)
    if len(raw) < 4:
        raise unreadable(case_id, path, f": its header is truncated ({len(raw)} of 348 bytes)")
    for endian, order in (("<", "little"), (">", "big")):  # noqa: B007 (endian is read after the loop)
        sizeof_hdr = int.from_bytes(raw[:4], order, signed=True)
        if sizeof_hdr in _HEADER_CLASSES:
            break
    else:
        raise unreadable(
            case_id,
            path,
            f": not a NIfTI file, its first 4 bytes (sizeof_hdr) read "
            f"{int.from_bytes(raw[:4], 'little', signed=True)}, not 348 (NIfTI-1) "
            "or 540 (NIfTI-2)",
        )
    if len(raw) < sizeof_hdr:
        raise unreadable(case_id, path, f": its header is truncated ({len(raw)} of {sizeof_hdr} bytes)")
    header = _HEADER_CLASSES[sizeof_hdr](raw[:sizeof_hdr], endianness=endian, check=False)
    magic = bytes(header["magic"]).rstrip(b"\0").decode("latin-1")
    if magic != _SINGLE_FILE_MAGIC[sizeof_hdr]:
        pair = " (it marks a header whose voxels are in a separate .img file)" if magic in ("ni1", "ni2") else ""
        raise bad_header(
            case_id,
            path,
            f"magic string {magic!r}{pair} is not {_SINGLE_FILE_MAGIC[sizeof_hdr]!r}, as a single-file .nii needs",
        )
    flag = raw[sizeof_hdr : sizeof_hdr + 1]
    return header, flag not in (b"", b"\x00")


def _check_shape_and_spacing(header, case_id: str, path: Path, expect_ndim: int) -> None:
    dim = [int(d) for d in header["dim"]]
    if not 1 <= dim[0] <= 7:
        raise bad_header(case_id, path, f"dim[0]={dim[0]}, but a NIfTI image has 1 to 7 dimensions")
    for i in range(1, dim[0] + 1):
        if dim[i] < 1:
            raise bad_header(case_id, path, f"dim[{i}]={dim[i]}, but every axis needs at least one voxel")
    shape = tuple(dim[1 : dim[0] + 1])
    if len(shape) == 4 and shape[3] == 1 and expect_ndim == 3:
        shape = shape[:3]
    if len(shape) != expect_ndim:
        raise wrong_ndim(case_id, path, expect_ndim, shape)
    for i in range(1, 4):
        size_mm = float(header["pixdim"][i])
        if not (np.isfinite(size_mm) and size_mm > 0):
            raise bad_header(case_id, path, f"pixdim[{i}]={size_mm:g}, but voxel sizes must be finite and positive")


def _check_datatype_and_scaling(header, case_id: str, path: Path) -> tuple[int, int]:
    """``(voxels, bytes per voxel)`` of a supported data type with a defined scaling."""
    code = int(header["datatype"])
    if code not in data_type_codes.value_set("code"):
        raise bad_header(case_id, path, f"datatype code {code} is not a NIfTI data type")
    stored = data_type_codes.dtype[code]
    if stored.kind not in "iuf" or stored.itemsize == 0:
        name = data_type_codes.niistring[code].removeprefix("NIFTI_TYPE_") or data_type_codes.label[code]
        raise bad_header(
            case_id,
            path,
            f"data type {name} (datatype {code}) is not supported: an image here holds "
            "one integer or float value per voxel",
            "Convert it to a scalar integer or float image and re-export it (or run with data.on_error=skip).",
        )
    slope, inter = float(header["scl_slope"]), float(header["scl_inter"])
    if slope != 0 and np.isfinite(slope) and not np.isfinite(inter):  # slope 0/NaN/Inf: unscaled (nibabel)
        raise bad_header(
            case_id, path, f"scl_inter={inter:g} with scl_slope={slope:g}: the intensity scaling is undefined"
        )
    n_voxels = math.prod(int(d) for d in header["dim"][1 : int(header["dim"][0]) + 1])  # no int64 overflow
    return n_voxels, stored.itemsize


def _check_data_fits(header, case_id, path: Path, data_bytes: int, file_bytes: int, capacity_bytes: int) -> int:
    """The voxel data's start byte, once offset and size are known to fit in the file."""
    first = int(header.single_vox_offset)  # header and extension flag
    offset_f = float(header["vox_offset"])
    if not np.isfinite(offset_f):
        raise bad_header(case_id, path, f"vox_offset={offset_f:g} is not a byte offset")
    if offset_f < first:
        raise bad_header(case_id, path, f"vox_offset={offset_f:g} lies inside the {first}-byte header")
    offset = int(offset_f)
    if offset + data_bytes > capacity_bytes:
        shape = "x".join(str(int(d)) for d in header["dim"][1 : int(header["dim"][0]) + 1])
        dtype = data_type_codes.label[int(header["datatype"])]
        holds = (
            f"a gzip file of {file_bytes} bytes can hold at most {capacity_bytes} bytes"
            if capacity_bytes > file_bytes
            else f"the file holds {file_bytes} bytes"
        )
        size = f"{data_bytes} bytes" + (f" ({data_bytes / 1e9:.3g} GB)" if data_bytes >= 1e9 else "")
        raise unreadable(
            case_id,
            path,
            f": its header declares {shape} {dtype} voxels, {size} of voxel data from byte {offset}, but {holds}",
            "The file is truncated or its header is corrupt: re-download or re-export it "
            "(or run with data.on_error=skip).",
        )
    return offset


def _check_memory(case_id: str, path: Path, n_voxels: int, stored_itemsize: int, out_itemsize: int) -> None:
    """Refuse a size that fits the file (a well-compressed .nii.gz) but not free memory."""
    need_bytes = n_voxels * (stored_itemsize + 2 * out_itemsize)  # stored array, converted copy, RAS copy
    free_bytes = _available_memory_bytes()
    if need_bytes > free_bytes:
        raise CaseError(
            case_id,
            path,
            f"loading it needs about {need_bytes / 1e9:.1f} GB of memory but {free_bytes / 1e9:.1f} GB is available",
            "Free memory or prepare with fewer data.num_workers (or run with data.on_error=skip).",
        )


def _check_extensions(f, header, case_id: str, path: Path, offset: int) -> None:
    """Each extension's size (esize) must keep it before the voxel data; walks as nibabel reads them."""
    pos = int(header.single_vox_offset)
    while offset - pos >= 16:  # nibabel reads another extension while 16 bytes remain
        f.seek(pos)
        head = f.read(8)
        if len(head) < 8:
            raise unreadable(case_id, path, f": it ends inside the header extension at byte {pos}")
        esize, _ecode = struct.unpack(f"{header.endianness}ii", head)
        if esize < 8:
            raise bad_header(
                case_id,
                path,
                f"the header extension at byte {pos} declares {esize} bytes, fewer than its own 8-byte size and code",
            )
        if pos + esize > offset:
            raise bad_header(
                case_id,
                path,
                f"the header extension at byte {pos} declares {esize} bytes, "
                f"running past the start of the voxel data at byte {offset}",
            )
        pos += esize


def _check_affine(header, case_id: str, path: Path) -> None:
    """The affine nibabel will use (sform, else qform, else pixdim) is finite and of full rank."""
    which = (
        "sform" if header["sform_code"] != 0 else "qform" if header["qform_code"] != 0 else "pixdim (no sform or qform)"
    )
    try:
        affine = header.get_best_affine()
    except (ValueError, ArithmeticError, np.linalg.LinAlgError) as e:
        raise bad_header(case_id, path, f"its {which} affine cannot be computed ({one_line(e)})") from e
    if not np.all(np.isfinite(affine)):
        raise bad_header(case_id, path, f"its {which} affine contains NaN or Inf")
    axes = affine[:3, :3]
    lengths = np.sqrt((axes**2).sum(axis=0))
    # |det| / product of axis lengths: 1 for perpendicular axes, 0 when they are parallel or zero
    if np.any(lengths == 0) or abs(np.linalg.det(axes)) < 1e-6 * float(np.prod(lengths)):
        raise bad_header(case_id, path, f"its {which} affine is singular: its voxel axes do not span 3D space")
