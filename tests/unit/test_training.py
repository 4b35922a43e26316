"""Training loop: an old run folder resumes; config guards; data errors before the first step."""

from __future__ import annotations

import json

import pytest

from brats_seg.config import BackendConfig, ModelConfig, TrackingConfig, TrainConfig, TrainerConfig
from tests.conftest import TINY, data_config


@pytest.fixture(scope="module")
def backend():
    from brats_seg.backend import configure, decide_backend

    return configure(decide_backend(BackendConfig(name="cpu_onednn")))


def _cfg(root, tmp_path, run_dir, epochs=2) -> TrainConfig:
    return TrainConfig(
        data=data_config(root, "brats2021", tmp_path),
        resolution=TINY,
        model=ModelConfig(depth=2, base_filters=4),
        trainer=TrainerConfig(epochs=epochs, batch_size=1, seed=3, learning_rate=3e-3, warmup_epochs=1),
        tracking=TrackingConfig(name="none"),
        run_dir=str(run_dir),
    )


def test_run_dir_with_a_different_config_is_refused(synthetic_root, tmp_path, backend):
    from brats_seg.training.loop import train

    root = synthetic_root["brats2021"]
    train(_cfg(root, tmp_path, tmp_path / "run", epochs=1))
    other = _cfg(root, tmp_path, tmp_path / "run", epochs=1)
    other.model.base_filters = 6
    with pytest.raises(ValueError, match="model.base_filters"):
        train(other)


def test_corrupt_data_fails_before_the_first_step(dataset_copy, tmp_path, backend):
    from brats_seg.data.dataset import PreparationFailed
    from brats_seg.training.loop import train

    root = dataset_copy("brats2021")
    case = sorted(p for p in root.iterdir() if p.is_dir())[1]
    seg = case / f"{case.name}_seg.nii.gz"
    seg.write_bytes(seg.read_bytes()[:200])  # truncated
    cfg = _cfg(root, tmp_path, tmp_path / "run")
    with pytest.raises(PreparationFailed) as err:
        train(cfg)
    assert case.name in str(err.value) and seg.name in str(err.value)
    assert not (tmp_path / "run" / "checkpoints").exists()  # no model was built or trained


def test_resume_position_trusts_the_state_unless_the_weights_are_newer():
    from brats_seg.training.checkpoint import resume_position

    state = {"epoch": 2, "step": 3, "partial": {"loss": 1.5, "count": 6.0}, "partial_epoch": 3, "iterations": 23}
    assert resume_position(state, 23, steps=10) == (2, 3, state["partial"])
    # killed between writing last.keras (step 27) and state.json: the weights say where
    assert resume_position(state, 27, steps=10) == (2, 7, None)
    # under fp16 loss scaling the optimizer skips steps: recorded and restored agree, no correction
    assert resume_position({**state, "iterations": 19}, 19, steps=10) == (2, 3, state["partial"])
    # partial sums belong to the epoch after the completed ones, else they are dropped
    assert resume_position({**state, "partial_epoch": 2}, 23, steps=10) == (2, 3, None)
    assert resume_position({"epoch": 1, "iterations": 10}, 10, steps=10) == (1, 0, None)


def test_a_state_one_save_ahead_of_the_weights_is_rolled_back_in_place():
    """state.json is written before last.keras and carries the state it replaces: killed between
    the two, the weights' optimizer step is the previous save's, and the state goes back to it
    (history, best, position), so the lost epoch is trained and recorded once."""
    from brats_seg.training.checkpoint import resume_position

    previous = {"epoch": 1, "best_value": 0.5, "best_epoch": 1, "history": [{"epoch": 1}], "iterations": 10}
    state = {
        "epoch": 2,
        "best_value": 0.6,
        "best_epoch": 2,
        "history": [{"epoch": 1}, {"epoch": 2}],
        "iterations": 20,
        "previous": dict(previous),
    }
    assert resume_position(state, 10, steps=10) == (1, 0, None)
    assert state == previous
    # a partial save (a signal mid-epoch) one ahead of the epoch-end weights likewise
    partial = {
        **previous,
        "epoch": 1,
        "step": 4,
        "partial": {"loss": 1.0},
        "partial_epoch": 2,
        "iterations": 14,
        "previous": dict(previous),
    }
    assert resume_position(partial, 10, steps=10) == (1, 0, None) and partial == previous
    # consistent: nothing changes
    same = {**previous, "previous": {"epoch": 0, "iterations": 0}}
    assert resume_position(same, 10, steps=10) == (1, 0, None) and same["epoch"] == 1


