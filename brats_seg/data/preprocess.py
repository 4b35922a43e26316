"""Resample, normalise and crop a case to the network grid, and invert it for predictions.

All arrays are RAS voxel order, channels-last ``(x, y, z[, c])``. Steps:

1. resample to isotropic ``spacing_mm`` with SimpleITK (linear for images, nearest for
   labels); the resampled grid covers the same physical extent as the native grid
   (voxel boxes aligned at the volume's corner);
2. z-score each channel over brain voxels (non-zero in any channel at the native grid),
   background set to 0;
3. crop/pad to ``shape`` centred on the brain bounding box.

:class:`PreprocessRecord` holds everything :func:`invert_to_native` needs to put a
network output back on the native RAS grid.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

import numpy as np
import SimpleITK as sitk

from brats_seg.data.errors import CaseError

__all__ = [
    "NETWORK_DTYPE",
    "ZSCORE_MIN_STD",
    "PreprocessRecord",
    "check_same_grid",
    "describe_preprocessing",
    "invert_to_native",
    "preprocess_case",
    "resample",
    "resampled_shape",
    "zscore_brain",
]

log = logging.getLogger(__name__)

ZSCORE_MIN_STD = 1e-6  # a channel whose brain voxels vary less than this is centred only (divided by 1)
NETWORK_DTYPE = np.float16  # the network-grid image as cached and fed to the model: half the bytes of float32


@dataclass
class PreprocessRecord:
    """How a case was mapped from its native RAS grid to the network grid (JSON-able).

    Attributes:
        native_shape: RAS shape of the original files.
        native_spacing_mm: their voxel size.
        resampled_shape: shape after resampling to ``spacing_mm``.
        spacing_mm: target isotropic spacing.
        crop_start: index in the resampled grid of the network grid's first voxel, per
            axis; negative where the network grid extends past the volume (padding).
        shape: network grid shape.
        brain_box: brain bounding box in the resampled grid, ``[[start, stop] x 3]``.
        cropped_voxels: brain voxels cut off (only with ``allow_crop``), per axis.
    """

    native_shape: list[int]
    native_spacing_mm: list[float]
    resampled_shape: list[int]
    spacing_mm: float
    crop_start: list[int]
    shape: list[int]
    brain_box: list[list[int]]
    cropped_voxels: list[int]

    def to_dict(self) -> dict:
        return asdict(self)


def check_same_grid(case_id: str, shapes_affines: list[tuple[str, tuple, np.ndarray]], atol: float = 1e-3) -> None:
    """Raise :class:`CaseError` if the files' shapes or affines disagree.

    Args:
        shapes_affines: ``[(path, shape, affine)]`` of the case's files (as stored).
    """
    ref_path, ref_shape, ref_aff = shapes_affines[0]
    for path, shape, aff in shapes_affines[1:]:
        if tuple(shape[:3]) != tuple(ref_shape[:3]):
            raise CaseError(
                case_id,
                path,
                f"shape {tuple(shape[:3])} differs from {ref_shape[:3]} of {ref_path}",
                "All modalities and the label of a case must share one grid: co-register and resample them first.",
            )
        if not np.allclose(aff, ref_aff, atol=atol):
            raise CaseError(
                case_id,
                path,
                f"affine differs from that of {ref_path} (max difference {np.abs(aff - ref_aff).max():.4g})",
                "All modalities and the label of a case must share one grid: co-register and resample them first.",
            )


def resampled_shape(shape: tuple[int, ...], spacing_mm, target_mm: float) -> tuple[int, int, int]:
    """The grid of ``shape`` (voxels of ``spacing_mm``) resampled to ``target_mm``: its extent kept."""
    return tuple(max(1, int(round(n * s / target_mm))) for n, s in zip(shape[:3], spacing_mm))


def estimate_preparation_bytes(
    native_shape, native_spacing_mm, target_spacing_mm: float, shape, channels: int = 4
) -> int:
    """Memory :func:`preprocess_case` and the cache writer hold for one case at their peak.

    The native float32 image, one float32 array of all channels on the resampled grid (the
    native extent at ``target_spacing_mm``) with a channel's resampling input and output
    beside it, the brain masks, the float16 network-grid image and the label maps.

    A spacing that is not finite and positive (a corrupt header, which the case's own load
    reports by file) counts as ``target_spacing_mm``: the estimate must not fail first.
    """
    native = int(np.prod(native_shape[:3]))
    native_spacing_mm = [float(s) if np.isfinite(s) and s > 0 else float(target_spacing_mm) for s in native_spacing_mm]
    resampled = int(np.prod(resampled_shape(tuple(native_shape), native_spacing_mm, target_spacing_mm)))
    network = int(np.prod(shape))
    return (
        native * (4 * channels + 2)  # float32 image, brain mask, label
        + resampled * (4 * channels + 2 * 4 + 2)  # all channels, a channel's SimpleITK in/out, masks
        + network * (2 * channels + 4)
    )  # float16 image, labels and regions


def resample(
    volume: np.ndarray,
    spacing_mm,
    target_spacing_mm,
    out_shape=None,
    interpolation: str = "linear",
) -> np.ndarray:
    """Resample a 3D array between two axis-aligned grids sharing a corner.

    Voxel ``i`` of a grid with spacing ``s`` covers ``[i*s, (i+1)*s)`` mm along its axis, so
    both grids span the same physical box when ``n_out * s_out == n_in * s_in``.

    Args:
        volume: ``(x, y, z)`` array.
        spacing_mm: its voxel size (3 values).
        target_spacing_mm: output voxel size (scalar or 3 values).
        out_shape: output shape; default covers the same extent.
        interpolation: ``linear`` | ``nearest``.

    Returns:
        float32 (linear) or the input dtype (nearest) array of ``out_shape``.
    """
    spacing_mm = [float(s) for s in spacing_mm]
    target = [float(target_spacing_mm)] * 3 if np.isscalar(target_spacing_mm) else [float(t) for t in target_spacing_mm]
    if out_shape is None:
        out_shape = tuple(max(1, int(round(n * s / t))) for n, s, t in zip(volume.shape, spacing_mm, target))
    if interpolation == "linear":
        arr, interp = volume.astype(np.float32, copy=False), sitk.sitkLinear
    elif interpolation == "nearest":
        arr, interp = volume, sitk.sitkNearestNeighbor
    else:
        raise ValueError(f"interpolation should be 'linear' or 'nearest', got {interpolation!r}.")
    # SimpleITK arrays are (z, y, x); voxel centres sit at origin + i * spacing.
    img = sitk.GetImageFromArray(np.ascontiguousarray(arr.transpose(2, 1, 0)))
    img.SetSpacing(spacing_mm)
    img.SetOrigin([s / 2 for s in spacing_mm])
    out = sitk.Resample(
        img,
        [int(n) for n in out_shape],
        sitk.Transform(),
        interp,
        [t / 2 for t in target],
        target,
        img.GetDirection(),
        0.0,
        img.GetPixelID(),
    )
    return sitk.GetArrayFromImage(out).transpose(2, 1, 0)


def zscore_brain(image: np.ndarray, brain: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Z-score each channel over brain voxels; background becomes 0.

    Args:
        image: ``(x, y, z, c)`` float array.
        brain: ``(x, y, z)`` bool mask.
        out: float32 array of ``image``'s shape to write into (``image`` itself: in place, one
            channel's brain voxels at a time, as preparation at 2x resolution does).
    """
    out = np.zeros(image.shape, dtype=np.float32) if out is None else out
    background = ~brain
    for c in range(image.shape[-1]):
        values = image[..., c][brain]
        std = float(values.std(dtype=np.float64)) if values.size else 0.0  # float64 sums of float32 values
        mean = float(values.mean(dtype=np.float64)) if values.size else 0.0
        channel = out[..., c]
        channel[brain] = (values - np.float32(mean)) / np.float32(std if std > ZSCORE_MIN_STD else 1.0)
        channel[background] = 0.0
    return out


