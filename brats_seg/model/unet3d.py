"""The 3D U-Net of Çiçek et al. (2016) in Keras, built from named blocks a memory plan can address.

Tensors are channels-last ``(batch, x, y, z, channels)`` in RAS throughout.

The network (blocks, layers, channels, dtypes) is described once, without Keras, by
:mod:`brats_seg.model.topology`; this module makes a Keras layer for each layer there
and wires the blocks as the topology says. What only Keras needs stays here: the layer
classes (:class:`TrilinearUpSampling3D`, :class:`NestedRegionSigmoid`), initialisers, and
the :class:`Block` mechanics.

Every layer is named ``<block>_<part>`` (``enc0_conv1``, ``dec2_up``, ``head_conv``), so
``model.get_layer("bottleneck_conv2")`` works and a plan can address a block by its
prefix. Each block is a :class:`Block`: its layers are created (and built) once by a
factory, and ``build_unet3d(..., block_wrapper=...)`` lets the LMS code decide how the
block's forward pass runs (kept, recomputed, offloaded) without re-creating layers.
Every TwoConv block also exposes ``Block.split = (front, tail)``: ``tail`` is its last
conv unit, ``front`` everything before it. LMS recomputes ``front`` and keeps ``tail`` in
the last block before the head, whose backward runs right after its forward (see
``brats_seg.lms``).
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import keras
import numpy as np
from keras import layers, ops

from brats_seg.config import ModelConfig
from brats_seg.model.checks import check_region_parents, check_unet_config
from brats_seg.model.norm import GroupNorm
from brats_seg.model.topology import BlockSpec, LayerSpec, unet_topology

__all__ = [
    "Block",
    "BlockCallWrapper",
    "NestedRegionSigmoid",
    "TrilinearUpSampling3D",
    "build_unet3d",
    "make_unet_blocks",
]

logger = logging.getLogger(__name__)

NORM_EPSILON = 1e-5  # instance/group norm; the usual value (PyTorch, MONAI) rather than Keras' 1e-3

# (block_name, block, inputs) -> output; see build_unet3d.
BlockCallWrapper = Callable[
    [str, "Block", list], Any
]  # what runs a block (brats_seg.lms.runtime.offload.BlockWrapper is one)


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


def _block_from_spec(spec: BlockSpec, cfg: ModelConfig) -> Block:
    """A :class:`Block` with one Keras layer per layer of ``spec``, run as the topology wires them.

    ``apply(*inputs)`` takes the block's inputs in the order of ``spec.inputs``; a ``cast``
    of the topology is Keras' autocast inside the next layer, so it passes its input on.
    """
    made = {layer.name: _make_layer(layer, cfg) for layer in spec.model_layers}

    def run_layers(run, part: Sequence[LayerSpec], values: dict):
        for layer in part:
            args = [values[t.name] for t in layer.inputs]
            keras_layer = made.get(layer.name)
            if keras_layer is None:  # cast
                values[layer.output.name] = args[0]
            else:
                values[layer.output.name] = run(keras_layer, args[0] if len(args) == 1 else args)
        return values[part[-1].output.name]

    def inputs_of(values) -> dict:
        return {t.name: v for t, v in zip(spec.inputs, values)}

    def apply(*inputs):
        return run_layers(_call, spec.layers, inputs_of(inputs))

    def build_fn(*input_shapes):
        return run_layers(_build, spec.layers, inputs_of(tuple(s) for s in input_shapes))

    split = None
    if spec.tail_start is not None:
        front, tail = spec.layers[: spec.tail_start], spec.layers[spec.tail_start :]
        feed = tail[0].inputs[0].name  # the tail reads only the front's output
        split = (
            lambda *inputs: run_layers(_call, front, inputs_of(inputs)),
            lambda x: run_layers(_call, tail, {feed: x}),
        )
    return Block(name=spec.name, layers=tuple(made.values()), apply=apply, build_fn=build_fn, split=split)


def _call(layer: layers.Layer, x):
    return layer(x)


def _build(layer: layers.Layer, shape):
    """Build ``layer`` for input ``shape`` (a shape or list of shapes); return its output shape."""
    if not layer.built:
        layer.build(shape)
    return tuple(layer.compute_output_shape(shape))


def _make_layer(spec: LayerSpec, cfg: ModelConfig) -> layers.Layer:
    """The Keras layer of one topology layer (initialisers and Keras options are chosen here)."""
    name, channels = spec.name, spec.output.channels
    if spec.kind == "conv" and name == "head_conv":  # compute dtype; the sigmoid after it is float32
        return layers.Conv3D(
            channels, spec.kernel, name=name, bias_initializer=keras.initializers.Constant(_head_bias(cfg))
        )
    if spec.kind == "conv" and spec.kernel == 1:  # dec{l}_upconv
        return layers.Conv3D(channels, 1, name=name)
    if spec.kind == "conv":  # TwoConv: a norm and a ReLU follow
        return layers.Conv3D(
            channels, spec.kernel, padding="same", use_bias=spec.bias, kernel_initializer="he_normal", name=name
        )
    if spec.kind == "norm":
        return _norm_layer(spec, cfg)
    if spec.kind == "relu":
        return layers.ReLU(name=name)
    if spec.kind == "pool":
        return layers.MaxPooling3D(2, name=name)
    if spec.kind == "up_transpose":
        return layers.Conv3DTranspose(channels, spec.kernel, strides=2, name=name)
    if spec.kind == "up_trilinear":
        return TrilinearUpSampling3D(name=name)
    if spec.kind == "concat":
        return layers.Concatenate(axis=-1, name=name)
    if spec.kind == "sigmoid":
        return layers.Activation("sigmoid", dtype="float32", name=name)
    if spec.kind == "nest":
        return NestedRegionSigmoid(spec.parents, name=name)
    raise ValueError(f"{name}: no Keras layer for kind {spec.kind!r}.")


def _norm_layer(spec: LayerSpec, cfg: ModelConfig) -> layers.Layer:
    """Instance and group norm keep only their input (compute dtype) for backward (model/norm.py)."""
    if spec.norm == "instance":
        # groups=-1: one group per channel, statistics over (x, y, z) per sample = instance norm.
        return GroupNorm(groups=-1, epsilon=NORM_EPSILON, name=spec.name)
    if spec.norm == "group":
        if spec.groups != cfg.groups:
            logger.debug(
                "%s: %d groups do not divide %d channels; using %d",
                spec.name,
                cfg.groups,
                spec.output.channels,
                spec.groups,
            )
        return GroupNorm(groups=spec.groups, epsilon=NORM_EPSILON, name=spec.name)
    return layers.BatchNormalization(name=spec.name)


def _prior_logit(prior: float) -> float:
    if not 0.0 < prior < 1.0:
        raise ValueError(f"model.foreground_prior={prior} should be in (0, 1), e.g. 0.01.")
    return float(math.log(prior / (1.0 - prior)))


def _head_bias(cfg: ModelConfig) -> np.ndarray:
    """Bias at the log-odds of a foreground prior: the net starts predicting background
    (tumour is ~1% of voxels) instead of 0.5 everywhere, which speeds up early training.
    A nested region's sigmoid is its probability within its parent: it starts at 0.5."""
    parents = list(cfg.region_parents) or [-1] * cfg.out_channels
    return np.array([_prior_logit(cfg.foreground_prior) if p < 0 else 0.0 for p in parents], np.float32)


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
        check_region_parents(self.parents)

    def call(self, logits):
        if logits.shape[-1] is not None and logits.shape[-1] != len(self.parents):
            raise ValueError(f"{len(self.parents)} region parents for {logits.shape[-1]} output channels.")
        return nested_sigmoid(logits, self.parents)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self) -> dict:
        return {**super().get_config(), "parents": list(self.parents)}


