"""Evaluate a training run on held-out cases, the BraTS way.

:func:`evaluate_run` (``scripts/evaluate.py``), per case of the run's split:

1. inference on the cached network-grid image (whole volume, or sliding windows);
2. undo the crop and the resampling: probabilities on the native RAS grid;
3. threshold (``evaluate.threshold``) -> the regions the model predicts -> one label map
   in the layout's own values (the nesting rule resolves non-nested regions), then the
   run's post-processing (``evaluate.postprocess=auto``: small components removed, a small
   ET relabelled as necrosis, as ``<run_dir>/postprocess.json`` says; it is chosen on the
   run's val split first when the file is missing or was chosen for another checkpoint or
   other inference settings: :mod:`brats_seg.evaluation.postprocess_run`);
4. that label map is written as NIfTI with the label file's affine and header, and every
   metric is computed from it against the ORIGINAL label file (loaded again, RAS, with its
   voxel spacing) by :func:`brats_seg.evaluation.scoring.score.score_case`, the function
   ``scripts/score.py`` uses on the written files: both give the same ``metrics.csv``;
5. an overlay PNG (FLAIR on the native grid, reference solid, prediction dashed).

Files, under ``<run_dir>/eval/<split>/``::

    metrics.csv                 case_id, dice_wt, ..., lesion23_hd95_<r> (brats_seg.evaluation.scoring.table)
    summary.json                n_cases, and mean/median/std/n/n_inf per metric column
    per_case.png                every case's Dice and HD95 per region (brats_seg.plots)
    predictions/<case_id>.nii.gz
    overlays/<case_id>.png
    cases/<case_id>.json        the case's metrics row and the fingerprint of what made it

An evaluation continues where it stopped. After each case its record is written (last,
atomically); the same command again takes a case's row from its record instead of
recomputing it while the record's fingerprint -- the checkpoint's size and SHA-256, every
``evaluate.*`` value, the regions and the cache entry's own fingerprint (case
files and preprocessing) -- still matches and the prediction (and overlay) it recorded are the
files in place. So a SIGTERM, SIGINT or SIGKILL costs at most the case in progress, and
``metrics.csv`` and ``summary.json`` come out as an uninterrupted run's (floats are kept at
full precision). An evaluation of a model passed in memory records nothing to reuse.

WT-only models (``model.out_channels=1``): only WT is scored; the other regions' columns
stay in metrics.csv (same columns for every run of a layout) as empty cells (``null``
statistics with ``n: 0`` in summary.json). Scoring their written masks with
``scripts/score.py`` scores TC/ET as empty predictions instead.

Nothing here imports TensorFlow at module level.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
from pathlib import Path

import numpy as np

from brats_seg.config import DataConfig, EvaluateConfig, TrainConfig
from brats_seg.data.cache import CacheEntry
from brats_seg.data.labels import labels_to_regions, region_names
from brats_seg.data.nifti import load_volume, save_mask
from brats_seg.evaluation.case_records import case_fingerprint, evaluation_key, record_case, reusable_row
from brats_seg.evaluation.inference.ensemble import ensemble_size
from brats_seg.evaluation.inference.ensemble_model import member_for
from brats_seg.evaluation.inference.entries import prepare_run_entries, split_case_ids
from brats_seg.evaluation.inference.predict import check_native_shape, predict_case_labels, predict_case_native
from brats_seg.evaluation.inference.run import (
    RunError,
    check_evaluate_config,
    inference_device,
    inference_policy,
    inference_settings,
    load_run_config,
    load_run_model,
    run_regions,
)
from brats_seg.evaluation.inference.start import check_run_dir
from brats_seg.evaluation.postprocess import PostProcessing
from brats_seg.evaluation.postprocess_run import postprocessing_for_run
from brats_seg.evaluation.scoring.score import load_reference, score_case
from brats_seg.evaluation.scoring.table import INF_DISTANCE_MM, MetricsTable
from brats_seg.locks import hold_lock, remove_stale_temporaries
from brats_seg.oom_inference import check_inference_memory, inference_memory_guard, measured_against_estimate
from brats_seg.patch_schedule import inference_patch
from brats_seg.run_dir import RunFolder
from brats_seg.signals import report_progress

__all__ = [
    "eval_dir",
    "evaluate_run",
    "split_case_ids",
]

log = logging.getLogger(__name__)

_EFFECT_COLUMNS = ("dice_", "lesion23_dice_", "lesion_dice_", "rq_", "pq_")  # summary.json: unprocessed means


def eval_dir(run_dir: str | Path, split: str) -> Path:
    """``<run_dir>/eval/<split>``: where an evaluation's files go."""
    return RunFolder(Path(run_dir).expanduser()).eval_dir(split)


