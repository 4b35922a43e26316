"""The metrics table of an evaluation: columns, ``metrics.csv``, ``summary.json``, the printed summary.

Columns (DESIGN.md "Metrics"), for each region ``r`` of the layout (``wt``, ``tc``, ``et``,
and ``rc`` for brats2024), grouped by metric in this order:

===================================  ==============================================================
``dice hd95 sens spec``               legacy per-case metrics (BraTS 2012-2022; DeepMind HD95)
``nsd``                               global normalised surface Dice (panoptica, as BraTS 2025+)
``lesion_dice lesion_hd95 lesion_nsd``  lesion-wise, instance-matched (panoptica, BraTS 2025+)
``lesions_ref lesions_pred lesions_tp``  lesion counts (connected components) and matched ones
``rq pq``                             detection F1 (recognition quality) and panoptic quality
``lesion23_dice lesion23_hd95``       the BraTS 2023/2024 lesion-wise ranking metrics
===================================  ==============================================================

In ``metrics.csv`` an infinite distance is written ``373`` (the official BraTS parser's
penalty, the diagonal of the 240x240x155 mm image) and an undefined value (no lesion on
either side) is an empty cell, not 0 and not 1. ``summary.json`` gives mean, median and
std per column over the cases where the value is defined (infinite distances counted as
373, and how many there were in ``n_inf``).
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from brats_seg.files import write_text_atomic

__all__ = [
    "INF_DISTANCE_MM",
    "METRIC_NAMES",
    "MetricsTable",
    "format_summary_table",
    "metric_columns",
]

log = logging.getLogger(__name__)

# mm; what an infinite distance counts as in the CSV and the statistics (official parser).
INF_DISTANCE_MM = 373.0

METRIC_NAMES = (
    "dice",
    "hd95",
    "sens",
    "spec",
    "nsd",
    "lesion_dice",
    "lesion_hd95",
    "lesion_nsd",
    "lesions_ref",
    "lesions_pred",
    "lesions_tp",
    "rq",
    "pq",
    "lesion23_dice",
    "lesion23_hd95",
)
_STATS = ("mean", "median", "std")


def metric_columns(regions: Sequence[str]) -> tuple[str, ...]:
    """``("case_id", "dice_wt", "dice_tc", ..., "lesion23_hd95_et")``: every column, in order."""
    return ("case_id",) + tuple(f"{m}_{r}" for m in METRIC_NAMES for r in regions)


def _is_distance(column: str) -> bool:
    return "hd95" in column


def _cell(value: float) -> str:
    if math.isnan(value):
        return ""
    if math.isinf(value):
        return f"{INF_DISTANCE_MM:g}"
    return repr(float(value))


class MetricsTable:
    """Per-case metrics of one evaluation split, written as ``metrics.csv``/``summary.json``.

    Example::

        table = MetricsTable(("wt", "tc", "et"))
        table.add("BraTS2021_00000", score_case(...))
        table.save_csv(run_dir / "eval/test/metrics.csv")
        table.save_summary_json(run_dir / "eval/test/summary.json")

    Args:
        regions: the regions whose columns the table holds, in order.
    """

    def __init__(self, regions: Sequence[str]) -> None:
        self.regions = tuple(regions)
        if not self.regions:
            raise ValueError("a metrics table needs at least one region.")
        self.columns = metric_columns(self.regions)
        self._rows: dict[str, dict[str, float]] = {}

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
            metrics: a value (float; NaN = undefined, inf allowed for distances) for every
                metric column (an extra ``case_id`` key is ignored).

        Raises:
            ValueError: empty or duplicate ``case_id``, or keys other than the columns.
        """
        if not isinstance(case_id, str) or not case_id:
            raise ValueError(f"case_id should be a non-empty string, got {case_id!r}.")
        if case_id in self._rows:
            raise ValueError(f"case {case_id!r} is already in the table; case ids must be unique.")
        values = {k: v for k, v in metrics.items() if k != "case_id"}
        missing = sorted(set(self.columns[1:]) - set(values))
        extra = sorted(set(values) - set(self.columns[1:]))
        if missing or extra:
            raise ValueError(
                f"case {case_id!r} has other metrics than the table: missing {missing[:6]}, "
                f"extra {extra[:6]}. Score every case with the same regions."
            )
        self._rows[case_id] = {c: float(values[c]) for c in self.columns[1:]}

    def values(self, column: str) -> np.ndarray:
        """All cases' values of one metric column, float64 ``(n_cases,)`` (NaN, inf as stored)."""
        if column not in self.columns[1:]:
            raise KeyError(f"no column {column!r} in the table; columns are {self.columns}.")
        return np.array([row[column] for row in self._rows.values()], dtype=np.float64)

    def summary(self) -> dict:
        """Mean, median and std (population) per column over the cases where it is defined.

        Returns:
            ``{"n_cases": int, "<column>": {"mean", "median", "std": float, "n": int,
            "n_inf": int}}``; infinite distances enter the statistics as 373 mm and are
            counted in ``n_inf``; statistics of a column with no value are NaN.
        """
        out: dict = {"n_cases": len(self._rows)}
        for column in self.columns[1:]:
            v = self.values(column)
            v = v[~np.isnan(v)]
            n_inf = int(np.isinf(v).sum())
            v = np.where(np.isinf(v), INF_DISTANCE_MM, v)
            stats = (
                dict.fromkeys(_STATS, math.nan)
                if v.size == 0
                else {"mean": float(np.mean(v)), "median": float(np.median(v)), "std": float(np.std(v))}
            )
            out[column] = {**stats, "n": int(v.size), "n_inf": n_inf}
        return out

    def save_csv(self, path: str | os.PathLike) -> Path:
        """Write ``metrics.csv`` (one row per case, :attr:`columns`) atomically.

        Floats at full precision (``repr``), infinite distances as ``373``, undefined
        values as empty cells.
        """
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(self.columns)
        for case_id, row in self._rows.items():
            writer.writerow([case_id] + [_cell(row[c]) for c in self.columns[1:]])
        path = write_text_atomic(path, buf.getvalue())
        log.info("wrote metrics of %d cases to %s", len(self._rows), path)
        return path

    def save_summary_json(self, path: str | os.PathLike, extra: dict | None = None) -> Path:
        """Write :meth:`summary` as JSON (undefined statistics as ``null``) atomically, with the
        entries of ``extra`` (e.g. the post-processing applied) beside the statistics."""
        summary = {**self.summary(), **(extra or {})}
        for column in self.columns[1:]:
            for stat in _STATS:
                if not math.isfinite(summary[column][stat]):
                    summary[column][stat] = None
        path = write_text_atomic(path, json.dumps(summary, indent=2, allow_nan=False) + "\n")
        log.info("wrote metrics summary to %s", path)
        return path

    @classmethod
    def load_csv(cls, path: str | os.PathLike) -> MetricsTable:
        """Read a ``metrics.csv`` written by :meth:`save_csv` (empty cells as NaN).

        Raises:
            ValueError: the file's columns are not those of a metrics table.
        """
        path = Path(path)
        with path.open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            names = reader.fieldnames or []
            regions = tuple(c[len("dice_") :] for c in names if c.startswith("dice_"))
            table = cls(regions or ("wt",))
            if tuple(names) != table.columns:
                raise ValueError(
                    f"{path}: columns {names[:5]}... are not those of a brats-seg metrics.csv for regions {regions}."
                )
            for row in reader:
                case_id = row.pop("case_id")
                table.add(case_id, {k: float(v) if v != "" else math.nan for k, v in row.items()})
        return table


