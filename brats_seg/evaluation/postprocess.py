"""Post-processing of a predicted label map, chosen on the run's validation split.

BraTS entries clean their label maps before they are ranked (Isensee et al. 2020/2021, the
2023 lesion-wise winners): stray small components removed, and a small enhancing volume
relabelled as necrosis, with thresholds chosen on validation data. The 2023/2024 ranking
(``lesion23_*``) scores every false-positive component Dice 0, and a case without enhancing
tumour gets ET Dice 0 for a single predicted ET voxel, so these rules move the leaderboard.

:class:`PostProcessing` holds the rules; :meth:`PostProcessing.apply` runs them on a label
map in the layout's own values, in this order:

1. ``min_component_mm3[r]``: connected components of region ``r`` (26-connectivity, as the
   lesion-wise scoring counts lesions) smaller than this are taken out of ``r`` and out of
   every region inside ``r``: a WT component becomes background, a TC component edema, an
   ET component necrosis;
2. ``relabel_below_mm3[r]``: if what is left of region ``r`` in the case is smaller than this
   in total, ``r`` is emptied and its voxels keep the label of the region holding it (ET
   becomes necrosis, the core label: TC and WT are unchanged).

:func:`choose_postprocessing` picks the rules on validation cases: one setting at a time
(ET's relabelling first, then each region's smallest component, outermost first), each
the candidate with the highest mean 2023 lesion-wise Dice over regions, provided no
region's mean legacy Dice falls more than :data:`LEGACY_TOLERANCE` below the unprocessed
one; ties go to the smaller threshold (do less). It returns the rules and a report of
what each step measured. The run folder keeps the result as ``postprocess.json``
(:mod:`brats_seg.run_dir`); evaluation and prediction apply it (``evaluate.postprocess``).
Nothing here imports TensorFlow.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import cc3d
import numpy as np

from brats_seg.data.labels import label_table, labels_to_regions, regions_to_labels
from brats_seg.evaluation.scoring.lesion23 import compute_lesion23_metrics, lesion23_params_for
from brats_seg.evaluation.scoring.metrics import compute_dice

__all__ = [
    "COMPONENT_CANDIDATES_MM3",
    "LEGACY_TOLERANCE",
    "POSTPROCESS_KIND",
    "RELABEL_CANDIDATES_MM3",
    "RELABEL_REGIONS",
    "PostProcessing",
    "PostprocessError",
    "ValidationCase",
    "choose_postprocessing",
    "rules_of_record",
]

log = logging.getLogger(__name__)

POSTPROCESS_KIND = "brats-seg postprocess"
POSTPROCESS_VERSION = 1
# Regions whose small total volume is relabelled as the region holding them (BraTS practice: ET only).
RELABEL_REGIONS = ("et",)
RELABEL_CANDIDATES_MM3 = (0, 50, 100, 200, 300, 500, 750, 1000, 1500)
COMPONENT_CANDIDATES_MM3 = (0, 10, 20, 50, 100, 200, 500, 1000)
# A setting may not lower any region's mean legacy Dice on validation by more than this.
LEGACY_TOLERANCE = 0.01
# Voxels kept around a case's tumour when choosing (more than the lesion-wise dilation).
_MARGIN = 8


class PostprocessError(ValueError):
    """A post-processing description that cannot be used; the message names the file or value."""


@dataclass(frozen=True)
class PostProcessing:
    """Rules for a label map (see the module doc). Thresholds in mm^3; 0 = off.

    Attributes:
        min_component_mm3: ``{region: smallest component kept}``.
        relabel_below_mm3: ``{region: total volume under which the region is emptied}``
            (only regions of :data:`RELABEL_REGIONS`).
    """

    min_component_mm3: Mapping[str, float] = field(default_factory=dict)
    relabel_below_mm3: Mapping[str, float] = field(default_factory=dict)

    @property
    def is_identity(self) -> bool:
        """Whether the rules change nothing."""
        return not any(v > 0 for v in (*self.min_component_mm3.values(), *self.relabel_below_mm3.values()))

    def rules(self) -> dict:
        """The rules as JSON (what a fingerprint or a manifest records)."""
        return {
            "min_component_mm3": {r: float(v) for r, v in sorted(self.min_component_mm3.items())},
            "relabel_below_mm3": {r: float(v) for r, v in sorted(self.relabel_below_mm3.items())},
        }

    def describe(self) -> str:
        """One line for a log."""
        if self.is_identity:
            return "none (no rule changes the mask)"
        parts = [f"{r.upper()} components < {v:g} mm3 removed" for r, v in self.min_component_mm3.items() if v > 0]
        parts += [
            f"{r.upper()} < {v:g} mm3 in total relabelled as the region holding it"
            for r, v in self.relabel_below_mm3.items()
            if v > 0
        ]
        return "; ".join(parts)

    @classmethod
    def from_rules(cls, rules: Mapping, layout: str, source: str) -> PostProcessing:
        """Rules read back (:meth:`rules`), checked against ``layout``.

        Raises:
            PostprocessError: naming ``source`` and the bad key or value.
        """
        names = set(label_table(layout).region_names)
        out = {}
        for key, allowed in (("min_component_mm3", names), ("relabel_below_mm3", set(RELABEL_REGIONS) & names)):
            given = rules.get(key, {}) if isinstance(rules, Mapping) else None
            if not isinstance(given, Mapping):
                raise PostprocessError(f"{source}: '{key}' should map regions to volumes in mm3, got {given!r}.")
            for region, value in given.items():
                if region not in allowed:
                    raise PostprocessError(
                        f"{source}: '{key}' names region {region!r}; {layout} allows "
                        f"{', '.join(sorted(allowed)) or 'none'} there."
                    )
                if (
                    isinstance(value, bool)
                    or not isinstance(value, (int, float))
                    or not math.isfinite(value)
                    or value < 0
                ):
                    raise PostprocessError(f"{source}: '{key}.{region}' = {value!r}; use a volume in mm3 >= 0.")
            out[key] = {str(r): float(v) for r, v in given.items()}
        return cls(out["min_component_mm3"], out["relabel_below_mm3"])

    def apply(self, labels: np.ndarray, layout: str, spacing_mm: Sequence[float]) -> np.ndarray:
        """The label map with the rules applied (a new array; ``labels`` is not changed).

        Args:
            labels: ``(x, y, z)`` in ``layout``'s own values.
            layout: the run's ``data.layout``.
            spacing_mm: the voxel size of the label map, for volumes in mm^3.
        """
        labels = np.asarray(labels)
        if self.is_identity:
            return labels.copy()
        table = label_table(layout)
        names = table.region_names
        sets = {r.name: set(r.labels) for r in table.regions}
        regions = labels_to_regions(labels, layout, names).astype(bool)
        voxel_mm3 = float(np.prod([float(s) for s in spacing_mm]))
        for i, name in enumerate(names):  # outermost first: WT's components before TC's
            smallest = self.min_component_mm3.get(name, 0.0)
            if smallest <= 0 or not regions[..., i].any():
                continue
            components, n = cc3d.connected_components(regions[..., i], connectivity=26, return_N=True)
            sizes = np.bincount(components.ravel(), minlength=n + 1) * voxel_mm3
            small = np.flatnonzero(sizes < smallest)
            small = small[small != 0]
            if small.size == 0:
                continue
            removed = np.isin(components, small)
            for j, other in enumerate(names):  # the region and those inside it
                if j == i or sets[other] < sets[name]:
                    regions[..., j][removed] = False
        for name, below in self.relabel_below_mm3.items():
            i = names.index(name)
            if below > 0 and 0 < np.count_nonzero(regions[..., i]) * voxel_mm3 < below:
                regions[..., i] = False
        return regions_to_labels(regions, layout, names).astype(labels.dtype, copy=False)


def rules_of_record(
    record: Mapping | None, layout: str, source: str, checkpoint_identity: Mapping | None = None
) -> PostProcessing | None:
    """The rules a ``postprocess.json`` record holds, for prediction and export (None: no record).

    A record chosen for another checkpoint than ``checkpoint_identity`` still applies, with a
    warning saying how to choose again.

    Raises:
        PostprocessError: not a post-processing record, or bad rules (naming ``source``).
    """
    if record is None:
        return None
    if not isinstance(record, Mapping) or record.get("kind") != POSTPROCESS_KIND:
        raise PostprocessError(
            f'{source} is not a brats-seg post-processing record (no "kind": '
            f'"{POSTPROCESS_KIND}"): delete it and run scripts/evaluate.py to choose it again.'
        )
    rules = PostProcessing.from_rules(record.get("rules"), layout, source)
    chosen_for = (
        (record.get("chosen_for") or {}).get("checkpoint") if isinstance(record.get("chosen_for"), Mapping) else None
    )
    if checkpoint_identity is not None and chosen_for != dict(checkpoint_identity):
        log.warning(
            "%s was chosen for another checkpoint than this one; its rules (%s) are applied as they stand. "
            "scripts/evaluate.py with the same run_dir and checkpoint chooses them again for this one.",
            source,
            rules.describe(),
        )
    return rules


# ---------------------------------------------------------------------------------------
# Choosing the rules on validation cases
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ValidationCase:
    """A validation case's prediction (as thresholded, unprocessed) and reference label maps."""

    case_id: str
    pred: np.ndarray
    ref: np.ndarray
    spacing_mm: tuple[float, float, float]

    def cropped(self) -> ValidationCase:
        """The same case cut to its tumour's box (prediction or reference) with a margin: the
        rules and the scores are the same there, and choosing is quicker."""
        present = (self.pred != 0) | (self.ref != 0)
        if not present.any():
            box = tuple(slice(0, 1) for _ in present.shape)
        else:
            idx = np.nonzero(present)
            box = tuple(
                slice(max(int(i.min()) - _MARGIN, 0), min(int(i.max()) + 1 + _MARGIN, n))
                for i, n in zip(idx, present.shape)
            )
        return ValidationCase(
            self.case_id, np.ascontiguousarray(self.pred[box]), np.ascontiguousarray(self.ref[box]), self.spacing_mm
        )


