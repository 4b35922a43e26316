"""Keras callbacks of a run: atomic checkpoints with resume state, early stopping, tracking.

Run folder (``run_dir``)::

    checkpoints/last.keras   every epoch: model + optimizer state (resume from here)
    checkpoints/best.keras   best validation mean Dice so far (evaluate this)
    state.json               completed epochs, best epoch and value, per-epoch history
    history.csv              the same history as a table

``state.json`` is written just before ``last.keras`` and carries the state it replaces,
each file through a temporary name and a rename, so a run killed at any moment resumes
from the last position saved whole (:meth:`RunCheckpoint._save_state_then_weights`). A disk that
fills up while they are written ends the run with :class:`~brats_seg.files.DiskFullError`
naming the file, the free space and the epoch the same command resumes from. The names and
the writing of these files belong to :class:`brats_seg.run_dir.RunFolder`.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import time
from pathlib import Path

import keras

from brats_seg.files import DiskFullError, atomic_path
from brats_seg.run_dir import RunFolder
from brats_seg.tracking.names import training_metric_key

__all__ = ["DeadRegionWarning", "RunCheckpoint", "RunState", "TrackingCallback", "TrainingCurves", "load_state"]

log = logging.getLogger(__name__)


class RunState(dict):
    """``state.json``: ``epoch`` (completed), ``best_value``, ``best_epoch``, ``history``."""


def load_state(run_dir: str | Path) -> RunState | None:
    """The run's state, or None for a new run."""
    state = RunFolder(Path(run_dir)).read_state()
    return None if state is None else RunState(state)


def _save_model_atomic(model: keras.Model, path: Path) -> None:
    with atomic_path(path) as tmp:  # keeps the .keras suffix Keras requires
        model.save(tmp)


