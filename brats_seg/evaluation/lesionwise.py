"""Lesion-wise scoring: the two definitions BraTS has ranked by since 2023.

**BraTS 2025+ (``lesion_*``, ``nsd_*``, ``lesions_*``, ``rq_*``, ``pq_*``)** is what the
official evaluation package of today computes, with the maintained ``panoptica`` library
(Kofler et al., "Panoptica -- instance-wise evaluation of 3D semantic and instance
segmentation maps", 2023; cite it when you report these numbers). We configure panoptica
exactly as the official BraTS GLI configuration does, from our own label table:
semantic input, connected components (26-connectivity) per region, maximal bipartite
matching of lesions on Dice (threshold 1e-6), instance and global Dice/NSD/HD95, and the
official zero-true-positive rules (Dice and NSD 0, HD95 infinite when one side has
lesions and nothing matched; undefined, NaN, when neither side has any). Lesion-wise Dice,
NSD and HD95 average the *matched* lesions only; missed and false-positive lesions show in
the detection quality ``rq`` (F1 of lesion detection) and in ``pq = rq x lesion Dice``.

**BraTS 2023/2024 (``lesion23_*``)** is the definition the 2023 and 2024 leaderboards ranked
by (Saluja et al., the BraTS 2023 lesion-wise metrics): reference lesions are connected
components (26-connectivity) merged when their dilation (18-connected structuring element,
``dilation`` iterations) joins them; each reference lesion is scored against the union of
the predicted components that touch its dilation (Dice, and DeepMind's HD95 in mm);
reference lesions of ``min_volume_mm3`` or less are dropped from the average; every missed
lesion scores Dice 0 / HD95 374 mm and every predicted component touching no reference
lesion is a false positive with Dice 0 / HD95 374 mm, in the same average. With nothing to
average (no lesion on either side) the 2023 code returns Dice 1 and HD95 0, and so do we.
There is no maintained library for this one, so it is written here, following the
published description and checked against the 2023 reference code (README "Metrics").

Both functions take label maps ``(x, y, z)`` and a region table ``{region: label values}``
(:func:`brats_seg.data.labels.region_label_values`), so they hold for every layout.

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
import logging
import math
import re
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import cc3d
import numpy as np
import scipy.ndimage as ndi
import surface_distance

from brats_seg.data.nifti import spacing_of, to_original_orientation

__all__ = [
    "LESION23_MISSED_HD95_MM",
    "LESION23_PARAMS",
    "Lesion23Params",
    "LesionwiseError",
    "compute_lesion23_metrics",
    "compute_lesionwise_metrics",
    "compute_panoptica_metrics",
    "lesion23_params_for",
    "make_panoptica_evaluator",
    "to_official_input",
]

log = logging.getLogger(__name__)

# mm; the 2023 code's penalty for a missed or false-positive lesion.
LESION23_MISSED_HD95_MM = 374.0


class LesionwiseError(ValueError):
    """Lesion-wise scoring could not be done (the message says why)."""


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


# ---------------------------------------------------------------------------------------
# BraTS 2025+: panoptica
# ---------------------------------------------------------------------------------------

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
    from panoptica import ConnectedComponentsInstanceApproximator, InputType, MaxBipartiteMatching, Metric
    from panoptica import Panoptica_Evaluator, disable_citation_reminder
    from panoptica.utils.edge_case_handling import EdgeCaseHandler, EdgeCaseResult, MetricZeroTPEdgeCaseHandling
    from panoptica.utils.label_group import LabelGroup, LabelMergeGroup
    from panoptica.utils.segmentation_class import SegmentationClassGroups

    disable_citation_reminder()

    def zero_tp(missed):
        return MetricZeroTPEdgeCaseHandling(
            no_instances_result=EdgeCaseResult.NAN, empty_prediction_result=missed,
            empty_reference_result=missed, normal=missed)

    # Groups as in the official config: one label a LabelGroup, several a LabelMergeGroup,
    # never single-instance; the values are our layout's (the official GLI config's for
    # brats2023/brats2024, whose labels are the same).
    groups = {region: (LabelGroup(list(values), single_instance=False) if len(values) == 1
                       else LabelMergeGroup(list(values), single_instance=False))
              for region, values in key}
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


def _check_pair(pred_labels: np.ndarray, ref_labels: np.ndarray, spacing_mm: Sequence[float]):
    pred, ref = np.asarray(pred_labels), np.asarray(ref_labels)
    if pred.shape != ref.shape or pred.ndim != 3:
        raise LesionwiseError(
            f"the prediction {pred.shape} and the reference {ref.shape} should be 3D label maps of one shape")
    for name, arr in (("prediction", pred), ("reference", ref)):
        if not (np.issubdtype(arr.dtype, np.integer) or arr.dtype == bool):
            raise LesionwiseError(f"the {name} should be an integer label map, got dtype {arr.dtype}")
        if arr.size and (arr.min() < 0 or arr.max() > 255):
            raise LesionwiseError(f"the {name} has labels outside 0-255 ({arr.min()}..{arr.max()})")
    spacing = tuple(float(s) for s in np.ravel(spacing_mm))
    if len(spacing) != 3 or not all(math.isfinite(s) and s > 0 for s in spacing):
        raise LesionwiseError(f"the voxel spacing should be 3 positive sizes in mm, got {spacing_mm!r}")
    return pred.astype(np.uint8), ref.astype(np.uint8), spacing


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
    pred, ref, spacing = _check_pair(pred_labels, ref_labels, spacing_mm)
    ref, _ = to_official_input(ref, spacing, stored_affine, stored_zooms_mm)
    pred, spacing = to_official_input(pred, spacing, stored_affine, stored_zooms_mm)  # (k, j, i), (i, j, k)
    if len(spacing) != 3 or not all(math.isfinite(s) and s > 0 for s in spacing):
        raise LesionwiseError(
            f"the reference file's header voxel sizes should be 3 positive sizes in mm, got {stored_zooms_mm!r}: "
            "fix the pixdim of the reference label file")
    evaluator = make_panoptica_evaluator(table)
    try:
        with warnings.catch_warnings():
            # panoptica warns on every global NSD that its 0.5 tolerance is its default.
            warnings.filterwarnings("ignore", message="The threshold is set to 0.5")
            warnings.filterwarnings("ignore", category=RuntimeWarning)
            results = evaluator.evaluate(pred, ref, voxelspacing=spacing, verbose=False, log_times=False)
    except Exception as e:  # noqa: BLE001 - any panoptica failure is reported per case
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


# ---------------------------------------------------------------------------------------
# BraTS 2023/2024
# ---------------------------------------------------------------------------------------

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
    pred, ref, spacing = _check_pair(np.asarray(pred_mask) != 0, np.asarray(ref_mask) != 0, spacing_mm)
    pred, ref = pred != 0, ref != 0
    voxel_mm3 = spacing[0] * spacing[1] * spacing[2]
    pred_cc = cc3d.connected_components(pred, connectivity=26)
    pred_boxes = ndi.find_objects(pred_cc)
    # Reference lesions: components of the dilated reference, restricted to the reference.
    ref_lesions = np.where(ref, cc3d.connected_components(
        ndi.binary_dilation(ref, structure=_DILATION, iterations=params.dilation), connectivity=26), 0)
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
        dices.append(2.0 * np.count_nonzero(lesion & predicted) / (np.count_nonzero(lesion) + np.count_nonzero(predicted)))
        hd95s.append(_hd95_mm(lesion, predicted, spacing))
    n_fp = sum(1 for i, box in enumerate(pred_boxes, start=1) if box is not None and i not in matched_pred)
    n = len(dices) + n_fp
    if n == 0:
        dice, hd95 = 1.0, 0.0
    else:
        dice = sum(dices) / n
        hd95 = (sum(hd95s) + n_fp * LESION23_MISSED_HD95_MM) / n
    return {"dice": dice, "hd95": hd95, "tp": n_tp, "fn": n_fn, "fp": n_fp}


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
    values = compute_panoptica_metrics(pred_labels, ref_labels, spacing_mm, table,  # checks the input
                                       stored_affine, stored_zooms_mm)
    pred, ref = np.asarray(pred_labels), np.asarray(ref_labels)
    for region, labels in table.items():
        scores = compute_lesion23_metrics(np.isin(pred, list(labels)), np.isin(ref, list(labels)), spacing_mm, lesion23)
        values[f"lesion23_dice_{region}"] = scores["dice"]
        values[f"lesion23_hd95_{region}"] = scores["hd95"]
    return values
