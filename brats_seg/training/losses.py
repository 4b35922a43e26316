"""Training loss: soft Dice + binary cross-entropy on sigmoid region probabilities.

Tensors are channels-last ``(batch, x, y, z, regions)``; regions are WT, TC, ET (or WT only).
The loss is always computed in float32, also under a mixed-precision policy.
"""

from __future__ import annotations

import functools

import keras
from keras import ops

__all__ = ["SoftDiceBCELoss", "compute_bce", "compute_soft_dice", "compute_soft_dice_bce"]

SPATIAL_AXES = (1, 2, 3)  # x, y, z of (B, x, y, z, R)


def _as_float32(y_true, y_pred):
    y_true = ops.cast(y_true, "float32")
    y_pred = ops.cast(y_pred, "float32")
    if len(y_pred.shape) != 5:
        raise ValueError(f"y_pred should be (batch, x, y, z, regions), got shape {tuple(y_pred.shape)}.")
    return y_true, y_pred


def compute_soft_dice(y_true, y_pred, smooth: float = 1e-5):
    """Soft Dice per sample and region.

    Args:
        y_true: targets in {0, 1}, ``(B, x, y, z, R)``.
        y_pred: probabilities in [0, 1], ``(B, x, y, z, R)``.
        smooth: added to numerator and denominator; makes empty/empty give 1.

    Returns:
        ``(B, R)`` float32: ``(2 sum(t p) + smooth) / (sum(t) + sum(p) + smooth)`` over space.
    """
    y_true, y_pred = _as_float32(y_true, y_pred)
    intersection = ops.sum(y_true * y_pred, axis=SPATIAL_AXES)  # (B, R)
    total = ops.sum(y_true, axis=SPATIAL_AXES) + ops.sum(y_pred, axis=SPATIAL_AXES)  # (B, R)
    return (2.0 * intersection + smooth) / (total + smooth)


def compute_bce(y_true, y_pred):
    """Binary cross-entropy per sample, averaged over space and regions.

    Args:
        y_true: targets in {0, 1}, ``(B, x, y, z, R)``.
        y_pred: probabilities, ``(B, x, y, z, R)``; clipped to ``[eps, 1 - eps]``
            with ``eps = keras.config.epsilon()`` (1e-7).

    Returns:
        ``(B,)`` float32.
    """
    y_true, y_pred = _as_float32(y_true, y_pred)
    eps = keras.config.epsilon()
    p = ops.clip(y_pred, eps, 1.0 - eps)
    bce = -(y_true * ops.log(p) + (1.0 - y_true) * ops.log(1.0 - p))  # (B, x, y, z, R)
    return ops.mean(bce, axis=(1, 2, 3, 4))


def compute_soft_dice_bce(y_true, y_pred, bce_weight: float = 1.0, smooth: float = 1e-5, batch_dice: bool = False):
    """``1 - mean_r Dice[b, r] + bce_weight * BCE[b]`` per sample ``(B,)``, with its gradient by
    ``y_pred`` written out.

    ``batch_dice``: the Dice of each region is taken over the whole batch (its sums over the
    samples and space, as nnU-Net's ``batch_dice`` and MONAI's ``DiceLoss(batch=True)``) and
    every sample carries it: a sample whose region is empty then still gets a gradient against
    what it predicts there, which a per-sample Dice of an empty target (about 0 whatever is
    predicted, with a vanishing gradient) does not give.

    The value is that of :func:`compute_soft_dice` and :func:`compute_bce`. Differentiated
    automatically, the two kept about nine full-size float32 tensors of the head's output for
    backward (the clip's bounds, ``1 - p``, both logarithms, the products); the gradient is::

        dDice[b,r]/dp = (2 t - Dice[b,r]) / (sum t + sum p + smooth)
        (batch_dice: the batch's Dice and sums, and the Dice part of every sample's upstream summed)
        dBCE[b]/dp    = (p_c - t) / (p_c (1 - p_c)) / (x y z R)   where eps <= p <= 1 - eps, else 0

    (``p_c`` the clipped probability), so backward keeps only ``y_true`` (in its own dtype,
    uint8 from the pipeline), ``y_pred`` and the ``(B, R)`` sums. Both passes are compiled by
    XLA, which fuses their element-wise steps: no head-sized temporaries besides the results.
    No gradient flows to ``y_true``.
    """
    import tensorflow as tf

    y_pred = ops.cast(y_pred, "float32")
    y_true = ops.convert_to_tensor(y_true)
    if (
        len(y_pred.shape) != 5
        or len(y_true.shape) != 5
        or any(a is not None and b is not None and a != b for a, b in zip(y_true.shape, y_pred.shape))
    ):
        raise ValueError(
            f"y_true {tuple(y_true.shape)} and y_pred {tuple(y_pred.shape)} should both be (batch, x, y, z, regions)."
        )
    # The labels stay in their dtype (uint8 from the pipeline): the compiled passes cast them
    # where they read them, so no float32 copy of them is kept for backward.

    @tf.custom_gradient
    def loss(p):
        value, dice, total = _soft_dice_bce_forward(y_true, p, bce_weight, smooth, bool(batch_dice))

        def grad(upstream):  # upstream (B,)
            return _soft_dice_bce_gradient(y_true, p, dice, total, upstream, bce_weight, smooth, bool(batch_dice))

        return value, grad

    return loss(y_pred)


