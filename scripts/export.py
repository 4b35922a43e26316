#!/usr/bin/env python
"""Export a trained run's model as a TensorFlow SavedModel that serves without brats_seg.

    python scripts/export.py run_dir=outputs/<run>                        # best checkpoint -> outputs/<run>/export
    python scripts/export.py run_dir=outputs/<run> checkpoint=last output=/models/brats/1
    python scripts/export.py run_dir=outputs/<run> backend.precision=bf16  # a bf16 graph (default fp32)

Writes ``<output>/`` (default ``<run_dir>/export``): the SavedModel, whose ``serving_default``
signature takes ``image`` float32 ``(batch, x, y, z, 4)`` (FLAIR, T1, T1ce, T2, channels-last RAS,
preprocessed onto the run's network grid) and returns ``probabilities`` float32
``(batch, x, y, z, R)``, one sigmoid channel per region; and ``preprocessing.json``, what the input
must be (spacing, orientation, grid, crop, normalisation) and how the output becomes a label map
(threshold, paint order), with the run's config and the brats_seg version it came from. Load it
with ``tf.saved_model.load(output)`` or serve it with TF Serving; ``scripts/predict.py
export=<output>`` predicts with it as with the run. The folder appears complete or not at all; a
previous export there is replaced. When the run has an MLflow run (``mlflow.json``), the export is
also logged into it as an MLflow model (``runs:/<run_id>/model`` for the best checkpoint,
``model_last`` for the last) that ``mlflow.pyfunc.load_model`` loads without brats_seg, and
registered as the run's ``tracking.register_as`` if set (:mod:`brats_seg.evaluation.serving.mlflow_model`);
a failure there is a warning. Exits 2 with a message on a bad run folder, checkpoint or output.
"""

from __future__ import annotations

from brats_seg.cli import hydra_entry, to_config, user_errors
from brats_seg.script_configs import register_configs

register_configs()


@hydra_entry("../configs", "export")
def main(cfg) -> None:
    conf = to_config(cfg)
    from brats_seg.evaluation.inference.start import check_run_dir
    from brats_seg.evaluation.serving.export import check_export_output, default_export_dir

    with user_errors("export"):  # TensorFlow-free checks first
        run = check_run_dir(conf.run_dir, conf.checkpoint)
        output = check_export_output(conf.output if str(conf.output).strip() else default_export_dir(conf.run_dir))

    from brats_seg.backend import configure
    from brats_seg.resolve import resolve_inference

    with user_errors("export"):
        configure(resolve_inference(run, conf.backend, True))  # the command's precision
    from brats_seg.evaluation.serving.export import DESCRIPTION_FILE, export_run
    from brats_seg.evaluation.serving.mlflow_model import log_export_to_run

    with user_errors("export"):
        folder = export_run(conf.run_dir, output, conf.checkpoint, conf.format, run)
    logged = log_export_to_run(conf.run_dir, folder, conf.checkpoint, run)  # never raises: a failure is a warning
    print(f"\nexported {conf.run_dir} (checkpoint {conf.checkpoint}, {conf.backend.precision}) to {folder}")
    print(f"  SavedModel          {folder}  (signature serving_default: image -> probabilities)")
    print(f"  {DESCRIPTION_FILE:<18}  {folder / DESCRIPTION_FILE}")
    print(f"  predict with it:    python scripts/predict.py export={folder} input=<case> output=<folder>")
    if logged is not None:
        print(
            f"  MLflow model        {logged.run_uri}  ({logged.model_uri}): "
            f"mlflow.pyfunc.load_model('{logged.run_uri}').predict(volume)"
        )
        if logged.version is not None:
            print(f"  registered          {run.tracking.register_as!r} version {logged.version}")


if __name__ == "__main__":
    main()