class RunCheckpoint(keras.callbacks.Callback):
    """Checkpoint every epoch and the best by ``monitor``; early stopping that survives resume.

    Args:
        run_dir: the run folder.
        monitor: validation metric to maximise (``val_dice_mean``).
        patience: epochs without improvement before stopping; 0 = never stop early.
        state: the state loaded on resume (None for a new run).
        export_model: the plain model sharing the training model's weights, saved as
            ``.keras`` (default: the training model itself).
        write: write files (the chief); other workers keep the state in memory only.
        select_stage: with a patch schedule, its last stage (1-based, the epoch logs' ``stage``):
            only its epochs can be the best, and early stopping counts there only (their
            validation infers as evaluation will); None = every epoch.
    """

    def __init__(
        self,
        run_dir: str | Path,
        monitor: str = "val_dice_mean",
        patience: int = 0,
        state: RunState | None = None,
        export_model: keras.Model | None = None,
        write: bool = True,
        select_stage: int | None = None,
    ) -> None:
        super().__init__()
        self.export_model = export_model  # saved instead of the training model (LMS wrappers can't be)
        self.folder = RunFolder(Path(run_dir))
        self.write = write  # False on the workers that are not the chief: same decisions, no files
        if write:
            self.folder.checkpoints_dir.mkdir(parents=True, exist_ok=True)
        self.monitor = monitor
        self.patience = patience
        self.select_stage = select_stage
        self.state = state or RunState(epoch=0, best_value=None, best_epoch=None, history=[])
        self._t0 = time.perf_counter()

    def on_epoch_begin(self, epoch, logs=None):
        self._t0 = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        logs = dict(logs or {})
        row = {"epoch": epoch + 1, "seconds": round(time.perf_counter() - self._t0, 2)}
        row.update({k: float(v) for k, v in logs.items()})
        value = logs.get(self.monitor)
        selectable = self.select_stage is None or logs.get("stage") == self.select_stage
        improved = (
            selectable
            and value is not None
            and math.isfinite(float(value))
            and (self.state["best_value"] is None or float(value) > self.state["best_value"])
        )
        previous = self._snapshot()
        with self._saying_what_is_intact():
            if improved:
                if self.write:
                    self._writing = "best"
                    _save_model_atomic(self.export_model or self.model, self.folder.checkpoint_file("best"))
                    log.info("epoch %d: %s improved to %.4f, saved best.keras", epoch + 1, self.monitor, float(value))
                self.state["best_value"], self.state["best_epoch"] = float(value), epoch + 1
            self.state["epoch"] = epoch + 1
            self.state.pop("step", None)
            self.state.pop("partial", None)
            self.state.pop("partial_epoch", None)
            self.state["history"].append(row)
            if "train_time_s" in logs:  # the budget's clock resumes from it
                self.state["train_time_s"] = float(logs["train_time_s"])
            self.state["iterations"] = self._iterations()
            if self.write:
                self._save_state_then_weights(previous)
                self._writing = "history"
                self.folder.write_history_csv(self.state["history"])
        best_epoch = self.state["best_epoch"] or 0
        if selectable and self.select_stage is not None and not best_epoch:
            best_epoch = epoch  # the last stage's first epoch: its patience counts from there
        if selectable and self.patience and epoch + 1 - best_epoch >= self.patience:
            log.info(
                "early stopping: no %s gain for %d epochs (best %.4f at epoch %d)",
                self.monitor,
                self.patience,
                self.state["best_value"] or float("nan"),
                best_epoch,
            )
            self.model.stop_training = True

    def save_partial(self, epoch: int, step: int, sums: dict[str, float], train_time_s: float | None = None) -> None:
        """A signal stopped epoch ``epoch`` (0-based) after ``step`` steps: save weights and position
        (and the training seconds spent), in the same order as at an epoch's end
        (:meth:`_save_state_then_weights`)."""
        previous = self._snapshot()
        with self._saying_what_is_intact():
            self.state["epoch"] = int(epoch)  # completed epochs
            self.state["step"] = int(step)
            self.state["partial"] = dict(sums)
            if train_time_s is not None:
                self.state["train_time_s"] = float(train_time_s)
            self.state["partial_epoch"] = epoch + 1
            self.state["iterations"] = self._iterations()
            if self.write:
                self._save_state_then_weights(previous)

    def _snapshot(self) -> dict:
        """The state as saved last (without its own ``previous``), for the next save to carry."""
        return copy.deepcopy({k: v for k, v in self.state.items() if k != "previous"})

    def _save_state_then_weights(self, previous: dict) -> None:
        """``state.json`` (carrying ``previous``, the state it replaces), then ``last.keras``.

        A run killed (or a disk that fills) between the two leaves a state one save ahead of
        the weights; the optimizer step recorded in each tells them apart, and the resuming run
        rolls the state back to ``previous`` (:func:`brats_seg.training.checkpoint.resume_position`),
        so the epoch is trained again and recorded once, with its best. ``best.keras`` is written
        before both: a best one save ahead is rewritten, identically, when that epoch is trained again.
        """
        self.state["previous"] = previous
        self._writing = "state"
        self.folder.write_state(self.state)
        self._writing = "last"
        _save_model_atomic(self.export_model or self.model, self.folder.checkpoint_file("last"))

    @contextlib.contextmanager
    def _saying_what_is_intact(self):
        """A full disk while saving: :class:`DiskFullError` saying where the run resumes from.

        Every file is replaced atomically, ``state.json`` just before ``last.keras``; if
        ``last.keras`` is what did not fit, the state on disk is one save ahead and the run
        resumes from the save it carries (``previous``).
        """
        self._writing = None
        try:
            yield
        except DiskFullError as e:
            saved = self.folder.read_state()
            if saved is not None and self._writing == "last":
                saved = saved.get("previous") or None
                saved = saved if saved and (saved.get("epoch") or saved.get("step")) else None
            if saved is None:
                what = "No epoch was saved yet: the same command starts the run again."
            elif saved.get("step"):
                what = (
                    f"The run resumes from step {saved['step']} of epoch {int(saved['epoch']) + 1} "
                    f"(the position saved last in {self.folder.state_path})."
                )
            else:
                what = (
                    f"The run resumes from the last completed epoch, epoch {int(saved['epoch'])} "
                    f"({self.folder.checkpoint_file('last')} and {self.folder.state_path} are intact)."
                )
            raise DiskFullError(e.path, e.free_bytes, what) from e

    def _iterations(self) -> int | None:
        """The optimizer step the saved weights are at (``resume_position`` checks it)."""
        opt = getattr(self.export_model or self.model, "optimizer", None)
        return int(opt.iterations.numpy()) if opt is not None else None


class TrackingCallback(keras.callbacks.Callback):
    """Per-epoch metrics (and the learning rate) to the run's tracker, under the keys whose chart
    sections lead with loss and Dice (:func:`~brats_seg.tracking.names.training_metric_key`)."""

    def __init__(self, tracker, extra_metrics=None) -> None:
        super().__init__()
        self.tracker = tracker
        self.extra_metrics = extra_metrics  # callable(epoch) -> dict, e.g. LMS stats

    def on_epoch_end(self, epoch, logs=None):
        metrics = {k: float(v) for k, v in (logs or {}).items()}
        opt = self.model.optimizer
        try:
            lr = opt.learning_rate
            metrics["learning_rate"] = float(lr(opt.iterations) if callable(lr) else lr)
        except (TypeError, ValueError):
            pass
        if self.extra_metrics is not None:
            metrics.update(self.extra_metrics(epoch))
        self.tracker.log_metrics({training_metric_key(k): v for k, v in metrics.items()}, step=epoch + 1)


