"""The run folder (brats_seg.run_dir): its paths, its one config reader, its files."""

from __future__ import annotations

import json
import math

import pytest

from brats_seg.config import DataConfig, ModelConfig, TrainConfig, config_to_dict
from brats_seg.run_dir import RunError, RunFolder


def test_paths_follow_the_layout(tmp_path):
    run = RunFolder.of(tmp_path / "run")
    assert run.config_path == tmp_path / "run" / "config.json"
    assert run.plan_paths == (tmp_path / "run" / "plan.txt", tmp_path / "run" / "plan.json")
    assert run.checkpoint_file("last") == tmp_path / "run" / "checkpoints" / "last.keras"
    assert run.metrics_csv("test") == tmp_path / "run" / "eval" / "test" / "metrics.csv"
    assert run.predictions_dir("val") == tmp_path / "run" / "eval" / "val" / "predictions"
    with pytest.raises(ValueError, match="best, last"):
        run.checkpoint_file("middle")
    with pytest.raises(RunError, match="run_dir is not set"):
        RunFolder.of("  ")


def test_config_round_trip_and_the_missing_folder(tmp_path):
    run = RunFolder.of(tmp_path / "run")
    with pytest.raises(RunError, match="does not exist.*python train.py run_dir="):
        run.read_config()
    cfg = TrainConfig(data=DataConfig(layout="brats2024"), model=ModelConfig(depth=4, base_filters=12))
    run.write_config(cfg)
    back = run.read_config()
    assert back.model.base_filters == 12 and back.model.out_channels == 4  # brats2024: WT, TC, ET, RC resolved
    assert sorted(p.name for p in run.root.iterdir()) == ["config.json"]  # no temporary left


def test_an_old_config_without_the_newer_keys_is_upgraded(tmp_path):
    """A config.json written before model.regions and data.prefetch_batches existed reads as
    that run trained: independent sigmoids, and today's defaults for what it could not say."""
    stored = config_to_dict(TrainConfig())
    del stored["model"]["regions"], stored["model"]["region_parents"], stored["data"]["prefetch_batches"]
    del stored["trainer"]["batch_dice"], stored["data"]["stratify"]
    stored["plan"] = {"format": "table"}  # the plan_memory.py group runs of 2025-2026 carried (dropped on reading)
    run = RunFolder.of(tmp_path)
    run.config_path.write_text(json.dumps(stored))
    cfg = run.read_config()
    assert cfg.model.regions == "independent" and cfg.model.region_parents == [-1, -1, -1]
    assert (
        cfg.trainer.batch_dice is False and TrainConfig().trainer.batch_dice is True
    )  # per-sample Dice, as it trained
    assert cfg.data.prefetch_batches == DataConfig().prefetch_batches
    assert cfg.data.stratify is False and DataConfig().stratify is True  # its split was a random one


def test_unreadable_files_are_named(tmp_path):
    run = RunFolder.of(tmp_path)
    run.config_path.write_text("{not json")
    with pytest.raises(RunError, match="config.json is not readable JSON"):
        run.read_config()
    run.config_path.write_text(json.dumps({"model": {"depth": 3}, "colour": "blue"}))  # another program's
    with pytest.raises(
        RunError, match=r"config.json is not a brats-seg run's config.json \(another program's file\?\)"
    ):
        run.read_config()
    run.config_path.write_text(json.dumps({"data": {}, "model": {"depth": 3}, "trainer": {}, "colour": "blue"}))
    with pytest.raises(RunError, match="unknown TrainConfig keys"):  # ours, from a newer version
        run.read_config()
    with pytest.raises(RunError, match="split.json not found"):
        run.read_split()
    run.state_path.write_text("[")
    with pytest.raises(RunError, match="state.json cannot be read"):
        run.read_state()
    with pytest.raises(RunError, match="checkpoint .*best.keras not found"):
        run.checkpoint("best")


