"""Evaluate a training run on held-out cases, the BraTS way.

:func:`evaluate_run` (``scripts/evaluate.py``), per case of the run's split:

1. inference on the cached network-grid image (whole volume, or sliding windows);
2. undo the crop and the resampling: probabilities on the native RAS grid;
3. threshold (``evaluate.threshold``) -> the regions the model predicts -> one label map
   in the layout's own values (the nesting rule resolves non-nested regions);
4. that label map is written as NIfTI with the label file's affine and header, and every
   metric is computed from it against the ORIGINAL label file (loaded again, RAS, with its
   voxel spacing) by :func:`brats_seg.evaluation.scoring.score_case`, the function
   ``scripts/score.py`` uses on the written files: both give the same ``metrics.csv``;
5. an overlay PNG (FLAIR on the native grid, reference solid, prediction dashed).

Files, under ``<run_dir>/eval/<split>/``::

    metrics.csv                 case_id, dice_wt, ..., lesion23_hd95_<r> (brats_seg.evaluation.table)
    summary.json                n_cases, and mean/median/std/n/n_inf per metric column
    predictions/<case_id>.nii.gz
    overlays/<case_id>.png

WT-only models (``model.out_channels=1``): only WT is scored; the other regions' columns
stay in metrics.csv (same columns for every run of a layout) as empty cells (``null``
statistics with ``n: 0`` in summary.json). Scoring their written masks with
``scripts/score.py`` scores TC/ET as empty predictions instead.

Nothing here imports TensorFlow at module level.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from pathlib import Path

import numpy as np

from brats_seg.choices import check_choice
from brats_seg.config import EvaluateConfig, TrainConfig
from brats_seg.data.cache import CacheEntry, prepare_cases
from brats_seg.data.errors import DataError, DatasetError
from brats_seg.data.labels import labels_to_regions, region_names
from brats_seg.data.layouts import discover_cases
from brats_seg.data.nifti import load_volume, save_mask
from brats_seg.data.splits import load_split
from brats_seg.evaluation.predict import check_native_shape, predict_case_labels, predict_case_native
from brats_seg.evaluation.run import (
    RunError,
    check_evaluate_config,
    checkpoint_path,
    check_inference_memory,
    inference_device,
    inference_policy,
    load_run_config,
    load_run_model,
    run_regions,
)
from brats_seg.evaluation.scoring import load_reference, score_case
from brats_seg.evaluation.table import MetricsTable
from brats_seg.files import hold_lock
from brats_seg.run_dir import RunFolder

__all__ = [
    "SPLITS",
    "eval_dir",
    "check_run_dir",
    "split_case_ids",
    "evaluate_run",
]

log = logging.getLogger(__name__)

SPLITS = ("val", "test", "all")


def eval_dir(run_dir: str | Path, split: str) -> Path:
    """``<run_dir>/eval/<split>``: where an evaluation's files go."""
    return RunFolder(Path(run_dir).expanduser()).eval_dir(split)


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
    if split is not None:
        check_choice(split, SPLITS, "split", error=RunError, hint="The run's split.json lists val and test.")
    config = load_run_config(run_dir)
    checkpoint_path(run_dir, checkpoint)
    if eval_cfg is not None:
        check_evaluate_config(eval_cfg, config.model)
    return config


def split_case_ids(run_dir: str | Path, split: str) -> list[str]:
    """Case ids of ``split`` (``val`` | ``test`` | ``all``) in ``<run_dir>/split.json``.

    Raises:
        RunError: a bad split name, or no split.json.
    """
    check_choice(split, SPLITS, "split", error=RunError)
    path = RunFolder(Path(run_dir).expanduser()).split_path
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
    from brats_seg.data.dataset import GENERATED, dataset_cache_dir, ensure_synthetic

    data = config.data
    if data.name in GENERATED:
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


def _flair_native(meta: dict) -> np.ndarray:
    """FLAIR ``(x, y, z)`` on the native RAS grid (first image file; MSD: 4D channel 0)."""
    first = meta["images"][0]
    if len(meta["images"]) == 1:
        return load_volume(first, meta["case_id"], expect_ndim=4).data[..., meta.get("channels", [0])[0]]
    return load_volume(first, meta["case_id"]).data


