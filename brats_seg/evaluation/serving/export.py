"""A run's model as a TensorFlow SavedModel that serves without brats_seg, with a
``preprocessing.json`` saying what its input must be and what to do with its output.

::

    <export>/saved_model.pb variables/ assets/ fingerprint.pb   the SavedModel (Keras 3 ExportArchive)
             preprocessing.json                                 regions and labels, channels, grid,
                                                                preprocessing steps, threshold and
                                                                paint order, precision, run, version

The signature ``serving_default`` takes ``image``: float32 ``(batch, x, y, z, 4)``, channels-last
RAS (FLAIR, T1, T1ce, T2), preprocessed onto the run's network grid; and returns ``probabilities``:
float32 ``(batch, x, y, z, R)``, the sigmoid output of each region of the layout in output order.
The spatial dims are fixed to ``resolution.shape``: the U-Net's instance and group norms normalise
over the grid they are given (another grid changes what the model computes, see
:func:`brats_seg.evaluation.inference.run.check_evaluate_config`), its trilinear up-sampling needs static
dims, and the preprocessing always produces that grid. The batch is free: the cases of a batch
run one at a time (``tf.map_fn``) through the same kernels as brats_seg's own inference, so with
the same thread settings the outputs equal the run's ``.keras`` model's bit for bit. A FLAIR-only
model (``model.in_channels=1``) takes the four channels too and uses the first.

How a case is inferred follows how the run trained (``preprocessing.json``'s ``inference``,
:func:`describe_inference`):

* whole volumes (``trainer.patch_size`` null): the model on the whole grid, one forward pass;
* patches (``trainer.patch_size=[x,y,z]``): the model, built at the patch as training built it,
  on windows of the patch with overlap ``evaluate.window_overlap``'s default (0.5), blended with
  the Gaussian importance map, all inside the graph: the window corners are constants
  (:func:`brats_seg.evaluation.inference.sliding.window_corners`), a ``tf.while_loop`` runs one window at a
  time in their order and adds its weighted probabilities and its weights into the grid's sums,
  and the probabilities are their quotient -- the sums ``predict_volume(mode="sliding")`` forms on
  the host, in the same order, so the SavedModel serves what brats_seg's sliding inference gives.
  A client still sends the whole grid and gets the whole grid back.

The facts in ``preprocessing.json`` are read from their owners: channels from
:mod:`brats_seg.data.layouts`, regions, labels and paint order from :mod:`brats_seg.data.labels`,
the steps from :func:`brats_seg.data.preprocess.describe_preprocessing`, the threshold and
mirroring from :class:`brats_seg.config.EvaluateConfig`. The folder is written with
:func:`brats_seg.files.atomic_dir`: a killed export leaves the previous export, or a ``.tmp-``
folder, never a folder that looks complete. TensorFlow and Keras are imported inside functions,
after ``brats_seg.backend.configure``. Reading an export back: :mod:`brats_seg.evaluation.serving.exported`;
as an MLflow model of the run (``mlflow.pyfunc``): :mod:`brats_seg.evaluation.serving.mlflow_model`.
"""

from __future__ import annotations

import json
import logging
import os
from datetime import datetime, timezone
from pathlib import Path

from brats_seg.backend import PRECISION_POLICIES
from brats_seg.choices import check_choice
from brats_seg.config import EvaluateConfig, ExportFormat, TrainConfig, config_to_dict
from brats_seg.data.labels import REGION_TITLES, label_table
from brats_seg.data.layouts import CHANNELS
from brats_seg.data.preprocess import describe_preprocessing
from brats_seg.evaluation.inference.run import RunError, load_run_config, load_run_model, run_regions
from brats_seg.evaluation.inference.sliding import GAUSSIAN_SIGMA_SCALE, gaussian_importance_map, window_corners
from brats_seg.files import atomic_dir, write_text_atomic
from brats_seg.patch_schedule import inference_patch
from brats_seg.run_dir import RunFolder

