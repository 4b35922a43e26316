"""MLflow's "models from code" file of a brats-seg model: the SavedModel export behind ``mlflow.pyfunc``.

THIS FILE MUST NOT IMPORT brats_seg, NOR ANYTHING BUT THE STANDARD LIBRARY, mlflow, numpy AND
tensorflow. MLflow copies it into every logged model and runs it wherever the model is loaded
(``mlflow.pyfunc.load_model``, ``mlflow models serve``), in a process that need not have brats_seg
installed. brats_seg never imports it either: it hands MLflow its path
(:mod:`brats_seg.evaluation.serving.mlflow_model`).

The model's artifacts are the export of :mod:`brats_seg.evaluation.serving.export`: ``saved_model`` (the
SavedModel folder) and ``preprocessing`` (its ``preprocessing.json``, what the input must be and
how the output becomes a label map). ``predict`` takes a float32 array ``(batch, x, y, z, 4)``,
channels-last RAS (FLAIR, T1, T1ce, T2) preprocessed onto the run's network grid, and returns
float32 ``(batch, x, y, z, R)``: the sigmoid probability of each region, in the order of
``preprocessing.json``'s ``regions`` -- what the SavedModel's ``serving_default`` signature
returns, so the same numbers as the run's Keras model and ``predict.py``'s network grid.
MLflow checks the input against the logged signature before ``predict`` sees it.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlflow
import numpy as np

SAVED_MODEL = "saved_model"  # the artifact key of the SavedModel folder
PREPROCESSING = "preprocessing"  # the artifact key of its preprocessing.json


class BratsSegModel(mlflow.pyfunc.PythonModel):
    """A brats-seg export as an MLflow pyfunc model: ``predict(volume) -> probabilities``."""

    def load_context(self, context) -> None:
        import tensorflow as tf

        self.description = json.loads(Path(context.artifacts[PREPROCESSING]).read_text())
        signature = self.description["signature"]
        self._input_name = signature["input"]["name"]  # "image"
        self._output_name = signature["output"]["name"]  # "probabilities"
        self._loaded = tf.saved_model.load(context.artifacts[SAVED_MODEL])  # kept: its signature uses its variables
        self._serve = self._loaded.signatures[signature["name"]]

    def predict(self, context, model_input: np.ndarray, params: dict | None = None) -> np.ndarray:
        """``(batch, x, y, z, 4)`` float32 -> ``(batch, x, y, z, R)`` float32 probabilities."""
        import tensorflow as tf

        image = tf.constant(np.asarray(model_input, dtype=np.float32))
        return self._serve(**{self._input_name: image})[self._output_name].numpy()


mlflow.models.set_model(BratsSegModel())
