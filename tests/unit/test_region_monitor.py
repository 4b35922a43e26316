"""Per-region training monitors (mean probability, predicted and reference volume) and the
one-time warning for a region whose prediction stays empty while its reference is not."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from brats_seg.training.callbacks import DeadRegionWarning
from brats_seg.training.metrics import RegionProbability, RegionVolume, make_region_monitors

REGIONS = ("wt", "tc", "et")


def _labels(n=4, shape=(8, 10, 6), seed=0):
    """Nested regions (ET in TC in WT), every region non-empty in every case, (n, x, y, z, 3)."""
    rng = np.random.default_rng(seed)
    y = np.zeros((n, *shape, 3), np.float32)
    for i in range(n):
        x0 = int(rng.integers(0, 3))
        y[i, x0 : x0 + 5, 2:8, 1:5, 0] = 1
        y[i, x0 + 1 : x0 + 4, 3:7, 2:4, 1] = 1
        y[i, x0 + 2 : x0 + 3, 4:6, 2:4, 2] = 1
    return y


def test_monitors_measure_probability_and_volumes_in_ml():
    y = _labels()
    p = np.where(y > 0, 0.9, 0.1).astype(np.float32)
    p[..., 1] = 0.2  # TC predicted nowhere
    voxel_ml = 8 / 1000  # 2 mm voxels
    probs = RegionProbability(1, "prob_tc")
    vol, ref = RegionVolume(0, "vol_wt", voxel_ml), RegionVolume(1, "ref_vol_tc", voxel_ml, reference=True)
    for m in (probs, vol, ref):
        m.update_state(y, p)
    np.testing.assert_allclose(float(probs.result()), 0.2, rtol=1e-6)
    np.testing.assert_allclose(float(vol.result()), y[..., 0].sum(axis=(1, 2, 3)).mean() * voxel_ml, rtol=1e-6)
    np.testing.assert_allclose(float(ref.result()), y[..., 1].sum(axis=(1, 2, 3)).mean() * voxel_ml, rtol=1e-6)
    names = [m.name for m in make_region_monitors(REGIONS, voxel_ml)]
    assert names[:3] == ["prob_wt", "vol_wt", "ref_vol_wt"] and len(names) == 9
    with pytest.raises(ValueError, match="voxel_ml"):
        RegionVolume(0, "vol_wt", voxel_ml=0)
    with pytest.raises(ValueError, match="region_index 3.*3 output"):
        RegionVolume(3, "vol_rc").update_state(y, p)


def _fit(dead_region: int | None, caplog, epochs=3):
    """A fixed 1x1x1 model that reproduces its input labels, with one output channel forced empty."""
    import keras

    y = _labels()
    inputs = keras.Input(y.shape[1:])
    kernel = 10.0 * np.eye(3, dtype=np.float32).reshape(1, 1, 1, 3, 3)  # logit = 10 * label - 5
    logits = keras.layers.Conv3D(
        3,
        1,
        kernel_initializer=keras.initializers.Constant(kernel),
        bias_initializer=keras.initializers.Constant(-5.0),
        name="head",
    )(inputs)
    if dead_region is not None:  # the region's logit pushed far below 0: sigmoid never crosses 0.5
        mask = np.ones(3, np.float32)
        mask[dead_region] = 0.0
        logits = keras.layers.Lambda(lambda t: t * mask - 20.0 * (1 - mask))(logits)
    model = keras.Model(inputs, keras.layers.Activation("sigmoid")(logits))
    model.compile(
        optimizer=keras.optimizers.SGD(0.0), loss="binary_crossentropy", metrics=make_region_monitors(REGIONS, 0.064)
    )
    warn = DeadRegionWarning(REGIONS, epochs=2)
    with caplog.at_level(logging.WARNING, logger="brats_seg.training.callbacks"):
        hist = model.fit(y, y, validation_data=(y, y), epochs=epochs, batch_size=2, verbose=0, callbacks=[warn])
    return hist.history, warn, [r.getMessage() for r in caplog.records if "is not learning" in r.getMessage()]


def test_dead_region_warning_fires_once_for_a_region_forced_empty(caplog):
    history, warn, messages = _fit(dead_region=1, caplog=caplog)
    assert history["vol_tc"] == [0.0, 0.0, 0.0] and min(history["ref_vol_tc"]) > 0
    assert min(history["vol_wt"]) > 0 and min(history["vol_et"]) > 0
    assert warn.warned == {"tc": 2}  # after two empty epochs, once, TC only
    assert len(messages) == 1
    assert "region TC" in messages[0] and "epoch 2" in messages[0] and "prob_tc" in messages[0]


def test_no_warning_when_every_region_is_predicted(caplog):
    history, warn, messages = _fit(dead_region=None, caplog=caplog)
    assert min(history["vol_tc"]) > 0
    assert warn.warned == {} and messages == []


def test_dead_region_count_continues_from_a_resumed_history(caplog):
    rows = [{"epoch": 1, "vol_tc": 0.0, "ref_vol_tc": 3.0}]
    warn = DeadRegionWarning(("tc",), epochs=2, history=rows)
    with caplog.at_level(logging.WARNING, logger="brats_seg.training.callbacks"):
        warn.on_epoch_end(1, {"vol_tc": 0.0, "ref_vol_tc": 3.0})  # epoch 2: the second empty epoch in a row
    assert warn.warned == {"tc": 2}
    quiet = DeadRegionWarning(("tc",), epochs=2)
    quiet.on_epoch_end(0, {"vol_tc": 0.0, "ref_vol_tc": 3.0})
    quiet.on_epoch_end(1, {"vol_tc": 0.4, "ref_vol_tc": 3.0})  # it came alive: the count restarts
    quiet.on_epoch_end(2, {"vol_tc": 0.0, "ref_vol_tc": 0.0})  # empty reference: not a dead output
    assert quiet.warned == {}
    with pytest.raises(ValueError, match="dead_region_epochs"):
        DeadRegionWarning(("tc",), epochs=-1)


def test_monitors_round_trip_through_their_config():
    """Checkpoints are loaded with compile=True on resume: the metrics must deserialize."""
    import keras

    for m in make_region_monitors(REGIONS, 0.008):
        clone = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(m))
        assert type(clone) is type(m) and clone.get_config() == m.get_config()