__all__ = [
    "DESCRIPTION_FILE",
    "EXPORT_KIND",
    "INPUT_NAME",
    "OUTPUT_NAME",
    "SIGNATURE",
    "check_export_output",
    "default_export_dir",
    "describe_export",
    "describe_inference",
    "export_run",
    "is_export_dir",
]

log = logging.getLogger(__name__)

DESCRIPTION_FILE = "preprocessing.json"  # beside the SavedModel: what the input must be
EXPORT_KIND = "brats-seg export"  # preprocessing.json's "kind": tells an export from another folder
EXPORT_VERSION = 1  # preprocessing.json's layout; a reader refuses a newer one
SIGNATURE = "serving_default"  # the signature TF Serving calls
INPUT_NAME = "image"  # (batch, x, y, z, 4) float32
OUTPUT_NAME = "probabilities"  # (batch, x, y, z, R) float32
_SAVED_MODEL_FILE = "saved_model.pb"  # what tf.saved_model writes; its presence makes a SavedModel folder


def default_export_dir(run_dir: str | Path) -> Path:
    """``<run_dir>/export``: where ``scripts/export.py`` writes when ``output=`` is not given."""
    return RunFolder.of(run_dir).export_dir


def is_export_dir(path: str | Path) -> bool:
    """Whether ``path`` is a folder holding a SavedModel and its ``preprocessing.json``."""
    path = Path(path).expanduser()
    return (path / _SAVED_MODEL_FILE).is_file() and (path / DESCRIPTION_FILE).is_file()


def check_export_output(output: str | Path) -> Path:
    """The export folder, checked before anything is loaded: a new folder, an empty one, or a
    previous export (replaced whole). Anything else would be moved aside and deleted by the
    atomic replacement, so it is refused.

    Raises:
        RunError: ``output`` is a file, or a folder holding other files than an export.
    """
    output = Path(output).expanduser()
    if output.exists() and not output.is_dir():
        raise RunError(f"output={output} is a file: pass output= a new folder for the export.")
    if output.is_dir() and any(output.iterdir()) and not is_export_dir(output):
        raise RunError(
            f"output={output} already holds files that are not a brats-seg export; an export replaces "
            "its folder whole, so pass output= a new or empty folder."
        )
    # the export is written beside output= and renamed into place: its parent must take a new
    # folder, and output= cannot be a mount point (a container's /workspace/model volume)
    parent = next((p for p in output.absolute().parents if p.exists()), Path("/"))
    if output.is_mount() or not os.access(parent, os.W_OK | os.X_OK):
        why = "is a mount point" if output.is_mount() else f"is in {parent}, where this user cannot create folders"
        raise RunError(
            f"output={output} {why}: an export is written beside its folder and renamed into place. Export to "
            "a folder you can write (the default <run_dir>/export), then mount or copy it where it is needed "
            "(in the image: -v <run_dir>/export:/workspace/model:ro)."
        )
    return output


def describe_inference(config: TrainConfig) -> dict:
    """How the export infers a case (TensorFlow-free): ``{"mode": "whole"}`` for a run trained on
    whole volumes; for a patch run, Gaussian-blended sliding windows of the patch::

        {"mode": "sliding", "window": [x, y, z], "overlap": 0.5, "blending": "gaussian", "sigma_scale": 0.125}

    ``overlap`` is ``evaluate.window_overlap``'s default, ``sigma_scale`` the Gaussian's sigma per
    axis as a fraction of the window (:func:`brats_seg.evaluation.inference.sliding.gaussian_importance_map`).
    """
    patch = inference_patch(config)
    if not patch:
        return {"mode": "whole"}
    return {
        "mode": "sliding",
        "window": patch,
        "overlap": float(EvaluateConfig().window_overlap),
        "blending": "gaussian",
        "sigma_scale": float(GAUSSIAN_SIGMA_SCALE),
    }


