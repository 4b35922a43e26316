"""Cost of one layer by the rule of its kind: tensors kept for backward, FLOPs, weights, scratch.

The rules price the layers of a topology block (:mod:`brats_seg.model.topology`) in call
order; :mod:`brats_seg.lms.planner.cost` derives the block and network tables from these rows.
Sizes are bytes, FLOPs are for the whole batch.

What each kind keeps for its backward pass (TensorFlow autodiff of the Keras 3 layer):

- ``conv``: its input (Conv3DBackpropFilter needs it; the kernel is a weight).
- ``norm``: instance and group norm (``brats_seg.model.norm``): its input in its own dtype
  (the conv output) plus per-group float32 mean and 1/std. Temporaries: instance norm
  (oneDNN's kernel) none, but a copy per pass when several samples are split
  (``MemoryModel.norm_split_tensors``); group norm (XLA) float32 ones under a 16-bit policy
  (``MemoryModel.norm_upcast_*``). Batch norm (Keras, computing in float32): its input
  upcast to float32 plus statistics (``MemoryModel.batch_norm_*``).
- ``relu``: its output (ReluGrad uses the output).
- ``pool``: its input and its output (MaxPool3DGrad needs both).
- ``concat``: nothing (its gradient is a slice).
- ``up_transpose``: its input (the filter gradient needs it).
- ``up_trilinear``: nothing (gathers and constant scalings are linear); its forward and
  backward transients are ``MemoryModel.trilinear_*scratch_factor`` times its output.
- ``cast``: nothing.
- ``sigmoid``: its output.
- ``nest``: the sigmoids' output, then for the products their inputs and output (each
  region's probability times its parent's: the product's gradient needs both factors).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from brats_seg.lms.planner.memory_model import MemoryModel
from brats_seg.model.topology import BlockSpec, LayerSpec, TensorSpec, instance_norm_is_planar

__all__ = ["LayerCost", "compute_layer_costs"]

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}  # a tensor's dtype -> bytes per element
FLOAT32_BYTES = 4  # weights, their gradients and optimizer slots are float32 under every policy

# Forward FLOPs of the cheap layers (convolutions are counted exactly: 2*K^3*Cin*Cout per
# output voxel; per input voxel for the transposed one, stride K).
NORM_FLOPS_PER_ELEMENT = 8.0  # mean, squared difference, variance, scale, shift
RELU_FLOPS_PER_ELEMENT = 1.0
POOL_FLOPS_PER_INPUT_ELEMENT = 1.0  # 2x2x2 max: ~one comparison per input element
TRILINEAR_FLOPS_PER_OUTPUT_ELEMENT = 9.0  # 3 axes x (mul, mul, add)
SIGMOID_FLOPS_PER_ELEMENT = 4.0


@dataclass(frozen=True)
class LayerCost:
    """One layer of a block: what it reads, writes and keeps for backward.

    Attributes:
        name: the topology layer's name (``enc0_conv1``, casts ``enc0_image_cast``,
            ``head_cast``); a nested sigmoid is two rows, ``head_sigmoid`` and ``head_nest``.
        kind: the topology layer's kind (a nested sigmoid's rows: ``sigmoid``, ``nest``).
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
        channels: ``(in, out)`` channels of a convolution (the step-time model pads them to
            the CPU's channel block), else ``(0, 0)``.
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
    channels: tuple[int, int] = (0, 0)


# Layers without weights: kind -> (what they save for backward, forward FLOPs per output
# element, or per input element for pool), as the module docstring says.
_WEIGHTLESS = {
    "cast": ("", 0.0),
    "relu": ("out", RELU_FLOPS_PER_ELEMENT),
    "pool": ("in+out", POOL_FLOPS_PER_INPUT_ELEMENT),
    "concat": ("", 0.0),
    "up_trilinear": ("", TRILINEAR_FLOPS_PER_OUTPUT_ELEMENT),
    "sigmoid": ("out", SIGMOID_FLOPS_PER_ELEMENT),
}


def compute_layer_costs(
    block: BlockSpec, input_bytes: Mapping[str, int], input_shape: Sequence[int], batch: int, mm: MemoryModel
) -> tuple[list[LayerCost], dict[str, int], dict[str, int], int | None]:
    """Price the layers of one block in call order, each by the rule of its kind.

    Args:
        block: the topology block.
        input_bytes: bytes of (at least) the block's input tensors.
        input_shape: spatial shape of the network input.
        batch: samples per step.
        mm: the coefficients.

    Returns:
        ``(rows, tensor_bytes, tensor_channels, tail_start)``: the cost rows (a nested sigmoid
        gives two: the sigmoids, then the products), the bytes of every tensor they read, create
        or write, the channels of those that are activations (the step-time model pads them), and
        the row where the block's tail (last conv unit) starts, or None.
    """
    costing = _BlockCosting(block, input_bytes, input_shape, batch, mm)
    tail_start = None
    for i, layer in enumerate(block.layers):
        if i == block.tail_start:
            tail_start = len(costing.layers)
        costing.add(layer)
    return costing.layers, costing.tensors, costing.channels, tail_start


class _BlockCosting:
    """Prices the layers of one topology block, in call order."""

    def __init__(
        self, block: BlockSpec, tensor_bytes: Mapping[str, int], input_shape: Sequence[int], batch: int, mm: MemoryModel
    ):
        self.block, self.input_shape, self.batch, self.mm = block, tuple(input_shape), batch, mm
        self.tensors: dict[str, int] = {t.name: tensor_bytes[t.name] for t in block.inputs}
        self.channels: dict[str, int] = {t.name: t.channels for t in block.inputs}
        self.layers: list[LayerCost] = []

    def voxels(self, t: TensorSpec) -> int:
        return math.prod(self.input_shape) // 8**t.level

    def add_tensor(self, t: TensorSpec) -> str:
        self.tensors[t.name] = self.batch * self.voxels(t) * t.channels * DTYPE_BYTES[t.dtype]
        self.channels[t.name] = t.channels
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
        grad_scratch = (
            cin * (self.voxels(y) + k**3 * slice_voxels) * DTYPE_BYTES[y.dtype] if layer.kind == "conv" and k > 1 else 0
        )
        self.layers.append(
            LayerCost(
                name=layer.name,
                kind=layer.kind,
                inputs=(x.name,),
                output=y.name,
                saved=(x.name,),
                forward_flops=flops,
                params=layer.params,
                trainable_params=layer.trainable_params,
                workspace_ref_bytes=max(self.tensors[x.name], self.tensors[y.name]),
                weight_grad_scratch_ref_bytes=grad_scratch,
                channels=(cin, cout),
            )
        )

    def norm(self, layer: LayerSpec) -> None:
        """Instance/group norm save their input and float32 statistics; batch norm an upcast copy."""
        mm, x, y = self.mm, layer.inputs[0], layer.output
        self.add_tensor(y)
        f32_bytes = self.batch * self.voxels(y) * y.channels * FLOAT32_BYTES
        # Statistics per (sample, group): mean and 1/std. Batch norm's per-channel statistics
        # are counted the same way (a slight over-count of a few bytes per channel).
        stats = f"{y.name}_stats"
        self.tensors[stats] = self.batch * 1 * (2 * layer.groups) * FLOAT32_BYTES
        saved, creates = [stats], [stats]
        low_precision = x.dtype != "float32"
        if layer.norm == "batch":
            own_copies = mm.batch_norm_saved_tensors - (0 if low_precision else 1)
            if not low_precision:
                saved.append(x.name)
            if own_copies > 0:
                copy = f"{y.name}_f32"
                self.tensors[copy] = round(own_copies * f32_bytes)
                saved.append(copy)
                creates.append(copy)
            forward_scratch = mm.batch_norm_forward_scratch_tensors * f32_bytes
            backward_scratch = mm.batch_norm_backward_scratch_tensors * f32_bytes
        elif layer.norm == "instance":  # oneDNN's kernel per sample (brats_seg.model.norm.instance_norm)
            saved.append(x.name)  # the input in its own dtype; no float32 copy
            split = mm.norm_split_tensors * self.tensors[y.name] if self.batch > 1 else 0.0
            # a channel count oneDNN's channels-last kernel does not vectorise: the planar view's copies
            planar = (
                mm.norm_planar_tensors * self.tensors[y.name] if instance_norm_is_planar(y.channels, y.dtype) else 0.0
            )
            forward_scratch = backward_scratch = split + planar
        else:  # group norm: the XLA path (brats_seg.model.norm.group_norm)
            saved.append(x.name)
            forward_scratch = mm.norm_upcast_forward_tensors * f32_bytes if low_precision else 0.0
            backward_scratch = mm.norm_upcast_backward_tensors * f32_bytes if low_precision else 0.0
        self.layers.append(
            LayerCost(
                name=layer.name,
                kind="norm",
                inputs=(x.name,),
                output=y.name,
                saved=tuple(saved),
                creates=tuple(creates),
                forward_flops=NORM_FLOPS_PER_ELEMENT * self.batch * self.voxels(y) * y.channels,
                params=layer.params,
                trainable_params=layer.trainable_params,
                forward_scratch_bytes=int(forward_scratch),
                backward_scratch_bytes=int(backward_scratch),
            )
        )

    def weightless(self, name: str, kind: str, inputs: Sequence[TensorSpec], y: TensorSpec) -> None:
        """A layer without weights, by the rule of its kind in :data:`_WEIGHTLESS`."""
        self.add_tensor(y)
        roles, flops_per_element = _WEIGHTLESS[kind]
        counted = inputs[0] if kind == "pool" else y  # pool: FLOPs per input element
        flops = flops_per_element * self.batch * self.voxels(counted) * counted.channels if flops_per_element else 0.0
        saved = (tuple(t.name for t in inputs) if "in" in roles else ()) + ((y.name,) if "out" in roles else ())
        trilinear = kind == "up_trilinear"
        forward_scratch = self.mm.trilinear_scratch_factor if trilinear else 0.0
        backward_scratch = self.mm.trilinear_backward_scratch_factor if trilinear else 0.0
        self.layers.append(
            LayerCost(
                name=name,
                kind=kind,
                inputs=tuple(t.name for t in inputs),
                output=y.name,
                saved=saved,
                forward_flops=flops,
                forward_scratch_bytes=int(forward_scratch * self.tensors[y.name]),
                backward_scratch_bytes=int(backward_scratch * self.tensors[y.name]),
            )
        )

    def nest(self, layer: LayerSpec) -> None:
        """NestedRegionSigmoid: the sigmoids (output saved), then each region times its parent's
        probability (both factors and the product saved)."""
        y, block = layer.output, self.block.name
        probabilities = TensorSpec(f"{block}/sigmoid", y.channels, y.level, y.dtype)
        self.weightless(layer.name, "sigmoid", layer.inputs, probabilities)
        self.add_tensor(y)
        self.layers.append(
            LayerCost(
                name=f"{block}_nest",
                kind="nest",
                inputs=(probabilities.name,),
                output=y.name,
                saved=(probabilities.name, y.name),
                forward_flops=self.batch * self.voxels(y) * y.channels,
            )
        )

    def add(self, layer: LayerSpec) -> None:
        if layer.kind in ("conv", "up_transpose"):
            self.conv(layer)
        elif layer.kind == "norm":
            self.norm(layer)
        elif layer.kind == "nest":
            self.nest(layer)
        else:
            self.weightless(layer.name, layer.kind, layer.inputs, layer.output)
