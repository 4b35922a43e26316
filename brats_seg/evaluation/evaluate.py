"""Evaluate a training run on held-out cases, and score existing masks, the BraTS way.

:func:`evaluate_run` (``scripts/evaluate.py``), per case of the run's split:

1. inference on the cached network-grid image (whole volume, or sliding windows);
2. undo the crop and the resampling: probabilities on the native RAS grid;
3. threshold (``evaluate.threshold``) -> regions WT, TC, ET (or WT only);
4. metrics against the ORIGINAL label file (loaded again, RAS), with its voxel spacing;
5. the prediction as NIfTI in the layout's own labels with the label file's affine and
   header, and an overlay PNG (FLAIR on the native grid, reference solid, prediction dashed).

Files, under ``<run_dir>/eval/<split>/``::

    metrics.csv                 case_id, dice_wt, dice_tc, dice_et, hd95_wt, ..., spec_et
    summary.json                n_cases, and mean/median/std/n per metric column
    predictions/<case_id>.nii.gz
    overlays/<case_id>.png

WT-only models (``model.out_channels=1``): only WT is scored; the TC/ET columns stay
in metrics.csv (same columns for every run) and hold NaN (``nan`` in the CSV, ``null``
statistics with ``n: 0`` in summary.json). Their masks carry the layout's edema label
(see :mod:`brats_seg.evaluation.inference`).

:func:`score_masks` (``scripts/score.py``) scores masks that already exist, with the
same metric code and no model (and no TensorFlow). A reference case without a
prediction file counts as an **empty prediction** (Dice 0 / HD95 373.13 mm where the
reference is not empty), as the BraTS challenge scores a missing submission, and is
listed in a warning.

Nothing here imports TensorFlow at module level.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from brats_seg.config import EvaluateConfig, TrainConfig
from brats_seg.data.cache import CacheEntry, prepare_cases
from brats_seg.data.errors import CaseError, DataError, DatasetError
from brats_seg.data.labels import REGION_NAMES, check_label_map, labels_to_regions
from brats_seg.data.layouts import discover_cases
from brats_seg.data.nifti import Volume, load_volume, save_mask
from brats_seg.data.splits import load_split
from brats_seg.evaluation.inference import (
    RunError,
    check_evaluate_config,
    check_native_shape,
    checkpoint_path,
    load_run_config,
    load_run_model,
    predict_case_native,
    regions_to_mask,
    threshold_regions,
)
from brats_seg.evaluation.metrics import HD95_EMPTY_MM, METRIC_COLUMNS, MetricsTable, compute_case_metrics

__all__ = [
    "SPLITS",
    "ScoreResult",
    "eval_dir",
    "check_run_dir",
    "split_case_ids",
    "evaluate_run",
    "score_masks",
    "format_summary_table",
]

log = logging.getLogger(__name__)

SPLITS = ("val", "test", "all")


def eval_dir(run_dir: str | Path, split: str) -> Path:
    """``<run_dir>/eval/<split>``: where an evaluation's files go."""
    return Path(run_dir).expanduser() / "eval" / split


def check_run_dir(
    run_dir: str | Path,
    checkpoint: str = "best",
    split: str | None = None,
    eval_cfg: EvaluateConfig | None = None,
) -> TrainConfig:
    """Check a run folder can be evaluated (and the settings make sense), without importing TensorFlow.

    Returns:
        The run's config.

    Raises:
        RunError: empty ``run_dir``, no config.json, no checkpoint, a bad split name or
            ``evaluate.*`` value.
    """
    if not str(run_dir).strip():
        raise RunError("run_dir is not set: pass run_dir=<the training run's folder> (e.g. outputs/<run>).")
    if split is not None and split not in SPLITS:
        raise RunError(f"split={split!r}: use one of {', '.join(SPLITS)} (the run's split.json lists val and test).")
    config = load_run_config(run_dir)
    checkpoint_path(run_dir, checkpoint)
    if eval_cfg is not None:
        check_evaluate_config(eval_cfg, config.model.depth)
    return config


def split_case_ids(run_dir: str | Path, split: str) -> list[str]:
    """Case ids of ``split`` (``val`` | ``test`` | ``all``) in ``<run_dir>/split.json``.

    Raises:
        RunError: a bad split name, or no split.json.
    """
    if split not in SPLITS:
        raise RunError(f"split={split!r}: use one of {', '.join(SPLITS)}.")
    path = Path(run_dir).expanduser() / "split.json"
    if not path.is_file():
        raise RunError(f"{path} not found: the run does not say which cases it held out; train first: "
                       f"python train.py run_dir={run_dir}")
    try:
        split_ids = load_split(path)
    except ValueError as e:
        raise RunError(str(e)) from e
    if split == "all":
        return sorted(set(split_ids["train"]) | set(split_ids["val"]) | set(split_ids["test"]))
    return sorted(split_ids[split])


