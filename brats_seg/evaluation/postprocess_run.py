"""A run's post-processing as evaluation applies it: ``<run_dir>/postprocess.json`` read back when it
was chosen for this checkpoint, these inference settings and these val cases, else chosen now on
the run's val split (:func:`~brats_seg.evaluation.postprocess.choose_postprocessing`) and written.
An ensemble of a cross-validation's folds (:mod:`~brats_seg.evaluation.inference.ensemble`) chooses
on every fold's val cases together, each predicted by the fold that held it out, as nnU-Net does.

The rules themselves and how they are chosen: :mod:`brats_seg.evaluation.postprocess`. Nothing here
imports TensorFlow at module level.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np

from brats_seg.config import EvaluateConfig, TrainConfig
from brats_seg.evaluation.inference.ensemble import ensemble_size
from brats_seg.evaluation.inference.ensemble_model import member_for
from brats_seg.evaluation.inference.entries import prepare_run_entries, split_case_ids
from brats_seg.evaluation.inference.predict import check_native_shape, predict_case_labels, predict_case_native
from brats_seg.evaluation.inference.run import (
    RunError,
    inference_device,
    inference_policy,
    load_run_model,
    run_regions,
)
from brats_seg.evaluation.postprocess import (
    POSTPROCESS_KIND,
    POSTPROCESS_VERSION,
    PostprocessError,
    PostProcessing,
    ValidationCase,
    choose_postprocessing,
)
from brats_seg.evaluation.scoring.score import load_reference
from brats_seg.oom_inference import check_inference_memory, inference_memory_guard
from brats_seg.run_dir import RunFolder

__all__ = ["postprocessing_for_run"]

log = logging.getLogger(__name__)


def _postprocess_key(
    checkpoint_identity: dict | None, eval_cfg: EvaluateConfig, config: TrainConfig, val_ids: list[str]
) -> dict | None:
    """What the choice depends on: the weights, the settings that make the thresholded map, the
    regions and the val cases. None for a model in memory (the choice is not kept)."""
    if checkpoint_identity is None:
        return None
    return json.loads(
        json.dumps(
            {
                "checkpoint": checkpoint_identity,
                "threshold": float(eval_cfg.threshold),
                "mode": str(eval_cfg.mode),
                "window": [int(w) for w in eval_cfg.window],
                "window_overlap": float(eval_cfg.window_overlap),
                "mirror": bool(eval_cfg.mirror),
                "layout": str(config.data.layout),
                "regions": list(run_regions(config)),
                "val_cases": list(val_ids),
            }
        )
    )


def _recorded_postprocessing(folder: RunFolder, key: dict, layout: str) -> PostProcessing | None:
    """The rules of ``postprocess.json`` if it was chosen for ``key``; None (choose again) otherwise."""
    path = folder.postprocess_path
    try:
        record = folder.read_postprocess()
    except RunError as e:
        log.warning("%s; choosing the post-processing again", e)
        return None
    if record is None:
        return None
    if record.get("kind") != POSTPROCESS_KIND or record.get("chosen_for") != key:
        log.info(
            "%s was chosen for another checkpoint, other inference settings or other val cases: "
            "choosing the post-processing again on the val split",
            path,
        )
        return None
    try:
        return PostProcessing.from_rules(record.get("rules"), layout, str(path))
    except PostprocessError as e:
        log.warning("%s; choosing the post-processing again", e)
        return None


def postprocessing_for_run(
    run_dir: str | Path,
    config: TrainConfig,
    eval_cfg: EvaluateConfig,
    checkpoint: str = "best",
    model=None,
    progress: bool = True,
    load_model=None,
    checkpoint_identity: dict | None = None,
):
    """The post-processing an evaluation of the run applies, and the model if it was loaded for it.

    ``evaluate.postprocess=none``: None. Otherwise the rules of ``<run_dir>/postprocess.json``
    when it was chosen for this checkpoint (size and SHA-256), these inference settings and
    these val cases; else they are chosen now on the run's val split
    (:func:`~brats_seg.evaluation.postprocess.choose_postprocessing`: the val cases are
    predicted, thresholded and scored under each candidate) and written to that file (not
    for a model passed in memory, which has no checkpoint to name).

    Args:
        run_dir, checkpoint: the run and which checkpoint is evaluated.
        config: the run's own config (its dataset holds the val cases).
        eval_cfg: the inference settings.
        model: a loaded model, or None (loaded here only if the rules must be chosen).
        progress: tqdm bars.
        load_model: ``load_model(records) -> model``, how to load it (the caller's memory check
            and estimate); None: checked against the val cases and loaded here.
        checkpoint_identity: the checkpoint's identity if the caller has read it (else read here).

    Returns:
        ``(rules or None, model or None)``.
    """
    from tqdm.auto import tqdm

    if str(eval_cfg.postprocess) == "none":
        return None, model
    folder = RunFolder(Path(run_dir).expanduser())
    val_ids = split_case_ids(run_dir, "val")
    if model is None and checkpoint_identity is None:
        checkpoint_identity = folder.checkpoint_identity(checkpoint)
    key = _postprocess_key(checkpoint_identity if model is None else None, eval_cfg, config, val_ids)
    if key is not None:
        rules = _recorded_postprocessing(folder, key, config.data.layout)
        if rules is not None:
            log.info("post-processing (%s): %s", folder.postprocess_path, rules.describe())
            return rules, model
    if not val_ids:
        log.warning(
            "the run %s has no val cases to choose post-processing on: masks are written as thresholded "
            "(pass evaluate.postprocess=none to say so)",
            run_dir,
        )
        return None, model
    entries = prepare_run_entries(config, val_ids, progress)
    device, policy = inference_device(), inference_policy()
    records = [e.meta["record"] for e in entries]
    members = ensemble_size(run_dir)
    if model is None and load_model is not None:
        model = load_model(records)
    elif model is None:
        check_inference_memory(config, eval_cfg, device, policy, records, members=members)
        model = load_run_model(run_dir, checkpoint, config)
    names = run_regions(config)
    cases = []
    with inference_memory_guard(config, eval_cfg, device, policy, records, members=members):
        for entry in tqdm(entries, desc="choosing post-processing (val)", unit="case", disable=not progress):
            probs = predict_case_native(
                member_for(model, entry.case_id, "val"),  # a fold ensemble: the fold that held the case out
                entry,
                entry.meta["record"],
                mode=eval_cfg.mode,
                window=eval_cfg.window,
                overlap=eval_cfg.window_overlap,
                mirror=eval_cfg.mirror,
            )
            ref_vol, ref = load_reference(entry.case_id, entry.meta["label"], entry.meta["layout"])
            check_native_shape(entry.case_id, entry.meta["label"], probs, ref.shape)
            labels, _ = predict_case_labels(probs, entry.meta["layout"], names, eval_cfg.threshold)
            cases.append(
                ValidationCase(
                    entry.case_id, labels, ref.astype(np.uint8), tuple(float(s) for s in ref_vol.spacing_mm)
                ).cropped()
            )
    rules, report = choose_postprocessing(cases, config.data.layout, names)
    before, after = report["unprocessed"], report["chosen"]
    log.info(
        "post-processing chosen on %d val cases: %s; val mean lesion-wise Dice (2023) %s, legacy Dice %s",
        len(cases),
        rules.describe(),
        ", ".join(f"{r.upper()} {before['lesion23_dice'][r]:.3f} -> {after['lesion23_dice'][r]:.3f}" for r in names),
        ", ".join(f"{r.upper()} {before['dice'][r]:.3f} -> {after['dice'][r]:.3f}" for r in names),
    )
    if key is not None:
        from datetime import datetime, timezone

        folder.write_postprocess(
            {
                "kind": POSTPROCESS_KIND,
                "version": POSTPROCESS_VERSION,
                "rules": rules.rules(),
                "described": rules.describe(),
                "chosen_for": key,
                "validation": report,
                "chosen_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            }
        )
    return rules, model
