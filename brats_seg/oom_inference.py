"""Out of memory in evaluation and prediction: the check before, the guard during.

* Before: :func:`check_inference_memory` holds the predicted peak of one case's evaluation or
  prediction (:mod:`brats_seg.lms.planner.inference`, for the largest case) to the run's
  ``lms.limit`` before any model is loaded, and says what lowers it.
* During: :func:`inference_memory_guard` turns TensorFlow's ``ResourceExhaustedError`` and
  Python's ``MemoryError`` into an :class:`InferenceOutOfMemoryError` with the same estimate,
  the peak measured at the failure, the memory available and the settings that lower it.

What counts as out of memory and what is left (:func:`~brats_seg.oom.is_out_of_memory`,
:func:`~brats_seg.oom.headroom`, the measured peak) is :mod:`brats_seg.oom`'s, which training's
guard shares. Memory on CPU is counted as the estimate counts it: above the runtime (the RSS
before the model is loaded). Nothing here imports TensorFlow or Keras at module level.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
from collections.abc import Iterator

from brats_seg.backend import device_memory_bytes
from brats_seg.config import EvaluateConfig, TrainConfig
from brats_seg.cpu import device_has_native_bf16
from brats_seg.lms.planner.inference import InferenceEstimate, estimate_inference
from brats_seg.lms.planner.memory_model import MemoryModel, memory_model_for
from brats_seg.lms.planner.search import planning_budget
from brats_seg.lms.planner.units import format_gb, parse_limit
from brats_seg.lms.planner.workload import Workload
from brats_seg.memory import memory_facts
from brats_seg.oom import first_line, headroom, is_out_of_memory, peak_at_failure
from brats_seg.run_dir import RunError

__all__ = [
    "InferenceOutOfMemoryError",
    "check_inference_memory",
    "inference_memory_guard",
    "inference_out_of_memory_error",
    "measured_against_estimate",
]

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class _InferenceCase:
    """The largest case of an inference as the planner sees it (voxel counts None: the network grid)."""

    workload: Workload
    memory_model: MemoryModel
    resampled_voxels: int | None
    native_voxels: int | None
    mirror: bool
    scoring: bool
    members: int = 1
    preparation_bytes: int = 0
    pool_retained: bool = True

    def estimate(self, workload: Workload | None = None, mirror: bool | None = None) -> InferenceEstimate:
        return estimate_inference(
            self.workload if workload is None else workload,
            self.memory_model,
            mirror=self.mirror if mirror is None else mirror,
            resampled_voxels=self.resampled_voxels,
            native_voxels=self.native_voxels,
            scoring=self.scoring,
            members=self.members,
            preparation_bytes=self.preparation_bytes,
            pool_retained=self.pool_retained,
        )


def _largest_case(
    run: TrainConfig, eval_cfg: EvaluateConfig, device: str, policy: str, records, scoring: bool, members: int = 1
) -> _InferenceCase:
    return _InferenceCase(
        workload=dataclasses.replace(Workload.from_config(run), policy=policy),
        memory_model=memory_model_for(device),
        resampled_voxels=max((math.prod(r["resampled_shape"]) for r in records), default=None),
        native_voxels=max((math.prod(r["native_shape"]) for r in records), default=None),
        mirror=eval_cfg.mirror and eval_cfg.mode == "whole",
        scoring=scoring,
        members=members,
        preparation_bytes=max((int(r.get("preparation_bytes", 0)) for r in records), default=0),
        pool_retained=device == "CPU",  # TensorFlow's CPU allocator keeps the forward pass resident
    )


def measured_against_estimate(peak_bytes: int, estimate: InferenceEstimate) -> str:
    """``peak X GB above the runtime (predicted Y GB, at its Z step)``: what evaluate.py logs and
    predict.py prints once its cases are done (the inference-memory records read this wording)."""
    return (
        f"peak {peak_bytes / 1e9:.2f} GB above the runtime (predicted {estimate.peak_bytes / 1e9:.2f} GB, "
        f"at its {estimate.peak_at} step)"
    )


def check_inference_memory(
    run: TrainConfig,
    eval_cfg: EvaluateConfig,
    device: str,
    policy: str,
    records=(),
    scoring: bool = True,
    members: int = 1,
) -> InferenceEstimate:
    """Predict a case's evaluation (``scoring``) or prediction peak and hold it to the run's
    ``lms.limit`` (less the planning margin), before any model is loaded.

    Args:
        run: the run's config.
        eval_cfg: mirroring and mode.
        device: ``CPU`` or ``GPU``.
        policy: the dtype policy the model infers in (``float32``, ``mixed_bfloat16``).
        records: the cases' ``PreprocessRecord`` dicts (their resampled and native grids; a
            prediction's from the files' headers, with ``preparation_bytes``:
            :func:`brats_seg.data.prep_memory.prediction_records`); none: the network grid
            stands for both.
        scoring: evaluation (scored) or prediction (written only).
        members: the models of an ensemble (1: a run's).

    Returns:
        The :class:`~brats_seg.lms.planner.inference.InferenceEstimate` of the largest case.

    Raises:
        RunError: the estimate is over the budget, with the numbers and what to change.
    """
    case = _largest_case(run, eval_cfg, device, policy, records, scoring, members)
    workload, estimate = case.workload, case.estimate()
    limit = parse_limit(run.lms.limit, device_memory_bytes(device, run.backend.gpu_memory_limit_mb))
    budget = planning_budget(limit, case.memory_model)
    log.info(
        "inference of a case (%s, %s%s): predicted peak %s at its %s step, budget %s (lms.limit %s)",
        "x".join(map(str, workload.input_shape)),
        workload.policy,
        f", an ensemble of {members}" if members > 1 else "",
        format_gb(estimate.peak_bytes),
        estimate.peak_at,
        format_gb(budget),
        format_gb(limit),
    )
    if estimate.peak_bytes > budget:
        hints = _inference_hints(case, eval_cfg, bf16=workload.policy == "float32" and device_has_native_bf16(device))
        hints.append("a machine with more memory, or a larger lms.limit in the run's config.json")
        raise RunError(
            f"inference of one case at {'x'.join(map(str, workload.input_shape))} ({workload.policy}) is predicted to "
            f"need {format_gb(estimate.peak_bytes)} at its {estimate.peak_at} step, over the budget "
            f"{format_gb(budget)} (lms.limit {format_gb(limit)} less the planner's margin). Try: "
            + "; ".join(hints)
            + "."
        )
    return estimate


def _inference_hints(case: _InferenceCase, eval_cfg: EvaluateConfig, bf16: bool, below: int | None = None) -> list[str]:
    """What lowers one case's inference peak, each with the estimate it gives: no mirroring,
    and (``bf16``) bfloat16; with ``below``, only those whose estimate is lower than it."""
    hints = []
    if case.mirror:
        no_mirror = case.estimate(mirror=False).peak_bytes
        if below is None or no_mirror < below:
            hints.append(f"evaluate.mirror=false ({format_gb(no_mirror)})")
    if bf16:
        peak = case.estimate(
            dataclasses.replace(case.workload, policy="mixed_bfloat16"), mirror=eval_cfg.mirror
        ).peak_bytes
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
def inference_memory_guard(
    run: TrainConfig,
    eval_cfg: EvaluateConfig,
    device: str,
    policy: str,
    records=(),
    scoring: bool = True,
    baseline_bytes: int | None = None,
    members: int = 1,
) -> Iterator[None]:
    """Turn running out of memory inside the block (TensorFlow's ``ResourceExhaustedError``,
    Python's ``MemoryError``) into an :class:`InferenceOutOfMemoryError`: the estimate of
    :func:`check_inference_memory` for the same cases, the measured peak, the memory available
    and what would lower the peak. Other errors pass unchanged.

    Args:
        run, eval_cfg, device, policy, records, scoring, members: as :func:`check_inference_memory`.
        baseline_bytes: on CPU, the RSS before the model was loaded (the measured peak is
            reported above it, as the estimate counts); None: no peak is reported on CPU.

    Raises:
        InferenceOutOfMemoryError: memory ran out inside the block.
    """
    try:
        yield
    except Exception as e:
        if not is_out_of_memory(e):
            raise
        raise inference_out_of_memory_error(
            e, run, eval_cfg, device, policy, records, scoring, baseline_bytes, members
        ) from e


def inference_out_of_memory_error(
    exc: BaseException,
    run: TrainConfig,
    eval_cfg: EvaluateConfig,
    device: str,
    policy: str,
    records=(),
    scoring: bool = True,
    baseline_bytes: int | None = None,
    members: int = 1,
) -> InferenceOutOfMemoryError:
    """The :class:`InferenceOutOfMemoryError` for ``exc`` (see :func:`inference_memory_guard`)."""
    case = _largest_case(run, eval_cfg, device, policy, records, scoring, members)
    workload, estimate = case.workload, case.estimate()
    measured = peak_at_failure(device, baseline_bytes)
    facts = [
        f"The inference of one case at {'x'.join(map(str, workload.input_shape))} ({workload.policy}"
        f"{', mirrored' if case.mirror else ''}) was predicted to need {format_gb(estimate.peak_bytes)} at its "
        f"{estimate.peak_at} step."
    ]
    if measured is not None:
        facts.append(f"Measured peak: {format_gb(measured)} at the failure (the allocation that failed not counted).")
    if device == "CPU":
        room, where = headroom(memory_facts())
        facts.append(f"Memory available: {format_gb(room)} ({where.replace(' before the model was built', ' now')}).")
    hints = _inference_hints(
        case, eval_cfg, bf16=workload.policy == "float32" and device_has_native_bf16(device), below=estimate.peak_bytes
    )
    hints.append(
        f"a machine (or job) with more memory free than the {format_gb(estimate.peak_bytes)} predicted "
        "(lms.limit in the run's config.json at most what is free, so that the check before loading "
        "the model refuses what does not fit)"
    )
    what = "evaluating" if scoring else "predicting"
    message = f"out of memory {what} a case: {first_line(exc)}. " + " ".join(facts) + " Try: " + "; ".join(hints) + "."
    return InferenceOutOfMemoryError(message, estimate, measured)
