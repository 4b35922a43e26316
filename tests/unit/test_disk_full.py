"""A full disk while writing a checkpoint, a prediction or the tracking store (issue 21, "disk full").

Each case runs on a real size-limited file system (a 4 MB tmpfs, mounted by the test; this needs
root, as CI has) or, where none can be mounted, with ENOSPC injected where the bytes reach the
disk (``os.fsync`` of files under the folder, as NFS and delayed allocation report it); the
tests that need the injected fault itself use it everywhere.

- checkpoint: the disk fills at the end of epoch 1, so epoch 2's checkpoint cannot be written:
  DiskFullError names the file and the free space and says the run resumes from epoch 1; epoch
  1's files are whole (last.keras loads, state.json says 1, no temporary left); with space freed
  the same config resumes at epoch 2 and ends with the weights of an uninterrupted run.
- prediction: scripts/predict.py's disk fills after the first mask: exit 2 with one line naming
  the next mask and the free space; the mask written stays a valid NIfTI, equal to a mask
  predicted with space to spare; with space freed the same command writes them all.
- tracking store: MLflow's SQLite database fills up during training: training goes on, ONE
  warning names the database and the free space, and the run folder is complete; also when
  MLflow's system-metrics thread meets the full disk first (its own tracebacks stay out of the
  log), and when an artifact (the best checkpoint) does not fit beside the store.
- the checkpoint's message says what is on disk: no epoch yet, a completed epoch, or a signal's
  mid-epoch position.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from brats_seg.config import BackendConfig, ModelConfig, TrackingConfig, TrainConfig, TrainerConfig
from brats_seg.files import DiskFullError, is_temporary
from tests.conftest import TINY, data_config, mounted_tmpfs

REPO = Path(__file__).resolve().parents[2]
SMALL_FS = "4m"


# --- a disk that fills up on demand ---------------------------------------------------------


def fill(folder: Path) -> Path:
    """Write ``folder/filler`` until the file system refuses a single byte; returns the filler."""
    filler = folder / "filler"
    with open(filler, "wb", buffering=0) as f:
        for chunk in (1 << 20, 1 << 16, 1 << 12, 1 << 9, 1):
            try:
                while True:
                    f.write(b"\0" * chunk)
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
    return filler


class Disk:
    """Where a test writes (``folder``) and how the disk fills (:meth:`fill`) and empties (:meth:`free`)."""

    kind: str
    folder: Path

    def fill(self) -> None:
        raise NotImplementedError

    def free(self) -> None:
        raise NotImplementedError


class SmallFileSystem(Disk):
    kind = "tmpfs"

    def __init__(self, folder: Path) -> None:
        self.folder, self.filler = folder, None

    def fill(self) -> None:
        self.filler = fill(self.folder)
        assert os.statvfs(self.folder).f_bavail == 0

    def free(self) -> None:
        self.filler.unlink()


class InjectedEnospc(Disk):
    """``os.fsync`` of a file under ``folder`` fails with ENOSPC once filled (as NFS reports a full disk)."""

    kind = "injected"

    def __init__(self, folder: Path, monkeypatch) -> None:
        self.folder, self.full = folder, False
        real = os.fsync

        def fsync(fd):
            if self.full and Path(os.readlink(f"/proc/self/fd/{fd}")).is_relative_to(self.folder):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return real(fd)

        folder.mkdir(parents=True, exist_ok=True)
        monkeypatch.setattr(os, "fsync", fsync)

    def fill(self) -> None:
        self.full = True

    def free(self) -> None:
        self.full = False


@pytest.fixture
def disk(tmp_path, monkeypatch):
    """A real 4 MB file system that fills up where one can be mounted (root: CI); elsewhere ENOSPC
    injected at fsync (as a full NFS share reports it), so the test runs everywhere, once."""
    folder = tmp_path / "disk"
    with mounted_tmpfs(folder, SMALL_FS) as why_not:
        yield InjectedEnospc(folder, monkeypatch) if why_not else SmallFileSystem(folder)


# --- tiny training runs -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def backend():
    from brats_seg.backend import configure, decide_backend

    return configure(decide_backend(BackendConfig(name="cpu_onednn")))


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    return tmp_path_factory.mktemp("disk_full")  # the data cache, shared by the module's runs


def _cfg(root, shared: Path, run_dir: Path, tracking: TrackingConfig | None = None) -> TrainConfig:
    return TrainConfig(
        data=data_config(root, "brats2021", shared),
        resolution=dataclasses.replace(TINY),
        model=ModelConfig(depth=2, base_filters=4),
        trainer=TrainerConfig(epochs=2, batch_size=1, steps_per_epoch=1, seed=3),
        tracking=tracking or TrackingConfig(name="none"),
        run_dir=str(run_dir),
    )


def _last_checkpoint(run_dir: Path):
    import keras

    import brats_seg.model.unet3d
    import brats_seg.training.losses  # noqa: F401

    return keras.models.load_model(Path(run_dir) / "checkpoints" / "last.keras", compile=True)


def _weights(run_dir: Path) -> list[np.ndarray]:
    model = _last_checkpoint(run_dir)
    return model.get_weights() + [v.numpy() for v in model.optimizer.variables]


@pytest.fixture(scope="module")
def reference_run(synthetic_root, shared, backend):
    """An uninterrupted 2-epoch run: the end a resumed run must reach, and a model to predict with."""
    from brats_seg.training.loop import train

    run_dir = shared / "reference"
    assert train(_cfg(synthetic_root["brats2021"], shared, run_dir)).epochs_done == 2
    return run_dir


def _fill_after_epoch(disk: Disk, epoch: int):
    import keras

    class FillTheDisk(keras.callbacks.Callback):
        """Runs after the run's own callbacks: epoch ``epoch``'s files are written, the next ones cannot be."""

        def on_epoch_end(self, e, logs=None):
            if e + 1 == epoch:
                disk.fill()

    return FillTheDisk()


def _temporaries(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if is_temporary(p)]


# --- checkpoint ---------------------------------------------------------------------------------


def test_a_full_disk_at_a_checkpoint_names_it_keeps_epoch_1_and_the_run_resumes_to_the_same_end(
    disk, synthetic_root, shared, backend, reference_run, caplog
):
    from brats_seg.run_dir import RunFolder
    from brats_seg.training.loop import train

    run_dir = disk.folder / "run"
    cfg = _cfg(synthetic_root["brats2021"], shared, run_dir)
    with pytest.raises(DiskFullError) as caught:
        train(cfg, extra_callbacks=[_fill_after_epoch(disk, 1)])
    err = caught.value
    assert err.path.parent == run_dir / "checkpoints" and err.path.name in ("best.keras", "last.keras")
    message = str(err)
    assert str(err.path) in message and "free there" in message, message
    assert "resumes from the last completed epoch, epoch 1" in message, message
    if disk.kind == "tmpfs":
        assert err.free_bytes is not None and err.free_bytes < 64 * 1024, message  # what was really free

    folder = RunFolder(run_dir)
    assert folder.read_state()["epoch"] == 1
    assert int(_last_checkpoint(run_dir).optimizer.iterations.numpy()) == 1  # epoch 1's (one step) loads
    assert _temporaries(run_dir) == []  # the failed write gave its space back
    assert not (run_dir / ".lock").exists()

    disk.free()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="brats_seg"):
        result = train(cfg)
    assert result.epochs_done == 2
    assert any("from epoch 2 step 0" in r.getMessage() for r in caplog.records), caplog.text[-3000:]
    assert [h["epoch"] for h in folder.read_state()["history"]] == [1, 2]
    for a, b in zip(_weights(reference_run), _weights(run_dir), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


# --- prediction ---------------------------------------------------------------------------------

_PREDICT = """
import errno, os, runpy, sys
from pathlib import Path

