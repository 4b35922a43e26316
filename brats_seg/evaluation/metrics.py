"""BraTS segmentation metrics: Dice, HD95, sensitivity, specificity.

Three layers, as in MONAI:

* pure per-mask functions (:func:`compute_dice`, :func:`compute_hd95_mm`,
  :func:`compute_sensitivity`, :func:`compute_specificity`) on one binary mask pair;
* a per-case function (:func:`compute_case_metrics`) over the nested regions
  ``(x, y, z, R)``, channels-last, in RAS (WT, TC, ET by default);
* an accumulator (:class:`MetricsTable`) that collects cases and writes the
  ``metrics.csv`` and ``summary.json`` of the command-line contract.

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

import csv
import io
import json
import logging
import math
import os
import tempfile
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import surface_distance

from brats_seg.data.labels import REGION_NAMES

__all__ = [
    "HD95_EMPTY_MM",
    "METRIC_NAMES",
    "METRIC_COLUMNS",
    "compute_dice",
    "compute_hd95_mm",
    "compute_sensitivity",
    "compute_specificity",
    "compute_case_metrics",
    "MetricsTable",
]

logger = logging.getLogger(__name__)

# mm; the diagonal of the 240 x 240 x 155 mm BraTS image, the HD95 given when exactly
# one of the two masks is empty (DESIGN.md).
HD95_EMPTY_MM = 373.13

# Metric prefixes, in the column order of the contract.
METRIC_NAMES = ("dice", "hd95", "sens", "spec")

# Columns of <run_dir>/eval/<split>/metrics.csv, in order (DESIGN.md "Files").
METRIC_COLUMNS = ("case_id",) + tuple(f"{m}_{r}" for m in METRIC_NAMES for r in REGION_NAMES)

_SUMMARY_STATS = ("mean", "median", "std")


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
        raise ValueError(
            f"spacing_mm should have 3 values (x, y, z) in mm, got {len(spacing)}: {spacing_mm!r}."
        )
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
    region_names: Sequence[str] = REGION_NAMES,
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
        ordered as :data:`METRIC_COLUMNS` (dice for all regions, then hd95, ...).

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

    per_metric: dict[str, dict[str, float]] = {m: {} for m in METRIC_NAMES}
    for i, region in enumerate(region_names):
        pred = _as_mask(f"pred_regions[..., {i}] ({region})", pred_regions[..., i])
        ref = _as_mask(f"ref_regions[..., {i}] ({region})", ref_regions[..., i])
        per_metric["dice"][region] = compute_dice(pred, ref)
        per_metric["hd95"][region] = compute_hd95_mm(pred, ref, spacing)
        per_metric["sens"][region] = compute_sensitivity(pred, ref)
        per_metric["spec"][region] = compute_specificity(pred, ref)
    return {
        f"{metric}_{region}": float(value)
        for metric in METRIC_NAMES
        for region, value in per_metric[metric].items()
    }


# ---------------------------------------------------------------------------------------
# Accumulator
# ---------------------------------------------------------------------------------------


def _write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to ``path`` via a temporary file in the same folder and os.replace."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", newline="", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _json_number(value: float) -> float | None:
    """NaN/inf are not JSON; write them as null."""
    return value if math.isfinite(value) else None


class MetricsTable:
    """Per-case metrics of one evaluation split, written as ``metrics.csv``/``summary.json``.

    Columns are :data:`METRIC_COLUMNS` restricted to the regions present: fixed by
    ``region_names`` if given, else by the first case added. Every case must then
    carry exactly those metric keys.

    Example::

        table = MetricsTable()
        table.add("BraTS2021_00000", compute_case_metrics(pred, ref, spacing_mm))
        table.save_csv(run_dir / "eval/test/metrics.csv")
        table.save_summary_json(run_dir / "eval/test/summary.json")

    Args:
        region_names: regions whose columns the table holds, e.g. ``("wt",)``;
            ``None`` to take them from the first case.
    """

    def __init__(self, region_names: Sequence[str] | None = None) -> None:
        self._metric_columns: tuple[str, ...] | None = None
        if region_names is not None:
            self._metric_columns = self._columns_for_keys(
                {f"{m}_{r}" for m in METRIC_NAMES for r in region_names}, "region_names"
            )
        self._rows: dict[str, dict[str, float]] = {}

    @staticmethod
    def _columns_for_keys(keys: set[str], source: str) -> tuple[str, ...]:
        unknown = sorted(keys - set(METRIC_COLUMNS[1:]))
        if unknown:
            raise ValueError(
                f"{source}: unknown metric keys {unknown}; "
                f"expected keys among {METRIC_COLUMNS[1:]}."
            )
        return tuple(c for c in METRIC_COLUMNS[1:] if c in keys)

    @property
    def columns(self) -> tuple[str, ...]:
        """CSV columns: ``case_id`` then the metric columns present, in contract order."""
        return ("case_id",) + (self._metric_columns or ())

    @property
    def case_ids(self) -> tuple[str, ...]:
        """Case ids in the order they were added."""
        return tuple(self._rows)

    def __len__(self) -> int:
        return len(self._rows)

    def __contains__(self, case_id: object) -> bool:
        return case_id in self._rows

    def add(self, case_id: str, metrics: Mapping[str, float]) -> None:
        """Add one case.

        Args:
            case_id: unique case identifier (e.g. ``BraTS2021_00000``).
            metrics: output of :func:`compute_case_metrics` (extra ``case_id`` key ignored).

        Raises:
            ValueError: empty or duplicate ``case_id``, unknown metric keys, or keys
                different from the table's columns.
        """
        if not isinstance(case_id, str) or not case_id:
            raise ValueError(f"case_id should be a non-empty string, got {case_id!r}.")
        if case_id in self._rows:
            raise ValueError(f"case {case_id!r} is already in the table; case ids must be unique.")
        values = {k: v for k, v in metrics.items() if k != "case_id"}
        columns = self._columns_for_keys(set(values), f"case {case_id!r}")
        if self._metric_columns is None:
            self._metric_columns = columns
        elif columns != self._metric_columns:
            missing = sorted(set(self._metric_columns) - set(columns))
            extra = sorted(set(columns) - set(self._metric_columns))
            raise ValueError(
                f"case {case_id!r} has different metrics from the table: missing {missing}, "
                f"extra {extra}. Evaluate every case with the same region_names."
            )
        self._rows[case_id] = {c: float(values[c]) for c in columns}

    def values(self, column: str) -> np.ndarray:
        """All cases' values of one metric column, float64 ``(n_cases,)``."""
        if column not in (self._metric_columns or ()):
            raise KeyError(f"no column {column!r} in the table; columns are {self.columns}.")
        return np.array([row[column] for row in self._rows.values()], dtype=np.float64)

    def summary(self) -> dict:
        """Mean, median and standard deviation (population, ``ddof=0``) per metric column.

        NaN values (none come from :func:`compute_case_metrics`) are left out of
        their column's statistics; ``n`` counts the values used.

        Returns:
            ``{"n_cases": int, "<column>": {"mean", "median", "std": float, "n": int}, ...}``;
            statistics of a column with no values are NaN.
        """
        out: dict = {"n_cases": len(self._rows)}
        for column in self._metric_columns or ():
            v = self.values(column)
            v = v[~np.isnan(v)]
            if v.size == 0:
                stats = dict.fromkeys(_SUMMARY_STATS, math.nan)
            else:
                stats = {
                    "mean": float(np.mean(v)),
                    "median": float(np.median(v)),
                    "std": float(np.std(v)),
                }
            out[column] = {**stats, "n": int(v.size)}
        return out

    def save_csv(self, path: str | os.PathLike) -> Path:
        """Write ``metrics.csv`` (one row per case, :attr:`columns`), atomically.

        Floats are written at full precision (``repr``); parent folders are created.

        Returns:
            The path written.
        """
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(self.columns)
        for case_id, row in self._rows.items():
            writer.writerow([case_id] + [repr(row[c]) for c in self._metric_columns or ()])
        text = buf.getvalue()
        path = _write_text_atomic(path, text)
        logger.info("Wrote metrics of %d cases to %s", len(self._rows), path)
        return path

    def save_summary_json(self, path: str | os.PathLike) -> Path:
        """Write :meth:`summary` as JSON (NaN as ``null``), atomically.

        Returns:
            The path written.
        """
        summary = self.summary()
        for column in self._metric_columns or ():
            for stat in _SUMMARY_STATS:
                summary[column][stat] = _json_number(summary[column][stat])
        path = _write_text_atomic(path, json.dumps(summary, indent=2, allow_nan=False) + "\n")
        logger.info("Wrote metrics summary to %s", path)
        return path

    @classmethod
    def load_csv(cls, path: str | os.PathLike) -> MetricsTable:
        """Read a ``metrics.csv`` written by :meth:`save_csv` (e.g. to resume an evaluation).

        Raises:
            ValueError: the file has no ``case_id`` column or unknown columns.
        """
        path = Path(path)
        with path.open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            if reader.fieldnames is None or reader.fieldnames[0] != "case_id":
                raise ValueError(
                    f"{path}: first column should be 'case_id', got {reader.fieldnames}. "
                    f"Is this a metrics.csv written by brats_seg?"
                )
            table = cls()
            table._metric_columns = table._columns_for_keys(set(reader.fieldnames[1:]), str(path))
            for row in reader:
                table.add(row.pop("case_id"), {k: float(v) for k, v in row.items()})
        return table

