"""A run's stages as the training loop runs them (``trainer.patch_schedule``; one stage without it).

:mod:`brats_seg.patch_schedule` says what a schedule is; :func:`brats_seg.resolve.resolve_run`
planned each stage. Here each stage becomes what the loop needs: its config
(:func:`brats_seg.resolve.stage_config`: the stage's patch and batch), its steps per epoch, where
it ends (an epoch without a budget, a second of training with one) and its model. A run without a
schedule is one stage with the run's own config, so both take the same path.

* **Which stage an epoch trains in** is a pure function of the run folder: without a budget, of
  the epoch (the stages' first epochs, planned at the start); with one, of the training seconds
  spent when the epoch began (``state.json``'s history). A stage change only happens between
  epochs (the epoch in which a stage's time ends is cut after that step, validated and saved, as
  a budget's end is), so a resumed run is always inside one stage, at an exact data position.
* **The models** of the stages are built on one set of layers (:class:`StageModels`): weights and
  the optimizer (its moments and step, hence the learning-rate schedule) run on across stages;
  each stage's model has its own input shape and its own memory plan's wrapper, and its first
  step traces the step function again (the loop logs how long that first step took).
* **Model selection** with a schedule: ``best.keras`` is chosen among the last stage's epochs
  only, whose validation infers the way evaluation will (the last stage's patch by sliding
  windows, or the whole volume); earlier stages' validation scores are logged, not selected, and
  early stopping counts only in the last stage.

Imported after :func:`brats_seg.backend.configure` (the data pipeline it reads steps from imports
TensorFlow); the functions are pure.
"""

from __future__ import annotations

import bisect
import dataclasses
import logging
from collections.abc import Sequence

from brats_seg.config import TrainConfig
from brats_seg.data.pipeline import TrainInput
from brats_seg.resolve import ResolvedRun, stage_config

__all__ = ["StageModels", "StageRun", "stage_of_epoch", "stage_runs", "total_steps"]

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class StageRun:
    """One stage as the loop runs it.

    Attributes:
        index, count: the stage's place (0-based) and how many there are.
        name: ``48x48x48`` or ``whole`` (``""`` for a run without a schedule).
        config: the run's config as this stage trains it (its patch and global batch).
        plan: this stage's memory plan.
        steps: training steps per epoch of this stage.
        first_epoch, end_epoch: without a budget, the stage's epochs ``[first, end)``; with one,
            None and the run's ``trainer.epochs`` (the clock ends the stage).
        end_s: with a budget, the training seconds at which the stage ends; None without.
    """

    index: int
    count: int
    name: str
    config: TrainConfig
    plan: object
    steps: int
    first_epoch: int | None
    end_epoch: int
    end_s: float | None

    @property
    def last(self) -> bool:
        return self.index + 1 == self.count


def stage_runs(run: ResolvedRun, n_train: int) -> list[StageRun]:
    """The run's stages over ``n_train`` training cases (one, the run itself, without a schedule).

    Raises:
        ValueError: a stage whose crops cannot fill one batch (from :meth:`TrainInput.steps_per_epoch`).
    """
    cfg = run.config
    t, grid = cfg.trainer, cfg.resolution.shape
    if not run.stages:
        steps = TrainInput.from_config(cfg).steps_per_epoch(n_train, grid)
        return [StageRun(0, 1, "", cfg, run.plan, steps, 0, t.epochs, None)]
    out, cumulative = [], 0.0
    for i, planned in enumerate(run.stages):
        stage_cfg = stage_config(cfg, planned.stage)
        cumulative += planned.stage.share
        last = i + 1 == len(run.stages)
        steps = TrainInput.from_config(stage_cfg).steps_per_epoch(n_train, grid)
        if t.time_budget_s:
            end_epoch, end_s = t.epochs, (float(t.time_budget_s) if last else cumulative * float(t.time_budget_s))
        else:
            end_epoch, end_s = (t.epochs if last else run.stages[i + 1].first_epoch), None
        out.append(
            StageRun(
                i,
                len(run.stages),
                planned.stage.name,
                stage_cfg,
                planned.plan,
                steps,
                planned.first_epoch,
                end_epoch,
                end_s,
            )
        )
    return out


def stage_of_epoch(stages: Sequence[StageRun], epoch: int, spent_s: float) -> int:
    """The stage epoch ``epoch`` (0-based) trains in, the run having spent ``spent_s`` training
    seconds when it began (a budgeted run's clock at that epoch's start)."""
    if len(stages) == 1:
        return 0
    if stages[0].end_s is None:
        return bisect.bisect_right([s.first_epoch for s in stages], epoch) - 1
    return min(bisect.bisect_right([s.end_s for s in stages], spent_s), len(stages) - 1)


def total_steps(stages: Sequence[StageRun], epochs: int) -> int:
    """Training steps of the whole run without a budget: each stage's epochs times its steps
    (the cosine's length); with one stage ``epochs * steps``."""
    return (
        sum((s.end_epoch - (s.first_epoch or 0)) * s.steps for s in stages)
        if len(stages) > 1
        else (epochs * stages[0].steps)
    )


class StageModels:
    """The stages' training models on the layers of the run's compiled models: stage 0's (or the
    run's own) is ``compiled.model``; another's is built when the loop enters it, under the
    strategy's scope, with that stage's plan, and compiled with the same optimizer and loss."""

    def __init__(self, compiled, stages: Sequence[StageRun], backend, strategy, first: int = 0) -> None:
        self.compiled, self.stages, self.backend, self.strategy = compiled, stages, backend, strategy
        self._models = {first: (compiled.model, compiled.offload_stats)}

    def model(self, index: int):
        """``(model, offload_stats)`` of stage ``index``."""
        if index not in self._models:
            from brats_seg.training.build import build_train_model

            stage = self.stages[index]
            with self.strategy.scope():
                model, stats = build_train_model(stage.config, stage.plan, self.backend, self.compiled.blocks)
                model.compile(optimizer=self.compiled.model.optimizer, loss=self.compiled.loss, jit_compile=False)
            self._models[index] = (model, stats)
        return self._models[index]
