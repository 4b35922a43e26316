"""The 3D U-Net of Çiçek et al. (2016), built from named blocks a memory plan can address.

Tensors are channels-last ``(batch, x, y, z, channels)`` in RAS throughout.

Block structure (the LMS planner models exactly this; keep them in step)::

    F_l = base_filters * 2**l, l = 0..depth
    enc0        TwoConv(F_0)                          on the input
    enc{l}      MaxPool3D(2) -> TwoConv(F_l)          l = 1..depth-1
    bottleneck  MaxPool3D(2) -> TwoConv(F_depth)
    dec{l}      Up(prev) -> Concat([up, enc{l}]) -> TwoConv(F_l)   l = depth-1..0
    head        Conv3D(out_channels, 1) -> sigmoid    (float32)

    TwoConv(F) = [Conv3D(F, 3, same, no bias) -> Norm -> ReLU] x 2
    Up         = Conv3DTranspose(F_l, 2, strides 2)            (upsample=transpose)
               | TrilinearUpSampling3D(2) -> Conv3D(F_l, 1)     (upsample=trilinear)

Every TwoConv block also exposes ``Block.split = (front, tail)``: ``tail`` is its last
conv unit, ``front`` everything before it. LMS recomputes ``front`` and keeps ``tail`` in
the last block before the head, whose backward runs right after its forward (see
``brats_seg.lms``).

Every layer is named ``<block>_<part>`` (``enc0_conv1``, ``dec2_up``, ``head_conv``), so
``model.get_layer("bottleneck_conv2")`` works and a plan can address a block by its
prefix. Each block is a :class:`Block`: its layers are created (and built) once by a
factory, and ``build_unet3d(..., block_wrapper=...)`` lets the LMS code decide how the
block's forward pass runs (kept, recomputed, offloaded) without re-creating layers.
"""

from __future__ import annotations

import logging
import math
import numbers
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import keras
import numpy as np
from keras import layers, ops

from brats_seg.config import ModelConfig

__all__ = [
    "Block",
    "BlockWrapper",
    "TrilinearUpSampling3D",
    "build_unet3d",
    "check_unet_config",
    "level_filters",
    "make_unet_blocks",
    "unet_block_names",
]

logger = logging.getLogger(__name__)

NORMS = ("instance", "group", "batch")
UPSAMPLES = ("transpose", "trilinear")
IN_CHANNELS = (1, 4)  # FLAIR only | FLAIR, T1, T1ce, T2
CONV_UNIT_LAYERS = 3  # conv -> norm -> ReLU: the tail of Block.split
NORM_EPSILON = 1e-5  # instance/group norm; the usual value (PyTorch, MONAI) rather than Keras' 1e-3

# (block_name, block, inputs) -> output; see build_unet3d.
BlockWrapper = Callable[[str, "Block", list], Any]


# ---------------------------------------------------------------------------------------
# Names and validation
# ---------------------------------------------------------------------------------------


def unet_block_names(depth: int) -> list[str]:
    """Block names in forward order.

    Args:
        depth: number of down-sampling steps (>= 1).

    Returns:
        ``["enc0", ..., f"enc{depth-1}", "bottleneck", f"dec{depth-1}", ..., "dec0", "head"]``.
    """
    _check_depth(depth)
    encoders = [f"enc{level}" for level in range(depth)]
    decoders = [f"dec{level}" for level in reversed(range(depth))]
    return [*encoders, "bottleneck", *decoders, "head"]


def level_filters(base_filters: int, depth: int) -> list[int]:
    """Filters per level, ``F_l = base_filters * 2**l`` for ``l = 0..depth``."""
    return [base_filters * 2**level for level in range(depth + 1)]


def _check_depth(depth: int) -> None:
    if not isinstance(depth, int) or depth < 1:
        raise ValueError(f"model.depth must be an integer >= 1, got {depth!r}.")