def describe_export(
    config: TrainConfig,
    run_dir: str | Path,
    checkpoint: str,
    checkpoint_identity: dict,
    policy: str,
    warn_unchosen: bool = True,
) -> dict:
    """The content of ``preprocessing.json`` for a run's model (TensorFlow-free).

    Args:
        config: the run's config.
        run_dir: the run's folder.
        checkpoint: which checkpoint was exported (``best``, ``last`` or a path).
        checkpoint_identity: its ``{"size", "sha256"}`` (:meth:`RunFolder.checkpoint_identity`).
        policy: the Keras dtype policy the graph was traced under (``float32``, ``mixed_bfloat16``).
        warn_unchosen: warn when the run has no post-processing chosen yet (False at the end of
            training, before any evaluation could choose it).
    """
    table = label_table(config.data.layout)
    names = run_regions(config)
    labels = {r.name: list(r.labels) for r in table.regions}
    shape = [int(s) for s in config.resolution.shape]
    defaults = EvaluateConfig()
    precision = next((p for p, name in PRECISION_POLICIES.items() if name == policy), policy)
    preprocessing = describe_preprocessing(config.resolution.spacing_mm, shape, config.data.allow_crop)
    return {
        "kind": EXPORT_KIND,
        "version": EXPORT_VERSION,
        "signature": {
            "name": SIGNATURE,
            "input": {
                "name": INPUT_NAME,
                "shape": [None, *shape, len(CHANNELS)],
                "dtype": "float32",
                "channels": list(CHANNELS),
                "channels_used": config.model.in_channels,
            },
            "output": {
                "name": OUTPUT_NAME,
                "shape": [None, *shape, len(names)],
                "dtype": "float32",
                "meaning": "sigmoid probability of each region, in the order of 'regions'",
            },
            "axes": f"channels-last (batch, x, y, z, channel), voxel order {preprocessing['orientation']}",
        },
        "inference": describe_inference(config),
        "regions": [{"name": n, "title": REGION_TITLES[n], "labels": labels[n]} for n in names],
        "labels": {
            "layout": config.data.layout,
            "names": {str(v): n for v, n in sorted(table.names.items())},
            "background": 0,
        },
        "preprocessing": preprocessing,
        "postprocessing": {
            "threshold": defaults.threshold,
            "rule": "a region is where its probability, on the native grid, is > threshold",
            "paint_order": [[region, label] for region, label in table.paint_order if region in names],
            "paint_rule": "write each region's voxels with its label in paint_order, later entries winning; "
            "voxels in no region are 0",
            "test_time_mirroring": defaults.mirror,
            "mirroring_rule": "brats_seg's predict.py averages the probabilities with those of the input "
            "flipped along x (axis 1), flipped back (evaluate.mirror)",
            "chosen": _chosen_postprocessing(config, run_dir, checkpoint_identity, warn_unchosen),
            "chosen_rule": "then, on the painted label map (null: nothing): each region's connected components "
            "(26-connected) under min_component_mm3 leave it and the regions inside it; a region "
            "under relabel_below_mm3 in total takes the label of the region holding it (ET -> "
            "necrosis); chosen on the run's val split (brats_seg.evaluation.postprocess)",
        },
        "precision": {"backend": str(precision), "dtype_policy": policy, "trained": str(config.backend.precision)},
        "run": {
            "run_dir": str(Path(run_dir).expanduser().resolve()),
            "checkpoint": str(checkpoint),
            "checkpoint_size": checkpoint_identity.get("size"),
            "checkpoint_sha256": checkpoint_identity.get("sha256"),
            "summary": _config_summary(config),
            "config": config_to_dict(config),
        },
        "brats_seg": _provenance(),
        "exported_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def _chosen_postprocessing(
    config: TrainConfig, run_dir: str | Path, checkpoint_identity: dict, warn_unchosen: bool = True
) -> dict | None:
    """The run's ``postprocess.json`` (rules, what they were chosen for and their validation means), or None."""
    from brats_seg.evaluation.postprocess import PostprocessError, rules_of_record

    folder = RunFolder.of(run_dir)
    record = folder.read_postprocess()
    try:
        rules = rules_of_record(record, config.data.layout, str(folder.postprocess_path), checkpoint_identity)
    except PostprocessError as e:
        raise RunError(str(e)) from None
    if rules is None:
        (log.warning if warn_unchosen else log.debug)(
            "the run %s has no post-processing chosen (scripts/evaluate.py chooses it on the val split): "
            "the export holds none, and its masks are written as thresholded",
            run_dir,
        )
        return None
    validation = record.get("validation") or {}
    return {
        "kind": record["kind"],
        "version": record.get("version"),
        "rules": rules.rules(),
        "described": rules.describe(),
        "chosen_for": record.get("chosen_for"),
        "validation": {k: validation.get(k) for k in ("cases", "objective", "unprocessed", "chosen")},
    }


