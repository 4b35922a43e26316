"""A run's model in its MLflow run: an MLflow model that serves raw NIfTI cases and preprocessed volumes.

What is logged, as the run's model ``model`` (``runs:/<run_id>/model``; in MLflow 3 a logged model,
``models:/<model_id>``)::

    MLmodel                    flavour python_function, "models from code", the params signature
    pyfunc_model.py            brats_seg/tracking/pyfunc_model.py
    code/brats_seg/            this brats_seg's package (MLflow's code_paths): the raw-case path's code
    artifacts/saved_model/     the SavedModel export (brats_seg.evaluation.serving.export), preprocessing.json in it
                               (scripts/export.py: under its export folder's name, e.g. export/)
    artifacts/preprocessing.json   what the input must be and how the output becomes a label map
    input_example.json serving_input_example.json   a zero volume, for grids of at most
                               INPUT_EXAMPLE_MAX_VALUES values (tiny); none above
    requirements.txt python_env.yaml conda.yaml   what the code needs, pinned to this environment

``predict`` takes a case as its four NIfTI files (paths or bytes; a DataFrame, one row per case)
and returns its label map on its own grid (:mod:`brats_seg.evaluation.serving.nifti_request`), or
takes a float32 volume ``(-1, x, y, z, 4)`` already on the run's network grid and returns the
SavedModel's probabilities ``(-1, x, y, z, R)`` (:mod:`brats_seg.tracking.pyfunc_model`). One
model takes both, so its signature declares no input schema (MLflow's schemas are either tensors
or columns), only its params (``probabilities``, ``labels``); the model checks the input itself
and answers a bad one with HTTP 400 and one line. The volume's shape is in ``preprocessing.json``
and the model's tags.

Why the model carries brats_seg (``code_paths``) rather than being served without it: a raw case
needs the run's preprocessing (reorientation, brain box, resampling onto the grid, normalisation),
the inversion to the native grid and the chosen post-processing. Written again inside the
model file, that would be a second copy of ``predict.py``'s path that drifts from it; MLflow's
own answer for custom code is ``code_paths``, which puts the package the model was made with
first on ``sys.path`` where it loads, so a served case is what ``predict.py export=`` writes, with
the code of that version. brats_seg is not on PyPI, so ``brats-seg==<version>`` as a requirement
would not install; its dependencies that the serving path imports are the requirements
(:data:`SERVING_REQUIREMENTS`, pinned to this environment). The volume path still needs only
mlflow, numpy and tensorflow.

Why a ``pyfunc`` over the SavedModel rather than ``mlflow.tensorflow.log_model`` on the Keras
model: the Keras flavour saves the ``.keras`` model, whose layers are brats_seg's own classes; the
SavedModel is a graph that needs TensorFlow only, it is the model as ``predict.py`` runs it (a patch
run's sliding windows are in the graph), and it comes with ``preprocessing.json``.

The input example is a zero volume (batch 1): MLflow stores an example as JSON (the serving copy
indented) and predicts it once while logging, to check that it serves. At tiny's 48x56x40 grid
(430,080 values) that is about 12 MB of JSON; at half (3.4 M values) it would be about 100 MB, at
full (27.5 M) 0.8 GB, so above :data:`INPUT_EXAMPLE_MAX_VALUES` it is left out.

When: at the end of a training that finished (chief, tracking on, a best checkpoint), the best
checkpoint is exported into a temporary folder and logged (:func:`log_best_model`);
``scripts/export.py`` logs the export it wrote into the run's MLflow run when the run has one
(:func:`log_export_to_run`). A model is told apart by its checkpoint's SHA-256, its precision and
the post-processing chosen for it (what ``preprocessing.json`` would say differently), tags of
the logged model: a run that already holds the same model (a finished run trained again, an export
after training) is not given it twice. ``tracking.register_as=<name>`` registers the model in the
Model Registry (:meth:`~brats_seg.tracking.Tracker.register_model`; a version already holding it
is kept). Nothing here raises: a failed export, log or registration is said once and the run
folder keeps the run; ``scripts/export.py`` logs it later.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import logging
import shutil
import tempfile
import time
from importlib import metadata
from pathlib import Path

import numpy as np

from brats_seg.config import TrainConfig
from brats_seg.evaluation.inference.run import load_run_config
from brats_seg.evaluation.serving.export import DESCRIPTION_FILE, describe_export, export_run
from brats_seg.files import atomic_dir
from brats_seg.run_dir import RunFolder
from brats_seg.tracking import Tracker

__all__ = [
    "INPUT_EXAMPLE_MAX_VALUES",
    "MODEL_NAME",
    "SERVING_REQUIREMENTS",
    "LoggedModel",
    "log_best_model",
    "log_export_to_run",
    "model_name",
]

log = logging.getLogger(__name__)

MODEL_NAME = "model"  # the best checkpoint's model: runs:/<run_id>/model
INPUT_EXAMPLE_MAX_VALUES = 500_000  # values in the example volume; tiny's 430,080 -> ~12 MB of MLflow's JSON
_PYFUNC_MODULE = "brats_seg.tracking.pyfunc_model"  # the models-from-code file (found, never imported)
# the logged model's tags that tell two models of a run apart (_identity)
_SHA_TAG, _POLICY_TAG = "brats_seg.checkpoint_sha256", "brats_seg.dtype_policy"
_POSTPROCESS_TAG = "brats_seg.postprocessing_sha256"
# What the served model imports, by distribution: the volume path (mlflow, numpy, tensorflow) and the
# raw-case path (brats_seg's copy in code/: NIfTI reading, resampling, the config's dataclasses,
# post-processing's components and the modules it imports with them, pandas for the answer); tests/unit/test_serving_nifti.py checks that
# every distribution a served raw case imports is one of these or a dependency of one.
SERVING_REQUIREMENTS = (
    "mlflow",
    "numpy",
    "tensorflow",
    "keras",
    "nibabel",
    "SimpleITK",
    "scipy",
    "omegaconf",
    "connected-components-3d",
    "surface-distance",
    "psutil",
    "tqdm",
    "pandas",
)


@dataclasses.dataclass(frozen=True)
class LoggedModel:
    """A model in a run's MLflow run.

    Attributes:
        run_uri: ``runs:/<run_id>/<name>``, what users load and serve.
        model_uri: ``models:/<model_id>``, the logged model itself.
        version: its version in the Model Registry under ``tracking.register_as``, or None.
    """

    run_uri: str
    model_uri: str
    version: str | None = None


def model_name(checkpoint: str) -> str | None:
    """The model's name in the run for a checkpoint: ``best`` -> ``model``, ``last`` ->
    ``model_last``; None for a ``.keras`` file given by path (not logged)."""
    return {"best": MODEL_NAME, "last": f"{MODEL_NAME}_last"}.get(str(checkpoint))


def log_best_model(tracker, run_dir: str | Path, step: int = 0) -> LoggedModel | None:
    """Training's end: log the run's best checkpoint as the MLflow model ``model``; register it as
    the tracker's ``register_as`` (``tracking.register_as``) if set.

    Call after :func:`brats_seg.backend.configure` (the export is traced under its dtype policy),
    with the run open in this thread. Nothing is done without a best checkpoint or with tracking
    off; a model the run already holds is not logged again (it is still registered). Never raises.

    Args:
        tracker: the run's :class:`~brats_seg.tracking.Tracker` (or ``NullTracker``).
        run_dir: the run folder.
        step: the epoch of the best checkpoint: the run's metrics at that step are linked to the model.

    Returns:
        The logged (or already logged) model, or None.
    """
    folder = RunFolder.of(run_dir)
    if not tracker.sending or not folder.checkpoint_file("best").is_file():
        return None
    try:
        import keras

        config = load_run_config(folder.root)
        description = describe_export(
            config,
            folder.root,
            "best",
            folder.checkpoint_identity("best"),
            keras.mixed_precision.global_policy().name,
            warn_unchosen=False,
        )
        uri = _held(tracker, MODEL_NAME, description)  # what the export would describe, without exporting
        if uri is None:
            with tempfile.TemporaryDirectory(prefix="brats-seg-mlflow-model-") as tmp:
                export = export_run(folder.root, Path(tmp) / "saved_model", "best", config=config, warn_unchosen=False)
                uri = _log_export(tracker, export, MODEL_NAME, step)
    except Exception as e:  # noqa: BLE001 - the run is trained; its folder is the result
        log.warning(
            "the best model was not logged to MLflow: exporting checkpoints/best.keras failed (%s: %s). The "
            "run folder %s keeps it; `python scripts/export.py run_dir=%s` exports and logs it.",
            type(e).__name__,
            e,
            run_dir,
            run_dir,
        )
        return None
    return _registered(tracker, MODEL_NAME, uri)


def log_export_to_run(
    run_dir: str | Path, export_dir: str | Path, checkpoint: str, config: TrainConfig
) -> LoggedModel | None:
    """``scripts/export.py``: log the export just written as an MLflow model of the run's MLflow run
    (the one ``mlflow.json`` names; nothing without it), unless the run already holds it, and
    register it as the run's ``tracking.register_as`` if set. Never raises.

    Returns:
        The logged model, or None.
    """
    name = model_name(checkpoint)
    if name is None:
        log.info("checkpoint %s is a file, not the run's best or last: the export is not logged to MLflow", checkpoint)
        return None
    try:
        state = RunFolder.of(run_dir).read_state() or {}
        step = state.get("best_epoch" if checkpoint == "best" else "epoch") or 0
        tracking = dataclasses.replace(config.tracking, system_metrics=False)  # a short job: no system metrics
        description = json.loads((Path(export_dir) / DESCRIPTION_FILE).read_text())
        with Tracker.resume(Path(run_dir), tracking, stage="export") as tracker:
            uri = _held(tracker, name, description) if tracker.sending else None
            if uri is None and tracker.sending:
                uri = _log_export(tracker, Path(export_dir), name, int(step))
            return _registered(tracker, name, uri)
    except Exception as e:  # noqa: BLE001 - the export on disk is the result
        log.warning("the export was not logged to MLflow (%s: %s); it is in %s", type(e).__name__, e, export_dir)
        return None


def _identity(description: dict) -> dict[str, str]:
    """What tells two models of a run apart: the checkpoint's SHA-256, the precision, the chosen
    post-processing (its digest; ``none``)."""
    chosen = description["postprocessing"]["chosen"]
    digest = "none" if chosen is None else hashlib.sha256(json.dumps(chosen, sort_keys=True).encode()).hexdigest()
    return {
        _SHA_TAG: str(description["run"]["checkpoint_sha256"]),
        _POLICY_TAG: str(description["precision"]["dtype_policy"]),
        _POSTPROCESS_TAG: digest,
    }


def _held(tracker, name: str, description: dict) -> str | None:
    """The URI of the run's model ``name`` that already holds the model ``description`` describes, or None."""
    identity = _identity(description)
    uri = tracker.find_model(name, identity)
    if uri is not None:
        log.info(
            "run %s already holds this model as %s (checkpoint %s, sha256 %s..., %s, post-processing %s): "
            "not logged again",
            tracker.run_id,
            uri,
            description["run"]["checkpoint"],
            identity[_SHA_TAG][:12],
            identity[_POLICY_TAG],
            "none" if identity[_POSTPROCESS_TAG] == "none" else "chosen",
        )
    return uri


