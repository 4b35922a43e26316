"""Training metrics: hard Dice per region, averaged per sample over an epoch.

Tensors are channels-last ``(batch, x, y, z, regions)``; regions are those of the layout
(WT, TC, ET, and RC for brats2024) or WT only. Like BraTS scoring, a sample whose prediction and reference are both empty scores
Dice 1, and the epoch value is the mean of per-sample Dice (not a pooled Dice). These are
training/validation monitors on the network grid; the scores that count are computed on
the native grid by ``brats_seg.evaluation``.

Three layers: :func:`compute_hard_dice` (the maths), :class:`RegionDice` /
:class:`MeanDice` (epoch accumulators), :func:`make_dice_metrics` (the set a model gets).
"""

from __future__ import annotations

import keras
from keras import ops

__all__ = ["RegionDice", "MeanDice", "compute_hard_dice", "make_dice_metrics"]

SPATIAL_AXES = (1, 2, 3)  # x, y, z of (B, x, y, z, R)


def compute_hard_dice(y_true, y_pred, threshold: float = 0.5):
    """Hard Dice per sample and region.

    Args:
        y_true: reference, ``(B, x, y, z, R)``; a voxel is foreground where ``y_true > 0.5``.
        y_pred: probabilities, ``(B, x, y, z, R)``; foreground where ``y_pred > threshold``.
        threshold: probability threshold.

    Returns:
        ``(B, R)`` float32; 1 where both masks are empty.
    """
    if len(y_pred.shape) != 5:
        raise ValueError(f"y_pred should be (batch, x, y, z, regions), got shape {tuple(y_pred.shape)}.")
    ref = ops.cast(ops.cast(y_true, "float32") > 0.5, "float32")
    pred = ops.cast(ops.cast(y_pred, "float32") > threshold, "float32")
    intersection = ops.sum(ref * pred, axis=SPATIAL_AXES)  # (B, R)
    total = ops.sum(ref, axis=SPATIAL_AXES) + ops.sum(pred, axis=SPATIAL_AXES)  # (B, R)
    return ops.where(total > 0, 2.0 * intersection / ops.maximum(total, 1.0), 1.0)


class _PerSampleMean(keras.metrics.Metric):
    """Accumulates the (weighted) mean of a per-sample value over an epoch."""

    def __init__(self, threshold: float = 0.5, name: str | None = None, dtype=None):
        super().__init__(name=name, dtype=dtype or "float32")
        self.threshold = float(threshold)
        self.total = self.add_variable(shape=(), initializer="zeros", name="total", dtype="float32")
        self.count = self.add_variable(shape=(), initializer="zeros", name="count", dtype="float32")

    def _per_sample(self, dice):  # (B, R) -> (B,): the mean over regions; RegionDice picks one
        return ops.mean(dice, axis=-1)

    def update_state(self, y_true, y_pred, sample_weight=None):
        values = self._per_sample(compute_hard_dice(y_true, y_pred, self.threshold))  # (B,)
        if sample_weight is None:
            weights = ops.ones_like(values)
        else:
            weights = ops.reshape(ops.cast(sample_weight, "float32"), (-1,)) * ops.ones_like(values)
        self.total.assign_add(ops.sum(values * weights))
        self.count.assign_add(ops.sum(weights))

    def result(self):
        return ops.divide_no_nan(self.total, self.count)

    def reset_state(self):
        self.total.assign(0.0)
        self.count.assign(0.0)

    def get_config(self) -> dict:
        return {**super().get_config(), "threshold": self.threshold}


@keras.saving.register_keras_serializable(package="brats_seg")
class RegionDice(_PerSampleMean):
    """Mean over samples of the hard Dice of one region.

    Args:
        region_index: channel of the region in ``(B, x, y, z, R)`` (0 = WT).
        name: metric name, ``dice_<region>`` (e.g. ``dice_tc``).
        threshold: probability threshold (``y_pred > threshold`` is foreground).
    """

    def __init__(self, region_index: int, name: str, threshold: float = 0.5, dtype=None):
        if not isinstance(region_index, int) or region_index < 0:
            raise ValueError(f"region_index must be a channel index >= 0, got {region_index!r}.")
        super().__init__(threshold=threshold, name=name, dtype=dtype)
        self.region_index = region_index

    def update_state(self, y_true, y_pred, sample_weight=None):
        regions = y_pred.shape[-1]
        if regions is not None and self.region_index >= regions:
            raise ValueError(
                f"{self.name}: region_index {self.region_index} is out of range for {regions} output "
                f"region(s); make the metrics from the model's regions (make_dice_metrics)."
            )
        super().update_state(y_true, y_pred, sample_weight)

    def _per_sample(self, dice):
        return dice[:, self.region_index]

    def get_config(self) -> dict:
        return {**super().get_config(), "region_index": self.region_index}


@keras.saving.register_keras_serializable(package="brats_seg")
class MeanDice(_PerSampleMean):
    """Mean over samples of the hard Dice averaged over all regions (``dice_mean``).

    Equals the mean of the :class:`RegionDice` values of the same epoch.

    Args:
        name: metric name.
        threshold: probability threshold (``y_pred > threshold`` is foreground).
    """

    def __init__(self, name: str = "dice_mean", threshold: float = 0.5, dtype=None):
        super().__init__(threshold=threshold, name=name, dtype=dtype)


def make_dice_metrics(regions=("wt", "tc", "et"), threshold: float = 0.5) -> list[keras.metrics.Metric]:
    """The Dice metrics a model predicting ``regions`` is compiled with.

    Args:
        regions: region names in output-channel order (``brats_seg.data.labels.output_regions``).
        threshold: probability threshold.

    Returns:
        ``[dice_<r> for r in regions] + [dice_mean]`` (so ``val_dice_mean`` always exists for
        model selection).
    """
    regions = tuple(regions)
    if not regions or len(set(regions)) != len(regions):
        raise ValueError(f"regions must be distinct region names, one per output channel, got {regions!r}.")
    per_region = [RegionDice(i, name=f"dice_{r}", threshold=threshold) for i, r in enumerate(regions)]
    return [*per_region, MeanDice(threshold=threshold)]