def _config_summary(config: TrainConfig) -> dict:
    """The handful of values a reader looks for first."""
    m = config.model
    return {
        "data": config.data.name,
        "layout": config.data.layout,
        "resolution": config.resolution.name,
        "model": f"{m.name} depth={m.depth} base_filters={m.base_filters} norm={m.norm} upsample={m.upsample} "
        f"regions={m.regions}",
        "epochs": config.trainer.epochs,
        "seed": config.trainer.seed,
    }


def _provenance() -> dict:
    """brats_seg's version and the git commit of the code that exported (``+dirty``: uncommitted changes)."""
    from importlib.metadata import PackageNotFoundError, version

    from brats_seg.tracking import git_commit

    try:
        package = version("brats-seg")
    except PackageNotFoundError:
        package = "unknown"
    return {"version": package, "git_commit": git_commit()}


def export_run(
    run_dir: str | Path,
    output: str | Path | None = None,
    checkpoint: str = "best",
    fmt: str = "saved_model",
    config: TrainConfig | None = None,
    warn_unchosen: bool = True,
) -> Path:
    """Export a run's model: a SavedModel plus ``preprocessing.json``, in one atomic folder.

    Call after ``brats_seg.backend.configure``: the model is traced under the dtype policy
    it set (``backend.precision``).

    Args:
        run_dir: the training run.
        output: the export folder (replaced whole if it holds an export); None = ``<run_dir>/export``.
        checkpoint: ``best`` | ``last`` | a ``.keras`` file.
        fmt: ``saved_model``.
        config: the run's config (read from ``config.json`` if None).
        warn_unchosen: warn when the run has no post-processing chosen yet (see :func:`describe_export`).

    Returns:
        The export folder.

    Raises:
        RunError: a bad format, output folder, run folder or checkpoint.
        DiskFullError: the disk filled; the previous export, if any, is intact.
    """
    import keras

    check_choice(fmt, ExportFormat, "format", error=RunError)
    output = check_export_output(output if output is not None and str(output).strip() else default_export_dir(run_dir))
    config = config or load_run_config(run_dir)
    identity = RunFolder.of(run_dir).checkpoint_identity(checkpoint)  # before loading: the weights exported
    model = _model_at_network_input(load_run_model(run_dir, checkpoint, config), config)
    policy = keras.mixed_precision.global_policy().name
    description = describe_export(config, run_dir, checkpoint, identity, policy, warn_unchosen)
    with atomic_dir(output) as folder:
        _write_saved_model(model, config, folder)
        write_text_atomic(folder / DESCRIPTION_FILE, json.dumps(description, indent=1) + "\n")
    log.info("exported %s (checkpoint %s, %s) to %s", run_dir, checkpoint, policy, output)
    return output


def _model_at_network_input(model, config: TrainConfig):
    """``model`` for a run trained on whole volumes; for a patch run, the U-Net built at the patch
    (as training built it) holding ``model``'s weights: the model the sliding windows run."""
    patch = inference_patch(config)
    if not patch:
        return model
    from brats_seg.model.unet3d import build_unet3d

    window_model = build_unet3d(config.model, tuple(patch))
    window_model.set_weights(model.get_weights())  # same builder and config: the same weights in the same order
    return window_model