def _registered(tracker, name: str, uri: str | None) -> LoggedModel | None:
    """The model ``uri`` of the run, registered as the tracker's ``register_as`` if set."""
    if uri is None:
        return None
    version = tracker.register_model(uri, tracker.register_as) if tracker.register_as else None
    return LoggedModel(f"runs:/{tracker.run_id}/{name}", uri, version)


def _log_export(tracker, export: Path, name: str, step: int) -> str | None:
    """Log the export folder ``export`` as the pyfunc model ``name``; its URI, or None."""
    description = json.loads((export / DESCRIPTION_FILE).read_text())
    signature, example = _signature(), _input_example(description)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="brats-seg-code-") as code:
        uri = tracker.log_model(
            name,
            _pyfunc_file(),
            artifacts={"saved_model": export, "preprocessing": export / DESCRIPTION_FILE},
            signature=signature,
            input_example=example,
            pip_requirements=_requirements(),
            tags=_tags(description),
            step=step,
            code_paths=[_package_copy(Path(code))],
        )
    if uri is not None:
        log.info(
            "logged checkpoint %s as the MLflow model runs:/%s/%s (%s) in %.1f s: "
            "mlflow.pyfunc.load_model('runs:/%s/%s').predict(volume)",
            description["run"]["checkpoint"],
            tracker.run_id,
            name,
            uri,
            time.perf_counter() - start,
            tracker.run_id,
            name,
        )
    return uri


