"""A run's data splits as MLflow dataset inputs, the evaluated split and its table, against a sqlite store.

The tracked start is training's own (``start_tracking``, given a run folder with its
``split.json``), without a model; the evaluation's logging is evaluation's own
(``_log_to_mlflow``, given a ``metrics.csv``). The data root need not exist: a split's dataset
is metadata (name, digest, source, profile), no case is read.
"""

from __future__ import annotations

import errno
import json
import logging
import math
import types
from pathlib import Path

import mlflow
import pytest
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from brats_seg.config import DataConfig, ResolutionConfig, TrackingConfig, TrainConfig
from brats_seg.evaluation.evaluate import _log_to_mlflow
from brats_seg.evaluation.scoring.table import MetricsTable
from brats_seg.run_dir import RunFolder
from brats_seg.tracking import NullTracker
from brats_seg.tracking.datasets import split_inputs
from brats_seg.training.tracked import start_tracking
from tests.conftest import TINY

LOGGER = "brats_seg.tracking.faults"  # the tracker says what failed through FaultPolicy
HALF = ResolutionConfig(name="half", spacing_mm=2.0, shape=[96, 112, 80])
SPLIT = {
    "seed": 0,
    "val_fraction": 0.15,
    "test_fraction": 0.2,
    "train": ["case_1", "case_2", "case_3"],
    "val": ["case_4"],
    "test": ["case_5", "case_6"],
}


@pytest.fixture(scope="module")
def store_uri(tmp_path_factory) -> str:
    """One sqlite store per module (creating the schema costs ~1-2 s); each test its own experiment."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow')}/mlruns.db"


def _config(tmp_path: Path, uri: str, experiment: str, resolution: ResolutionConfig = TINY) -> TrainConfig:
    data = DataConfig(name="synthetic", root=str(tmp_path / "data"), cache_dir=str(tmp_path / "cache"))
    return TrainConfig(
        data=data,
        resolution=resolution,
        run_dir=str(tmp_path / "run"),
        tracking=TrackingConfig(uri=uri, experiment=experiment, system_metrics=False),
    )


def _tracked_start(cfg: TrainConfig, run_dir: Path):
    """What training does once its run folder holds split.json: the chief's tracked start."""
    run_dir.mkdir(parents=True, exist_ok=True)
    RunFolder(run_dir).write_split(SPLIT)
    run = types.SimpleNamespace(
        config=cfg,
        lms="off",
        reason="test",
        backend=types.SimpleNamespace(name="cpu_onednn", device="CPU", precision="float32"),
        stages=(),
    )
    return start_tracking(run, run_dir, run_dir.name, 1, [], None)


def _inputs(uri: str, run_id: str) -> dict[str, tuple]:
    """``name -> (digest, context, profile, source, source_type)`` of the run's dataset inputs."""
    inputs = MlflowClient(uri).get_run(run_id).inputs.dataset_inputs
    out = {}
    for d in inputs:
        assert d.dataset.name not in out, f"{d.dataset.name} logged twice"
        context = {t.key: t.value for t in d.tags}["mlflow.data.context"]
        out[d.dataset.name] = (
            d.dataset.digest,
            context,
            json.loads(d.dataset.profile),
            json.loads(d.dataset.source),
            d.dataset.source_type,
        )
    return out


def _search(uri: str, experiment_id: str, filter_string: str) -> set[str]:
    mlflow.set_tracking_uri(uri)
    return {r.info.run_id for r in mlflow.search_runs([experiment_id], filter_string, output_format="list")}


def test_splits_are_dataset_inputs_that_search_runs_filters_on(store_uri, tmp_path):
    cfg = _config(tmp_path, store_uri, "splits")
    first = _tracked_start(cfg, tmp_path / "run_a")
    first.end()
    again = _tracked_start(cfg, tmp_path / "run_b")  # the same data in another run
    again.end()
    half = _tracked_start(_config(tmp_path, store_uri, "splits", HALF), tmp_path / "run_half")
    half.end()

    inputs = _inputs(store_uri, first.run_id)
    assert sorted(inputs) == ["synthetic/test", "synthetic/train", "synthetic/val"]
    root = str((tmp_path / "data").resolve())
    for name, context, cases in (("train", "train", 3), ("val", "validation", 1), ("test", "test", 2)):
        digest, got_context, profile, source, source_type = inputs[f"synthetic/{name}"]
        assert got_context == context and len(digest) == 8
        assert profile == {
            "cases": cases,
            "layout": "brats2021",
            "resolution": "tiny",
            "spacing_mm": 4.0,
            "shape": "48x56x40",
        }
        assert source == {"uri": root} and source_type == "local"
    digests = {name: v[0] for name, v in inputs.items()}
    assert len(set(digests.values())) == 3  # one per split
    assert {n: v[0] for n, v in _inputs(store_uri, again.run_id).items()} == digests  # stable across runs
    at_half = {n: v[0] for n, v in _inputs(store_uri, half.run_id).items()}
    assert sorted(at_half) == sorted(digests) and not set(at_half.values()) & set(digests.values())

    experiment = first.experiment_id
    everyone = {first.run_id, again.run_id, half.run_id}
    assert _search(store_uri, experiment, "dataset.name = 'synthetic/train'") == everyone
    assert _search(store_uri, experiment, f"dataset.digest = '{digests['synthetic/train']}'") == {
        first.run_id,
        again.run_id,
    }
    assert _search(store_uri, experiment, f"dataset.digest = '{at_half['synthetic/val']}'") == {half.run_id}
    assert _search(store_uri, experiment, "dataset.context = 'validation'") == everyone
    assert _search(store_uri, experiment, "dataset.name = 'synthetic/other'") == set()


