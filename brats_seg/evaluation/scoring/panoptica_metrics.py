"""BraTS 2025+ lesion-wise scoring (``lesion_*``, ``nsd_*``, ``lesions_*``, ``rq_*``, ``pq_*``), by panoptica.

This is what the official evaluation package of today computes, with the maintained
``panoptica`` library (Kofler et al., "Panoptica -- instance-wise evaluation of 3D semantic
and instance segmentation maps", 2023; cite it when you report these numbers). We configure
panoptica exactly as the official BraTS GLI configuration does, from our own label table:
semantic input, connected components (26-connectivity) per region, maximal bipartite
matching of lesions on Dice (threshold 1e-6), instance and global Dice/NSD/HD95, and the
official zero-true-positive rules (Dice and NSD 0, HD95 infinite when one side has lesions
and nothing matched; undefined, NaN, when neither side has any). Lesion-wise Dice, NSD and
HD95 average the *matched* lesions only; missed and false-positive lesions show in the
detection quality ``rq`` (F1 of lesion detection) and in ``pq = rq x lesion Dice``.

Label maps are ``(x, y, z)`` in RAS with a region table ``{region: label values}``
(:func:`brats_seg.data.labels.region_label_values`), so this holds for every layout. The
BraTS 2023/2024 definition is :mod:`brats_seg.evaluation.scoring.lesion23`.

**How the official evaluation reads a file, and why we read it the same way.** The official
package (``brats-evaluation``) hands panoptica the *file paths*; panoptica reads a NIfTI file
with SimpleITK, whose array is the file's voxels with the axes reversed, ``(k, j, i)``, and
whose spacing is in the file's axis order, ``(i, j, k)``; panoptica pairs the two as given.
So on a file whose first and last voxel sizes differ, the official lesion-wise HD95 and NSD
measure distances along the file's first axis (i) with the voxel size of its last (k), and
the reverse (checked with brats-evaluation 0.0.10 on panoptica 2.1.7; README "Metrics"). The BraTS releases are 1 mm
isotropic, where this changes nothing; elsewhere the leaderboard's numbers are the ones
computed this way, so :func:`compute_panoptica_metrics` hands panoptica the label maps
exactly as the official package does (:func:`to_official_input`): in the file's stored
voxel order, axes reversed, with the header's voxel sizes in file order. The global
metrics, the lesion counts and the lesion-wise Dice do not depend on it; the legacy HD95
and ``lesion23_*`` use the true voxel size of each axis, as their reference codes do.
"""

from __future__ import annotations

import contextlib
import functools
import io
import math
import warnings
from collections.abc import Mapping, Sequence

import numpy as np

from brats_seg.data.nifti import spacing_of, to_original_orientation
from brats_seg.evaluation.scoring.lesion_input import LesionwiseError, check_label_pair

__all__ = ["compute_panoptica_metrics", "make_panoptica_evaluator", "to_official_input"]

# Our column -> panoptica's result field.
_PANOPTICA_FIELDS = {
    "nsd": "global_bin_nsd",
    "lesion_dice": "sq_dsc",
    "lesion_hd95": "sq_hd95",
    "lesion_nsd": "sq_nsd",
    "lesions_ref": "n_ref_instances",
    "lesions_pred": "n_pred_instances",
    "lesions_tp": "tp",
    "rq": "rq",
    "pq": "pq_dsc",  # panoptica names the panoptic quality by its matching metric
}


def _region_table_key(table: Mapping[str, Sequence[int]]) -> tuple[tuple[str, tuple[int, ...]], ...]:
    return tuple((str(r), tuple(sorted(int(v) for v in vals))) for r, vals in table.items())


