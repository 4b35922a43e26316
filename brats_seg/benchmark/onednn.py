"""oneDNN's own account of a training step: its verbose lines caught and summed.

``ONEDNN_VERBOSE`` makes oneDNN print one line per primitive it executes, from C, on file
descriptor 1; :func:`capture_stdout` catches those, :func:`onednn_profile` sums them per primitive
kind (what ``scripts/benchmark.py benchmark.onednn_verbose=true`` records) and
:func:`onednn_seconds` per kernel and reorder layout pair (what ``scripts/profile_step.py`` prints).
"""

from __future__ import annotations

import collections
import os
import sys
import tempfile

__all__ = ["capture_stdout", "onednn_profile", "onednn_seconds"]


def capture_stdout(fn):
    """``(fn(), what the process wrote to its stdout meanwhile)``: file descriptor 1 goes to a
    temporary file while ``fn`` runs, so the C library's writes (oneDNN's verbose lines) are
    caught, not Python's alone."""
    import ctypes

    libc = ctypes.CDLL(None)
    sys.stdout.flush()
    libc.fflush(None)
    saved = os.dup(1)
    with tempfile.TemporaryFile() as f:
        os.dup2(f.fileno(), 1)
        try:
            result = fn()
        finally:
            libc.fflush(None)
            os.dup2(saved, 1)
            os.close(saved)
        f.seek(0)
        return result, f.read().decode(errors="replace")


def onednn_profile(text: str) -> dict:
    """Milliseconds per oneDNN primitive kind in ``ONEDNN_VERBOSE`` output (``exec`` lines:
    ``onednn_verbose[,v1,primitive],exec,cpu,<kind>,<impl>,<prop>,...,<ms>``); convolutions
    also per propagation (forward, backward by data, by weights) and per implementation (the
    kernel oneDNN chose: ``brg_conv_fwd:avx512_core``, ``gemm:jit``, ``ref:any`` ...). ``reorder_share`` is the
    reorders' part of oneDNN's time: layout changes between TensorFlow's plain tensors and
    oneDNN's channel-blocked ones (and their padding), no arithmetic."""
    ms: dict[str, float] = {}
    impl: dict[str, float] = {}
    for line in text.splitlines():
        parts = line.strip().split(",")
        if not parts[0].startswith("onednn_verbose") or "exec" not in parts[:4]:
            continue
        i = parts.index("exec")
        try:
            t = float(parts[-1])
            kind = parts[i + 2]
        except (ValueError, IndexError):
            continue
        ms[kind] = ms.get(kind, 0.0) + t
        if kind == "convolution" and len(parts) > i + 4:
            key = f"convolution:{parts[i + 4]}"
            ms[key] = ms.get(key, 0.0) + t
            impl[parts[i + 3]] = impl.get(parts[i + 3], 0.0) + t  # which kernel oneDNN picked
    total = sum(v for k, v in ms.items() if ":" not in k)
    return {
        "onednn_ms": {k: round(v, 1) for k, v in sorted(ms.items())},
        "onednn_total_ms": round(total, 1),
        "convolution_impl_ms": {k: round(v, 1) for k, v in sorted(impl.items())},
        "reorder_share": round(ms.get("reorder", 0.0) / total, 4) if total else None,
    }


def onednn_seconds(lines: list[str]) -> dict[str, float]:
    """Seconds per ``kind propagation kernel`` (reorders: ``reorder src -> dst`` layouts) from
    ``ONEDNN_VERBOSE=profile_exec`` lines."""
    out: dict[str, float] = collections.defaultdict(float)
    for line in lines:
        if not line.startswith("onednn_verbose") or ",exec," not in line:
            continue
        parts = line.strip().split(",")
        try:
            ms = float(parts[-1])
            i = parts.index("exec")
            kind, impl, prop = parts[i + 2], parts[i + 3], parts[i + 4]
        except (ValueError, IndexError):
            continue
        if kind == "reorder":
            mds = [p for p in parts if p.startswith(("src:", "dst:"))]
            label = "reorder " + " -> ".join(m.split(":")[1] + ":" + m.split(":")[3] for m in mds[:2])
        else:
            label = f"{kind} {prop} {impl}"
        out[label] += ms / 1000.0
    return dict(out)
