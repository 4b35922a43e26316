"""Memory statistics of a run: device peak bytes per epoch, LMS traffic and recomputation.

* GPU: ``tf.config.experimental.get_memory_info("GPU:0")["peak"]``, reset each epoch.
* CPU: the process's peak resident set (``VmHWM`` in ``/proc/self/status``), reset each
  epoch by writing ``5`` to ``/proc/self/clear_refs`` (Linux >= 4.0); where that is not
  possible the peak since process start is reported and said so once.

:class:`MemoryStatsCallback` logs ``peak_bytes`` and the per-step ``lms_offloaded_bytes``
and ``lms_recomputed_flops`` that :class:`OffloadStats` counts inside the LMS wrapper, per epoch.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

import keras
import tensorflow as tf

__all__ = [
    "MemoryStatsCallback",
    "OffloadStats",
    "allocator_peak_bytes",
    "current_file_rss_bytes",
    "current_rss_bytes",
    "device_peak_bytes",
    "peak_rss_bytes",
    "reset_allocator_peak",
    "reset_device_peak",
    "reset_peak_rss",
]

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


def current_file_rss_bytes() -> int | None:
    """File-backed resident memory of this process now (``RssFile``: mapped files' pages, the
    libraries' and a memory-mapped cache's; clean, so the kernel can drop them), or None."""
    kb = _status_kb("RssFile")
    return None if kb is None else kb * 1024


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
        offload_stats: the :class:`OffloadStats` of the LMS wrapper, or None.
        baseline_bytes: on CPU, the RSS just before the model was built (the runtime); each
            epoch then also logs ``measured_bytes``, the peak above it: what the plan
            predicts (``plan.txt``), validation included; ``train_measured_bytes`` and
            ``val_measured_bytes``, the training steps' and the validation pass's own peaks
            above it (the peak is reset between them; an epoch without validation logs its
            training peak only); and ``file_bytes``, the file-backed resident pages above the
            runtime's at the epoch's end (mapped files, which the kernel may drop; the plan
            does not count them; ``baseline_file_bytes``, read with ``baseline_bytes``, is the
            runtime's).
    """

    def __init__(
        self,
        device: str,
        offload_stats=None,
        baseline_bytes: int | None = None,
        baseline_file_bytes: int | None = None,
    ) -> None:
        super().__init__()
        self.device = device
        self.offload_stats = offload_stats
        self.baseline_bytes = baseline_bytes
        self.baseline_file_bytes = baseline_file_bytes
        self._train_peak: int | None = None

    @property
    def _phases(self) -> bool:
        return self.baseline_bytes is not None and self.device == "CPU"

    def on_epoch_begin(self, epoch, logs=None):
        reset_device_peak(self.device)
        self._train_peak = None
        if self.offload_stats is not None:
            self.offload_stats.reset()

    def on_test_begin(self, logs=None):
        if self._phases:  # the training steps' peak, then the validation pass's own
            self._train_peak = peak_rss_bytes()
            reset_peak_rss()

    def on_epoch_end(self, epoch, logs=None):
        if logs is None:
            return
        logs["peak_bytes"] = float(device_peak_bytes(self.device))
        if self._phases:
            baseline = float(self.baseline_bytes)
            if self._train_peak is not None:
                logs["train_measured_bytes"] = self._train_peak - baseline
                logs["val_measured_bytes"] = logs["peak_bytes"] - baseline
                logs["peak_bytes"] = float(max(self._train_peak, logs["peak_bytes"]))
            else:
                logs["train_measured_bytes"] = logs["peak_bytes"] - baseline
            logs["measured_bytes"] = logs["peak_bytes"] - baseline
            files = current_file_rss_bytes()
            if files is not None and self.baseline_file_bytes is not None:
                logs["file_bytes"] = float(files - self.baseline_file_bytes)
        if self.offload_stats is not None:
            stats = self.offload_stats.result()
            logs["lms_offloaded_bytes"] = float(stats["lms_offloaded_bytes"])
            logs["lms_recomputed_flops"] = float(stats["lms_recomputed_flops"])


class OffloadStats:
    """LMS counters: bytes copied to the host and FLOPs recomputed, per training step.

    The counters are ``tf.Variable`` s updated inside the traced step (so a dynamic batch,
    e.g. Keras' ``None``, is counted right), summed over replicas on read. Create the
    object under ``strategy.scope()`` when training distributed. A block is counted when
    its forward pass is recorded for backprop (training steps, not inference).

    Args:
        flops_per_block: forward FLOPs of a block for ONE example (batch 1), e.g. from the
            planner; multiplied by the batch size at run time. Missing blocks count 0.
    """

    def __init__(self, flops_per_block: Mapping[str, float] | None = None):
        self.flops_per_block = dict(flops_per_block or {})

        def counter(name: str) -> tf.Variable:
            return tf.Variable(
                0,
                dtype=tf.int64,
                trainable=False,
                name=name,
                synchronization=tf.VariableSynchronization.ON_READ,
                aggregation=tf.VariableAggregation.SUM,
            )

        self.offloaded_bytes = counter("lms_offloaded_bytes")  # bytes, all passes since reset
        self.recomputed_flops = counter("lms_recomputed_flops")  # FLOPs, all passes since reset
        self.passes = counter("lms_passes")  # training forward passes (steps x replicas)

    def add_pass(self) -> None:
        self.passes.assign_add(1)

    def add_offloaded(self, tensors: Sequence[tf.Tensor]) -> None:
        """Count ``tensors`` (any shapes) as copied to the host once in this pass."""
        if tensors:
            self.offloaded_bytes.assign_add(tf.add_n([_nbytes(t) for t in tensors]))

    def add_recomputed(self, block_name: str, x: tf.Tensor) -> None:
        """Count ``block_name``'s forward FLOPs for the batch of ``x`` ``(B, ...)``."""
        per_example = int(self.flops_per_block.get(block_name, 0))
        if per_example:
            batch = x.shape[0] if x.shape.rank and x.shape[0] is not None else tf.shape(x, tf.int64)[0]
            self.recomputed_flops.assign_add(tf.cast(batch, tf.int64) * per_example)

    def result(self) -> dict[str, float]:
        """Means per forward pass (one replica's step) since the last :meth:`reset`."""
        passes = int(self.passes.numpy())
        per = max(passes, 1)
        return {
            "lms_offloaded_bytes": int(self.offloaded_bytes.numpy()) / per,
            "lms_recomputed_flops": int(self.recomputed_flops.numpy()) / per,
            "lms_passes": passes,
        }

    def reset(self) -> None:
        for v in (self.offloaded_bytes, self.recomputed_flops, self.passes):
            v.assign(0)


def _nbytes(t: tf.Tensor) -> tf.Tensor:
    """Size of ``t`` in bytes, an int64 scalar (a constant when the shape is static)."""
    n = t.shape.num_elements()
    if n is not None:
        return tf.constant(n * t.dtype.size, tf.int64)
    return tf.size(t, out_type=tf.int64) * t.dtype.size
