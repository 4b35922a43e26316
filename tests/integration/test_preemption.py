"""SIGTERM/SIGINT to a training process: the step finishes, a checkpoint is saved, the exit is
prompt and distinct, the MLflow run is KILLED, and the same command resumes to the same end."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
EXIT_PREEMPTED = 75


def _command(tmp_path, run_dir, uri):
    return [
        sys.executable,
        str(REPO / "train.py"),
        "resolution=tiny",
        "data=synthetic",
        f"data.root={tmp_path / 'synthetic'}",
        "data.synthetic_cases=8",
        f"data.cache_dir={tmp_path / 'cache'}",
        "model.depth=2",
        "model.base_filters=4",
        "trainer.epochs=2",
        "trainer.batch_size=1",
        "backend=cpu_onednn",
        f"tracking.uri={uri}",
        "tracking.system_metrics=false",
        f"run_dir={run_dir}",
    ]


def _weights(run_dir):
    import keras

    import brats_seg.model.unet3d
    import brats_seg.training.losses  # noqa: F401

    model = keras.models.load_model(run_dir / "checkpoints" / "last.keras", compile=True)
    return model.get_weights() + [v.numpy() for v in model.optimizer.variables]


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM])
def test_signal_saves_the_step_and_the_same_command_resumes_to_the_same_end(tmp_path, sig):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    full_dir, cut_dir = tmp_path / "full", tmp_path / "cut"
    done = subprocess.run(_command(tmp_path, full_dir, uri), cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]

    proc = subprocess.Popen(
        _command(tmp_path, cut_dir, uri),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    lines = []
    for line in proc.stdout:  # the loop logs each epoch's start once its signal handlers are in place
        lines.append(line)
        if "epoch 1/2: training from step 1" in line:
            break
    assert proc.poll() is None, "".join(lines)[-3000:]
    time.sleep(0.5)  # inside the first step (its tracing takes seconds)
    sent = time.monotonic()
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=300)
    waited = time.monotonic() - sent
    output = "".join(lines) + out
    assert proc.returncode == EXIT_PREEMPTED, output[-3000:]
    assert waited < 120
    assert "Re-run the same command to resume" in output
    state = json.loads((cut_dir / "state.json").read_text())
    assert state["epoch"] == 0 and state["step"] >= 1  # a mid-epoch checkpoint with its position
    assert (cut_dir / "checkpoints" / "last.keras").is_file()
    client = MlflowClient(tracking_uri=uri)
    run_id = json.loads((cut_dir / "mlflow.json").read_text())["run_id"]
    assert client.get_run(run_id).info.status == "KILLED"

    again = subprocess.run(_command(tmp_path, cut_dir, uri), cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((cut_dir / "mlflow.json").read_text())["run_id"] == run_id  # the same MLflow run
    assert client.get_run(run_id).info.status == "FINISHED"
    for a, b in zip(_weights(full_dir), _weights(cut_dir)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    full_hist = json.loads((full_dir / "state.json").read_text())["history"]
    cut_hist = json.loads((cut_dir / "state.json").read_text())["history"]
    assert [h["epoch"] for h in cut_hist] == [1, 2]
    for key in ("loss", "dice_mean", "val_dice_mean"):
        for a, b in zip(full_hist, cut_hist):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-5), key