out, kind = Path(sys.argv[1]), sys.argv[2]
real_replace, real_fsync = os.replace, os.fsync
masks = []

def replace(src, dst):  # once the first mask is in place, the disk is full
    real_replace(src, dst)
    if Path(dst).parent == out and str(dst).endswith(".nii.gz"):
        masks.append(dst)
        if kind == "tmpfs" and len(masks) == 1:
            with open(out.parent / "filler", "wb", buffering=0) as f:
                for chunk in (1 << 20, 1 << 16, 1 << 12, 1 << 9, 1):
                    try:
                        while True:
                            f.write(b"\\0" * chunk)
                    except OSError:
                        pass

def fsync(fd):
    if kind == "injected" and masks and Path(os.readlink(f"/proc/self/fd/{fd}")).parent == out:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    return real_fsync(fd)

os.replace, os.fsync = replace, fsync
script = sys.argv[3]
sys.argv = [script, *sys.argv[4:]]
runpy.run_path(script, run_name="__main__")
"""


def _predict(script_args: list[str], out: Path, kind: str | None) -> subprocess.CompletedProcess:
    """scripts/predict.py in a fresh process; with ``kind``, its disk fills once the first mask is in place."""
    script = str(REPO / "scripts" / "predict.py")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-c", _PREDICT, str(out), kind, script] if kind else [sys.executable, script]
    return subprocess.run(
        [*command, *script_args], cwd=out.parent, env=env, capture_output=True, text=True, timeout=900
    )


def _predict_args(run_dir: Path, root: Path) -> list[str]:
    return [f"run_dir={run_dir}", f"input={root}", "evaluate.overlays=false", "backend=cpu_onednn"]


@pytest.fixture(scope="module")
def spare_masks(synthetic_root, reference_run, shared) -> Path:
    """The masks scripts/predict.py writes with space to spare."""
    out = shared / "spare" / "masks"
    out.parent.mkdir()
    done = _predict([*_predict_args(reference_run, synthetic_root["brats2021"]), f"output={out}"], out, None)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


@pytest.mark.slow  # runs the entry point scripts/predict.py
def test_a_full_disk_while_predicting_names_the_mask_and_the_masks_written_stay_valid(
    disk, synthetic_root, reference_run, spare_masks
):
    import nibabel as nib

    args = _predict_args(reference_run, synthetic_root["brats2021"])
    expected = sorted(p.name for p in spare_masks.iterdir() if p.name.endswith(".nii.gz"))
    assert len(expected) == 3

    out = disk.folder / "masks"
    done = _predict([*args, f"output={out}"], out, disk.kind)
    assert done.returncode == 2, (done.stdout + done.stderr)[-3000:]
    error = done.stderr.strip().splitlines()[-1]
    assert error.startswith("error: no space left on the device writing "), done.stderr[-3000:]
    named = Path(error.removeprefix("error: no space left on the device writing ").split(" (", 1)[0])
    assert " free there)." in error and "run the same command again" in error, error
    # the next write: the second mask, or the folder's own record of the masks done (not another mask)
    assert named.parent == out and (named.name == expected[1] or not named.name.endswith(".nii.gz")), error
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    written = sorted(p.name for p in out.iterdir() if p.name.endswith(".nii.gz") and not is_temporary(p))
    assert written == expected[:1] and _temporaries(out) == []  # the first mask; the second's space given back
    first = nib.load(out / expected[0])
    reference = nib.load(spare_masks / expected[0])
    np.testing.assert_array_equal(np.asarray(first.dataobj), np.asarray(reference.dataobj))
    np.testing.assert_array_equal(first.affine, reference.affine)

    (disk.folder / "filler").unlink(missing_ok=True)  # space freed: the same command completes the folder
    done = _predict([*args, f"output={out}"], out, None)
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir() if p.name.endswith(".nii.gz")) == expected
    for name in expected:
        np.testing.assert_array_equal(
            np.asarray(nib.load(out / name).dataobj), np.asarray(nib.load(spare_masks / name).dataobj)
        )


# --- tracking store -----------------------------------------------------------------------------


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _database_full(monkeypatch, disk: InjectedEnospc, only_system_metrics: bool = False) -> None:
    """MLflow's SQLite store refuses writes as it does on a full disk (MlflowException from SQLite's
    error); with ``only_system_metrics``, only the batches of MLflow's monitor (``system/*``)."""
    import sqlite3

    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import TEMPORARILY_UNAVAILABLE

    real = MlflowClient.log_batch

    def log_batch(self, *args, **kwargs):
        metrics = kwargs.get("metrics") or (args[1] if len(args) > 1 else None) or []
        if disk.full and (not only_system_metrics or any(m.key.startswith("system/") for m in metrics)):
            try:
                raise sqlite3.OperationalError("database or disk is full")
            except sqlite3.OperationalError as e:
                raise MlflowException(f"(sqlite3.OperationalError) {e}", error_code=TEMPORARILY_UNAVAILABLE) from e
        return real(self, *args, **kwargs)

    monkeypatch.setattr(MlflowClient, "log_batch", log_batch)


