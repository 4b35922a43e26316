"""The training-curve figure during training: drawn from the checkpoint's history, within its
time budget, always once more at the end, logged to MLflow; a figure that cannot be written does
not stop training."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from brats_seg.run_dir import RunFolder
from brats_seg.training import callbacks
from brats_seg.training.callbacks import TrainingCurves


class _Tracker:
    def __init__(self):
        self.logged = []

    def log_artifact(self, path, artifact_path=None):
        self.logged.append(path.name)


class _Clock:
    """perf_counter for the callback: each drawing costs ``cost`` s, each epoch ``epoch`` s."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


@pytest.fixture
def curves(tmp_path, monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(callbacks.time, "perf_counter", clock)
    drawn = []

    def plot(history, regions, path, title=""):
        clock.now += 1.0  # a drawing takes 1 s
        drawn.append(len(history))
        path.write_bytes(b"png")
        return path

    monkeypatch.setattr("brats_seg.plots.plot_training_curves", plot)
    checkpoint = SimpleNamespace(state={"history": []}, folder=RunFolder(tmp_path))
    tracker = _Tracker()
    cb = TrainingCurves(checkpoint, ("wt", "tc", "et"), tracker, "run", budget=0.05)  # 1 s per 20 s
    return SimpleNamespace(cb=cb, clock=clock, drawn=drawn, tracker=tracker, checkpoint=checkpoint)


def _epoch(c, seconds: float) -> None:
    c.clock.now += seconds
    c.checkpoint.state["history"].append({"epoch": len(c.checkpoint.state["history"]) + 1})
    c.cb.on_epoch_end(len(c.checkpoint.state["history"]) - 1)


def test_long_epochs_redraw_every_epoch(curves):
    for _ in range(3):
        _epoch(curves, 60.0)
    assert curves.drawn == [1, 2, 3]
    assert curves.tracker.logged == ["training_curves.png"] * 3
    curves.cb.on_train_end()  # nothing new since the last drawing
    assert curves.drawn == [1, 2, 3]


def test_short_epochs_redraw_within_the_budget_and_at_the_end(curves):
    for _ in range(30):
        _epoch(curves, 2.0)  # 2 s epochs: a 1 s drawing each epoch would cost a third of the run
    drawing_s = len(curves.drawn) * 1.0
    assert drawing_s <= 0.05 * 30 * 2.0 + 1.0  # the budget, plus the first drawing
    assert curves.drawn[0] == 1 and len(curves.drawn) >= 2
    curves.cb.on_train_end()
    assert curves.drawn[-1] == 30  # the figure ends up showing every epoch
    assert (curves.checkpoint.folder.training_curves_path).read_bytes() == b"png"


def test_a_figure_that_cannot_be_written_warns_once_and_training_goes_on(curves, monkeypatch, caplog):
    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("brats_seg.plots.plot_training_curves", full)
    with caplog.at_level(logging.WARNING, logger=callbacks.__name__):
        for _ in range(3):
            _epoch(curves, 60.0)
        curves.cb.on_train_end()
    warnings = [r for r in caplog.records if "training_curves.png" in r.getMessage()]
    assert len(warnings) == 1 and "Training goes on" in warnings[0].getMessage()
    assert curves.tracker.logged == []
