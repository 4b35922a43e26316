"""Distributed training on this machine: ``distribute=mirrored`` over 2 logical CPUs with LMS,
and ``distribute=multi_worker`` as two processes on 127.0.0.1 (preempted, a worker killed,
resumed), each against a single-process run of the same global batch and seed.

Tolerances: the replicas' gradients are summed in another order than one device sums its
batch, and a process with 1 thread orders a convolution's sums otherwise than one with 2
(float32). Metrics agree to 1e-4 relative. Weights after Adam do less well: for a gradient
near zero, Adam's step is up to the learning rate (3e-3) whatever the gradient's size, so a
rounding difference can move a weight by a fraction of that; measured here after 9 steps:
up to 1.05e-4 absolute. Asserted: 1e-3 absolute (a third of one step's largest move),
while training on other cases than the single process moves weights by ~1e-2.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from brats_seg.distribute.cluster import free_local_ports

REPO = Path(__file__).resolve().parents[2]
EXIT_PREEMPTED, EXIT_CLUSTER_FAILURE = 75, 3
RTOL, ATOL = 1e-4, 1e-5  # metrics
WEIGHT_ATOL = 1e-3  # weights after Adam (module doc)

MIRRORED = textwrap.dedent("""
    import json, sys
    from brats_seg.backend import configure
    from brats_seg.config import (BackendConfig, DataConfig, DistributeConfig, LMSConfig, ModelConfig,
                                  ResolutionConfig, TrackingConfig, TrainConfig, TrainerConfig)
    tmp = sys.argv[1]
    from brats_seg.data.synthetic import write_synthetic_dataset
    root = tmp + "/data"
    write_synthetic_dataset(root, "brats2021", n_cases=8, seed=0)
    backend = configure(BackendConfig(name="cpu_onednn"))
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    from brats_seg.training.loop import train
    out = {}
    for name in ("none", "mirrored"):
        cfg = TrainConfig(
            data=DataConfig(name="brats2021", layout="brats2021", root=root, cache_dir=tmp + "/cache", num_workers=1),
            resolution=ResolutionConfig(name="tiny", spacing_mm=4.0, shape=[48, 56, 40]),
            model=ModelConfig(depth=2, base_filters=4),
            trainer=TrainerConfig(epochs=2, batch_size=2, seed=3, learning_rate=3e-3, warmup_epochs=1),
            lms=LMSConfig(name="recompute"), tracking=TrackingConfig(name="none"),
            distribute=DistributeConfig(name=name, devices=["/CPU:0", "/CPU:1"] if name == "mirrored" else []),
            run_dir=f"{tmp}/{name}")
        train(cfg, backend)
        out[name] = json.load(open(f"{tmp}/{name}/state.json"))["history"]
    print("HISTORY " + json.dumps(out))
