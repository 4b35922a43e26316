"""Legacy BraTS segmentation metrics (BraTS 2012-2022): Dice, HD95, sensitivity, specificity.

Three layers, as in MONAI:

* pure per-mask functions (:func:`compute_dice`, :func:`compute_hd95_mm`,
  :func:`compute_sensitivity`, :func:`compute_specificity`) on one binary mask pair;
* a per-case function (:func:`compute_case_metrics`) over the regions ``(x, y, z, R)``,
  channels-last, in RAS;
* the accumulator that writes ``metrics.csv``/``summary.json`` is
  :class:`brats_seg.evaluation.scoring.table.MetricsTable`; the lesion-wise metrics of BraTS 2023+
  are in :mod:`brats_seg.evaluation.scoring.lesionwise`.

Masks are compared on the native grid of the reference label file; spacings are in mm.
Pure numpy (plus DeepMind's ``surface_distance`` for HD95): no TensorFlow here.

Empty-mask rules (BraTS conventions, see DESIGN.md "Metrics"):

=========================  =====  =========  ===========  ===========
pred / ref                 Dice   HD95 (mm)  sensitivity  specificity
=========================  =====  =========  ===========  ===========
both empty                 1      0          1            TN / (TN + FP) = 1
ref empty, pred not        0      373.13     0            TN / (TN + FP)
pred empty, ref not        0      373.13     0            TN / (TN + FP) = 1
=========================  =====  =========  ===========  ===========

Sensitivity with an empty reference follows the BraTS 2023 evaluation code (taken
from GaNDLF): ``TP / (TP + FN)`` evaluates to 0 when the prediction is not empty and
is set to 1 when both masks are empty. Specificity uses the mirror rule on the
background (``spec(pred, ref) == sens(~pred, ~ref)``): it is only undefined when the
reference covers the whole volume, and is then 1 if the prediction also covers it
and 0 otherwise. Specificity is computed over the whole volume, background included.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Sequence

import numpy as np
import surface_distance

__all__ = [
    "HD95_EMPTY_MM",
    "LEGACY_METRICS",
    "compute_case_metrics",
    "compute_dice",
    "compute_hd95_mm",
    "compute_sensitivity",
    "compute_specificity",
]

logger = logging.getLogger(__name__)

# mm; the diagonal of the 240 x 240 x 155 mm BraTS image, the HD95 given when exactly
# one of the two masks is empty (DESIGN.md).
HD95_EMPTY_MM = 373.13

# Metric prefixes, in the column order of the contract.
LEGACY_METRICS = ("dice", "hd95", "sens", "spec")


# ---------------------------------------------------------------------------------------
# Pure per-mask functions
# ---------------------------------------------------------------------------------------


def _as_mask(name: str, array: np.ndarray) -> np.ndarray:
    """Return ``array`` as a bool mask, refusing anything that is not already binary."""
    array = np.asarray(array)
    if array.dtype == bool:
        return array
    if not np.issubdtype(array.dtype, np.integer):
        raise ValueError(
            f"{name} should be a bool or {{0, 1}} integer mask, got dtype {array.dtype}. "
            f"Threshold probabilities first (e.g. {name} > 0.5)."
        )
    if array.size and (array.min() < 0 or array.max() > 1):
        raise ValueError(
            f"{name} should hold only 0 and 1, got values in [{array.min()}, {array.max()}]. "
            f"Convert label maps to regions first (brats_seg.data.labels.labels_to_regions)."
        )
    return array.astype(bool)


def _as_mask_pair(pred: np.ndarray, ref: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    pred, ref = _as_mask("pred", pred), _as_mask("ref", ref)
    if pred.shape != ref.shape:
        raise ValueError(
            f"pred and ref should have the same shape, got pred {pred.shape} and ref {ref.shape}. "
            f"Resample the prediction to the reference grid first."
        )
    return pred, ref


def _check_spacing_mm(spacing_mm: Sequence[float]) -> tuple[float, float, float]:
    spacing = tuple(float(s) for s in np.ravel(np.asarray(spacing_mm, dtype=float)))
    if len(spacing) != 3:
        raise ValueError(f"spacing_mm should have 3 values (x, y, z) in mm, got {len(spacing)}: {spacing_mm!r}.")
    if not all(math.isfinite(s) and s > 0 for s in spacing):
        raise ValueError(
            f"spacing_mm should be finite and positive (mm), got {spacing_mm!r}. "
            f"Check the pixdim of the reference NIfTI header."
        )
    return spacing  # type: ignore[return-value]


def compute_dice(pred: np.ndarray, ref: np.ndarray) -> float:
    """Dice coefficient ``2 |P & R| / (|P| + |R|)``.

    Args:
        pred: predicted mask, any shape, bool or {0, 1}.
        ref: reference mask, same shape.

    Returns:
        Dice in [0, 1]; 1 if both masks are empty, 0 if exactly one is.
    """
    pred, ref = _as_mask_pair(pred, ref)
    n_pred, n_ref = np.count_nonzero(pred), np.count_nonzero(ref)
    if n_pred + n_ref == 0:
        return 1.0
    return 2.0 * np.count_nonzero(pred & ref) / (n_pred + n_ref)


def compute_hd95_mm(pred: np.ndarray, ref: np.ndarray, spacing_mm: Sequence[float]) -> float:
    """Symmetric 95th-percentile Hausdorff distance, in mm.

    Computed by DeepMind's ``surface_distance`` (the reference BraTS 2023 uses):
    surfel-area-weighted 95th percentile of the distances from each surface to the
    other, the larger of the two directions.

    Args:
        pred: predicted mask ``(x, y, z)``, bool or {0, 1}.
        ref: reference mask ``(x, y, z)``, same shape.
        spacing_mm: voxel size ``(x, y, z)`` in mm, of the reference file.

    Returns:
        HD95 in mm; 0 if both masks are empty, :data:`HD95_EMPTY_MM` if exactly one is.
    """
    pred, ref = _as_mask_pair(pred, ref)
    spacing = _check_spacing_mm(spacing_mm)
    if pred.ndim != 3:
        raise ValueError(f"HD95 needs 3D masks (x, y, z), got shape {pred.shape}.")
    pred_empty, ref_empty = not pred.any(), not ref.any()
    if pred_empty and ref_empty:
        return 0.0
    if pred_empty or ref_empty:
        # Also keeps us off the library's empty-mask path, which uses np.Inf (gone in numpy 2).
        return HD95_EMPTY_MM
    with warnings.catch_warnings():
        # surface-distance 0.1 imports from scipy.ndimage.filters/.morphology (deprecated).
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        distances = surface_distance.compute_surface_distances(ref, pred, spacing)
    return float(surface_distance.compute_robust_hausdorff(distances, 95))


def compute_sensitivity(pred: np.ndarray, ref: np.ndarray) -> float:
    """Sensitivity (recall) ``TP / (TP + FN)``.

    Args:
        pred: predicted mask, any shape, bool or {0, 1}.
        ref: reference mask, same shape.

    Returns:
        Sensitivity in [0, 1]. With an empty reference (BraTS 2023 / GaNDLF rule):
        1 if the prediction is empty too, else 0.
    """
    pred, ref = _as_mask_pair(pred, ref)
    n_ref = np.count_nonzero(ref)
    if n_ref == 0:
        return 1.0 if not pred.any() else 0.0
    return np.count_nonzero(pred & ref) / n_ref


def compute_specificity(pred: np.ndarray, ref: np.ndarray) -> float:
    """Specificity ``TN / (TN + FP)`` over the whole volume.

    Args:
        pred: predicted mask, any shape, bool or {0, 1}.
        ref: reference mask, same shape.

    Returns:
        Specificity in [0, 1]. Undefined only if the reference covers every voxel
        (no negatives); then, mirroring the sensitivity rule on the background,
        1 if the prediction covers every voxel too, else 0.
    """
    pred, ref = _as_mask_pair(pred, ref)
    return compute_sensitivity(~pred, ~ref)


# ---------------------------------------------------------------------------------------
# Per case
# ---------------------------------------------------------------------------------------


def compute_case_metrics(
    pred_regions: np.ndarray,
    ref_regions: np.ndarray,
    spacing_mm: Sequence[float],
    region_names: Sequence[str] = ("wt", "tc", "et"),
) -> dict[str, float]:
    """All metrics of one case, per region.

    Args:
        pred_regions: predicted regions ``(x, y, z, R)``, bool or {0, 1}, on the
            reference grid.
        ref_regions: reference regions ``(x, y, z, R)``, same shape.
        spacing_mm: voxel size ``(x, y, z)`` of the reference file, in mm.
        region_names: one name per channel, e.g. ``("wt", "tc", "et")`` or ``("wt",)``.

    Returns:
        ``{"dice_<r>", "hd95_<r>", "sens_<r>", "spec_<r>"}`` for each region ``r``,
        ordered as the table's columns (dice for all regions, then hd95, ...).

    Raises:
        ValueError: shapes differ, are not 4D, the channel count differs from
            ``len(region_names)``, or ``spacing_mm`` is not 3 positive values.
    """
    pred_regions, ref_regions = np.asarray(pred_regions), np.asarray(ref_regions)
    if pred_regions.shape != ref_regions.shape:
        raise ValueError(
            f"pred_regions and ref_regions should have the same shape, got pred "
            f"{pred_regions.shape} and ref {ref_regions.shape}. Resample the prediction to "
            f"the reference grid and convert both to regions (x, y, z, R) first."
        )
    if pred_regions.ndim != 4:
        raise ValueError(
            f"regions should have shape (x, y, z, R), got {pred_regions.shape}. "
            f"Add a channel axis for a single region (mask[..., None])."
        )
    region_names = tuple(region_names)
    if pred_regions.shape[-1] != len(region_names):
        raise ValueError(
            f"regions have {pred_regions.shape[-1]} channels but region_names has "
            f"{len(region_names)}: {region_names}. Pass one name per channel."
        )
    spacing = _check_spacing_mm(spacing_mm)

    per_metric: dict[str, dict[str, float]] = {m: {} for m in LEGACY_METRICS}
    for i, region in enumerate(region_names):
        pred = _as_mask(f"pred_regions[..., {i}] ({region})", pred_regions[..., i])
        ref = _as_mask(f"ref_regions[..., {i}] ({region})", ref_regions[..., i])
        per_metric["dice"][region] = compute_dice(pred, ref)
        per_metric["hd95"][region] = compute_hd95_mm(pred, ref, spacing)
        per_metric["sens"][region] = compute_sensitivity(pred, ref)
        per_metric["spec"][region] = compute_specificity(pred, ref)
    return {
        f"{metric}_{region}": float(value) for metric in LEGACY_METRICS for region, value in per_metric[metric].items()
    }
