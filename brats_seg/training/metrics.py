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

__all__ = [
    "MeanDice",
    "RegionDice",
    "RegionProbability",
    "RegionVolume",
    "compute_hard_dice",
    "make_dice_metrics",
    "make_region_monitors",
]

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

    def _values(self, y_true, y_pred):  # (B,) per-sample values to average
        return self._per_sample(compute_hard_dice(y_true, y_pred, self.threshold))

    def per_sample(self, y_true, y_pred):
        """``(B,)`` the values this metric averages; the training loop sums them over replicas."""
        if hasattr(self, "region_index"):
            _check_region_index(self, y_pred)
        return self._values(y_true, y_pred)

    def update_state(self, y_true, y_pred, sample_weight=None):
        values = self._values(y_true, y_pred)  # (B,)
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
        _check_region_index(self, y_pred)
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


def _check_region_index(metric, y_pred) -> None:
    regions = y_pred.shape[-1]
    if regions is not None and metric.region_index >= regions:
        raise ValueError(
            f"{metric.name}: region_index {metric.region_index} is out of range for {regions} output "
            f"region(s); make the metrics from the model's regions (make_dice_metrics, make_region_monitors)."
        )


@keras.saving.register_keras_serializable(package="brats_seg")
class RegionProbability(_PerSampleMean):
    """Mean predicted probability of one region over all voxels, averaged over samples.

    A monitor, not a score: a region output whose mean probability stays at the head's
    prior (``model.foreground_prior``) or falls below it while the reference is not
    empty is not learning.

    Args:
        region_index: channel of the region in ``(B, x, y, z, R)``.
        name: ``prob_<region>``.
    """

    def __init__(self, region_index: int, name: str, threshold: float = 0.5, dtype=None):
        super().__init__(
            threshold=threshold, name=name, dtype=dtype
        )  # threshold unused: kept for the config round trip
        self.region_index = int(region_index)

    def _values(self, y_true, y_pred):
        _check_region_index(self, y_pred)
        return ops.mean(ops.cast(y_pred[..., self.region_index], "float32"), axis=SPATIAL_AXES)  # (B,)

    def get_config(self) -> dict:
        return {**super().get_config(), "region_index": self.region_index}


@keras.saving.register_keras_serializable(package="brats_seg")
class RegionVolume(_PerSampleMean):
    """Mean volume per sample (mL on the network grid) of one region, predicted or reference.

    Args:
        region_index: channel of the region in ``(B, x, y, z, R)``.
        name: ``vol_<region>`` (predicted, ``y_pred > threshold``) or ``ref_vol_<region>``.
        voxel_ml: volume of one network voxel in mL (``spacing_mm ** 3 / 1000``).
        reference: measure ``y_true`` (> 0.5) instead of the prediction.
        threshold: probability threshold for the prediction.
    """

    def __init__(
        self,
        region_index: int,
        name: str,
        voxel_ml: float = 1.0,
        reference: bool = False,
        threshold: float = 0.5,
        dtype=None,
    ):
        if voxel_ml <= 0:
            raise ValueError(f"voxel_ml must be > 0 (mL per network voxel), got {voxel_ml!r}.")
        super().__init__(threshold=threshold, name=name, dtype=dtype)
        self.region_index = int(region_index)
        self.voxel_ml = float(voxel_ml)
        self.reference = bool(reference)

    def _values(self, y_true, y_pred):
        _check_region_index(self, y_pred)
        mask = y_true[..., self.region_index] if self.reference else y_pred[..., self.region_index]
        cut = 0.5 if self.reference else self.threshold
        voxels = ops.sum(ops.cast(ops.cast(mask, "float32") > cut, "float32"), axis=SPATIAL_AXES)  # (B,)
        return voxels * self.voxel_ml

    def get_config(self) -> dict:
        return {
            **super().get_config(),
            "region_index": self.region_index,
            "voxel_ml": self.voxel_ml,
            "reference": self.reference,
        }


def make_region_monitors(
    regions=("wt", "tc", "et"), voxel_ml: float = 1.0, threshold: float = 0.5
) -> list[keras.metrics.Metric]:
    """Per-region training monitors: ``prob_<r>``, ``vol_<r>`` and ``ref_vol_<r>`` (mL).

    Args:
        regions: region names in output-channel order.
        voxel_ml: volume of one network voxel in mL.
        threshold: probability threshold of the predicted volume.
    """
    out: list[keras.metrics.Metric] = []
    for i, r in enumerate(regions):
        out += [
            RegionProbability(i, name=f"prob_{r}"),
            RegionVolume(i, name=f"vol_{r}", voxel_ml=voxel_ml, threshold=threshold),
            RegionVolume(i, name=f"ref_vol_{r}", voxel_ml=voxel_ml, reference=True),
        ]
    return out


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
