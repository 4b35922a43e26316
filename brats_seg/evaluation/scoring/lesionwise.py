"""Lesion-wise scoring: the two definitions BraTS has ranked by since 2023, both at once.

:func:`compute_lesionwise_metrics` scores a case by both, for every region of a table
``{region: label values}`` (:func:`brats_seg.data.labels.region_label_values`), so it holds
for every layout. Each definition is a module of its own::

    panoptica_metrics  BraTS 2025+ (``lesion_*``, ``nsd_*``, ``lesions_*``, ``rq_*``, ``pq_*``): what the
                       official evaluation package of today computes, with the panoptica library,
                       configured as the official BraTS GLI configuration; lesion-wise Dice, NSD and
                       HD95 average the matched lesions, misses show in ``rq`` and ``pq``
    lesion23           BraTS 2023/2024 (``lesion23_*``): what the 2023 and 2024 leaderboards ranked by,
                       written here after the 2023 reference code; missed and false-positive
                       lesions score Dice 0 / HD95 374 mm in the same average
    lesion_input       the label-map pair both accept, and
                       :class:`~brats_seg.evaluation.scoring.lesion_input.LesionwiseError`, which both raise

Label maps are ``(x, y, z)`` in RAS, prediction and reference on one grid.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import numpy as np

from brats_seg.evaluation.scoring.lesion23 import LESION23_PARAMS, Lesion23Params, compute_lesion23_metrics
from brats_seg.evaluation.scoring.panoptica_metrics import compute_panoptica_metrics

__all__ = ["compute_lesionwise_metrics"]

log = logging.getLogger(__name__)


def compute_lesionwise_metrics(
    pred_labels: np.ndarray,
    ref_labels: np.ndarray,
    spacing_mm: Sequence[float],
    table: Mapping[str, Sequence[int]],
    lesion23: Lesion23Params = LESION23_PARAMS["GLI"],
    stored_affine: np.ndarray | None = None,
    stored_zooms_mm: Sequence[float] | None = None,
) -> dict[str, float]:
    """Both lesion-wise definitions for every region of ``table``.

    Args:
        pred_labels, ref_labels: label maps ``(x, y, z)`` in RAS, of one grid.
        spacing_mm: their voxel size ``(x, y, z)`` in mm.
        table: ``{region: label values}``.
        lesion23: the 2023 parameters.
        stored_affine, stored_zooms_mm: how the reference file stores the grid, for the
            panoptica metrics (:func:`compute_panoptica_metrics`).

    Returns:
        :func:`compute_panoptica_metrics`' columns plus ``lesion23_dice_<r>`` and
        ``lesion23_hd95_<r>``.

    Raises:
        LesionwiseError: bad input, or panoptica failed.
    """
    values = compute_panoptica_metrics(
        pred_labels,
        ref_labels,
        spacing_mm,
        table,  # checks the input
        stored_affine,
        stored_zooms_mm,
    )
    pred, ref = np.asarray(pred_labels), np.asarray(ref_labels)
    for region, labels in table.items():
        scores = compute_lesion23_metrics(np.isin(pred, list(labels)), np.isin(ref, list(labels)), spacing_mm, lesion23)
        values[f"lesion23_dice_{region}"] = scores["dice"]
        values[f"lesion23_hd95_{region}"] = scores["hd95"]
    return values
