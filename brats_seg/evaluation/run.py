"""A trained run as evaluation and prediction see it: its config, checkpoint and model.

The model of a run is rebuilt from its ``config.json`` and its weights are loaded from
``checkpoints/<best|last>.keras`` (:func:`load_run_model`), so a training model wrapped
for Large Model Support loads into a plain one. Before the model is loaded,
:func:`check_inference_memory` holds the predicted peak of a case to the run's ``lms.limit``;
while cases run, :func:`inference_memory_guard` turns running out of memory anyway into a
message with that estimate, the measured peak and what lowers it. Nothing here imports
TensorFlow or Keras at module level: they are imported inside the functions, after
``brats_seg.backend.configure``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from pathlib import Path

from brats_seg.choices import check_choice
from brats_seg.config import EvaluateConfig, ModelConfig, TrainConfig
from brats_seg.data.labels import output_regions
from brats_seg.evaluation.sliding import MODES, resolve_window
from brats_seg.run_dir import RunError, RunFolder

__all__ = [
    "MODES",
    "RunError",
    "check_evaluate_config",
    "inference_settings",
    "checkpoint_path",
    "load_run_config",
    "load_run_model",
    "check_inference_memory",
    "InferenceOutOfMemoryError",
    "inference_device",
    "inference_memory_guard",
    "inference_out_of_memory_error",
    "inference_policy",
    "inference_precision",
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
    patch = [int(p) for p in (run.trainer.patch_size or [])]
    if not patch:
        return cfg
    if cfg.window and [int(w) for w in cfg.window] != patch:
        raise RunError(f"evaluate.window={list(cfg.window)}: this run trained on patches of {patch}, and its "
                       f"{run.model.norm} norm learned the statistics of windows of that size; leave evaluate.window "
                       "empty (the run's patch is used).")
    if str(cfg.mode) == "sliding" and [int(w) for w in cfg.window] == patch:
        return cfg
    log.debug("the run trained on patches of %s: inferring by sliding windows of that size (overlap %g, Gaussian "
              "blending)", "x".join(map(str, patch)), cfg.window_overlap)  # evaluate.py prints the mode once
    return dataclasses.replace(cfg, mode="sliding", window=patch)


def check_evaluate_config(cfg: EvaluateConfig, model: ModelConfig | None = None,
                          patch: list[int] | None = None) -> None:
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
    check_choice(cfg.mode, MODES, "evaluate.mode", error=RunError)
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
        run's network grid.

    Raises:
        RunError: missing config/checkpoint, or weights that do not fit the config.
    """
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


def inference_precision(run: TrainConfig, requested: str | None) -> str:
    """The precision a run's model infers in: ``requested`` (``backend.precision=`` given on the
    command line) or else the run's own, so a bf16 run is evaluated in bf16 (half the memory)
    -- except on a CPU without native bf16, where oneDNN cannot run it: fp32, said once."""
    if requested:
        return requested
    precision = run.backend.precision
    if precision == "bf16":
        from brats_seg.cpu import cpu_model_name, has_native_bf16
        from brats_seg.lms.planner.preflight import planning_device

        if planning_device(run) == "CPU" and not has_native_bf16():
            log.warning("the run trained in bf16; this CPU (%s) has no native bf16, so its model infers in fp32 "
                        "(about twice the memory of bf16)", cpu_model_name())
            return "fp32"
    return precision if precision in ("fp32", "bf16") else "fp32"