def _evaluate_case(model, entry: CacheEntry, config: TrainConfig, eval_cfg: EvaluateConfig, out: Path) -> dict:
    """Infer, invert, threshold, write and score one case; returns its metrics row."""
    from brats_seg.evaluation.overlays import save_overlay

    meta = entry.meta
    case_id, layout = entry.case_id, meta["layout"]
    names = run_regions(config)
    probs = predict_case_native(
        model, entry, meta["record"], mode=eval_cfg.mode, window=eval_cfg.window, overlap=eval_cfg.window_overlap,
        mirror=eval_cfg.mirror
    )  # (x, y, z, R) native RAS
    ref_vol, ref_labels = load_reference(case_id, meta["label"], layout)
    check_native_shape(case_id, meta["label"], probs, ref_labels.shape)
    labels, pred = predict_case_labels(probs, layout, names, eval_cfg.threshold)  # what is written, and its regions
    save_mask(labels, ref_vol.original_affine, ref_vol.original_header, out / "predictions" / f"{case_id}.nii.gz")
    metrics = score_case(case_id, labels, ref_labels, ref_vol.spacing_mm, layout, names, reference=ref_vol)
    if eval_cfg.overlays:
        dice = "  ".join(f"{r.upper()} {metrics[f'dice_{r}']:.3f}" for r in names)
        save_overlay(_flair_native(meta), labels_to_regions(ref_labels, layout, names), pred,
                     out / "overlays" / f"{case_id}.png", title=f"{case_id}  Dice {dice}",
                     spacing_mm=ref_vol.spacing_mm, region_names=names)
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
        from brats_seg.tracking import Tracker

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
        LockedError: another process is evaluating this split of this run.
    """
    eval_cfg = eval_cfg or EvaluateConfig()
    if model is None:
        config = check_run_dir(run_dir, checkpoint, split, eval_cfg)
    else:
        config = load_run_config(run_dir)
        check_evaluate_config(eval_cfg, config.model)
    run_dir = Path(run_dir).expanduser()
    case_ids = split_case_ids(run_dir, split)
    if not case_ids:
        raise RunError(f"the {split} split of {run_dir / 'split.json'} is empty: nothing to evaluate; try split=all.")
    with hold_lock(eval_dir(run_dir, split), f"evaluation of the {split} split in"):  # one evaluation writes it
        summary = _evaluate_cases(run_dir, split, checkpoint, eval_cfg, progress, model, config, case_ids)
    _log_to_mlflow(run_dir, config, split, summary, eval_dir(run_dir, split))  # the lock file gone first
    return summary


def _evaluate_cases(run_dir: Path, split: str, checkpoint: str, eval_cfg: EvaluateConfig, progress: bool, model,
                    config: TrainConfig, case_ids: list[str]) -> dict:
    """:func:`evaluate_run` once its inputs are checked and its output folder locked."""
    from tqdm.auto import tqdm

    entries = _prepare_entries(config, case_ids, progress)
    estimate = None
    if model is None:  # predicted to fit lms.limit, or refused before the model is loaded
        estimate = check_inference_memory(config, eval_cfg, inference_device(), inference_policy(),
                                          [entry.meta["record"] for entry in entries])
    from brats_seg.lms.runtime.stats import current_rss_bytes, peak_rss_bytes, reset_peak_rss

    baseline = current_rss_bytes()  # the runtime, before the model (what the estimate is above)
    reset_peak_rss()
    model = model if model is not None else load_run_model(run_dir, checkpoint, config)
    out = eval_dir(run_dir, split)
    table = MetricsTable(region_names(config.data.layout))
    bar = tqdm(entries, desc=f"evaluating {split}", unit="case", disable=not progress)
    for entry in bar:
        row = _evaluate_case(model, entry, config, eval_cfg, out)
        table.add(entry.case_id, row)
        bar.set_postfix(dice_wt=f"{row['dice_wt']:.3f}")
    measured = peak_rss_bytes() - baseline
    if estimate is not None:
        log.info("evaluation peak %.2f GB above the runtime (predicted %.2f GB, at its %s step)", measured / 1e9,
                 estimate.peak_bytes / 1e9, estimate.peak_at)
    table.save_csv(out / "metrics.csv")
    table.save_summary_json(out / "summary.json")
    summary = table.summary()
    log.info("evaluated %d %s cases of %s: mean Dice WT %.3f", len(table), split, run_dir, summary["dice_wt"]["mean"])
    return summary
