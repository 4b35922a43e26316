"""The start every command that infers with a training run's model shares, before TensorFlow loads.

:func:`check_run_dir` checks a run folder can be evaluated (its config, its checkpoint, the
split and ``evaluate.*`` values); :func:`start_inference` adds the inference settings the run gets
and the backend decided for it (:func:`brats_seg.resolve.resolve_inference`), as
``scripts/evaluate.py`` and ``scripts/predict.py`` both start. Pure Python: a wrong ``run_dir``
fails in a second.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from brats_seg.backend import ResolvedBackend
from brats_seg.choices import check_choice
from brats_seg.config import BackendConfig, EvaluateConfig, Split, TrainConfig
from brats_seg.evaluation.inference.run import (
    RunError,
    check_evaluate_config,
    checkpoint_path,
    inference_settings,
    load_run_config,
)
from brats_seg.patch_schedule import inference_patch

__all__ = ["InferenceStart", "check_run_dir", "start_inference"]


def check_run_dir(
    run_dir: str | Path,
    checkpoint: str = "best",
    split: str | None = None,
    eval_cfg: EvaluateConfig | None = None,
) -> TrainConfig:
    """Check a run folder can be evaluated (and the settings make sense), without importing TensorFlow.

    Returns:
        The run's config.

    Raises:
        RunError: empty ``run_dir``, no config.json, no checkpoint, a bad split name or
            ``evaluate.*`` value.
    """
    if not str(run_dir).strip():
        raise RunError("run_dir is not set: pass run_dir=<the training run's folder> (e.g. outputs/<run>).")
    if split is not None:
        check_choice(split, Split, "split", error=RunError, hint="The run's split.json lists val and test.")
    config = load_run_config(run_dir)
    checkpoint_path(run_dir, checkpoint)
    if eval_cfg is not None:
        check_evaluate_config(inference_settings(eval_cfg, config), config.model, inference_patch(config))
    return config


@dataclasses.dataclass(frozen=True)
class InferenceStart:
    """What ``scripts/evaluate.py`` and ``scripts/predict.py`` decide before TensorFlow loads.

    Attributes:
        run: the trained run's config (``config.json``, checked).
        evaluate: the inference settings it gets (a patch run: windows of its patch).
        backend: the backend decided for inference (:func:`brats_seg.resolve.resolve_inference`),
            to apply with :func:`brats_seg.backend.configure`.
    """

    run: TrainConfig
    evaluate: EvaluateConfig
    backend: ResolvedBackend


def start_inference(
    run_dir: str | Path,
    checkpoint: str,
    eval_cfg: EvaluateConfig,
    backend: BackendConfig,
    precision_given: bool,
    split: str | None = None,
) -> InferenceStart:
    """The one TensorFlow-free start of the commands that infer with a training run's model: the
    run folder checked (:func:`check_run_dir`), the inference settings derived from the run
    (:func:`~brats_seg.evaluation.inference.run.inference_settings`) and the backend decided --
    the run's own precision (a bf16 run infers in bf16) unless ``backend.precision=`` is given.
    Nothing is written into the command's config.

    Raises:
        RunError: the run folder cannot be evaluated (named).
        BackendError: a backend or given precision this machine cannot run.
    """
    from brats_seg.resolve import resolve_inference

    run = check_run_dir(run_dir, checkpoint, split, eval_cfg)
    return InferenceStart(run, inference_settings(eval_cfg, run), resolve_inference(run, backend, precision_given))
