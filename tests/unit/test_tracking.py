"""Tracking: MLflow runs read back with MlflowClient, resume, tracking=none, unreachable server, URIs."""

from __future__ import annotations

import json
import logging
import os
import time
from datetime import datetime
from pathlib import Path

import pytest

from brats_seg.config import TrackingConfig
from brats_seg.run_dir import RunFolder
from brats_seg.tracking import (
    NullTracker,
    Tracker,
    artifact_location_for,
    evaluation_metric_key,
    find_project_root,
    git_commit,
    make_run_name,
    resolve_tracking_uri,
    training_metric_key,
)

LOGGER = "brats_seg.tracking.faults"  # the tracker says what failed through FaultPolicy
RUN_FILE = RunFolder(Path(".")).tracking_path.name  # the run folder owns the name of the run id file


@pytest.fixture(scope="module")
def store_uri(tmp_path_factory) -> str:
    """One sqlite store per module (creating the schema costs ~1-2 s); runs are told apart by id."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow')}/mlruns.db"


@pytest.fixture
def clean_env(monkeypatch):
    """Undo the environment variables the tracker sets for http stores."""
    for name in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT"):
        monkeypatch.setenv(name, "x")  # recorded, so teardown restores the original state...
        monkeypatch.delenv(name)  # ...while the test starts without the variable


def _cfg(uri: str, **kw) -> TrackingConfig:
    kw.setdefault("experiment", "test")
    kw.setdefault("system_metrics", False)
    return TrackingConfig(uri=uri, **kw)


def _client(uri: str):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri)


def _metric_steps(uri: str, run_id: str, key: str) -> list[int]:
    return sorted(m.step for m in _client(uri).get_metric_history(run_id, key))


def test_run_is_logged_and_reads_back(store_uri, tmp_path):
    run_dir = tmp_path / "run"
    params = {"model.depth": 3, "resolution.shape": [48, 56, 40], "data.root": "x" * 7000, "odd key?*": 1}
    tracker = Tracker.start(_cfg(store_uri), run_dir, "synthetic-tiny-test", params, {"backend": "cpu_onednn"})
    tracker.log_metrics({"loss": 0.9, "val/dice_wt": 0.1}, step=1)
    tracker.log_metrics({"loss": 0.5, "val/dice_wt": 0.4}, step=2)
    (tmp_path / "split.json").write_text("{}")
    (tmp_path / "overlays").mkdir()
    (tmp_path / "overlays" / "case1.png").write_bytes(b"png")
    tracker.log_artifact(tmp_path / "split.json")
    tracker.log_artifacts(tmp_path / "overlays", "overlays")
    tracker.log_text("plan table", "plan/memory.txt")
    tracker.set_tags({"git_commit": "abc"})
    tracker.end()

    run = _client(store_uri).get_run(tracker.run_id)
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "synthetic-tiny-test"
    assert run.data.params["model.depth"] == "3"
    assert run.data.params["resolution.shape"] == "[48, 56, 40]"
    assert len(run.data.params["data.root"]) == 6000 and run.data.params["data.root"].endswith("[truncated]")
    assert run.data.params["odd key__"] == "1"
    assert run.data.tags["backend"] == "cpu_onednn" and run.data.tags["git_commit"] == "abc"
    assert _metric_steps(store_uri, tracker.run_id, "loss") == [1, 2]
    assert run.data.metrics["val/dice_wt"] == pytest.approx(0.4)
    # Artifacts beside the database, not under the cwd.
    db_dir = Path(store_uri[len("sqlite:///") :]).parent
    assert run.info.artifact_uri.startswith((db_dir / "mlartifacts").as_uri())
    names = {f.path for f in _client(store_uri).list_artifacts(tracker.run_id)}
    assert names == {"split.json", "overlays", "plan"}
    assert (db_dir / "mlartifacts" / "test" / tracker.run_id / "artifacts" / "overlays" / "case1.png").is_file()

    saved = json.loads((run_dir / RUN_FILE).read_text())
    assert saved == {
        "run_id": tracker.run_id,
        "experiment_id": run.info.experiment_id,
        "tracking_uri": store_uri,
        "run_name": "synthetic-tiny-test",
    }
    assert sorted(p.name for p in run_dir.iterdir()) == [RUN_FILE]  # no local copy of the calls


def test_the_experiment_opens_in_mlflows_model_training_view(tmp_path):
    """MLflow's UI reads the experiment tag mlflow.experimentKind; without it, it opened ours in
    its GenAI view (traces, token usage). An older experiment gets the tag; a kind set by hand stays."""
    from brats_seg.tracking.store import experiment_id_for

    uri = f"sqlite:///{tmp_path}/mlruns.db"
    client = _client(uri)
    new = experiment_id_for(client, uri, "fresh")
    assert client.get_experiment(new).tags["mlflow.experimentKind"] == "custom_model_development"
    older = client.create_experiment("made-before-the-tag")
    assert experiment_id_for(client, uri, "made-before-the-tag") == older
    assert client.get_experiment(older).tags["mlflow.experimentKind"] == "custom_model_development"
    chosen = client.create_experiment("chosen", tags={"mlflow.experimentKind": "genai_development"})
    experiment_id_for(client, uri, "chosen")
    assert client.get_experiment(chosen).tags["mlflow.experimentKind"] == "genai_development"


@pytest.mark.parametrize(
    "flat, key",
    [
        ("loss", "Loss/train"),
        ("val_loss", "Loss/val"),
        ("dice_wt", "Dice/train_wt"),
        ("val_dice_et", "Dice/val_et"),
        ("dice_mean", "Dice/train_mean"),
        ("val_dice_mean", "Dice/val_mean"),
        ("best_val_dice_mean", "Dice/val_mean_best"),
        ("val_dice_rc", "Dice/val_rc"),
        ("prob_tc", "region monitors/prob_tc"),
        ("val_vol_wt", "region monitors/val_vol_wt"),
        ("val_ref_vol_et", "region monitors/val_ref_vol_et"),
        ("learning_rate", "optimizer/learning_rate"),
        ("peak_bytes", "memory and time/peak_bytes"),
        ("step_s", "memory and time/step_s"),
        ("val_s", "memory and time/val_s"),
        ("lms_recomputed_flops", "memory and time/lms_recomputed_flops"),
        ("something_new", "something_new"),
    ],
)
def test_training_metrics_go_to_the_chart_section_users_look_in(flat, key):
    assert training_metric_key(flat) == key


def test_chart_sections_lead_with_loss_dice_and_the_evaluation():
    """MLflow orders a run's chart sections by name as plain strings (capitals first), before
    'Model metrics' and 'System metrics': the leading sections are Dice, Eval <split> and Loss."""
    flat = [
        "loss",
        "val_loss",
        "dice_wt",
        "val_dice_wt",
        "val_dice_mean",
        "prob_wt",
        "val_ref_vol_wt",
        "learning_rate",
        "peak_bytes",
        "lms_offloaded_bytes",
    ]
    keys = [training_metric_key(k) for k in flat]
    keys += [
        evaluation_metric_key("test", column, stat)
        for column in ("dice_wt", "hd95_wt", "lesion_dice_wt")
        for stat in ("mean", "median", "std")
    ]
    sections = sorted({k.rsplit("/", 1)[0] for k in keys})  # JavaScript's default sort: code units
    assert sections[:3] == ["Dice", "Eval test", "Loss"]
    assert all(s[0].islower() for s in sections[3:])
    assert evaluation_metric_key("val", "hd95_tc", "std") == "eval val std/hd95_tc"


def test_resume_reopens_the_same_run(store_uri, tmp_path):
    run_dir = tmp_path / "run"
    first = Tracker.start(_cfg(store_uri), run_dir, "resume-me", {"trainer.epochs": 2, "model.depth": 3}, {})
    first.log_metrics({"loss": 1.0}, step=1)
    first.log_metrics({"loss": 0.8}, step=2)
    first.end("KILLED")

    # Re-running with the same run_dir (e.g. more epochs): the run name given now is ignored.
    second = Tracker.start(
        _cfg(store_uri),
        run_dir,
        "ignored-name",
        {"trainer.epochs": 4, "model.depth": 3, "trainer.seed": 0},
        {"resumed": "yes"},
    )
    assert second.run_id == first.run_id
    assert _client(store_uri).get_run(second.run_id).info.status == "RUNNING"
    second.log_metrics({"loss": 0.6}, step=3)
    second.log_metrics({"loss": 0.5}, step=4)
    second.end()

    run = _client(store_uri).get_run(first.run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "resume-me"
    assert _metric_steps(store_uri, run.info.run_id, "loss") == [1, 2, 3, 4]
    assert run.data.params["trainer.epochs"] == "2"  # MLflow params are immutable: the first value stays
    assert run.data.params["trainer.seed"] == "0"  # new keys are added
    assert run.data.tags["resumed"] == "yes"

    # Evaluation reopens it too; the run keeps its status, evaluation's goes in a tag.
    evaluation = Tracker.resume(run_dir)
    assert evaluation.run_id == first.run_id
    evaluation.log_metrics({"test/dice_wt": 0.7}, step=4)
    evaluation.end("FAILED")
    run = _client(store_uri).get_run(first.run_id)
    assert run.info.status == "FINISHED" and run.data.tags["evaluation.status"] == "FAILED"
    assert run.data.metrics["test/dice_wt"] == pytest.approx(0.7)


def test_resume_without_run_file_sends_nothing(tmp_path):
    tracker = Tracker.resume(tmp_path / "never-tracked")
    assert tracker.run_id is None
    tracker.log_metrics({"test/dice_wt": 0.7})
    tracker.end()
    assert not (tmp_path / "never-tracked").exists()


def test_tracking_none_sends_nothing(tmp_path):
    db = tmp_path / "should-not-exist.db"
    run_dir = tmp_path / "run"
    (tmp_path / "f.txt").write_text("x")
    tracker = Tracker.start(_cfg(f"sqlite:///{db}", name="none"), run_dir, "offline", {"a": 1}, {"t": "v"})
    tracker.log_metrics({"loss": 1.0}, step=1)
    tracker.log_params({"b": 2})
    tracker.log_artifact(tmp_path / "f.txt")
    tracker.log_text("x", "notes.txt")
    tracker.end()
    assert tracker.run_id is None
    assert not db.exists() and not (run_dir / RUN_FILE).exists() and not (tmp_path / "mlartifacts").exists()


def test_a_worker_that_is_not_the_chief_sends_nothing_and_answers_every_method(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    with NullTracker() as tracker:
        tracker.log_metrics({"loss": 1.0}, step=1)
        tracker.log_params({"a": 1})
        tracker.set_tags({"t": "v"})
        tracker.log_text("x", "notes.txt")
        assert tracker.find_model("model", {}) is None and tracker.register_model("models:/m", "name") is None
        assert tracker.log_model("model", tmp_path / "model.py", {}, None) is None
        assert not tracker.sending and tracker.run_id is None and tracker.register_as == ""
    assert list(tmp_path.iterdir()) == [] and not caplog.records


def test_unreachable_server_warns_once_and_training_goes_on(tmp_path, caplog, clean_env):
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    run_dir = tmp_path / "run"
    t0 = time.perf_counter()
    tracker = Tracker.start(
        _cfg("http://127.0.0.1:9", system_metrics=True), run_dir, "unreachable", {"a": 1}, {"t": "v"}
    )
    (tmp_path / "f.txt").write_text("x")
    for step in range(1, 21):
        tracker.log_metrics({"loss": 1.0 / step}, step=step)
    tracker.log_params({"b": 2})
    tracker.set_tags({"u": "w"})
    tracker.log_artifact(tmp_path / "f.txt")
    tracker.log_text("x", "notes.txt")
    tracker.end()
    elapsed_s = time.perf_counter() - t0
    logging.getLogger(__name__).info("unreachable server: start + 24 calls + end took %.2f s", elapsed_s)
    assert elapsed_s < 30

    warnings = [r for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    message = warnings[0].getMessage()
    assert "http://127.0.0.1:9" in message and "Training goes on" in message and str(run_dir) in message
    assert tracker.run_id is None and not (run_dir / RUN_FILE).exists()


def test_store_failure_mid_run_warns_once_then_stops_contacting(store_uri, tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    tracker = Tracker.start(_cfg(store_uri), tmp_path / "run", "dies", {}, {})
    calls = []

    def broken(*args, **kwargs):
        calls.append(1)
        raise ConnectionError("store went away")

    tracker._client.log_batch = broken
    for step in range(5):
        tracker.log_metrics({"loss": 1.0}, step=step)
    tracker.log_metrics({"not-a-number": "nan?"}, step=6)
    tracker.log_artifact(tmp_path / "missing.txt")
    tracker.end()
    assert len(calls) == 1  # after the first failure the store is not contacted again
    warnings = [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING]
    assert sum("store went away" in w for w in warnings) == 1


def test_refused_call_warns_but_stays_connected(store_uri, tmp_path, caplog):
    from mlflow.exceptions import MlflowException

    caplog.set_level(logging.WARNING, logger=LOGGER)
    tracker = Tracker.start(_cfg(store_uri), tmp_path / "run", "refused", {}, {})
    real = tracker._client.log_batch

    def refuse_once(*args, **kwargs):
        tracker._client.log_batch = real
        raise MlflowException("bad value", error_code=1000)  # INVALID_PARAMETER_VALUE

    tracker._client.log_batch = refuse_once
    tracker.log_metrics({"loss": 1.0}, step=1)
    tracker.log_metrics({"loss": 0.5}, step=2)
    tracker.end()
    assert _metric_steps(store_uri, tracker.run_id, "loss") == [2]
    assert len([r for r in caplog.records if r.name == LOGGER]) == 1


def test_system_metrics_are_logged(store_uri, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "0.2")
    tracker = Tracker.start(_cfg(store_uri, system_metrics=True), tmp_path / "run", "sysmetrics", {}, {})
    deadline = time.monotonic() + 30.0  # a busy machine can delay the first sample by seconds
    metrics = {}
    while time.monotonic() < deadline and "system/cpu_utilization_percentage" not in metrics:
        time.sleep(0.5)
        metrics = _client(store_uri).get_run(tracker.run_id).data.metrics
    tracker.end()
    assert "system/cpu_utilization_percentage" in metrics


def test_relative_sqlite_uri_resolves_against_the_project_root(tmp_path, monkeypatch):
    assert resolve_tracking_uri("sqlite:///mlruns.db", root=tmp_path) == f"sqlite:///{tmp_path}/mlruns.db"
    assert resolve_tracking_uri("sqlite:///db/x.db?mode=rw", root=tmp_path) == f"sqlite:///{tmp_path}/db/x.db?mode=rw"
    for uri in (f"sqlite:///{tmp_path}/abs.db", "http://127.0.0.1:5000", "postgresql://u@h/db", "sqlite://"):
        assert resolve_tracking_uri(uri, root=tmp_path) == uri

    # Default root: the repository holding this test, whatever the cwd.
    monkeypatch.chdir(tmp_path)
    repo = Path(__file__).resolve().parents[2]
    assert find_project_root() == repo
    assert resolve_tracking_uri("sqlite:///mlruns.db") == f"sqlite:///{repo}/mlruns.db"
    assert find_project_root(tmp_path) == tmp_path  # no project above: the cwd
    assert (
        artifact_location_for(f"sqlite:///{tmp_path}/mlruns.db", "brats seg")
        == (tmp_path / "mlartifacts" / "brats_seg").as_uri()
    )
    assert artifact_location_for("http://127.0.0.1:5000", "x") is None


def test_run_name_and_git_commit(tmp_path):
    name = make_run_name("synthetic", "tiny", "unet3d_d3f8", "cpu_onednn", "off", now=datetime(2024, 11, 22, 14, 30))
    assert name == "synthetic-tiny-unet3d_d3f8-cpu_onednn-lmsoff-1122-1430"
    assert make_run_name("my data", "2x", "u/net", "gpu_lms", "auto").startswith("my_data-2x-u_net-gpu_lms-lmsauto-")
    commit = git_commit()
    assert commit == "unknown" or len(commit.split("+")[0]) >= 7
    assert git_commit(tmp_path) == "unknown"


def test_bad_tracking_name_is_an_actionable_error(tmp_path):
    with pytest.raises(ValueError, match="tracking=mlflow or tracking=none"):
        Tracker.start(_cfg("sqlite:///x.db", name="wandb"), tmp_path, "x", {}, {})
    assert os.listdir(tmp_path) == []


def test_mlflow_sets_its_user_and_source_tags(store_uri, tmp_path):
    tracker = Tracker.start(_cfg(store_uri), tmp_path / "run", "context-tags", {}, {"backend": "cpu_onednn"})
    tracker.end()
    tags = _client(store_uri).get_run(tracker.run_id).data.tags
    assert {"mlflow.user", "mlflow.source.name", "mlflow.source.type"} <= set(tags) and tags["backend"] == "cpu_onednn"


def test_a_run_already_active_in_the_thread_is_left_alone(store_uri, tmp_path):
    import mlflow

    mlflow.set_tracking_uri(store_uri)
    outer = mlflow.start_run(run_name="notebook")
    try:
        tracker = Tracker.start(_cfg(store_uri), tmp_path / "run", "inner", {}, {})
        tracker.end()
        assert mlflow.active_run().info.run_id == outer.info.run_id
        assert _client(store_uri).get_run(tracker.run_id).info.status == "FINISHED"
    finally:
        mlflow.end_run()


def test_probe_counts_any_http_answer_and_fails_fast_without_one():
    import http.server
    import threading

    from brats_seg.tracking import StoreUnreachable, probe_server

    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_error(404)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        probe_server(f"http://127.0.0.1:{server.server_port}", timeout_s=5)  # an error status is an answer
    finally:
        server.shutdown()
        server.server_close()
    t0 = time.perf_counter()
    with pytest.raises(StoreUnreachable, match="127.0.0.1:9.*tracking.uri"):
        probe_server("http://127.0.0.1:9", timeout_s=2)
    assert time.perf_counter() - t0 < 5


def test_only_mlflows_public_api_is_used():
    """MLflow's internals change between minor versions; the pin in pyproject.toml trusts its public API only."""
    import re

    repo = Path(__file__).resolve().parents[2]
    private = re.compile(r"mlflow\.(utils|tracking\.context|system_metrics\.system_metrics_monitor|store)\b")
    offenders = [
        f"{path.relative_to(repo)}:{n}"
        for folder in ("brats_seg", "scripts")
        for path in sorted((repo / folder).rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if private.search(line)
    ]
    assert offenders == []


def test_links_to_the_ui_choose_the_model_training_view():
    """MLflow 3.17 opens an experiment in the view its GenAI/Model training switch was left in
    (GenAI in a new browser) and reads no tag for it; the query in our links chooses training."""
    from brats_seg.tracking import ui_url

    assert (
        ui_url("sqlite:////data/mlruns.db", "3", "abc")
        == "http://127.0.0.1:5000/#/experiments/3/runs/abc?workflowType=machine_learning"
    )
    assert (
        ui_url("https://mlflow.example:8443/", "3")
        == "https://mlflow.example:8443/#/experiments/3?workflowType=machine_learning"
    )
    assert ui_url("sqlite:////data/mlruns.db", "1", server="http://127.0.0.1:5077").startswith(
        "http://127.0.0.1:5077/#/"
    )