def _nearest_valid_shapes(shape: Sequence[int], multiple: int) -> list[tuple[int, ...]]:
    """The valid shapes just below and just above ``shape`` (each axis a multiple)."""
    below = tuple(max(multiple, (s // multiple) * multiple) for s in shape)
    above = tuple(-(-s // multiple) * multiple for s in shape)
    return sorted({below, above})


def check_unet_config(cfg: ModelConfig, input_shape: Sequence[int]) -> None:
    """Validate a model config against a spatial input shape.

    Args:
        cfg: the model config.
        input_shape: spatial shape ``(x, y, z)`` of the network input.

    Raises:
        ValueError: naming the bad value and what to use instead.
    """
    _check_depth(cfg.depth)
    if not isinstance(cfg.base_filters, int) or cfg.base_filters < 1:
        raise ValueError(f"model.base_filters must be an integer >= 1, got {cfg.base_filters!r}.")
    if cfg.in_channels not in IN_CHANNELS:
        raise ValueError(
            f"model.in_channels must be 4 (FLAIR,T1,T1ce,T2) or 1 (FLAIR only), got {cfg.in_channels!r}."
        )
    if not isinstance(cfg.out_channels, int) or cfg.out_channels < 1:
        raise ValueError(
            f"model.out_channels must be the number of sigmoid outputs (>= 1), got {cfg.out_channels!r}; "
            "0 means one output per region of data.layout and is resolved by "
            "brats_seg.config.resolve_model_outputs before a model is built."
        )
    if cfg.norm not in NORMS:
        raise ValueError(f"model.norm must be one of {', '.join(NORMS)}, got {cfg.norm!r}.")
    if cfg.norm == "group" and (not isinstance(cfg.groups, int) or cfg.groups < 1):
        raise ValueError(f"model.groups must be an integer >= 1 for norm=group, got {cfg.groups!r}.")
    if cfg.upsample not in UPSAMPLES:
        raise ValueError(f"model.upsample must be one of {', '.join(UPSAMPLES)}, got {cfg.upsample!r}.")
    shape = tuple(input_shape)
    if len(shape) != 3 or not all(isinstance(s, numbers.Integral) and s > 0 for s in shape):
        raise ValueError(f"input_shape must be three positive integers (x, y, z), got {input_shape!r}.")
    multiple = 2**cfg.depth
    if any(s % multiple for s in shape):
        options = " or ".join(str(s) for s in _nearest_valid_shapes(shape, multiple))
        raise ValueError(
            f"input shape {shape} is not divisible by 2**depth = {multiple} (model.depth={cfg.depth}). "
            f"Use a resolution shape of multiples of {multiple}, e.g. {options}, or lower model.depth."
        )


def _group_count(requested: int, channels: int) -> int:
    """The largest divisor of ``channels`` that is <= ``requested``."""
    groups = min(requested, channels)
    while channels % groups:
        groups -= 1
    return groups


# ---------------------------------------------------------------------------------------
# Layers
# ---------------------------------------------------------------------------------------


@keras.saving.register_keras_serializable(package="brats_seg")
class TrilinearUpSampling3D(layers.Layer):
    """Trilinear up-sampling by 2 along x, y and z (Keras 3's UpSampling3D is nearest only).

    Half-pixel centres with edge clamping, i.e. PyTorch ``Upsample(scale_factor=2,
    mode="trilinear", align_corners=False)`` and ``tf.image.resize(method="bilinear")``
    applied per axis. Trilinear interpolation is separable; for a factor of 2 each axis
    reduces to ``out[2i] = 0.75 x[i] + 0.25 x[i-1]`` and ``out[2i+1] = 0.75 x[i] + 0.25 x[i+1]``
    with the neighbours clamped at the edges. No weights; runs in the compute dtype.

    Input ``(B, x, y, z, C)`` -> output ``(B, 2x, 2y, 2z, C)``; spatial dims must be static.
    """

    def call(self, inputs):
        x = inputs
        for axis in (1, 2, 3):
            x = self._upsample_axis(x, axis)
        return x

    @staticmethod
    def _upsample_axis(x, axis: int):
        n = x.shape[axis]
        if n is None:
            raise ValueError(f"TrilinearUpSampling3D needs static spatial dims, got shape {x.shape}.")
        index = np.arange(n, dtype="int32")
        previous = ops.take(x, np.maximum(index - 1, 0), axis=axis)  # x[i-1], clamped at the edge
        following = ops.take(x, np.minimum(index + 1, n - 1), axis=axis)  # x[i+1], clamped
        even = 0.75 * x + 0.25 * previous
        odd = 0.75 * x + 0.25 * following
        interleaved = ops.stack([even, odd], axis=axis + 1)  # (..., n, 2, ...)
        new_shape = [-1, *x.shape[1:]]
        new_shape[axis] = 2 * n
        return ops.reshape(interleaved, new_shape)

    def compute_output_shape(self, input_shape):
        batch, *spatial, channels = input_shape
        return (batch, *[None if s is None else 2 * s for s in spatial], channels)


# ---------------------------------------------------------------------------------------
# Blocks
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Block:
    """One named U-Net block: its layers (created once) and its forward pass.

    Attributes:
        name: block name (``enc0``, ``bottleneck``, ``dec1``, ``head``); prefix of its layers.
        layers: the block's layers, in call order.
        apply: the forward pass ``apply(*inputs) -> output``, built only from ``layers``.
        build_fn: ``build_fn(*input_shapes) -> output_shape``; builds every layer from
            shapes without adding nodes to any graph (see :meth:`build`).
        split: ``(front, tail)`` with ``apply(*inputs) == tail(front(*inputs))``: ``tail``
            is the block's last conv unit (``conv2 -> norm2 -> relu2``), ``front`` the rest.
            LMS can recompute ``front`` and keep ``tail`` (see ``brats_seg.lms``). None for
            the head.
    """

    name: str
    layers: tuple
    apply: Callable[..., Any]
    build_fn: Callable[..., tuple]
    split: tuple[Callable[..., Any], Callable[[Any], Any]] | None = None

    def __call__(self, *inputs):
        return self.apply(*inputs)

    def build(self, *input_shapes) -> tuple:
        """Create every weight of the block from its input shapes; returns the output shape."""
        return self.build_fn(*input_shapes)

    @property
    def variables(self) -> list:
        """All weights of the block (trainable and not), e.g. for ``tf.custom_gradient``."""
        return [v for layer in self.layers for v in layer.weights]

    @property
    def trainable_variables(self) -> list:
        return [v for layer in self.layers for v in layer.trainable_weights]


def _chain_block(
    name: str,
    parts: Sequence[layers.Layer],
    up: Sequence[layers.Layer] = (),
    merge: layers.Layer | None = None,
    tail: int = 0,
) -> Block:
    """A block that runs its layers as a chain.

    Without ``merge``: ``apply(x) = parts[-1](...parts[0](x))``.
    With ``merge`` (decoder): ``apply(x, skip)`` runs ``up`` on ``x``, merges
    ``[up(x), skip]``, then runs ``parts``. ``tail > 0``: the last ``tail`` parts form
    :attr:`Block.split`'s tail.
    """
    parts, up = tuple(parts), tuple(up)
    front_parts, tail_parts = (parts[:-tail], parts[-tail:]) if tail else (parts, ())

    def run_front(run, x, skip=None):
        for layer in up:
            x = run(layer, x)
        if merge is not None:
            x = run(merge, [x, skip])
        for layer in front_parts:
            x = run(layer, x)
        return x

    def run_tail(run, x):
        for layer in tail_parts:
            x = run(layer, x)
        return x

    def apply(*inputs):
        return run_tail(_call, run_front(_call, *inputs))

    def build_fn(*input_shapes):
        return run_tail(_build, run_front(_build, *[tuple(s) for s in input_shapes]))

    split = None
    if tail:
        split = (lambda *inputs: run_front(_call, *inputs), lambda x: run_tail(_call, x))
    block_layers = up + ((merge,) if merge is not None else ()) + parts
    return Block(name=name, layers=block_layers, apply=apply, build_fn=build_fn, split=split)


def _call(layer: layers.Layer, x):
    return layer(x)


def _build(layer: layers.Layer, shape):
    """Build ``layer`` for input ``shape`` (a shape or list of shapes); return its output shape."""
    if not layer.built:
        layer.build(shape)
    return tuple(layer.compute_output_shape(shape))


def _norm_layer(cfg: ModelConfig, channels: int, name: str) -> layers.Layer:
    if cfg.norm == "instance":
        # groups=-1: one group per channel, statistics over (x, y, z) per sample = instance norm.
        return layers.GroupNormalization(groups=-1, epsilon=NORM_EPSILON, name=name)
    if cfg.norm == "group":
        groups = _group_count(cfg.groups, channels)
        if groups != cfg.groups:
            logger.debug("%s: %d groups do not divide %d channels; using %d", name, cfg.groups, channels, groups)
        return layers.GroupNormalization(groups=groups, epsilon=NORM_EPSILON, name=name)
    return layers.BatchNormalization(name=name)


def _two_conv_layers(name: str, filters: int, cfg: ModelConfig) -> list[layers.Layer]:
    """[Conv3D(F, 3, same, no bias) -> Norm -> ReLU] x 2, named ``<name>_{conv,norm,relu}{1,2}``."""
    parts: list[layers.Layer] = []
    for i in (1, 2):
        parts += [
            layers.Conv3D(
                filters, 3, padding="same", use_bias=False, kernel_initializer="he_normal", name=f"{name}_conv{i}"
            ),
            _norm_layer(cfg, filters, f"{name}_norm{i}"),
            layers.ReLU(name=f"{name}_relu{i}"),
        ]
    return parts


def encoder_block(name: str, filters: int, cfg: ModelConfig, pool: bool) -> Block:
    """``enc0`` (no pool), ``enc{l}`` and ``bottleneck`` (MaxPool3D(2) first): ``(B,x,y,z,C)`` ->
    ``(B,x',y',z',filters)`` with ``x' = x`` or ``x / 2``."""
    parts = [layers.MaxPooling3D(2, name=f"{name}_pool")] if pool else []
    return _chain_block(name, parts + _two_conv_layers(name, filters, cfg), tail=CONV_UNIT_LAYERS)


def decoder_block(name: str, filters: int, cfg: ModelConfig) -> Block:
    """``dec{l}``: ``apply(x (B,x,y,z,C'), skip (B,2x,2y,2z,F_l)) -> (B,2x,2y,2z,F_l)``."""
    if cfg.upsample == "transpose":
        up = [layers.Conv3DTranspose(filters, 2, strides=2, name=f"{name}_up")]
    else:
        up = [TrilinearUpSampling3D(name=f"{name}_up"), layers.Conv3D(filters, 1, name=f"{name}_upconv")]
    merge = layers.Concatenate(axis=-1, name=f"{name}_concat")
    return _chain_block(name, _two_conv_layers(name, filters, cfg), up=up, merge=merge, tail=CONV_UNIT_LAYERS)


def _prior_logit(prior: float) -> float:
    if not 0.0 < prior < 1.0:
        raise ValueError(f"model.foreground_prior={prior} should be in (0, 1), e.g. 0.01.")
    return float(math.log(prior / (1.0 - prior)))


@keras.saving.register_keras_serializable(package="brats_seg")
class NestedRegionSigmoid(layers.Layer):
    """Region probabilities from logits, each region within the one that contains it.

    ``p_r = sigmoid(z_r) * p_parent(r)`` (``sigmoid(z_r)`` alone where ``parents[r] < 0``):
    with the parents of :func:`brats_seg.data.labels.region_parents`, for BraTS
    ``P(TC) = P(WT) * P(TC | WT)`` and ``P(ET) = P(WT) * P(ET | WT)``. A sub-region's logit is
    trained only where the tumour is predicted: background voxels far from it, where
    ``P(WT)`` is near 0, give it no gradient, so a small region is not pushed to "empty" by
    the bulk of the volume before it has learned what it looks like (see README "Region
    outputs"). The parent factor is a constant to the sub-region's gradient
    (``stop_gradient``): the parent learns from its own reference alone, not pushed down
    at oedema voxels by the TC/ET losses through the product. Each sub-region is one
    product away from WT, not a chain of them: a product of several uncertain factors
    falls under the 0.5 threshold.

    Input ``(B, x, y, z, R)`` logits -> ``(B, x, y, z, R)`` probabilities, float32.

    Args:
        parents: per region, the index of its parent region (earlier in the order), or -1.
    """

    def __init__(self, parents, **kwargs):
        kwargs.setdefault("dtype", "float32")
        super().__init__(**kwargs)
        self.parents = tuple(int(p) for p in parents)
        bad = [(r, p) for r, p in enumerate(self.parents) if p >= r]
        if bad:
            raise ValueError(f"region parents must come earlier in the output order, got {self.parents!r}.")

    def call(self, logits):
        if logits.shape[-1] is not None and logits.shape[-1] != len(self.parents):
            raise ValueError(f"{len(self.parents)} region parents for {logits.shape[-1]} output channels.")
        probs = []
        for r, parent in enumerate(self.parents):
            p = ops.sigmoid(logits[..., r:r + 1])
            probs.append(p if parent < 0 else p * ops.stop_gradient(probs[parent]))
        return ops.concatenate(probs, axis=-1)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self) -> dict:
        return {**super().get_config(), "parents": list(self.parents)}


def head_block(cfg: ModelConfig) -> Block:
    """``head``: ``(B,x,y,z,F_0)`` -> sigmoid probabilities ``(B,x,y,z,out_channels)``, float32
    whatever the dtype policy (the loss and metrics then see float32).

    With ``cfg.region_parents`` naming a parent for some region (``model.regions=nested``,
    resolved from the layout), the head ends in :class:`NestedRegionSigmoid`; else in one
    independent sigmoid per region.
    """
    parents = list(cfg.region_parents) or [-1] * cfg.out_channels
    if len(parents) != cfg.out_channels:
        raise ValueError(f"model.region_parents={parents} must give one parent per output ({cfg.out_channels}).")
    nested = any(p >= 0 for p in parents)
    # Bias at the log-odds of a foreground prior: the net starts predicting background
    # (tumour is ~1% of voxels) instead of 0.5 everywhere, which speeds up early training.
    # A nested region's sigmoid is its probability within its parent: it starts at 0.5.
    bias = np.array([_prior_logit(cfg.foreground_prior) if p < 0 else 0.0 for p in parents], np.float32)
    parts = [
        layers.Conv3D(cfg.out_channels, 1, dtype="float32", name="head_conv",
                      bias_initializer=keras.initializers.Constant(bias)),
        NestedRegionSigmoid(parents, name="head_sigmoid") if nested
        else layers.Activation("sigmoid", dtype="float32", name="head_sigmoid"),
    ]
    return _chain_block("head", parts)


def make_unet_blocks(cfg: ModelConfig) -> dict[str, Block]:
    """All blocks of the U-Net, keyed by name in forward order (layers created, not built)."""
    filters = level_filters(cfg.base_filters, cfg.depth)
    blocks: dict[str, Block] = {}
    for level in range(cfg.depth):
        blocks[f"enc{level}"] = encoder_block(f"enc{level}", filters[level], cfg, pool=level > 0)
    blocks["bottleneck"] = encoder_block("bottleneck", filters[cfg.depth], cfg, pool=True)
    for level in reversed(range(cfg.depth)):
        blocks[f"dec{level}"] = decoder_block(f"dec{level}", filters[level], cfg)
    blocks["head"] = head_block(cfg)
    return blocks


# ---------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------


def build_unet3d(
    cfg: ModelConfig,
    input_shape: tuple[int, int, int],
    block_wrapper: BlockWrapper | None = None,
    blocks: dict[str, Block] | None = None,
) -> keras.Model:
    """Build the 3D U-Net as a functional Keras model named ``unet3d``.

    Args:
        cfg: model config (depth, base_filters, norm, groups, upsample, in/out channels).
        input_shape: spatial shape ``(x, y, z)``, each divisible by ``2**cfg.depth``.
        block_wrapper: optional ``(block_name, block, inputs) -> output`` that runs a
            block's whole forward pass (pool/up-sampling/concat included). ``block`` is a
            :class:`Block`, already built (its weights exist), callable as
            ``block(*inputs)``; ``inputs`` is ``[x]`` for ``enc*``/``bottleneck``/``head``
            and ``[x, skip]`` for ``dec*``. It is called once per block, in the order of
            :func:`unet_block_names`, on symbolic tensors. None calls ``block(*inputs)``.
        blocks: blocks from :func:`make_unet_blocks` to build on. Two models built on the
            same blocks share their layers and weights: training runs an LMS-wrapped model
            while checkpoints save its plain twin (wrapped models cannot be saved as .keras).

    Returns:
        Model ``(B, x, y, z, in_channels)`` -> ``(B, x, y, z, out_channels)`` sigmoid
        probabilities, float32 even under a mixed-precision policy.

    Raises:
        ValueError: bad config value or an input shape not divisible by ``2**depth``.
    """
    check_unet_config(cfg, input_shape)
    input_shape = tuple(int(s) for s in input_shape)
    blocks = blocks if blocks is not None else make_unet_blocks(cfg)
    run = block_wrapper or (lambda name, block, inputs: block(*inputs))

    def run_block(name: str, inputs: list):
        block = blocks[name]
        block.build(*[tuple(t.shape) for t in inputs])
        return run(name, block, inputs)

    image = keras.Input(shape=(*input_shape, cfg.in_channels), name="image")  # (B, x, y, z, C_in)
    skips = []
    x = image
    for level in range(cfg.depth):
        x = run_block(f"enc{level}", [x])  # (B, x/2^l, y/2^l, z/2^l, F_l)
        skips.append(x)
    x = run_block("bottleneck", [x])  # (B, x/2^d, ..., F_d)
    for level in reversed(range(cfg.depth)):
        x = run_block(f"dec{level}", [x, skips[level]])  # (B, x/2^l, ..., F_l)
    probabilities = run_block("head", [x])  # (B, x, y, z, C_out), float32
    logger.debug(
        "built unet3d depth=%d base_filters=%d norm=%s upsample=%s input=%s",
        cfg.depth, cfg.base_filters, cfg.norm, cfg.upsample, tuple(input_shape),
    )
    return keras.Model(image, probabilities, name="unet3d")
