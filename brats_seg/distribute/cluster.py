"""Who the workers of a ``distribute=multi_worker`` run are, and which one this process is.

Pure Python (no TensorFlow): :func:`resolve_cluster` reads, in this order,

1. ``distribute.workers`` + ``distribute.index`` (the command line),
2. the ``TF_CONFIG`` environment variable (``worker`` and at most one ``chief`` task),
3. the SLURM environment of an ``srun`` task (CPU and GPU nodes alike: nothing here asks
   for GPUs, unlike TensorFlow's ``SlurmClusterResolver``),

and returns a :class:`Cluster`, whose :meth:`Cluster.tf_config` is what
``MultiWorkerMirroredStrategy`` reads. Every address is ``host:port``; worker 0 is the chief.
"""

from __future__ import annotations

import errno
import json
import os
import re
import socket
from dataclasses import dataclass
from typing import Mapping, Sequence

from brats_seg.config import DistributeConfig

__all__ = [
    "Cluster",
    "ClusterError",
    "ClusterFailure",
    "PortInUseError",
    "SOURCES",
    "resolve_cluster",
    "cluster_from_tf_config",
    "check_worker_list",
    "check_port_free",
    "free_local_ports",
    "unreachable_workers",
    "split_address",
]

SOURCES = ("distribute.workers", "TF_CONFIG", "SLURM")
# How each source names the worker list and this worker's index in error messages.
_LABELS = {
    "distribute.workers": ("distribute.workers", "distribute.index"),
    "TF_CONFIG": ("TF_CONFIG's cluster", "TF_CONFIG's task index"),
    "SLURM": ("the SLURM worker list", "SLURM_PROCID"),
}
_EXAMPLE = (
    "python train.py distribute=multi_worker distribute.workers=[node1:12345,node2:12345] distribute.index=0 "
    "(and distribute.index=1 on node2)"
)


class ClusterError(RuntimeError):
    """The cluster cannot be formed from this machine; the message says what to change."""


class PortInUseError(ClusterError, OSError):
    """This worker's port is taken by another process."""


class ClusterFailure(RuntimeError):
    """A worker never joined or was lost mid-run: not a config error, the same command resumes.

    Deliberately not a :class:`ClusterError`: entry points exit with a status of their own
    for it (``brats_seg.cli``), so job scripts can tell it from bad input.
    """


@dataclass(frozen=True)
class Cluster:
    """The workers of a multi-worker run and this process's place among them.

    Attributes:
        workers: ``host:port`` of every worker, chief first.
        index: this worker's position in ``workers`` (0 = chief: writes the run folder).
        source: where the list came from: ``distribute.workers``, ``TF_CONFIG`` or ``SLURM``.
    """

    workers: tuple[str, ...]
    index: int
    source: str

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"Cluster source {self.source!r}: use one of {', '.join(SOURCES)}.")
        object.__setattr__(self, "workers", tuple(self.workers))
        check_worker_list(self.workers, self.index, *_LABELS[self.source])

    @property
    def is_chief(self) -> bool:
        """Worker 0 is the chief: it alone writes the run folder and tracking."""
        return self.index == 0

    @property
    def num_workers(self) -> int:
        return len(self.workers)

    @property
    def address(self) -> str:
        """This worker's ``host:port`` (its gRPC server listens on the port)."""
        return self.workers[self.index]

    def tf_config(self) -> str:
        """The ``TF_CONFIG`` JSON for this worker (all tasks of type ``worker``; worker 0 is chief)."""
        return json.dumps({"cluster": {"worker": list(self.workers)}, "task": {"type": "worker", "index": self.index}})


# ---------------------------------------------------------------------------------------
# Addresses
# ---------------------------------------------------------------------------------------

def split_address(address: str, label: str = "address") -> tuple[str, int]:
    """``"node1:12345" -> ("node1", 12345)``; IPv6 hosts in brackets: ``"[::1]:12345"``.

    Raises:
        ValueError: no port, a non-integer port, a port outside 1..65535 or an empty host,
            naming ``label`` and the value.
    """
    hint = "expected host:port, e.g. node1:12345"
    if not isinstance(address, str) or ":" not in address:
        raise ValueError(f"{label}={address!r} has no port: {hint}.")
    host, _, port_text = address.strip().rpartition(":")
    if not host or host in ("[]",):
        raise ValueError(f"{label}={address!r} has no host: {hint}.")
    if host.count(":") and not (host.startswith("[") and host.endswith("]")):
        raise ValueError(f"{label}={address!r}: write an IPv6 host in brackets, e.g. [::1]:12345.")
    if not re.fullmatch(r"[0-9]+", port_text):
        raise ValueError(f"{label}={address!r}: port {port_text!r} is not an integer; {hint}.")
    port = int(port_text)
    if not 1 <= port <= 65535:
        raise ValueError(f"{label}={address!r}: port {port} is outside 1..65535.")
    return host, port


