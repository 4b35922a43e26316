"""Build the ``tf.distribute`` strategy of ``distribute=none|mirrored|multi_worker``.

Every strategy, a single device included, runs the same distributed step
(``strategy.run``), so training has one code path:

- ``none``: ``OneDeviceStrategy`` on ``/GPU:0`` or ``/CPU:0``;
- ``mirrored``: ``MirroredStrategy`` over ``distribute.devices``, else every logical GPU,
  else every logical CPU (tests split the CPU into logical devices to get 2 replicas);
- ``multi_worker``: ``MultiWorkerMirroredStrategy`` over the cluster of
  :func:`brats_seg.distribute.resolve.resolve_cluster`, with ``TF_CONFIG`` written for it.

TensorFlow is imported inside the functions: :func:`brats_seg.backend.configure` must run
first, and ``multi_worker`` must be built before TensorFlow runs any op (collective ops
and the coordination service are configured when its runtime starts).
"""

from __future__ import annotations

import logging
import os
import re
from typing import TYPE_CHECKING

from brats_seg.choices import check_choice
from brats_seg.config import DistributeConfig, check_distribute_config
from brats_seg.distribute.cluster import Cluster, ClusterFailure, check_port_free, split_address, unreachable_workers
from brats_seg.distribute.resolve import resolve_cluster

if TYPE_CHECKING:
    import tensorflow as tf

__all__ = ["canonical_device", "make_strategy"]

log = logging.getLogger(__name__)

# Coordination-service leader of a cluster whose tasks are all of type "worker" (Cluster.tf_config).
_LEADER = "/job:worker/replica:0/task:0"


def canonical_device(name: str) -> str:
    """``"/gpu:1"``, ``"GPU:1"``, ``"/device:GPU:1"`` -> ``"/device:GPU:1"`` (TF's logical device name).

    Raises:
        ValueError: not a CPU or GPU device name.
    """
    m = re.fullmatch(r"\s*/?(?:job:localhost/replica:0/task:0/)?(?:device:)?(cpu|gpu):([0-9]+)\s*", str(name), re.I)
    if not m:
        raise ValueError(f"distribute.devices entry {name!r}: use device names like /GPU:0 or /CPU:1.")
    return f"/device:{m.group(1).upper()}:{int(m.group(2))}"


def make_strategy(cfg: DistributeConfig, device: str) -> tuple[tf.distribute.Strategy, Cluster | None]:
    """Build the strategy ``cfg.name`` asks for on ``device``.

    Args:
        cfg: the ``distribute`` group.
        device: ``"GPU"`` or ``"CPU"``: the device the resolved backend trains on.

    Returns:
        ``(strategy, cluster)``; ``cluster`` is None unless ``multi_worker``.

    Raises:
        ValueError: a bad ``distribute`` value (named), ``collective=nccl`` on CPU, an unknown
            device in ``distribute.devices``, or a cluster that cannot be resolved.
        ClusterError: this worker's port is taken (PortInUseError).
        ClusterFailure: not every worker joined within ``distribute.timeout_s``.
    """
    check_distribute_config(cfg)
    check_choice(device, ("CPU", "GPU"), "device", hint="(the resolved backend's device)")
    if cfg.collective == "nccl" and device == "CPU":
        raise ValueError(
            "distribute.collective=nccl needs GPUs (NCCL is NVIDIA's GPU collective library), but this run is on "
            "the CPU: use distribute.collective=ring (or auto)."
        )
    if "TF_CONFIG" in os.environ and not os.environ["TF_CONFIG"].strip():
        del os.environ["TF_CONFIG"]  # TF 2.21 parses a blank TF_CONFIG as JSON and fails, even for MirroredStrategy
    if cfg.name != "multi_worker" and os.environ.get("TF_CONFIG"):
        log.warning(
            "TF_CONFIG is set but distribute=%s trains on this machine only; use distribute=multi_worker "
            "to join its cluster",
            cfg.name,
        )
    if cfg.name == "none":
        return _one_device(device), None
    if cfg.name == "mirrored":
        return _mirrored(cfg, device), None
    return _multi_worker(cfg, device)


def _one_device(device: str):
    import tensorflow as tf

    name = "/GPU:0" if device == "GPU" else "/CPU:0"
    strategy = tf.distribute.OneDeviceStrategy(name)
    log.info("distribute=none: OneDeviceStrategy on %s (1 replica)", name)
    return strategy