# ---------------------------------------------------------------------------------------
# The printed summary
# ---------------------------------------------------------------------------------------

# (header, column prefix, digits): what the printed table shows, left to right.
_SHOWN = (
    ("Dice", "dice", 3),
    ("HD95", "hd95", 1),
    ("Dice", "lesion23_dice", 3),
    ("HD95", "lesion23_hd95", 1),
    ("Dice", "lesion_dice", 3),
    ("NSD", "lesion_nsd", 3),
    ("HD95", "lesion_hd95", 1),
    ("NSD", "nsd", 3),
    ("F1", "rq", 3),
)
_GROUPS = (("legacy", 2), ("BraTS 2023-24 rank", 2), ("lesion-wise (2025+)", 3), ("global", 1), ("detect", 1))


def format_summary_table(summary: dict, regions: Sequence[str]) -> str:
    """A plain-text table of the means per region of the metrics BraTS ranked by.

    Legacy Dice/HD95 (2012-2022), the BraTS 2023/2024 lesion-wise ranking metrics, the
    lesion-wise Dice/NSD/HD95 of today's official evaluation (panoptica), global NSD and
    lesion detection F1. HD95 in mm; ``n/a`` where no case defines the value; a ``*``
    marks a mean in which some infinite distances counted as 373 mm.
    """
    width = 8
    head1 = f"{'':<7}" + "".join(f"{g:^{width * n}}" for g, n in _GROUPS)
    head2 = f"{'region':<7}" + "".join(f"{h:>{width}}" for h, _, _ in _SHOWN)
    lines = [head1.rstrip(), head2, "-" * len(head2)]
    for region in regions:
        cells = []
        for _, prefix, digits in _SHOWN:
            stats = summary.get(f"{prefix}_{region}", {})
            mean = stats.get("mean")
            if mean is None or not math.isfinite(mean):
                cells.append(f"{'n/a':>{width}}")
            else:
                star = "*" if stats.get("n_inf") else ""
                cells.append(f"{mean:.{digits}f}{star}".rjust(width))
        lines.append(f"{region.upper():<7}" + "".join(cells))
    lines.append(
        "means over cases; HD95 in mm; * = infinite distances counted as 373 mm; every column per case in metrics.csv"
    )
    return "\n".join(lines)
