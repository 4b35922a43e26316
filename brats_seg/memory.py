"""The machine's memory as this process sees it: RAM available, the memory cgroup's limit and
room, and the kernel's out-of-memory kill counters.

A SLURM job or a container is held to its memory cgroup's limit whatever the machine has,
and ``psutil`` sees only the machine: :func:`available_memory_bytes` is the smaller of the
two, what ``lms.limit``'s fractions are of on CPU. The OOM kill counters (the cgroup's and
``/proc/vmstat``'s) and the boot id let the next start tell why a run died
(:mod:`brats_seg.oom`). Reads ``/proc`` and ``/sys/fs/cgroup`` (v1 and v2); where
they are absent (not Linux), the machine's figures stand. Standard library and psutil only.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["available_memory_bytes", "boot_id", "cgroup_memory", "cgroup_state", "memory_facts", "system_oom_kills"]

_UNLIMITED = 2**62  # cgroup v1 writes "no limit" as 2**63 - 4096 (rounded to pages)


# ---------------------------------------------------------------------------------------
# What the kernel says: memory cgroup, OOM kill counters, boot id
# ---------------------------------------------------------------------------------------


def _read(path: str | Path) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def _int(text: str | None) -> int | None:
    try:
        return int(text.strip()) if text is not None else None
    except ValueError:
        return None


def _field(text: str | None, name: str) -> int | None:
    """``name value`` lines (``memory.oom_control``, ``memory.events``, ``/proc/vmstat``)."""
    for line in (text or "").splitlines():
        key, _, value = line.partition(" ")
        if key == name:
            return _int(value)
    return None


def _mounts(mountinfo: str) -> dict[str, tuple[str, str]]:
    """``{"v1": (root, mount point), "v2": (root, mount point)}`` of the memory controller."""
    found: dict[str, tuple[str, str]] = {}
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3:
            continue
        if tail[0] == "cgroup" and "memory" in tail[2].split(","):
            found.setdefault("v1", (fields[3], fields[4]))
        elif tail[0] == "cgroup2":
            found.setdefault("v2", (fields[3], fields[4]))
    return found


def _cgroup_dir(mount: tuple[str, str], path: str) -> Path:
    root, point = mount
    if root != "/" and (path == root or path.startswith(root + "/")):  # a container's namespaced view
        path = path[len(root) :]
    return Path(point) / path.lstrip("/")


def cgroup_memory(pid: int | str = "self") -> dict | None:
    """The memory cgroup of process ``pid``: ``{"version", "path", "limit_bytes", "usage_bytes",
    "oom_kill"}`` (``limit_bytes`` None when unlimited, the smallest of its ancestors' limits
    otherwise), or None where there is none to read."""
    own, mounts = _read(f"/proc/{pid}/cgroup"), _mounts(_read("/proc/self/mountinfo") or "")
    if own is None:
        return None
    v1 = next(
        (
            line.split(":", 2)[2]
            for line in own.splitlines()
            if len(line.split(":", 2)) == 3 and "memory" in line.split(":", 2)[1].split(",")
        ),
        None,
    )
    if v1 is not None and "v1" in mounts:
        return cgroup_state(str(_cgroup_dir(mounts["v1"], v1)), 1)
    v2 = next((line.split(":", 2)[2] for line in own.splitlines() if line.startswith("0::")), None)
    if v2 is not None and "v2" in mounts:
        folder = _cgroup_dir(mounts["v2"], v2)
        if (folder / "memory.current").exists() or (folder / "memory.events").exists():
            return cgroup_state(str(folder), 2)
    return None


def cgroup_state(path: str, version: int) -> dict | None:
    """A memory cgroup's limit, usage (its working set: less the inactive file cache) and OOM kill
    count now, read from its folder; None if it is gone."""
    folder = Path(path)
    if not folder.is_dir():
        return None
    if version == 1:
        limit = _int(_read(folder / "memory.limit_in_bytes"))
        hierarchical = _field(_read(folder / "memory.stat"), "hierarchical_memory_limit")
        limits = [v for v in (limit, hierarchical) if v is not None and v < _UNLIMITED]
        return {
            "version": 1,
            "path": path,
            "limit_bytes": min(limits) if limits else None,
            "usage_bytes": _working_set(
                _int(_read(folder / "memory.usage_in_bytes")),
                _field(_read(folder / "memory.stat"), "total_inactive_file"),
            ),
            "oom_kill": _field(_read(folder / "memory.oom_control"), "oom_kill"),
        }
    limits = []
    for level in (folder, *folder.parents):
        value = (_read(level / "memory.max") or "").strip()
        if value.isdigit():
            limits.append(int(value))
        if not (level / "memory.max").exists() and level != folder:
            break  # above the delegated part of the tree
    return {
        "version": 2,
        "path": path,
        "limit_bytes": min(limits) if limits else None,
        "usage_bytes": _working_set(
            _int(_read(folder / "memory.current")), _field(_read(folder / "memory.stat"), "inactive_file")
        ),
        "oom_kill": _field(_read(folder / "memory.events"), "oom_kill"),
    }


def _working_set(usage: int | None, inactive_file: int | None) -> int | None:
    """A cgroup's usage less the file cache it would drop first (what ``docker stats`` shows)."""
    return None if usage is None else max(usage - (inactive_file or 0), 0)


def memory_facts() -> dict:
    """This process's memory situation now (JSON-ready): the system's available and total RAM,
    the memory cgroup, the kernel's OOM kill count and the boot id."""
    import psutil

    vm = psutil.virtual_memory()
    return {
        "available_bytes": int(vm.available),
        "total_bytes": int(vm.total),
        "cgroup": cgroup_memory(),
        "vmstat_oom_kill": system_oom_kills(),
        "boot_id": boot_id(),
    }


def available_memory_bytes() -> int:
    """Bytes this process can still take: the RAM available now, or less where its memory
    cgroup's limit leaves less room."""
    import psutil

    system = int(psutil.virtual_memory().available)
    cgroup = cgroup_memory() or {}
    limit, usage = cgroup.get("limit_bytes"), cgroup.get("usage_bytes")
    if limit is not None and usage is not None:
        return max(min(system, int(limit - usage)), 0)
    return system


def boot_id() -> str | None:
    """This boot's id (``/proc/sys/kernel/random/boot_id``): a dead run's record from another boot died in a restart."""
    return (_read("/proc/sys/kernel/random/boot_id") or "").strip() or None


def system_oom_kills() -> int | None:
    """Every OOM kill on the machine since boot, cgroups' included (``/proc/vmstat``'s ``oom_kill``)."""
    return _field(_read("/proc/vmstat"), "oom_kill")