def check_inference_memory(run: TrainConfig, eval_cfg: EvaluateConfig, device: str, policy: str, records=(),
                           scoring: bool = True):
    """Predict a case's evaluation (``scoring``) or prediction peak and hold it to the run's
    ``lms.limit`` (less the planning margin), before any model is loaded.

    Args:
        run: the run's config.
        eval_cfg: mirroring and mode.
        device: ``CPU`` or ``GPU``.
        policy: the dtype policy the model infers in (``float32``, ``mixed_bfloat16``).
        records: the cases' ``PreprocessRecord`` dicts (their resampled and native grids);
            none: the network grid stands for both.

    Returns:
        The :class:`~brats_seg.lms.planner.inference.InferenceEstimate` of the largest case.

    Raises:
        RunError: the estimate is over the budget, with the numbers and what to change.
    """
    import math

    from brats_seg.backend import device_memory_bytes
    from brats_seg.lms.planner.inference import estimate_inference
    from brats_seg.lms.planner.memory_model import memory_model_for
    from brats_seg.lms.planner.search import planning_budget
    from brats_seg.lms.planner.units import format_gb, parse_limit
    from brats_seg.lms.planner.workload import Workload

    mm = memory_model_for(device)
    workload = dataclasses.replace(Workload.from_config(run), policy=policy)
    resampled = max((math.prod(r["resampled_shape"]) for r in records), default=None)
    native = max((math.prod(r["native_shape"]) for r in records), default=None)
    estimate = estimate_inference(workload, mm, mirror=eval_cfg.mirror and eval_cfg.mode == "whole",
                                  resampled_voxels=resampled, native_voxels=native, scoring=scoring)
    limit = parse_limit(run.lms.limit, device_memory_bytes(device, run.backend.gpu_memory_limit_mb))
    budget = planning_budget(limit, mm)
    log.info("inference of a case (%s, %s): predicted peak %s at its %s step, budget %s (lms.limit %s)",
             "x".join(map(str, workload.input_shape)), workload.policy, format_gb(estimate.peak_bytes),
             estimate.peak_at, format_gb(budget), format_gb(limit))
    if estimate.peak_bytes > budget:
        hints = _inference_hints(workload, mm, eval_cfg, resampled, native, scoring,
                                 bf16=workload.policy == "float32" and (device == "GPU" or _has_native_bf16()))
        hints.append("a machine with more memory, or a larger lms.limit in the run's config.json")
        raise RunError(
            f"inference of one case at {'x'.join(map(str, workload.input_shape))} ({workload.policy}) is predicted to "
            f"need {format_gb(estimate.peak_bytes)} at its {estimate.peak_at} step, over the budget "
            f"{format_gb(budget)} (lms.limit {format_gb(limit)} less the planner's margin). Try: "
            + "; ".join(hints) + ".")
    return estimate


def _inference_hints(workload, mm, eval_cfg: EvaluateConfig, resampled: int | None, native: int | None,
                     scoring: bool, bf16: bool, below: int | None = None) -> list[str]:
    """What lowers one case's inference peak, each with the estimate it gives: no mirroring,
    and (``bf16``) bfloat16; with ``below``, only those whose estimate is lower than it."""
    from brats_seg.lms.planner.inference import estimate_inference
    from brats_seg.lms.planner.units import format_gb

    hints = []
    if eval_cfg.mirror and eval_cfg.mode == "whole":
        no_mirror = estimate_inference(workload, mm, mirror=False, resampled_voxels=resampled,
                                       native_voxels=native, scoring=scoring).peak_bytes
        if below is None or no_mirror < below:
            hints.append(f"evaluate.mirror=false ({format_gb(no_mirror)})")
    if bf16:
        peak = estimate_inference(dataclasses.replace(workload, policy="mixed_bfloat16"), mm,
                                  mirror=eval_cfg.mirror, resampled_voxels=resampled, native_voxels=native,
                                  scoring=scoring).peak_bytes
        if below is None or peak < below:
            hints.append(f"backend.precision=bf16 on a CPU with native bf16 ({format_gb(peak)})")
    return hints


class InferenceOutOfMemoryError(RunError):
    """Evaluation or prediction ran out of memory; the message gives the estimate, the measured
    peak and what lowers it (:func:`inference_memory_guard`).

    Attributes:
        estimate: the :class:`~brats_seg.lms.planner.inference.InferenceEstimate` of the largest case.
        measured_bytes: the peak measured at the failure (above the runtime on CPU), or None.
    """

    def __init__(self, message: str, estimate=None, measured_bytes: int | None = None) -> None:
        super().__init__(message)
        self.estimate = estimate
        self.measured_bytes = measured_bytes


@contextlib.contextmanager
def inference_memory_guard(run: TrainConfig, eval_cfg: EvaluateConfig, device: str, policy: str, records=(),
                           scoring: bool = True, baseline_bytes: int | None = None):
    """Turn running out of memory inside the block (TensorFlow's ``ResourceExhaustedError``,
    Python's ``MemoryError``) into an :class:`InferenceOutOfMemoryError`: the estimate of
    :func:`check_inference_memory` for the same cases, the measured peak, the memory available
    and what would lower the peak. Other errors pass unchanged.

    Args:
        run, eval_cfg, device, policy, records, scoring: as :func:`check_inference_memory`.
        baseline_bytes: on CPU, the RSS before the model was loaded (the measured peak is
            reported above it, as the estimate counts); None: no peak is reported on CPU.

    Raises:
        InferenceOutOfMemoryError: memory ran out inside the block.
    """
    try:
        yield
    except Exception as e:
        from brats_seg.lms.planner.advice import is_out_of_memory

        if not is_out_of_memory(e):
            raise
        raise inference_out_of_memory_error(e, run, eval_cfg, device, policy, records, scoring, baseline_bytes) from e