class TrainingCurves(keras.callbacks.Callback):
    """``training_curves.png`` in the run folder and in MLflow, redrawn as epochs end.

    Drawn from the checkpoint callback's history (a resumed run's earlier epochs included), so
    it must come after that callback. A drawing takes about half a second on 2 cores; where epochs
    are shorter than that many times over (the tiny demo), the figure is redrawn only once
    ``1 / budget`` times its last drawing's cost has passed, so it never takes more than
    ``budget`` of the training time, and always once more when training ends. A figure that
    cannot be written (a full disk) is reported once and training goes on: the checkpoint,
    which needs the disk, says what it means for the run.

    Args:
        checkpoint: the run's :class:`RunCheckpoint` (its ``state["history"]``).
        regions: the model's regions, in output order.
        tracker: the run's tracker (the figure is logged as an artifact).
        title: the figure's title (the run's name).
        budget: the largest share of training time the drawing may take.
    """

    def __init__(self, checkpoint: RunCheckpoint, regions, tracker, title: str = "", budget: float = 0.05) -> None:
        super().__init__()
        self.checkpoint, self.regions, self.tracker, self.title = checkpoint, tuple(regions), tracker, title
        self.budget = float(budget)
        self.path = checkpoint.folder.training_curves_path
        self._drawn_at: float | None = None  # perf_counter when the last drawing ended
        self._cost_s = 0.0
        self._drawn_epochs = -1  # the history length the figure shows
        self._failed = False

    def on_epoch_end(self, epoch, logs=None):
        due = self._drawn_at is None or time.perf_counter() - self._drawn_at >= self._cost_s / self.budget
        if due:
            self.draw()

    def on_train_end(self, logs=None):
        self.draw()

    def draw(self) -> None:
        """Redraw the figure if the history has grown since the last drawing, and log it."""
        from brats_seg.plots import plot_training_curves

        history = self.checkpoint.state["history"]
        if self._failed or not history or len(history) == self._drawn_epochs:
            return
        start = time.perf_counter()
        try:
            plot_training_curves(history, self.regions, self.path, self.title)
        except OSError as e:  # DiskFullError among them
            self._failed = True
            log.warning(
                "cannot write %s (%s); the training curves are in %s and MLflow. Training goes on.",
                self.path,
                e,
                self.checkpoint.folder.history_path,
            )
            return
        self._drawn_at = time.perf_counter()
        self._cost_s = self._drawn_at - start
        self._drawn_epochs = len(history)
        self.tracker.log_artifact(self.path)


class DeadRegionWarning(keras.callbacks.Callback):
    """Warn once per region when its prediction stays empty while its reference is not.

    Reads the per-region monitors of :func:`brats_seg.training.metrics.make_region_monitors`
    from the epoch logs: ``vol_<r>`` (mean predicted mL per case) and ``ref_vol_<r>`` (mean
    reference mL per case), for training and, where validated, ``val_`` ones. A region whose
    predicted volume is 0 in every case for ``epochs`` epochs in a row while its reference
    is not empty is a dead output: one warning names the region and the epoch (and the run
    goes on: a region can still start late). On resume the count continues from the history.

    Args:
        regions: region names in output-channel order.
        epochs: consecutive epochs of an empty prediction before the warning; 0 = never warn.
        history: ``state.json``'s per-epoch rows of a resumed run.
    """

    def __init__(self, regions, epochs: int = 3, history=()) -> None:
        super().__init__()
        if epochs < 0:
            raise ValueError(f"trainer.dead_region_epochs must be >= 0 (0 = off), got {epochs!r}.")
        self.regions, self.epochs = tuple(regions), int(epochs)
        self.empty_epochs: dict[tuple[str, str], int] = {}
        self.warned: dict[str, int] = {}  # region -> the epoch (1-based) its warning was given
        for row in history:
            self._count(row)

    def _count(self, logs) -> list[tuple[str, str]]:
        """Update the consecutive-empty counts; return the (prefix, region) pairs now dead."""
        dead = []
        for prefix in ("", "val_"):
            for r in self.regions:
                pred, ref = logs.get(f"{prefix}vol_{r}"), logs.get(f"{prefix}ref_vol_{r}")
                if pred is None or ref is None:
                    continue  # not measured this epoch (validation every few epochs)
                key = (prefix, r)
                self.empty_epochs[key] = self.empty_epochs.get(key, 0) + 1 if float(pred) <= 0 < float(ref) else 0
                if self.epochs and self.empty_epochs[key] >= self.epochs:
                    dead.append(key)
        if "epoch" in logs:  # a history row: a warning was already given when it happened
            for _, r in dead:
                self.warned.setdefault(r, int(logs["epoch"]))
        return dead

    def on_epoch_end(self, epoch, logs=None):
        logs = logs or {}
        for prefix, r in self._count(logs):
            if r in self.warned:
                continue
            self.warned[r] = epoch + 1
            which = "validation" if prefix else "training"
            log.warning(
                "region %s: the prediction has been empty in every %s case for %d epochs up to epoch %d, while "
                "the reference holds %.2f mL per case on average: the %s output is not learning. Its mean "
                "probability per epoch is prob_%s in history.csv (and MLflow); see docs/training.md, 'Training monitors'.",
                r.upper(),
                which,
                self.empty_epochs[(prefix, r)],
                epoch + 1,
                float(logs[f"{prefix}ref_vol_{r}"]),
                r.upper(),
                r,
            )
