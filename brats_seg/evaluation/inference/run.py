"""A trained run as evaluation and prediction see it: its config, checkpoint and model.

The model of a run is rebuilt from its ``config.json`` and its weights are loaded from
``checkpoints/<best|last>.keras`` (:func:`load_run_model`), so a training model wrapped
for Large Model Support loads into a plain one. The memory check before the model is loaded
and the guard while cases run are :mod:`brats_seg.oom_inference`'s. Nothing here imports
TensorFlow or Keras at module level: they are imported inside the functions, after
``brats_seg.backend.configure``.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from brats_seg.choices import check_choice
from brats_seg.config import EvalMode, EvaluateConfig, ModelConfig, TrainConfig
from brats_seg.data.labels import output_regions
from brats_seg.evaluation.inference.sliding import resolve_window
from brats_seg.patch_schedule import inference_patch
from brats_seg.run_dir import RunError, RunFolder

__all__ = [
    "RunError",
    "check_evaluate_config",
    "checkpoint_path",
    "inference_device",
    "inference_policy",
    "inference_settings",
    "load_run_config",
    "load_run_model",
    "run_regions",
]

log = logging.getLogger(__name__)


def load_run_config(run_dir: str | Path) -> TrainConfig:
    """The :class:`TrainConfig` a run was trained with (``<run_dir>/config.json``), outputs resolved:
    :meth:`RunFolder.read_config`, the one reader (it upgrades an older run's config).

    Raises:
        RunError: the folder or its config.json is missing or unreadable.
    """
    return RunFolder(Path(run_dir).expanduser()).read_config()


def run_regions(config: TrainConfig) -> tuple[str, ...]:
    """The regions the run's model predicts, in output order (``("wt", "tc", "et")``, ...)."""
    return output_regions(config.data.layout, config.model.out_channels)


def checkpoint_path(run_dir: str | Path, checkpoint: str = "best") -> Path:
    """``<run_dir>/checkpoints/<best|last>.keras``, or ``checkpoint`` itself if it is a ``.keras`` file
    (:meth:`RunFolder.checkpoint`).

    Raises:
        RunError: the checkpoint file does not exist.
    """
    return RunFolder(Path(run_dir).expanduser()).checkpoint(checkpoint)


def inference_settings(cfg: EvaluateConfig, run: TrainConfig) -> EvaluateConfig:
    """The inference a run's model gets, from its own config: a run trained on patches
    (``trainer.patch_size``) infers by sliding windows of its patch size with Gaussian blending,
    so ``scripts/evaluate.py run_dir=...`` and ``predict.py`` need no extra key; a whole-volume
    run keeps ``cfg`` as given. Idempotent.

    Raises:
        RunError: an ``evaluate.window`` other than the patch (its norm learned the statistics
            of windows of the patch's size).
    """
    patch = inference_patch(run) or []
    if not patch:
        return cfg
    if cfg.window and [int(w) for w in cfg.window] != patch:
        raise RunError(
            f"evaluate.window={list(cfg.window)}: this run trained on patches of {patch}, and its "
            f"{run.model.norm} norm learned the statistics of windows of that size; leave evaluate.window "
            "empty (the run's patch is used)."
        )
    if str(cfg.mode) == "sliding" and [int(w) for w in cfg.window] == patch:
        return cfg
    log.debug(
        "the run trained on patches of %s: inferring by sliding windows of that size (overlap %g, Gaussian blending)",
        "x".join(map(str, patch)),
        cfg.window_overlap,
    )  # evaluate.py prints the mode once
    return dataclasses.replace(cfg, mode="sliding", window=patch)


def check_evaluate_config(
    cfg: EvaluateConfig, model: ModelConfig | None = None, patch: list[int] | None = None
) -> None:
    """Check ``evaluate.*`` against the run's model up front (before a model is loaded).

    Sliding windows are refused for instance and group norm when the network was trained on
    whole volumes: those layers normalise every feature map over the volume they are
    given, so a window would be normalised with its own statistics, not the ones the
    model learned with. Whole-volume inference needs far less memory than training (no
    activations are kept for backward), so a model that trained whole infers whole. A model
    trained on patches (``patch``) learned window statistics: it infers by windows of its
    patch (:func:`inference_settings`).

    Args:
        cfg: the inference settings.
        model: the run's model config (norm; windows are multiples of ``2**depth``).
        patch: the run's ``trainer.patch_size`` (None: trained on whole volumes).

    Raises:
        RunError: naming the bad key and value.
    """
    check_choice(cfg.mode, EvalMode, "evaluate.mode", error=RunError)
    if not 0 < cfg.threshold < 1:
        raise RunError(f"evaluate.threshold={cfg.threshold}: use a probability in (0, 1), e.g. 0.5.")
    if not 0 <= cfg.window_overlap < 1:
        raise RunError(f"evaluate.window_overlap={cfg.window_overlap}: use a fraction in [0, 1), e.g. 0.5.")
    if model is None:
        return
    if cfg.mode == "sliding" and model.norm in ("instance", "group") and not patch:
        raise RunError(
            f"evaluate.mode=sliding with model.norm={model.norm}: this model normalises every feature map over "
            "the whole volume it was trained on, so a window would be normalised with its own statistics and "
            "give other predictions than the model learned. Use evaluate.mode=whole (inference keeps no "
            "activations for backward and needs far less memory than the training that fitted), or train "
            "with model.norm=batch for sliding-window inference."
        )
    if cfg.window:
        try:
            resolve_window(cfg.window, tuple(cfg.window), model.depth)
        except ValueError as e:
            raise RunError(str(e)) from None


def load_run_model(run_dir: str | Path, checkpoint: str = "best", config: TrainConfig | None = None):
    """Rebuild a run's U-Net (no LMS wrapping) and load a checkpoint's weights.

    Args:
        run_dir: the training run's folder.
        checkpoint: ``best`` | ``last`` | path of a ``.keras`` file.
        config: the run's config (read from ``config.json`` if None).

    Returns:
        A Keras model ``(B, X, Y, Z, in_channels) -> (B, X, Y, Z, out_channels)`` on the
        run's network grid; of an ensemble's folder, an
        :class:`~brats_seg.evaluation.inference.ensemble.Ensemble` of its members' models.

    Raises:
        RunError: missing config/checkpoint, or weights that do not fit the config.
    """
    folder = RunFolder(Path(run_dir).expanduser())
    members = folder.ensemble_members()
    if members:  # an ensemble's folder: each member's model; a fold's val cases by that fold
        from brats_seg.evaluation.inference.ensemble_model import Ensemble

        index = {str(m.root): i for i, m in enumerate(members)}
        val_by = folder.read_split().get("val_predicted_by") or {}
        models = [load_run_model(m.root, checkpoint, load_run_config(m.root)) for m in members]
        return Ensemble(models, {case: index[run] for case, run in val_by.items()})
    from brats_seg.model.unet3d import build_unet3d

    config = config or load_run_config(run_dir)
    path = checkpoint_path(run_dir, checkpoint)
    model = build_unet3d(config.model, tuple(config.resolution.shape))
    try:
        model.load_weights(str(path))
    except (ValueError, KeyError, OSError) as e:
        raise RunError(
            f"weights of {path} do not fit the model of {RunFolder(Path(run_dir)).config_path} ({e}). "
            "Was config.json edited after training? Restore it, or evaluate another run."
        ) from e
    log.info("loaded %s into unet3d depth=%d base_filters=%d", path, config.model.depth, config.model.base_filters)
    return model


def inference_device() -> str:
    """``GPU`` or ``CPU``: the device the process's backend was decided for
    (:func:`brats_seg.resolve.resolve_inference`) and applied (:func:`brats_seg.backend.configure`);
    code that infers without configuring first gets TensorFlow's default placement."""
    from brats_seg.backend import applied_backend

    applied = applied_backend()
    if applied is not None:
        return applied.device
    import tensorflow as tf

    return "GPU" if tf.config.list_logical_devices("GPU") else "CPU"


def inference_policy() -> str:
    """Keras' global dtype policy, which ``backend.configure`` set from ``backend.precision``."""
    import keras

    return keras.mixed_precision.global_policy().name