def inference_out_of_memory_error(exc: BaseException, run: TrainConfig, eval_cfg: EvaluateConfig, device: str,
                                  policy: str, records=(), scoring: bool = True,
                                  baseline_bytes: int | None = None) -> InferenceOutOfMemoryError:
    """The :class:`InferenceOutOfMemoryError` for ``exc`` (see :func:`inference_memory_guard`)."""
    import math

    from brats_seg.lms.planner.advice import first_line
    from brats_seg.lms.planner.inference import estimate_inference
    from brats_seg.lms.planner.memory_model import memory_model_for
    from brats_seg.lms.planner.units import format_gb
    from brats_seg.lms.planner.workload import Workload

    mm = memory_model_for(device)
    workload = dataclasses.replace(Workload.from_config(run), policy=policy)
    resampled = max((math.prod(r["resampled_shape"]) for r in records), default=None)
    native = max((math.prod(r["native_shape"]) for r in records), default=None)
    mirror = eval_cfg.mirror and eval_cfg.mode == "whole"
    estimate = estimate_inference(workload, mm, mirror=mirror, resampled_voxels=resampled, native_voxels=native,
                                  scoring=scoring)
    measured, available = _measured_and_available(device, baseline_bytes)
    facts = [f"The inference of one case at {'x'.join(map(str, workload.input_shape))} ({workload.policy}"
             f"{', mirrored' if mirror else ''}) was predicted to need {format_gb(estimate.peak_bytes)} at its "
             f"{estimate.peak_at} step."]
    if measured is not None:
        facts.append(f"Measured peak: {format_gb(measured)} at the failure (the allocation that failed not counted).")
    if available is not None:
        facts.append(f"Memory available: {available}.")
    native_bf16 = device == "GPU" or _has_native_bf16()
    hints = _inference_hints(workload, mm, eval_cfg, resampled, native, scoring,
                             bf16=workload.policy == "float32" and native_bf16, below=estimate.peak_bytes)
    hints.append(f"a machine (or job) with more memory free than the {format_gb(estimate.peak_bytes)} predicted "
                 "(lms.limit in the run's config.json at most what is free, so that the check before loading "
                 "the model refuses what does not fit)")
    what = "evaluating" if scoring else "predicting"
    message = (f"out of memory {what} a case: {first_line(exc)}. " + " ".join(facts)
               + " Try: " + "; ".join(hints) + ".")
    return InferenceOutOfMemoryError(message, estimate, measured)


def _has_native_bf16() -> bool:
    from brats_seg.cpu import has_native_bf16

    return has_native_bf16()


def _measured_and_available(device: str, baseline_bytes: int | None) -> tuple[int | None, str | None]:
    """The peak at the failure (above ``baseline_bytes`` on CPU) and the memory available, in words."""
    try:
        from brats_seg.lms.runtime.stats import device_peak_bytes

        peak = device_peak_bytes(device)
        measured = peak - baseline_bytes if device == "CPU" and baseline_bytes is not None else (
            peak if device == "GPU" else None)
    except Exception as e:  # a diagnosis aid: never hide the out-of-memory error behind another
        log.debug("no peak measured at the failure: %s", e)
        measured = None
    if device == "GPU":
        return measured, None
    from brats_seg.lms.planner.units import format_gb
    from brats_seg.training.oom import headroom, memory_facts

    room, where = headroom(memory_facts())
    return measured, f"{format_gb(room)} ({where.replace(' before the model was built', ' now')})"


def inference_device() -> str:
    """``GPU`` if TensorFlow sees one (call after ``backend.configure``), else ``CPU``."""
    import tensorflow as tf

    return "GPU" if tf.config.list_logical_devices("GPU") else "CPU"


def inference_policy() -> str:
    """Keras' global dtype policy, which ``backend.configure`` set from ``backend.precision``."""
    import keras

    return keras.mixed_precision.global_policy().name