""")


@pytest.mark.slow
def test_mirrored_on_two_logical_cpus_with_recompute_matches_one_device(tmp_path):
    script = tmp_path / "mirrored.py"
    script.write_text(MIRRORED)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=900, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-4000:]
    history = json.loads(proc.stdout.split("HISTORY ", 1)[1])
    one, two = history["none"], history["mirrored"]
    assert [h["epoch"] for h in two] == [1, 2]
    for a, b in zip(one, two):
        for key in ("loss", "dice_mean", "prob_wt", "val_dice_mean"):
            assert b[key] == pytest.approx(a[key], rel=RTOL, abs=ATOL), (key, a[key], b[key])
    assert all(h["lms_recomputed_flops"] > 0 for h in two)  # the blocks ran through the recompute wrapper
    assert "inside a tf.function" not in proc.stderr  # no eager strategy.run


def _train_cmd(tmp_path, run_dir, uri, *extra):
    return [sys.executable, str(REPO / "train.py"), "resolution=tiny", "data=synthetic",
            f"data.root={tmp_path / 'synthetic'}", "data.synthetic_cases=10", f"data.cache_dir={tmp_path / 'cache'}",
            "model.depth=2", "model.base_filters=4", "trainer.epochs=3", "trainer.batch_size=2", "trainer.seed=4",
            "backend=cpu_onednn", "backend.intra_op_threads=1", f"tracking.uri={uri}",
            "tracking.system_metrics=false", f"run_dir={run_dir}", *extra]


class Worker:
    """One ``train.py`` process whose output goes to a file (no pipe to fill and block it)."""

    count = 0

    def __init__(self, cmd, cwd):
        Worker.count += 1
        self.log = Path(cwd) / f"worker-{Worker.count}.log"
        self._file = open(self.log, "w")
        self.proc = subprocess.Popen(cmd, cwd=cwd, stdout=self._file, stderr=subprocess.STDOUT, text=True,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def wait_for(self, text: str, timeout: float = 600) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if text in self.output():
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise AssertionError(f"{text!r} not seen:\n{self.output()[-4000:]}")

    def finish(self, timeout: float) -> int:
        try:
            self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self._file.close()
        return self.proc.returncode

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def _weights(run_dir):
    import keras

    import brats_seg.model.unet3d  # noqa: F401  registers the custom layers
    import brats_seg.training.losses  # noqa: F401

    model = keras.models.load_model(run_dir / "checkpoints" / "last.keras", compile=True)
    return model.get_weights() + [v.numpy() for v in model.optimizer.variables]


@pytest.mark.slow
def test_two_workers_preempted_killed_and_resumed_end_as_one_process(tmp_path):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    single = subprocess.run(_train_cmd(tmp_path, tmp_path / "single", uri, "backend.intra_op_threads=2"), cwd=tmp_path,
                            capture_output=True, text=True, timeout=900)  # also writes the data and the cache
    assert single.returncode == 0, single.stderr[-4000:]

    ports = free_local_ports(2)
    workers = f"distribute.workers=[127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}]"
    run_dir = tmp_path / "mw"

    def start(other_run_dir=None):
        dirs = [run_dir, other_run_dir or run_dir]
        return [Worker(_train_cmd(tmp_path, dirs[i], uri, "distribute=multi_worker", workers, f"distribute.index={i}"),
                       tmp_path) for i in range(2)]

    # 1. SIGTERM to both (what SLURM does at preemption): both save-and-stop, promptly
    ws = start()
    ws[0].wait_for("epoch 2/3: training from step 1")
    for w in ws:
        w.proc.send_signal(signal.SIGTERM)
    t0 = time.monotonic()
    codes = [w.finish(timeout=300) for w in ws]
    assert codes == [EXIT_PREEMPTED] * 2, [w.output()[-3000:] for w in ws]
    assert time.monotonic() - t0 < 120  # prompt: a step, the save, and exit
    assert "Re-run the same command to resume" in ws[0].output()
    state = json.loads((run_dir / "state.json").read_text())
    assert state["epoch"] == 2 or (state["epoch"] == 1 and state["step"] >= 1)  # stopped in epoch 2, saved
    assert "saved best.keras" in ws[0].output() and "saved best.keras" not in ws[1].output()  # the chief writes

    # 2. resumed; then worker 1 dies: worker 0 stops within the bound, naming it
    ws = start()
    ws[0].wait_for("epoch 3/3: training from step 1")
    ws[1].proc.kill()
    t0 = time.monotonic()
    code = ws[0].finish(timeout=300)
    waited = time.monotonic() - t0
    ws[1].finish(timeout=30)
    assert code == EXIT_CLUSTER_FAILURE, ws[0].output()[-4000:]
    assert waited < 120
    assert f"127.0.0.1:{ports[1]}" in ws[0].output().split("distributed training stopped", 1)[1]
    assert json.loads((run_dir / "state.json").read_text())["epoch"] == 2

    # 3. the same command on both resumes from the last saved epoch and ends as one process does;
    # worker 1 is given a run_dir of its own, as on a machine without the chief's file system:
    # it takes the chief's weights and position, and writes nothing there
    elsewhere = tmp_path / "not_shared"
    ws = start(other_run_dir=elsewhere)
    codes = [w.finish(timeout=600) for w in ws]
    assert codes == [0, 0], [w.output()[-3000:] for w in ws]
    assert not elsewhere.exists() or not any(elsewhere.iterdir())
    for a, b in zip(_weights(tmp_path / "single"), _weights(run_dir)):
        np.testing.assert_allclose(b, a, rtol=0, atol=WEIGHT_ATOL)
    hist_single = json.loads((tmp_path / "single" / "state.json").read_text())["history"]
    hist_mw = json.loads((run_dir / "state.json").read_text())["history"]
    assert [h["epoch"] for h in hist_mw] == [1, 2, 3]
    for a, b in zip(hist_single, hist_mw):
        assert b["val_dice_mean"] == pytest.approx(a["val_dice_mean"], rel=1e-3, abs=1e-4)
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs(client.get_experiment_by_name("brats-seg").experiment_id,
                              filter_string=f"tags.run_dir = '{run_dir}'")
    assert len(runs) == 1 and runs[0].info.status == "FINISHED"  # one run for the job, the chief's
    assert runs[0].data.tags["distribute"] == "multi_worker" and runs[0].data.tags["replicas"] == "2"
    assert [m.step for m in client.get_metric_history(runs[0].info.run_id, "val_dice_mean")] == [1, 2, 3]


@pytest.mark.slow
def test_sweep_through_submitit_local_gives_one_mlflow_run_per_job(tmp_path):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlruns.db'}"
    cmd = [sys.executable, str(REPO / "train.py"), "-m", "hydra/launcher=submitit_local", "resolution=tiny", "data=synthetic",
           f"data.root={tmp_path / 'synthetic'}", "data.synthetic_cases=5", f"data.cache_dir={tmp_path / 'cache'}",
           "model.depth=2", "model.base_filters=4,6", "trainer.seed=1,2", "trainer.epochs=1",
           "trainer.steps_per_epoch=1", "trainer.batch_size=1", "backend=cpu_onednn", "backend.intra_op_threads=1",
           f"tracking.uri={uri}", "tracking.system_metrics=false", f"hydra.sweep.dir={tmp_path / 'sweep'}",
           f"hydra.launcher.submitit_folder={tmp_path / 'submitit'}"]
    made = subprocess.run([sys.executable, str(REPO / "scripts" / "make_synthetic.py"), f"out={tmp_path / 'synthetic'}",
                           "n_cases=5"], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert made.returncode == 0, made.stderr[-2000:]  # written once, before the jobs run side by side
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-4000:]
    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs(client.get_experiment_by_name("brats-seg").experiment_id)
    assert len(runs) == 4
    assert len({r.info.run_name for r in runs}) == 4  # distinct names
    assert {r.data.tags["sweep_overrides"] for r in runs} == {
        f"model.base_filters={f},trainer.seed={s}" for f in (4, 6) for s in (1, 2)}
    assert {r.data.params["model.base_filters"] for r in runs} == {"4", "6"}
    assert all(r.info.status == "FINISHED" for r in runs)
    assert len({r.data.tags["run_dir"] for r in runs}) == 4  # a run folder per job
