"""A wall-clock training budget (``trainer.time_budget_s``) and the learning rate that fits it.

Comparing recipes "at equal time" (patches against whole volumes) needs each run to stop after
the same training time and to have annealed its learning rate by then, whatever its step time:

* :class:`TrainingClock` sums the training steps' wall time (input waits included, validation
  not) over the run, resumes included (``state.json``'s ``train_time_s``); once it reaches the
  budget the run ends after the step, validates, saves and finishes as if its epochs were done.
* :class:`BudgetCosineDecay` is the cosine schedule of ``trainer.lr_schedule=cosine`` with the
  time spent in place of the step: after the linear warm-up (in steps, as without a budget), the
  rate at a step is ``base * (alpha + (1 - alpha) * (1 + cos(pi * spent / budget)) / 2)``, so
  every run reaches the floor as its budget ends. ``trainer.epochs`` is then an upper bound.

Time is not deterministic: a budgeted run resumes where it stopped, with the time it had spent,
but its steps' learning rates (and its last step) are not bit-identical to an uninterrupted
run's, unlike a run without a budget.
"""

from __future__ import annotations

import math

import keras
import tensorflow as tf

__all__ = ["BudgetCosineDecay", "TrainingClock"]

ALPHA = 0.01  # the cosine's floor, as a share of the peak rate (as CosineDecay's alpha in make_optimizer)


@keras.saving.register_keras_serializable(package="brats_seg")
class BudgetCosineDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warm-up over ``warmup_steps``, then a cosine over the share of the budget spent.

    The share is a variable the training loop sets before each step (:meth:`set_progress`).
    """

    def __init__(self, peak: float, warmup_steps: int, alpha: float = ALPHA) -> None:
        self.peak, self.warmup_steps, self.alpha = float(peak), int(warmup_steps), float(alpha)
        self.progress = tf.Variable(0.0, trainable=False, dtype=tf.float32, name="budget_progress")

    def set_progress(self, share: float) -> None:
        self.progress.assign(min(max(float(share), 0.0), 1.0))

    def __call__(self, step):
        step = tf.cast(step, tf.float32)
        cosine = self.alpha + (1.0 - self.alpha) * 0.5 * (1.0 + tf.cos(math.pi * tf.identity(self.progress)))
        if self.warmup_steps <= 0:
            return self.peak * cosine
        warm = self.peak * tf.minimum(step / float(self.warmup_steps), 1.0)  # as CosineDecay's warm-up
        return tf.where(step < float(self.warmup_steps), warm, self.peak * cosine)

    def get_config(self) -> dict:
        return {"peak": self.peak, "warmup_steps": self.warmup_steps, "alpha": self.alpha}


class TrainingClock:
    """Training seconds spent (validation excluded) against ``budget_s`` (0 = no budget).

    Args:
        budget_s: ``trainer.time_budget_s``.
        spent_s: seconds spent before this start (a resumed run's ``train_time_s``).
        schedule: a :class:`BudgetCosineDecay` to keep at the share spent, or None.
    """

    def __init__(self, budget_s: float = 0.0, spent_s: float = 0.0, schedule=None) -> None:
        self.budget_s, self.spent_s = float(budget_s or 0.0), float(spent_s or 0.0)
        self.schedule = schedule if isinstance(schedule, BudgetCosineDecay) else None
        self.sync()

    @property
    def budgeted(self) -> bool:
        return self.budget_s > 0

    @property
    def over(self) -> bool:
        """The budget is spent: no further step."""
        return self.budgeted and self.spent_s >= self.budget_s

    @property
    def share(self) -> float:
        return self.spent_s / self.budget_s if self.budgeted else 0.0

    def add(self, seconds: float) -> None:
        self.spent_s += float(seconds)
        self.sync()

    def sync(self) -> None:
        """The schedule at the share spent (before the next step reads it)."""
        if self.schedule is not None:
            self.schedule.set_progress(self.share)
