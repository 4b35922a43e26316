"""Serving: a run's model outside brats_seg, as a SavedModel and as an MLflow model, and read back.

::

    export        a run's model as a TensorFlow SavedModel that serves without brats_seg
                  (signature serving_default: image -> probabilities) and its preprocessing.json:
                  export_run, describe_export
    exported      an export read back for prediction: read_export (no TensorFlow) and
                  ExportedModel, which stands where the Keras model stands in predict
    mlflow_model  the export logged to the run's MLflow run as an MLflow pyfunc model that loads,
                  serves and registers without brats_seg: log_best_model (training's end),
                  log_export_to_run (scripts/export.py)

export builds the model with inference.run and puts sliding's windows in its graph; exported
reads an export's preprocessing.json back into the run's config, so predicting with it goes
through inference.predict as the run does; mlflow_model logs what export wrote, with
brats_seg/tracking/pyfunc_model.py (a file MLflow copies into the model, which imports no
brats_seg) as its code: a logged model names no module of this package.
"""