def _prepare_entries(config: TrainConfig, case_ids: list[str], progress: bool) -> list[CacheEntry]:
    """Cache entries of ``case_ids`` (prepared now only if missing or stale), in id order."""
    from brats_seg.data.dataset import dataset_cache_dir, ensure_synthetic

    data = config.data
    if data.name == "synthetic":
        ensure_synthetic(data)
    try:
        cases, skipped = discover_cases(data.root, data.layout, require_labels=False, on_error="skip")
    except DatasetError as e:
        raise DatasetError(f"{e} (data.root comes from the run's config.json; if the dataset moved, edit it there.)") from e
    by_id = {c.case_id: c for c in cases}
    problems = dict(skipped)
    missing = [i for i in case_ids if i not in by_id or by_id[i].label is None]
    if missing:
        lines = "\n".join(f"  - {problems.get(i, f'case {i}: no such case, or no label file')}" for i in missing[:10])
        raise DatasetError(
            f"{len(missing)} case(s) of the run's split cannot be evaluated from {data.root}:\n{lines}\n"
            "Restore them, or point data.root in the run's config.json at the dataset the run was trained on."
        )
    cache_root = dataset_cache_dir(data) / config.resolution.name
    entries, errors, _ = prepare_cases(
        [by_id[i] for i in case_ids], cache_root, config.resolution.spacing_mm, config.resolution.shape,
        data.allow_crop, data.num_workers, progress,
    )
    if errors:
        lines = "\n".join(f"  - {e}" for e in errors)
        raise DataError(f"{len(errors)} case(s) to evaluate could not be prepared:\n{lines}")
    return entries


def _load_reference(case_id: str, path: str | Path, layout: str) -> tuple[Volume, np.ndarray]:
    """The label file (RAS) and its regions ``(x, y, z, 3)`` uint8, labels checked."""
    vol = load_volume(path, case_id)
    labels = check_label_map(case_id, path, vol.data, layout, f"Is this really data={layout}?")
    return vol, labels_to_regions(labels, layout)


def _case_metrics(pred: np.ndarray, ref: np.ndarray, spacing_mm) -> dict[str, float]:
    """Metrics of every contract column; regions the model does not predict are NaN."""
    names = REGION_NAMES[: pred.shape[-1]]
    values = compute_case_metrics(pred, ref[..., : len(names)], spacing_mm, region_names=names)
    return {c: values.get(c, math.nan) for c in METRIC_COLUMNS[1:]}


def _flair_native(meta: dict) -> np.ndarray:
    """FLAIR ``(x, y, z)`` on the native RAS grid (first image file; MSD: 4D channel 0)."""
    first = meta["images"][0]
    if len(meta["images"]) == 1:
        return load_volume(first, meta["case_id"], expect_ndim=4).data[..., 0]
    return load_volume(first, meta["case_id"]).data


def _evaluate_case(model, entry: CacheEntry, config: TrainConfig, eval_cfg: EvaluateConfig, out: Path) -> dict:
    """Infer, invert, threshold, score and write one case; returns its metrics row."""
    from brats_seg.evaluation.overlays import save_overlay

    meta = entry.meta
    case_id, layout = entry.case_id, meta["layout"]
    probs = predict_case_native(
        model, entry, meta["record"], mode=eval_cfg.mode, window=eval_cfg.window, overlap=eval_cfg.window_overlap,
        mirror=eval_cfg.mirror
    )  # (x, y, z, R) native RAS
    ref_vol, ref = _load_reference(case_id, meta["label"], layout)
    check_native_shape(case_id, meta["label"], probs, ref.shape[:3])
    pred = threshold_regions(probs, eval_cfg.threshold)  # (x, y, z, R) bool
    metrics = _case_metrics(pred, ref, ref_vol.spacing_mm)
    save_mask(regions_to_mask(pred, layout), ref_vol.original_affine, ref_vol.original_header,
              out / "predictions" / f"{case_id}.nii.gz")
    if eval_cfg.overlays:
        n = pred.shape[-1]
        dice = "  ".join(f"{r.upper()} {metrics[f'dice_{r}']:.3f}" for r in REGION_NAMES[:n])
        save_overlay(_flair_native(meta), ref[..., :n], pred, out / "overlays" / f"{case_id}.png",
                     title=f"{case_id}  Dice {dice}", spacing_mm=ref_vol.spacing_mm, region_names=REGION_NAMES[:n])
    return metrics


