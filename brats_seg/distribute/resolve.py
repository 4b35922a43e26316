"""Where a ``distribute=multi_worker`` run's cluster comes from: the command line, ``TF_CONFIG`` or SLURM.

Pure Python (no TensorFlow): :func:`resolve_cluster` reads, in this order,

1. ``distribute.workers`` + ``distribute.index`` (the command line),
2. the ``TF_CONFIG`` environment variable (``worker`` and at most one ``chief`` task),
3. the SLURM environment of an ``srun`` task (:mod:`brats_seg.distribute.slurm`; CPU and
   GPU nodes alike: nothing here asks for GPUs, unlike TensorFlow's ``SlurmClusterResolver``),

and returns a :class:`~brats_seg.distribute.cluster.Cluster`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

from brats_seg.config import DistributeConfig
from brats_seg.distribute.cluster import WORKER_LIST_EXAMPLE, Cluster
from brats_seg.distribute.slurm import cluster_from_slurm

__all__ = ["cluster_from_tf_config", "planned_replicas", "resolve_cluster"]


def resolve_cluster(cfg: DistributeConfig, environ: Mapping[str, str] = os.environ) -> Cluster:
    """The cluster of a ``distribute=multi_worker`` run: worker list, else TF_CONFIG, else SLURM.

    Args:
        cfg: the ``distribute`` group (``workers``, ``index``, ``port``).
        environ: the environment to read ``TF_CONFIG`` / ``SLURM_*`` from.

    Raises:
        ValueError: none of the three sources is there, or the one used is inconsistent
            (the message names the variable or key and its value).
    """
    if cfg.workers:
        return Cluster(tuple(str(w).strip() for w in cfg.workers), cfg.index, "distribute.workers")
    tf_config = environ.get("TF_CONFIG", "")
    if tf_config.strip():
        return cluster_from_tf_config(tf_config)
    if environ.get("SLURM_JOB_ID") and "SLURM_NTASKS" in environ:
        return cluster_from_slurm(environ, cfg.port)
    raise ValueError(
        "distribute=multi_worker needs to know the workers: pass distribute.workers (host:port each) and "
        f"distribute.index, set TF_CONFIG, or start one task per worker with srun in a SLURM job. E.g. {WORKER_LIST_EXAMPLE}."
    )


def planned_replicas(
    cfg: DistributeConfig, device: str, gpus: int, environ: Mapping[str, str] = os.environ
) -> tuple[int, bool]:
    """``(replicas, chief)``: how many replicas will share the global batch, and whether this
    process is the chief, known before TensorFlow is imported (the run's plan is made for one
    replica's share; :func:`brats_seg.training.loop.train` checks the strategy agrees).

    ``none``: one. ``mirrored``: the devices of ``distribute.devices``, else every visible GPU
    (one CPU device on a CPU). ``multi_worker``: each worker's GPUs (or its CPU) times the workers.

    Raises:
        ValueError: a ``multi_worker`` cluster that cannot be resolved (:func:`resolve_cluster`).
    """
    local = max(gpus, 1) if device == "GPU" else 1
    if cfg.name == "none":
        return 1, True
    if cfg.name == "mirrored":
        return (len(cfg.devices) if cfg.devices else local), True
    cluster = resolve_cluster(cfg, environ)
    return cluster.num_workers * local, cluster.is_chief


def cluster_from_tf_config(text: str) -> Cluster:
    """Parse ``TF_CONFIG``: ``worker`` tasks and at most one ``chief`` (which becomes worker 0).

    Raises:
        ValueError: text that is not JSON, a missing ``cluster``/``task``, a task type other
            than worker/chief, or an index outside its list.
    """
    example = '{"cluster": {"worker": ["node1:12345", "node2:12345"]}, "task": {"type": "worker", "index": 0}}'
    try:
        spec = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(
            f"TF_CONFIG is not valid JSON ({e.msg} at character {e.pos}): {text[:200]!r}; expected e.g. {example}."
        ) from None
    if not isinstance(spec, dict) or not isinstance(spec.get("cluster"), dict) or not spec["cluster"]:
        raise ValueError(f'TF_CONFIG={text[:200]!r} has no "cluster" mapping; expected e.g. {example}.')
    cluster, task = spec["cluster"], spec.get("task")
    other = sorted(set(cluster) - {"chief", "worker"})
    if other:
        raise ValueError(
            f"TF_CONFIG's cluster has task type {other[0]!r}: MultiWorkerMirroredStrategy uses only 'worker' "
            "tasks (and at most one 'chief'); remove it (parameter servers and evaluators are not supported)."
        )
    for kind in ("chief", "worker"):
        entries = cluster.get(kind, [])
        if not isinstance(entries, list) or not all(isinstance(a, str) for a in entries):
            raise ValueError(f'TF_CONFIG\'s cluster {kind!r} must be a list of "host:port" strings, got {entries!r}.')
    chief, worker = cluster.get("chief", []), cluster.get("worker", [])
    if len(chief) > 1:
        raise ValueError(f"TF_CONFIG lists {len(chief)} chiefs {chief}: there is at most one (the rest are workers).")
    if not isinstance(task, dict):
        raise ValueError(
            f'TF_CONFIG={text[:200]!r} has no "task" ({{"type": "worker", "index": i}}) '
            "saying which worker this process is."
        )
    kind, index = task.get("type"), task.get("index", 0)
    if kind not in ("chief", "worker"):
        raise ValueError(f"TF_CONFIG's task type {kind!r}: use 'worker' (or 'chief'); others are not supported.")
    if isinstance(index, bool) or not isinstance(index, int):
        raise ValueError(f"TF_CONFIG's task index {index!r} is not an integer.")
    tasks = chief if kind == "chief" else worker
    if not 0 <= index < len(tasks):
        raise ValueError(
            f"TF_CONFIG's task index={index} but its cluster lists {len(tasks)} {kind} "
            f"task(s) ({'none' if not tasks else f'0..{len(tasks) - 1}'})."
        )
    position = index if kind == "chief" else len(chief) + index
    return Cluster(tuple(chief + worker), position, "TF_CONFIG")