def test_a_full_tracking_store_is_said_once_and_training_goes_on(
    disk, synthetic_root, shared, backend, tmp_path, monkeypatch, caplog
):
    from brats_seg.run_dir import RunFolder
    from brats_seg.training.loop import train

    if disk.kind == "injected":
        _database_full(monkeypatch, disk)
    db = disk.folder / "mlruns.db"
    tracking = TrackingConfig(uri=f"sqlite:///{db}", experiment="disk-full", system_metrics=False)
    run_dir = tmp_path / "run"  # the run folder has space: only the store is full
    mlflow_records = _Records()
    logging.getLogger("mlflow").addHandler(mlflow_records)
    try:
        with caplog.at_level(logging.WARNING):
            result = train(
                _cfg(synthetic_root["brats2021"], shared, run_dir, tracking),
                extra_callbacks=[_fill_after_epoch(disk, 1)],
            )
    finally:
        logging.getLogger("mlflow").removeHandler(mlflow_records)

    assert result.epochs_done == 2
    said = [
        r
        for r in caplog.records
        if r.levelno >= logging.WARNING and any(w in r.getMessage() for w in ("MLflow", "mlflow", "disk", "space"))
    ]
    assert len(said) == 1, [r.getMessage() for r in said]
    message = said[0].getMessage()
    assert said[0].name == "brats_seg.tracking.faults"
    assert f"MLflow cannot write {db}: no space left on its disk (" in message and "free there" in message, message
    assert "training goes on" in message and str(run_dir) in message, message
    assert not [r for r in mlflow_records.records if "disk is full" in r.getMessage()]  # no MLflow traceback too

    folder = RunFolder(run_dir)
    state = folder.read_state()
    assert state["epoch"] == 2 and [h["epoch"] for h in state["history"]] == [1, 2]
    assert len(folder.history_path.read_text().splitlines()) == 3  # header and two epochs
    assert folder.checkpoint_file("last").is_file() and folder.checkpoint_file("best").is_file()
    assert json.loads(folder.tracking_path.read_text())["run_id"] == result.run_id
    assert _temporaries(run_dir) == []


