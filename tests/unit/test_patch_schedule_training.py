"""trainer.patch_schedule in training: stages in order, each with its own patch, batch and model on
shared weights and one optimizer; a run stopped in its second stage (at the stage change, then
mid-stage) resumes in that stage to the uninterrupted run's weights; the best checkpoint is the
last stage's and evaluation infers as that stage (sliding windows of a last patch, on the native
grid); with a time budget the clock ends each stage (the cut epoch validated) and the run, and the
same command trains nothing more. (A single patch size is the one-stage case of the same loop:
these replace test_patches.py's end-to-end runs.)"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal

import numpy as np
import pytest

from brats_seg.config import BackendConfig, ModelConfig, TrackingConfig, TrainConfig, TrainerConfig
from tests.conftest import TINY, data_config

# Patches, larger patches for two epochs (a run is killed there: at the stage change, then
# mid-stage), the whole volume, then a patch again (a schedule may end on a patch: evaluation then
# slides that patch's windows, as a single patch size's run does).
SCHEDULE = [
    {"patch": [16, 16, 16], "share": 0.2},
    {"patch": [24, 32, 24], "share": 0.4, "batch_size": 2},
    {"patch": "whole", "share": 0.2},
    {"patch": [32, 32, 32], "share": 0.2},
]


@pytest.fixture(scope="module")
def backend():
    from brats_seg.backend import configure, decide_backend

    return configure(decide_backend(BackendConfig(name="cpu_onednn")))


def _cfg(root, tmp_path, run_dir, **trainer) -> TrainConfig:
    settings = dict(epochs=5, batch_size=1, seed=3, warmup_epochs=1, steps_per_epoch=3, patch_schedule=SCHEDULE)
    return TrainConfig(
        data=data_config(root, "brats2021", tmp_path),
        resolution=TINY,
        model=ModelConfig(depth=3, base_filters=4),
        trainer=TrainerConfig(**{**settings, **trainer}),
        tracking=TrackingConfig(name="none"),
        run_dir=str(run_dir),
    )


def _state(run_dir):
    return json.loads((run_dir / "state.json").read_text())


def test_stages_train_in_order_resume_mid_stage_exactly_and_the_last_stage_is_selected_and_evaluated(
    synthetic_root, tmp_path, backend, caplog
):
    import keras
    import nibabel as nib

    from brats_seg.evaluation.evaluate import evaluate_run
    from brats_seg.run_dir import RunFolder
    from brats_seg.signals import Preempted
    from brats_seg.training.loop import train

    root = synthetic_root["brats2021"]
    with caplog.at_level(logging.INFO):
        full = train(_cfg(root, tmp_path, tmp_path / "full"))
    assert full.epochs_done == 5
    state = _state(tmp_path / "full")
    assert [h["stage"] for h in state["history"]] == [1, 2, 2, 3, 4]
    assert state["best_epoch"] == 5  # only the last stage's epochs are selected
    assert all("val_dice_mean" in h for h in state["history"])  # every stage validated (logged)
    assert state["iterations"] == 3 + 3 + 3 + 1 + 3  # 3 steps a patch epoch, the one training case whole: one optimizer
    plan = json.loads((tmp_path / "full" / "plan.json").read_text())
    assert [s["patch"] for s in plan["stages"]] == [[16, 16, 16], [24, 32, 24], "whole", [32, 32, 32]]
    assert [s["batch_size"] for s in plan["stages"]] == [1, 2, 1, 1]
    # each epoch's record holds its stage's plan beside the measured peak above the runtime (a
    # number, not asserted positive: this process's RSS before the model holds earlier tests' pools)
    planned = [s["plan"]["predicted_peak_bytes"] for s in plan["stages"]]
    assert [h["planned_bytes"] for h in state["history"]] == [planned[int(h["stage"]) - 1] for h in state["history"]]
    assert all(np.isfinite(h["measured_bytes"]) for h in state["history"])
    assert "time: 1 training and 1 validation case(s)" in caplog.text  # before the first step, each stage priced
    assert "whole: step" in caplog.text and "run:" in caplog.text and "for 5 epochs" in caplog.text
    for k, name in enumerate(("16x16x16", "24x32x24", "whole", "32x32x32"), start=1):
        assert f"stage {k}/4: {name}" in caplog.text
        assert f"stage {k}/4 ({name}): first step" in caplog.text  # the retrace at each stage, timed

    class Kill(keras.callbacks.Callback):
        """SIGTERM to this process as `kill` sends it, before step ``step`` (0-based) of epoch ``epoch``."""

        def __init__(self, epoch, step):
            super().__init__()
            self.at = (epoch, step)

        def on_train_batch_begin(self, batch, logs=None):
            if (self.epoch, batch) == self.at:
                os.kill(os.getpid(), signal.SIGTERM)

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

    resumed = tmp_path / "resumed"
    # killed in the second stage twice: at its first step (the stage change), then mid-stage; the
    # step under way when the signal comes is finished and saved
    with pytest.raises(Preempted):
        train(_cfg(root, tmp_path, resumed), extra_callbacks=[Kill(1, 0)])
    assert (_state(resumed)["epoch"], _state(resumed)["step"]) == (1, 1)
    caplog.clear()
    with caplog.at_level(logging.INFO), pytest.raises(Preempted):
        train(_cfg(root, tmp_path, resumed), extra_callbacks=[Kill(2, 1)])
    assert "stage 2/4: 24x32x24, batch 2, from epoch 2 step 2" in caplog.text  # in the stage it was killed in
    assert "stage 1/4" not in caplog.text
    assert (_state(resumed)["epoch"], _state(resumed)["step"]) == (2, 2)
    caplog.clear()
    with caplog.at_level(logging.INFO):
        assert train(_cfg(root, tmp_path, resumed)).epochs_done == 5
    assert "stage 2/4: 24x32x24, batch 2, from epoch 3 step 3" in caplog.text  # back in its stage, mid-stage

    def weights(run):
        return keras.models.load_model(tmp_path / run / "checkpoints" / "last.keras", compile=False).get_weights()

    for a, b in zip(weights("full"), weights("resumed"), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    resumed_history = _state(resumed)["history"]
    assert [h["stage"] for h in resumed_history] == [1, 2, 2, 3, 4]
    assert _state(resumed)["iterations"] == state["iterations"]
    # the steps each epoch took, a resumed one counting those before the signal
    assert [h["steps"] for h in resumed_history] == [h["steps"] for h in state["history"]] == [3, 3, 3, 1, 3]

    summary = evaluate_run(tmp_path / "full", "test", progress=False)
    assert summary["n_cases"] >= 1 and 0.0 <= summary["dice_wt"]["mean"] <= 1.0
    chosen_with = json.dumps(json.loads((tmp_path / "full" / "postprocess.json").read_text()))
    assert '"mode": "sliding"' in chosen_with and "[32, 32, 32]" in chosen_with  # the last stage's windows
    folder = RunFolder(tmp_path / "full")
    case_id = json.loads(folder.split_path.read_text())["test"][0]
    label = next(p for p in (root / case_id).iterdir() if p.name.endswith("seg.nii.gz"))
    assert nib.load(folder.prediction_file("test", case_id)).shape == nib.load(label).shape  # the native grid


class _SteadyClock:
    """``time.perf_counter`` of a machine where every timed span (a training step, a validation
    pass) lasts ``tick`` seconds: the budget's arithmetic without the CPU's speed (CI once traced
    the first step on a loaded 2-vCPU machine for longer than the whole 3 s budget)."""

    def __init__(self, tick: float):
        self.now, self.tick = 0.0, tick

    def perf_counter(self) -> float:
        self.now += self.tick
        return self.now


def test_with_a_budget_the_clock_ends_each_stage_and_the_run(synthetic_root, tmp_path, backend, monkeypatch):
    from types import SimpleNamespace

    from brats_seg.training import epochs
    from brats_seg.training.loop import train

    monkeypatch.setattr(epochs, "time", SimpleNamespace(perf_counter=_SteadyClock(0.5).perf_counter))
    schedule = [{"patch": [16, 16, 16], "share": 0.5}, {"patch": "whole", "share": 0.5}]
    cfg = _cfg(synthetic_root["brats2021"], tmp_path, tmp_path / "budget", patch_schedule=schedule)
    cfg.trainer = dataclasses.replace(cfg.trainer, epochs=200, steps_per_epoch=None, time_budget_s=3.0)
    first = train(cfg)
    state = _state(tmp_path / "budget")
    history = state["history"]
    stages = [h["stage"] for h in history]
    assert stages == sorted(stages) and set(stages) == {1, 2} and first.epochs_done < 200
    cut = history[stages.index(2) - 1]  # stage 1's last epoch: cut when the clock passed its half
    assert cut["train_time_s"] >= 1.5 and "val_dice_mean" in cut
    assert all(h["train_time_s"] < 1.5 for h in history[: stages.index(2) - 1])
    assert state["train_time_s"] >= 3.0 and state["best_epoch"] > stages.index(2)  # selected in stage 2
    last = history[-1]
    assert last["train_time_s"] == state["train_time_s"] and "val_dice_mean" in last  # the cut epoch is validated
    assert (tmp_path / "budget" / "checkpoints" / "best.keras").is_file()
    again = train(cfg)  # the same command: the budget is spent, nothing more is trained
    assert again.epochs_done == first.epochs_done
    assert _state(tmp_path / "budget")["train_time_s"] == state["train_time_s"]


def test_the_stage_of_an_epoch_follows_its_first_epochs_or_the_clock_when_it_began():
    """A resumed run's stage is a pure function of the run folder: the epoch (no budget), or the
    training seconds spent when the epoch began (a budget); an epoch begun at a stage's end is the
    next stage's (killed between the two, the run resumes in the right one)."""
    from brats_seg.training.stages import StageRun, stage_of_epoch

    def stages(firsts, ends_s):
        return [
            StageRun(i, len(firsts), f"s{i}", None, None, 3, f, 0, e) for i, (f, e) in enumerate(zip(firsts, ends_s))
        ]

    by_epoch = stages([0, 2, 5], [None] * 3)
    assert [stage_of_epoch(by_epoch, e, 0.0) for e in range(7)] == [0, 0, 1, 1, 1, 2, 2]
    by_time = stages([None] * 3, [10.0, 20.0, 30.0])
    assert [stage_of_epoch(by_time, 0, s) for s in (0.0, 9.9, 10.0, 19.99, 20.0, 35.0)] == [0, 0, 1, 1, 2, 2]
    assert stage_of_epoch(stages([0], [None]), 9, 99.0) == 0  # no schedule: one stage