class _Scorer:
    """Mean legacy and 2023 lesion-wise Dice per region of validation cases under rules, with
    each case's region scores kept by mask content (most candidates change few cases)."""

    def __init__(self, cases: Sequence[ValidationCase], layout: str, names: Sequence[str]) -> None:
        self.cases = [c.cropped() for c in cases]
        self.layout, self.names = layout, tuple(names)
        self.refs = [labels_to_regions(c.ref, layout, self.names).astype(bool) for c in self.cases]
        self._cache: dict[tuple[int, str, bytes], tuple[float, float]] = {}

    def score(self, rules: PostProcessing) -> dict[str, dict[str, float]]:
        """``{"dice": {region: mean}, "lesion23_dice": {region: mean}}`` over the cases."""
        sums = {m: dict.fromkeys(self.names, 0.0) for m in ("dice", "lesion23_dice")}
        for k, case in enumerate(self.cases):
            pred = labels_to_regions(rules.apply(case.pred, self.layout, case.spacing_mm), self.layout, self.names)
            for i, name in enumerate(self.names):
                mask = pred[..., i].astype(bool)
                key = (k, name, hashlib.sha1(np.packbits(mask).tobytes()).digest())
                if key not in self._cache:
                    ref = self.refs[k][..., i]
                    lesion = compute_lesion23_metrics(mask, ref, case.spacing_mm, lesion23_params_for(case.case_id))
                    self._cache[key] = (compute_dice(mask, ref), lesion["dice"])
                dice, lesion_dice = self._cache[key]
                sums["dice"][name] += dice
                sums["lesion23_dice"][name] += lesion_dice
        n = max(len(self.cases), 1)
        return {m: {r: v / n for r, v in per.items()} for m, per in sums.items()}