def _log_to_mlflow(run_dir: Path, config: TrainConfig, split: str, summary: dict, out: Path) -> None:
    """Log summary statistics (``<split>_<column>_<mean|median|std>``) and the eval folder
    (artifacts ``eval/<split>``) to the run's MLflow run; never fails the evaluation."""
    metrics = {
        f"{split}_{column}_{stat}": value
        for column, stats in summary.items() if isinstance(stats, dict)
        for stat, value in stats.items() if stat in ("mean", "median", "std") and math.isfinite(value)
    }
    try:
        from brats_seg.tracking.mlflow import Tracker

        # The run's own tracking settings; no system metrics for a short evaluation.
        tracker = Tracker.resume(run_dir, dataclasses.replace(config.tracking, system_metrics=False))
        with tracker:
            tracker.log_metrics(metrics, step=0)
            tracker.log_artifacts(out, f"eval/{split}")
    except Exception as e:  # noqa: BLE001 - tracking is best effort: the files on disk are the result
        log.warning("could not log the evaluation to MLflow (%s: %s); the files are in %s", type(e).__name__, e, out)


def evaluate_run(
    run_dir: str | Path,
    split: str = "test",
    checkpoint: str = "best",
    eval_cfg: EvaluateConfig | None = None,
    progress: bool = True,
    model=None,
) -> dict:
    """Evaluate a run's model on its ``val`` | ``test`` | ``all`` cases on the native grid.

    Call ``brats_seg.backend.configure`` first (this loads a Keras model).

    Args:
        run_dir: the training run's folder (config.json, split.json, checkpoints/).
        split: ``val`` | ``test`` | ``all`` (every case in split.json).
        checkpoint: ``best`` | ``last`` | a ``.keras`` path.
        eval_cfg: inference mode, threshold, overlays, sliding window.
        progress: show a tqdm bar.
        model: an already loaded model (e.g. from train.py at the end of training);
            None loads ``checkpoint``.

    Returns:
        The summary written to summary.json: ``{"n_cases": n, "<column>": {"mean",
        "median", "std", "n"}}`` for each metric column (NaN where a column has no value).

    Raises:
        RunError: run folder, checkpoint or split name unusable.
        DataError: the split's cases cannot be found or prepared, or a label file is bad.
    """
    from tqdm.auto import tqdm

    eval_cfg = eval_cfg or EvaluateConfig()
    if model is None:
        config = check_run_dir(run_dir, checkpoint, split, eval_cfg)
    else:
        config = load_run_config(run_dir)
        check_evaluate_config(eval_cfg, config.model.depth)
    run_dir = Path(run_dir).expanduser()
    case_ids = split_case_ids(run_dir, split)
    if not case_ids:
        raise RunError(f"the {split} split of {run_dir / 'split.json'} is empty: nothing to evaluate; try split=all.")
    entries = _prepare_entries(config, case_ids, progress)
    model = model if model is not None else load_run_model(run_dir, checkpoint, config)
    out = eval_dir(run_dir, split)
    table = MetricsTable(region_names=REGION_NAMES)
    bar = tqdm(entries, desc=f"evaluating {split}", unit="case", disable=not progress)
    for entry in bar:
        row = _evaluate_case(model, entry, config, eval_cfg, out)
        table.add(entry.case_id, row)
        bar.set_postfix(dice_wt=f"{row['dice_wt']:.3f}")
    table.save_csv(out / "metrics.csv")
    table.save_summary_json(out / "summary.json")
    summary = table.summary()
    log.info("evaluated %d %s cases of %s: mean Dice WT %.3f", len(table), split, run_dir, summary["dice_wt"]["mean"])
    _log_to_mlflow(run_dir, config, split, summary, out)
    return summary


# ---------------------------------------------------------------------------------------
# Scoring existing masks
# ---------------------------------------------------------------------------------------


@dataclass
class ScoreResult:
    """What :func:`score_masks` did.

    Attributes:
        summary: as in summary.json.
        csv_path, summary_path: files written.
        missing: reference cases without a prediction file (scored as empty masks).
        unmatched: prediction files without a reference case (ignored).
    """

    summary: dict
    csv_path: Path
    summary_path: Path
    missing: list[str] = field(default_factory=list)
    unmatched: list[str] = field(default_factory=list)


_NIFTI_EXTS = (".nii.gz", ".nii")


def _find_prediction(pred_dir: Path, case_id: str) -> Path | None:
    for ext in _NIFTI_EXTS:
        p = pred_dir / f"{case_id}{ext}"
        if p.is_file():
            return p
    return None


def _mask_ids(pred_dir: Path) -> set[str]:
    """Case ids of the ``<case_id>.nii[.gz]`` files in ``pred_dir``."""
    ids = set()
    for p in pred_dir.iterdir():
        ext = next((e for e in _NIFTI_EXTS if p.name.endswith(e)), None)
        if ext and p.is_file():
            ids.add(p.name[: -len(ext)])
    return ids