def _signature():
    """The MLflow signature: no input schema (raw cases or a volume: the model checks them), the
    params ``probabilities`` (raw cases: also return them) and ``labels`` (a layout's label values)."""
    from mlflow.models import ModelSignature
    from mlflow.types import ParamSchema, ParamSpec

    return ModelSignature(
        inputs=None,
        outputs=None,
        params=ParamSchema([ParamSpec("probabilities", "boolean", False), ParamSpec("labels", "string", "")]),
    )


def _input_example(description: dict) -> np.ndarray | None:
    """A zero volume ``(1, x, y, z, 4)``, or None above :data:`INPUT_EXAMPLE_MAX_VALUES` values."""
    shape = (1, *(int(s) for s in description["signature"]["input"]["shape"][1:]))
    values = int(np.prod(shape))
    if values > INPUT_EXAMPLE_MAX_VALUES:
        log.info(
            "no input example in the MLflow model: a %s volume is %d values (MLflow stores examples as JSON; "
            "the limit is %d); its signature gives the shape",
            "x".join(map(str, shape[1:])),
            values,
            INPUT_EXAMPLE_MAX_VALUES,
        )
        return None
    return np.zeros(shape, np.dtype(description["signature"]["input"]["dtype"]))


def _tags(description: dict) -> dict[str, str]:
    """The logged model's tags: its identity (:func:`_identity`), which checkpoint, the grid, regions
    and how a case is inferred."""
    run = description["run"]
    return {
        **_identity(description),
        "brats_seg.checkpoint": str(run["checkpoint"]),
        "brats_seg.resolution": str(run["summary"]["resolution"]),
        "brats_seg.grid": "x".join(str(s) for s in description["signature"]["input"]["shape"][1:4]),
        "brats_seg.regions": ",".join(r["name"] for r in description["regions"]),
        "brats_seg.inference": str(description["inference"]["mode"]),
    }


def _requirements() -> list[str]:
    """What the model needs where it loads (:data:`SERVING_REQUIREMENTS`), pinned to this environment."""
    return [f"{name}=={metadata.version(name)}" for name in SERVING_REQUIREMENTS]


def _package_copy(folder: Path) -> Path:
    """This brats_seg package copied into ``folder`` (no byte-code), for the model's ``code/``."""
    import brats_seg

    target = folder / "brats_seg"
    with atomic_dir(target) as tmp:
        shutil.copytree(
            Path(brats_seg.__file__).parent,
            tmp,
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
            dirs_exist_ok=True,
        )
    return target


def _pyfunc_file() -> Path:
    """The path of :mod:`brats_seg.tracking.pyfunc_model`, found without importing it."""
    return Path(importlib.util.find_spec(_PYFUNC_MODULE).origin)
