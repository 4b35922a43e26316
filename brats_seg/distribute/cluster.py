"""The workers of a ``distribute=multi_worker`` run: the :class:`Cluster` type and its checks.

Pure Python (no TensorFlow). A :class:`Cluster` is the worker list (``host:port`` each,
worker 0 the chief) and this process's index in it; :meth:`Cluster.tf_config` is what
``MultiWorkerMirroredStrategy`` reads. Where a cluster comes from (the command line,
``TF_CONFIG``, SLURM) is :mod:`brats_seg.distribute.resolve`.
"""

from __future__ import annotations

import errno
import json
import os
import re
import socket
from collections.abc import Sequence
from dataclasses import dataclass

from brats_seg.choices import check_choice

__all__ = [
    "SOURCES",
    "WORKER_LIST_EXAMPLE",
    "Cluster",
    "ClusterError",
    "ClusterFailure",
    "PortInUseError",
    "check_port_free",
    "check_worker_list",
    "free_local_ports",
    "split_address",
    "unreachable_workers",
]

SOURCES = ("distribute.workers", "TF_CONFIG", "SLURM")
# How each source names the worker list and this worker's index in error messages.
_LABELS = {
    "distribute.workers": ("distribute.workers", "distribute.index"),
    "TF_CONFIG": ("TF_CONFIG's cluster", "TF_CONFIG's task index"),
    "SLURM": ("the SLURM worker list", "SLURM_PROCID"),
}
WORKER_LIST_EXAMPLE = (
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
        check_choice(self.source, SOURCES, "cluster source")
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


def check_worker_list(
    workers: Sequence[str], index: int, label: str = "distribute.workers", index_label: str = "distribute.index"
) -> None:
    """Check a worker list and this worker's index in it.

    Raises:
        ValueError: an empty list, a malformed ``host:port``, an address listed twice, or an
            index outside the list, naming the value.
    """
    if not workers:
        raise ValueError(f"{label} is empty: list every worker as host:port, e.g. {WORKER_LIST_EXAMPLE}.")
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
