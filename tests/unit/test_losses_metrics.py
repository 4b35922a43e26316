"""Soft Dice + BCE loss and hard-Dice metrics against numpy on tiny arrays."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from brats_seg.training.losses import SoftDiceBCELoss, compute_bce, compute_soft_dice
from brats_seg.training.metrics import (
    MeanDice,
    RegionDice,
    compute_hard_dice,
    make_dice_metrics,
)

EPS = 1e-7  # keras.config.epsilon(): probabilities are clipped to [EPS, 1 - EPS]


def _volume(values, regions: int = 1) -> np.ndarray:
    """(B, n) values -> (B, n, 1, 1, R) float32 with the same values in every region."""
    a = np.asarray(values, dtype=np.float32)
    return np.repeat(a[:, :, None, None, None], regions, axis=-1)


# ---------------------------------------------------------------------------------------
# Loss
# ---------------------------------------------------------------------------------------


def test_soft_dice_hand_computed():
    # sample 0: t = [1, 0, 0, 0], p = [0.5, 0.5, 0, 0] -> 2*0.5 / (1 + 1) = 0.5
    # sample 1: t = [1, 1, 0, 0], p = [1, 1, 0, 0]     -> 2*2 / (2 + 2) = 1
    t = _volume([[1, 0, 0, 0], [1, 1, 0, 0]])
    p = _volume([[0.5, 0.5, 0, 0], [1, 1, 0, 0]])
    dice = compute_soft_dice(t, p, smooth=1e-5).numpy()
    assert dice.shape == (2, 1)
    np.testing.assert_allclose(dice[:, 0], [(1 + 1e-5) / (2 + 1e-5), 1.0], rtol=1e-6)


def test_soft_dice_both_empty_is_one():
    zeros = np.zeros((1, 2, 2, 2, 3), np.float32)
    np.testing.assert_allclose(compute_soft_dice(zeros, zeros).numpy(), 1.0)


def test_bce_hand_computed():
    # t = [1, 0], p = [0.8, 0.1]: (-ln 0.8 - ln 0.9) / 2
    t, p = _volume([[1, 0]]), _volume([[0.8, 0.1]])
    np.testing.assert_allclose(compute_bce(t, p).numpy(), [(-np.log(0.8) - np.log(0.9)) / 2], rtol=1e-6)


def _numpy_loss(t: np.ndarray, p: np.ndarray, bce_weight: float, smooth: float) -> float:
    inter = (t * p).sum(axis=(1, 2, 3))
    dice = (2 * inter + smooth) / (t.sum(axis=(1, 2, 3)) + p.sum(axis=(1, 2, 3)) + smooth)  # (B, R)
    q = np.clip(p, EPS, 1 - EPS)
    bce = -(t * np.log(q) + (1 - t) * np.log(1 - q))
    return float(1 - dice.mean() + bce_weight * bce.mean())


@pytest.mark.parametrize("bce_weight", [0.0, 1.0, 0.5])
def test_loss_matches_numpy(bce_weight):
    rng = np.random.default_rng(0)
    t = (rng.random((3, 4, 3, 2, 3)) > 0.6).astype(np.float32)
    p = rng.random((3, 4, 3, 2, 3)).astype(np.float32)
    t[1, ..., 2] = 0  # an empty region in one sample
    loss = SoftDiceBCELoss(bce_weight=bce_weight)(t, p)
    assert loss.dtype == "float32"
    np.testing.assert_allclose(float(loss), _numpy_loss(t, p, bce_weight, 1e-5), rtol=1e-5)


def test_loss_hand_computed_without_bce():
    t = _volume([[1, 0, 0, 0]])
    p = _volume([[0.5, 0.5, 0, 0]])
    np.testing.assert_allclose(float(SoftDiceBCELoss(bce_weight=0.0)(t, p)), 0.5, atol=1e-5)


def test_perfect_prediction_has_near_zero_loss():
    t = _volume([[1, 0, 1, 0]], regions=3)
    assert float(SoftDiceBCELoss()(t, t)) < 1e-5


def test_loss_is_float32_for_float16_predictions():
    rng = np.random.default_rng(1)
    t = (rng.random((2, 4, 4, 4, 3)) > 0.5).astype(np.float32)
    p32 = rng.random((2, 4, 4, 4, 3)).astype(np.float32)
    p16 = p32.astype(np.float16)
    loss = SoftDiceBCELoss()(t, p16)
    assert loss.dtype == "float32"
    np.testing.assert_allclose(float(loss), _numpy_loss(t, p16.astype(np.float32), 1.0, 1e-5), rtol=1e-5)


def test_loss_config_round_trip_and_validation():
    loss = SoftDiceBCELoss(bce_weight=0.3, smooth=1e-4)
    clone = SoftDiceBCELoss.from_config(loss.get_config())
    assert (clone.bce_weight, clone.smooth, clone.name) == (0.3, 1e-4, "soft_dice_bce")
    with pytest.raises(ValueError, match="bce_weight.*-1"):
        SoftDiceBCELoss(bce_weight=-1)
    with pytest.raises(ValueError, match="smooth"):
        SoftDiceBCELoss(smooth=0)


# ---------------------------------------------------------------------------------------
# Metrics
# ---------------------------------------------------------------------------------------


def _numpy_hard_dice(t: np.ndarray, p: np.ndarray) -> np.ndarray:
    """(B, x, y, z, R) -> (B, R); both empty -> 1."""
    ref, pred = t > 0.5, p > 0.5
    inter = (ref & pred).sum(axis=(1, 2, 3))
    total = ref.sum(axis=(1, 2, 3)) + pred.sum(axis=(1, 2, 3))
    return np.where(total > 0, 2 * inter / np.maximum(total, 1), 1.0)


def test_hard_dice_hand_computed():
    # sample 0: ref [1,1,0,0], pred>0.5 [1,0,1,0] -> 2*1/4 = 0.5
    # sample 1: both empty -> 1;  sample 2: ref empty, pred not -> 0
    t = _volume([[1, 1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]])
    p = _volume([[0.9, 0.5, 0.7, 0.2], [0.1, 0.5, 0.0, 0.3], [0.6, 0.0, 0.0, 0.0]])
    np.testing.assert_allclose(compute_hard_dice(t, p).numpy()[:, 0], [0.5, 1.0, 0.0])


def _batches(seed: int = 0):
    rng = np.random.default_rng(seed)
    batches = []
    for b in (3, 2):
        t = (rng.random((b, 4, 3, 2, 3)) > 0.7).astype(np.float32)
        p = rng.random((b, 4, 3, 2, 3)).astype(np.float32)
        batches.append((t, p))
    batches[0][0][0, ..., 2] = 0  # empty ET reference ...
    batches[0][1][0, ..., 2] = 0.1  # ... predicted empty: Dice 1
    batches[1][0][1, ..., 1] = 0  # empty TC reference, non-empty prediction: Dice 0
    return batches


def test_region_dice_is_mean_of_per_sample_dice_over_the_epoch():
    batches = _batches()
    expected = np.concatenate([_numpy_hard_dice(t, p) for t, p in batches])  # (5, 3)
    assert expected[0, 2] == 1.0 and expected[4, 1] == 0.0
    metrics = make_dice_metrics(("wt", "tc", "et"))
    assert [m.name for m in metrics] == ["dice_wt", "dice_tc", "dice_et", "dice_mean"]
    for t, p in batches:
        for m in metrics:
            m.update_state(t, p)
    for r, m in enumerate(metrics[:3]):
        np.testing.assert_allclose(float(m.result()), expected[:, r].mean(), rtol=1e-6)
    np.testing.assert_allclose(float(metrics[3].result()), expected.mean(), rtol=1e-6)
    for m in metrics:
        m.reset_state()
        assert float(m.result()) == 0.0


def test_region_dice_sample_weight():
    t, p = _batches()[0]
    weights = np.array([1.0, 0.0, 2.0], np.float32)
    metric = RegionDice(0, name="dice_wt")
    metric.update_state(t, p, sample_weight=weights)
    d = _numpy_hard_dice(t, p)[:, 0]
    np.testing.assert_allclose(float(metric.result()), (d * weights).sum() / weights.sum(), rtol=1e-6)


def test_wt_only_metrics_and_errors():
    metrics = make_dice_metrics(("wt",))
    assert [m.name for m in metrics] == ["dice_wt", "dice_mean"]
    t, p = _batches()[0]
    t, p = t[..., :1], p[..., :1]
    for m in metrics:
        m.update_state(t, p)
    np.testing.assert_allclose(float(metrics[0].result()), float(metrics[1].result()))
    with pytest.raises(ValueError, match="region_index 2.*1 output"):
        RegionDice(2, name="dice_et").update_state(t, p)
    with pytest.raises(ValueError, match="region_index.*got -1"):
        RegionDice(-1, name="dice_x")
    with pytest.raises(ValueError, match="distinct region names"):
        make_dice_metrics(("wt", "wt"))
    assert RegionDice(1, name="val_tc").name == "val_tc"
    assert [m.name for m in make_dice_metrics(("wt", "tc", "et", "rc"))][-2:] == ["dice_rc", "dice_mean"]
    assert MeanDice().name == "dice_mean"


def test_loss_and_metrics_inside_compiled_model():
    """Graph mode: model.evaluate on an identity model reports the numpy values."""
    batches = _batches()
    t = np.concatenate([b[0] for b in batches])
    p = np.concatenate([b[1] for b in batches])
    model = keras.Sequential([keras.Input((4, 3, 2, 3)), keras.layers.Identity()])
    model.compile(loss=SoftDiceBCELoss(), metrics=make_dice_metrics())
    results = model.evaluate(p, t, batch_size=2, verbose=0, return_dict=True)
    expected = _numpy_hard_dice(t, p)
    np.testing.assert_allclose(results["dice_et"], expected[:, 2].mean(), rtol=1e-5)
    np.testing.assert_allclose(results["dice_mean"], expected.mean(), rtol=1e-5)
    # Keras averages the per-batch losses weighted by batch size (2, 2, 1)
    per_batch = [_numpy_loss(t[i : i + 2], p[i : i + 2], 1.0, 1e-5) for i in (0, 2, 4)]
    np.testing.assert_allclose(results["loss"], np.average(per_batch, weights=[2, 2, 1]), rtol=1e-5)


def _numpy_batch_dice_loss(t: np.ndarray, p: np.ndarray, bce_weight: float, smooth: float) -> float:
    inter = (t * p).sum(axis=(0, 1, 2, 3))
    dice = (2 * inter + smooth) / (t.sum(axis=(0, 1, 2, 3)) + p.sum(axis=(0, 1, 2, 3)) + smooth)  # (R,)
    q = np.clip(p, EPS, 1 - EPS)
    bce = -(t * np.log(q) + (1 - t) * np.log(1 - q))
    return float(1 - dice.mean() + bce_weight * bce.mean())


def _autodiff_loss(t, p, bce_weight: float, batch_dice: bool):
    """The same loss written with plain ops, for TensorFlow to differentiate."""
    import tensorflow as tf

    axes = (0, 1, 2, 3) if batch_dice else (1, 2, 3)
    inter = tf.reduce_sum(t * p, axis=axes)
    dice = (2 * inter + 1e-5) / (tf.reduce_sum(t, axis=axes) + tf.reduce_sum(p, axis=axes) + 1e-5)
    q = tf.clip_by_value(p, EPS, 1 - EPS)
    bce = -(t * tf.math.log(q) + (1 - t) * tf.math.log(1 - q))
    return 1 - tf.reduce_mean(dice) + bce_weight * tf.reduce_mean(bce)


@pytest.mark.parametrize("batch_dice", [False, True])
def test_loss_and_its_written_out_gradient_match_plain_ops(batch_dice):
    import tensorflow as tf

    rng = np.random.default_rng(2)
    t = (rng.random((3, 4, 3, 2, 3)) > 0.6).astype(np.float32)
    t[1, ..., 2] = 0  # an empty region in one sample
    p = tf.constant(rng.uniform(0.05, 0.95, (3, 4, 3, 2, 3)).astype(np.float32))
    loss = SoftDiceBCELoss(bce_weight=0.7, batch_dice=batch_dice)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(p)
        ours = loss(t, p)
        plain = _autodiff_loss(tf.constant(t), p, 0.7, batch_dice)
    np.testing.assert_allclose(float(ours), float(plain), rtol=1e-5)
    if batch_dice:
        np.testing.assert_allclose(float(ours), _numpy_batch_dice_loss(t, p.numpy(), 0.7, 1e-5), rtol=1e-5)
    np.testing.assert_allclose(tape.gradient(ours, p).numpy(), tape.gradient(plain, p).numpy(), rtol=1e-4, atol=1e-7)


def test_batch_dice_gives_a_sample_without_the_region_a_gradient_against_predicting_it():
    import tensorflow as tf

    t = np.zeros((2, 4, 4, 4, 1), np.float32)
    t[0, :2] = 1  # the region in the first sample only
    p = tf.constant(np.full((2, 4, 4, 4, 1), 0.3, np.float32))
    grads = {}
    for batch_dice in (False, True):
        with tf.GradientTape() as tape:
            tape.watch(p)
            value = SoftDiceBCELoss(bce_weight=0.0, batch_dice=batch_dice)(t, p)
        grads[batch_dice] = tape.gradient(value, p).numpy()[1]  # the empty sample
    assert np.abs(grads[False]).max() < 1e-6  # per-sample Dice of an empty target: next to nothing to learn
    assert (grads[True] > 1e-4).all()  # over the batch: lower it there
    clone = SoftDiceBCELoss.from_config(SoftDiceBCELoss(batch_dice=True).get_config())
    assert clone.batch_dice is True
