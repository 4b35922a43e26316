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
  channels for a 3D convolution's input gradient).
"""

from __future__ import annotations

import functools
import platform
from pathlib import Path

__all__ = ["cpu_flags", "cpu_isa", "has_native_bf16", "cpu_model_name"]

_AVX512_CORE = frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq"})
_BF16 = frozenset({"avx512_bf16", "amx_bf16"})


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


def cpu_isa(cpuinfo: str | None = None) -> str:
    """``avx512`` (oneDNN's avx512_core), ``avx2`` or ``other`` (neither, or unknown)."""
    flags = cpu_flags(cpuinfo)
    if _AVX512_CORE <= flags:
        return "avx512"
    if "avx2" in flags:
        return "avx2"
    return "other"


def has_native_bf16(cpuinfo: str | None = None) -> bool:
    """True if the CPU computes bfloat16 natively (AVX512-BF16 or AMX-BF16)."""
    return bool(_BF16 & cpu_flags(cpuinfo))


def cpu_model_name(cpuinfo: str | None = None) -> str:
    """The CPU's model name, for logs and benchmark records."""
    return _cpuinfo_field(_cpuinfo() if cpuinfo is None else cpuinfo, "model name") or platform.processor() or "unknown"
