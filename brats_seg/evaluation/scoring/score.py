"""Scoring label maps: every metric of a case from the label map that is written, and
``scripts/score.py`` for folders of existing masks.

:func:`score_case` is the one function both ``scripts/evaluate.py`` (on the label map it
saves) and ``scripts/score.py`` (on the label map it reads back) call, so scoring the
written masks reproduces ``metrics.csv`` exactly. Label maps are ``(x, y, z)`` in RAS in
the layout's own values, on the reference file's grid; no model and no TensorFlow here.

A reference case without a prediction file counts as an **empty prediction** (Dice 0 /
HD95 373.13 mm where the reference is not empty), as the BraTS challenge scores a missing
submission, and is listed in a warning.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from brats_seg.data.errors import CaseError, DatasetError
from brats_seg.data.labels import check_label_map, labels_to_regions, region_label_values, region_names
from brats_seg.data.layouts import discover_cases
from brats_seg.data.nifti import NIFTI_SUFFIXES, Volume, find_nifti, load_volume, nifti_stem
from brats_seg.evaluation.scoring.lesion23 import lesion23_params_for
from brats_seg.evaluation.scoring.lesion_input import LesionwiseError
from brats_seg.evaluation.scoring.lesionwise import compute_lesionwise_metrics
from brats_seg.evaluation.scoring.metrics import HD95_EMPTY_MM, compute_case_metrics
from brats_seg.evaluation.scoring.table import METRIC_NAMES, MetricsTable
from brats_seg.files import is_temporary

__all__ = ["ScoreResult", "load_reference", "score_case", "score_masks"]

log = logging.getLogger(__name__)


def score_case(
    case_id: str,
    pred_labels: np.ndarray,
    ref_labels: np.ndarray,
    spacing_mm: Sequence[float],
    layout: str,
    regions: Sequence[str] | None = None,
    reference: Volume | None = None,
) -> dict[str, float]:
    """Every metric of one case, for every region of the layout.

    Args:
        case_id: the case (its BraTS sub-challenge prefix picks the 2023 lesion-wise
            parameters; named in errors).
        pred_labels: the predicted label map ``(x, y, z)``, as written.
        ref_labels: the reference label map, same grid.
        spacing_mm: the reference file's voxel size ``(x, y, z)`` in mm.
        layout: the layout of both label maps.
        regions: the regions that were predicted (e.g. ``("wt",)`` for a WT-only model);
            the layout's other regions get NaN (undefined). Default: all of them.
        reference: the reference file as :func:`load_reference` read it. The official
            evaluation's lesion-wise HD95 and NSD depend on how the file stores its voxels
            (:func:`brats_seg.evaluation.scoring.panoptica_metrics.to_official_input`), so pass it whenever
            there is a file; without it the label maps count as stored as they are (RAS
            order, voxel size ``spacing_mm``).

    Returns:
        ``{"<metric>_<region>": value}`` for every column of the layout's metrics table.

    Raises:
        CaseError: the lesion-wise scoring failed (naming the case).
    """
    all_regions = region_names(layout)
    regions = tuple(regions) if regions is not None else all_regions
    pred = np.asarray(pred_labels).astype(np.uint8)
    ref = np.asarray(ref_labels).astype(np.uint8)
    values = compute_case_metrics(
        labels_to_regions(pred, layout, regions),
        labels_to_regions(ref, layout, regions),
        spacing_mm,
        region_names=regions,
    )
    table = region_label_values(layout, regions)
    scored = sorted({v for labels in table.values() for v in labels})
    stored = (
        {}
        if reference is None
        else {
            "stored_affine": reference.original_affine,
            "stored_zooms_mm": reference.original_header.get_zooms()[:3],  # pixdim, as SimpleITK reads it
        }
    )
    try:  # labels of regions not scored (a WT-only model and RC) are background here
        values.update(
            compute_lesionwise_metrics(
                np.where(np.isin(pred, scored), pred, 0),
                np.where(np.isin(ref, scored), ref, 0),
                spacing_mm,
                table,
                lesion23=lesion23_params_for(case_id),
                **stored,
            )
        )
    except LesionwiseError as e:
        raise CaseError(
            case_id,
            None,
            f"lesion-wise scoring failed: {e}",
            "Check that the mask and the reference are label maps of the same grid.",
        ) from None
    return {f"{m}_{r}": values.get(f"{m}_{r}", math.nan) for m in METRIC_NAMES for r in all_regions}


def load_reference(case_id: str, path: str | Path, layout: str) -> tuple[Volume, np.ndarray]:
    """The label file (RAS) and its checked label map ``(x, y, z)`` int16."""
    vol = load_volume(path, case_id)
    return vol, check_label_map(case_id, path, vol.data, layout, f"Is this really data={layout}?")


def _load_prediction(case_id: str, path: Path, ref: Volume, layout: str) -> np.ndarray:
    """A mask's label map ``(x, y, z)`` on the reference grid, labels checked."""
    vol = load_volume(path, case_id)
    if vol.data.shape != ref.data.shape or not np.allclose(vol.affine_ras, ref.affine_ras, atol=1e-3):
        raise CaseError(
            case_id,
            path,
            f"grid (RAS shape {vol.data.shape}, affine {np.round(vol.affine_ras, 3).tolist()}) differs from that of "
            f"the reference {ref.path} (RAS shape {ref.data.shape}, affine {np.round(ref.affine_ras, 3).tolist()})",
            "A mask must be on its reference label file's grid: write it with scripts/predict.py, or resample it first.",
        )
    return check_label_map(
        case_id,
        path,
        vol.data,
        layout,
        "Write masks in the layout's own labels, or pass the data= the masks were written for.",
    )