def _xla(fn):
    """``fn`` compiled by XLA: its element-wise chain runs as one fused loop, so the
    head-sized float32 temporaries autodiff-free code would still make (``1 - p``, logs,
    products) never exist; with no host placements inside, LMS is unaffected."""
    import tensorflow as tf

    return tf.function(fn, jit_compile=True, reduce_retracing=True)


@functools.cache
def _compiled():
    eps = keras.config.epsilon()

    def forward(y, p, bce_weight, smooth, batch_dice):
        y = ops.cast(y, "float32")
        intersection = tf_sum(y * p)  # (B, R)
        total = tf_sum(y) + tf_sum(p)
        if batch_dice:  # the batch's sums, carried by every sample
            intersection = ops.broadcast_to(ops.sum(intersection, axis=0, keepdims=True), ops.shape(intersection))
            total = ops.broadcast_to(ops.sum(total, axis=0, keepdims=True), ops.shape(total))
        dice = (2.0 * intersection + smooth) / (total + smooth)
        value = 1.0 - ops.mean(dice, axis=-1)
        pc = ops.clip(p, eps, 1.0 - eps)
        bce = -(y * ops.log(pc) + (1.0 - y) * ops.log(1.0 - pc))
        return value + bce_weight * ops.mean(bce, axis=(1, 2, 3, 4)), dice, total

    def gradient(y, p, dice, total, upstream, bce_weight, smooth, batch_dice):
        y = ops.cast(y, "float32")
        # every sample's value holds the batch's Dice: its gradient gathers all their upstreams
        dice_upstream = ops.broadcast_to(ops.sum(upstream), ops.shape(upstream)) if batch_dice else upstream
        regions = ops.cast(ops.shape(p)[-1], "float32")
        count = ops.cast(ops.prod(ops.shape(p)[1:]), "float32")
        inv_total = (1.0 / (total + smooth))[:, None, None, None, :]  # (B, 1, 1, 1, R)
        dp_dice = -(2.0 * y - dice[:, None, None, None, :]) * inv_total / regions
        pc = ops.clip(p, eps, 1.0 - eps)
        inside = ops.cast((p >= eps) & (p <= 1.0 - eps), "float32")
        dp_bce = (bce_weight / count) * inside * (pc - y) / (pc * (1.0 - pc))
        return dice_upstream[:, None, None, None, None] * dp_dice + upstream[:, None, None, None, None] * dp_bce

    def tf_sum(t):
        return ops.sum(t, axis=SPATIAL_AXES)

    return _xla(forward), _xla(gradient)


def _soft_dice_bce_forward(y, p, bce_weight, smooth, batch_dice=False):
    return _compiled()[0](y, p, bce_weight, smooth, batch_dice)


def _soft_dice_bce_gradient(y, p, dice, total, upstream, bce_weight, smooth, batch_dice=False):
    return _compiled()[1](y, p, dice, total, upstream, bce_weight, smooth, batch_dice)


@keras.saving.register_keras_serializable(package="brats_seg")
class SoftDiceBCELoss(keras.losses.Loss):
    """``1 - mean soft Dice + bce_weight * mean BCE`` on sigmoid probabilities.

    The Dice is taken per sample and region over space (``batch_dice``: per region over the
    batch and space, the same for every sample), then averaged over regions; the BCE is
    averaged over voxels and regions. Keras then averages the per-sample values over the
    batch (``sum_over_batch_size``), so for a batch the loss is
    ``1 - mean_{b,r} Dice[b, r] + bce_weight * mean_{b,x,y,z,r} BCE``.

    Args:
        bce_weight: weight of the cross-entropy term (``trainer.bce_weight``); >= 0.
        smooth: Dice smoothing term.
        batch_dice: Dice over the batch (``trainer.batch_dice``).
        name: loss name.
        **kwargs: passed to :class:`keras.losses.Loss` (e.g. ``reduction``).

    Call: ``loss(y_true (B,x,y,z,R), y_pred (B,x,y,z,R))`` -> float32 scalar.
    """

    def __init__(
        self,
        bce_weight: float = 1.0,
        smooth: float = 1e-5,
        name: str = "soft_dice_bce",
        batch_dice: bool = False,
        **kwargs,
    ):
        if bce_weight < 0:
            raise ValueError(f"bce_weight must be >= 0, got {bce_weight!r}.")
        if smooth <= 0:
            raise ValueError(f"smooth must be > 0 (it makes empty/empty Dice 1), got {smooth!r}.")
        kwargs.setdefault("dtype", "float32")
        super().__init__(name=name, **kwargs)
        self.bce_weight = float(bce_weight)
        self.smooth = float(smooth)
        self.batch_dice = bool(batch_dice)

    def call(self, y_true, y_pred):
        """Per-sample loss ``(B,)`` float32 (:func:`compute_soft_dice_bce`)."""
        return compute_soft_dice_bce(y_true, y_pred, self.bce_weight, self.smooth, self.batch_dice)

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(bce_weight=self.bce_weight, smooth=self.smooth, batch_dice=self.batch_dice)
        return config