def _flair_native(meta: dict) -> np.ndarray:
    """FLAIR ``(x, y, z)`` on the native RAS grid (first image file; MSD: 4D channel 0)."""
    first = meta["images"][0]
    if len(meta["images"]) == 1:
        return load_volume(first, meta["case_id"], expect_ndim=4).data[..., meta.get("channels", [0])[0]]
    return load_volume(first, meta["case_id"]).data


def _evaluate_case(
    model,
    entry: CacheEntry,
    config: TrainConfig,
    eval_cfg: EvaluateConfig,
    folder: RunFolder,
    split: str,
    postprocess: PostProcessing | None = None,
) -> tuple[dict, dict | None]:
    """Infer, invert, threshold, post-process, write and score one case.

    Returns:
        Its metrics row, and the row of the mask as thresholded if post-processing changed
        it (None: unchanged, the same row).
    """
    from brats_seg.evaluation.overlays import save_overlay

    meta = entry.meta
    case_id, layout = entry.case_id, meta["layout"]
    names = run_regions(config)
    probs = predict_case_native(
        model,
        entry,
        meta["record"],
        mode=eval_cfg.mode,
        window=eval_cfg.window,
        overlap=eval_cfg.window_overlap,
        mirror=eval_cfg.mirror,
    )  # (x, y, z, R) native RAS
    ref_vol, ref_labels = load_reference(case_id, meta["label"], layout)
    check_native_shape(case_id, meta["label"], probs, ref_labels.shape)
    labels, pred = predict_case_labels(probs, layout, names, eval_cfg.threshold)  # what is written, and its regions
    unprocessed = None
    if postprocess is not None and not postprocess.is_identity:
        processed = postprocess.apply(labels, layout, ref_vol.spacing_mm)
        if not np.array_equal(processed, labels):  # scored both ways: the effect is reported
            unprocessed = score_case(case_id, labels, ref_labels, ref_vol.spacing_mm, layout, names, reference=ref_vol)
            labels, pred = processed, labels_to_regions(processed, layout, names).astype(bool)
    save_mask(labels, ref_vol.original_affine, ref_vol.original_header, folder.prediction_file(split, case_id))
    metrics = score_case(case_id, labels, ref_labels, ref_vol.spacing_mm, layout, names, reference=ref_vol)
    if eval_cfg.overlays:
        dice = "  ".join(f"{r.upper()} {metrics[f'dice_{r}']:.3f}" for r in names)
        save_overlay(
            _flair_native(meta),
            labels_to_regions(ref_labels, layout, names),
            pred,
            folder.overlay_file(split, case_id),
            title=f"{case_id}  Dice {dice}",
            spacing_mm=ref_vol.spacing_mm,
            region_names=names,
        )
    return metrics, unprocessed


def _plot_cases(table: MetricsTable, path: Path, title: str) -> None:
    """Each case's Dice and HD95 per region, beside ``summary.json`` (for people to look at)."""
    from brats_seg.plots import plot_case_scores

    dice = {r: table.values(f"dice_{r}") for r in table.regions}
    hd95 = {r: table.values(f"hd95_{r}") for r in table.regions}
    plot_case_scores(table.case_ids, dice, hd95, path, title=title, penalty_mm=INF_DISTANCE_MM)


def _metrics_columns(path: Path) -> dict[str, list]:
    """``metrics.csv`` as ``{column: values}`` (undefined values NaN), for MLflow's table artifact."""
    table = MetricsTable.load_csv(path)
    return {"case_id": list(table.case_ids), **{c: table.values(c).tolist() for c in table.columns[1:]}}


