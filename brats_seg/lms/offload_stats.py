"""LMS counters of a training run: bytes copied to the host and FLOPs recomputed per step."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import tensorflow as tf

__all__ = ["OffloadStats"]



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
                0, dtype=tf.int64, trainable=False, name=name,
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
