"""MLflow's "models from code" file of a brats-seg model: the SavedModel export behind ``mlflow.pyfunc``.

THIS FILE IMPORTS ONLY THE STANDARD LIBRARY, mlflow, numpy AND tensorflow AT ITS TOP. MLflow copies
it into every logged model and runs it wherever the model is loaded (``mlflow.pyfunc.load_model``,
``mlflow models serve``). brats_seg never imports it either: it hands MLflow its path
(:mod:`brats_seg.evaluation.serving.mlflow_model`).

The model's artifacts are the export of :mod:`brats_seg.evaluation.serving.export`: ``saved_model`` (the
SavedModel folder) and ``preprocessing`` (its ``preprocessing.json``, what the input must be and
how the output becomes a label map). ``predict`` takes either

- a float32 array ``(batch, x, y, z, 4)``, channels-last RAS (FLAIR, T1, T1ce, T2) preprocessed
  onto the run's network grid, and returns float32 ``(batch, x, y, z, R)``: the sigmoid
  probability of each region, in the order of ``preprocessing.json``'s ``regions`` -- what the
  SavedModel's ``serving_default`` signature returns. This path needs no brats_seg; or
- raw cases: each its four NIfTI files (paths, or the files' bytes; base64 text over HTTP),
  as a DataFrame, a dict or a list of dicts, and returns a DataFrame with each case's label map
  as a gzipped NIfTI on its own grid (and its probabilities with ``params={"probabilities":
  True}``): :mod:`brats_seg.evaluation.serving.nifti_request`, which runs ``predict.py``'s
  preprocessing, inversion and post-processing. That path imports brats_seg, from the copy of
  the package the model carries (``code/``, MLflow's ``code_paths``), so a model loads and
  serves with its own version of that code wherever it goes.

A bad request (a missing contrast, a file that is not NIfTI, contrasts on different grids, an
array of the wrong shape) raises :class:`BadRequest`: MLflow's scoring server answers it with
HTTP 400 and its one line.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlflow
import mlflow.exceptions
import mlflow.protos.databricks_pb2
import numpy as np

SAVED_MODEL = "saved_model"  # the artifact key of the SavedModel folder
PREPROCESSING = "preprocessing"  # the artifact key of its preprocessing.json


class BadRequest(mlflow.exceptions.MlflowException):
    """A request the model cannot answer: HTTP 400 with one line saying why.

    MLflow's scoring server prefixes the message of an ``MlflowException`` raised by ``predict``
    with the whole request (``Failed to predict data '<request>'``): megabytes of base64 for a
    case sent as bytes. The message set here is kept as it is.
    """

    def __init__(self, line: str) -> None:
        self._line = line
        super().__init__(line, error_code=mlflow.protos.databricks_pb2.INVALID_PARAMETER_VALUE)

    @property
    def message(self) -> str:
        return self._line

    @message.setter
    def message(self, value: str) -> None:  # MLflow's prefix: not taken
        pass


class BratsSegModel(mlflow.pyfunc.PythonModel):
    """A brats-seg export as an MLflow pyfunc model: ``predict(volume) -> probabilities``, or
    ``predict(cases) -> label maps`` (module doc)."""

    def load_context(self, context) -> None:
        import tensorflow as tf

        self.description = json.loads(Path(context.artifacts[PREPROCESSING]).read_text())
        signature = self.description["signature"]
        self._input_name = signature["input"]["name"]  # "image"
        self._output_name = signature["output"]["name"]  # "probabilities"
        self._grid = [int(s) for s in signature["input"]["shape"][1:]]  # x, y, z, 4
        self._folder = context.artifacts[SAVED_MODEL]
        self._loaded = tf.saved_model.load(self._folder)  # kept: its signature uses its variables
        self._serve = self._loaded.signatures[signature["name"]]
        self._cases = None  # the raw-case server, made at the first such request

    def predict(self, context, model_input, params: dict | None = None):
        """A volume ``(batch, x, y, z, 4)`` -> probabilities ``(batch, x, y, z, R)``; raw cases ->
        a DataFrame of label maps (module doc). ``params``: ``probabilities`` (bool, raw cases:
        also return them), ``labels`` (a layout whose label values to write; empty: the run's)."""
        params = params or {}
        if _is_volume(model_input):
            return self._probabilities(np.asarray(model_input))
        if self._cases is None:
            from brats_seg.evaluation.serving.nifti_request import NiftiServer  # the model's own copy (code/)

            self._cases = NiftiServer.load(self._folder, self._loaded)
        from brats_seg.evaluation.serving.nifti_request import RequestError

        try:
            return self._cases.segment(
                model_input, probabilities=bool(params.get("probabilities")), labels=str(params.get("labels") or "")
            )
        except RequestError as e:
            raise BadRequest(str(e)) from None

    def _probabilities(self, volume: np.ndarray) -> np.ndarray:
        import tensorflow as tf

        if volume.ndim == 4:
            volume = volume[None]
        if volume.ndim != 5 or list(volume.shape[1:]) != self._grid:
            raise BadRequest(
                f"a volume of shape {list(volume.shape)}: this model takes (batch, {', '.join(map(str, self._grid))}) "
                "(FLAIR, T1, T1ce, T2 on the run's network grid), or raw cases as NIfTI files."
            )
        image = tf.constant(volume.astype(np.float32, copy=False))
        return self._serve(**{self._input_name: image})[self._output_name].numpy()


def _is_volume(model_input) -> bool:
    """Whether the input is a numeric array (a preprocessed volume), not raw cases."""
    if isinstance(model_input, np.ndarray):
        return model_input.dtype.kind in "fiu"
    if isinstance(model_input, list) and model_input and not isinstance(model_input[0], dict):
        try:
            return np.asarray(model_input).dtype.kind in "fiu"
        except ValueError:
            return False
    return False


mlflow.models.set_model(BratsSegModel())