def nested_sigmoid(logits, parents: Sequence[int]):
    """``p_r = sigmoid(z_r) * stop_gradient(p_parent(r))`` for ``logits (B, x, y, z, R)`` float32.

    Written with its gradient, ``dL/dz_r = dL/dp_r * s_r (1 - s_r) * p_parent(r)`` with
    ``s = sigmoid(z)``: backward keeps ``s`` and the output ``p`` (which the loss keeps
    anyway), where automatic differentiation of the loop kept every slice, product and
    stop-gradient copy, about three times the head's output in float32. Forward and
    backward are compiled by XLA (no host placements inside, so LMS is unaffected), which
    fuses their element-wise steps: no head-sized temporaries besides the results.
    """
    import tensorflow as tf

    parents = tuple(int(p) for p in parents)
    forward_fn, gradient_fn = _nested_sigmoid_fns(parents)

    @tf.custom_gradient
    def forward(z):
        s, p = forward_fn(z)

        def grad(dp):
            return gradient_fn(dp, s, p)

        return p, grad

    return forward(logits)


@functools.cache
def _nested_sigmoid_fns(parents: tuple[int, ...]):
    """XLA-compiled ``z -> (s, p)`` and ``(dp, s, p) -> dz`` of :func:`nested_sigmoid`."""
    import tensorflow as tf

    def forward(z):
        s = tf.sigmoid(z)
        probs = []
        for r, parent in enumerate(parents):
            probs.append(s[..., r : r + 1] if parent < 0 else s[..., r : r + 1] * probs[parent])
        return s, tf.concat(probs, axis=-1)

    def gradient(dp, s, p):
        parent_p = tf.concat(
            [tf.ones_like(s[..., :1]) if parent < 0 else p[..., parent : parent + 1] for parent in parents], axis=-1
        )
        return dp * s * (1.0 - s) * parent_p

    return (
        tf.function(forward, jit_compile=True, reduce_retracing=True),
        tf.function(gradient, jit_compile=True, reduce_retracing=True),
    )


