"""The epoch loop around the step functions of :mod:`brats_seg.training.steps`.

Drives Keras callbacks as ``model.fit`` would (``on_train_begin``, ``on_epoch_begin``,
``on_train_batch_begin/end``, ``on_test_begin/end`` around the validation pass, ``on_epoch_end``
with the training means and, every ``val_every`` epochs, the ``val_`` ones,
``model.stop_training``), shows a progress bar on
the chief, and stops after the current step when a worker was signalled
(:mod:`brats_seg.training.preemption`). Stopping decisions (early stopping, a callback's
``stop_training``) are the chief's, sent to every worker, so that all leave the loop at
the same step.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import sys
import time
from collections.abc import Callable

import tensorflow as tf

from brats_seg.training.budget import TrainingClock
from brats_seg.training.checkpoint import ResumePosition
from brats_seg.training.steps import EpochSums, chief_value, chief_values

__all__ = ["LoopOutcome", "LoopShape", "evaluate", "run_epochs"]

log = logging.getLogger(__name__)

PROGRESS_KEYS = ("loss", "dice_mean")  # shown on the progress bar


@dataclasses.dataclass(frozen=True)
class LoopShape:
    """How many epochs of how many steps, validated how often: what every worker must agree on."""

    epochs: int  # trainer.epochs: the run's epochs in all
    steps: int  # steps per epoch (TrainInput.steps_per_epoch)
    val_every: int  # trainer.val_every: epochs between validations
    stage: object = (
        None  # a patch schedule's stage (training.stages.StageRun): where this loop ends; None = the run's end
    )


@dataclasses.dataclass
class LoopOutcome:
    """How the loop ended: ``finished`` (all epochs or early stopping), ``preempted``, or
    ``stage_done`` (a patch schedule's stage ended; ``epoch`` is the next stage's first).

    ``epoch`` (0-based) and ``step`` locate a preemption: ``step`` steps of ``epoch`` done
    (``step == 0``: stopped at an epoch boundary, nothing partial to save).
    """

    status: str
    epoch: int = 0
    step: int = 0
    sums: EpochSums | None = None
    train_time_s: float = 0.0  # training seconds spent at the stop (the budget's clock)


def evaluate(eval_step: Callable, dataset) -> EpochSums:
    """Every batch of ``dataset`` through ``eval_step``; the summed metrics."""
    sums = EpochSums()
    for x, y in dataset:
        sums.add(eval_step(x, y))
    return sums


def _budget_spent(strategy, clock: TrainingClock, single_worker: bool) -> bool:
    """Whether the budget is spent, the chief's clock deciding (and setting the learning rate's
    share) for every worker, so that all stop at the same step with the same rates."""
    if not clock.budgeted:
        return False
    if single_worker:
        return clock.over
    share, over = (float(v) for v in chief_values(strategy, [tf.constant(clock.share), tf.constant(float(clock.over))]))
    if clock.schedule is not None:
        clock.schedule.set_progress(share)
    return over > 0


def _stage_over(strategy, clock: TrainingClock, end_s: float | None, single_worker: bool) -> bool:
    """Whether a patch-schedule stage's training seconds are spent, the chief's clock deciding."""
    if end_s is None:
        return False
    over = clock.spent_s >= end_s
    if single_worker:
        return over
    return float(chief_value(strategy, tf.constant(float(over))).numpy()) > 0


def run_epochs(
    *,
    strategy,
    model,
    train_step: Callable,
    iterator,
    validate: Callable[[], EpochSums],
    shape: LoopShape,
    start: ResumePosition,
    callbacks,
    preemption,
    is_chief: bool = True,
    single_worker: bool = True,
    clock: TrainingClock | None = None,
) -> LoopOutcome:
    """Train epochs ``start.epoch+1 .. shape.epochs`` (1-based), resuming at ``start.step``.

    The caller calls ``callbacks.on_train_begin`` before and ``on_train_end`` after a finished run
    (a patch schedule runs this once per stage).

    Args:
        strategy: the run's strategy.
        model: the training model (its ``stop_training`` is honoured).
        train_step: ``(iterator, stop) -> sums`` (:func:`~brats_seg.training.steps.make_train_step`).
        iterator: the distributed training dataset's iterator, at ``start``.
        validate: ``() -> sums``: the validation pass (:func:`evaluate` of the eval step,
            :func:`~brats_seg.training.steps.make_eval_step`, over the local validation batches).
        shape: the epochs, steps per epoch and validation interval (:class:`LoopShape`).
        start: where training starts: epochs done, steps of the next one done (a preempted run)
            and those steps' sums (:class:`~brats_seg.training.checkpoint.ResumePosition`).
        callbacks: a ``keras.callbacks.CallbackList`` holding the run's callbacks.
        preemption: a :class:`~brats_seg.training.preemption.PreemptionFlag`.
        is_chief: show the progress bar.
        single_worker: no other process takes part; a signal during a step stops right after
            it (with several workers the next step carries the flag to all, so they stop
            one step later, together).
        clock: the training time spent and its budget (:mod:`brats_seg.training.budget`): each
            epoch logs ``train_s`` and the run's ``train_time_s``; a spent budget ends the
            epoch after the step, which is validated and saved, and the run as finished.
        shape.stage: a patch schedule's stage (:class:`~brats_seg.training.stages.StageRun`) or
            None: the loop ends (``stage_done``, at the next epoch) after epoch ``stage.end_epoch`` or
            after the step at which the clock reaches ``stage.end_s`` (the epoch cut there,
            validated and saved); each epoch logs ``stage`` (1-based) when there are several.
    """
    from tqdm.auto import tqdm

    epochs, steps, val_every, stage = shape.epochs, shape.steps, shape.val_every, shape.stage
    initial_epoch, initial_step = start.epoch, start.step
    partial = EpochSums.from_dict(start.partial) if start.partial else None  # the sums of those steps
    clock = clock or TrainingClock()
    if _budget_spent(strategy, clock, single_worker):
        log.info(
            "the training budget (trainer.time_budget_s=%g) is spent (%.0f s trained): nothing to train",
            clock.budget_s,
            clock.spent_s,
        )
        return LoopOutcome("finished", train_time_s=clock.spent_s)
    several = stage is not None and stage.count > 1
    end_epoch = stage.end_epoch if stage is not None else epochs
    for epoch in range(initial_epoch, end_epoch):
        first = initial_step if epoch == initial_epoch else 0
        sums = partial if (epoch == initial_epoch and partial is not None) else EpochSums()
        callbacks.on_epoch_begin(epoch)
        log.info("epoch %d/%d: training from step %d of %d", epoch + 1, epochs, first + 1, steps)
        bar = tqdm(
            total=steps,
            initial=first,
            desc=f"epoch {epoch + 1}/{epochs}",
            unit="step",
            leave=True,
            disable=not (is_chief and sys.stderr.isatty()),
            dynamic_ncols=True,
        )
        stop = spent = stage_over = False
        step_times: list[float] = []
        with bar:
            for step in range(first, steps):
                callbacks.on_train_batch_begin(step)
                started = time.perf_counter()
                out = {k: float(v) for k, v in train_step(iterator, tf.constant(preemption.requested)).items()}
                step_times.append(time.perf_counter() - started)
                clock.add(step_times[-1])
                if several and epoch == initial_epoch and step == first:  # a new input shape: traced again
                    log.info(
                        "stage %d/%d (%s): first step %.2f s (the step traced for its input)",
                        stage.index + 1,
                        stage.count,
                        stage.name,
                        step_times[-1],
                    )
                # a worker signalled before this step (the flag travels in the step), or this
                # single-worker process signalled during it
                stop = out.pop("stop") > 0 or (single_worker and preemption.requested)
                sums.add(out)
                logs = sums.means()
                callbacks.on_train_batch_end(step, logs)
                bar.set_postfix({k: f"{logs[k]:.4f}" for k in PROGRESS_KEYS if k in logs}, refresh=False)
                bar.update(1)
                if stop and step + 1 < steps:
                    return LoopOutcome("preempted", epoch, step + 1, sums, clock.spent_s)
                spent = _budget_spent(strategy, clock, single_worker)
                if spent:
                    log.info(
                        "training budget spent: %.0f s of trainer.time_budget_s=%g after step %d of %d of "
                        "epoch %d; validating and finishing",
                        clock.spent_s,
                        clock.budget_s,
                        step + 1,
                        steps,
                        epoch + 1,
                    )
                    break
                stage_over = several and not stage.last and _stage_over(strategy, clock, stage.end_s, single_worker)
                if stage_over:
                    log.info(
                        "stage %d/%d (%s) ends: %.0f s trained of its %.0f after step %d of %d of epoch %d; "
                        "validating, then the next stage",
                        stage.index + 1,
                        stage.count,
                        stage.name,
                        clock.spent_s,
                        stage.end_s,
                        step + 1,
                        steps,
                        epoch + 1,
                    )
                    break
        logs = sums.means()
        if step_times:  # seconds per training step (the median: the first one traces the step)
            logs["step_s"] = statistics.median(step_times)
        logs["train_s"] = sum(step_times)  # this epoch's training, validation excluded
        logs["steps"] = first + len(step_times)  # steps this epoch took (a cut or resumed epoch: what it took)
        logs["train_time_s"] = clock.spent_s  # the run's, across resumes
        if several:
            logs["stage"] = stage.index + 1
        if stage is not None and stage.plan is not None:  # beside measured_bytes: the same quantity
            logs["planned_bytes"] = float(stage.plan.predicted_peak_bytes)  # this stage's plan, above the runtime
        stage_end = several and not stage.last and (stage_over or epoch + 1 == stage.end_epoch)
        if (epoch + 1) % max(val_every, 1) == 0 or spent or stage_end:  # as Keras' validation_freq; ends validated
            started = time.perf_counter()
            callbacks.on_test_begin()  # as Keras' fit around its validation pass
            logs.update(validate().means("val_"))
            callbacks.on_test_end()
            logs["val_s"] = time.perf_counter() - started  # the validation pass, seconds
        callbacks.on_epoch_end(epoch, logs)
        # the chief's figures are the run's (history.csv, MLflow); another worker's may differ after a
        # mid-epoch resume (it does not hold the chief's partial sums), so it says them at DEBUG only
        log.log(
            logging.INFO if is_chief else logging.DEBUG,
            "epoch %d/%d: %s",
            epoch + 1,
            epochs,
            ", ".join(f"{k} {v:.4f}" for k, v in logs.items() if k.endswith(PROGRESS_KEYS)),
        )
        model.stop_training = bool(chief_value(strategy, tf.constant(float(bool(model.stop_training)))).numpy())
        if model.stop_training or spent or epoch + 1 == epochs:  # done: a signal now has nothing left to save
            break
        if stop:  # signalled during the epoch's last step: the epoch is complete and saved
            return LoopOutcome("preempted", epoch + 1, 0, train_time_s=clock.spent_s)
        if stage_end:
            return LoopOutcome("stage_done", epoch + 1, 0, train_time_s=clock.spent_s)
    return LoopOutcome("finished", train_time_s=clock.spent_s)
