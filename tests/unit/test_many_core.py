"""Settings for a many-core server (issue 47): the cores a process may use (affinity, physical
cores, the cgroup's quota, sockets, NUMA nodes), threads and preparation workers derived from them,
the validation subset and the cost of a dataset before it is downloaded."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from brats_seg.config import DataConfig, TrainConfig, TrainerConfig
from brats_seg.cpu import cgroup_cpu_quota, cpu_topology, parse_cpu_list, usable_cores
from brats_seg.data.splits import validation_subset
from brats_seg.data.workers import preparation_workers
from tests.unit.test_evaluate import CLI_ENV, ROOT


@pytest.mark.parametrize("text,cpus", [("0", [0]), ("0-3", [0, 1, 2, 3]), ("0-1,8,10-11", [0, 1, 8, 10, 11]), ("", [])])
def test_the_kernels_cpu_lists_are_read(text, cpus):
    assert parse_cpu_list(text) == cpus


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_the_cgroup_cpu_quota_is_read_in_v2_and_v1(tmp_path):
    _write(tmp_path / "v2" / "job" / "cpu.max", "400000 100000\n")
    assert cgroup_cpu_quota(tmp_path / "v2", "0::/job\n") == 4.0
    _write(tmp_path / "v2" / "free" / "cpu.max", "max 100000\n")
    assert cgroup_cpu_quota(tmp_path / "v2", "0::/free\n") is None
    _write(tmp_path / "v1" / "cpu,cpuacct" / "slurm" / "cpu.cfs_quota_us", "150000\n")
    _write(tmp_path / "v1" / "cpu,cpuacct" / "slurm" / "cpu.cfs_period_us", "100000\n")
    assert cgroup_cpu_quota(tmp_path / "v1", "4:memory:/x\n2:cpu,cpuacct:/slurm\n") == 1.5
    _write(tmp_path / "v1" / "cpu,cpuacct" / "none" / "cpu.cfs_quota_us", "-1\n")
    _write(tmp_path / "v1" / "cpu,cpuacct" / "none" / "cpu.cfs_period_us", "100000\n")
    assert cgroup_cpu_quota(tmp_path / "v1", "2:cpu,cpuacct:/none\n") is None


def test_sockets_cores_and_numa_nodes_of_the_processes_cpus(tmp_path):
    allowed = sorted(os.sched_getaffinity(0))
    for i, cpu in enumerate(allowed):  # each CPU its own socket and node: a two-socket server's shape
        _write(tmp_path / "cpu" / f"cpu{cpu}" / "topology" / "physical_package_id", f"{i}\n")
        _write(tmp_path / "cpu" / f"cpu{cpu}" / "topology" / "core_id", "0\n")
        _write(tmp_path / "node" / f"node{i}" / "cpulist", f"{cpu}\n")
    _write(tmp_path / "node" / "node9" / "cpulist", "200-203\n")  # a node of CPUs this process may not use
    topo = cpu_topology(tmp_path / "cpu", tmp_path / "node")
    assert topo["allowed_cpus"] == allowed
    assert topo["sockets"] == len(allowed) and topo["physical_cores"] == len(allowed)
    assert topo["numa_nodes"] == {i: [cpu] for i, cpu in enumerate(allowed)}


def test_hyperthreads_and_the_quota_bound_the_usable_cores():
    assert usable_cores({"physical_cores": 40, "cgroup_quota": None}) == 40
    assert usable_cores({"physical_cores": 40, "cgroup_quota": 4.0}) == 4  # a container's --cpus=4
    assert usable_cores({"physical_cores": 40, "cgroup_quota": 2.5}) == 3
    assert usable_cores({"physical_cores": 0, "cgroup_quota": 0.5}) == 1


@pytest.mark.skipif(not shutil.which("taskset") or len(os.sched_getaffinity(0)) < 2, reason="needs taskset and 2 CPUs")
def test_a_process_pinned_to_one_cpu_takes_one_thread_and_one_preparation_worker():
    code = (
        "from brats_seg.backend import decide_backend; from brats_seg.config import BackendConfig;"
        "from brats_seg.data.workers import preparation_workers; from brats_seg.cpu import usable_cores;"
        "print(usable_cores(), decide_backend(BackendConfig(name='cpu_onednn')).intra_op_threads, preparation_workers('auto'))"
    )
    pinned = subprocess.run(
        ["taskset", "-c", "1", sys.executable, "-c", code], capture_output=True, text=True, env=CLI_ENV, cwd=ROOT
    )
    assert pinned.stdout.split() == ["1", "1", "1"], pinned.stderr[-2000:]
    free = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=CLI_ENV, cwd=ROOT)
    n = str(usable_cores())
    assert free.stdout.split() == [n, n, n], free.stderr[-2000:]


@pytest.mark.parametrize("value,expect", [("auto", None), ("3", 3), (2, 2), ("AUTO", None)])
def test_preparation_workers_take_auto_or_a_count(value, expect):
    assert preparation_workers(value) == (usable_cores() if expect is None else expect)


@pytest.mark.parametrize("value", [0, "0", "x", -1, "1.5"])
def test_a_bad_num_workers_is_refused_naming_the_key(value):
    from brats_seg.checks import check_train_config

    cfg = TrainConfig(data=DataConfig(num_workers=value))
    with pytest.raises(ValueError, match=r"data.num_workers=.*or auto"):
        check_train_config(cfg, training=False)


def test_the_validation_subset_is_fixed_seeded_and_all_when_unset():
    ids = [f"c{i:03d}" for i in range(188)]
    some = validation_subset(ids, 20, seed=0)
    assert len(some) == 20 and some == sorted(some) and set(some) <= set(ids)
    assert validation_subset(list(reversed(ids)), 20, seed=0) == some  # a function of the ids, not their order
    assert validation_subset(ids, 20, seed=1) != some
    assert validation_subset(ids, 0, 0) == ids and validation_subset(ids, 500, 0) == ids
    with pytest.raises(ValueError, match="trainer.val_cases"):
        from brats_seg.checks import check_train_config

        check_train_config(TrainConfig(trainer=TrainerConfig(val_cases=-1)), training=False)


def test_plan_memory_prices_a_dataset_before_it_is_downloaded():
    """plan.cases=1251 with a data.root that does not exist: the schedule's stages each priced, the
    fold's 800 training cases and the 20 validated (trainer.val_cases) of its 200."""
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "plan_memory.py"),
            "experiment=brats2021",
            "data.root=/nonexistent/BraTS2021",
            "plan.cases=1251",
            "data.fold=0",
            "backend=cpu_onednn",
            "backend.precision=fp32",  # any CPU
        ],
        capture_output=True,
        text=True,
        env=CLI_ENV,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    time = proc.stdout.split("\ntime: ", 1)[1]
    assert time.startswith("800 training and 20 validation case(s), validation every 2 epoch(s)"), time[:300]
    for stage in ("32x32x32", "48x48x48", "64x64x64", "96x96x96", "144x144x144", "whole"):
        assert f"  {stage}: step " in time
    assert "for the budget of 24 h 00 min of training" in time
