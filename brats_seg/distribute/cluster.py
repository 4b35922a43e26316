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
import itertools
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
    "cluster_from_slurm",
    "check_worker_list",
    "check_port_free",
    "unreachable_workers",
    "expand_hostlist",
    "parse_tasks_per_node",
    "split_address",
]

SOURCES = ("distribute.workers", "TF_CONFIG", "SLURM")
# How each source names the worker list and this worker's index in error messages.
_LABELS = {
    "distribute.workers": ("distribute.workers", "distribute.index"),
    "TF_CONFIG": ("TF_CONFIG's cluster", "TF_CONFIG's task index"),
    "SLURM": ("the SLURM worker list", "SLURM_PROCID"),
}
_MAX_HOSTS = 100_000  # a hostlist expanding to more names than this is a typo, not a cluster
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


# ---------------------------------------------------------------------------------------
# Slurm syntax
# ---------------------------------------------------------------------------------------

def _split_top_level(text: str, label: str) -> list[str]:
    """Split at commas outside brackets: ``"a[1,2],b" -> ["a[1,2]", "b"]``."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            if depth:
                raise ValueError(f"{label}={text!r}: nested '[' at character {i}.")
            depth = 1
        elif ch == "]":
            if not depth:
                raise ValueError(f"{label}={text!r}: ']' without '[' at character {i}.")
            depth = 0
        elif ch == "," and not depth:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"{label}={text!r}: '[' is never closed.")
    items.append(text[start:])
    if any(not item.strip() for item in items):
        raise ValueError(f"{label}={text!r}: empty host name (two commas in a row, or a trailing comma).")
    return [item.strip() for item in items]


def _expand_range_list(body: str, text: str, label: str) -> list[str]:
    """``"01-03,07" -> ["01", "02", "03", "07"]``: zero padding follows the range's start."""
    out: list[str] = []
    for part in body.split(","):
        m = re.fullmatch(r"\s*([0-9]+)(?:-([0-9]+))?\s*", part)
        if not m:
            raise ValueError(f"{label}={text!r}: bad range {part!r} in [{body}] (expected n or lo-hi, e.g. 01-04).")
        lo_text, hi_text = m.group(1), m.group(2)
        lo, hi = int(lo_text), int(hi_text if hi_text is not None else lo_text)
        if hi < lo:
            raise ValueError(f"{label}={text!r}: range {part.strip()!r} runs backwards.")
        if hi - lo >= _MAX_HOSTS:
            raise ValueError(f"{label}={text!r}: range {part.strip()!r} has more than {_MAX_HOSTS} hosts.")
        width = len(lo_text)
        out.extend(str(n).zfill(width) for n in range(lo, hi + 1))
    return out


def expand_hostlist(text: str, label: str = "SLURM_JOB_NODELIST") -> list[str]:
    """Expand Slurm's compressed hostlist, in Slurm's order.

    ``"node[01-03,07],gpu-5,rack[1-2]-n[3-4]"`` ->
    ``node01 node02 node03 node07 gpu-5 rack1-n3 rack1-n4 rack2-n3 rack2-n4``
    (several bracket groups in one name: the leftmost varies slowest).

    Raises:
        ValueError: unbalanced or nested brackets, an empty name, a bad or backwards range,
            naming ``label`` and the text.
    """
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{label}={text!r} is empty: expected host names like node[01-04].")
    hosts: list[str] = []
    for item in _split_top_level(text.strip(), label):
        pieces = re.split(r"\[([^\]]*)\]", item)  # literal, group, literal, group, ..., literal
        choices = [[p] if i % 2 == 0 else _expand_range_list(p, text, label) for i, p in enumerate(pieces)]
        hosts.extend("".join(combo) for combo in itertools.product(*choices))
        if len(hosts) > _MAX_HOSTS:
            raise ValueError(f"{label}={text!r} expands to more than {_MAX_HOSTS} hosts.")
    return hosts