@functools.lru_cache(maxsize=8)
def _evaluator(key: tuple[tuple[str, tuple[int, ...]], ...]):
    from panoptica import (
        ConnectedComponentsInstanceApproximator,
        InputType,
        MaxBipartiteMatching,
        Metric,
        Panoptica_Evaluator,
        disable_citation_reminder,
    )
    from panoptica.utils.edge_case_handling import EdgeCaseHandler, EdgeCaseResult, MetricZeroTPEdgeCaseHandling
    from panoptica.utils.label_group import LabelGroup, LabelMergeGroup
    from panoptica.utils.segmentation_class import SegmentationClassGroups

    disable_citation_reminder()

    def zero_tp(missed):
        return MetricZeroTPEdgeCaseHandling(
            no_instances_result=EdgeCaseResult.NAN,
            empty_prediction_result=missed,
            empty_reference_result=missed,
            normal=missed,
        )

    # Groups as in the official config: one label a LabelGroup, several a LabelMergeGroup,
    # never single-instance; the values are our layout's (the official GLI config's for
    # brats2023/brats2024, whose labels are the same).
    groups = {
        region: (
            LabelGroup(list(values), single_instance=False)
            if len(values) == 1
            else LabelMergeGroup(list(values), single_instance=False)
        )
        for region, values in key
    }
    # panoptica prints (not logs) a note when one label is in two groups, as WT/TC/ET
    # nest by design; keep it off the user's terminal.
    with contextlib.redirect_stdout(io.StringIO()):
        class_groups = SegmentationClassGroups(groups)
    # Field by field the official BraTS GLI configuration (brats-evaluation 0.0.10,
    # brats_evaluation/configs/config_gli.yaml; scripts/check_official_metrics.py compares
    # every field with the file); fields the file leaves out keep panoptica's defaults
    # here too (per_region_evaluation, log_intermediate_steps, speed_toggles).
    return Panoptica_Evaluator(
        expected_input=InputType.SEMANTIC,
        instance_approximator=ConnectedComponentsInstanceApproximator(cca_backend=None),
        instance_matcher=MaxBipartiteMatching(matching_metric=Metric.DSC, matching_threshold=1e-6),
        edge_case_handler=EdgeCaseHandler(
            listmetric_zeroTP_handling={
                Metric.DSC: zero_tp(EdgeCaseResult.ZERO),
                Metric.NSD: zero_tp(EdgeCaseResult.ZERO),
                Metric.HD95: zero_tp(EdgeCaseResult.INF),
            },
            empty_list_std=EdgeCaseResult.NAN,
        ),
        segmentation_class_groups=class_groups,
        instance_metrics=[Metric.DSC, Metric.NSD, Metric.HD95],
        global_metrics=[Metric.DSC, Metric.NSD, Metric.HD95],
        decision_metric=None,
        decision_threshold=None,
        save_group_times=False,
        log_times=False,
        verbose=False,
    )


def make_panoptica_evaluator(table: Mapping[str, Sequence[int]]):
    """The panoptica evaluator of the official BraTS configuration for our regions.

    Args:
        table: ``{region: label values}``; a region of one label is a panoptica
            ``LabelGroup``, one of several a ``LabelMergeGroup`` (as in the official config).
    """
    return _evaluator(_region_table_key(table))


def to_official_input(
    labels: np.ndarray,
    spacing_mm: Sequence[float],
    stored_affine: np.ndarray | None = None,
    stored_zooms_mm: Sequence[float] | None = None,
) -> tuple[np.ndarray, tuple[float, float, float]]:
    """A label map as the official evaluation hands it to panoptica, with the spacing it pairs.

    brats-evaluation passes the file paths to panoptica, which reads a NIfTI file with
    SimpleITK: ``GetArrayFromImage`` gives the stored voxels with the axes reversed,
    ``(k, j, i)``, and ``GetSpacing`` the header's voxel sizes in file order, ``(i, j, k)``;
    panoptica uses that spacing for the array's axes as they come (module docstring).

    Args:
        labels: label map ``(x, y, z)`` in RAS, on the file's grid.
        spacing_mm: its voxel size ``(x, y, z)`` in mm; used only when ``stored_affine`` is
            not given.
        stored_affine: the file's affine as stored; default: the file stores ``labels`` as
            they are (RAS order) with voxel size ``spacing_mm``.
        stored_zooms_mm: the header's voxel sizes along the stored axes ``(i, j, k)``, as
            SimpleITK reads them (``pixdim``, float32); default: the column lengths of
            ``stored_affine``.

    Returns:
        ``(array (k, j, i) C-contiguous, spacing (i, j, k) in mm)``.
    """
    labels = np.asarray(labels)
    if stored_affine is None:
        stored, zooms = labels, spacing_mm
    else:
        stored = to_original_orientation(labels, stored_affine)
        zooms = stored_zooms_mm if stored_zooms_mm is not None else spacing_of(stored_affine)
    return np.ascontiguousarray(stored.transpose(2, 1, 0)), tuple(abs(float(z)) for z in np.ravel(zooms))