def _objective(scores: dict) -> float:
    return float(np.mean(list(scores["lesion23_dice"].values())))


def _allowed(scores: dict, baseline: dict) -> bool:
    return all(scores["dice"][r] >= baseline["dice"][r] - LEGACY_TOLERANCE - 1e-12 for r in baseline["dice"])


def choose_postprocessing(
    cases: Sequence[ValidationCase],
    layout: str,
    names: Sequence[str],
    relabel_candidates: Sequence[float] = RELABEL_CANDIDATES_MM3,
    component_candidates: Sequence[float] = COMPONENT_CANDIDATES_MM3,
) -> tuple[PostProcessing, dict]:
    """The rules that score best on validation cases (see the module doc).

    Args:
        cases: the validation cases' unprocessed predictions and references.
        layout: their layout.
        names: the regions the model predicts (a WT-only model: ``("wt",)``).
        relabel_candidates, component_candidates: volumes tried, in mm^3.

    Returns:
        ``(rules, report)``; the report holds the mean legacy and lesion-wise Dice per region
        unprocessed and with the rules, and every candidate each step measured.
    """
    names = tuple(names)
    scorer = _Scorer(cases, layout, names)
    current = PostProcessing({}, {})
    baseline = scorer.score(current)
    best_scores = baseline
    steps = []
    plan = [("relabel_below_mm3", r, relabel_candidates) for r in RELABEL_REGIONS if r in names]
    plan += [("min_component_mm3", r, component_candidates) for r in names]
    for key, region, candidates in plan:
        tried = []
        chosen, chosen_scores = 0.0, None
        for value in sorted({float(v) for v in candidates} | {0.0}):
            rules = _with(current, key, region, value)
            scores = scorer.score(rules)
            ok = _allowed(scores, baseline)
            tried.append(
                {
                    "mm3": value,
                    "lesion23_dice_mean": _objective(scores),
                    "allowed": ok,
                    "dice": scores["dice"],
                    "lesion23_dice": scores["lesion23_dice"],
                }
            )
            if ok and (chosen_scores is None or _objective(scores) > _objective(chosen_scores) + 1e-9):
                chosen, chosen_scores = value, scores
        current = _with(current, key, region, chosen)
        best_scores = chosen_scores if chosen_scores is not None else best_scores
        steps.append({"rule": key, "region": region, "chosen_mm3": chosen, "candidates": tried})
        log.debug("post-processing: %s %s -> %g mm3", key, region, chosen)
    current = PostProcessing(
        {r: v for r, v in current.min_component_mm3.items() if v > 0},
        {r: v for r, v in current.relabel_below_mm3.items() if v > 0},
    )
    report = {
        "cases": [c.case_id for c in cases],
        "objective": "mean over regions of lesion23_dice",
        "legacy_tolerance": LEGACY_TOLERANCE,
        "unprocessed": baseline,
        "chosen": best_scores,
        "steps": steps,
    }
    return current, report


def _with(rules: PostProcessing, key: str, region: str, value: float) -> PostProcessing:
    mins, relabel = dict(rules.min_component_mm3), dict(rules.relabel_below_mm3)
    (mins if key == "min_component_mm3" else relabel)[region] = value
    return PostProcessing(mins, relabel)