def _mirrored(cfg: DistributeConfig, device: str):
    import tensorflow as tf

    available = [d.name for d in tf.config.list_logical_devices("GPU") + tf.config.list_logical_devices("CPU")]
    if cfg.devices:
        devices = [canonical_device(d) for d in cfg.devices]
        unknown = [d for d in devices if d not in available]
        if unknown:
            raise ValueError(
                f"distribute.devices lists {unknown}, which TensorFlow does not see here; available: {available}."
            )
        if len(set(devices)) != len(devices):
            raise ValueError(f"distribute.devices={list(cfg.devices)} names a device twice.")
    else:
        kind = "GPU" if device == "GPU" else "CPU"
        devices = [d for d in available if f"/device:{kind}:" in d]
        if not devices:
            raise ValueError(f"distribute=mirrored on {kind} but TensorFlow sees no {kind} device.")
    if len(devices) > 1 and all(":GPU:" in d for d in devices):
        cross_device_ops = tf.distribute.NcclAllReduce()
    else:
        # NcclAllReduce has no CPU kernel (TF 2.21: "No OpKernel was registered to support Op
        # 'NcclAllReduce' ... Registered devices: [CPU]"). ReductionToOneDevice sums on one
        # device and broadcasts back: logical CPUs share host memory, so its copies are cheap,
        # and TF itself falls back to it for non-GPU devices (select_cross_device_ops).
        # HierarchicalCopyAllReduce also runs on 2 logical CPUs in TF 2.21, but is laid out
        # for an 8-GPU DGX-1; TF 2.21's own default here, CollectiveAllReduce over RING, works
        # too (and is what MirroredStrategy uses anyway inside an XLA-compiled step).
        cross_device_ops = tf.distribute.ReductionToOneDevice()
    strategy = tf.distribute.MirroredStrategy(devices, cross_device_ops=cross_device_ops)
    log.info(
        "distribute=mirrored: MirroredStrategy over %s with %s; %d replicas in sync",
        ", ".join(devices),
        type(cross_device_ops).__name__,
        strategy.num_replicas_in_sync,
    )
    if strategy.num_replicas_in_sync == 1 and device == "CPU":
        log.info(
            "distribute=mirrored on one CPU device is one replica: TensorFlow already spreads a step over "
            "all cores (backend.intra_op_threads); use distribute=none, or multi_worker across machines"
        )
    return strategy


def _multi_worker(cfg: DistributeConfig, device: str):
    cluster = resolve_cluster(cfg)  # bad lists and ports fail before TensorFlow loads
    check_port_free(cluster.address)
    import tensorflow as tf

    if os.environ.get("TF_CONFIG") and cluster.source != "TF_CONFIG":
        log.warning("TF_CONFIG is replaced by the cluster from %s", cluster.source)
    os.environ["TF_CONFIG"] = cluster.tf_config()
    _warn_shared_gpus(cluster, device, len(tf.config.list_physical_devices("GPU")))
    _bound_registration(cluster, cfg.timeout_s)
    implementation = {
        "auto": tf.distribute.experimental.CommunicationImplementation.AUTO,
        "ring": tf.distribute.experimental.CommunicationImplementation.RING,  # gRPC; CPU and GPU
        "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL,  # GPUs only
    }[cfg.collective]
    # No per-collective timeout: a worker that exits is noticed at once (UnavailableError), while
    # a timeout would keep a sleeping thread per collective op for its length (hundreds over a
    # run of fast steps, measured) and fail the workers that wait while the chief saves alone.
    options = tf.distribute.experimental.CommunicationOptions(implementation=implementation)
    try:
        strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    except (tf.errors.DeadlineExceededError, tf.errors.UnavailableError) as e:
        detail = (e.message or str(e)).strip().splitlines()[0]
        down = unreachable_workers(cluster)
        raise ClusterFailure(
            f"distribute=multi_worker: not all {cluster.num_workers} workers joined within distribute.timeout_s="
            f"{cfg.timeout_s} s (this is worker {cluster.index}, {cluster.address}; workers from {cluster.source}: "
            f"{', '.join(cluster.workers)}; not answering now: {', '.join(down) or 'none'}). Start every worker "
            "with the same worker list, check that the hosts reach each other on these ports, or raise "
            f"distribute.timeout_s. TensorFlow: {detail}"
        ) from None
    log.info(
        "distribute=multi_worker: MultiWorkerMirroredStrategy, worker %d of %d (%s%s), cluster from %s, "
        "collective %s, timeout %s; %d replicas in sync",
        cluster.index,
        cluster.num_workers,
        cluster.address,
        ", chief" if cluster.is_chief else "",
        cluster.source,
        cfg.collective,
        f"{cfg.timeout_s} s to join" if cfg.timeout_s else "none",
        strategy.num_replicas_in_sync,
    )
    return strategy, cluster


def _warn_shared_gpus(cluster: Cluster, device: str, n_gpus: int) -> None:
    """Several workers on one host each take every GPU they see; say how to split them."""
    host = split_address(cluster.address)[0]
    sharing = sum(split_address(w)[0] == host for w in cluster.workers)
    if device == "GPU" and sharing > 1 and n_gpus > 1:
        log.warning(
            "%d workers run on %s and this one sees %d GPUs: give each its own GPU(s) (srun --gpus-per-task=1 "
            "or CUDA_VISIBLE_DEVICES), or run one worker per host",
            sharing,
            host,
            n_gpus,
        )


def _bound_registration(cluster: Cluster, timeout_s: int) -> None:
    """Make a worker that never starts an error after ``timeout_s`` instead of a hang.

    TF 2.21's MultiWorkerMirroredStrategy configures the coordination service without a
    registration barrier: a worker whose peer never starts blocks in its constructor for
    good (and SIGTERM does not interrupt it). The strategy keeps a coordination service
    configured before it, so this sets one with a registration barrier bounded by
    ``timeout_s``; then the constructor raises DeadlineExceededError. There is no public
    API for this, hence the internal module.
    """
    if not timeout_s:
        return
    try:
        from tensorflow.python.eager import context

        ctx = context.context()
        if ctx.coordination_service is not None:
            log.info("coordination service already configured; worker registration left unbounded by timeout_s")
            return
        ctx.configure_coordination_service(
            service_type="standalone", service_leader=_LEADER, cluster_register_timeout_in_ms=int(timeout_s * 1000)
        )
        ctx.coordination_service.cluster_register_with_barrier = True
    except (ImportError, AttributeError, ValueError) as e:  # internal API moved: keep TF's default
        log.warning(
            "could not bound worker registration by distribute.timeout_s (%s): a worker that never starts "
            "makes the others wait indefinitely",
            e,
        )