def _log_to_mlflow(
    run_dir: Path, config: TrainConfig, name: str, summary: dict, out: Path, split: str, case_ids: list[str]
) -> None:
    """Log to the run's MLflow run: summary statistics (the mean of each column in
    ``Eval <name>/<column>``, the median and std after it:
    :func:`~brats_seg.tracking.names.evaluation_metric_key`), the cases scored as the dataset input
    ``<data.name>/eval/<split>`` (context ``evaluation``: :mod:`brats_seg.tracking.datasets`), the
    eval folder (artifacts ``eval/<name>``) and ``metrics.csv`` as the table artifact
    ``eval/<name>/metrics_table.json`` (shown as a table by MLflow's UI); never fails the evaluation."""
    try:
        from brats_seg.tracking import Tracker, evaluation_metric_key
        from brats_seg.tracking.datasets import evaluated_input

        metrics = {
            evaluation_metric_key(name, column, stat): value
            for column, stats in summary.items()
            if isinstance(stats, dict)
            for stat, value in stats.items()
            if stat in ("mean", "median", "std") and math.isfinite(value)
        }
        # The run's own tracking settings; no system metrics for a short evaluation.
        tracker = Tracker.resume(run_dir, dataclasses.replace(config.tracking, system_metrics=False))
        with tracker:
            tracker.log_metrics(metrics, step=0)
            tracker.log_datasets([evaluated_input(config.data, config.resolution, split, case_ids)])
            tracker.log_artifacts(out, f"eval/{name}")
            tracker.log_table(_metrics_columns(out / "metrics.csv"), f"eval/{name}/metrics_table.json")
            postprocess = RunFolder(run_dir).postprocess_path
            if postprocess.is_file():  # the rules the masks were written with, and their val scores
                tracker.log_artifact(postprocess)
    except Exception as e:  # noqa: BLE001 - tracking is best effort: the files on disk are the result
        log.warning("could not log the evaluation to MLflow (%s: %s); the files are in %s", type(e).__name__, e, out)


