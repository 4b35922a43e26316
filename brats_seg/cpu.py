"""What the host CPU can do, read at run time (no TensorFlow import).

The machines this project runs on differ in instruction sets (an Intel Sapphire Rapids
with AVX-512 and AMX-BF16, an AMD EPYC with AVX2 only), and oneDNN picks different
convolution implementations on them, with different memory and precision support:

* ``avx512`` (AVX-512 F/BW/VL/DQ, oneDNN's ``avx512_core``): direct (brgemm/jit) kernels
  for every pass of a channels-last 3D convolution.
* ``avx2``: the forward pass copies its input into a padded buffer, and backward-by-weights
  is the gemm (im2col) implementation with a transposed copy of each sample's input, in
  memory oneDNN allocates itself. The planner's CPU presets differ by this.
* native bfloat16 (AVX512-BF16 or AMX-BF16): without it oneDNN refuses bf16 and
  TensorFlow falls back to Eigen kernels (slow, and an im2col buffer of voxels x 27 x
  channels for a 3D convolution's input gradient). With AMX (Sapphire Rapids) oneDNN's
  bf16 convolutions are AMX tile kernels; with AVX512-BF16 alone (AMD EPYC Zen 4) they are
  ``avx512_core_bf16`` kernels: :func:`cpu_kind` tells the two apart.

oneDNN can be capped below what the CPU has with ``ONEDNN_MAX_CPU_ISA`` (``DNNL_MAX_CPU_ISA``),
e.g. ``AVX2`` or ``AVX512_CORE_BF16``; its kernels are then those of the capped set, so
:func:`cpu_kind`, :func:`cpu_isa` and :func:`has_native_bf16` report the capped CPU (what the
memory presets and the precision check must go by).
"""

from __future__ import annotations

import functools
import os
import platform
from pathlib import Path

__all__ = [
    "KINDS",
    "cpu_flags",
    "cpu_id",
    "cpu_isa",
    "cpu_kind",
    "cpu_model_name",
    "device_has_native_bf16",
    "has_native_bf16",
    "onednn_isa_cap",
]


_AVX512_CORE = frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq"})
_BF16 = frozenset({"avx512_bf16", "amx_bf16"})

# What oneDNN runs, ordered: "other" < "avx2" < "avx512" (no bf16) < "avx512_bf16" < "avx512_amx".
_LEVELS = ("other", "avx2", "avx512", "avx512_bf16", "avx512_amx")
KINDS = ("avx512_amx", "avx512", "avx2", "other")  # cpu_kind's values
# ONEDNN_MAX_CPU_ISA value -> the highest level it allows (oneDNN's names; unknown = no cap).
_CAPS = {
    "SSE41": "other",
    "AVX": "other",
    "AVX2": "avx2",
    "AVX2_VNNI": "avx2",
    "AVX2_VNNI_2": "avx2",
    "AVX512_CORE": "avx512",
    "AVX512_CORE_VNNI": "avx512",
    "AVX512_CORE_BF16": "avx512_bf16",
    "AVX512_CORE_FP16": "avx512_bf16",
    "AVX10_1_512": "avx512_bf16",
    "AVX512_CORE_AMX": "avx512_amx",
    "AVX10_1_512_AMX": "avx512_amx",
    "AVX512_CORE_AMX_FP16": "avx512_amx",
    "AVX10_1_512_AMX_FP16": "avx512_amx",
    "DEFAULT": "avx512_amx",
    "ALL": "avx512_amx",
}


def _cpuinfo_field(text: str, field: str) -> str:
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == field:
            return value.strip()
    return ""


@functools.lru_cache(maxsize=1)
def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:  # not Linux: no flags known
        return ""


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The CPU's feature flags (``/proc/cpuinfo`` on Linux; empty elsewhere)."""
    return frozenset(_cpuinfo_field(_cpuinfo() if cpuinfo is None else cpuinfo, "flags").split())


def onednn_isa_cap(environ=None) -> str | None:
    """The ``ONEDNN_MAX_CPU_ISA`` (or ``DNNL_MAX_CPU_ISA``) value in effect, upper-cased, or None."""
    environ = os.environ if environ is None else environ
    value = environ.get("ONEDNN_MAX_CPU_ISA") or environ.get("DNNL_MAX_CPU_ISA")
    return value.strip().upper() if value else None


def _level(cpuinfo: str | None, environ=None) -> str:
    """What oneDNN runs on this CPU: its flags' level, lowered to the cap if one is set."""
    flags = cpu_flags(cpuinfo)
    if flags >= _AVX512_CORE:
        level = "avx512_amx" if "amx_bf16" in flags else "avx512_bf16" if "avx512_bf16" in flags else "avx512"
    else:
        level = "avx2" if "avx2" in flags else "other"
    cap = _CAPS.get(onednn_isa_cap(environ) or "", "avx512_amx")
    return min(level, cap, key=_LEVELS.index)


def cpu_kind(cpuinfo: str | None = None, environ=None) -> str:
    """The family of kernels oneDNN runs here, which the memory presets are per:
    ``avx512_amx`` (AVX-512 with AMX, e.g. Sapphire Rapids), ``avx512`` (AVX-512 without
    AMX, e.g. AMD Zen 4, with or without AVX512-BF16), ``avx2`` or ``other``."""
    level = _level(cpuinfo, environ)
    return "avx512" if level == "avx512_bf16" else level