@dataclass
class ScoreResult:
    """What :func:`score_masks` did.

    Attributes:
        summary: as in summary.json.
        regions: the regions scored (the table's rows).
        csv_path, summary_path: files written.
        missing: reference cases without a prediction file (scored as empty masks).
        unmatched: prediction files without a reference case (ignored).
    """

    summary: dict
    regions: tuple[str, ...]
    csv_path: Path
    summary_path: Path
    missing: list[str] = field(default_factory=list)
    unmatched: list[str] = field(default_factory=list)


def score_masks(
    pred_dir: str | Path,
    ref_dir: str | Path,
    layout: str,
    out: str | Path | None = None,
    on_error: str = "raise",
    progress: bool = True,
) -> ScoreResult:
    """Score ``<pred_dir>/<case_id>.nii.gz`` masks against a labelled dataset.

    Args:
        pred_dir: folder of masks in the layout's own labels, on the references' grids.
        ref_dir: dataset root holding the reference label files.
        layout: the layout of the references and of the masks' labels.
        out: CSV path; default ``<pred_dir>/metrics.csv``. summary.json goes beside it.
        on_error: ``raise`` | ``skip``: what a bad reference case does to discovery.
        progress: show a tqdm bar.

    Returns:
        A :class:`ScoreResult`.

    Raises:
        DatasetError: ``pred_dir`` or ``ref_dir`` unusable.
        CaseError: a mask on another grid or with labels outside the layout's set
            (naming both files), or a case the lesion-wise scoring failed on.
    """
    from tqdm.auto import tqdm

    if not str(pred_dir).strip():
        raise DatasetError("pred_dir is not set: pass pred_dir=<folder of <case_id>.nii.gz masks>.")
    pred_dir = Path(pred_dir).expanduser()
    if not pred_dir.is_dir():
        raise DatasetError(f"pred_dir {pred_dir} is not a folder: pass pred_dir=<folder of <case_id>.nii.gz masks>.")
    cases, _ = discover_cases(ref_dir, layout, require_labels=True, on_error=on_error)
    regions = region_names(layout)
    table = MetricsTable(regions)
    missing = []
    for case in tqdm(cases, desc="scoring", unit="case", disable=not progress):
        ref_vol, ref = load_reference(case.case_id, case.label, layout)
        path = find_nifti(pred_dir, case.case_id)
        if path is None:
            missing.append(case.case_id)
            pred = np.zeros_like(ref)  # BraTS: a missing prediction is an empty mask
        else:
            pred = _load_prediction(case.case_id, path, ref_vol, layout)
        table.add(case.case_id, score_case(case.case_id, pred, ref, ref_vol.spacing_mm, layout, reference=ref_vol))
    masks = {
        nifti_stem(p)
        for p in pred_dir.iterdir()
        if p.is_file() and p.name.endswith(NIFTI_SUFFIXES) and not is_temporary(p)
    }  # not a killed writer's
    unmatched = sorted(masks - {c.case_id for c in cases})
    if missing:
        log.warning(
            "%d of %d reference cases have no prediction in %s and count as empty masks "
            "(Dice 0, HD95 %.2f mm where the reference is not empty): %s",
            len(missing),
            len(cases),
            pred_dir,
            HD95_EMPTY_MM,
            ", ".join(missing),
        )
    if unmatched:
        log.warning(
            "%d mask(s) in %s have no reference case and are ignored: %s",
            len(unmatched),
            pred_dir,
            ", ".join(unmatched),
        )
    csv_path = Path(out).expanduser() if out else pred_dir / "metrics.csv"
    table.save_csv(csv_path)
    summary_path = table.save_summary_json(csv_path.with_name("summary.json"))
    return ScoreResult(table.summary(), regions, csv_path, summary_path, missing, unmatched)