def _write_saved_model(model, config: TrainConfig, folder: Path) -> None:
    """The SavedModel of ``model`` with the ``serving_default`` signature (see the module doc).

    ``model`` takes ``network_input_shape(config)``: the whole grid, or the patch of a patch run.
    """
    import keras
    import tensorflow as tf

    shape = tuple(int(s) for s in config.resolution.shape)
    n_out, n_in = len(run_regions(config)), config.model.in_channels
    inference = describe_inference(config)
    if inference["mode"] == "sliding":
        one_case = _sliding_case_fn(model, shape, inference, n_in, n_out)
        parallel = {"parallel_iterations": 1}  # one case at a time: the memory of one case's windows
    else:

        def one_case(x):  # (x, y, z, 4) -> (x, y, z, R): a static batch of 1, as brats_seg's inference runs it
            return tf.cast(model(x[None, ..., :n_in], training=False), tf.float32)[0]

        parallel = {}  # as exports have always been traced

    def serve(image):  # (B, x, y, z, 4) float32 -> {"probabilities": (B, x, y, z, R) float32}
        probs = tf.map_fn(one_case, image, fn_output_signature=tf.TensorSpec((*shape, n_out), tf.float32), **parallel)
        return {OUTPUT_NAME: probs}

    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint(
        SIGNATURE, serve, input_signature=[tf.TensorSpec((None, *shape, len(CHANNELS)), tf.float32, name=INPUT_NAME)]
    )
    tf_log = logging.getLogger("tensorflow")
    level = tf_log.level
    tf_log.setLevel(max(level, logging.WARNING))  # not "Assets written to <the temporary folder>"
    try:
        archive.write_out(str(folder), verbose=False)
    finally:
        tf_log.setLevel(level)


def _sliding_case_fn(model, shape: tuple[int, int, int], inference: dict, n_in: int, n_out: int):
    """One case's Gaussian-blended sliding-window inference as graph ops:
    ``(X, Y, Z, 4) -> (X, Y, Z, R)`` float32, what ``predict_volume(mode="sliding")`` computes.

    A ``tf.while_loop`` over the constant window corners (one model call in the graph, whatever
    the number of windows; ``parallel_iterations=1``: one window's activations at a time, as on the
    host) adds each window's ``p * w`` and ``w`` into one ``(X, Y, Z, R + 1)`` sum in the host's
    order; the probabilities are the first ``R`` channels divided by the last.
    """
    import tensorflow as tf

    window = tuple(int(w) for w in inference["window"])
    corners = window_corners(shape, window, inference["overlap"])
    weights = gaussian_importance_map(window, inference["sigma_scale"])[..., None]  # (wx, wy, wz, 1) float32
    log.info(
        "export: sliding windows %s over %s, overlap %.2f: %d windows a case",
        "x".join(map(str, window)),
        "x".join(map(str, shape)),
        inference["overlap"],
        len(corners),
    )
    image_size, sum_size = [*window, n_in], [*window, n_out + 1]  # static: the model needs static dims

    def one_case(x):
        x = x[..., :n_in]  # (X, Y, Z, C_in)
        starts = tf.constant([[*c, 0] for c in corners], tf.int32)  # (N, 4): (x, y, z, channel 0)
        gauss = tf.constant(weights)

        def add_window(i, total):  # total (X, Y, Z, R + 1): sum of p * w, then sum of w
            begin = starts[i]
            p = tf.cast(model(tf.slice(x, begin, image_size)[None], training=False), tf.float32)[0]  # (wx, wy, wz, R)
            box = tf.slice(total, begin, sum_size) + tf.concat([p * gauss, gauss], axis=-1)
            total = tf.raw_ops.TensorStridedSliceUpdate(
                input=total, begin=begin, end=begin + sum_size, strides=[1, 1, 1, 1], value=box
            )
            return i + 1, total

        total = tf.zeros((*shape, n_out + 1), tf.float32)
        _, total = tf.while_loop(
            lambda i, _: i < len(corners), add_window, (tf.constant(0), total), parallel_iterations=1
        )
        return total[..., :n_out] / total[..., n_out:]

    return one_case
