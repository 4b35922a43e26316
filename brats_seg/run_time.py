"""What a training run will take, before it starts: seconds per step, per epoch (training and
validation) and for the whole run, on this dataset and this CPU.

The step is the memory plan's (:attr:`~brats_seg.lms.planner.plan.Plan.predicted_step_s`: the
step-time model of :mod:`brats_seg.lms.planner.step_time` plus what the plan recomputes); an epoch
is :func:`~brats_seg.data.patches.steps_per_epoch` of them over the training cases; a validation
pass is one forward pass per validation case on the whole grid, or, for a stage trained on
patches, one per sliding window of its patch (:func:`~brats_seg.evaluation.inference.sliding.
sliding_window_starts` at the evaluation's default overlap, as the loop validates), priced by the
same model's forward costs. A run ends at ``trainer.epochs`` or, with ``trainer.time_budget_s``,
when the training clock (validation excluded) reaches it; with ``trainer.patch_schedule`` each
stage is priced apart. On a GPU there is no step-time model: nothing is predicted.

What it leaves out: the data pipeline (it overlaps the step), checkpoint writes, the first
step's tracing (a few seconds each stage) and early stopping (``trainer.patience``). The numbers
are as good as the step-time model on this CPU (``calibrated``; an uncalibrated CPU's are an
upper estimate), and are checked against measured runs in ``tests/unit/test_run_time.py``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

from brats_seg.config import EvaluateConfig, TrainConfig
from brats_seg.lms.planner.units import format_duration, format_seconds

__all__ = ["RunTime", "StageTime", "forward_s", "predict_run_time", "validation_s"]


@dataclass(frozen=True)
class StageTime:
    """One stage (or the run without a schedule).

    Attributes:
        name: ``whole`` or the patch, e.g. ``48x48x48``.
        steps_per_epoch: training steps an epoch takes.
        step_s: seconds a training step takes (the plan's).
        val_s: seconds one validation pass over the validation cases takes, as this stage validates.
        epochs: epochs the stage trains (with a budget, what its share of the clock holds; may be
            a fraction).
    """

    name: str
    steps_per_epoch: int
    step_s: float
    val_s: float
    epochs: float

    @property
    def epoch_train_s(self) -> float:
        return self.steps_per_epoch * self.step_s


@dataclass(frozen=True)
class RunTime:
    """A run's predicted time (:func:`predict_run_time`)."""

    stages: tuple[StageTime, ...]
    n_train: int
    n_val: int
    val_every: int
    budget_s: float | None
    calibrated: bool
    confidence: str = ""

    @property
    def train_s(self) -> float:
        return sum(s.epochs * s.epoch_train_s for s in self.stages)

    @property
    def val_s(self) -> float:
        return sum(s.epochs / self.val_every * s.val_s for s in self.stages)

    @property
    def total_s(self) -> float:
        return self.train_s + self.val_s

    @property
    def epochs(self) -> float:
        return sum(s.epochs for s in self.stages)

    def lines(self) -> list[str]:
        """The estimate in words, a stage a line (for plan.txt, the start's log and plan_memory.py)."""
        out = [
            f"time: {self.n_train} training and {self.n_val} validation case(s), validation every "
            f"{self.val_every} epoch(s); {self.confidence}"
        ]
        for s in self.stages:
            out.append(
                f"  {s.name}: step {format_seconds(s.step_s)}, epoch {format_duration(s.epoch_train_s)} training "
                f"({s.steps_per_epoch} steps) + {format_duration(s.val_s)} validation, {s.epochs:.1f} epoch(s)"
            )
        limit = (
            f"the budget of {format_duration(self.budget_s)} of training"
            if self.budget_s
            else f"{self.epochs:.0f} epochs"
        )
        out.append(
            f"  run: {format_duration(self.total_s)} ({format_duration(self.train_s)} training + "
            f"{format_duration(self.val_s)} validation) for {limit}"
        )
        return out


def forward_s(time_model, workload) -> float:
    """Seconds of one forward pass of ``workload`` (its input shape and batch), by the step-time model."""
    from brats_seg.lms.planner.cost import compute_network_cost

    net = compute_network_cost(workload)
    return sum(time_model.block_forward_s(net, i) for i in range(len(net.blocks)))


def _windows(grid: Sequence[int], patch: Sequence[int], overlap: float) -> int:
    from brats_seg.evaluation.inference.sliding import sliding_window_starts

    return math.prod(len(sliding_window_starts(int(g), int(p), overlap)) for g, p in zip(grid, patch))


def validation_s(cfg: TrainConfig, time_model, n_val: int) -> float:
    """Seconds of one validation pass over ``n_val`` cases as ``cfg`` (one stage) validates: the
    whole grid at batch 1, or sliding windows of its patch, one at a time."""
    from brats_seg.lms.planner.workload import Workload

    grid = tuple(int(g) for g in cfg.resolution.shape)
    workload = dataclasses.replace(Workload.from_config(cfg), input_batches=0, validates=False)
    patch = cfg.trainer.patch_size
    if not patch:
        return n_val * forward_s(time_model, workload.with_input(grid, 1))
    windows = _windows(grid, patch, EvaluateConfig().window_overlap)
    return n_val * windows * forward_s(time_model, workload.with_input(tuple(int(p) for p in patch), 1))


def predict_run_time(run, n_train: int, n_val: int, time_model=None) -> RunTime | None:
    """The run's time on this CPU (None on a GPU, or without a step time in its plans).

    Args:
        run: the :class:`~brats_seg.resolve.ResolvedRun` (its config, plan and stages' plans).
        n_train, n_val: the training and validation cases.
        time_model: price with this :class:`~brats_seg.lms.planner.step_time.CpuTimeModel` instead
            of this CPU's (the plans' step times are then re-priced: another CPU's records); a run
            resolved without a plan is then priced without recomputation.
    """
    from brats_seg.data.patches import steps_per_epoch
    from brats_seg.lms.planner.step_time import cpu_time_model
    from brats_seg.resolve import stage_config

    if run.device != "CPU" or (run.plan is None and time_model is None):
        return None
    cfg, t = run.config, run.config.trainer
    model = time_model or cpu_time_model()
    if run.stages:
        parts = [(stage_config(cfg, p.stage), p.plan, p.stage.share, p.stage.name) for p in run.stages]
    else:
        parts = [(cfg, run.plan, 1.0, "x".join(map(str, t.patch_size)) if t.patch_size else "whole")]
    if time_model is None and any(plan.predicted_step_s is None for _, plan, _, _ in parts):
        return None
    grid = tuple(int(g) for g in cfg.resolution.shape)
    stages = []  # a step trains the global batch, each replica its share at once: the plan's step time
    for k, (c, plan, share, name) in enumerate(parts):
        steps = steps_per_epoch(n_train, grid, c.trainer.patch_size, c.trainer.batch_size, t.steps_per_epoch)
        step_s = _step_s(c, plan, time_model)
        epoch_s = steps * step_s
        if t.time_budget_s:
            epochs = min(share * t.time_budget_s / epoch_s, float(t.epochs))
        elif run.stages:
            first = run.stages[k].first_epoch or 0
            last = run.stages[k + 1].first_epoch if k + 1 < len(run.stages) else t.epochs
            epochs = float((last or t.epochs) - first)
        else:
            epochs = float(t.epochs)
        stages.append(StageTime(name, steps, step_s, validation_s(c, model, n_val), epochs))
    return RunTime(
        stages=tuple(stages),
        n_train=n_train,
        n_val=n_val,
        val_every=max(1, int(t.val_every)),
        budget_s=t.time_budget_s or None,
        calibrated=model.calibrated,
        confidence=_confidence(model),
    )


def _step_s(cfg: TrainConfig, plan, time_model) -> float:
    """The plan's step time, or with ``time_model`` the step priced by it plus the plan's recomputation."""
    if time_model is None:
        return plan.predicted_step_s
    from brats_seg.lms.planner.cost import compute_network_cost
    from brats_seg.lms.planner.workload import Workload

    workload = dataclasses.replace(Workload.from_config(cfg), input_batches=0, validates=False)
    return time_model.step_s(compute_network_cost(workload)) + (float(plan.overhead_s or 0.0) if plan else 0.0)


def _confidence(model) -> str:
    """How far to trust the step times: the calibration's error on points its fit did not see, or
    that the CPU has none (an upper estimate)."""
    if not model.calibrated:
        return (
            f"an upper estimate: this CPU has no step-time calibration ({model.cpu}); lms.calibrate=now "
            "measures one in minutes"
        )
    held_out = model.held_out or "not recorded"
    return (
        f"step-time model of this CPU ({model.cpu}; {model.source}); its error on points it was not fitted on: "
        f"{held_out}"
    )
