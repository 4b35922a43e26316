"""End to end: ``train.py`` with overrides, then ``evaluate.py``; the MLflow store holds the run."""

from __future__ import annotations

import csv
import json

import pytest

from tests.integration.scripts import REPO, run_script


@pytest.mark.slow
def test_train_then_evaluate_is_tracked_in_mlflow(tmp_path):
    from mlflow.tracking import MlflowClient

    db = tmp_path / "mlruns.db"
    uri = f"sqlite:///{db}"
    run_dir = tmp_path / "run"
    common = [f"tracking.uri={uri}", "tracking.system_metrics=false"]
    run_script(
        [
            str(REPO / "train.py"),
            "resolution=tiny",
            "data=synthetic",
            f"data.root={tmp_path / 'synthetic'}",
            "data.synthetic_cases=5",
            f"data.cache_dir={tmp_path / 'cache'}",
            "model.depth=2",
            "model.base_filters=4",
            "trainer.epochs=2",
            "trainer.batch_size=1",
            f"run_dir={run_dir}",
            *common,
        ],
        cwd=tmp_path,
    )
    assert (run_dir / "checkpoints" / "best.keras").is_file()
    assert json.loads((run_dir / "state.json").read_text())["epoch"] == 2

    out = run_script([str(REPO / "scripts" / "evaluate.py"), f"run_dir={run_dir}"], cwd=tmp_path)
    assert "WT" in out.stdout
    split = json.loads((run_dir / "split.json").read_text())
    # post-processing chosen on the val split, kept in the run folder, said, and in the summary
    assert split["val"] and "post-processing: " in out.stdout
    chosen = json.loads((run_dir / "postprocess.json").read_text())
    assert chosen["validation"]["cases"] == split["val"]
    summary = json.loads((run_dir / "eval" / "test" / "summary.json").read_text())
    assert summary["postprocess"]["rules"] == chosen["rules"]
    with open(run_dir / "eval" / "test" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert sorted(r["case_id"] for r in rows) == sorted(split["test"])
    assert list(rows[0])[:7] == ["case_id", "dice_wt", "dice_tc", "dice_et", "hd95_wt", "hd95_tc", "hd95_et"]

    run_id = json.loads((run_dir / "mlflow.json").read_text())["run_id"]
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(run_id)
    assert run.data.params["model.base_filters"] == "4"
    assert run.data.params["resolution.name"] == "tiny"
    assert run.data.tags["backend"] == "cpu_onednn" and run.data.tags["resolution"] == "tiny"
    assert "git_commit" in run.data.tags
    history = client.get_metric_history(run_id, "Dice/val_mean")
    assert [m.step for m in history] == [1, 2]  # per-epoch metrics, in the run page's leading sections
    assert [m.step for m in client.get_metric_history(run_id, "Loss/train")] == [1, 2]
    assert "Eval test/dice_wt" in run.data.metrics and "eval test median/dice_wt" in run.data.metrics
    assert not [k for k in run.data.metrics if "/" not in k]  # nothing left in MLflow's catch-all section
    top = {a.path for a in client.list_artifacts(run_id)}
    assert {"checkpoints", "eval", "training_curves.png", "postprocess.json"} <= top
    evaluated = {a.path for a in client.list_artifacts(run_id, "eval/test")}
    assert {"eval/test/metrics.csv", "eval/test/summary.json", "eval/test/per_case.png"} <= evaluated
    # the figures in the run folder: both epochs drawn (the last drawing at the end of training)
    import matplotlib.image as mpimg

    assert mpimg.imread(run_dir / "training_curves.png").shape[1] > 800
    assert mpimg.imread(run_dir / "eval" / "test" / "per_case.png").shape[1] > 800
