"""The best model as an MLflow model (brats_seg.evaluation.serving.mlflow_model): logged at the end of
training, loaded by ``mlflow.pyfunc`` in a process that never imports brats_seg with the Keras
model's probabilities, registered under ``tracking.register_as``, and every failure a warning.

One tiny run (depth 2, 4 filters, 48x56x40, one epoch of one step, three synthetic cases) trains
into a temporary sqlite store with ``register_as=brats-demo``; the other tests reopen its MLflow run.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from brats_seg.config import BackendConfig, ModelConfig, TrackingConfig, TrainConfig, TrainerConfig
from tests.conftest import TINY, data_config
from tests.integration.scripts import post_json, serve_model, stop_server

REGISTERED = "brats-demo"
# The pyfunc model runs the SavedModel, which computes what the Keras model computes with the same
# kernels (tests/unit/test_export.py: equal bit for bit with the same thread counts); the bound is
# float32 rounding of reordered sums, far below what a wrong weight, channel or region gives.
ATOL = 1e-5


@pytest.fixture(scope="module")
def backend():
    from brats_seg.backend import configure, decide_backend

    return configure(decide_backend(BackendConfig(name="cpu_onednn")))


@pytest.fixture(scope="module")
def trained(synthetic_root, tmp_path_factory, backend):
    """A run trained with tracking on and ``register_as=brats-demo``, and how long training took."""
    from brats_seg.training.loop import train

    base = tmp_path_factory.mktemp("mlflow_model")
    uri = f"sqlite:///{base}/mlruns.db"
    cfg = TrainConfig(
        data=data_config(synthetic_root["brats2021"], "brats2021", base),
        resolution=TINY,
        model=ModelConfig(depth=2, base_filters=4),
        trainer=TrainerConfig(epochs=1, batch_size=1, steps_per_epoch=1, seed=3),
        tracking=TrackingConfig(uri=uri, experiment="mlflow-model", system_metrics=False, register_as=REGISTERED),
        run_dir=str(base / "run"),
    )
    start = time.perf_counter()
    result = train(cfg)
    return SimpleNamespace(
        base=base,
        uri=uri,
        cfg=cfg,
        run_dir=Path(result.run_dir),
        run_id=result.run_id,
        train_s=time.perf_counter() - start,
    )


def _client(uri: str):
    from mlflow import MlflowClient

    return MlflowClient(uri)


def _models(uri: str, run_id: str, name: str = "model") -> list:
    client = _client(uri)
    experiment_id = client.get_run(run_id).info.experiment_id
    return [
        m
        for m in client.search_logged_models([experiment_id], filter_string=f"name = '{name}'")
        if m.source_run_id == run_id
    ]


def _resumed(trained, register_as: str = REGISTERED):
    """The trained run reopened, its tracker registering as ``register_as``."""
    import dataclasses

    from brats_seg.tracking import Tracker

    tracking = dataclasses.replace(trained.cfg.tracking, register_as=register_as)
    return Tracker.resume(trained.run_dir, tracking, stage="export")


def test_training_logs_the_best_model_and_registers_it(trained):
    """(a) the run has a logged model ``model`` with the signature and the checkpoint's identity;
    (c) it is a version of the registered model ``brats-demo``."""
    from mlflow.entities import LoggedModelStatus

    from brats_seg.run_dir import RunFolder

    (model,) = _models(trained.uri, trained.run_id)
    assert model.status == LoggedModelStatus.READY
    folder = RunFolder(trained.run_dir)
    assert model.tags["brats_seg.checkpoint"] == "best"
    assert model.tags["brats_seg.checkpoint_sha256"] == folder.checkpoint_identity("best")["sha256"]
    assert model.tags["brats_seg.regions"] == "wt,tc,et"
    run = _client(trained.uri).get_run(trained.run_id)
    assert model.model_id in {o.model_id for o in run.outputs.model_outputs}  # the runs list's "Models" column

    import mlflow

    mlflow.set_tracking_uri(trained.uri)  # as the tracker left it
    info = mlflow.models.get_model_info(f"runs:/{trained.run_id}/model")
    # raw cases or a volume: no input schema (the model checks its input), its params declared
    assert info.signature.inputs is None and info.signature.outputs is None
    assert [(p.to_dict()["name"], p.to_dict()["type"], p.default) for p in info.signature.params.params] == [
        ("probabilities", "boolean", False),
        ("labels", "string", ""),
    ]
    assert model.tags["brats_seg.grid"] == "x".join(map(str, TINY.shape))  # the volume's shape, where users look
    local = Path(mlflow.artifacts.download_artifacts(f"runs:/{trained.run_id}/model"))
    assert (local / "code" / "brats_seg" / "evaluation" / "serving" / "nifti_request.py").is_file()
    assert not list((local / "code").rglob("*.pyc"))
    requirements = (local / "requirements.txt").read_text().split()
    for name in ("mlflow", "numpy", "tensorflow", "nibabel", "SimpleITK"):
        assert any(r.startswith(f"{name}==") for r in requirements), requirements
    assert info.saved_input_example_info["type"] == "ndarray"  # tiny: a zero volume (1, x, y, z, 4)

    (version,) = _client(trained.uri).search_model_versions(f"name='{REGISTERED}'")
    assert version.run_id == trained.run_id and version.source == f"models:/{model.model_id}"
    print(f"training 1 epoch at tiny with tracking, the model logged and registered: {trained.train_s:.1f} s")


_CHILD = textwrap.dedent("""
    import json, sys, time
    import numpy as np
    import tensorflow as tf

    uri, store, volume, out, intra, inter = sys.argv[1:7]
    tf.config.threading.set_intra_op_parallelism_threads(int(intra))
    tf.config.threading.set_inter_op_parallelism_threads(int(inter))
    import mlflow

    mlflow.set_tracking_uri(store)
    start = time.perf_counter()
    model = mlflow.pyfunc.load_model(uri)
    loaded_s = time.perf_counter() - start
    probs = model.predict(np.load(volume))
    np.save(out, probs)
    print(json.dumps({"type": type(probs).__name__, "dtype": str(probs.dtype), "load_s": loaded_s,
                      "brats_seg_imported": "brats_seg" in sys.modules}))
    assert "brats_seg" not in sys.modules
