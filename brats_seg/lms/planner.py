"""LMS memory planner: an analytic memory model of the 3D U-Net and a per-block plan.

Pure Python: nothing here imports TensorFlow or Keras, so the plan can be made (and
printed, and checked against a budget) before TensorFlow is configured or imported.

Tensors are channels-last ``(batch, x, y, z, channels)``. The network modelled is the
one of ``brats_seg/model/unet3d.py`` (blocks ``enc{l}``, ``bottleneck``, ``dec{l}``,
``head``); keep the two in step.

The module has four parts:

1. **Cost tables** (:func:`compute_network_cost`): per block, a table of its layers with
   the tensors each layer saves for backward (:data:`SAVED_FOR_BACKWARD` documents the
   assumption per layer type), forward FLOPs, parameters and transient working sets;
   plus weights, weight gradients, optimizer slots, the data batch, a convolution
   workspace allowance and a runtime allowance.
2. **Timeline simulation** (:func:`simulate`): forward through the blocks, the loss,
   backward in reverse; every tensor is on the device over the union of the intervals
   in which someone needs it (its producer kept it, a consumer kept or will recompute
   from it, an offloaded copy has come back ``prefetch`` blocks early); gradients of
   block outputs live from their first producer in backward to their consumer. The
   predicted peak is the largest step, and where it happens is reported. A recomputed
   or offloaded last block before the head keeps its last conv unit (:func:`tail_kept`).
3. **Planning** (:func:`plan_lms`, :func:`compare_strategies`): ``off`` / ``recompute``
   / ``offload`` / ``auto`` (greedy by peak bytes saved per overhead second, then a
   pass that undoes every move not needed to fit). :class:`PlanDoesNotFitError` says
   what would fit.
4. **The plan** (:class:`Plan`): per-block table, totals, ``format_table``, JSON.

Calibration: every memory coefficient is a field of :class:`MemoryModel` (one place).
Measure real peaks for a few workloads and use :func:`fit_memory_model`, which fits
``runtime_bytes`` (intercept) and ``activation_factor`` (slope) by least squares;
the other fields encode per-layer assumptions or were fitted once, to revisit only if
the residuals show a pattern (e.g. mixed precision predicted low -> ``norm_saved_tensors``). The defaults
are calibrated on CPU; ``docs/lms_calibration.md`` has the measurements and commands.

Units: bytes are SI in printed tables (1 GB = 1e9 bytes); :func:`parse_limit` reads
both ``GB`` (1e9) and ``GiB`` (2**30).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from brats_seg.config import LMSConfig, ModelConfig, TrainConfig
from brats_seg.model.topology import (
    BlockSpec,
    LayerSpec,
    TensorSpec,
    check_batch_size,
    check_input_shape,
    check_policy,
    unet_topology,
)

__all__ = [
    "BlockCost",
    "BlockPlan",
    "DTYPE_BYTES",
    "LayerCost",
    "MemoryModel",
    "CPU_MEMORY_MODELS",
    "memory_model_for",
    "NetworkCost",
    "OPTIMIZER_SLOTS",
    "POLICIES",
    "Plan",
    "PlanDoesNotFitError",
    "SAVED_FOR_BACKWARD",
    "STANDARD_RESOLUTIONS",
    "STRATEGIES",
    "Timeline",
    "compare_strategies",
    "compute_network_cost",
    "estimate_peak",
    "fit_memory_model",
    "format_bytes",
    "parse_limit",
    "plan_lms",
    "plan_lms_from_config",
    "simulate",
    "tail_kept",
]

logger = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------
# Vocabulary and constants
# ---------------------------------------------------------------------------------------

POLICIES = ("keep", "recompute", "offload")  # per block
STRATEGIES = ("off", "recompute", "offload", "auto")  # per plan (`lms=` config group)

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}  # a tensor's dtype -> bytes per element
FLOAT32_BYTES = 4  # weights, their gradients and optimizer slots are float32 under every policy
DATA_BYTES_PER_ELEMENT = 4  # the pipeline hands image and region targets to the model as float32

# Optimizer -> float32 slot variables per trainable weight.
OPTIMIZER_SLOTS = {"adam": 2, "adamw": 2, "sgd": 0, "sgd_momentum": 1}

# The resolutions of configs/resolution, smallest first (name, (x, y, z)).
STANDARD_RESOLUTIONS = (
    ("tiny", (48, 56, 40)),
    ("half", (96, 112, 80)),
    ("full", (192, 224, 160)),
    ("2x", (384, 448, 320)),
)

# What each layer type keeps for its backward pass (TensorFlow autodiff of the Keras 3 layer).
SAVED_FOR_BACKWARD = {
    "conv": "its input (Conv3DBackpropFilter needs it; the kernel is a weight)",
    "norm": "its input upcast to float32 (Keras Group/BatchNormalization compute in float32; "
    "under a float32 policy that is the conv output itself) plus per-group mean and 1/std; "
    "not the normalised output (gamma is folded into the scale) -- MemoryModel.norm_saved_tensors",
    "relu": "its output (ReluGrad uses the output)",
    "pool": "its input and its output (MaxPool3DGrad needs both)",
    "concat": "nothing (its gradient is a slice)",
    "up_transpose": "its input (the filter gradient needs it)",
    "up_trilinear": "nothing (gathers and constant scalings are linear)",
    "cast": "nothing",
    "sigmoid": "its output",
    "nest": "its inputs and output (each region's probability times its parent's: the product's "
    "gradient needs both factors)",
}

# Forward FLOPs of the cheap layers (convolutions are counted exactly: 2*K^3*Cin*Cout per output voxel).
NORM_FLOPS_PER_ELEMENT = 8.0  # mean, squared difference, variance, scale, shift
RELU_FLOPS_PER_ELEMENT = 1.0
POOL_FLOPS_PER_INPUT_ELEMENT = 1.0  # 2x2x2 max: ~one comparison per input element
TRILINEAR_FLOPS_PER_OUTPUT_ELEMENT = 9.0  # 3 axes x (mul, mul, add)
SIGMOID_FLOPS_PER_ELEMENT = 4.0

_LMS_DEFAULTS = LMSConfig()
DEFAULT_SIZE_BYTES = _LMS_DEFAULTS.size
DEFAULT_PREFETCH = _LMS_DEFAULTS.prefetch
DEFAULT_HOST_BANDWIDTH_BPS = _LMS_DEFAULTS.host_bandwidth_gbps * 1e9
DEFAULT_DEVICE_FLOPS = _LMS_DEFAULTS.device_tflops * 1e12


# ---------------------------------------------------------------------------------------
# The calibration point
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryModel:
    """Coefficients of the memory model: the one place to calibrate against measurements.

    ``peak = runtime + weights + weight grads + optimizer slots + data + workspace
    + activation_factor * (kept activations + activation gradients + transient)
    + rebuild allowance`` at the worst step of the simulated timeline, where ``runtime =
    runtime_bytes + (runtime_bytes_per_conv + runtime_bytes_per_conv_filter * base_filters)
    * convolutions`` and the rebuild allowance
    (recompute/offload only) is ``rebuild_runtime_bytes + rebuild_fragmentation *`` the
    largest block's rebuilt internals. :func:`fit_memory_model` fits ``runtime_bytes``
    and ``activation_factor`` to measured peaks; the other fields are per-layer
    assumptions (see :data:`SAVED_FOR_BACKWARD`) or were fitted once (the docs).

    Calibrated on CPU (oneDNN, float32, Adam, batch 1) against the peak RSS that
    ``scripts/benchmark.py`` measures above the already-imported runtime after four
    steps (the BFC pool keeps touching new pages for a few steps); the measurements,
    the per-component evidence and the commands are in ``docs/lms_calibration.md``.
    GPU backends are not calibrated: there cuDNN takes real convolution workspace
    (raise ``workspace_factor``) and the allocator is the GPU BFC.

    Attributes:
        runtime_bytes: a fixed allowance for what the runtime adds besides tensors;
            0, as everything measured scales with the model (next field). TensorFlow's
            own import (~0.85 GB RSS on CPU) is NOT in it: the benchmark's baseline (and
            any budget taken from the RAM available after start-up) already contains it.
        runtime_bytes_per_conv: per convolution (transposed ones included): its traced
            and Grappler-optimised graph nodes, the oneDNN primitives and JIT kernels of
            its forward and two backward passes. RSS beyond the allocator's peak at the
            smallest workloads is 0.15 GB for the depth-3 U-Net (18 convolutions) and
            0.18-0.2 GB at depth 4 (23): 8 MB each.
        runtime_bytes_per_conv_filter: the part of the per-convolution runtime that grows
            with the network's width, per base filter. 0 on AVX-512 (not resolved by its
            calibration grid of 8 and 16 filters); on AVX2 the RSS beyond the allocator at
            64x64x48 is 8.7 / 10.6 / 13.2 MB per convolution at 8 / 16 / 32 filters.
        activation_factor: multiplies every activation/gradient/transient byte. Two
            effects meet here and nearly cancel, hence 1.0: allocator rounding and
            fragmentation (oneDNN's BFC allocator rounds chunks up and never gives touched
            pages back: RSS +4..+34% over the allocator's own peak at full resolution) and
            the block granularity of :func:`simulate` (the worst layer's working set, the
            block's saved tensors and its input gradients are counted at once, though the
            saved tensors are freed layer by layer in backward and the input gradients
            appear only at the block's end: +6..+25% over the allocator's peak).
        workspace_factor: convolution scratch = this x the largest convolution's
            max(input, output) bytes. 0 on CPU: oneDNN's direct 3D convolutions (forward
            and both backward passes) allocate no workspace tensor (a profiler trace of
            every allocation of the step shows none); cuDNN's algorithms on a GPU do (1.0,
            about one activation, was the previous, unmeasured, default).
        norm_saved_tensors: full-size float32 tensors a norm layer saves (its upcast
            input). Under a float32 policy the first one is the conv output itself; under
            mixed precision the trace shows the float32 upcast kept and the low-precision
            conv output freed. 2.0 would model an implementation that also keeps the
            normalised output (Keras' GroupNormalization does not).
        norm_forward_scratch_tensors: full-size float32 temporaries in a norm forward
            besides its output: one, the squared difference of the variance (freed before
            the output is written) or, under mixed precision, the float32 normalised
            output before its downcast.
        norm_backward_scratch_tensors: full-size float32 temporaries in a norm backward
            besides the gradients of its input and output: one (the trace shows ``dy``,
            ``dy * inv`` and the tiled statistics gradient alive at once, then their sum).
        trilinear_scratch_factor: transient of TrilinearUpSampling3D as a multiple of
            its output (the shifted copies and the interleaved stack of the last axis).
            Not measured (the default model up-samples by transposed convolution).
        loss_tensors: head-output-sized float32 tensors alive in the loss step besides
            the head output and its gradient: clipped probabilities, ``1 - p``, the logs,
            the reciprocal and products of the BCE gradient, the tiled Dice gradients and
            clip's two boolean masks (a quarter each) -- 8.5 at the worst moment measured.
        prefetched_batches: extra batches held by the input pipeline in the same memory
            (0 on a GPU, where tf.data buffers live in host RAM; the prefetch depth when
            planning host RAM on the CPU backend).
        backward_flops_factor: backward FLOPs of a block / its forward FLOPs (a conv's
            backward is two convs); used to cost how much transfer compute can hide.
        rebuild_runtime_bytes: added once any block is recomputed or offloaded: the
            traced recompute graphs (each wrapped block's backward traces its forward
            again). Fitted: 25 MB.
        rebuild_fragmentation: the share of the largest block's rebuilt internals that
            stays resident beyond the allocator's peak for the rest of the run. Rebuilt
            tensors leave chunks of their sizes in the BFC pool that differently sized
            later tensors only partly reuse; the pool's touched pages grow over the
            first steps (RSS +0.03..+0.08 GB after step 1 at half resolution while the
            allocator's peak stays put) and never shrink. Fitted: 0.15.
        conv_weight_grad_scratch: memory oneDNN allocates itself (outside TensorFlow's
            allocator) for a 3x3x3 convolution's gradient by weights, in units of one
            sample's input plus one im2col slice ``cin x 27 x y x z`` (the gemm
            implementation's transposed input copy and column buffer); the largest one is
            added to the step. 0 with AVX-512 (direct kernels, no such buffer); 1 on
            AVX2-only CPUs, where oneDNN picks ``gemm:jit`` for it (RSS beyond the
            allocator's peak +0.55 GB at full resolution, 8 filters, against 0.50 GB for
            ``dec0``'s first convolution by this formula).
    """

    runtime_bytes: int = 0
    runtime_bytes_per_conv: int = 8_000_000
    runtime_bytes_per_conv_filter: int = 0
    activation_factor: float = 1.0
    workspace_factor: float = 0.0
    norm_saved_tensors: float = 1.0
    norm_forward_scratch_tensors: float = 1.0
    norm_backward_scratch_tensors: float = 1.0
    trilinear_scratch_factor: float = 2.0
    loss_tensors: float = 8.5
    prefetched_batches: int = 0
    backward_flops_factor: float = 2.0
    rebuild_runtime_bytes: int = 25_000_000
    rebuild_fragmentation: float = 0.15
    conv_weight_grad_scratch: float = 0.0

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"MemoryModel.{f.name} must be a number >= 0, got {value!r}.")
        if self.norm_saved_tensors < 1:
            raise ValueError(
                f"MemoryModel.norm_saved_tensors must be >= 1 (a norm layer keeps at least its input), "
                f"got {self.norm_saved_tensors!r}."
            )


#: The calibrated CPU coefficients per instruction set oneDNN runs on (see
#: :mod:`brats_seg.cpu`). The defaults of :class:`MemoryModel` were measured on an AVX-512
#: CPU (Sapphire Rapids). On an AVX2-only CPU (AMD EPYC) oneDNN computes the gradient by
#: weights with its gemm implementation and scratch of its own, JIT-compiles more kernel
#: variants per convolution, and the pool keeps more of the rebuilt tensors' pages; the
#: three are fitted on a calibration grid and checked on points it did not include
#: (docs/lms_calibration.md, "AVX2-only CPUs").
CPU_MEMORY_MODELS: dict[str, MemoryModel] = {
    "avx512": MemoryModel(),
    "avx2": MemoryModel(conv_weight_grad_scratch=1.0, runtime_bytes_per_conv=8_500_000,
                        runtime_bytes_per_conv_filter=120_000, rebuild_runtime_bytes=0, rebuild_fragmentation=0.95),
}


def memory_model_for(device: str, isa: str | None = None) -> MemoryModel:
    """The coefficients for the device a run trains on.

    Args:
        device: ``CPU`` or ``GPU``.
        isa: the CPU's instruction set (``avx512`` | ``avx2`` | ``other``); detected when None.
            A CPU with neither is planned as AVX2 (the larger of the two presets).

    Returns:
        The CPU preset of the host's instruction set, or the uncalibrated GPU default.
    """
    if device != "CPU":
        return MemoryModel()
    if isa is None:
        from brats_seg.cpu import cpu_isa

        isa = cpu_isa()
    return CPU_MEMORY_MODELS.get(isa, CPU_MEMORY_MODELS["avx2"])


# ---------------------------------------------------------------------------------------
# Cost tables
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LayerCost:
    """One layer of a block: what it reads, writes and keeps for backward.

    Attributes:
        name: Keras layer name (``enc0_conv1``); casts inserted by Keras get ``*_cast``.
        kind: a key of :data:`SAVED_FOR_BACKWARD`.
        inputs: tensor names read.
        output: tensor name written.
        saved: tensor names kept for backward (under ``keep``).
        creates: extra tensors the layer materialises besides its output (float32
            upcast, statistics), all named in ``saved`` or transient.
        forward_flops: forward FLOPs for the whole batch.
        params: weights (trainable and not).
        trainable_params: trainable weights.
        forward_scratch_bytes: unnamed temporaries while the layer runs forward.
        backward_scratch_bytes: unnamed temporaries while it runs backward.
        workspace_ref_bytes: max(input, output) bytes for convolutions (workspace), else 0.
        weight_grad_scratch_ref_bytes: for 3x3x3 convolutions, one sample's input plus
            one im2col slice (see ``MemoryModel.conv_weight_grad_scratch``), else 0.
    """

    name: str
    kind: str
    inputs: tuple[str, ...]
    output: str
    saved: tuple[str, ...]
    creates: tuple[str, ...] = ()
    forward_flops: float = 0.0
    params: int = 0
    trainable_params: int = 0
    forward_scratch_bytes: int = 0
    backward_scratch_bytes: int = 0
    workspace_ref_bytes: int = 0
    weight_grad_scratch_ref_bytes: int = 0


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
        saved: every tensor the layers keep for backward under ``keep``.
        keep_saved_bytes: bytes of ``saved`` (its inputs and output included).
        internal_saved_bytes: bytes of ``saved`` that are neither inputs nor the output
            (what ``recompute``/``offload`` drop in forward and rebuild in backward).
        forward_working_keep_bytes: unsaved internals + scratch at the worst layer, forward, keep.
        forward_working_drop_bytes: internals + scratch at the worst layer, forward, nothing saved.
        backward_working_bytes: internal gradients + scratch at the worst layer, backward.
        forward_flops: forward FLOPs (= FLOPs recomputed under recompute/offload).
        recomputable: False when a layer writes state in forward (BatchNormalization's
            moving statistics would be updated twice): such a block is always kept, as
            ``brats_seg.lms.offload`` refuses to recompute it.
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
    name: str, inputs: Sequence[str], output: str, layers: list[LayerCost], tensor_bytes: dict[str, int],
    skip_input: str | None = None, recomputable: bool = True, tail_start: int | None = None,
) -> BlockCost:
    """Derive a block's memory quantities from its layer table."""
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
        """Backward through ``part`` layer by layer (last first): what layers up to the
        current one saved, plus the current layer's working set."""
        return max(internal_saved(part[: k + 1]) + layer_backward(part[k]) for k in range(len(part)))

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
        backward_working_bytes=max(layer_backward(layer) for layer in layers),
        forward_flops=sum(layer.forward_flops for layer in layers),
        recomputable=recomputable,
        **tail_fields,
    )


# Layers without weights: kind -> (what they save for backward, forward FLOPs per output
# element, or per input element for pool), as SAVED_FOR_BACKWARD says.
_WEIGHTLESS = {
    "cast": ("", 0.0),
    "relu": ("out", RELU_FLOPS_PER_ELEMENT),
    "pool": ("in+out", POOL_FLOPS_PER_INPUT_ELEMENT),
    "concat": ("", 0.0),
    "up_trilinear": ("", TRILINEAR_FLOPS_PER_OUTPUT_ELEMENT),
    "sigmoid": ("out", SIGMOID_FLOPS_PER_ELEMENT),
}


class _BlockCosting:
    """Prices the layers of one topology block, in call order (helper of compute_network_cost)."""

    def __init__(self, block: BlockSpec, tensor_bytes: Mapping[str, int], input_shape: Sequence[int], batch: int,
                 mm: MemoryModel):
        self.block, self.input_shape, self.batch, self.mm = block, tuple(input_shape), batch, mm
        self.tensors: dict[str, int] = {t.name: tensor_bytes[t.name] for t in block.inputs}
        self.layers: list[LayerCost] = []

    def voxels(self, t: TensorSpec) -> int:
        return math.prod(self.input_shape) // 8**t.level

    def add_tensor(self, t: TensorSpec) -> str:
        self.tensors[t.name] = self.batch * self.voxels(t) * t.channels * DTYPE_BYTES[t.dtype]
        return t.name

    def conv(self, layer: LayerSpec) -> None:
        """``conv`` and ``up_transpose``: a convolution saves its input; FLOPs counted exactly."""
        x, y = layer.inputs[0], layer.output
        self.add_tensor(y)
        cin, cout, k = x.channels, y.channels, layer.kernel
        if layer.kind == "up_transpose":  # stride k: each output voxel gets one kernel tap per input channel
            flops = 2.0 * cin * cout * self.voxels(y) * self.batch
        else:
            flops = 2.0 * k**3 * cin * cout * self.voxels(y) * self.batch
        # gemm weight-gradient scratch of a 3x3x3 conv: one sample's input plus one y-z im2col slice
        slice_voxels = self.voxels(y) // y.shape(self.input_shape)[0]
        grad_scratch = cin * (self.voxels(y) + k**3 * slice_voxels) * DTYPE_BYTES[y.dtype] if layer.kind == "conv" \
            and k > 1 else 0
        self.layers.append(LayerCost(
            name=layer.name, kind=layer.kind, inputs=(x.name,), output=y.name, saved=(x.name,), forward_flops=flops,
            params=layer.params, trainable_params=layer.trainable_params,
            workspace_ref_bytes=max(self.tensors[x.name], self.tensors[y.name]),
            weight_grad_scratch_ref_bytes=grad_scratch,
        ))

    def norm(self, layer: LayerSpec) -> None:
        """Saves its input upcast to float32 and its statistics (see ``MemoryModel.norm_saved_tensors``)."""
        mm, x, y = self.mm, layer.inputs[0], layer.output
        self.add_tensor(y)
        f32_bytes = self.batch * self.voxels(y) * y.channels * FLOAT32_BYTES
        # Statistics per (sample, group): mean and 1/std. Batch norm's per-channel statistics
        # are counted the same way (a slight over-count of a few bytes per channel).
        stats = f"{y.name}_stats"
        self.tensors[stats] = self.batch * 1 * (2 * layer.groups) * FLOAT32_BYTES
        saved, creates = [stats], [stats]
        # Under float32 the first saved tensor is the input itself; otherwise an upcast copy.
        own_copies = mm.norm_saved_tensors - (1 if x.dtype == "float32" else 0)
        if x.dtype == "float32":
            saved.append(x.name)
        if own_copies > 0:
            copy = f"{y.name}_f32"
            self.tensors[copy] = int(round(own_copies * f32_bytes))
            saved.append(copy)
            creates.append(copy)
        self.layers.append(LayerCost(
            name=layer.name, kind="norm", inputs=(x.name,), output=y.name, saved=tuple(saved), creates=tuple(creates),
            forward_flops=NORM_FLOPS_PER_ELEMENT * self.batch * self.voxels(y) * y.channels,
            params=layer.params, trainable_params=layer.trainable_params,
            forward_scratch_bytes=int(mm.norm_forward_scratch_tensors * f32_bytes),
            backward_scratch_bytes=int(mm.norm_backward_scratch_tensors * f32_bytes),
        ))

    def weightless(self, name: str, kind: str, inputs: Sequence[TensorSpec], y: TensorSpec) -> None:
        """A layer without weights, by the rule of its kind in :data:`_WEIGHTLESS`."""
        self.add_tensor(y)
        roles, flops_per_element = _WEIGHTLESS[kind]
        counted = inputs[0] if kind == "pool" else y  # pool: FLOPs per input element
        flops = flops_per_element * self.batch * self.voxels(counted) * counted.channels if flops_per_element else 0.0
        saved = (tuple(t.name for t in inputs) if "in" in roles else ()) + ((y.name,) if "out" in roles else ())
        scratch = self.mm.trilinear_scratch_factor if kind == "up_trilinear" else 0.0
        self.layers.append(LayerCost(
            name=name, kind=kind, inputs=tuple(t.name for t in inputs), output=y.name, saved=saved,
            forward_flops=flops, forward_scratch_bytes=int(scratch * self.tensors[y.name]),
        ))

    def nest(self, layer: LayerSpec) -> None:
        """NestedRegionSigmoid: the sigmoids (output saved), then each region times its parent's
        probability (both factors and the product saved)."""
        y, block = layer.output, self.block.name
        probabilities = TensorSpec(f"{block}/sigmoid", y.channels, y.level, y.dtype)
        self.weightless(layer.name, "sigmoid", layer.inputs, probabilities)
        self.add_tensor(y)
        self.layers.append(LayerCost(
            name=f"{block}_nest", kind="nest", inputs=(probabilities.name,), output=y.name,
            saved=(probabilities.name, y.name), forward_flops=self.batch * self.voxels(y) * y.channels,
        ))

    def add(self, layer: LayerSpec) -> None:
        if layer.kind in ("conv", "up_transpose"):
            self.conv(layer)
        elif layer.kind == "norm":
            self.norm(layer)
        elif layer.kind == "nest":
            self.nest(layer)
        else:
            self.weightless(layer.name, layer.kind, layer.inputs, layer.output)

    def finish(self) -> BlockCost:
        tail_start = None
        for i, layer in enumerate(self.block.layers):
            if i == self.block.tail_start:
                tail_start = len(self.layers)
            self.add(layer)
        recomputable = not any(layer.kind == "norm" and layer.norm == "batch" for layer in self.block.layers)
        inputs = [t.name for t in self.block.inputs]
        skip = self.block.skip.name if self.block.skip else None
        return _finish_block(self.block.name, inputs, self.block.output.name, self.layers, self.tensors, skip,
                             recomputable, tail_start)


@dataclass(frozen=True)
class NetworkCost:
    """Cost tables of one workload (model, shape, batch, dtype policy, optimizer).

    Attributes:
        blocks: block costs in forward order.
        tensor_bytes: bytes of every block-output tensor (and ``image``).
        producer: block index producing each tensor (``image``: -1).
        consumers: block indices reading each tensor (the loss is index ``len(blocks)``).
        pinned: tensors that stay alive for the whole step whatever the plan (``image``,
            an argument of the training step), counted in ``persistent["data_bytes"]``.
        persistent: bytes alive the whole step, by kind (``runtime_bytes``,
            ``weight_bytes``, ``weight_gradient_bytes``, ``optimizer_slot_bytes``,
            ``data_bytes``, ``workspace_bytes``).
        loss_bytes: transient bytes of the loss step.
        params: weights; trainable_params: trainable weights.
        memory_model: the coefficients used.
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

    @property
    def block_names(self) -> list[str]:
        return [b.name for b in self.blocks]

    @property
    def persistent_bytes(self) -> int:
        return sum(self.persistent.values())


def compute_network_cost(
    model_cfg: ModelConfig,
    input_shape: Sequence[int],
    batch_size: int,
    policy: str = "float32",
    optimizer: str = "adam",
    memory_model: MemoryModel | None = None,
) -> NetworkCost:
    """Build the cost tables of the U-Net for one workload.

    Args:
        model_cfg: depth, base_filters, norm, groups, upsample, in/out channels.
        input_shape: spatial shape ``(x, y, z)``, each divisible by ``2**depth``.
        batch_size: samples per step.
        policy: ``float32`` | ``mixed_float16`` | ``mixed_bfloat16`` (or fp32/fp16/bf16).
        optimizer: a key of :data:`OPTIMIZER_SLOTS`.
        memory_model: coefficients; default :class:`MemoryModel()`.

    Returns:
        The :class:`NetworkCost`.

    Raises:
        ValueError: a bad value, named, with what to use instead.
    """
    mm = memory_model or MemoryModel()
    topology = unet_topology(model_cfg, policy)  # checks the model config and the policy
    input_shape = check_input_shape(input_shape, model_cfg.depth)
    check_batch_size(batch_size)
    if optimizer not in OPTIMIZER_SLOTS:
        raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZER_SLOTS)}, got {optimizer!r}.")
    batch, voxels = batch_size, math.prod(input_shape)
    image_bytes = batch * voxels * model_cfg.in_channels * DTYPE_BYTES[topology.image.dtype]
    globals_: dict[str, int] = {topology.image.name: image_bytes}  # block outputs (and the image)
    blocks: list[BlockCost] = []
    for spec in topology.blocks:
        blocks.append(_BlockCosting(spec, globals_, input_shape, batch, mm).finish())
        globals_[spec.name] = blocks[-1].output_bytes

    n = len(blocks)
    producer = {"image": -1, **{blk.output: i for i, blk in enumerate(blocks)}}
    consumers: dict[str, list[int]] = {t: [] for t in globals_}
    for i, blk in enumerate(blocks):
        for t in blk.inputs:
            consumers[t].append(i)
    consumers["head"].append(n)  # the loss

    params = sum(blk.params for blk in blocks)
    trainable = sum(layer.trainable_params for blk in blocks for layer in blk.layers)
    labels_bytes = batch * voxels * model_cfg.out_channels * DATA_BYTES_PER_ELEMENT
    workspace_ref = max(layer.workspace_ref_bytes for blk in blocks for layer in blk.layers)
    weight_grad_scratch_ref = max(layer.weight_grad_scratch_ref_bytes for blk in blocks for layer in blk.layers)
    persistent = {
        "runtime_bytes": int(mm.runtime_bytes + (mm.runtime_bytes_per_conv + mm.runtime_bytes_per_conv_filter
                                                  * model_cfg.base_filters) * sum(
            1 for blk in blocks for layer in blk.layers if layer.kind in ("conv", "up_transpose"))),
        "weight_bytes": params * FLOAT32_BYTES,
        "weight_gradient_bytes": trainable * FLOAT32_BYTES,
        "optimizer_slot_bytes": OPTIMIZER_SLOTS[optimizer] * trainable * FLOAT32_BYTES,
        "data_bytes": (image_bytes + labels_bytes) * (1 + int(mm.prefetched_batches)),
        "workspace_bytes": int(mm.workspace_factor * workspace_ref),
        "library_scratch_bytes": int(mm.conv_weight_grad_scratch * weight_grad_scratch_ref),
    }
    return NetworkCost(
        blocks=tuple(blocks),
        tensor_bytes=globals_,
        producer=producer,
        consumers={t: tuple(c) for t, c in consumers.items()},
        pinned=frozenset({"image"}),
        persistent=persistent,
        loss_bytes=int(mm.loss_tensors * globals_["head"]),
        params=params,
        trainable_params=trainable,
        memory_model=mm,
    )


# ---------------------------------------------------------------------------------------
# Timeline simulation
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Timeline:
    """Predicted device bytes per step of one training step.

    Steps: ``forward <block>`` for each block in order, ``loss``, ``backward <block>``
    in reverse order.

    Attributes:
        steps: step labels.
        total_bytes: predicted bytes in use at each step's worst moment.
        kept_bytes: activations kept across steps (saved tensors, inputs, skips).
        gradient_bytes: activation gradients alive (block outputs' gradients).
        transient_bytes: the working set of the block (or loss) being run.
        persistent: bytes alive the whole step, by kind.
    """

    steps: tuple[str, ...]
    total_bytes: tuple[int, ...]
    kept_bytes: tuple[int, ...]
    gradient_bytes: tuple[int, ...]
    transient_bytes: tuple[int, ...]
    persistent: Mapping[str, int]

    @property
    def peak_index(self) -> int:
        return max(range(len(self.total_bytes)), key=self.total_bytes.__getitem__)

    @property
    def peak_bytes(self) -> int:
        return self.total_bytes[self.peak_index]

    @property
    def peak_at(self) -> str:
        return self.steps[self.peak_index]

    def breakdown(self) -> dict[str, int]:
        """Bytes by kind at the peak step."""
        i = self.peak_index
        return {
            **self.persistent,
            "kept_activation_bytes": self.kept_bytes[i],
            "activation_gradient_bytes": self.gradient_bytes[i],
            "transient_bytes": self.transient_bytes[i],
        }


def _offloadable(net: NetworkCost, tensor: str, size_bytes: int) -> bool:
    return tensor not in net.pinned and net.tensor_bytes[tensor] >= size_bytes


def tail_kept(net: NetworkCost, i: int, policy: str) -> bool:
    """Whether block ``i`` under ``policy`` keeps its tail (last conv unit) un-recomputed.

    True for the last block before the head when it is recomputed or offloaded: its
    backward follows its forward at once (only the head and the loss run in between),
    so recomputing the tail would save nothing across the step, only cost its FLOPs,
    while recomputing just the front lowers the block's own backward peak (the tail's
    tensors are freed before the front is rebuilt). As PyTorch's
    ``checkpoint_sequential`` leaves its last segment un-checkpointed.
    """
    blk = net.blocks[i]
    return policy != "keep" and blk.tail_start is not None and i == len(net.blocks) - 2


def _recomputed_flops(net: NetworkCost, i: int, policy: str) -> float:
    blk = net.blocks[i]
    if policy == "keep":
        return 0.0
    return blk.forward_flops - (blk.tail_forward_flops if tail_kept(net, i, policy) else 0.0)


def simulate(
    net: NetworkCost,
    policies: Sequence[str],
    skip_offloaded: Sequence[bool] | None = None,
    size_bytes: int = DEFAULT_SIZE_BYTES,
    prefetch: int = DEFAULT_PREFETCH,
) -> Timeline:
    """Simulate the device memory of one training step under a per-block plan.

    Args:
        net: cost tables from :func:`compute_network_cost`.
        policies: ``keep`` | ``recompute`` | ``offload`` per block, forward order.
        skip_offloaded: per block; True on ``dec{l}`` holds its skip tensor in host
            memory between ``enc{l+1}``'s forward and (``prefetch`` blocks before)
            ``dec{l}``'s forward. Ignored elsewhere.
        size_bytes: tensors smaller than this are never offloaded.
        prefetch: blocks ahead at which an offloaded tensor is copied back.

    Returns:
        The :class:`Timeline`.
    """
    blocks, n = net.blocks, len(net.blocks)
    if len(policies) != n:
        raise ValueError(f"need one policy per block ({n}), got {len(policies)}.")
    bad = [p for p in policies if p not in POLICIES]
    if bad:
        raise ValueError(f"policies must be among {', '.join(POLICIES)}, got {bad[0]!r}.")
    skip_offloaded = list(skip_offloaded or [False] * n)
    steps = n * 2 + 1  # t < n forward block t; t == n loss; t > n backward block 2n - t

    def back(i: int) -> int:
        return 2 * n - i

    kept = [0] * steps
    grads = [0] * steps
    transient = [0] * steps
    largest_rebuild = 0  # internals a recomputed block rebuilds in its backward

    def add(arr: list[int], nbytes: int, intervals: Iterable[tuple[int, int]]) -> None:
        alive = [False] * steps
        for start, end in intervals:
            for t in range(max(0, start), min(steps - 1, end) + 1):
                alive[t] = True
        for t in range(steps):
            if alive[t]:
                arr[t] += nbytes

    for tensor, nbytes in net.tensor_bytes.items():
        if tensor in net.pinned:
            continue
        p, cs = net.producer[tensor], net.consumers[tensor]
        intervals: list[tuple[int, int]] = []
        # Forward: alive until its last forward reader, unless a skip held on the host.
        skip_reader = next((c for c in cs if c < n and blocks[c].skip_input == tensor), None)
        if skip_reader is not None and skip_offloaded[skip_reader] and _offloadable(net, tensor, size_bytes):
            others = [c for c in cs if c != skip_reader]
            intervals.append((p, max(others, default=p)))
            intervals.append((max(p + 1, skip_reader - prefetch), skip_reader))
        else:
            intervals.append((p, max(cs)))
        if policies[p] == "keep" and tensor in blocks[p].saved:
            intervals.append((p, back(p)))
        for c in cs:
            if c == n:  # the loss: consumes and differentiates within its own step
                continue
            pol = policies[c]
            if pol == "keep":
                if tensor in blocks[c].saved:
                    intervals.append((c, back(c)))
            elif pol == "recompute" or not _offloadable(net, tensor, size_bytes):
                intervals.append((c, back(c)))
            else:  # offloaded: back on the device `prefetch` blocks before its backward
                intervals.append((max(n, back(c) - prefetch), back(c)))
        add(kept, nbytes, intervals)
        # Its gradient: from the first reader's backward (accumulated) to its producer's backward.
        add(grads, nbytes, [(back(max(cs)), back(p))])

    for i, blk in enumerate(blocks):
        if policies[i] == "keep":
            add(kept, blk.internal_saved_bytes, [(i, back(i))])
            transient[i] += blk.forward_working_keep_bytes
            transient[back(i)] += blk.backward_working_bytes
        elif tail_kept(net, i, policies[i]):
            # The tail's saved tensors live until its backward, which runs first in the
            # block's backward step; the front is rebuilt once they are freed.
            add(kept, blk.tail_saved_bytes, [(i, back(i) - 1)])
            transient[i] += blk.forward_working_drop_bytes
            transient[back(i)] += max(blk.tail_backward_bytes, blk.front_backward_bytes)
            largest_rebuild = max(largest_rebuild, blk.internal_saved_bytes - blk.tail_saved_bytes)
        else:
            transient[i] += blk.forward_working_drop_bytes
            transient[back(i)] += blk.internal_saved_bytes + blk.backward_working_bytes
            largest_rebuild = max(largest_rebuild, blk.internal_saved_bytes)
    transient[n] += net.loss_bytes

    mm = net.memory_model
    factor = mm.activation_factor
    # Rebuilt tensors leave freed chunks of their sizes in the pool that later, differently
    # sized tensors only partly reuse: the largest rebuild's share stays resident.
    rebuild = int(mm.rebuild_runtime_bytes + mm.rebuild_fragmentation * largest_rebuild) if largest_rebuild else 0
    fixed = net.persistent_bytes
    total = tuple(int(fixed + factor * (kept[t] + grads[t] + transient[t]) + rebuild) for t in range(steps))
    labels = (
        *(f"forward {b.name}" for b in blocks),
        "loss",
        *(f"backward {b.name}" for b in reversed(blocks)),
    )

    def scaled(arr: list[int]) -> tuple[int, ...]:
        return tuple(int(factor * v) for v in arr)

    return Timeline(labels, total, scaled(kept), scaled(grads), scaled(transient), dict(net.persistent))


# ---------------------------------------------------------------------------------------
# Per-block accounting and overhead
# ---------------------------------------------------------------------------------------


@dataclass
class BlockPlan:
    """One row of a plan.

    Attributes:
        block: block name.
        policy: ``keep`` | ``recompute`` | ``offload``.
        kept_bytes: device bytes this block needs kept from its forward to its backward
            (keep: every tensor its layers save; recompute: its inputs; offload: its
            inputs under ``lms.size``). Neighbours share tensors (a block's output is
            the next one's input), so the column does not add up to the peak.
        moved_bytes: bytes crossing the host link per step (each offloaded tensor twice:
            to the host in forward, back in backward or before the skip's reader).
        recomputed_flops: forward FLOPs run again in backward.
        skip_offloaded: ``dec{l}`` only: its skip tensor (``enc{l}``'s output) waits in
            host memory during the middle of the forward pass; :attr:`Plan.offload_skips`
            lists the producers, the names ``brats_seg.lms.offload`` takes.
        keep_bytes: what ``keep`` would keep (for comparison).
        input_bytes: bytes of the block's inputs.
        skip_bytes: bytes of the skip input (``dec{l}``), else 0.
        forward_flops: forward FLOPs of the block.
        overhead_s: predicted extra seconds per step (recompute + transfers not hidden).
        tail_kept: the block's last conv unit is kept, only the rest is recomputed /
            offloaded (the last block before the head; see :func:`tail_kept`).
            :attr:`Plan.keep_tails` lists them for ``brats_seg.lms.offload``.
    """

    block: str
    policy: str
    kept_bytes: int
    moved_bytes: int
    recomputed_flops: float
    skip_offloaded: bool = False
    keep_bytes: int = 0
    input_bytes: int = 0
    skip_bytes: int = 0
    forward_flops: float = 0.0
    overhead_s: float = 0.0
    tail_kept: bool = False


@dataclass(frozen=True)
class _Costing:
    """How the overhead of a plan is priced."""

    size_bytes: int
    prefetch: int
    host_bandwidth_bps: float
    device_flops: float


def _forward_s(net: NetworkCost, i: int, costing: _Costing) -> float:
    return net.blocks[i].forward_flops / costing.device_flops


def _block_row(net: NetworkCost, i: int, policy: str, skip_offloaded: bool, costing: _Costing) -> BlockPlan:
    """Account one block under a policy: kept/moved bytes, recomputed FLOPs, overhead seconds."""
    blk, n = net.blocks[i], len(net.blocks)
    bw, back_factor = costing.host_bandwidth_bps, net.memory_model.backward_flops_factor
    moved = [t for t in blk.inputs if _offloadable(net, t, costing.size_bytes)] if policy == "offload" else []
    recomputed = _recomputed_flops(net, i, policy)
    tail = tail_kept(net, i, policy)
    if policy == "keep":
        kept = blk.keep_saved_bytes
    else:
        kept = sum(blk.tensor_bytes[t] for t in blk.inputs if t not in moved) + (blk.tail_saved_bytes if tail else 0)
    overhead = recomputed / costing.device_flops
    moved_one_way = sum(blk.tensor_bytes[t] for t in moved)
    if moved_one_way:
        # To host: overlaps the block's own forward. Back: overlaps the backward of the
        # `prefetch` blocks that run between the copy's issue and this block's backward.
        ahead = range(i + 1, min(n, i + 1 + costing.prefetch))
        hide_back = sum(back_factor * _forward_s(net, j, costing) for j in ahead)
        overhead += max(0.0, moved_one_way / bw - _forward_s(net, i, costing))
        overhead += max(0.0, moved_one_way / bw - hide_back)
    skip_moved = 0
    if skip_offloaded and blk.skip_input and _offloadable(net, blk.skip_input, costing.size_bytes):
        skip_moved = blk.skip_bytes
        producer = net.producer[blk.skip_input]
        hide_out = sum(_forward_s(net, j, costing) for j in range(producer + 1, i))
        hide_in = sum(_forward_s(net, j, costing) for j in range(max(producer + 1, i - costing.prefetch), i))
        overhead += max(0.0, skip_moved / bw - hide_out) + max(0.0, skip_moved / bw - hide_in)
    return BlockPlan(
        block=blk.name,
        policy=policy,
        kept_bytes=int(kept),
        moved_bytes=int(2 * (moved_one_way + skip_moved)),
        recomputed_flops=recomputed,
        skip_offloaded=bool(skip_moved),
        tail_kept=tail,
        keep_bytes=blk.keep_saved_bytes,
        input_bytes=blk.input_bytes,
        skip_bytes=blk.skip_bytes,
        forward_flops=blk.forward_flops,
        overhead_s=overhead,
    )


# ---------------------------------------------------------------------------------------
# The plan
# ---------------------------------------------------------------------------------------


def format_bytes(nbytes: float) -> str:
    """Human bytes, SI: ``12.35 GB``, ``840.2 MB``, ``3.1 kB``, ``512 B``."""
    nbytes = float(nbytes)
    for unit, scale, digits in (("TB", 1e12, 2), ("GB", 1e9, 2), ("MB", 1e6, 1), ("kB", 1e3, 1)):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:.{digits}f} {unit}"
    return f"{int(nbytes)} B"


def _gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:.2f} GB"


def _shape_str(shape: Sequence[int]) -> str:
    return "x".join(str(s) for s in shape)


@dataclass
class Plan:
    """A per-block LMS plan and its predictions.

    Attributes:
        strategy: ``off`` | ``recompute`` | ``offload`` | ``auto``.
        blocks: one :class:`BlockPlan` per block, forward order.
        predicted_peak_bytes: predicted device peak of one training step.
        peak_at: the step where it happens (``backward dec0``).
        limit_bytes: the budget.
        fits: ``predicted_peak_bytes <= limit_bytes``.
        peak_breakdown: bytes by kind at the peak step.
        inputs: the workload and costing inputs (model config, shape, batch, ...).
        timeline: ``(step, bytes)`` per step.
        strategies: predictions of the four strategies (see :func:`compare_strategies`).
    """

    strategy: str
    blocks: list[BlockPlan]
    predicted_peak_bytes: int
    peak_at: str
    limit_bytes: int
    fits: bool
    peak_breakdown: dict[str, int] = field(default_factory=dict)
    inputs: dict[str, Any] = field(default_factory=dict)
    timeline: list[tuple[str, int]] = field(default_factory=list)
    strategies: dict[str, Any] | None = None

    @property
    def recomputed_flops(self) -> float:
        return sum(b.recomputed_flops for b in self.blocks)

    @property
    def moved_bytes(self) -> int:
        return sum(b.moved_bytes for b in self.blocks)

    @property
    def overhead_s(self) -> float:
        return sum(b.overhead_s for b in self.blocks)

    @property
    def totals(self) -> dict[str, float]:
        return {
            "recomputed_flops": self.recomputed_flops,
            "moved_bytes": self.moved_bytes,
            "overhead_s": self.overhead_s,
        }

    @property
    def policies(self) -> dict[str, str]:
        """Block name -> policy, the mapping the LMS block wrapper reads."""
        return {b.block: b.policy for b in self.blocks}

    @property
    def offload_skips(self) -> set[str]:
        """Producers (``enc{l}``) of the skips held on the host: ``BlockWrapper(offload_skips=...)``."""
        return {f"enc{b.block.removeprefix('dec')}" for b in self.blocks if b.skip_offloaded}

    @property
    def keep_tails(self) -> set[str]:
        """Blocks whose last conv unit is kept: ``BlockWrapper(keep_tails=...)``."""
        return {b.block for b in self.blocks if b.tail_kept}

    def entry(self, block: str) -> BlockPlan:
        """The row of ``block``; KeyError naming the known blocks otherwise."""
        for b in self.blocks:
            if b.block == block:
                return b
        raise KeyError(f"no block {block!r} in the plan; blocks are {', '.join(b.block for b in self.blocks)}.")

    def format_table(self) -> str:
        """A fixed-width table for logs and the terminal."""
        i = self.inputs
        verdict = "<=" if self.fits else "EXCEEDS"
        lines = [
            f"LMS plan: strategy {self.strategy}, predicted peak {_gb(self.predicted_peak_bytes)} "
            f"(at {self.peak_at}) {verdict} limit {_gb(self.limit_bytes)}",
        ]
        if i:
            m = i.get("model", {})
            lines.append(
                f"model depth {m.get('depth')}, base {m.get('base_filters')}, {m.get('norm')} norm, "
                f"{m.get('upsample')} up; input {_shape_str(i.get('input_shape', ()))} x{m.get('in_channels')}, "
                f"batch {i.get('batch_size')}, {i.get('policy')}, {i.get('optimizer')}"
            )
        header = (f"{'block':<11} {'policy':<10} {'kept':>10} {'moved':>10} {'recompute':>13} "
                  f"{'skip>host':>9} {'overhead':>10}")
        lines += [header, "-" * len(header)]
        for b in self.blocks:
            skip = "yes" if b.skip_offloaded else "-"
            policy = b.policy + ("*" if b.tail_kept else "")
            lines.append(
                f"{b.block:<11} {policy:<10} {format_bytes(b.kept_bytes):>10} {format_bytes(b.moved_bytes):>10} "
                f"{b.recomputed_flops / 1e9:>7.1f} GFLOP {skip:>9} {b.overhead_s * 1e3:>7.1f} ms"
            )
        lines.append("-" * len(header))
        lines.append(
            f"{'total':<11} {'':<10} {'':>10} {format_bytes(self.moved_bytes):>10} "
            f"{self.recomputed_flops / 1e9:>7.1f} GFLOP {'':>9} {self.overhead_s * 1e3:>7.1f} ms"
        )
        if self.keep_tails:
            lines.append(f"* {', '.join(sorted(self.keep_tails))}: last conv unit kept (its backward follows at once), "
                         "the rest recomputed")
        if self.peak_breakdown:
            parts = ", ".join(f"{k.removesuffix('_bytes').replace('_', ' ')} {format_bytes(v)}"
                              for k, v in self.peak_breakdown.items())
            lines.append(f"at the peak: {parts}")
        if self.strategies:
            lines.append("strategies: " + "; ".join(
                f"{name} {_gb(s['predicted_peak_bytes'])}" if s.get("predicted_peak_bytes") is not None
                else f"{name} n/a ({s.get('reason', '')})"
                for name, s in self.strategies.items()
            ))
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: ``limit_bytes``, ``strategies``, ``plan`` (rows) and the rest."""
        return {
            "limit_bytes": int(self.limit_bytes),
            "strategy": self.strategy,
            "fits": bool(self.fits),
            "predicted_peak_bytes": int(self.predicted_peak_bytes),
            "peak_at": self.peak_at,
            "peak_breakdown": dict(self.peak_breakdown),
            "totals": self.totals,
            "strategies": self.strategies,
            "plan": [dataclasses.asdict(b) for b in self.blocks],
            "inputs": self.inputs,
            "timeline": [{"step": s, "bytes": int(v)} for s, v in self.timeline],
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Plan:
        """Inverse of :meth:`to_dict` (e.g. a plan saved in a run directory)."""
        try:
            return cls(
                strategy=data["strategy"],
                blocks=[BlockPlan(**row) for row in data["plan"]],
                predicted_peak_bytes=int(data["predicted_peak_bytes"]),
                peak_at=data["peak_at"],
                limit_bytes=int(data["limit_bytes"]),
                fits=bool(data["fits"]),
                peak_breakdown=dict(data.get("peak_breakdown", {})),
                inputs=dict(data.get("inputs", {})),
                timeline=[(row["step"], int(row["bytes"])) for row in data.get("timeline", [])],
                strategies=data.get("strategies"),
            )
        except (KeyError, TypeError) as err:
            raise ValueError(f"not a saved LMS plan ({err!r}); re-create it with scripts/plan_memory.py.") from err

    @classmethod
    def from_json(cls, text: str) -> Plan:
        return cls.from_dict(json.loads(text))


class PlanDoesNotFitError(RuntimeError):
    """No plan fits the memory limit; the message says what would.

    Attributes:
        smallest_peak_bytes: the smallest predicted peak over the strategies allowed.
        best_strategy: the strategy achieving it.
        limit_bytes: the budget.
        max_batch_size: largest batch that fits with one of the fixed strategies allowed
            (off, recompute, and offload unless on CPU); 0: none.
        max_resolution: ``(name, shape)`` of the largest standard resolution (divisible by
            ``2**depth``) that fits at batch 1 likewise, or None.
    """

    def __init__(self, message: str, smallest_peak_bytes: int, best_strategy: str, limit_bytes: int,
                 max_batch_size: int, max_resolution: tuple[str, tuple[int, int, int]] | None):
        super().__init__(message)
        self.smallest_peak_bytes = smallest_peak_bytes
        self.best_strategy = best_strategy
        self.limit_bytes = limit_bytes
        self.max_batch_size = max_batch_size
        self.max_resolution = max_resolution


# ---------------------------------------------------------------------------------------
# Planning
# ---------------------------------------------------------------------------------------


def _fixed_config(net: NetworkCost, strategy: str, costing: _Costing) -> tuple[list[str], list[bool]]:
    """Policies and skip flags of a fixed strategy (``off``/``recompute``/``offload``)."""
    n = len(net.blocks)
    if strategy == "off":
        return ["keep"] * n, [False] * n
    # Blocks that cannot be recomputed (batch norm) are kept by every strategy.
    if strategy == "recompute":
        return ["recompute" if blk.recomputable else "keep" for blk in net.blocks], [False] * n
    # offload: every block whose input can move goes to the host, and every skip.
    policies = [
        "keep" if not blk.recomputable
        else "offload" if _can_offload(net, i, costing) else "recompute"
        for i, blk in enumerate(net.blocks)
    ]
    skips = [_can_offload_skip(net, i, costing) for i in range(n)]
    return policies, skips


def _can_offload(net: NetworkCost, i: int, costing: _Costing) -> bool:
    blk = net.blocks[i]
    return blk.recomputable and any(_offloadable(net, t, costing.size_bytes) for t in blk.inputs)


def _can_offload_skip(net: NetworkCost, i: int, costing: _Costing) -> bool:
    """``dec{l}``'s skip can wait on the host (its producer, not kept, does not pin it)."""
    skip = net.blocks[i].skip_input
    return (skip is not None and _offloadable(net, skip, costing.size_bytes)
            and net.blocks[net.producer[skip]].recomputable)


def _overhead(net: NetworkCost, policies: Sequence[str], skips: Sequence[bool], costing: _Costing) -> float:
    return sum(_block_row(net, i, p, s, costing).overhead_s for i, (p, s) in enumerate(zip(policies, skips)))


def _auto_config(net: NetworkCost, limit_bytes: int, costing: _Costing, allow_offload: bool
                 ) -> tuple[list[str], list[bool]]:
    """Greedy: from all-keep, apply the move with the most peak bytes saved per overhead
    second until the plan fits; then undo every move the fit does not need.

    Moves only ever go keep -> recompute -> offload and skip on-device -> host, and the
    loop stops only when the plan fits or no move is left; the plan with no move left
    is exactly the ``offload`` strategy (``recompute`` without offload; blocks that are
    not recomputable stay ``keep`` in both). So if that
    fits, the greedy fits. (A move usually lowers every step, but not always: under
    ``keep`` a decoder does not save its skip and the mixed-precision head does not
    save its fp16 input, while ``recompute`` must keep them for its own backward step.
    The greedy therefore prices moves by the simulated peak, not by a bytes count.)
    """
    n = len(net.blocks)
    policies, skips = ["keep"] * n, [False] * n

    def sim(p: Sequence[str], s: Sequence[bool]) -> Timeline:
        return simulate(net, p, s, costing.size_bytes, costing.prefetch)

    current = sim(policies, skips)
    cost = _overhead(net, policies, skips, costing)
    while current.peak_bytes > limit_bytes:
        moves: list[tuple[list[str], list[bool]]] = []
        for i in range(n):
            nexts = {"keep": ["recompute", "offload"], "recompute": ["offload"], "offload": []}[policies[i]]
            for new in nexts if net.blocks[i].recomputable else ():
                if new == "offload" and not (allow_offload and _can_offload(net, i, costing)):
                    continue
                moves.append((policies[:i] + [new] + policies[i + 1:], skips))
            if allow_offload and not skips[i] and _can_offload_skip(net, i, costing):
                moves.append((policies, skips[:i] + [True] + skips[i + 1:]))
        if not moves:
            break
        best_key, best = None, None
        for p, s in moves:
            t = sim(p, s)
            extra_s = max(_overhead(net, p, s, costing) - cost, 1e-12)
            saved_peak = current.peak_bytes - t.peak_bytes
            saved_area = sum(current.total_bytes) - sum(t.total_bytes)  # progress when the peak cannot move yet
            key = (saved_peak > 0, saved_peak / extra_s, saved_area / extra_s)
            if best_key is None or key > best_key:
                best_key, best = key, (p, s, t)
        policies, skips, current = list(best[0]), list(best[1]), best[2]
        cost = _overhead(net, policies, skips, costing)
    if current.peak_bytes > limit_bytes:
        return policies, skips

    # Undo moves the fit does not need, most expensive block first.
    changed = True
    while changed:
        changed = False
        order = sorted(range(n), key=lambda i: -_block_row(net, i, policies[i], skips[i], costing).overhead_s)
        for i in order:
            if skips[i]:
                s = skips[:i] + [False] + skips[i + 1:]
                if sim(policies, s).peak_bytes <= limit_bytes:
                    skips, changed = s, True
            for cheaper in ("keep", "recompute"):
                if policies[i] == cheaper or (cheaper == "recompute" and policies[i] != "offload"):
                    continue
                p = policies[:i] + [cheaper] + policies[i + 1:]
                if sim(p, skips).peak_bytes <= limit_bytes:
                    policies, changed = p, True
                    break
    return policies, skips


def _costing(size_bytes: int, prefetch: int, host_bandwidth_bps: float, device_flops: float) -> _Costing:
    if not isinstance(size_bytes, int) or size_bytes < 0:
        raise ValueError(f"lms.size must be an integer number of bytes >= 0, got {size_bytes!r}.")
    if not isinstance(prefetch, int) or prefetch < 0:
        raise ValueError(f"lms.prefetch must be an integer >= 0 (blocks ahead), got {prefetch!r}.")
    if not host_bandwidth_bps > 0:
        raise ValueError(
            f"host bandwidth must be > 0 bytes/s, got {host_bandwidth_bps!r}; check lms.host_bandwidth_gbps."
        )
    if not device_flops > 0:
        raise ValueError(f"device FLOP rate must be > 0, got {device_flops!r}; check lms.device_tflops.")
    return _Costing(size_bytes, prefetch, float(host_bandwidth_bps), float(device_flops))


def _make_plan(net: NetworkCost, strategy: str, policies: Sequence[str], skips: Sequence[bool],
               limit_bytes: int, costing: _Costing, inputs: dict[str, Any]) -> Plan:
    timeline = simulate(net, policies, skips, costing.size_bytes, costing.prefetch)
    rows = [_block_row(net, i, p, s, costing) for i, (p, s) in enumerate(zip(policies, skips))]
    return Plan(
        strategy=strategy,
        blocks=rows,
        predicted_peak_bytes=timeline.peak_bytes,
        peak_at=timeline.peak_at,
        limit_bytes=int(limit_bytes),
        fits=timeline.peak_bytes <= limit_bytes,
        peak_breakdown=timeline.breakdown(),
        inputs=inputs,
        timeline=list(zip(timeline.steps, timeline.total_bytes)),
    )


def _solve(net: NetworkCost, strategy: str, limit_bytes: int, costing: _Costing, allow_offload: bool,
           inputs: dict[str, Any]) -> Plan:
    """The plan of one strategy, whether or not it fits."""
    if strategy == "auto":
        policies, skips = _auto_config(net, limit_bytes, costing, allow_offload)
    else:
        policies, skips = _fixed_config(net, strategy, costing)
    return _make_plan(net, strategy, policies, skips, limit_bytes, costing, inputs)


def _summary(plan: Plan) -> dict[str, Any]:
    return {
        "predicted_peak_bytes": int(plan.predicted_peak_bytes),
        "recomputed_flops": plan.recomputed_flops,
        "moved_bytes": int(plan.moved_bytes),
        "overhead_s": plan.overhead_s,
        "peak_at": plan.peak_at,
        "fits": bool(plan.fits),
    }


def _inputs_dict(model_cfg, input_shape, batch_size, policy, optimizer, costing, allow_offload, mm) -> dict[str, Any]:
    return {
        "model": dataclasses.asdict(model_cfg),
        "input_shape": [int(s) for s in input_shape],
        "batch_size": batch_size,
        "policy": policy,
        "optimizer": optimizer,
        "size_bytes": costing.size_bytes,
        "prefetch": costing.prefetch,
        "host_bandwidth_bps": costing.host_bandwidth_bps,
        "device_flops": costing.device_flops,
        "allow_offload": allow_offload,
        "memory_model": dataclasses.asdict(mm),
    }


def _compare(net: NetworkCost, limit_bytes: int, costing: _Costing, allow_offload: bool, inputs: dict[str, Any],
             auto_plan: Plan | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for strategy in ("off", "recompute", "offload"):
        if strategy == "offload" and not allow_offload:
            out[strategy] = {"predicted_peak_bytes": None, "recomputed_flops": None, "moved_bytes": None,
                             "reason": "offload is not available on this device (CPU: host memory is the device)"}
            continue
        out[strategy] = _summary(_solve(net, strategy, limit_bytes, costing, allow_offload, inputs))
    auto_plan = auto_plan or _solve(net, "auto", limit_bytes, costing, allow_offload, inputs)
    if auto_plan.fits:
        out["auto"] = _summary(auto_plan)
    else:
        out["auto"] = {"predicted_peak_bytes": None, "recomputed_flops": None, "moved_bytes": None,
                       "reason": f"no plan fits the limit {_gb(limit_bytes)} (smallest peak "
                                 f"{_gb(auto_plan.predicted_peak_bytes)})"}
    return out


def _fixed_strategies(allow_offload: bool) -> tuple[str, ...]:
    return ("off", "recompute", "offload") if allow_offload else ("off", "recompute")


def _fits_with(model_cfg, shape, batch, policy, optimizer, mm, strategies, costing, limit_bytes
               ) -> tuple[bool, int]:
    """Whether any of the fixed ``strategies`` fits, and the smallest of their peaks."""
    net = compute_network_cost(model_cfg, shape, batch, policy, optimizer, mm)
    peak = min(
        simulate(net, *_fixed_config(net, strategy, costing), costing.size_bytes, costing.prefetch).peak_bytes
        for strategy in strategies
    )
    return peak <= limit_bytes, peak


def _largest_batch(model_cfg, shape, policy, optimizer, mm, strategies, costing, limit_bytes,
                   cap: int = 4096) -> tuple[int, int]:
    """Largest batch (<= cap) that fits, and its peak; (0, 0) if batch 1 does not fit."""
    ok, peak = _fits_with(model_cfg, shape, 1, policy, optimizer, mm, strategies, costing, limit_bytes)
    if not ok:
        return 0, 0
    lo, lo_peak, hi = 1, peak, 2
    while hi <= cap:
        ok, peak = _fits_with(model_cfg, shape, hi, policy, optimizer, mm, strategies, costing, limit_bytes)
        if not ok:
            break
        lo, lo_peak, hi = hi, peak, hi * 2
    hi = min(hi, cap + 1)
    while hi - lo > 1:  # lo fits, hi does not (or is past the cap)
        mid = (lo + hi) // 2
        ok, peak = _fits_with(model_cfg, shape, mid, policy, optimizer, mm, strategies, costing, limit_bytes)
        lo, lo_peak, hi = (mid, peak, hi) if ok else (lo, lo_peak, mid)
    return lo, lo_peak


def _does_not_fit(model_cfg, input_shape, batch_size, policy, optimizer, mm, costing, allow_offload,
                  limit_bytes, strategy, plan: Plan, strategies: dict[str, Any]) -> PlanDoesNotFitError:
    """Build the error that says what the smallest peak is and what would fit."""
    candidates = {k: v["predicted_peak_bytes"] for k, v in strategies.items()
                  if v.get("predicted_peak_bytes") is not None}
    candidates[strategy] = plan.predicted_peak_bytes  # auto's best attempt when it failed
    best_strategy = min(candidates, key=candidates.get)
    smallest = candidates[best_strategy]
    fixed = _fixed_strategies(allow_offload)
    max_batch, batch_peak = _largest_batch(model_cfg, input_shape, policy, optimizer, mm, fixed, costing, limit_bytes)
    max_res, res_peak = None, 0
    for name, shape in STANDARD_RESOLUTIONS:
        if any(s % 2**model_cfg.depth for s in shape):
            continue
        ok, peak = _fits_with(model_cfg, shape, 1, policy, optimizer, mm, fixed, costing, limit_bytes)
        if ok:
            max_res, res_peak = (name, shape), peak
    lms_choices = "lms=" + "/".join(fixed)
    head = (
        f"LMS plan does not fit: strategy {strategy} predicts {_gb(plan.predicted_peak_bytes)} (at {plan.peak_at}) "
        f"for batch {batch_size} at {_shape_str(input_shape)} ({policy}), over the limit {_gb(limit_bytes)}. "
        f"Smallest predicted peak: {_gb(smallest)} with lms={best_strategy}."
    )
    if max_batch:
        batch_part = f" With {lms_choices} the largest batch that fits is {max_batch} ({_gb(batch_peak)})."
    else:
        batch_part = f" No batch size fits at {_shape_str(input_shape)} with {lms_choices}."
    if max_res:
        res_part = (f" The largest standard resolution that fits at batch 1 is {max_res[0]} "
                    f"{_shape_str(max_res[1])} ({_gb(res_peak)}).")
    else:
        res_part = " No standard resolution fits at batch 1."
    advice = []
    if strategy != "auto" and smallest <= limit_bytes:
        advice.append(f"use lms=auto or lms={best_strategy}")
    if max_batch and max_batch < batch_size:
        advice.append(f"lower trainer.batch_size to {max_batch}")
    advice += ["choose a smaller resolution", "lower model.base_filters or use backend.precision=bf16/fp16",
               "or raise lms.limit"]
    message = head + batch_part + res_part + " To fix: " + ", ".join(advice) + "."
    return PlanDoesNotFitError(message, int(smallest), best_strategy, int(limit_bytes), max_batch, max_res)


def _prepare(model_cfg, input_shape, batch_size, policy, optimizer, limit_bytes, strategy, size_bytes, prefetch,
             host_bandwidth_bps, device_flops, allow_offload, memory_model):
    if strategy not in STRATEGIES:
        raise ValueError(f"lms strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}.")
    if strategy == "offload" and not allow_offload:
        raise ValueError("lms=offload needs a GPU (on CPU, host memory is the device); use lms=recompute or lms=auto.")
    if not isinstance(limit_bytes, (int, float)) or limit_bytes <= 0:
        raise ValueError(f"limit_bytes must be a positive number of bytes, got {limit_bytes!r}; see parse_limit.")
    mm = memory_model or MemoryModel()
    policy = check_policy(policy)
    costing = _costing(size_bytes, prefetch, host_bandwidth_bps, device_flops)
    input_shape = tuple(input_shape)
    net = compute_network_cost(model_cfg, input_shape, batch_size, policy, optimizer, mm)
    inputs = _inputs_dict(model_cfg, input_shape, batch_size, policy, optimizer, costing, allow_offload, mm)
    return mm, policy, costing, input_shape, net, inputs


def plan_lms(
    model_cfg: ModelConfig,
    input_shape: Sequence[int],
    batch_size: int,
    policy: str,
    optimizer: str,
    limit_bytes: int,
    strategy: str = "auto",
    size_bytes: int = DEFAULT_SIZE_BYTES,
    prefetch: int = DEFAULT_PREFETCH,
    host_bandwidth_bps: float = DEFAULT_HOST_BANDWIDTH_BPS,
    device_flops: float = DEFAULT_DEVICE_FLOPS,
    allow_offload: bool = True,
    memory_model: MemoryModel | None = None,
) -> Plan:
    """Decide keep | recompute | offload per block so one training step fits ``limit_bytes``.

    Args:
        model_cfg: the U-Net config.
        input_shape: spatial ``(x, y, z)``.
        batch_size: samples per step.
        policy: ``float32`` | ``mixed_float16`` | ``mixed_bfloat16`` (or fp32/fp16/bf16).
        optimizer: ``adam`` | ``adamw`` | ``sgd`` | ``sgd_momentum``.
        limit_bytes: device budget (see :func:`parse_limit`).
        strategy: ``off`` (keep all), ``recompute`` (all), ``offload`` (all blocks and
            skips whose tensors reach ``size_bytes``), ``auto`` (least predicted overhead
            that fits).
        size_bytes: tensors smaller than this are never offloaded (``lms.size``).
        prefetch: blocks ahead in backward at which copies back are issued.
        host_bandwidth_bps: host<->device bytes/s, to price transfers.
        device_flops: FLOP/s, to price recomputation and how much transfer it hides.
        allow_offload: False on CPU: only keep/recompute.
        memory_model: coefficients; default :class:`MemoryModel()`.

    Returns:
        The :class:`Plan`, with ``strategies`` filled by the comparison of all four.

    Raises:
        PlanDoesNotFitError: the strategy's predicted peak exceeds the limit; the message
            gives the smallest peak, the largest batch and resolution that fit.
        ValueError: a bad argument, named.
    """
    mm, policy, costing, input_shape, net, inputs = _prepare(
        model_cfg, input_shape, batch_size, policy, optimizer, limit_bytes, strategy, size_bytes, prefetch,
        host_bandwidth_bps, device_flops, allow_offload, memory_model)
    plan = _solve(net, strategy, limit_bytes, costing, allow_offload, inputs)
    plan.strategies = _compare(net, limit_bytes, costing, allow_offload, inputs,
                               auto_plan=plan if strategy == "auto" else None)
    if not plan.fits:
        raise _does_not_fit(model_cfg, input_shape, batch_size, policy, optimizer, mm, costing, allow_offload,
                            limit_bytes, strategy, plan, plan.strategies)
    if model_cfg.norm == "batch" and strategy != "off":
        logger.warning("model.norm=batch: blocks with BatchNormalization are always kept (recomputing them would "
                       "update the moving statistics twice), so LMS can only act on the head; use "
                       "model.norm=instance or group to let it act on every block.")
    logger.info("LMS plan %s: predicted peak %s at %s (limit %s), recompute %.1f GFLOP, move %s per step",
                strategy, _gb(plan.predicted_peak_bytes), plan.peak_at, _gb(limit_bytes),
                plan.recomputed_flops / 1e9, format_bytes(plan.moved_bytes))
    return plan


def compare_strategies(
    model_cfg: ModelConfig,
    input_shape: Sequence[int],
    batch_size: int,
    policy: str,
    optimizer: str,
    limit_bytes: int,
    size_bytes: int = DEFAULT_SIZE_BYTES,
    prefetch: int = DEFAULT_PREFETCH,
    host_bandwidth_bps: float = DEFAULT_HOST_BANDWIDTH_BPS,
    device_flops: float = DEFAULT_DEVICE_FLOPS,
    allow_offload: bool = True,
    memory_model: MemoryModel | None = None,
) -> dict[str, Any]:
    """Predictions of ``off``, ``recompute``, ``offload`` and ``auto``; never raises for fit.

    Returns:
        ``{strategy: {"predicted_peak_bytes", "recomputed_flops", "moved_bytes",
        "overhead_s", "peak_at", "fits"}}``; ``auto`` (when nothing fits) and ``offload``
        (when not allowed) have None values and a ``reason``.
    """
    _, _, costing, _, net, inputs = _prepare(
        model_cfg, input_shape, batch_size, policy, optimizer, limit_bytes, "auto", size_bytes, prefetch,
        host_bandwidth_bps, device_flops, allow_offload, memory_model)
    return _compare(net, limit_bytes, costing, allow_offload, inputs)


def estimate_peak(
    model_cfg: ModelConfig,
    input_shape: Sequence[int],
    batch_size: int,
    policy: str = "float32",
    optimizer: str = "adam",
    strategy: str = "off",
    size_bytes: int = DEFAULT_SIZE_BYTES,
    prefetch: int = DEFAULT_PREFETCH,
    memory_model: MemoryModel | None = None,
) -> Timeline:
    """The timeline of a fixed strategy (``off``/``recompute``/``offload``), no budget involved.

    Used by calibration and pre-flight checks; ``timeline.peak_bytes`` is the prediction.
    """
    if strategy not in ("off", "recompute", "offload"):
        raise ValueError(f"estimate_peak takes a fixed strategy (off, recompute, offload), got {strategy!r}.")
    net = compute_network_cost(model_cfg, input_shape, batch_size, policy, optimizer, memory_model)
    costing = _costing(size_bytes, prefetch, DEFAULT_HOST_BANDWIDTH_BPS, DEFAULT_DEVICE_FLOPS)
    policies, skips = _fixed_config(net, strategy, costing)
    return simulate(net, policies, skips, size_bytes, prefetch)


def fit_memory_model(
    samples: Sequence[tuple[Mapping[str, Any], int]],
    base: MemoryModel | None = None,
) -> MemoryModel:
    """Calibrate ``runtime_bytes`` and ``activation_factor`` to measured peaks.

    The prediction is linear in the two: ``peak = runtime + other_fixed + factor * act``
    (``act`` = activation bytes at the peak step, which does not move with ``factor``),
    so an ordinary least-squares fit is exact. With a single sample only
    ``activation_factor`` is fitted.

    Args:
        samples: ``(kwargs of estimate_peak, measured peak bytes)`` pairs, e.g.
            ``({"model_cfg": ModelConfig(depth=4), "input_shape": (96, 112, 80), "batch_size": 1}, 2.1e9)``.
        base: the other coefficients; default :class:`MemoryModel()`.

    Returns:
        A new :class:`MemoryModel` with the two fitted fields.
    """
    base = base or MemoryModel()
    if not samples:
        raise ValueError("fit_memory_model needs at least one (workload, measured_bytes) sample.")
    unit = dataclasses.replace(base, runtime_bytes=0, activation_factor=1.0)
    rows = []
    for kwargs, measured in samples:
        t = estimate_peak(**{**kwargs, "memory_model": unit})
        i = t.peak_index
        act = t.kept_bytes[i] + t.gradient_bytes[i] + t.transient_bytes[i]
        rows.append((act, measured - (t.total_bytes[i] - act)))  # target = runtime + factor * act
    if len(rows) == 1:
        act, target = rows[0]
        return dataclasses.replace(base, activation_factor=max(0.0, (target - base.runtime_bytes) / act))
    mean_a = sum(a for a, _ in rows) / len(rows)
    mean_y = sum(y for _, y in rows) / len(rows)
    var = sum((a - mean_a) ** 2 for a, _ in rows)
    if var == 0:
        raise ValueError("fit_memory_model needs samples of different sizes (batch or resolution) to fit two values.")
    factor = sum((a - mean_a) * (y - mean_y) for a, y in rows) / var
    runtime = mean_y - factor * mean_a
    return dataclasses.replace(base, runtime_bytes=int(max(0.0, runtime)), activation_factor=max(0.0, factor))


def _resolved_model(cfg: TrainConfig) -> ModelConfig:
    """``cfg.model`` with ``out_channels`` resolved from the layout (0 = one per region), unchanged ``cfg``."""
    from brats_seg.data.labels import output_regions

    return dataclasses.replace(cfg.model, out_channels=len(output_regions(cfg.data.layout, cfg.model.out_channels)))


def plan_lms_from_config(cfg: TrainConfig, device_bytes: int, allow_offload: bool, optimizer: str = "adam",
                         memory_model: MemoryModel | None = None) -> Plan:
    """:func:`plan_lms` from the composed config (``lms``, ``model``, ``resolution``, ``trainer``, ``backend``).

    Args:
        cfg: the train config.
        device_bytes: device memory (RAM on CPU), for fractional ``lms.limit``.
        allow_offload: True on a GPU, False on CPU.
        optimizer: the trainer's optimizer (the config has no field for it; Adam is used).
        memory_model: coefficients; default :class:`MemoryModel()`.
    """
    return plan_lms(
        _resolved_model(cfg),
        tuple(cfg.resolution.shape),
        cfg.trainer.batch_size,
        cfg.backend.precision,
        optimizer,
        parse_limit(cfg.lms.limit, device_bytes),
        strategy=cfg.lms.name,
        size_bytes=int(cfg.lms.size),
        prefetch=int(cfg.lms.prefetch),
        host_bandwidth_bps=cfg.lms.host_bandwidth_gbps * 1e9,
        device_flops=cfg.lms.device_tflops * 1e12,
        allow_offload=allow_offload,
        memory_model=memory_model,
    )


# ---------------------------------------------------------------------------------------
# Limits
# ---------------------------------------------------------------------------------------

_UNITS = {
    "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_LIMIT_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")


def parse_limit(text: str | int | float, device_bytes: int | None) -> int:
    """Parse ``lms.limit`` into bytes.

    Args:
        text: ``"16GB"`` (1e9), ``"16GiB"`` (2**30), ``"512MB"``, ``"1.5e10"`` or
            ``"12345"`` (bytes), or a fraction ``"0.8"`` (a plain number <= 1.0 is a
            fraction of ``device_bytes``).
        device_bytes: device memory (RAM on CPU); needed only for fractions.

    Returns:
        The budget in bytes (> 0).

    Raises:
        ValueError: unreadable text, an unknown unit, a non-positive budget, or a
            fraction without ``device_bytes``.
    """
    if isinstance(text, bool):
        raise ValueError(f"lms.limit must be bytes, a size like '16GB', or a fraction like '0.8', got {text!r}.")
    raw = str(text)
    match = _LIMIT_RE.match(raw)
    if not match:
        raise ValueError(
            f"lms.limit {raw!r} is not a size: use bytes ('12345', '1.5e10'), a size with a unit "
            f"({', '.join(u.upper().replace('I', 'i') for u in _UNITS if u != 'b')}, e.g. '16GB'), "
            f"or a fraction of device memory ('0.8')."
        )
    value, unit = float(match.group(1)), match.group(2).lower()
    if unit:
        if unit not in _UNITS:
            raise ValueError(
                f"lms.limit {raw!r}: unknown unit {match.group(2)!r}; use B, kB, MB, GB, TB (powers of 1000) "
                f"or KiB, MiB, GiB, TiB (powers of 1024)."
            )
        nbytes = int(value * _UNITS[unit])
    elif value <= 1.0:
        if not device_bytes or device_bytes <= 0:
            raise ValueError(
                f"lms.limit {raw!r} is a fraction of device memory, but the device size is unknown; "
                f"give the limit in bytes or with a unit (e.g. '16GB')."
            )
        nbytes = int(value * device_bytes)
    else:
        nbytes = int(value)
    if nbytes <= 0:
        raise ValueError(f"lms.limit {raw!r} gives {nbytes} bytes; the budget must be positive.")
    return nbytes