def evaluate_run(
    run_dir: str | Path,
    split: str = "test",
    checkpoint: str = "best",
    eval_cfg: EvaluateConfig | None = None,
    progress: bool = True,
    model=None,
    data: DataConfig | None = None,
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
        data: another dataset holding the split's case ids, in the run's layout (e.g. the
            same cases acquired as another scanner would: ``data=mni_gliomas_shifted``); its
            files go to ``eval/<split>@<data.name>/``. None: the run's own dataset.

    Returns:
        The summary written to summary.json: ``{"n_cases": n, "<column>": {"mean",
        "median", "std", "n"}}`` for each metric column (NaN where a column has no value), and
        ``"postprocess"``: the rules applied (``{"rules", "described"}``) or None.

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
        check_evaluate_config(inference_settings(eval_cfg, config), config.model, inference_patch(config))
    eval_cfg = inference_settings(eval_cfg, config)  # a patch run infers by windows of its patch
    run_dir = Path(run_dir).expanduser()
    case_ids = split_case_ids(run_dir, split)
    if not case_ids:
        raise RunError(f"the {split} split of {run_dir / 'split.json'} is empty: nothing to evaluate; try split=all.")
    name, own = split, config  # post-processing is chosen on the run's own val cases
    if data is not None and data.name != config.data.name:
        if data.layout != config.data.layout:
            raise RunError(
                f"data={data.name} is in the {data.layout} layout, the run {run_dir} was trained on "
                f"{config.data.layout}: its labels and regions would not match."
            )
        config, name = dataclasses.replace(config, data=data), f"{split}@{data.name}"
    with hold_lock(eval_dir(run_dir, name), f"evaluation of the {name} split in"):  # one evaluation writes it
        summary = _evaluate_cases(run_dir, name, checkpoint, eval_cfg, progress, model, config, case_ids, own)
    _log_to_mlflow(run_dir, config, name, summary, eval_dir(run_dir, name), split, case_ids)  # the lock gone first
    return summary


def _evaluate_cases(
    run_dir: Path,
    split: str,
    checkpoint: str,
    eval_cfg: EvaluateConfig,
    progress: bool,
    model,
    config: TrainConfig,
    case_ids: list[str],
    own: TrainConfig,
) -> dict:
    """:func:`evaluate_run` once its inputs are checked and its output folder locked (``own``: the
    run's config with its own dataset, whose val cases post-processing is chosen on)."""
    from tqdm.auto import tqdm

    folder = RunFolder(run_dir)
    out = folder.eval_dir(split)
    remove_stale_temporaries(out)  # a killed evaluation's (the folder is locked)
    entries = prepare_run_entries(config, case_ids, progress)
    # Read before the model is loaded: a checkpoint saved meanwhile shows as another identity.
    identity = folder.checkpoint_identity(checkpoint) if model is None else None
    from brats_seg.lms.runtime.stats import current_rss_bytes, peak_rss_bytes, reset_peak_rss

    baseline = current_rss_bytes()  # the runtime, before the model (what the estimate is above)
    reset_peak_rss()
    estimate = None

    members = ensemble_size(run_dir)

    def load(records):  # predicted to fit lms.limit (the val cases' and these), or refused before it is loaded
        nonlocal estimate
        every = [*records, *(e.meta["record"] for e in entries)]
        estimate = check_inference_memory(
            config, eval_cfg, inference_device(), inference_policy(), every, members=members
        )
        return load_run_model(run_dir, checkpoint, config)

    postprocess, model = postprocessing_for_run(run_dir, own, eval_cfg, checkpoint, model, progress, load, identity)
    key = evaluation_key(identity, eval_cfg, config, postprocess, inference_policy())
    fingerprints = {e.case_id: case_fingerprint(key, e) for e in entries} if key is not None else {}
    rows = {
        e.case_id: row
        for e in entries
        if key is not None
        and (row := reusable_row(folder, split, e.case_id, fingerprints[e.case_id], eval_cfg.overlays)) is not None
    }
    if rows:
        log.info(
            "%s split: %d of %d cases were evaluated before with this checkpoint and these settings; "
            "their rows are reused (%s)",
            split,
            len(rows),
            len(entries),
            folder.eval_cases_dir(split),
        )
    todo = [e for e in entries if e.case_id not in rows]
    records = [entry.meta["record"] for entry in todo]
    guard = contextlib.nullcontext()
    if todo:
        device, policy = inference_device(), inference_policy()
        if model is None:
            model = load(records)
        # running out of memory anyway: the estimate, the measured peak and what lowers it
        guard = inference_memory_guard(
            config, eval_cfg, device, policy, records, baseline_bytes=baseline, members=members
        )
    table = MetricsTable(region_names(config.data.layout))
    unprocessed = MetricsTable(region_names(config.data.layout))  # as thresholded: the post-processing's effect
    changed = 0
    bar = tqdm(entries, desc=f"evaluating {split}", unit="case", disable=not progress)
    report_progress(f"0 of {len(entries)} cases")
    with guard:
        for i, entry in enumerate(bar):
            reused = rows.get(entry.case_id)
            if reused is None:
                # a fold ensemble's val case: the fold that held it out (the cross-validation prediction)
                predictor = member_for(model, entry.case_id, split.split("@")[0])
                row, raw = _evaluate_case(predictor, entry, config, eval_cfg, folder, split, postprocess)
                if key is not None:  # last: the case is complete
                    record_case(folder, split, entry.case_id, fingerprints[entry.case_id], eval_cfg.overlays, row, raw)
            else:
                row, raw = reused
            table.add(entry.case_id, row)
            unprocessed.add(entry.case_id, row if raw is None else raw)
            changed += raw is not None
            report_progress(f"{i + 1} of {len(entries)} cases")
            bar.set_postfix(dice_wt=f"{row['dice_wt']:.3f}")
    if estimate is not None:
        log.info("evaluation %s", measured_against_estimate(peak_rss_bytes() - baseline, estimate))
    table.save_csv(out / "metrics.csv")
    # the rules applied (chosen on the val split: postprocess.json says how) and their effect; null: none
    applied = (
        None
        if postprocess is None
        else {
            "rules": postprocess.rules(),
            "described": postprocess.describe(),
            "cases_changed": changed,
            "unprocessed_mean": {
                c: s["mean"] if math.isfinite(s["mean"]) else None
                for c, s in unprocessed.summary().items()
                if c.startswith(_EFFECT_COLUMNS)
            },
        }
    )
    table.save_summary_json(out / "summary.json", extra={"postprocess": applied})
    _plot_cases(table, folder.case_scores_figure(split), f"{run_dir.name}, {split} split")
    summary = {**table.summary(), "postprocess": applied}
    log.info(
        "evaluated %d %s cases of %s (%d computed now, %d reused): mean Dice WT %.3f",
        len(table),
        split,
        run_dir,
        len(todo),
        len(rows),
        summary["dice_wt"]["mean"],
    )
    return summary
