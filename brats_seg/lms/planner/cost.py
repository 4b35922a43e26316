"""Cost tables of the U-Net for one workload: per block and for the whole training step.

:func:`compute_network_cost` walks the blocks of the topology (:mod:`brats_seg.model.topology`),
prices their layers (:mod:`brats_seg.lms.planner.layer_cost`) and derives per block what ``keep``
keeps, what ``recompute`` / ``offload`` rebuild in backward and the working sets of its
forward and backward; per step, the bytes alive throughout (runtime, weights, gradients,
optimizer slots, data, workspace). The coefficients come from
:class:`~brats_seg.lms.planner.memory_model.MemoryModel`.

Tensors are channels-last ``(batch, x, y, z, channels)``; sizes are bytes.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from brats_seg.lms.planner.layer_cost import DTYPE_BYTES, FLOAT32_BYTES, LayerCost, compute_layer_costs
from brats_seg.lms.planner.memory_model import MemoryModel
from brats_seg.lms.planner.workload import OPTIMIZER_SLOTS, Workload
from brats_seg.model.checks import DTYPE_POLICIES

__all__ = ["BlockCost", "NetworkCost", "compute_network_cost", "compute_step_flops", "forward_only_bytes"]

# The input pipeline hands the step the cache's dtypes (brats_seg.data.pipeline): the image
# float16, the region targets uint8. The model casts the image to float32 (``image``) first.
BATCH_IMAGE_BYTES_PER_ELEMENT = 2
LABEL_BYTES_PER_ELEMENT = 1
DATA_TENSORS = ("batch_image", "image", "labels")  # from the input, never offloaded, no gradient


@dataclass(frozen=True)
class BlockCost:
    """One U-Net block: its layer table and the memory quantities derived from it.

    Attributes:
        name: block name (``enc0`` ... ``head``).
        inputs: names of its input tensors (block outputs of earlier blocks, or ``image``).
        output: name of its output tensor (the block name).
        skip_input: for ``dec{l}``, the skip tensor's name (``enc{l}``), else None.
        layers: the layer table, in call order.
        tensor_bytes: bytes of every tensor the block reads, creates or writes.
        tensor_channels: channels of its activations (layer inputs and outputs; the step-time
            model may count them padded to a block, as oneDNN's blocked layouts store them).
        saved: every tensor the layers keep for backward under ``keep``.
        keep_saved_bytes: bytes of ``saved`` (its inputs and output included).
        internal_saved_bytes: bytes of ``saved`` that are neither inputs nor the output
            (what ``recompute``/``offload`` drop in forward and rebuild in backward).
        forward_working_keep_bytes: unsaved internals + scratch at the worst layer, forward, keep.
        forward_working_drop_bytes: internals + scratch at the worst layer, forward, nothing saved.
        backward_working_bytes: what the block's backward holds at its worst layer beyond
            its saved tensors: that layer's internal gradients and scratch, less the saved
            tensors already freed by then (walking the layers backward).
        forward_flops: forward FLOPs (= FLOPs recomputed under recompute/offload).
        recomputable: False when a layer writes state in forward (BatchNormalization's
            moving statistics would be updated twice): such a block is always kept, as
            ``brats_seg.lms.runtime.offload`` refuses to recompute it.
        tail_start: index in ``layers`` of the block's last conv unit (the tail of
            ``Block.split``), None for the head. With the tail kept (the last block
            before the head, see :func:`tail_kept`), only the layers before it are
            recomputed.
        tail_saved_bytes: internal tensors the tail keeps (its input, the conv output).
        tail_backward_bytes: the tail's backward peak: walking its layers backward, the
            tensors not yet freed plus the current layer's gradients and scratch.
        front_backward_bytes: the same for the recomputed front (the recomputation's saved
            tensors are freed layer by layer as its backward proceeds).
        tail_forward_flops: forward FLOPs of the tail (not recomputed when kept).
    """

    name: str
    inputs: tuple[str, ...]
    output: str
    skip_input: str | None
    layers: tuple[LayerCost, ...]
    tensor_bytes: Mapping[str, int]
    saved: frozenset
    keep_saved_bytes: int
    internal_saved_bytes: int
    forward_working_keep_bytes: int
    forward_working_drop_bytes: int
    backward_working_bytes: int
    forward_flops: float
    recomputable: bool = True
    tail_start: int | None = None
    tail_saved_bytes: int = 0
    tail_backward_bytes: int = 0
    front_backward_bytes: int = 0
    tail_forward_flops: float = 0.0
    tensor_channels: Mapping[str, int] = field(default_factory=dict)

    @property
    def input_bytes(self) -> int:
        return sum(self.tensor_bytes[t] for t in self.inputs)

    @property
    def output_bytes(self) -> int:
        return self.tensor_bytes[self.output]

    @property
    def skip_bytes(self) -> int:
        return self.tensor_bytes[self.skip_input] if self.skip_input else 0

    @property
    def params(self) -> int:
        return sum(layer.params for layer in self.layers)


def _finish_block(
    name: str,
    inputs: Sequence[str],
    output: str,
    layers: list[LayerCost],
    tensor_bytes: dict[str, int],
    skip_input: str | None = None,
    recomputable: bool = True,
    tail_start: int | None = None,
    release_lag: int = 0,
    tensor_channels: Mapping[str, int] | None = None,
) -> BlockCost:
    """Derive a block's memory quantities from its layer table (``release_lag``: see
    ``MemoryModel.backward_release_lag_layers``)."""
    inputs = tuple(inputs)
    internal = set(tensor_bytes) - set(inputs) - {output}
    saved = frozenset(t for layer in layers for t in layer.saved)

    def size(names: Iterable[str]) -> int:
        return sum(tensor_bytes[t] for t in set(names))

    def layer_backward(layer: LayerCost) -> int:
        """Internal gradients (of the layer's input and output) and scratch while it runs backward."""
        return size(t for t in (*layer.inputs, layer.output) if t in internal) + layer.backward_scratch_bytes

    def internal_saved(part: Sequence[LayerCost]) -> int:
        return size(t for layer in part for t in layer.saved if t in internal)

    def segment_backward_peak(part: Sequence[LayerCost]) -> int:
        """Backward through ``part`` layer by layer (last first): what the layers up to
        ``release_lag`` after the current one saved (TensorFlow frees a saved tensor once
        the backward ops reading it have run, which the executor may schedule a few layers
        late), plus the current layer's working set."""
        return max(internal_saved(part[: k + 1 + release_lag]) + layer_backward(part[k]) for k in range(len(part)))

    tail_fields: dict[str, Any] = {}
    if tail_start is not None:
        front, tail = layers[:tail_start], layers[tail_start:]
        tail_fields = {
            "tail_start": tail_start,
            "tail_saved_bytes": internal_saved(tail),
            "tail_backward_bytes": segment_backward_peak(tail),
            "front_backward_bytes": segment_backward_peak(front),
            "tail_forward_flops": sum(layer.forward_flops for layer in tail),
        }

    fwd_keep = max(
        size(t for t in (*layer.inputs, layer.output, *layer.creates) if t in internal and t not in saved)
        + layer.forward_scratch_bytes
        for layer in layers
    )
    fwd_drop = max(
        size(t for t in (*layer.inputs, layer.output, *layer.creates) if t in internal) + layer.forward_scratch_bytes
        for layer in layers
    )
    return BlockCost(
        name=name,
        inputs=inputs,
        output=output,
        skip_input=skip_input,
        layers=tuple(layers),
        tensor_bytes=dict(tensor_bytes),
        saved=saved,
        keep_saved_bytes=size(saved),
        internal_saved_bytes=internal_saved(layers),
        forward_working_keep_bytes=fwd_keep,
        forward_working_drop_bytes=fwd_drop,
        # Beyond the block's saved tensors, alive from its forward into its backward.
        backward_working_bytes=segment_backward_peak(layers) - internal_saved(layers),
        forward_flops=sum(layer.forward_flops for layer in layers),
        recomputable=recomputable,
        tensor_channels=dict(tensor_channels or {}),
        **tail_fields,
    )


@dataclass(frozen=True)
class NetworkCost:
    """Cost tables of one workload (model, shape, batch, dtype policy, optimizer).

    Attributes:
        blocks: block costs in forward order.
        tensor_bytes: bytes of every block-output tensor (and ``image``).
        producer: block index producing each tensor (``image``: -1).
        consumers: block indices reading each tensor (the loss is index ``len(blocks)``).
        pinned: the step's input tensors (:data:`DATA_TENSORS`): ``batch_image`` (float16,
            until Keras casts it), ``image`` (its float32 cast, until ``enc0`` is done with
            it) and ``labels`` (uint8, until the loss); never offloaded, no gradient. The
            batches the input pipeline holds besides are ``persistent["data_bytes"]``.
        persistent: bytes alive the whole step, by kind (``runtime_bytes``,
            ``weight_bytes``, ``weight_gradient_bytes``, ``optimizer_slot_bytes``,
            ``weight_cast_bytes``, ``data_bytes``, ``workspace_bytes``).
        loss_bytes: transient bytes of the loss step.
        validation_bytes: the validation pass's peak of activations and inputs (forward
            only, one case, each tensor freed after its last reader; :func:`forward_only_bytes`)
            plus the validation pipeline's buffers (and a sliding-window validation's scoring):
            what it holds in TensorFlow's allocator; None when the workload does not validate.
        validation_host_bytes: what a sliding-window validation holds in NumPy beside it.
        params: weights; trainable_params: trainable weights.
        memory_model: the coefficients used.
        policy: the workload's dtype policy (``float32``, ``mixed_bfloat16``, ...), which the
            step-time model prices by.
    """

    blocks: tuple[BlockCost, ...]
    tensor_bytes: Mapping[str, int]
    producer: Mapping[str, int]
    consumers: Mapping[str, tuple[int, ...]]
    pinned: frozenset
    persistent: Mapping[str, int]
    loss_bytes: int
    params: int
    trainable_params: int
    memory_model: MemoryModel
    validation_bytes: int | None = None
    policy: str = "float32"
    validation_host_bytes: int = 0

    @property
    def persistent_bytes(self) -> int:
        return sum(self.persistent.values())


def _kernel_cast_bytes(topology) -> int:
    """Bytes of the compute-dtype copies of the convolution kernels (0 under float32)."""
    compute = DTYPE_POLICIES[topology.policy]
    if compute == "float32":
        return 0
    kernels = sum(
        layer.kernel**3 * layer.in_channels * layer.output.channels
        for block in topology.blocks
        for layer in block.layers
        if layer.kind in ("conv", "up_transpose")
    )
    return kernels * DTYPE_BYTES[compute]


def _bf16_scratch_bytes(topology, voxels: int, mm: MemoryModel) -> int:
    """What a bfloat16 step holds outside the allocator (``MemoryModel.bf16_scratch_bytes``)."""
    if DTYPE_POLICIES[topology.policy] != "bfloat16":
        return 0
    beyond = (
        mm.bf16_scratch_bytes_per_voxel
        if mm.bf16_scratch_bytes_per_voxel_beyond is None
        else mm.bf16_scratch_bytes_per_voxel_beyond
    )
    knee = mm.bf16_scratch_knee_voxels
    per_voxel = (
        mm.bf16_scratch_bytes + mm.bf16_scratch_bytes_per_voxel * min(voxels, knee) + beyond * max(0, voxels - knee)
    )
    width = topology.filters[0]
    # measured on widths whose first level does not fill oneDNN's 16-channel blocks (16 filters did not show it)
    per_filter = mm.bf16_scratch_bytes_per_voxel_filter * voxels * width if width % 16 else 0.0
    return int(max(per_voxel, per_filter))


def augment_bytes(workload) -> int:
    """The ``nnunet`` augmentation preset's temporaries while the pipeline's map call augments one
    case (``brats_seg.data.augment``): its image and region channels in float32 going into
    batchgenerators and coming out (two copies, 4 bytes a value), and the spatial transform's
    coordinate grid with its rotated copy (3 float64 values a voxel, twice). From the arrays'
    sizes, not fitted: at full resolution 0.72 GB, where the benchmark measured 0.45 GB above the
    plan without this term (``docs/measurements/augment_zen5/``). The ``light`` preset's float32
    temporary is one of :func:`~brats_seg.lms.planner.workload.pipeline_batches`."""
    if workload.augment != "nnunet":
        return 0
    channels = workload.model_cfg.in_channels + workload.model_cfg.out_channels
    return math.prod(workload.input_shape) * (channels * 4 * 2 + 3 * 8 * 2)


def compute_network_cost(workload: Workload, memory_model: MemoryModel | None = None) -> NetworkCost:
    """The cost tables of one workload, by walking its topology layer by layer.

    Args:
        workload: model config, input shape, batch, dtype policy, optimizer.
        memory_model: coefficients; default :class:`MemoryModel()`.

    Returns:
        The :class:`NetworkCost`.
    """
    mm = memory_model or MemoryModel()
    topology = workload.topology()
    model_cfg, input_shape, batch = workload.model_cfg, workload.input_shape, workload.batch_size
    voxels = math.prod(input_shape)
    image_bytes = batch * voxels * model_cfg.in_channels * DTYPE_BYTES[topology.image.dtype]
    globals_: dict[str, int] = {topology.image.name: image_bytes}  # block outputs (and the image)
    blocks: list[BlockCost] = []
    for spec in topology.blocks:
        layers, tensor_bytes, channels, tail_start = compute_layer_costs(spec, globals_, input_shape, batch, mm)
        # BatchNormalization writes its moving statistics in forward: never recomputed.
        recomputable = not any(layer.kind == "norm" and layer.norm == "batch" for layer in spec.layers)
        blocks.append(
            _finish_block(
                spec.name,
                [t.name for t in spec.inputs],
                spec.output.name,
                layers,
                tensor_bytes,
                spec.skip.name if spec.skip else None,
                recomputable,
                tail_start,
                mm.backward_release_lag_layers,
                channels,
            )
        )
        globals_[spec.name] = blocks[-1].output_bytes

    n = len(blocks)
    batch_image_bytes = batch * voxels * model_cfg.in_channels * BATCH_IMAGE_BYTES_PER_ELEMENT
    labels_bytes = batch * voxels * model_cfg.out_channels * LABEL_BYTES_PER_ELEMENT
    globals_.update(batch_image=batch_image_bytes, labels=labels_bytes)
    producer = {**dict.fromkeys(DATA_TENSORS, -1), **{blk.output: i for i, blk in enumerate(blocks)}}
    consumers: dict[str, list[int]] = {t: [] for t in globals_}
    for i, blk in enumerate(blocks):
        for t in blk.inputs:
            consumers[t].append(i)
    consumers["batch_image"].append(0)  # cast to float32 as the step starts
    consumers["head"].append(n)  # the loss (and the metrics, at the same step)
    consumers["labels"].append(n)

    params = sum(blk.params for blk in blocks)
    trainable = sum(layer.trainable_params for blk in blocks for layer in blk.layers)
    workspace_ref = max(layer.workspace_ref_bytes for blk in blocks for layer in blk.layers)
    weight_grad_scratch_ref = max(layer.weight_grad_scratch_ref_bytes for blk in blocks for layer in blk.layers)
    persistent = {
        "runtime_bytes": int(
            mm.runtime_bytes
            + (mm.runtime_bytes_per_conv + mm.runtime_bytes_per_conv_filter * model_cfg.base_filters)
            * sum(1 for blk in blocks for layer in blk.layers if layer.kind in ("conv", "up_transpose"))
        ),
        "weight_bytes": params * FLOAT32_BYTES,
        "weight_gradient_bytes": trainable * FLOAT32_BYTES,
        "optimizer_slot_bytes": OPTIMIZER_SLOTS[workload.optimizer] * trainable * FLOAT32_BYTES,
        # Under mixed precision each convolution casts its float32 kernel to the compute dtype
        # and keeps that copy from forward to its backward (the input gradient reads it).
        "weight_cast_bytes": _kernel_cast_bytes(topology),
        "data_bytes": (batch_image_bytes + labels_bytes) * workload.input_batches,  # the pipeline's batches
        "workspace_bytes": int(mm.workspace_factor * workspace_ref),
        "library_scratch_bytes": int(mm.conv_weight_grad_scratch * weight_grad_scratch_ref),
        "bf16_scratch_bytes": _bf16_scratch_bytes(topology, voxels, mm),
        # a training process (fed by its pipeline) beyond the benchmark's step
        "training_loop_bytes": mm.training_loop_bytes if workload.input_batches else 0,
        "augment_bytes": augment_bytes(workload) if workload.input_batches else 0,
    }
    net = NetworkCost(
        blocks=tuple(blocks),
        tensor_bytes=globals_,
        producer=producer,
        consumers={t: tuple(c) for t, c in consumers.items()},
        pinned=frozenset(DATA_TENSORS),
        persistent=persistent,
        loss_bytes=int(mm.loss_tensors * globals_["head"]),
        params=params,
        trainable_params=trainable,
        memory_model=mm,
        policy=topology.policy,
    )
    if workload.validates:  # one case at a time, fed by its own pipeline (batches of one)
        host = 0
        if workload.validation_grid is None:
            pipeline = (batch_image_bytes + labels_bytes) // batch * workload.input_batches
        else:  # whole volumes by sliding windows of the input: their arrays, not the window's
            pipeline, host = sliding_validation_bytes(workload)
        net = dataclasses.replace(
            net, validation_bytes=forward_only_bytes(net) // batch + pipeline, validation_host_bytes=host
        )
    return net


#: Whole-grid float32 arrays per output region that a sliding-window validation's scoring holds in
#: TensorFlow's allocator at its peak (brats_seg.training.steps.make_sliding_eval_step's ``score``):
#: the blended prediction's tensor copy, the labels cast to float32 and the loss's and metrics'
#: temporaries over the volume. Measured, not counted: the allocator's peak over 16 calls at two
#: grids ran 4.9-7.5 arrays, the executor's order varying between calls; the worst is taken
#: (docs/measurements/stage_memory_zen5/score_arrays.py, score_arrays.txt).
SLIDING_SCORE_REGION_ARRAYS = 7.5

#: Whole-grid float32 arrays per region in NumPy at the same time (evaluation/inference/sliding.py):
#: the weighted sum (or the blended prediction) and the stacked batch ``tf.constant`` copies from.
SLIDING_HOST_REGION_ARRAYS = 2


def sliding_validation_bytes(workload: Workload) -> tuple[int, int]:
    """``(pool, host)``: bytes of validating one whole volume of ``workload.validation_grid`` by
    sliding windows (a patch run's validation), besides the window's forward pass. ``pool``, in
    TensorFlow's allocator: the validation pipeline's whole volumes (the cache's float16 image and
    uint8 regions, as many as it holds) and the scoring's :data:`SLIDING_SCORE_REGION_ARRAYS` float32
    arrays per region; ``host``, in NumPy: the image, the blending's float32 weights and
    :data:`SLIDING_HOST_REGION_ARRAYS` float32 arrays per region."""
    voxels = math.prod(workload.validation_grid)
    c, r = workload.model_cfg.in_channels, workload.model_cfg.out_channels
    pipeline = voxels * (c * BATCH_IMAGE_BYTES_PER_ELEMENT + r * LABEL_BYTES_PER_ELEMENT) * workload.input_batches
    score = voxels * 4 * r * SLIDING_SCORE_REGION_ARRAYS
    host = voxels * (c * BATCH_IMAGE_BYTES_PER_ELEMENT + 4 + 4 * r * SLIDING_HOST_REGION_ARRAYS)
    return int(pipeline + score), int(host)


def forward_only_bytes(net: NetworkCost, with_loss: bool = True) -> int:
    """Activations and inputs at the worst moment of a forward pass without backward (the
    validation pass, inference): every tensor lives from its producer to its last reader and
    a block's internals only while it runs; then (``with_loss``) the loss on the head's output.

    Returns:
        Bytes at the network's batch size (activations scale with the batch).
    """
    n = len(net.blocks)
    worst = 0
    for i in range(n + 1 if with_loss else n):  # block i, or the loss (i == n)
        alive = sum(
            nbytes
            for t, nbytes in net.tensor_bytes.items()
            if net.producer[t] <= i <= max(net.consumers[t], default=net.producer[t])
        )
        working = net.blocks[i].forward_working_drop_bytes if i < n else net.loss_bytes
        worst = max(worst, alive + working)
    return worst


def compute_step_flops(net: NetworkCost) -> float:
    """FLOPs of one training step (forward and backward, no recomputation), for the whole batch.

    A convolution's backward is two convolutions of its forward's size (the gradient by its
    input and by its weights), except the network's first, whose input is the image: no
    gradient by it is taken. Every other layer is counted at twice its forward in backward.
    """
    total = 0.0
    first_conv = True
    for blk in net.blocks:
        for layer in blk.layers:
            if layer.kind in ("conv", "up_transpose"):
                total += layer.forward_flops * (2.0 if first_conv else 3.0)
                first_conv = False
            else:
                total += 3.0 * layer.forward_flops
    return total
