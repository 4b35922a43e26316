"""Training loss: soft Dice + binary cross-entropy on sigmoid region probabilities.

Tensors are channels-last ``(batch, x, y, z, regions)``; regions are WT, TC, ET (or WT only).
The loss is always computed in float32, also under a mixed-precision policy.
"""

from __future__ import annotations

import keras
from keras import ops

__all__ = ["SoftDiceBCELoss", "compute_soft_dice", "compute_bce"]

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


@keras.saving.register_keras_serializable(package="brats_seg")
class SoftDiceBCELoss(keras.losses.Loss):
    """``1 - mean soft Dice + bce_weight * mean BCE`` on sigmoid probabilities.

    The Dice is taken per sample and region over space, then averaged over regions;
    the BCE is averaged over voxels and regions. Keras then averages the per-sample
    values over the batch (``sum_over_batch_size``), so for a batch the loss is
    ``1 - mean_{b,r} Dice[b, r] + bce_weight * mean_{b,x,y,z,r} BCE``.

    Args:
        bce_weight: weight of the cross-entropy term (``trainer.bce_weight``); >= 0.
        smooth: Dice smoothing term.
        name: loss name.
        **kwargs: passed to :class:`keras.losses.Loss` (e.g. ``reduction``).

    Call: ``loss(y_true (B,x,y,z,R), y_pred (B,x,y,z,R))`` -> float32 scalar.
    """

    def __init__(self, bce_weight: float = 1.0, smooth: float = 1e-5, name: str = "soft_dice_bce", **kwargs):
        if bce_weight < 0:
            raise ValueError(f"bce_weight must be >= 0, got {bce_weight!r}.")
        if smooth <= 0:
            raise ValueError(f"smooth must be > 0 (it makes empty/empty Dice 1), got {smooth!r}.")
        kwargs.setdefault("dtype", "float32")
        super().__init__(name=name, **kwargs)
        self.bce_weight = float(bce_weight)
        self.smooth = float(smooth)

    def call(self, y_true, y_pred):
        """Per-sample loss ``(B,)`` float32."""
        dice = compute_soft_dice(y_true, y_pred, self.smooth)  # (B, R)
        loss = 1.0 - ops.mean(dice, axis=-1)  # (B,)
        if self.bce_weight:
            loss = loss + self.bce_weight * compute_bce(y_true, y_pred)
        return loss

    def get_config(self) -> dict:
        config = super().get_config()
        config.update(bce_weight=self.bce_weight, smooth=self.smooth)
        return config