#: Keys the first released config lacked (``git show 5ef0090:brats_seg/config.py``), and the ones it
#: had that are gone: an old run folder's ``config.json`` is this, not today's.
_KEYS_ADDED_SINCE_FIRST = (
    "backend.gpu_memory_limit_mb",
    "data.prefetch_batches",
    "distribute.collective",
    "distribute.devices",
    "distribute.lr_scaling",
    "distribute.port",
    "distribute.timeout_s",
    "model.foreground_prior",
    "model.region_parents",
    "model.regions",
    "trainer.dead_region_epochs",
    "trainer.deterministic",
)


def test_an_old_run_folder_resumes_and_evaluates(synthetic_root, tmp_path, backend, caplog):
    """A run folder written by the first version (config.json without the newer keys, with
    lms.enabled and the evaluate group it had) resumes with the same command and evaluates.
    (That a resumed run ends where an uninterrupted one does, weights and optimizer state, is
    the slow suite's: tests/integration/test_kill_anywhere.py and test_preemption.py.)"""
    import logging

    import keras

    from brats_seg.evaluation.evaluate import evaluate_run
    from brats_seg.training.loop import train

    root = synthetic_root["brats2021"]
    run_dir = tmp_path / "old"
    cfg = _cfg(root, tmp_path, run_dir, epochs=1)
    cfg.model.regions = "independent"  # what a run from before model.regions trained with
    train(cfg)
    stored = json.loads((run_dir / "config.json").read_text())
    for key in _KEYS_ADDED_SINCE_FIRST:
        group, name = key.split(".")
        del stored[group][name]
    stored["lms"]["enabled"] = False
    stored["evaluate"] = {"split": "test", "mode": "whole", "threshold": 0.5, "overlays": True, "window_overlap": 0.5}
    (run_dir / "config.json").write_text(json.dumps(stored))

    summary = evaluate_run(run_dir, "val", progress=False)  # before the resume rewrites config.json
    assert summary["n_cases"] >= 1 and (run_dir / "eval" / "val" / "metrics.csv").is_file()
    assert 0.0 <= summary["dice_wt"]["mean"] <= 1.0

    class CountEpochs(keras.callbacks.Callback):
        trained: list = []

        def on_epoch_begin(self, epoch, logs=None):
            self.trained.append(epoch + 1)

    counter = CountEpochs()
    again = _cfg(root, tmp_path, run_dir, epochs=2)
    again.model.regions = "independent"
    with caplog.at_level(logging.INFO, logger="brats_seg.resolve"):
        assert train(again, extra_callbacks=[counter]).epochs_done == 2
    assert counter.trained == [2]  # continued from the last completed epoch, not from scratch
    assert "resuming under the run's plan.json" in caplog.text  # the plan it started with, read back
    hist = json.loads((run_dir / "state.json").read_text())["history"]
    assert [h["epoch"] for h in hist] == [1, 2]
    header = (run_dir / "history.csv").read_text().splitlines()[0].split(",")
    for r in ("wt", "tc", "et"):  # the per-region monitors, for training and validation
        for col in (f"prob_{r}", f"vol_{r}", f"ref_vol_{r}", f"val_prob_{r}", f"val_vol_{r}", f"val_ref_vol_{r}"):
            assert col in header, col
    assert all(h["ref_vol_wt"] > 0 and 0 < h["prob_wt"] < 1 for h in hist)