""")


def test_the_logged_model_predicts_the_keras_models_output_without_brats_seg(trained, tmp_path):
    """(b) ``mlflow.pyfunc.load_model("runs:/<id>/model").predict(volume)`` in a process that never
    imports brats_seg (no PYTHONPATH, its cwd outside the repository) equals the run's Keras model."""
    import tensorflow as tf

    from brats_seg.evaluation.inference.run import load_run_model

    volume = np.random.default_rng(5).normal(0.0, 1.0, (1, *TINY.shape, 4)).astype(np.float32)
    np.save(tmp_path / "volume.npy", volume)
    expected = load_run_model(trained.run_dir, "best")(volume, training=False).numpy()
    (tmp_path / "child.py").write_text(_CHILD)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    threads = [
        str(tf.config.threading.get_intra_op_parallelism_threads()),
        str(tf.config.threading.get_inter_op_parallelism_threads()),
    ]
    done = subprocess.run(
        [
            sys.executable,
            str(tmp_path / "child.py"),
            f"runs:/{trained.run_id}/model",
            trained.uri,
            str(tmp_path / "volume.npy"),
            str(tmp_path / "out.npy"),
            *threads,
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report == {**report, "type": "ndarray", "dtype": "float32", "brats_seg_imported": False}
    probs = np.load(tmp_path / "out.npy")
    assert probs.shape == (1, *TINY.shape, 3)
    np.testing.assert_allclose(probs, expected, atol=ATOL, rtol=0)
    assert float(probs.std()) > 0  # not a constant: a wrong weight or channel would show


def test_a_finished_run_trained_again_logs_no_second_model(trained, caplog):
    """The same checkpoint and precision: the run keeps its one model (and its one registered version)."""
    from brats_seg.evaluation.serving.mlflow_model import log_best_model

    with caplog.at_level(logging.INFO), _resumed(trained) as tracker:
        logged = log_best_model(tracker, trained.run_dir, step=1)
    assert logged is not None and logged.version == "1"
    assert len(_models(trained.uri, trained.run_id)) == 1
    assert len(_client(trained.uri).search_model_versions(f"name='{REGISTERED}'")) == 1
    assert "not logged again" in caplog.text


@pytest.mark.parametrize(
    "name,refusal",
    [
        ("brats/demo", None),  # the registry's own rule: no '/' or ':' in a name
        ("brats-denied", "PERMISSION_DENIED"),  # a registry that refuses this user the name
    ],
)
def test_a_refused_registration_name_warns_once_by_name(trained, caplog, monkeypatch, name, refusal):
    """(d) one warning naming the name, nothing raised, the model stays logged in the run."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException
    from mlflow.protos import databricks_pb2

    from brats_seg.evaluation.serving.mlflow_model import log_best_model

    if refusal:

        def refuse(self, *args, **kwargs):
            raise MlflowException(f"no permission to create {args[0]!r}", error_code=getattr(databricks_pb2, refusal))

        monkeypatch.setattr(MlflowClient, "create_registered_model", refuse)
    with caplog.at_level(logging.WARNING), _resumed(trained, name) as tracker:
        logged = log_best_model(tracker, trained.run_dir, step=1)
        assert tracker.sending  # a refusal is not a store that is gone
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and repr(name) in warnings[0] and "register" in warnings[0], warnings
    assert logged is not None and logged.version is None
    assert _client(trained.uri).search_registered_models(f"name = '{name}'") == []


def _fail_log_model(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


def _fail_export(*args, **kwargs):
    raise OSError(errno.EIO, "Input/output error")


@pytest.mark.parametrize(
    "target,failure",
    [
        ("mlflow.pyfunc.log_model", _fail_log_model),  # the store's disk is full
        ("brats_seg.evaluation.serving.mlflow_model.export_run", _fail_export),  # the export cannot be written
    ],
)
def test_a_model_log_that_fails_warns_once_and_the_files_stand(trained, tmp_path, caplog, monkeypatch, target, failure):
    """A new run of a copy of the run folder: the failure is one warning, the tracker ends the run,
    and the run folder is as it was."""
    from brats_seg.evaluation.serving.mlflow_model import log_best_model
    from brats_seg.run_dir import RunFolder
    from brats_seg.tracking import Tracker

    run_dir = tmp_path / "run"
    shutil.copytree(trained.run_dir, run_dir, ignore=shutil.ignore_patterns("mlflow.json"))
    before = sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*"))
    monkeypatch.setattr(target, failure)
    with caplog.at_level(logging.WARNING):
        with Tracker.start(trained.cfg.tracking, run_dir, "failing", {}, {}) as tracker:
            assert log_best_model(tracker, run_dir, step=1) is None
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, warnings
    assert sorted(str(p.relative_to(run_dir)) for p in run_dir.rglob("*")) == sorted([*before, "mlflow.json"])
    assert RunFolder(run_dir).checkpoint_file("best").is_file()
    assert _models(trained.uri, tracker.run_id) == []


def test_the_export_script_logs_its_export_into_the_run(trained, tmp_path):
    """``scripts/export.py``'s step after the export: the export it wrote becomes a model of the run
    (``model_last`` for checkpoint=last), the best checkpoint's export is the model training
    logged, and the run's status is left as training left it."""
    from brats_seg.evaluation.inference.run import load_run_config
    from brats_seg.evaluation.serving.export import export_run
    from brats_seg.evaluation.serving.mlflow_model import log_export_to_run

    config = load_run_config(trained.run_dir)
    config.tracking.register_as = ""  # the registry is test (c)'s
    folder = export_run(trained.run_dir, tmp_path / "export", "last", config=config)
    logged = log_export_to_run(trained.run_dir, folder, "last", config)
    assert logged is not None and logged.run_uri == f"runs:/{trained.run_id}/model_last"
    (model,) = _models(trained.uri, trained.run_id, "model_last")
    assert model.tags["brats_seg.checkpoint"] == "last"

    folder = export_run(trained.run_dir, tmp_path / "export_best", "best", config=config)
    (best,) = _models(trained.uri, trained.run_id)
    assert log_export_to_run(trained.run_dir, folder, "best", config).model_uri == f"models:/{best.model_id}"
    assert len(_models(trained.uri, trained.run_id)) == 1
    run = _client(trained.uri).get_run(trained.run_id)
    assert run.info.status == "FINISHED" and run.data.tags["export.status"] == "FINISHED"


@pytest.mark.slow
def test_the_logged_model_serves_over_http(trained, tmp_path):
    """``mlflow models serve -m runs:/<id>/model --env-manager local`` (the README's command) answers
    ``{"inputs": volume}`` with the Keras model's probabilities (about 10 s to start, 2 s a request)."""
    import tensorflow as tf

    from brats_seg.evaluation.inference.run import load_run_model

    threads = (
        tf.config.threading.get_intra_op_parallelism_threads(),
        tf.config.threading.get_inter_op_parallelism_threads(),
    )
    server, port = serve_model(f"runs:/{trained.run_id}/model", trained.uri, tmp_path, threads)
    try:
        volume = np.random.default_rng(7).normal(0.0, 1.0, (1, *TINY.shape, 4)).astype(np.float32)
        status, answer = post_json(port, {"inputs": volume.tolist()})
        assert status == 200, answer
    finally:
        stop_server(server)
    probs = np.asarray(answer["predictions"], np.float32)
    assert probs.shape == (1, *TINY.shape, 3)
    expected = load_run_model(trained.run_dir, "best")(volume, training=False).numpy()
    np.testing.assert_allclose(probs, expected, atol=ATOL, rtol=0)
