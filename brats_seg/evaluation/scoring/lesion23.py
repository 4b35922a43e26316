"""BraTS 2023/2024 lesion-wise scoring (``lesion23_*``), written here as there is no library for it.

This is the definition the 2023 and 2024 leaderboards ranked by (Saluja et al., the BraTS
2023 lesion-wise metrics): reference lesions are connected components (26-connectivity)
merged when their dilation (18-connected structuring element, ``dilation`` iterations) joins
them; each reference lesion is scored against the union of the predicted components that
touch its dilation (Dice, and DeepMind's HD95 in mm); reference lesions of
``min_volume_mm3`` or less are dropped from the average; every missed lesion scores Dice 0 /
HD95 374 mm and every predicted component touching no reference lesion is a false positive
with Dice 0 / HD95 374 mm, in the same average. With nothing to average (no lesion on either
side) the 2023 code returns Dice 1 and HD95 0, and so do we. There is no maintained library
for this one, so it is written here, following the published description and checked against
the 2023 reference code (README "Metrics").

Masks are ``(x, y, z)`` in RAS, one region each
(:func:`brats_seg.evaluation.scoring.lesionwise.compute_lesionwise_metrics` makes them from the
label maps and a region table); distances and volumes use the true voxel size of each axis,
as the reference code does. The dilation and the volume threshold differ by sub-challenge
(:data:`LESION23_PARAMS`, :func:`lesion23_params_for`). The BraTS 2025+ definition is
:mod:`brats_seg.evaluation.scoring.panoptica_metrics`.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import cc3d
import numpy as np
import scipy.ndimage as ndi
import surface_distance

from brats_seg.evaluation.scoring.lesion_input import check_label_pair

__all__ = [
    "LESION23_MISSED_HD95_MM",
    "LESION23_PARAMS",
    "Lesion23Params",
    "compute_lesion23_metrics",
    "lesion23_params_for",
]

# mm; the 2023 code's penalty for a missed or false-positive lesion.
LESION23_MISSED_HD95_MM = 374.0


@dataclass(frozen=True)
class Lesion23Params:
    """The 2023/2024 lesion-wise parameters of one sub-challenge.

    Attributes:
        dilation: iterations of the 18-connected dilation that merges nearby reference
            lesions and finds the predicted components belonging to a lesion.
        min_volume_mm3: reference lesions of this volume (mm^3) or less are left out.
    """

    dilation: int = 3
    min_volume_mm3: float = 50.0


# Per BraTS 2023 sub-challenge, as in the 2023 reference code.
LESION23_PARAMS: dict[str, Lesion23Params] = {
    "GLI": Lesion23Params(3, 50.0),
    "SSA": Lesion23Params(3, 50.0),
    "PED": Lesion23Params(3, 50.0),
    "MEN": Lesion23Params(1, 50.0),
    "MET": Lesion23Params(1, 2.0),
}

_CHALLENGE = re.compile(r"BraTS-([A-Z]{3})-", re.IGNORECASE)


def lesion23_params_for(case_id: str) -> Lesion23Params:
    """The 2023 parameters for a case, from its ``BraTS-<challenge>-`` prefix; for any other
    case id those of GLI (BraTS 2021 and MSD case ids are all gliomas)."""
    m = _CHALLENGE.match(case_id)
    if m and m.group(1).upper() in LESION23_PARAMS:
        return LESION23_PARAMS[m.group(1).upper()]
    return LESION23_PARAMS["GLI"]


_DILATION = ndi.generate_binary_structure(3, 2)  # 18-connected, as the 2023 code


def _bbox(slices: tuple[slice, ...], pad: int, shape: tuple[int, ...]) -> tuple[slice, ...]:
    return tuple(slice(max(s.start - pad, 0), min(s.stop + pad, n)) for s, n in zip(slices, shape))


def _union_bbox(a: tuple[slice, ...], b: tuple[slice, ...]) -> tuple[slice, ...]:
    return tuple(slice(min(x.start, y.start), max(x.stop, y.stop)) for x, y in zip(a, b))


def _hd95_mm(ref: np.ndarray, pred: np.ndarray, spacing: tuple[float, float, float]) -> float:
    if not pred.any():
        return LESION23_MISSED_HD95_MM
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        distances = surface_distance.compute_surface_distances(ref, pred, spacing)
    hd = float(surface_distance.compute_robust_hausdorff(distances, 95))
    return hd if math.isfinite(hd) else LESION23_MISSED_HD95_MM


def compute_lesion23_metrics(
    pred_mask: np.ndarray,
    ref_mask: np.ndarray,
    spacing_mm: Sequence[float],
    params: Lesion23Params = LESION23_PARAMS["GLI"],
) -> dict[str, float]:
    """The BraTS 2023/2024 lesion-wise Dice and HD95 of one region.

    Args:
        pred_mask, ref_mask: binary masks ``(x, y, z)`` of one region.
        spacing_mm: voxel size per axis, in mm (lesion volumes and HD95 use it).
        params: the sub-challenge's dilation and volume threshold.

    Returns:
        ``{"dice", "hd95", "tp", "fn", "fp"}``: the lesion-wise Dice and HD95 (mm) and the
        lesion counts of the 2023 code (lesions at or under the threshold not counted).
    """
    pred, ref, spacing = check_label_pair(np.asarray(pred_mask) != 0, np.asarray(ref_mask) != 0, spacing_mm)
    pred, ref = pred != 0, ref != 0
    voxel_mm3 = spacing[0] * spacing[1] * spacing[2]
    pred_cc = cc3d.connected_components(pred, connectivity=26)
    pred_boxes = ndi.find_objects(pred_cc)
    # Reference lesions: components of the dilated reference, restricted to the reference.
    ref_lesions = np.where(
        ref,
        cc3d.connected_components(
            ndi.binary_dilation(ref, structure=_DILATION, iterations=params.dilation), connectivity=26
        ),
        0,
    )
    matched_pred: set[int] = set()
    dices: list[float] = []
    hd95s: list[float] = []
    n_tp = n_fn = 0
    for index, box in enumerate(ndi.find_objects(ref_lesions), start=1):
        if box is None:
            continue
        near = _bbox(box, params.dilation + 1, ref.shape)
        lesion_near = ref_lesions[near] == index
        zone = ndi.binary_dilation(lesion_near, structure=_DILATION, iterations=params.dilation)
        touching = np.unique(pred_cc[near][zone])
        touching = touching[touching != 0]
        matched_pred.update(int(t) for t in touching)
        volume_mm3 = float(np.count_nonzero(lesion_near)) * voxel_mm3
        if volume_mm3 <= params.min_volume_mm3:
            continue
        if touching.size == 0:
            n_fn += 1
            dices.append(0.0)
            hd95s.append(LESION23_MISSED_HD95_MM)
            continue
        n_tp += 1
        crop = _bbox(box, 0, ref.shape)
        for t in touching:
            crop = _union_bbox(crop, pred_boxes[t - 1])
        crop = _bbox(crop, 1, ref.shape)
        lesion = ref_lesions[crop] == index
        predicted = np.isin(pred_cc[crop], touching)
        dices.append(
            2.0 * np.count_nonzero(lesion & predicted) / (np.count_nonzero(lesion) + np.count_nonzero(predicted))
        )
        hd95s.append(_hd95_mm(lesion, predicted, spacing))
    n_fp = sum(1 for i, box in enumerate(pred_boxes, start=1) if box is not None and i not in matched_pred)
    n = len(dices) + n_fp
    if n == 0:
        dice, hd95 = 1.0, 0.0
    else:
        dice = sum(dices) / n
        hd95 = (sum(hd95s) + n_fp * LESION23_MISSED_HD95_MM) / n
    return {"dice": dice, "hd95": hd95, "tp": n_tp, "fn": n_fn, "fp": n_fp}