def make_unet_blocks(cfg: ModelConfig) -> dict[str, Block]:
    """All blocks of the U-Net, keyed by name in forward order (layers created, not built).

    The head ends in :class:`NestedRegionSigmoid` when ``cfg.region_parents`` names a parent
    for some region (``model.regions=nested``, resolved from the layout), else in one
    independent sigmoid per region; it runs in float32 whatever the dtype policy.
    """
    return {spec.name: _block_from_spec(spec, cfg) for spec in unet_topology(cfg).blocks}


# ---------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------


def build_unet3d(
    cfg: ModelConfig,
    input_shape: tuple[int, int, int],
    block_wrapper: BlockCallWrapper | None = None,
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
            :func:`~brats_seg.model.topology.unet_block_names`, on symbolic tensors. None
            calls ``block(*inputs)``.
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

    image = keras.Input(shape=(*input_shape, cfg.in_channels), name="image")  # (B, x, y, z, C_in)
    tensors = {"image": image}  # topology tensor name -> symbolic tensor; block outputs by block name
    for spec in unet_topology(cfg).blocks:  # enc0 .. bottleneck .. dec0, head
        inputs = [tensors[t.name] for t in spec.inputs]  # [x], or [x, skip] for dec{l}
        blocks[spec.name].build(*[tuple(t.shape) for t in inputs])
        tensors[spec.name] = run(spec.name, blocks[spec.name], inputs)  # (B, x/2^l, y/2^l, z/2^l, F_l)
    probabilities = tensors["head"]  # (B, x, y, z, C_out), float32
    logger.debug(
        "built unet3d depth=%d base_filters=%d norm=%s upsample=%s input=%s",
        cfg.depth,
        cfg.base_filters,
        cfg.norm,
        cfg.upsample,
        tuple(input_shape),
    )
    return keras.Model(image, probabilities, name="unet3d")