def _load_prediction(case_id: str, path: Path, ref: Volume, layout: str) -> np.ndarray:
    """Prediction regions ``(x, y, z, 3)`` on the reference grid, labels checked."""
    vol = load_volume(path, case_id)
    if vol.data.shape != ref.data.shape or not np.allclose(vol.affine_ras, ref.affine_ras, atol=1e-3):
        raise CaseError(
            case_id, path,
            f"grid (RAS shape {vol.data.shape}, affine {np.round(vol.affine_ras, 3).tolist()}) differs from that of "
            f"the reference {ref.path} (RAS shape {ref.data.shape}, affine {np.round(ref.affine_ras, 3).tolist()})",
            "A mask must be on its reference label file's grid: write it with scripts/predict.py, or resample it first.",
        )
    labels = check_label_map(case_id, path, vol.data, layout,
                             "Write masks in the layout's own labels, or pass the data= the masks were written for.")
    return labels_to_regions(labels, layout)


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
        layout: ``msd`` | ``brats2021`` | ``brats2023`` (of the references and the masks).
        out: CSV path; default ``<pred_dir>/metrics.csv``. summary.json goes beside it.
        on_error: ``raise`` | ``skip``: what a bad reference case does to discovery.
        progress: show a tqdm bar.

    Returns:
        A :class:`ScoreResult`.

    Raises:
        DatasetError: ``pred_dir`` or ``ref_dir`` unusable.
        CaseError: a mask on another grid or with labels outside the layout's set
            (naming both files).
    """
    from tqdm.auto import tqdm

    if not str(pred_dir).strip():
        raise DatasetError("pred_dir is not set: pass pred_dir=<folder of <case_id>.nii.gz masks>.")
    pred_dir = Path(pred_dir).expanduser()
    if not pred_dir.is_dir():
        raise DatasetError(f"pred_dir {pred_dir} is not a folder: pass pred_dir=<folder of <case_id>.nii.gz masks>.")
    cases, _ = discover_cases(ref_dir, layout, require_labels=True, on_error=on_error)
    table = MetricsTable(region_names=REGION_NAMES)
    missing = []
    for case in tqdm(cases, desc="scoring", unit="case", disable=not progress):
        ref_vol, ref = _load_reference(case.case_id, case.label, layout)
        path = _find_prediction(pred_dir, case.case_id)
        if path is None:
            missing.append(case.case_id)
            pred = np.zeros_like(ref)  # BraTS: a missing prediction is an empty mask
        else:
            pred = _load_prediction(case.case_id, path, ref_vol, layout)
        table.add(case.case_id, compute_case_metrics(pred, ref, ref_vol.spacing_mm))
    unmatched = sorted(_mask_ids(pred_dir) - {c.case_id for c in cases})
    if missing:
        log.warning("%d of %d reference cases have no prediction in %s and count as empty masks "
                    "(Dice 0, HD95 %.2f mm where the reference is not empty): %s",
                    len(missing), len(cases), pred_dir, HD95_EMPTY_MM, ", ".join(missing))
    if unmatched:
        log.warning("%d mask(s) in %s have no reference case and are ignored: %s", len(unmatched), pred_dir,
                    ", ".join(unmatched))
    csv_path = Path(out).expanduser() if out else pred_dir / "metrics.csv"
    table.save_csv(csv_path)
    summary_path = table.save_summary_json(csv_path.with_name("summary.json"))
    return ScoreResult(table.summary(), csv_path, summary_path, missing, unmatched)


# ---------------------------------------------------------------------------------------
# Reporting
# ---------------------------------------------------------------------------------------


def _cell(stats: dict, digits: int) -> tuple[str, str]:
    mean, std, median = stats.get("mean"), stats.get("std"), stats.get("median")
    if mean is None or not math.isfinite(mean):
        return "n/a", "n/a"
    return f"{mean:.{digits}f} ± {std:.{digits}f}", f"{median:.{digits}f}"


def format_summary_table(summary: dict) -> str:
    """A plain-text table of Dice and HD95 (mean ± std, median) per region.

    Args:
        summary: as returned by :func:`evaluate_run` / in summary.json.
    """
    header = f"{'region':<7}{'Dice mean ± std':>18}{'median':>9}{'HD95 mm mean ± std':>22}{'median':>9}"
    lines = [header, "-" * len(header)]
    for region in REGION_NAMES:
        dice, dice_med = _cell(summary.get(f"dice_{region}", {}), 3)
        hd, hd_med = _cell(summary.get(f"hd95_{region}", {}), 2)
        lines.append(f"{region.upper():<7}{dice:>18}{dice_med:>9}{hd:>22}{hd_med:>9}")
    return "\n".join(lines)

