#!/usr/bin/env python
"""Segment new (unlabelled) cases with a trained run's model.

    python scripts/predict.py run_dir=outputs/<run> input=/data/new/CASE output=/out
    python scripts/predict.py run_dir=outputs/<run> input=/data/Task01_BrainTumour/imagesTs output=/out
    python scripts/predict.py run_dir=outputs/<run> input=cases.txt output=/out evaluate.mode=sliding
    python scripts/predict.py export=outputs/<run>/export input=/data/new/CASE output=/out   # an export
    python scripts/predict.py run_dir=outputs/folds/ensemble 'runs=[outputs/folds/fold_0,...]' input=... output=...

``export=`` (or ``run_dir=``) takes a folder ``scripts/export.py`` wrote: the same
preprocessing, inversion to the native grid, threshold and labels (the run's config is kept in the
export's ``preprocessing.json``), so the masks are those the run's checkpoint writes; whole-volume
inference only, in the precision the export was made in. (``model=`` would name the model config
group, hence ``export=``.)

The masks are post-processed as the run's ``postprocess.json`` says (chosen on its val split by
``scripts/evaluate.py``; an export carries it): small components removed, a small ET relabelled as
necrosis. ``evaluate.postprocess=none`` writes them as thresholded.

``runs=[...]`` makes ``run_dir`` the ensemble of those runs and predicts with the mean of their
probabilities (``brats_seg.evaluation.inference.ensemble``; post-processing as the ensemble's
``postprocess.json`` says, chosen by ``scripts/evaluate.py`` on the folds' val cases together).

``input`` is a BraTS case folder, an MSD-style 4D image (FLAIR, T1, T1ce, T2), a folder
of 4D images, a ``.txt`` list of either (one per line), or a dataset root. Writes
``<output>/<case_id>.nii.gz`` in the run's layout labels (WT-only models: the layout's
edema label), or in ``labels=<layout>``'s (``labels=brats2023``: ET 3, as the BraTS 2023-2025
challenges score; ``labels=brats2021``: ET 4), on the grid and with the affine/header of each
case's first image file, and ``<output>/overlays/<case_id>.png``. The BraTS challenges' container
shape is ``input=/input output=/output evaluate.overlays=false``: a folder of case folders in, one
``<case_id>.nii.gz`` per case out (the image's default command; docs/installation.md). Exits 2 with a message on bad input. SIGTERM/SIGINT
stop it with exit status 75; the same command then skips the cases already written by the same
model with the same settings (``<output>/predict.json``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from brats_seg.cli import given_override, hydra_entry, to_config, user_errors
from brats_seg.script_configs import register_configs

register_configs()


@hydra_entry("../configs", "predict")
def main(cfg) -> None:
    conf = to_config(cfg)
    from brats_seg.data.predict_inputs import find_input_cases
    from brats_seg.evaluation.inference.predict import check_labels
    from brats_seg.evaluation.inference.run import RunError, run_regions
    from brats_seg.evaluation.inference.start import InferenceStart, start_inference
    from brats_seg.evaluation.serving.exported import export_precision, predict_source, prediction_postprocessing
    from brats_seg.resolve import resolve_inference

    with user_errors("prediction"):  # TensorFlow-free checks first
        if not str(conf.output).strip():
            raise RunError("output is not set: pass output=<folder for the masks>.")
        check_labels(conf.labels, RunError)
        if conf.runs:
            from brats_seg.evaluation.inference.ensemble import make_ensemble

            if str(conf.export).strip():
                raise RunError("runs= and export= together: an ensemble is made of training runs' folders.")
            make_ensemble(conf.run_dir, conf.runs, conf.checkpoint)
        export = predict_source(conf.run_dir, conf.export, conf.evaluate)  # None: a training run
        if export is None:  # as scripts/evaluate.py starts
            given = given_override("backend.precision")
            start = start_inference(conf.run_dir, conf.checkpoint, conf.evaluate, conf.backend, given)
        else:  # the precision the export's graph was traced in
            precision = export_precision(export, given_override("backend.precision"))
            backend = dataclasses.replace(conf.backend, precision=precision)
            start = InferenceStart(export.config, conf.evaluate, resolve_inference(export.config, backend, True))
        run, settings, backend = start.run, start.evaluate, start.backend
        cases = find_input_cases(conf.input, run.data.layout)
        # the rules chosen on the run's val split (scripts/evaluate.py), as the run or the export holds them
        postprocess = prediction_postprocessing(conf.run_dir, export, run, settings, conf.checkpoint)

    from brats_seg.backend import configure
    from brats_seg.data.prep_memory import prediction_records
    from brats_seg.lms.runtime.stats import current_rss_bytes, peak_rss_bytes, reset_peak_rss

    with user_errors("prediction"):
        configure(backend)
    from brats_seg.evaluation.inference.ensemble import ensemble_size
    from brats_seg.evaluation.inference.predict import predict_new_cases
    from brats_seg.evaluation.inference.run import inference_policy, load_run_model
    from brats_seg.oom_inference import check_inference_memory, inference_memory_guard, measured_against_estimate
    from brats_seg.run_dir import RunFolder

    with user_errors("prediction"):  # predicted to fit lms.limit, or refused before the model is loaded
        members = 1 if export is not None else ensemble_size(conf.run_dir)
        # the largest case's grids and preprocessing, from the files' headers
        records = prediction_records(cases, run.resolution.spacing_mm, run.resolution.shape)
        baseline = current_rss_bytes()  # the runtime, before the model (what the estimate is above)
        reset_peak_rss()
        estimate = check_inference_memory(run, settings, backend.device, inference_policy(), records, False, members)
        if export is None:
            # read before loading: a checkpoint saved meanwhile shows as another model in predict.json
            identity = {"checkpoint": RunFolder.of(conf.run_dir).checkpoint_identity(conf.checkpoint)}
            model = load_run_model(conf.run_dir, conf.checkpoint, run)
        else:
            from brats_seg.evaluation.serving.exported import load_exported_model

            identity, model = export.identity, load_exported_model(export.folder)
        identity = {**identity, "policy": inference_policy()}  # bf16 and fp32 masks of one model differ
        with inference_memory_guard(
            run, settings, backend.device, inference_policy(), records, False, baseline, members=members
        ):
            written = predict_new_cases(
                model,
                cases,
                run,
                conf.output,
                settings,
                model_identity=identity,
                postprocess=postprocess,
                labels=conf.labels,
            )
    peak = peak_rss_bytes() - baseline
    regions = run_regions(run)
    labels = "WT only (edema label)" if regions == ("wt",) else "/".join(r.upper() for r in regions)
    print(f"\nwrote {len(written)} mask(s) ({conf.labels or run.data.layout} labels, {labels}) to {Path(conf.output)}")
    if settings.mode == "sliding":
        print(f"inference: sliding windows of {'x'.join(map(str, settings.window))} (Gaussian blending)")
    print(f"post-processing: {postprocess.describe() if postprocess is not None else 'none'}")
    for path in written[:10]:
        print(f"  {path}")
    if len(written) > 10:
        print(f"  ... and {len(written) - 10} more")
    if settings.overlays:
        print(f"overlays in {Path(conf.output) / 'overlays'}")
    if backend.device == "CPU":  # the process's RSS is the device's memory
        print(f"memory: {measured_against_estimate(peak, estimate)}")


if __name__ == "__main__":
    main()
