"""Who the workers are: worker list, TF_CONFIG, SLURM (brats_seg.distribute.cluster). No TensorFlow."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from brats_seg.config import DistributeConfig, check_distribute_config
from brats_seg.distribute.cluster import (
    Cluster,
    ClusterError,
    PortInUseError,
    check_port_free,
    split_address,
    unreachable_workers,
)
from brats_seg.distribute.resolve import cluster_from_tf_config, resolve_cluster
from brats_seg.distribute.slurm import expand_hostlist, parse_tasks_per_node

REPO = Path(__file__).resolve().parents[2]


def mw(**kw) -> DistributeConfig:
    return DistributeConfig(name="multi_worker", **kw)


def slurm_env(**over) -> dict[str, str]:
    """2 nodes x 2 tasks, this process = rank 3 (second task of node b02)."""
    env = {
        "SLURM_JOB_ID": "42",
        "SLURM_NTASKS": "4",
        "SLURM_JOB_NODELIST": "b[01-02]",
        "SLURM_TASKS_PER_NODE": "2(x2)",
        "SLURM_PROCID": "3",
        "SLURM_LOCALID": "1",
        "SLURMD_NODENAME": "b02",
    }
    env.update(over)
    return {k: v for k, v in env.items() if v is not None}


def test_no_tensorflow_import():
    code = "import sys, brats_seg.distribute.cluster, brats_seg.distribute.strategy; print('tensorflow' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "False"


# --- Slurm syntax ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, hosts",
    [
        ("node1", ["node1"]),
        ("node[1-3]", ["node1", "node2", "node3"]),
        ("node[01-03,07]", ["node01", "node02", "node03", "node07"]),
        ("n[8-11]", ["n8", "n9", "n10", "n11"]),
        ("n[098-101]", ["n098", "n099", "n100", "n101"]),
        ("gpu-5,cpu-a", ["gpu-5", "cpu-a"]),
        ("rack[1-2]-n[3-4]", ["rack1-n3", "rack1-n4", "rack2-n3", "rack2-n4"]),
        (
            "node[01-03,07],gpu-5,rack[1-2]-n[3-4]",
            ["node01", "node02", "node03", "node07", "gpu-5", "rack1-n3", "rack1-n4", "rack2-n3", "rack2-n4"],
        ),
        ("a[1],b[2-2]x", ["a1", "b2x"]),
        ("[1-2]z", ["1z", "2z"]),
    ],
)
def test_expand_hostlist(text, hosts):
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize(
    "text, words",
    [
        ("node[1-3", "never closed"),
        ("node1-3]", "without '['"),
        ("node[1-[2]]", "nested"),
        ("node[3-1]", "backwards"),
        ("node[a-b]", "bad range"),
        ("node[]", "bad range"),
        ("a,,b", "empty host"),
        ("a,", "empty host"),
        ("", "empty"),
    ],
)
def test_expand_hostlist_rejects(text, words):
    with pytest.raises(ValueError, match="SLURM_JOB_NODELIST") as e:
        expand_hostlist(text)
    assert words in str(e.value) and repr(text) in str(e.value)


@pytest.mark.parametrize(
    "text, counts",
    [
        ("1", [1]),
        ("2(x3),1", [2, 2, 2, 1]),
        ("4(x2)", [4, 4]),
        ("1,2,3", [1, 2, 3]),
        ("1(x1)", [1]),
    ],
)
def test_parse_tasks_per_node(text, counts):
    assert parse_tasks_per_node(text) == counts


@pytest.mark.parametrize("text", ["", "x", "2(3)", "2(x)", "0", "2(x0)", "2,,1", "-1"])
def test_parse_tasks_per_node_rejects(text):
    with pytest.raises(ValueError, match="SLURM_TASKS_PER_NODE") as e:
        parse_tasks_per_node(text)
    assert repr(text) in str(e.value)


# --- addresses and worker lists -----------------------------------------------------------


def test_split_address():
    assert split_address("node1:12345") == ("node1", 12345)
    assert split_address("[::1]:80") == ("[::1]", 80)


@pytest.mark.parametrize(
    "address, words",
    [
        ("node1", "has no port"),
        ("node1:abc", "'abc' is not an integer"),
        ("node1:", "is not an integer"),
        ("node1:0", "port 0 is outside 1..65535"),
        ("node1:70000", "port 70000 is outside 1..65535"),
        (":123", "has no host"),
        ("::1:80", "brackets"),
    ],
)
def test_bad_addresses_name_the_value(address, words):
    with pytest.raises(ValueError) as e:
        resolve_cluster(mw(workers=["ok:1", address], index=0), {})
    assert f"distribute.workers[1]={address!r}" in str(e.value) and words in str(e.value)


def test_duplicate_address():
    with pytest.raises(ValueError, match=r"lists n1:5 twice \(positions 0 and 2\)"):
        resolve_cluster(mw(workers=["n1:5", "n2:5", "n1:5"]), {})


@pytest.mark.parametrize("index", [2, 3, -1])
def test_index_outside_list(index):
    with pytest.raises(ValueError) as e:
        Cluster(("n1:5", "n2:5"), index, "distribute.workers")
    assert f"distribute.index={index} but distribute.workers lists 2 workers (0..1)" in str(e.value)


def test_index_message_from_config():
    with pytest.raises(ValueError, match=r"distribute.index=3 but distribute.workers lists 2 workers \(0..1\)"):
        resolve_cluster(mw(workers=["n1:5", "n2:5"], index=3), {})


def test_empty_list_and_bad_source():
    with pytest.raises(ValueError, match="distribute.workers is empty"):
        Cluster((), 0, "distribute.workers")
    with pytest.raises(ValueError, match="'elsewhere'"):
        Cluster(("n1:5",), 0, "elsewhere")


def test_config_list_wins_over_env():
    env = {**slurm_env(), "TF_CONFIG": json.dumps({"cluster": {"worker": ["x:1"]}, "task": {"type": "worker"}})}
    c = resolve_cluster(mw(workers=["n1:5", "n2:6"], index=1), env)
    assert (c.workers, c.index, c.source, c.address, c.is_chief, c.num_workers) == (
        ("n1:5", "n2:6"),
        1,
        "distribute.workers",
        "n2:6",
        False,
        2,
    )


def test_tf_config_round_trip():
    c = Cluster(("n1:5", "n2:6", "n3:7"), 2, "SLURM")
    spec = json.loads(c.tf_config())
    assert spec == {"cluster": {"worker": ["n1:5", "n2:6", "n3:7"]}, "task": {"type": "worker", "index": 2}}
    back = cluster_from_tf_config(c.tf_config())
    assert (back.workers, back.index, back.source) == (c.workers, c.index, "TF_CONFIG")


def test_nothing_to_go_on():
    with pytest.raises(
        ValueError, match="distribute.workers.*TF_CONFIG.*srun.*python train.py distribute=multi_worker"
    ):
        resolve_cluster(mw(), {"SLURM_JOB_ID": "1"})  # a job id without task counts is not enough


# --- TF_CONFIG ----------------------------------------------------------------------------


def test_tf_config_workers():
    env = {"TF_CONFIG": json.dumps({"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 1}})}
    c = resolve_cluster(mw(), env)
    assert (c.workers, c.index, c.source, c.is_chief) == (("a:1", "b:2"), 1, "TF_CONFIG", False)


def test_tf_config_wins_over_slurm():
    env = {**slurm_env(), "TF_CONFIG": json.dumps({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker"}})}
    assert resolve_cluster(mw(), env).source == "TF_CONFIG"


@pytest.mark.parametrize(
    "task, index",
    [({"type": "chief", "index": 0}, 0), ({"type": "worker", "index": 0}, 1), ({"type": "worker", "index": 1}, 2)],
)
def test_tf_config_chief_first(task, index):
    text = json.dumps({"cluster": {"worker": ["w0:2", "w1:3"], "chief": ["c:1"]}, "task": task})
    c = cluster_from_tf_config(text)
    assert c.workers == ("c:1", "w0:2", "w1:3") and c.index == index and c.is_chief == (index == 0)


@pytest.mark.parametrize(
    "spec, words",
    [
        ({"cluster": {"worker": ["a:1"], "ps": ["p:1"]}, "task": {"type": "worker"}}, "task type 'ps'"),
        ({"cluster": {"worker": ["a:1"], "evaluator": ["e:1"]}, "task": {"type": "worker"}}, "task type 'evaluator'"),
        ({"cluster": {"worker": ["a:1"]}, "task": {"type": "ps", "index": 0}}, "task type 'ps'"),
        ({"cluster": {"worker": ["a:1"]}}, 'no "task"'),
        ({"task": {"type": "worker"}}, 'no "cluster"'),
        (
            {"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": 2}},
            "task index=2 but its cluster lists 2 worker task(s) (0..1)",
        ),
        ({"cluster": {"worker": ["a:1"]}, "task": {"type": "chief", "index": 0}}, "lists 0 chief task(s) (none)"),
        ({"cluster": {"worker": "a:1"}, "task": {"type": "worker"}}, "list of \"host:port\" strings, got 'a:1'"),
        ({"cluster": {"chief": ["c:1", "d:2"]}, "task": {"type": "chief"}}, "lists 2 chiefs"),
        (
            {"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": "0"}},
            "task index '0' is not an integer",
        ),
        ({"cluster": {"worker": ["a:1", "a:1"]}, "task": {"type": "worker"}}, "TF_CONFIG's cluster lists a:1 twice"),
        ({"cluster": {"worker": ["a"]}, "task": {"type": "worker"}}, "TF_CONFIG's cluster[0]='a' has no port"),
    ],
)
def test_tf_config_rejects(spec, words):
    with pytest.raises(ValueError) as e:
        resolve_cluster(mw(), {"TF_CONFIG": json.dumps(spec)})
    assert words in str(e.value)


def test_tf_config_not_json():
    with pytest.raises(ValueError, match=r"TF_CONFIG is not valid JSON .*\{cluster: 1\}"):
        resolve_cluster(mw(), {"TF_CONFIG": "{cluster: 1}"})


# --- SLURM --------------------------------------------------------------------------------


def test_slurm_two_nodes_two_tasks():
    c = resolve_cluster(mw(port=23000), slurm_env())
    assert c.workers == ("b01:23000", "b01:23001", "b02:23000", "b02:23001")
    assert (c.index, c.address, c.source, c.is_chief) == (3, "b02:23001", "SLURM", False)
    chief = resolve_cluster(mw(port=23000), slurm_env(SLURM_PROCID="0", SLURM_LOCALID="0", SLURMD_NODENAME="b01"))
    assert chief.is_chief and chief.address == "b01:23000"


def test_slurm_uneven_tasks_and_step_variables():
    env = slurm_env(
        SLURM_JOB_NODELIST="c[1-3]",
        SLURM_TASKS_PER_NODE="2(x2),1",
        SLURM_NTASKS="5",
        SLURM_PROCID="4",
        SLURM_LOCALID="0",
        SLURMD_NODENAME="c3",
    )
    assert resolve_cluster(mw(port=100), env).workers == ("c1:100", "c1:101", "c2:100", "c2:101", "c3:100")
    # srun over part of the allocation: the step's variables describe it
    step = {
        **env,
        "SLURM_STEP_NODELIST": "c[2-3]",
        "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
        "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_PROCID": "1",
        "SLURM_LOCALID": "0",
        "SLURMD_NODENAME": "c3",
    }
    c = resolve_cluster(mw(port=100), step)
    assert (c.workers, c.index) == (("c2:100", "c3:100"), 1)


def test_slurm_nodelist_fallback():
    env = slurm_env(SLURM_JOB_NODELIST=None, SLURM_NODELIST="b[01-02]")
    assert resolve_cluster(mw(), env).num_workers == 4


@pytest.mark.parametrize(
    "over, words",
    [
        ({"SLURM_NTASKS": "5"}, "SLURM_TASKS_PER_NODE='2(x2)' adds up to 4 tasks but SLURM_NTASKS=5"),
        ({"SLURM_PROCID": "4"}, "SLURM_PROCID=4 but SLURM_NTASKS=4 (ranks 0..3)"),
        (
            {"SLURM_TASKS_PER_NODE": "2(x3)", "SLURM_NTASKS": "6"},
            "SLURM_JOB_NODELIST='b[01-02]' expands to 2 nodes but SLURM_TASKS_PER_NODE='2(x3)' gives task counts for 3",
        ),
        ({"SLURM_PROCID": None}, "SLURM_PROCID is not set"),
        ({"SLURM_PROCID": "x"}, "SLURM_PROCID='x' is not a non-negative integer"),
        ({"SLURM_NTASKS": "four"}, "SLURM_NTASKS='four'"),
        ({"SLURM_JOB_NODELIST": None}, "SLURM_JOB_NODELIST/SLURM_NODELIST is not"),
        ({"SLURM_TASKS_PER_NODE": None}, "SLURM_TASKS_PER_NODE is not"),
        ({"SLURM_LOCALID": "0"}, "srun --distribution=block"),  # rank 3 is the 2nd task of b02
        ({"SLURMD_NODENAME": "b01"}, "rank 3 is task 1 on b02"),
        ({"SLURM_JOB_NODELIST": "b[01-02"}, "SLURM_JOB_NODELIST='b[01-02'"),
    ],
)
def test_slurm_rejects(over, words):
    with pytest.raises(ValueError) as e:
        resolve_cluster(mw(), slurm_env(**over))
    assert words in str(e.value)


def test_slurm_port_range():
    with pytest.raises(ValueError, match="distribute.port=65535 with 2 tasks on a node"):
        resolve_cluster(mw(port=65535), slurm_env())


def test_slurm_needs_ntasks():
    env = slurm_env(SLURM_NTASKS=None)  # an salloc shell, not an srun task
    with pytest.raises(ValueError, match="distribute=multi_worker needs to know the workers"):
        resolve_cluster(mw(), env)


# --- config values ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw, words",
    [
        ({"name": "horovod"}, "distribute='horovod'"),
        ({"collective": "mpi"}, "distribute.collective='mpi'"),
        ({"lr_scaling": "sqrt"}, "distribute.lr_scaling='sqrt'"),
        ({"port": 0}, "distribute.port=0"),
        ({"port": 65536}, "distribute.port=65536"),
        ({"timeout_s": -1}, "distribute.timeout_s=-1"),
        ({"index": -1}, "distribute.index=-1"),
        ({"name": "multi_worker", "devices": ["/GPU:0"]}, "distribute.devices=['/GPU:0'] only applies"),
    ],
)
def test_check_distribute_config(kw, words):
    with pytest.raises(ValueError) as e:
        check_distribute_config(DistributeConfig(**kw))
    assert words in str(e.value)


def test_check_distribute_config_defaults_pass():
    for name in ("none", "mirrored", "multi_worker"):
        check_distribute_config(DistributeConfig(name=name))
    check_distribute_config(
        DistributeConfig(name="mirrored", devices=["/CPU:0"], collective="ring", lr_scaling="linear", timeout_s=0)
    )


# --- ports --------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def test_port_free_passes():
    check_port_free(f"localhost:{_free_port()}")


@pytest.mark.parametrize("listen", [False, True])
def test_port_in_use(listen):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        if listen:
            held.listen()
        port = held.getsockname()[1]
        with pytest.raises(PortInUseError) as e:
            check_port_free(f"node7:{port}")
    message = str(e.value)
    assert f"port {port} on node7 is in use" in message and "distribute.port" in message
    assert isinstance(e.value, OSError) and isinstance(e.value, ClusterError)


def test_port_after_previous_run_is_free():
    """A run that just ended leaves TIME_WAIT connections on its port: that port is usable."""
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = server.accept()
        accepted.close()  # the server side closes first: TIME_WAIT on (127.0.0.1, port)
        client.close()
    check_port_free(f"localhost:{port}")


def test_unreachable_workers():
    with socket.socket() as alive:
        alive.bind(("127.0.0.1", 0))
        alive.listen()
        up = f"127.0.0.1:{alive.getsockname()[1]}"
        down = f"127.0.0.1:{_free_port()}"
        me = f"127.0.0.1:{_free_port()}"
        assert unreachable_workers(Cluster((me, up, down), 0, "distribute.workers"), timeout_s=1.0) == [down]


# --- configs ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["distribute=none"], {"name": "none"}),
        (
            ["distribute=mirrored", "distribute.devices=[/CPU:0,/CPU:1]"],
            {"name": "mirrored", "devices": ["/CPU:0", "/CPU:1"]},
        ),
        (
            ["distribute=multi_worker", "distribute.workers=[n1:5,n2:5]", "distribute.index=1"],
            {"name": "multi_worker", "workers": ["n1:5", "n2:5"], "index": 1, "port": 12345, "timeout_s": 90},
        ),
    ],
)
def test_distribute_configs_compose(overrides, expected):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from brats_seg.config import TrainConfig
    from brats_seg.script_configs import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        cfg = OmegaConf.to_object(compose(config_name="train", overrides=overrides))
    assert isinstance(cfg, TrainConfig)
    check_distribute_config(cfg.distribute)
    for key, value in expected.items():
        assert getattr(cfg.distribute, key) == value


@pytest.mark.parametrize(
    "launcher, timeout_min, target",
    [("slurm", 1440, "SlurmLauncher"), ("local", 1440, "LocalLauncher"), ("submitit_slurm", 60, "SlurmLauncher")],
)
def test_launcher_configs_extend_the_plugin(launcher, timeout_min, target):
    from hydra import compose, initialize_config_dir

    from brats_seg.script_configs import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=[f"hydra/launcher={launcher}"], return_hydra_config=True)
    assert cfg.hydra.launcher.timeout_min == timeout_min  # the plugin's own option is still reachable
    assert cfg.hydra.launcher._target_.endswith(target)


def test_cluster_errors_are_user_errors(capsys):
    from brats_seg.cli import user_errors

    with pytest.raises(SystemExit) as e, user_errors():
        raise PortInUseError("port 5 on n1 is in use (...)")
    assert e.value.code == 2 and "error: port 5 on n1 is in use" in capsys.readouterr().err