def _brain_box(brain: np.ndarray) -> list[list[int]]:
    idx = np.nonzero(brain)
    if idx[0].size == 0:
        return [[0, n] for n in brain.shape]
    return [[int(i.min()), int(i.max()) + 1] for i in idx]


def _crop_pad(array: np.ndarray, start, shape, dtype=None) -> np.ndarray:
    """Window of ``shape`` at ``start`` (may be negative or past the end: zero padded), in
    ``dtype`` (default the array's)."""
    out = np.zeros(tuple(shape) + array.shape[3:], dtype=dtype or array.dtype)
    src, dst = [], []
    for s, n, size in zip(start, shape, array.shape[:3]):
        lo, hi = max(s, 0), min(s + n, size)
        src.append(slice(lo, max(hi, lo)))
        dst.append(slice(lo - s, lo - s + max(hi - lo, 0)))
    out[tuple(dst)] = array[tuple(src)]
    return out


def preprocess_case(
    case_id: str,
    image: np.ndarray,
    spacing_mm,
    target_spacing_mm: float,
    shape,
    label: np.ndarray | None = None,
    allow_crop: bool = False,
) -> tuple[np.ndarray, np.ndarray | None, PreprocessRecord]:
    """Resample, z-score and crop/pad one case.

    Args:
        case_id: for messages.
        image: native ``(x, y, z, 4)`` float array, RAS.
        spacing_mm: native voxel size.
        target_spacing_mm: isotropic target spacing (``resolution.spacing_mm``).
        shape: network grid (``resolution.shape``).
        label: native ``(x, y, z)`` integer label map, or None.
        allow_crop: a brain box larger than ``shape`` is cut (with a warning) instead of an error.

    Returns:
        ``(image float16 (X,Y,Z,4), label (X,Y,Z) or None, record)``: the image in the
        cache's dtype.

    Raises:
        CaseError: the brain box is larger than ``shape`` and ``allow_crop`` is off.
    """
    shape = [int(s) for s in shape]
    native_brain = np.any(image != 0, axis=-1)
    out_shape = resampled_shape(image.shape, spacing_mm, target_spacing_mm)
    # One float32 array on the resampled grid, filled a channel at a time and z-scored in place:
    # at 0.5 mm a channel is ~0.3 GB, and every extra copy of all four is over a GB.
    normed = np.empty((*out_shape, image.shape[-1]), dtype=np.float32)
    for c in range(image.shape[-1]):
        normed[..., c] = resample(image[..., c], spacing_mm, target_spacing_mm, out_shape)
    brain = resample(native_brain.astype(np.uint8), spacing_mm, target_spacing_mm, out_shape, "nearest") > 0
    zscore_brain(normed, brain, out=normed)

    box = _brain_box(brain)
    extent = [b[1] - b[0] for b in box]
    too_big = [e - n for e, n in zip(extent, shape)]
    if any(t > 0 for t in too_big):
        msg = (
            f"brain bounding box {tuple(extent)} voxels at {target_spacing_mm} mm is larger than "
            f"resolution.shape {tuple(shape)} by {tuple(max(t, 0) for t in too_big)} voxels"
        )
        if not allow_crop:
            raise CaseError(
                case_id,
                None,
                msg,
                "Use a larger resolution.shape (divisible by 2**model.depth), or data.allow_crop=true "
                "to cut the brain box to the shape with a warning.",
            )
        log.warning("case %s: %s; cropping (data.allow_crop=true)", case_id, msg)
    start = [b[0] + e // 2 - n // 2 for b, e, n in zip(box, extent, shape)]
    record = PreprocessRecord(
        native_shape=[int(s) for s in image.shape[:3]],
        native_spacing_mm=[float(s) for s in spacing_mm],
        resampled_shape=list(out_shape),
        spacing_mm=float(target_spacing_mm),
        crop_start=[int(s) for s in start],
        shape=shape,
        brain_box=box,
        cropped_voxels=[max(t, 0) for t in too_big],
    )
    out_image = _crop_pad(normed, start, shape, dtype=NETWORK_DTYPE)  # the cache's dtype, no float32 copy
    out_label = None
    if label is not None:
        lab = resample(label.astype(np.uint8), spacing_mm, target_spacing_mm, out_shape, "nearest")
        out_label = _crop_pad(lab, start, shape)
    return out_image, out_label, record


def invert_to_native(output: np.ndarray, record: PreprocessRecord | dict) -> np.ndarray:
    """Put a network-grid array back on the native RAS grid (linear interpolation).

    Args:
        output: ``(X, Y, Z, C)`` float array on the network grid (e.g. probabilities).
        record: the case's :class:`PreprocessRecord` (or its dict).

    Returns:
        float32 ``(x, y, z, C)`` on the native grid; 0 outside the network window.
    """
    rec = record if isinstance(record, PreprocessRecord) else PreprocessRecord(**record)
    if tuple(output.shape[:3]) != tuple(rec.shape):
        raise ValueError(f"output grid {output.shape[:3]} differs from the case's network grid {tuple(rec.shape)}.")
    # Place the window back in the resampled grid (the inverse crop is a crop at -start) and
    # resample, a channel at a time: at 2x resolution one channel on the resampled grid is
    # ~0.3 GB, all of them together over a GB.
    back_start = [-s for s in rec.crop_start]
    native = np.empty((*rec.native_shape, output.shape[-1]), dtype=np.float32)
    for c in range(output.shape[-1]):
        on_resampled = _crop_pad(output[..., c], back_start, rec.resampled_shape)
        native[..., c] = resample(on_resampled, [rec.spacing_mm] * 3, rec.native_spacing_mm, rec.native_shape)
    return native


def describe_preprocessing(spacing_mm: float, shape, allow_crop: bool = False) -> dict:
    """What :func:`preprocess_case` does to a case and :func:`invert_to_native` to a network
    output, as JSON-able data for programs that prepare inputs without brats_seg (an export's
    ``preprocessing.json``). Written here, beside the code it describes, from its constants.

    Args:
        spacing_mm: ``resolution.spacing_mm``.
        shape: ``resolution.shape`` (x, y, z), the network grid.
        allow_crop: ``data.allow_crop``: a brain box larger than ``shape`` is cut, not refused.
    """
    from brats_seg.data.nifti import ORIENTATION

    shape = [int(s) for s in shape]
    return {
        "orientation": ORIENTATION,
        "spacing_mm": float(spacing_mm),
        "shape": shape,
        "steps": [
            f"reorient each file to {ORIENTATION} voxel order by axis flips/permutations only (no resampling); "
            "the four contrasts must share one grid (co-registered)",
            "brain mask: voxels non-zero in any channel on the native grid",
            f"resample each channel to isotropic {float(spacing_mm)} mm, linear (SimpleITK); the grid covers the "
            "native extent: voxel i spans [i*s, (i+1)*s) mm from the volume's corner, resampled size "
            "round(n * native_spacing / spacing) per axis; the brain mask likewise with nearest neighbour",
            f"z-score each channel over the resampled brain voxels (mean and standard deviation in float64; a "
            f"standard deviation under {ZSCORE_MIN_STD} counts as 1); background voxels set to 0",
            f"crop/pad to {shape}: brain box = bounding box of the resampled brain mask [start, stop) per axis; "
            "window start = box_start + (box_stop - box_start) // 2 - shape // 2 (may be negative or past the "
            "end: zero padding); "
            + (
                "a box larger than the shape is cut, with a warning"
                if allow_crop
                else "a box larger than the shape is refused"
            ),
            f"the image is rounded to {np.dtype(NETWORK_DTYPE).name} (brats_seg's cache dtype) before the "
            "network; feeding float32 differs by that rounding only",
        ],
        "zscore_min_std": ZSCORE_MIN_STD,
        "network_dtype": np.dtype(NETWORK_DTYPE).name,
        "inverse": [
            "place the network output (x, y, z, R) back in the resampled grid at -window_start (zero outside)",
            f"resample each channel linearly to the native {ORIENTATION} grid; then back to the file's own orientation",
        ],
    }