def check_worker_list(workers: Sequence[str], index: int, label: str = "distribute.workers",
                      index_label: str = "distribute.index") -> None:
    """Check a worker list and this worker's index in it.

    Raises:
        ValueError: an empty list, a malformed ``host:port``, an address listed twice, or an
            index outside the list, naming the value.
    """
    if not workers:
        raise ValueError(f"{label} is empty: list every worker as host:port, e.g. {_EXAMPLE}.")
    seen: dict[str, int] = {}
    for i, address in enumerate(workers):
        split_address(address, f"{label}[{i}]")
        key = address.strip().lower()
        if key in seen:
            raise ValueError(
                f"{label} lists {address} twice (positions {seen[key]} and {i}): every worker needs its own "
                "host:port (several workers on one host need different ports)."
            )
        seen[key] = i
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(workers):
        raise ValueError(
            f"{index_label}={index!r} but {label} lists {len(workers)} workers (0..{len(workers) - 1}): "
            "give each worker its own position in the list."
        )


def check_port_free(address: str) -> None:
    """Make sure this worker's port can be listened on (on all interfaces) before TF tries.

    ``SO_REUSEADDR`` is set on POSIX on purpose: Linux then still refuses the bind while any
    socket listens on (or is bound without it to) the port, but not for the ``TIME_WAIT``
    connections a run that just ended leaves behind for up to a minute; gRPC, which TF's
    server uses, sets it too, so such a port would work and must not be reported busy.

    Raises:
        PortInUseError: another process holds the port.
        ClusterError: the port cannot be bound for another reason (e.g. privileged port).
        ValueError: ``address`` is not ``host:port``.
    """
    host, port = split_address(address, "this worker's address")
    family = socket.AF_INET6 if host.startswith("[") else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        if os.name == "posix":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise PortInUseError(
                    f"port {port} on {host} is in use (another job or a previous run still alive?): pick another "
                    "distribute.port / worker list or stop that process."
                ) from e
            raise ClusterError(
                f"cannot listen on port {port} on {host} ({e.strerror or e}): use a free port >= 1024 in "
                "distribute.workers / distribute.port."
            ) from e


def unreachable_workers(cluster: Cluster, timeout_s: float = 2.0) -> list[str]:
    """The other workers whose ``host:port`` does not accept a TCP connection within ``timeout_s``.

    Used after a collective op failed, to name the worker that went away (its gRPC server
    no longer listens). Checked concurrently, so the call takes about ``timeout_s`` at most.
    """
    from concurrent.futures import ThreadPoolExecutor

    def down(address: str) -> bool:
        host, port = split_address(address)
        try:
            with socket.create_connection((host.strip("[]"), port), timeout=timeout_s):
                return False
        except OSError:
            return True

    others = [w for i, w in enumerate(cluster.workers) if i != cluster.index]
    if not others:
        return []
    with ThreadPoolExecutor(max_workers=min(32, len(others))) as pool:
        return [w for w, is_down in zip(others, pool.map(down, others)) if is_down]


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
        from brats_seg.distribute.slurm import cluster_from_slurm

        return cluster_from_slurm(environ, cfg.port)
    raise ValueError(
        "distribute=multi_worker needs to know the workers: pass distribute.workers (host:port each) and "
        f"distribute.index, set TF_CONFIG, or start one task per worker with srun in a SLURM job. E.g. {_EXAMPLE}."
    )


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
        raise ValueError(f"TF_CONFIG is not valid JSON ({e.msg} at character {e.pos}): {text[:200]!r}; "
                         f"expected e.g. {example}.") from None
    if not isinstance(spec, dict) or not isinstance(spec.get("cluster"), dict) or not spec["cluster"]:
        raise ValueError(f"TF_CONFIG={text[:200]!r} has no \"cluster\" mapping; expected e.g. {example}.")
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
            raise ValueError(f"TF_CONFIG's cluster {kind!r} must be a list of \"host:port\" strings, got {entries!r}.")
    chief, worker = cluster.get("chief", []), cluster.get("worker", [])
    if len(chief) > 1:
        raise ValueError(f"TF_CONFIG lists {len(chief)} chiefs {chief}: there is at most one (the rest are workers).")
    if not isinstance(task, dict):
        raise ValueError(f"TF_CONFIG={text[:200]!r} has no \"task\" ({{\"type\": \"worker\", \"index\": i}}) "
                         "saying which worker this process is.")
    kind, index = task.get("type"), task.get("index", 0)
    if kind not in ("chief", "worker"):
        raise ValueError(f"TF_CONFIG's task type {kind!r}: use 'worker' (or 'chief'); others are not supported.")
    if isinstance(index, bool) or not isinstance(index, int):
        raise ValueError(f"TF_CONFIG's task index {index!r} is not an integer.")
    tasks = chief if kind == "chief" else worker
    if not 0 <= index < len(tasks):
        raise ValueError(f"TF_CONFIG's task index={index} but its cluster lists {len(tasks)} {kind} "
                         f"task(s) ({'none' if not tasks else f'0..{len(tasks) - 1}'}).")
    position = index if kind == "chief" else len(chief) + index
    return Cluster(tuple(chief + worker), position, "TF_CONFIG")


def free_local_ports(n: int) -> list[int]:
    """``n`` TCP ports free on 127.0.0.1 now (for a cluster of local workers: tests, scaling runs)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for sk in socks:
            sk.bind(("127.0.0.1", 0))
        return [sk.getsockname()[1] for sk in socks]
    finally:
        for sk in socks:
            sk.close()