def test_state_history_split_and_tracking_files(tmp_path):
    run = RunFolder.of(tmp_path)
    assert run.read_state() is None and run.read_tracking() is None
    run.write_state({"epoch": 2, "history": [{"epoch": 1, "loss": 0.5}, {"epoch": 2, "loss": 0.4, "val_loss": 0.45}]})
    assert run.read_state()["epoch"] == 2
    run.write_history_csv([{"epoch": 1, "loss": 0.5}, {"epoch": 2, "loss": math.nan, "val_loss": 0.45}])
    assert run.history_path.read_text().splitlines() == ["epoch,loss,val_loss", "1,0.5,", "2,,0.45"]
    run.write_split({"train": ["a", "b"], "val": ("c",), "test": ["d"]})
    assert run.read_split() == {"train": ["a", "b"], "val": ["c"], "test": ["d"]}
    run.write_tracking({"run_id": "abc"})
    assert run.read_tracking() == {"run_id": "abc"}
    paths = run.write_plan("table", "{}")
    assert [p.read_text() for p in paths] == ["table", "{}"]


def test_training_reads_an_old_config_as_evaluation_does(tmp_path):
    """Training's resume check and evaluation share the one reader: a run from before
    model.regions (independent sigmoids) resumes with the same command, and a changed
    model.regions is refused by name, which the raw comparison could not tell apart."""
    from brats_seg.data.labels import resolve_model_outputs
    from brats_seg.training.checkpoint import check_resumable

    stored = config_to_dict(resolve_model_outputs(TrainConfig()))
    del stored["model"]["regions"], stored["model"]["region_parents"]
    RunFolder.of(tmp_path).config_path.write_text(json.dumps(stored))
    RunFolder.of(tmp_path).write_state({"epoch": 1, "step": 0})  # a run with progress
    same = resolve_model_outputs(TrainConfig(model=ModelConfig(regions="independent")))
    check_resumable(tmp_path, same)  # the run as it trained: resumes
    with pytest.raises(ValueError, match=r"model.regions: 'independent' -> 'nested'"):
        check_resumable(tmp_path, resolve_model_outputs(TrainConfig(model=ModelConfig(regions="nested"))))


def test_a_run_from_before_the_stratified_split_says_how_to_resume(tmp_path):
    from brats_seg.data.labels import resolve_model_outputs
    from brats_seg.training.checkpoint import check_resumable

    stored = config_to_dict(resolve_model_outputs(TrainConfig()))
    del stored["data"]["stratify"]
    RunFolder.of(tmp_path).config_path.write_text(json.dumps(stored))
    RunFolder.of(tmp_path).write_state({"epoch": 1, "step": 0})
    with pytest.raises(ValueError, match=r"data.stratify: False -> True.*add data.stratify=false to resume"):
        check_resumable(tmp_path, resolve_model_outputs(TrainConfig()))
    check_resumable(tmp_path, resolve_model_outputs(TrainConfig(data=DataConfig(stratify=False))))


def test_evaluation_raises_the_run_folders_error():
    """One RunError: callers catching evaluation's catch the run folder's (and the CLI's handler both)."""
    from brats_seg.evaluation.inference import run as evaluation_run

    assert evaluation_run.RunError is RunError


def test_no_other_module_spells_the_run_folder_or_cache_file_names():
    """Every path of a run folder is joined in run_dir.py and every cache entry's in data/cache.py:
    a file renamed there is renamed everywhere."""
    import re
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    owners = {"brats_seg/run_dir.py", "brats_seg/data/cache.py"}
    names = (
        r"config\.json|split\.json|state\.json|history\.csv|plan\.txt|plan\.json|mlflow\.json"
        r"|last\.keras|best\.keras|image\.npy|regions\.npy"
    )
    literal = re.compile(rf"""["'/]({names})["']""")
    offenders = []
    for path in [*repo.glob("brats_seg/**/*.py"), *repo.glob("scripts/*.py"), repo / "train.py"]:
        rel = path.relative_to(repo).as_posix()
        if rel in owners:
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if literal.search(code) and "log." not in code and "raise " not in code:
                offenders.append(f"{rel}:{n}: {line.strip()}")
    assert not offenders, "file names joined outside their owner:\n" + "\n".join(offenders)
