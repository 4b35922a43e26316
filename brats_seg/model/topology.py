"""The one description of the 3D U-Net (Çiçek et al., 2016): blocks, layers, tensors, dtypes.

Pure Python, no TensorFlow or Keras import. :mod:`brats_seg.model.unet3d` creates its
Keras layers from it and :mod:`brats_seg.lms.planner.cost` prices it, so the model that trains and
the model that is planned are the same by construction. The rules a model config must
follow are in :mod:`brats_seg.model.checks`; :func:`unet_topology` applies them before it
describes anything.

Tensors are channels-last ``(batch, x, y, z, channels)`` in RAS; a tensor at spatial
``level`` l is ``(batch, x / 2**l, y / 2**l, z / 2**l, channels)``.

Blocks, in forward order::

    F_l = base_filters * 2**l, l = 0..depth
    enc0        TwoConv(F_0)                          on the input
    enc{l}      MaxPool3D(2) -> TwoConv(F_l)          l = 1..depth-1
    bottleneck  MaxPool3D(2) -> TwoConv(F_depth)
    dec{l}      Up(prev) -> Concat([up, enc{l}]) -> TwoConv(F_l)   l = depth-1..0
    head        Conv3D(out_channels, 1) -> sigmoid    (sigmoid and loss in float32)

    TwoConv(F) = [Conv3D(F, 3, same, no bias) -> Norm -> ReLU] x 2
    Up         = Conv3DTranspose(F_l, 2, strides 2)            (upsample=transpose)
               | TrilinearUpSampling3D(2) -> Conv3D(F_l, 1)     (upsample=trilinear)

With ``model.region_parents`` naming a parent for some region the head's sigmoid is a
nested one (each region's probability times its parent's, kind ``nest``).

Each layer is named ``<block>_<part>`` (``enc0_conv1``, ``dec2_up``, ``head_conv``). Under a
mixed-precision policy Keras casts the float32 image to the compute dtype where
``enc0_conv1`` reads it, and the float32 sigmoid casts the head's logits back; these casts
have no Keras layer of their own but hold tensors, so they are listed as layers of kind
``cast`` (``enc0_image_cast``, ``head_cast``). Every TwoConv block splits into a front and a tail,
its last conv unit (``conv2 -> norm2 -> relu2``), which LMS can keep while it recomputes
the front (see ``brats_seg.lms``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from brats_seg.config import ModelConfig
from brats_seg.model.checks import DTYPE_POLICIES, check_depth, check_model_config, check_policy

__all__ = [
    "BlockSpec",
    "LayerSpec",
    "TensorSpec",
    "UNetTopology",
    "group_count",
    "instance_norm_is_planar",
    "level_filters",
    "unet_block_names",
    "unet_topology",
]

IMAGE = "image"  # the input tensor: float32, as the data pipeline hands it over


@dataclass(frozen=True)
class TensorSpec:
    """A tensor of the forward pass, ``(batch, x / 2**level, y / 2**level, z / 2**level, channels)``.

    Attributes:
        name: ``image``; a block's output is named after the block (``enc0``, ``head``);
            any other ``<block>/<part>`` after the layer writing it (``enc0/conv1``).
        channels: channels (last axis).
        level: spatial level, 0 = the input grid.
        dtype: ``float32`` | ``float16`` | ``bfloat16`` under the topology's policy.
    """

    name: str
    channels: int
    level: int
    dtype: str

    def shape(self, input_shape: Sequence[int]) -> tuple[int, int, int]:
        """Spatial shape ``(x, y, z)`` for a network input of spatial ``input_shape``."""
        x, y, z = (int(s) // 2**self.level for s in input_shape)
        return x, y, z


@dataclass(frozen=True)
class LayerSpec:
    """One layer of a block.

    Attributes:
        name: the Keras layer name ``<block>_<part>``; for a ``cast``, a name of its own
            (Keras casts inside the layer that reads the tensor).
        kind: ``cast``, ``conv``, ``norm``, ``relu``, ``pool``, ``concat``, ``up_transpose``,
            ``up_trilinear``, ``sigmoid`` or ``nest``.
        inputs: tensors read, in order (``concat``: the up-sampled tensor, then the skip).
        output: the tensor written.
        kernel: kernel size along each axis (``conv``, ``up_transpose``), else 0.
        bias: whether a convolution adds a bias (TwoConv's do not: a norm follows).
        float32: computes in float32 whatever the dtype policy (the head's sigmoid).
        norm: ``instance`` | ``group`` | ``batch`` for kind ``norm``.
        groups: kind ``norm``: the groups its statistics are taken over: one per channel
            for instance norm, ``model.groups`` lowered to a divisor of the channels for
            group norm; batch norm keeps one pair per channel, over the batch.
        parents: kind ``nest``: per region, the index of its parent region or -1.
    """

    name: str
    kind: str
    inputs: tuple[TensorSpec, ...]
    output: TensorSpec
    kernel: int = 0
    bias: bool = False
    float32: bool = False
    norm: str = ""
    groups: int = 0
    parents: tuple[int, ...] = ()

    @property
    def in_channels(self) -> int:
        """Channels of the first input."""
        return self.inputs[0].channels

    @property
    def trainable_params(self) -> int:
        """Trainable weights: kernel and bias of a convolution, gamma and beta of a norm."""
        if self.kind in ("conv", "up_transpose"):
            return self.kernel**3 * self.in_channels * self.output.channels + (self.output.channels if self.bias else 0)
        if self.kind == "norm":
            return 2 * self.output.channels
        return 0

    @property
    def params(self) -> int:
        """All weights; batch norm adds its moving mean and variance (not trainable)."""
        moving = 2 * self.output.channels if self.kind == "norm" and self.norm == "batch" else 0
        return self.trainable_params + moving


@dataclass(frozen=True)
class BlockSpec:
    """One named block: its inputs and its layers in call order.

    Attributes:
        name: ``enc{l}``, ``bottleneck``, ``dec{l}`` or ``head``; the prefix of its layers.
        inputs: ``(x,)``, or ``(x, skip)`` for ``dec{l}`` (the skip is ``enc{l}``'s output).
        layers: in call order; the last one writes the block's output.
        level: the spatial level the block's convolutions run at.
        tail_start: index in ``layers`` of the last conv unit (``conv2 -> norm2 -> relu2``),
            which reads only the output of the layer before it; None for the head.
    """

    name: str
    inputs: tuple[TensorSpec, ...]
    layers: tuple[LayerSpec, ...]
    level: int
    tail_start: int | None = None

    @property
    def output(self) -> TensorSpec:
        return self.layers[-1].output

    @property
    def skip(self) -> TensorSpec | None:
        """The skip input of a decoder, else None."""
        return self.inputs[1] if len(self.inputs) > 1 else None

    @property
    def model_layers(self) -> tuple[LayerSpec, ...]:
        """The layers the Keras model has: all but the casts."""
        return tuple(layer for layer in self.layers if layer.kind != "cast")


@dataclass(frozen=True)
class UNetTopology:
    """The U-Net of one model config under one dtype policy.

    Attributes:
        policy: ``float32`` | ``mixed_float16`` | ``mixed_bfloat16``.
        filters: ``F_l`` for ``l = 0..depth``.
        image: the input tensor (float32).
        blocks: in forward order (:func:`unet_block_names`).
    """

    policy: str
    filters: tuple[int, ...]
    image: TensorSpec
    blocks: tuple[BlockSpec, ...]


def unet_topology(cfg: ModelConfig, policy: str = "float32") -> UNetTopology:
    """Describe the U-Net of ``cfg`` under a dtype policy.

    Args:
        cfg: the model config (depth, base_filters, norm, groups, upsample, in/out
            channels, region_parents).
        policy: ``float32`` | ``mixed_float16`` | ``mixed_bfloat16`` (or fp32/fp16/bf16).

    Returns:
        The :class:`UNetTopology`; shapes follow from an input shape (:meth:`TensorSpec.shape`).

    Raises:
        ValueError: a bad config value or policy, named, with what to use instead.
    """
    check_model_config(cfg)
    policy = check_policy(policy)
    compute = DTYPE_POLICIES[policy]
    filters = tuple(level_filters(cfg.base_filters, cfg.depth))
    image = TensorSpec(IMAGE, cfg.in_channels, 0, "float32")
    blocks: list[BlockSpec] = []
    x = image
    for level in range(cfg.depth + 1):  # enc0 .. enc{depth-1}, bottleneck
        name = f"enc{level}" if level < cfg.depth else "bottleneck"
        blocks.append(_encoder(name, level, x, filters[level], cfg, compute))
        x = blocks[-1].output
    for level in reversed(range(cfg.depth)):
        blocks.append(_decoder(f"dec{level}", level, x, blocks[level].output, filters[level], cfg, compute))
        x = blocks[-1].output
    blocks.append(_head(x, cfg, compute))
    return UNetTopology(policy, filters, image, tuple(blocks))


class _Writer:
    """Accumulates the layers of one block."""

    def __init__(self, name: str, level: int, dtype: str):
        self.name, self.level, self.dtype = name, level, dtype
        self.layers: list[LayerSpec] = []
        self.tail_start: int | None = None

    def add(
        self,
        part: str,
        kind: str,
        inputs: Sequence[TensorSpec],
        channels: int,
        *,
        level: int | None = None,
        dtype: str | None = None,
        block_output: bool = False,
        **attributes,
    ) -> TensorSpec:
        output = TensorSpec(
            self.name if block_output else f"{self.name}/{part}",
            channels,
            self.level if level is None else level,
            dtype or self.dtype,
        )
        self.layers.append(LayerSpec(f"{self.name}_{part}", kind, tuple(inputs), output, **attributes))
        return output

    def two_conv(self, x: TensorSpec, filters: int, cfg: ModelConfig) -> TensorSpec:
        """[Conv3D(F, 3, same, no bias) -> Norm -> ReLU] x 2; the second unit is the tail."""
        groups = group_count(cfg.groups, filters) if cfg.norm == "group" else filters
        for i in (1, 2):
            if i == 2:
                self.tail_start = len(self.layers)
            c = self.add(f"conv{i}", "conv", [x], filters, kernel=3)
            n = self.add(f"norm{i}", "norm", [c], filters, norm=cfg.norm, groups=groups)
            x = self.add(f"relu{i}", "relu", [n], filters, block_output=i == 2)
        return x

    def block(self, inputs: Sequence[TensorSpec]) -> BlockSpec:
        return BlockSpec(self.name, tuple(inputs), tuple(self.layers), self.level, self.tail_start)


def _encoder(name: str, level: int, x: TensorSpec, filters: int, cfg: ModelConfig, compute: str) -> BlockSpec:
    """``enc0``: (autocast ->) TwoConv on the image; ``enc{l}``, ``bottleneck``: MaxPool3D(2) -> TwoConv."""
    w = _Writer(name, level, compute)
    h = x
    if level == 0 and compute != "float32":
        h = w.add("image_cast", "cast", [x], x.channels)
    if level > 0:
        h = w.add("pool", "pool", [x], x.channels)
    w.two_conv(h, filters, cfg)
    return w.block([x])


def _decoder(
    name: str, level: int, x: TensorSpec, skip: TensorSpec, filters: int, cfg: ModelConfig, compute: str
) -> BlockSpec:
    """``dec{l}``: Up(x) -> Concat([up, skip]) -> TwoConv."""
    w = _Writer(name, level, compute)
    if cfg.upsample == "transpose":
        up = w.add("up", "up_transpose", [x], filters, kernel=2, bias=True)
    else:
        up = w.add("up", "up_trilinear", [x], x.channels)
        up = w.add("upconv", "conv", [up], filters, kernel=1, bias=True)
    merged = w.add("concat", "concat", [up, skip], 2 * filters)
    w.two_conv(merged, filters, cfg)
    return w.block([x, skip])


def _head(x: TensorSpec, cfg: ModelConfig, compute: str) -> BlockSpec:
    """``head``: Conv3D(out_channels, 1) in the compute dtype -> (cast ->) sigmoid (or nested
    sigmoid) in float32 under every policy.

    The 1x1x1 convolution reads ``dec0``'s output in its own dtype (which ``dec0``'s last
    ReLU keeps anyway), so under mixed precision no float32 copy of the widest full-size
    tensor is kept; only its ``out_channels`` logits are cast to float32.
    """
    w = _Writer("head", 0, compute)
    logits = w.add("conv", "conv", [x], cfg.out_channels, kernel=1, bias=True)
    if compute != "float32":
        logits = w.add("cast", "cast", [logits], cfg.out_channels, dtype="float32")
    parents = tuple(cfg.region_parents) or (-1,) * cfg.out_channels
    nested = any(p >= 0 for p in parents)
    w.add(
        "sigmoid",
        "nest" if nested else "sigmoid",
        [logits],
        cfg.out_channels,
        block_output=True,
        float32=True,
        dtype="float32",
        parents=parents if nested else (),
    )
    return w.block([x])


def unet_block_names(depth: int) -> list[str]:
    """Block names in forward order.

    Args:
        depth: number of down-sampling steps (>= 1).

    Returns:
        ``["enc0", ..., f"enc{depth-1}", "bottleneck", f"dec{depth-1}", ..., "dec0", "head"]``.
    """
    check_depth(depth)
    encoders = [f"enc{level}" for level in range(depth)]
    decoders = [f"dec{level}" for level in reversed(range(depth))]
    return [*encoders, "bottleneck", *decoders, "head"]


def level_filters(base_filters: int, depth: int) -> list[int]:
    """Filters per level, ``F_l = base_filters * 2**l`` for ``l = 0..depth``."""
    return [base_filters * 2**level for level in range(depth + 1)]


def group_count(requested: int, channels: int) -> int:
    """The largest divisor of ``channels`` that is <= ``requested`` (group norm's groups)."""
    groups = min(requested, channels)
    while channels % groups:
        groups -= 1
    return groups


#: Channels per vector of oneDNN's channels-last batch-norm kernels, by dtype: 4 float32 values
#: (its SSE4.1 kernel; AVX2 and AVX-512 take 8 and 16), 16 bfloat16 or float16 ones (AVX-512).
_NORM_LANES = {"float32": 4, "bfloat16": 16, "float16": 16}


def instance_norm_is_planar(channels: int, dtype: str) -> bool:
    """Whether instance norm of ``channels`` channels in ``dtype`` runs on a planar (channels-first)
    view (:func:`brats_seg.model.norm.instance_norm`) instead of the channels-last one.

    oneDNN's channels-last batch norm vectorises over channels: with a channel count that is not
    a multiple of its vector (16 bfloat16 values on AVX-512; 4 float32) it falls back to a scalar
    loop, ``nspc_bnorm:any``. On an AMD Zen 5 that made 4 to 12 base filters slower than 16 in
    bfloat16 (the norms took 4.3 s of a 5-s step at 4 filters; docs/measurements/width_zen5/). The
    planar kernel vectorises over voxels, whatever the channels, for the price of a transposed
    copy of the tensor in and out, in each pass (the planner counts them:
    ``MemoryModel.norm_planar_tensors``).
    """
    return channels % _NORM_LANES.get(dtype, 16) != 0