def cpu_isa(cpuinfo: str | None = None, environ=None) -> str:
    """``avx512`` (oneDNN's avx512_core, with or without AMX), ``avx2`` or ``other``."""
    return "avx512" if cpu_kind(cpuinfo, environ).startswith("avx512") else cpu_kind(cpuinfo, environ)


def has_native_bf16(cpuinfo: str | None = None, environ=None) -> bool:
    """True if oneDNN computes bfloat16 natively here (AVX512-BF16 or AMX-BF16, not capped below)."""
    return _level(cpuinfo, environ) in ("avx512_bf16", "avx512_amx")


def device_has_native_bf16(device: str) -> bool:
    """Whether ``device`` (``CPU`` or ``GPU``) computes bfloat16 natively: every GPU the project
    supports; a CPU as :func:`has_native_bf16` says (looked up at the call, so a test can stand in
    for the CPU by replacing it)."""
    return device == "GPU" or has_native_bf16()


def cpu_model_name(cpuinfo: str | None = None) -> str:
    """The CPU's model name, for logs and benchmark records."""
    return _cpuinfo_field(_cpuinfo() if cpuinfo is None else cpuinfo, "model name") or platform.processor() or "unknown"


def cpu_id(cpuinfo: str | None = None) -> str:
    """The CPU's make, ``<vendor> family <f> model <m>`` (e.g. ``AuthenticAMD family 26 model 2``,
    an AMD Zen 5): what a step-time calibration is per. Two CPUs of one kind (Zen 4 and Zen 5
    are both ``avx512``) run the same kernels at different speeds; their model names are often
    both just "AMD EPYC"."""
    text = _cpuinfo() if cpuinfo is None else cpuinfo
    vendor = _cpuinfo_field(text, "vendor_id") or platform.machine() or "unknown"
    family, model = _cpuinfo_field(text, "cpu family"), _cpuinfo_field(text, "model")
    return f"{vendor} family {family or '?'} model {model or '?'}"


# ---------------------------------------------------------------------------------------
# How many cores this process may use: affinity, physical cores, the cgroup's quota, sockets, NUMA
# ---------------------------------------------------------------------------------------


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def parse_cpu_list(text: str) -> list[int]:
    """``0-3,8,10-11`` (the kernel's CPU list format) as CPU numbers."""
    cpus: list[int] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        lo, _, hi = part.partition("-")
        cpus += range(int(lo), int(hi or lo) + 1)
    return cpus


def cgroup_cpu_quota(root: Path = Path("/sys/fs/cgroup"), proc_cgroup: str | None = None) -> float | None:
    """The CPUs' worth of time this process's cgroup may use (``cpu.max`` in v2, ``cpu.cfs_quota_us /
    cpu.cfs_period_us`` in v1; a container's ``--cpus``, a SLURM job's ``--cpus-per-task`` under cgroup
    CPU limits); None without a limit."""
    lines = (proc_cgroup if proc_cgroup is not None else _read(Path("/proc/self/cgroup")) or "").splitlines()
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        path = path.lstrip("/")
        if hierarchy == "0" and controllers == "":  # v2
            for folder in (root / path, root):
                text = _read(folder / "cpu.max")
                if text:
                    quota, _, period = text.partition(" ")
                    return None if quota == "max" else int(quota) / int(period or 100000)
        elif "cpu" in controllers.split(","):  # v1
            name = ",".join(sorted(controllers.split(",")))
            for folder in (root / name / path, root / "cpu" / path, root / name, root / "cpu"):
                quota, period = _read(folder / "cpu.cfs_quota_us"), _read(folder / "cpu.cfs_period_us")
                if quota is not None and period:
                    return None if int(quota) <= 0 else int(quota) / int(period)
    return None


def cpu_topology(
    sys_cpu: Path = Path("/sys/devices/system/cpu"), sys_node: Path = Path("/sys/devices/system/node")
) -> dict:
    """The CPUs this process may run on (its affinity: ``taskset``, ``numactl``, a container's
    cpuset), the physical cores and sockets among them, the NUMA nodes with their CPUs, and the
    cgroup's CPU quota."""
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    cores, sockets = set(), set()
    for cpu in allowed:
        topo = sys_cpu / f"cpu{cpu}" / "topology"
        package = _read(topo / "physical_package_id") or "0"
        core = _read(topo / "core_id") or str(cpu)
        sockets.add(package)
        cores.add((package, core))
    nodes = {}
    for node in sorted(sys_node.glob("node[0-9]*"), key=lambda p: int(p.name[4:])):
        text = _read(node / "cpulist")
        if text:
            nodes[int(node.name[4:])] = [c for c in parse_cpu_list(text) if c in allowed]
    return {
        "allowed_cpus": allowed,
        "physical_cores": len(cores),
        "sockets": len(sockets),
        "numa_nodes": {n: cpus for n, cpus in nodes.items() if cpus} or {0: allowed},
        "cgroup_quota": cgroup_cpu_quota(),
    }


def usable_cores(topology: dict | None = None) -> int:
    """The cores this process can keep busy: the physical cores of its affinity, at most its cgroup's
    CPU quota (rounded up), at least 1. What ``backend.intra_op_threads=0`` and
    ``data.num_workers=auto`` take: two workers pinned to one CPU each get one thread each, a
    container limited to 4 CPUs on a 64-core host gets 4, not 64."""
    topo = topology or cpu_topology()
    cores = max(1, int(topo["physical_cores"]))
    quota = topo.get("cgroup_quota")
    if quota:
        cores = min(cores, max(1, int(-(-quota // 1))))
    return cores
