"""Memory statistics of a run: device peak bytes per epoch, LMS traffic and recomputation.

* GPU: ``tf.config.experimental.get_memory_info("GPU:0")["peak"]``, reset each epoch.
* CPU: the process's peak resident set (``VmHWM`` in ``/proc/self/status``), reset each
  epoch by writing ``5`` to ``/proc/self/clear_refs`` (Linux >= 4.0); where that is not
  possible the peak since process start is reported and said so once.

:class:`MemoryStatsCallback` logs ``peak_bytes`` and the per-step ``lms_offloaded_bytes``
and ``lms_recomputed_flops`` counted by the LMS wrapper, per epoch.
"""

from __future__ import annotations

import logging
from pathlib import Path

import keras

__all__ = ["peak_rss_bytes", "reset_peak_rss", "current_rss_bytes", "device_peak_bytes", "reset_device_peak",
           "allocator_peak_bytes", "reset_allocator_peak",
           "MemoryStatsCallback"]

log = logging.getLogger(__name__)
_warned_reset = False


def _status_kb(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def peak_rss_bytes() -> int:
    """Peak resident set size of this process since start or the last :func:`reset_peak_rss`."""
    kb = _status_kb("VmHWM")
    if kb is not None:
        return kb * 1024
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def current_rss_bytes() -> int:
    """Resident set size of this process now."""
    kb = _status_kb("VmRSS")
    if kb is not None:
        return kb * 1024
    import psutil

    return int(psutil.Process().memory_info().rss)


def reset_peak_rss() -> bool:
    """Reset the peak RSS to the current RSS; False where the kernel does not allow it."""
    global _warned_reset
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        if not _warned_reset:
            log.warning("cannot reset the peak RSS here (/proc/self/clear_refs); peaks are since process start")
            _warned_reset = True
        return False


def device_peak_bytes(device: str) -> int:
    """Peak bytes of the training device since the last reset (GPU allocator, or process RSS)."""
    if device == "GPU":
        import tensorflow as tf

        return int(tf.config.experimental.get_memory_info("GPU:0")["peak"])
    return peak_rss_bytes()


def reset_device_peak(device: str) -> None:
    if device == "GPU":
        import tensorflow as tf

        tf.config.experimental.reset_memory_stats("GPU:0")
    else:
        reset_peak_rss()
        reset_allocator_peak(device)


def allocator_peak_bytes(device: str) -> int | None:
    """Peak bytes of live tensors in TensorFlow's own allocator since the last reset.

    On CPU with oneDNN the allocator is a BFC allocator that keeps statistics; without it
    (oneDNN off) TensorFlow raises, and None is returned. The RSS peak is larger: it also
    holds the runtime, memory oneDNN allocates itself (e.g. gemm scratch) and the pool's
    touched but free pages.
    """
    import tensorflow as tf

    try:
        return int(tf.config.experimental.get_memory_info(f"{device}:0")["peak"])
    except (ValueError, RuntimeError, tf.errors.OpError):
        return None


def reset_allocator_peak(device: str) -> None:
    import tensorflow as tf

    try:
        tf.config.experimental.reset_memory_stats(f"{device}:0")
    except (ValueError, RuntimeError, tf.errors.OpError):
        pass


class MemoryStatsCallback(keras.callbacks.Callback):
    """Per epoch: device peak bytes and LMS per-step stats, into the epoch logs.

    The values land in ``logs`` before the checkpoint and tracking callbacks read them,
    so they are in ``history.csv``, ``state.json`` and MLflow.

    Args:
        device: ``GPU`` or ``CPU``.
        offload_stats: the :class:`~brats_seg.lms.offload_stats.OffloadStats` of the LMS wrapper, or None.
        baseline_bytes: on CPU, the RSS just before the model was built (the runtime); each
            epoch then also logs ``measured_bytes``, the peak above it: what the plan
            predicts (``plan.txt``), validation included.
    """

    def __init__(self, device: str, offload_stats=None, baseline_bytes: int | None = None) -> None:
        super().__init__()
        self.device = device
        self.offload_stats = offload_stats
        self.baseline_bytes = baseline_bytes

    def on_epoch_begin(self, epoch, logs=None):
        reset_device_peak(self.device)
        if self.offload_stats is not None:
            self.offload_stats.reset()

    def on_epoch_end(self, epoch, logs=None):
        if logs is None:
            return
        logs["peak_bytes"] = float(device_peak_bytes(self.device))
        if self.baseline_bytes is not None and self.device == "CPU":
            logs["measured_bytes"] = logs["peak_bytes"] - float(self.baseline_bytes)
        if self.offload_stats is not None:
            stats = self.offload_stats.result()
            logs["lms_offloaded_bytes"] = float(stats["lms_offloaded_bytes"])
            logs["lms_recomputed_flops"] = float(stats["lms_recomputed_flops"])