def test_a_full_store_met_first_by_mlflows_system_metrics_thread_is_said_once(disk, tmp_path, monkeypatch, caplog):
    """MLflow's monitor writes every few seconds and may meet the full disk before the tracker:
    its traceback and warning stay out of the log, and the tracker's next call says it, once."""
    import threading
    import time

    from brats_seg.tracking.tracker import Tracker

    if disk.kind == "injected":
        _database_full(monkeypatch, disk)
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "0.2")
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLES_BEFORE_LOGGING", "1")
    db = disk.folder / "mlruns.db"
    mlflow_records = _Records()
    logging.getLogger("mlflow").addHandler(mlflow_records)
    try:
        with caplog.at_level(logging.WARNING):
            tracker = Tracker.start(
                TrackingConfig(uri=f"sqlite:///{db}", experiment="disk-full", system_metrics=True),
                tmp_path / "run",
                "run",
                {"model.depth": 2},
                {},
            )
            assert tracker.run_id is not None
            disk.fill()
            deadline = time.monotonic() + 60
            while any(t.name == "SystemMetricsMonitor" for t in threading.enumerate()):  # it stops on its failure
                assert time.monotonic() < deadline, "MLflow's system-metrics thread never met the full disk"
                time.sleep(0.2)
            assert not [r for r in caplog.records if r.levelno >= logging.WARNING]  # nothing said yet
            tracker.log_metrics({"loss": 1.0}, step=1)
            tracker.log_metrics({"loss": 0.9}, step=2)
            tracker.end()
    finally:
        logging.getLogger("mlflow").removeHandler(mlflow_records)
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(said) == 1 and f"MLflow cannot write {db}: no space left" in said[0], said
    assert not [r for r in mlflow_records.records if "disk is full" in r.getMessage()]


