"""Building the tf.distribute strategy (brats_seg.distribute.strategy).

TensorFlow runs in subprocesses: logical CPU devices and collective ops are fixed when its
runtime starts, so each case needs a fresh process. Each takes a few seconds.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from brats_seg.config import DistributeConfig
from brats_seg.distribute.cluster import PortInUseError, free_local_ports
from brats_seg.distribute.strategy import canonical_device, make_strategy

REPO = Path(__file__).resolve().parents[2]

MIRRORED_SCRIPT = r"""
import json
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
from brats_seg.config import DistributeConfig
from brats_seg.distribute.strategy import make_strategy

out = {}
mirrored, cluster = make_strategy(DistributeConfig(name="mirrored"), "CPU")
out["mirrored"] = [mirrored.num_replicas_in_sync, cluster, type(mirrored).__name__,
                   type(mirrored.extended._cross_device_ops).__name__]

@tf.function
def step():
    def replica():
        ctx = tf.distribute.get_replica_context()
        return ctx.all_reduce("SUM", tf.cast(ctx.replica_id_in_sync_group + 1, tf.float32))
    return mirrored.run(replica)

out["all_reduce"] = [float(t) for t in mirrored.experimental_local_results(step())]
out["reduce"] = float(mirrored.reduce("SUM", mirrored.run(lambda: tf.constant(1.0)), axis=None))
one, _ = make_strategy(DistributeConfig(name="mirrored", devices=["cpu:1"]), "CPU")
out["mirrored_one"] = one.num_replicas_in_sync
none, _ = make_strategy(DistributeConfig(name="none"), "CPU")
out["none"] = [none.num_replicas_in_sync, type(none).__name__]
try:
    make_strategy(DistributeConfig(name="mirrored", devices=["/CPU:0", "/CPU:5"]), "CPU")
except ValueError as e:
    out["unknown_device"] = str(e)
print(json.dumps(out))
"""

MULTI_WORKER_SCRIPT = r"""
import json, sys, time
from brats_seg.config import DistributeConfig
from brats_seg.distribute.cluster import ClusterFailure
from brats_seg.distribute.strategy import make_strategy

workers, index, timeout_s = json.loads(sys.argv[1])
t0 = time.monotonic()
try:
    strategy, cluster = make_strategy(
        DistributeConfig(name="multi_worker", workers=workers, index=index, timeout_s=timeout_s, collective="ring"), "CPU")
except ClusterFailure as e:
    print(json.dumps({"failure": str(e), "after_s": time.monotonic() - t0}))
    sys.exit(0)
import os
import tensorflow as tf
total = strategy.reduce("SUM", strategy.run(lambda: tf.constant(float(index + 1))), axis=None)
print(json.dumps({"replicas": strategy.num_replicas_in_sync, "sum": float(total), "chief": cluster.is_chief,
                  "tf_config": json.loads(os.environ["TF_CONFIG"])}))
"""


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "PYTHONPATH": str(REPO),
        "CUDA_VISIBLE_DEVICES": "",
        "TF_CONFIG": "",
    }


def _start(script: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        cwd=REPO,
        env=_env(),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _result(proc: subprocess.Popen, timeout_s: float = 120) -> dict:
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"subprocess hung for {timeout_s} s: {err[-3000:]}")
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def test_mirrored_two_logical_cpus_and_none():
    out = _result(_start(MIRRORED_SCRIPT))
    assert out["mirrored"] == [2, None, "MirroredStrategy", "ReductionToOneDevice"]
    assert out["all_reduce"] == [3.0, 3.0]  # replica ids 0, 1 -> 1 + 2 on each replica
    assert out["reduce"] == 2.0
    assert out["mirrored_one"] == 1
    assert out["none"] == [1, "OneDeviceStrategy"]
    assert "/device:CPU:5" in out["unknown_device"] and "available" in out["unknown_device"]


def test_nccl_refused_on_cpu():
    for name in ("multi_worker", "mirrored", "none"):
        with pytest.raises(ValueError, match="distribute.collective=nccl needs GPUs.*collective=ring"):
            make_strategy(DistributeConfig(name=name, collective="nccl"), "CPU")


def test_bad_values_refused_before_tensorflow():
    with pytest.raises(ValueError, match="distribute='horovod'"):
        make_strategy(DistributeConfig(name="horovod"), "CPU")
    with pytest.raises(ValueError, match="device='TPU'"):
        make_strategy(DistributeConfig(), "TPU")


def test_port_in_use_refused_before_tensorflow():
    with socket.socket() as held:
        held.bind(("", 0))
        held.listen()
        port = held.getsockname()[1]
        cfg = DistributeConfig(name="multi_worker", workers=[f"localhost:{port}", "localhost:1"], index=0)
        with pytest.raises(PortInUseError, match=f"port {port} on localhost is in use"):
            make_strategy(cfg, "CPU")


@pytest.mark.parametrize(
    "name, canonical",
    [
        ("/GPU:1", "/device:GPU:1"),
        ("cpu:0", "/device:CPU:0"),
        ("/device:CPU:2", "/device:CPU:2"),
        ("/gpu:10", "/device:GPU:10"),
    ],
)
def test_canonical_device(name, canonical):
    assert canonical_device(name) == canonical


def test_canonical_device_rejects():
    with pytest.raises(ValueError, match="'TPU:0'"):
        canonical_device("TPU:0")


def test_multi_worker_two_processes():
    workers = [f"localhost:{p}" for p in free_local_ports(2)]
    procs = [_start(MULTI_WORKER_SCRIPT, json.dumps([workers, i, 60])) for i in range(2)]
    results = [_result(p) for p in procs]
    for i, out in enumerate(results):
        assert out["replicas"] == 2 and out["sum"] == 3.0 and out["chief"] == (i == 0)
        assert out["tf_config"] == {"cluster": {"worker": workers}, "task": {"type": "worker", "index": i}}


def test_multi_worker_missing_worker_fails_after_timeout():
    """TF alone would wait forever for a worker that never starts; timeout_s bounds it."""
    workers = [f"localhost:{p}" for p in free_local_ports(2)]
    out = _result(_start(MULTI_WORKER_SCRIPT, json.dumps([workers, 0, 3])), timeout_s=90)
    assert "not all 2 workers joined within distribute.timeout_s=3 s" in out["failure"]
    assert f"not answering now: {workers[1]})" in out["failure"]
    assert 2.5 < out["after_s"] < 60
