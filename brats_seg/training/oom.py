"""Training's two hooks into :mod:`brats_seg.oom`, where out of memory is decided and told.

* :class:`MemoryRecordCallback` keeps a :class:`~brats_seg.oom.MemoryWatch` at the run's
  position (a Keras callback: it needs the step loop's events, so it lives with training).
* :func:`warn_about_dead_run` is the run folder lock's ``on_takeover``: it logs the diagnosis of
  the run that died holding it (:func:`~brats_seg.oom.takeover_message`) to the training log.

The watch, the guard that turns ``ResourceExhaustedError`` and ``MemoryError`` into
:class:`~brats_seg.lms.planner.advice.OutOfMemoryError`, and the diagnosis are
:mod:`brats_seg.oom`'s (what counts as out of memory there, evaluation's guard in
:mod:`brats_seg.oom_inference` shares).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

import keras

from brats_seg.config import TrainConfig
from brats_seg.oom import MemoryWatch, takeover_message

__all__ = ["MemoryRecordCallback", "warn_about_dead_run"]

log = logging.getLogger(__name__)


class MemoryRecordCallback(keras.callbacks.Callback):
    """Keeps a :class:`~brats_seg.oom.MemoryWatch` at the run's position: the epoch and measured peak
    in the lock record, the step in memory. Put it after the memory statistics callback (it reads
    their logs)."""

    def __init__(self, watch: MemoryWatch) -> None:
        super().__init__()
        self.watch = watch

    def on_epoch_begin(self, epoch, logs=None):
        self.watch.epoch_begin(epoch)

    def on_train_batch_begin(self, batch, logs=None):
        self.watch.step = batch

    def on_test_begin(self, logs=None):
        self.watch.validating()

    def on_epoch_end(self, epoch, logs=None):
        self.watch.epoch_end(epoch, logs)


def warn_about_dead_run(
    cfg: TrainConfig, device: str, run_dir: str | os.PathLike, replicas: int = 1
) -> Callable[[dict], None]:
    """An ``on_takeover`` for ``hold_lock``: logs :func:`~brats_seg.oom.takeover_message` as a WARNING."""

    def on_takeover(dead: dict) -> None:
        log.warning("run folder %s: %s", run_dir, takeover_message(dead, cfg, device, replicas))

    return on_takeover