def parse_tasks_per_node(text: str, label: str = "SLURM_TASKS_PER_NODE") -> list[int]:
    """Expand Slurm's tasks-per-node list: ``"2(x3),1" -> [2, 2, 2, 1]`` (one entry per node).

    Raises:
        ValueError: an entry that is not ``n`` or ``n(xk)`` with n, k >= 1, naming the text.
    """
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"{label}={text!r} is empty: expected counts like 2(x3),1.")
    counts: list[int] = []
    for part in text.strip().split(","):
        m = re.fullmatch(r"\s*([0-9]+)(?:\(x([0-9]+)\))?\s*", part)
        if not m or int(m.group(1)) < 1 or (m.group(2) is not None and int(m.group(2)) < 1):
            raise ValueError(f"{label}={text!r}: bad entry {part!r} (expected n or n(xk), e.g. 2(x3),1).")
        counts.extend([int(m.group(1))] * int(m.group(2) or 1))
    return counts


# ---------------------------------------------------------------------------------------
# Sources
# ---------------------------------------------------------------------------------------

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


def _first(environ: Mapping[str, str], *names: str) -> tuple[str, str | None]:
    """The first of ``names`` set in ``environ``: ``(name, value)``; ``(names[0], None)`` if none."""
    for name in names:
        if environ.get(name, "").strip():
            return name, environ[name].strip()
    return names[0], None


def _int_var(name: str, value: str | None) -> int:
    if value is None:
        raise ValueError(f"{name} is not set: start one process per worker with srun inside the SLURM job.")
    if not re.fullmatch(r"\s*[0-9]+\s*", value):
        raise ValueError(f"{name}={value!r} is not a non-negative integer.")
    return int(value)


def cluster_from_slurm(environ: Mapping[str, str], base_port: int) -> Cluster:
    """One worker per SLURM task: node by node, the k-th task of a node on ``base_port + k``.

    Step variables (``SLURM_STEP_*``, set by srun) win over the job's, so an ``srun`` over
    part of the allocation describes itself. Tasks must be laid out in blocks (Slurm's
    default), so that the global rank ``SLURM_PROCID`` follows the node order.

    Raises:
        ValueError: a missing variable, counts that do not add up, a rank outside the task
            count, or a rank that does not match the block layout.
    """
    list_name, nodelist = _first(environ, "SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
    tpn_name, tpn_text = _first(environ, "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
    ntasks_name, ntasks_text = _first(environ, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")
    if nodelist is None:
        raise ValueError("SLURM_JOB_ID is set but SLURM_JOB_NODELIST/SLURM_NODELIST is not: "
                         "start the workers with srun inside the job.")
    if tpn_text is None:
        raise ValueError("SLURM_JOB_ID is set but SLURM_TASKS_PER_NODE is not: start the workers with srun.")
    hosts = expand_hostlist(nodelist, list_name)
    per_node = parse_tasks_per_node(tpn_text, tpn_name)
    ntasks = _int_var(ntasks_name, ntasks_text)
    procid = _int_var("SLURM_PROCID", environ.get("SLURM_PROCID"))
    if len(per_node) != len(hosts):
        raise ValueError(f"{list_name}={nodelist!r} expands to {len(hosts)} nodes but {tpn_name}={tpn_text!r} "
                         f"gives task counts for {len(per_node)}.")
    if sum(per_node) != ntasks:
        raise ValueError(f"{tpn_name}={tpn_text!r} adds up to {sum(per_node)} tasks but {ntasks_name}={ntasks}.")
    if procid >= ntasks:
        raise ValueError(f"SLURM_PROCID={procid} but {ntasks_name}={ntasks} (ranks 0..{ntasks - 1}).")
    if base_port + max(per_node) - 1 > 65535:
        raise ValueError(f"distribute.port={base_port} with {max(per_node)} tasks on a node runs past port 65535: "
                         "use a lower distribute.port.")
    workers, where = [], []
    for host, count in zip(hosts, per_node):
        workers += [f"{host}:{base_port + k}" for k in range(count)]
        where += [(host, k) for k in range(count)]
    host, local = where[procid]
    localid = environ.get("SLURM_LOCALID")
    nodename = environ.get("SLURMD_NODENAME")
    if (localid is not None and _int_var("SLURM_LOCALID", localid) != local) or (nodename and nodename != host):
        raise ValueError(
            f"SLURM_PROCID={procid} (SLURM_LOCALID={localid}, SLURMD_NODENAME={nodename}) does not match a block "
            f"task layout, where rank {procid} is task {local} on {host}: launch with srun --distribution=block "
            "(Slurm's default), or list the workers in distribute.workers."
        )
    return Cluster(tuple(workers), procid, "SLURM")


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
