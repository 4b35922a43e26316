"""An export (:mod:`brats_seg.evaluation.serving.export`) as prediction sees it: its ``preprocessing.json``
read back without TensorFlow, and its SavedModel loaded as the model ``predict_volume`` expects.

``scripts/predict.py export=<export>`` predicts through the same path as ``run_dir=<run>``
(:func:`brats_seg.evaluation.inference.predict.predict_new_cases`): the run's config, kept whole in
``preprocessing.json``, fixes the preprocessing, the inversion to the native grid, the regions and
the labels, and :class:`ExportedModel` stands where the Keras model stands (``input_shape``,
``layers``, a call on a numpy batch), so the masks are those the run's ``.keras`` model writes.
The export's signature takes the whole network grid and infers it as the run does
(:attr:`ExportInfo.inference`): a patch run's SavedModel runs the Gaussian-blended sliding
windows of its patch inside its graph, so prediction calls it as a whole-volume model
(``predict_volume(mode="whole")``, test-time mirroring on the host as for any model), and
``evaluate.mode=sliding`` is refused (:func:`check_export_settings`). TensorFlow is imported only
by :func:`load_exported_model`.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from brats_seg.config import EvaluateConfig, TrainConfig, config_from_dict
from brats_seg.data.labels import resolve_model_outputs
from brats_seg.evaluation.inference.run import RunError, check_evaluate_config
from brats_seg.evaluation.postprocess import PostprocessError, PostProcessing, rules_of_record
from brats_seg.evaluation.serving.export import (
    DESCRIPTION_FILE,
    EXPORT_KIND,
    EXPORT_VERSION,
    INPUT_NAME,
    OUTPUT_NAME,
    SIGNATURE,
    is_export_dir,
)
from brats_seg.run_dir import RunFolder, upgrade_config_dict

__all__ = [
    "ExportInfo",
    "ExportedModel",
    "check_export_settings",
    "export_precision",
    "load_exported_model",
    "predict_source",
    "prediction_postprocessing",
    "read_export",
]

log = logging.getLogger(__name__)

_EXPORT_HINT = "python scripts/export.py run_dir=<the training run>"


@dataclass(frozen=True)
class ExportInfo:
    """An export folder as read from its ``preprocessing.json``.

    Attributes:
        folder: the export's folder.
        description: ``preprocessing.json`` as a dict.
        config: the run's config, as the run folder's reader gives it (upgraded, outputs resolved).
        precision: the ``backend.precision`` the SavedModel computes in (fp32 | bf16 | fp16).
        identity: what tells this export apart, for ``predict.json``: the SHA-256 of its
            ``preprocessing.json`` (which holds the checkpoint's SHA-256 and the export time).
    """

    folder: Path
    description: dict
    config: TrainConfig
    precision: str
    identity: dict

    @property
    def inference(self) -> dict:
        """How the SavedModel infers a case (``preprocessing.json``'s ``inference``, written by
        :func:`brats_seg.evaluation.serving.export.describe_inference`): ``{"mode": "whole"}``, or for a patch
        run ``{"mode": "sliding", "window": [x, y, z], "overlap": 0.5, "blending": "gaussian",
        "sigma_scale": 0.125}``, done inside the signature, which takes and returns the whole grid
        either way. An export made before the key existed infers whole."""
        inference = self.description.get("inference")
        return dict(inference) if isinstance(inference, dict) and inference.get("mode") else {"mode": "whole"}


def read_export(folder: str | Path) -> ExportInfo:
    """Read an export folder without TensorFlow.

    Raises:
        RunError: one line naming the folder: not set, missing, not an export (a training run
            folder says so), or a ``preprocessing.json`` that is unreadable or from a newer brats_seg.
    """
    if not str(folder).strip():
        raise RunError(f"export is not set: pass export=<an exported model's folder> (made by {_EXPORT_HINT}).")
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise RunError(f"export={folder} does not exist: pass the folder {_EXPORT_HINT} wrote.")
    if not is_export_dir(folder):
        if RunFolder(folder).has_config():
            raise RunError(
                f"export={folder} is a training run, not an export: pass run_dir={folder}, or export it "
                f"first: python scripts/export.py run_dir={folder}"
            )
        raise RunError(
            f"export={folder} is not a brats-seg export (no saved_model.pb and {DESCRIPTION_FILE}): "
            f"pass the folder {_EXPORT_HINT} wrote."
        )
    path = folder / DESCRIPTION_FILE
    raw = path.read_bytes()
    try:
        description = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RunError(f"{path} is not readable JSON ({e}): export the run again ({_EXPORT_HINT}).") from e
    if not isinstance(description, dict) or description.get("kind") != EXPORT_KIND:
        raise RunError(
            f'{path} is not a brats-seg export\'s description (no "kind": "{EXPORT_KIND}"): '
            f"pass the folder {_EXPORT_HINT} wrote."
        )
    if not isinstance(description.get("version"), int) or description["version"] > EXPORT_VERSION:
        raise RunError(
            f"{path} is version {description.get('version')} of the export format; this brats_seg "
            f"reads up to {EXPORT_VERSION}: upgrade brats_seg, or export the run with this one."
        )
    try:
        config = resolve_model_outputs(
            config_from_dict(TrainConfig, upgrade_config_dict(dict(description["run"]["config"])))
        )
        precision = str(description["precision"]["backend"])
    except (KeyError, TypeError, ValueError) as e:
        raise RunError(
            f"{path} does not hold the run's config and precision ({e}): export the run again ({_EXPORT_HINT})."
        ) from e
    return ExportInfo(
        folder=folder,
        description=description,
        config=config,
        precision=precision,
        identity={"export_sha256": hashlib.sha256(raw).hexdigest()},
    )


def check_export_settings(info: ExportInfo, eval_cfg: EvaluateConfig) -> None:
    """Check ``evaluate.*`` for predicting with an export, before it is loaded.

    Raises:
        RunError: sliding windows (the signature takes the whole grid; a patch run's export slides
            its windows inside it), checked first: the reason that holds whatever the model's norm;
            then a bad ``evaluate.*`` value; for a patch run's export, an ``evaluate.window`` or
            ``evaluate.window_overlap`` other than those its graph holds (they would be ignored).
    """
    if eval_cfg.mode == "sliding":
        shape = "x".join(str(s) for s in info.config.resolution.shape)
        inference = info.inference
        if inference["mode"] == "sliding":
            window = "x".join(str(w) for w in inference["window"])
            raise RunError(
                f"evaluate.mode={eval_cfg.mode} with export={info.folder}: the export takes the whole "
                f"network grid ({shape}) and runs the run's sliding windows ({window}, overlap "
                f"{inference['overlap']}, Gaussian blending) inside it; use evaluate.mode=whole."
            )
        raise RunError(
            f"evaluate.mode={eval_cfg.mode} with export={info.folder}: an export's signature takes the "
            f"whole network grid ({shape}); use evaluate.mode=whole, or run_dir=<the training run> for "
            "sliding windows."
        )
    check_evaluate_config(eval_cfg, info.config.model)
    inference = info.inference
    if inference["mode"] == "sliding":  # fixed in the graph: a different value asked for would be ignored
        window, overlap = [int(w) for w in inference["window"]], float(inference["overlap"])
        if eval_cfg.window and [int(w) for w in eval_cfg.window] != window:
            raise RunError(
                f"evaluate.window={list(eval_cfg.window)} with export={info.folder}: the export slides "
                f"windows of its run's patch {window} inside its graph; leave evaluate.window empty."
            )
        if float(eval_cfg.window_overlap) != overlap:
            raise RunError(
                f"evaluate.window_overlap={eval_cfg.window_overlap} with export={info.folder}: the export "
                f"slides its windows with overlap {overlap} inside its graph; leave "
                "evaluate.window_overlap at its default, or use run_dir=<the training run>."
            )


def predict_source(run_dir: str, export: str, eval_cfg: EvaluateConfig) -> ExportInfo | None:
    """What ``scripts/predict.py`` predicts with: the export ``export=`` names, or ``run_dir=`` when it
    holds an export (an export is accepted wherever a model is asked for), its settings checked;
    None for a training run.

    Raises:
        RunError: neither or both given, or an export that cannot be used with ``eval_cfg``.
    """
    folder, run = str(export).strip(), str(run_dir).strip()
    if folder and run:
        raise RunError(
            f"run_dir={run_dir} and export={export} are both given: pass one, run_dir= a training run "
            "or export= an export of one."
        )
    if not folder and not run:
        raise RunError(
            "run_dir is not set: pass run_dir=<the training run's folder> (e.g. outputs/<run>), "
            "or export=<an exported model's folder>."
        )
    if not folder and not is_export_dir(run):
        return None
    info = read_export(folder or run)
    check_export_settings(info, eval_cfg)
    return info


def prediction_postprocessing(
    run_dir: str, export: ExportInfo | None, config: TrainConfig, eval_cfg: EvaluateConfig, checkpoint: str = "best"
) -> PostProcessing | None:
    """The post-processing ``scripts/predict.py`` applies: none with ``evaluate.postprocess=none``;
    else the rules the export holds, or the training run's ``postprocess.json`` (chosen on its val
    split by ``scripts/evaluate.py``). Without one the masks are written as thresholded, said once.

    Raises:
        RunError: a ``postprocess.json`` or export description whose rules cannot be used (naming it).
    """
    if str(eval_cfg.postprocess) == "none":
        return None
    layout = config.data.layout
    try:
        if export is not None:
            record = (export.description.get("postprocessing") or {}).get("chosen")
            rules = rules_of_record(record, layout, str(export.folder / DESCRIPTION_FILE))
            if rules is None:
                log.warning(
                    "the export %s holds no post-processing (its run had none chosen when it was exported): "
                    "masks are written as thresholded",
                    export.folder,
                )
            return rules
        folder = RunFolder.of(run_dir)
        rules = rules_of_record(
            folder.read_postprocess(), layout, str(folder.postprocess_path), folder.checkpoint_identity(checkpoint)
        )
    except PostprocessError as e:
        raise RunError(str(e)) from None
    if rules is None:
        log.warning(
            "the run %s has no post-processing chosen yet (scripts/evaluate.py run_dir=%s chooses it on its "
            "val split): masks are written as thresholded",
            run_dir,
            run_dir,
        )
    else:
        log.info("post-processing (%s): %s", folder.postprocess_path, rules.describe())
    return rules


def export_precision(info: ExportInfo, requested: str | None) -> str:
    """The precision to predict an export in: the one its graph was traced in.

    Raises:
        RunError: ``requested`` (a ``backend.precision=`` given) differs from it.
    """
    if requested and requested != info.precision:
        raise RunError(
            f"backend.precision={requested}: the export {info.folder} computes in {info.precision}. "
            f"Drop backend.precision=, or export the run again with backend.precision={requested}."
        )
    return info.precision


class ExportedModel:
    """A loaded export, as :func:`brats_seg.evaluation.inference.sliding.predict_volume` uses a Keras model.

    Attributes:
        input_shape: the signature's input, ``(None, X, Y, Z, 4)``: the whole grid, also for a
            patch run (its SavedModel slides the windows itself).
        layers: empty (no MaxPooling3D to count: ``evaluate.mode=sliding`` is refused for exports).
    """

    layers = ()

    def __init__(self, loaded, folder: Path) -> None:
        signatures = getattr(loaded, "signatures", {})
        fn = signatures.get(SIGNATURE) if hasattr(signatures, "get") else None
        inputs = fn.structured_input_signature[1] if fn is not None else {}
        if fn is None or INPUT_NAME not in inputs or OUTPUT_NAME not in fn.structured_outputs:
            raise RunError(
                f"{folder}: the SavedModel has no {SIGNATURE} signature taking {INPUT_NAME!r} and returning "
                f"{OUTPUT_NAME!r}; export the run again ({_EXPORT_HINT})."
            )
        self._loaded, self._fn = loaded, fn  # the loaded object keeps the signature's variables alive
        self.input_shape = tuple(inputs[INPUT_NAME].shape)

    def __call__(self, batch: np.ndarray, training: bool = False) -> np.ndarray:
        """``(B, X, Y, Z, 4)`` float image (float16 is widened exactly) -> ``(B, X, Y, Z, R)`` float32."""
        import tensorflow as tf

        image = tf.constant(np.asarray(batch, dtype=np.float32))
        return self._fn(**{INPUT_NAME: image})[OUTPUT_NAME].numpy()


def load_exported_model(folder: str | Path) -> ExportedModel:
    """Load an export's SavedModel (``tf.saved_model.load``; call after ``backend.configure``).

    Raises:
        RunError: the SavedModel cannot be loaded, or lacks the signature.
    """
    import tensorflow as tf

    folder = Path(folder).expanduser()
    try:
        loaded = tf.saved_model.load(str(folder))
    except (OSError, ValueError, tf.errors.OpError) as e:
        raise RunError(
            f"{folder}: the SavedModel cannot be loaded ({str(e).splitlines()[0] if str(e) else e!r}); "
            f"export the run again ({_EXPORT_HINT})."
        ) from e
    return ExportedModel(loaded, folder)