def compute_panoptica_metrics(
    pred_labels: np.ndarray,
    ref_labels: np.ndarray,
    spacing_mm: Sequence[float],
    table: Mapping[str, Sequence[int]],
    stored_affine: np.ndarray | None = None,
    stored_zooms_mm: Sequence[float] | None = None,
) -> dict[str, float]:
    """The BraTS 2025+ lesion-wise, NSD and detection metrics of one case, by panoptica,
    computed as the official evaluation computes them on the reference file.

    Args:
        pred_labels, ref_labels: label maps ``(x, y, z)`` in RAS, of one grid.
        spacing_mm: voxel size ``(x, y, z)`` of these arrays, in mm.
        table: ``{region: label values}``.
        stored_affine, stored_zooms_mm: how the reference file stores the grid (its affine
            and header voxel sizes, see :func:`to_official_input`); default: stored as given.

    Returns:
        ``{"<metric>_<region>": value}`` for the metrics ``nsd lesion_dice lesion_hd95
        lesion_nsd lesions_ref lesions_pred lesions_tp rq pq``; HD95 in mm, ``inf`` where
        panoptica gives it (nothing matched), NaN where undefined (no lesion either side).
        ``nsd`` is panoptica's global NSD as the official evaluation reports it: panoptica
        computes its global metrics on the voxel grid (tolerance 0.5 voxel), whatever
        the spacing; the lesion-wise HD95 and NSD use the spacing as the official
        evaluation pairs it with the array's axes (:func:`to_official_input`; NSD
        tolerance: the smallest voxel size).

    Raises:
        LesionwiseError: bad input, or panoptica failed (with its message).
    """
    pred, ref, spacing = check_label_pair(pred_labels, ref_labels, spacing_mm)
    ref, _ = to_official_input(ref, spacing, stored_affine, stored_zooms_mm)
    pred, spacing = to_official_input(pred, spacing, stored_affine, stored_zooms_mm)  # (k, j, i), (i, j, k)
    if len(spacing) != 3 or not all(math.isfinite(s) and s > 0 for s in spacing):
        raise LesionwiseError(
            f"the reference file's header voxel sizes should be 3 positive sizes in mm, got {stored_zooms_mm!r}: "
            "fix the pixdim of the reference label file"
        )
    evaluator = make_panoptica_evaluator(table)
    try:
        with warnings.catch_warnings():
            # panoptica warns on every global NSD that its 0.5 tolerance is its default.
            warnings.filterwarnings("ignore", message="The threshold is set to 0.5")
            warnings.filterwarnings("ignore", category=RuntimeWarning)
            results = evaluator.evaluate(pred, ref, voxelspacing=spacing, verbose=False, log_times=False)
    except Exception as e:
        raise LesionwiseError(f"panoptica failed: {type(e).__name__}: {e}") from e
    out: dict[str, float] = {}
    for region in table:
        result = results[region]
        for column, attr in _PANOPTICA_FIELDS.items():
            out[f"{column}_{region}"] = _panoptica_value(result, attr)
    return out


def _panoptica_value(result, attr: str) -> float:
    try:
        value = getattr(result, attr)
    except Exception:  # noqa: BLE001 - panoptica raises when a metric is undefined
        return math.nan
    if value is None:
        return math.nan
    return float(value)