def test_a_full_store_only_mlflows_thread_met_is_said_at_the_trackers_next_call(tmp_path, monkeypatch, caplog):
    """The monitor's batch failed and the tracker's own calls would still fit: the fact is not
    lost with MLflow's filtered records; the tracker says it once and stops sending."""
    import threading
    import time

    from mlflow import MlflowClient

    from brats_seg.tracking.tracker import Tracker

    disk = InjectedEnospc(tmp_path / "disk", monkeypatch)
    _database_full(monkeypatch, disk, only_system_metrics=True)
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "0.2")
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLES_BEFORE_LOGGING", "1")
    db = disk.folder / "mlruns.db"
    with caplog.at_level(logging.WARNING):
        tracker = Tracker.start(
            TrackingConfig(uri=f"sqlite:///{db}", experiment="disk-full", system_metrics=True),
            tmp_path / "run",
            "run",
            {},
            {},
        )
        disk.fill()
        deadline = time.monotonic() + 60
        while any(t.name == "SystemMetricsMonitor" for t in threading.enumerate()):
            assert time.monotonic() < deadline, "MLflow's system-metrics thread never met the full disk"
            time.sleep(0.2)
        tracker.log_metrics({"loss": 1.0}, step=1)  # would be written: the tracker stops first
        tracker.end()
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(said) == 1 and f"MLflow cannot write {db}: no space left" in said[0], said
    assert MlflowClient(tracking_uri=f"sqlite:///{db}").get_metric_history(tracker.run_id, "loss") == []


def test_a_full_artifact_store_names_the_artifact_once_and_tracking_stops(disk, tmp_path, monkeypatch, caplog):
    """The best checkpoint does not fit beside the store: one warning names the artifact's file there."""
    from mlflow import MlflowClient

    from brats_seg.tracking.tracker import Tracker

    if disk.kind == "injected":
        real = MlflowClient.log_artifact

        def log_artifact(self, *args, **kwargs):  # as shutil.copy2 fails writing into a full folder
            if disk.full:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return real(self, *args, **kwargs)

        monkeypatch.setattr(MlflowClient, "log_artifact", log_artifact)
    db = disk.folder / "mlruns.db"
    best = tmp_path / "run" / "checkpoints" / "best.keras"
    best.parent.mkdir(parents=True)
    best.write_bytes(os.urandom(5_000_000))  # more than the 4 MB file system holds
    with caplog.at_level(logging.WARNING):
        tracker = Tracker.start(
            TrackingConfig(uri=f"sqlite:///{db}", experiment="disk-full", system_metrics=False),
            tmp_path / "run",
            "run",
            {},
            {},
        )
        if disk.kind == "injected":
            disk.fill()  # the tmpfs has room for small writes, not for the checkpoint
        tracker.log_artifact(best, "checkpoints")
        tracker.log_metrics({"loss": 1.0}, step=1)
        tracker.end()
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(said) == 1, said
    artifact = f"{disk.folder}/mlartifacts/disk-full/{tracker.run_id}/artifacts/checkpoints/best.keras"
    assert said[0].startswith(f"MLflow cannot write {artifact}: no space left on its disk ("), said


def test_the_checkpoint_error_says_where_the_run_resumes_from(tmp_path, monkeypatch):
    """No epoch saved yet, a completed epoch, a signal's mid-epoch position: each is said as it is on disk."""
    import keras

    from brats_seg.training.callbacks import RunCheckpoint

    disk = InjectedEnospc(tmp_path / "disk", monkeypatch)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
    checkpoint = RunCheckpoint(disk.folder / "run")
    checkpoint.set_model(model)

    def failure(save) -> str:
        disk.fill()
        with pytest.raises(DiskFullError) as caught:
            save()
        disk.free()
        return str(caught.value)

    assert "No epoch was saved yet: the same command starts the run again." in failure(
        lambda: checkpoint.on_epoch_end(0, {"val_dice_mean": 0.5})
    )
    checkpoint = RunCheckpoint(disk.folder / "run")  # a new start: the failed one's state is gone with it
    checkpoint.set_model(model)
    checkpoint.on_epoch_end(0, {"val_dice_mean": 0.5})
    said = failure(lambda: checkpoint.on_epoch_end(1, {"val_dice_mean": 0.6}))
    assert "resumes from the last completed epoch, epoch 1" in said and "best.keras" in said
    said = failure(lambda: checkpoint.save_partial(1, 3, {"loss": 1.0}))
    assert "resumes from the last completed epoch, epoch 1" in said and "last.keras" in said
    checkpoint.save_partial(1, 3, {"loss": 1.0})
    said = failure(lambda: checkpoint.save_partial(1, 5, {"loss": 1.0}))
    assert "resumes from step 3 of epoch 2" in said, said
