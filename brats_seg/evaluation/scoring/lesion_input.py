"""What both lesion-wise definitions accept, checked once, and the error they raise.

:mod:`brats_seg.evaluation.scoring.panoptica_metrics` (BraTS 2025+) and
:mod:`brats_seg.evaluation.scoring.lesion23` (BraTS 2023/2024) take the same input: a predicted
and a reference label map ``(x, y, z)`` in RAS, of one grid, with its voxel size in mm.
Both check it here, so a bad pair is refused with the same :class:`LesionwiseError`
whichever definition meets it first, and a caller (:func:`brats_seg.evaluation.scoring.score.score_case`)
catches one error type for both.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["LesionwiseError", "check_label_pair"]


class LesionwiseError(ValueError):
    """Lesion-wise scoring could not be done (the message says why)."""


def check_label_pair(
    pred_labels: np.ndarray, ref_labels: np.ndarray, spacing_mm: Sequence[float]
) -> tuple[np.ndarray, np.ndarray, tuple[float, ...]]:
    """A prediction and a reference as lesion-wise scoring takes them.

    Args:
        pred_labels, ref_labels: label maps ``(x, y, z)`` of one shape, integer or bool,
            labels 0-255.
        spacing_mm: voxel size ``(x, y, z)`` in mm.

    Returns:
        ``(pred uint8, ref uint8, spacing)``, the spacing as 3 floats.

    Raises:
        LesionwiseError: not 3D maps of one shape, not integer, labels outside 0-255, or
            not 3 positive finite voxel sizes.
    """
    pred, ref = np.asarray(pred_labels), np.asarray(ref_labels)
    if pred.shape != ref.shape or pred.ndim != 3:
        raise LesionwiseError(
            f"the prediction {pred.shape} and the reference {ref.shape} should be 3D label maps of one shape"
        )
    for name, arr in (("prediction", pred), ("reference", ref)):
        if not (np.issubdtype(arr.dtype, np.integer) or arr.dtype == bool):
            raise LesionwiseError(f"the {name} should be an integer label map, got dtype {arr.dtype}")
        if arr.size and (arr.min() < 0 or arr.max() > 255):
            raise LesionwiseError(f"the {name} has labels outside 0-255 ({arr.min()}..{arr.max()})")
    spacing = tuple(float(s) for s in np.ravel(spacing_mm))
    if len(spacing) != 3 or not all(math.isfinite(s) and s > 0 for s in spacing):
        raise LesionwiseError(f"the voxel spacing should be 3 positive sizes in mm, got {spacing_mm!r}")
    return pred.astype(np.uint8), ref.astype(np.uint8), spacing