def test_a_resumed_run_does_not_log_its_inputs_again(store_uri, tmp_path, monkeypatch):
    cfg = _config(tmp_path, store_uri, "resumed")
    first = _tracked_start(cfg, tmp_path / "run")
    first.end("KILLED")
    sent = []
    real = MlflowClient.log_inputs

    def spy(self, run_id, datasets=None, models=None):
        sent.append([d.dataset.name for d in datasets or []])
        return real(self, run_id, datasets, models)

    monkeypatch.setattr(MlflowClient, "log_inputs", spy)
    resumed = _tracked_start(cfg, tmp_path / "run")  # the same run_dir: the same MLflow run
    resumed.end()
    assert resumed.run_id == first.run_id
    assert sent == []  # the run holds them: nothing sent, whatever the store would do with it
    assert sorted(_inputs(store_uri, first.run_id)) == ["synthetic/test", "synthetic/train", "synthetic/val"]


def _metrics_csv(folder: Path) -> MetricsTable:
    table = MetricsTable(("wt", "tc", "et"))
    for i, case_id in enumerate(SPLIT["test"]):
        row = dict.fromkeys(table.columns[1:], 0.5 + 0.1 * i)
        row["dice_et"] = math.nan  # undefined: an empty cell, null in MLflow's table
        table.add(case_id, row)
    folder.mkdir(parents=True, exist_ok=True)
    table.save_csv(folder / "metrics.csv")
    return table


def test_evaluation_logs_the_split_it_scored_and_its_per_case_table(store_uri, tmp_path):
    cfg = _config(tmp_path, store_uri, "evaluated")
    run_dir = tmp_path / "run"
    training = _tracked_start(cfg, run_dir)
    training.end()
    out = RunFolder(run_dir).eval_dir("test")
    table = _metrics_csv(out)
    summary = table.summary()
    for _ in range(2):  # evaluated again (e.g. after more epochs): nothing is doubled
        _log_to_mlflow(run_dir, cfg, "test", summary, out, "test", SPLIT["test"])

    client = MlflowClient(store_uri)
    run = client.get_run(training.run_id)
    assert run.info.status == "FINISHED"  # evaluation does not change training's status
    inputs = _inputs(store_uri, training.run_id)
    assert sorted(inputs) == ["synthetic/eval/test", "synthetic/test", "synthetic/train", "synthetic/val"]
    digest, context, profile, _, _ = inputs["synthetic/eval/test"]
    assert context == "evaluation" and profile["cases"] == 2
    assert digest == inputs["synthetic/test"][0]  # the same cases of the same data
    assert _search(store_uri, training.experiment_id, "dataset.context = 'evaluation'") == {training.run_id}
    # the summary under the section the run page leads with
    assert run.data.metrics["Eval test/dice_wt"] == pytest.approx(summary["dice_wt"]["mean"])
    assert "Eval test/dice_et" not in run.data.metrics  # no value, no metric

    artifact = "eval/test/metrics_table.json"
    assert {"path": artifact, "type": "table"} in json.loads(run.data.tags["mlflow.loggedArtifacts"])
    rows = client.load_table(training.experiment_id, artifact, run_ids=[training.run_id])
    assert list(rows["case_id"]) == SPLIT["test"]  # one row per case, not appended twice
    assert list(rows.columns) == list(table.columns)
    assert list(rows["dice_wt"]) == pytest.approx([0.5, 0.6]) and rows["dice_et"].isna().all()
    assert {f.path for f in client.list_artifacts(training.run_id, "eval/test")} >= {"eval/test/metrics.csv", artifact}


@pytest.mark.parametrize(
    "failure, connected",
    [
        (MlflowException.invalid_parameter_value("dataset refused"), True),
        (OSError(errno.ENOSPC, "No space left on device"), False),
    ],
    ids=["refused", "disk_full"],
)
def test_a_store_that_fails_to_log_inputs_warns_once_and_training_goes_on(
    store_uri, tmp_path, caplog, monkeypatch, failure, connected
):
    caplog.set_level(logging.WARNING, logger=LOGGER)
    calls = []

    def fail(self, run_id, datasets=None, models=None):
        calls.append(run_id)
        raise failure

    monkeypatch.setattr(MlflowClient, "log_inputs", fail)
    cfg = _config(tmp_path, store_uri, f"failing-{connected}")
    run_dir = tmp_path / "run"
    tracker = _tracked_start(cfg, run_dir)  # does not raise
    tracker.log_datasets(split_inputs(cfg.data, cfg.resolution, SPLIT))  # said once
    tracker.log_metrics({"loss": 0.5}, step=1)
    tracker.end()
    warnings = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(warnings) == 1, warnings
    assert ("refused to log datasets" if connected else "no space left") in warnings[0]
    assert len(calls) == (2 if connected else 1)  # refused: still connected; full: not contacted again
    metrics = MlflowClient(store_uri).get_run(tracker.run_id).data.metrics
    assert ("loss" in metrics) is connected
    assert RunFolder(run_dir).split_path.is_file() and RunFolder(run_dir).tracking_path.is_file()


def test_a_worker_that_is_not_the_chief_logs_no_datasets(tmp_path):
    cfg = _config(tmp_path, "sqlite:///unused.db", "unused")
    NullTracker().log_datasets(split_inputs(cfg.data, cfg.resolution, SPLIT))
    NullTracker().log_table({"case_id": ["a"]}, "eval/test/metrics_table.json")
