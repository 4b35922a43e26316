"""What a traced training step really keeps from forward for backward: names, dtypes, bytes.

The LMS planner prices what each layer keeps (``brats_seg.lms.planner.layer_cost``) from rules; this
module reads the same thing off TensorFlow's traced graph, so the rules can be checked
against the graph (``tests/unit/test_saved_tensors.py``) and a user can see where a step's
memory goes under a dtype policy (``scripts/plan_memory.py plan.saved=true``).

A forward tensor is *kept* when an op of the backward pass (built by ``tape.gradient``)
reads it: TensorFlow holds it until that op has run. Ops that need only a tensor's shape
(``Shape``, ``Size``, ``Rank``) do not count (Grappler folds them for static shapes), and
a tensor that only re-labels another one's buffer (``Reshape``, ``Identity``,
``StopGradient``, ``IdentityN`` of ``tf.custom_gradient``) is counted once, as its source.
Variable reads (the weights' own buffers, persistent whatever the plan) and constants are
not activations and are left out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["SavedTensor", "trace_saved_tensors"]

_SHAPE_ONLY = frozenset({"Shape", "ShapeN", "Size", "Rank"})
# The weights' own buffers (persistent, not activations) and constants.
_NOT_ACTIVATIONS = frozenset({"ReadVariableOp", "Const"})
_ALIASES = frozenset({"Reshape", "Identity", "StopGradient", "Squeeze", "ExpandDims", "Snapshot", "IdentityN"})


@dataclass(frozen=True)
class SavedTensor:
    """One forward tensor the backward pass reads.

    Attributes:
        name: the graph tensor's name (``unet3d_1/enc0_conv1_1/convolution:0``).
        op_type: the op that made it (``Conv3D``, ``Relu``, ``Cast``).
        dtype: ``float32``, ``bfloat16``, ``uint8``, ...
        shape: static shape.
        nbytes: bytes (static shape).
    """

    name: str
    op_type: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int


def trace_saved_tensors(
    model,
    loss,
    batch_size: int,
    input_shape,
    in_channels: int,
    out_channels: int,
    image_dtype: str = "float16",
    labels_dtype: str = "uint8",
) -> list[SavedTensor]:
    """Trace ``loss(labels, model(image))`` and its gradient by the trainable weights; list what
    forward keeps for backward.

    Args:
        model: a Keras model ``(B, x, y, z, in_channels) -> (B, x, y, z, out_channels)``.
        loss: a Keras loss whose ``call(y, pred)`` gives per-sample values.
        batch_size, input_shape: the traced batch and spatial shape ``(x, y, z)``.
        in_channels, out_channels: image channels and region outputs.
        image_dtype, labels_dtype: what the input pipeline hands the step.

    Returns:
        The kept tensors, each buffer once, in graph order.
    """
    import tensorflow as tf

    marks: list[int] = []

    @tf.function(autograph=False)
    def step(x, y):
        with tf.GradientTape() as tape:
            value = tf.reduce_mean(loss.call(y, model(x, training=True)))
        marks.append(len(tf.compat.v1.get_default_graph().get_operations()))
        return tape.gradient(value, model.trainable_variables)

    shape = tuple(int(s) for s in input_shape)
    graph = step.get_concrete_function(
        tf.TensorSpec((batch_size, *shape, in_channels), image_dtype),
        tf.TensorSpec((batch_size, *shape, out_channels), labels_dtype),
    ).graph
    ops = graph.get_operations()
    backward = set(ops[marks[0] :])
    seen: set = set()
    kept: list[SavedTensor] = []
    for op in ops[: marks[0]]:
        if op.type in _NOT_ACTIVATIONS:
            continue
        for t in op.outputs:
            if not any(c in backward and c.type not in _SHAPE_ONLY for c in t.consumers()):
                continue
            source = t
            while source.op.type in _ALIASES and source.op.inputs:
                source = source.op.inputs[0]
            if source.ref() in seen:
                continue
            seen.add(source.ref())
            dims = tuple(int(d) if d is not None else 1 for d in (t.shape.as_list() if t.shape.rank else []))
            kept.append(SavedTensor(t.name, t.op.type, t.dtype.name, dims, math.prod(dims) * t.dtype.size))
    return kept
