"""The SLURM environment of an ``srun`` task as a :class:`~brats_seg.distribute.cluster.Cluster`.

Slurm's compressed host lists (``node[01-03,07],gpu-5``) and task counts (``2(x3),1``) are
parsed here, for CPU and GPU nodes alike (TensorFlow's ``SlurmClusterResolver`` asks for
GPUs and fails on CPU-only nodes).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping

from brats_seg.distribute.cluster import Cluster

__all__ = ["cluster_from_slurm", "expand_hostlist", "parse_tasks_per_node"]

_MAX_HOSTS = 100_000  # a hostlist expanding to more names than this is a typo, not a cluster


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
        raise ValueError(
            "SLURM_JOB_ID is set but SLURM_JOB_NODELIST/SLURM_NODELIST is not: "
            "start the workers with srun inside the job."
        )
    if tpn_text is None:
        raise ValueError("SLURM_JOB_ID is set but SLURM_TASKS_PER_NODE is not: start the workers with srun.")
    hosts = expand_hostlist(nodelist, list_name)
    per_node = parse_tasks_per_node(tpn_text, tpn_name)
    ntasks = _int_var(ntasks_name, ntasks_text)
    procid = _int_var("SLURM_PROCID", environ.get("SLURM_PROCID"))
    if len(per_node) != len(hosts):
        raise ValueError(
            f"{list_name}={nodelist!r} expands to {len(hosts)} nodes but {tpn_name}={tpn_text!r} "
            f"gives task counts for {len(per_node)}."
        )
    if sum(per_node) != ntasks:
        raise ValueError(f"{tpn_name}={tpn_text!r} adds up to {sum(per_node)} tasks but {ntasks_name}={ntasks}.")
    if procid >= ntasks:
        raise ValueError(f"SLURM_PROCID={procid} but {ntasks_name}={ntasks} (ranks 0..{ntasks - 1}).")
    if base_port + max(per_node) - 1 > 65535:
        raise ValueError(
            f"distribute.port={base_port} with {max(per_node)} tasks on a node runs past port 65535: "
            "use a lower distribute.port."
        )
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
