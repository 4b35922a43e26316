"""tf.data pipelines over tiny fake cache entries: shapes, determinism, resume, channels."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest
import tensorflow as tf

from brats_seg.config import TrainConfig
from brats_seg.data.pipeline import (
    TrainInput,
    _augment_map,
    augment_case,
    make_eval_dataset,
    make_train_dataset,
)

SHAPE = (6, 5, 4)  # (x, y, z)
N_CASES = 5


def _write_case(case_dir, index: int, rng, shape=SHAPE, image_dtype=np.float16):
    case_dir.mkdir()
    # channel c of case i is centred on 10*i + c: every value tells its case and channel
    image = rng.standard_normal((*shape, 4)) * 0.5 + 10 * index + np.arange(4)
    regions = rng.integers(0, 2, (*shape, 3))
    np.save(case_dir / "image.npy", image.astype(image_dtype))
    np.save(case_dir / "regions.npy", regions.astype(np.uint8))


@pytest.fixture
def cases(tmp_path):
    rng = np.random.default_rng(0)
    dirs = []
    for i in range(N_CASES):
        _write_case(tmp_path / f"case_{i:03d}", i, rng)
        dirs.append(tmp_path / f"case_{i:03d}")
    return dirs


def _load(case_dir):
    return np.load(case_dir / "image.npy").astype(np.float32), np.load(case_dir / "regions.npy").astype(np.float32)


def _take(ds, n):
    return [(x.numpy(), y.numpy()) for x, y in ds.take(n)]


def _case_of(image: np.ndarray) -> int:
    """Case index encoded in an (x, y, z, C) image (robust to the +-10%/0.1 augmentation)."""
    return round(float(np.median(image[..., 0])) / 10)


def _assert_equal_batches(a, b):
    assert len(a) == len(b)
    for (xa, ya), (xb, yb) in zip(a, b):
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)


def steps_per_epoch(n_cases: int, batch_size: int, max_steps: int | None = None) -> int:
    """Steps of an epoch of whole volumes (the one count: TrainInput.steps_per_epoch)."""
    return TrainInput(batch_size, seed=0, augment=False, max_steps_per_epoch=max_steps).steps_per_epoch(n_cases, SHAPE)


def test_steps_per_epoch():
    assert steps_per_epoch(5, 2) == 2
    assert steps_per_epoch(4, 4) == 1
    assert steps_per_epoch(10, 2, max_steps=3) == 3
    assert steps_per_epoch(10, 2, max_steps=30) == 5
    assert steps_per_epoch(10, 2, max_steps=None) == 5
    with pytest.raises(ValueError, match="3 training case.*batch of 4.*at most 3"):
        steps_per_epoch(3, 4)
    with pytest.raises(ValueError, match="batch_size.*0"):
        steps_per_epoch(3, 0)
    # patch mode: every case's voxels once an epoch (crops_per_case), then the cap
    patches = TrainInput(2, seed=0, augment=False, patch_size=(48, 48, 48))
    assert patches.steps_per_epoch(3, (96, 112, 80)) == 3 * 8 // 2
    assert replace(patches, max_steps_per_epoch=5).steps_per_epoch(3, (96, 112, 80)) == 5


def test_a_runs_train_input_is_its_config():
    cfg = TrainConfig()
    cfg.trainer.batch_size, cfg.trainer.steps_per_epoch, cfg.trainer.patch_size = 4, 7, [8, 8, 8]
    cfg.model.in_channels, cfg.model.out_channels, cfg.data.prefetch_batches = 1, 2, 3
    t = cfg.trainer
    assert TrainInput.from_config(cfg) == TrainInput(
        4,
        t.seed,
        t.augment,
        1,
        2,
        max_steps_per_epoch=7,
        prefetch_batches=3,
        augmentation=t.augmentation,
        patch_size=[8, 8, 8],
        foreground_fraction=t.foreground_fraction,
    )


def test_train_shapes_and_dtypes(cases):
    ds = make_train_dataset(cases, TrainInput(batch_size=2, seed=0, augment=True))
    assert ds.element_spec[0].shape == (2, *SHAPE, 4)
    assert ds.element_spec[1].shape == (2, *SHAPE, 3)
    for x, y in _take(ds, 3):  # the cache's dtypes: the device casts, the buffers stay small
        assert x.dtype == np.float16 and x.shape == (2, *SHAPE, 4)
        assert y.dtype == np.uint8 and y.shape == (2, *SHAPE, 3)
        assert set(np.unique(y)) <= {0, 1}


def test_each_epoch_is_a_seeded_permutation_without_repeats(cases):
    steps = steps_per_epoch(N_CASES, 2)
    ds = make_train_dataset(cases, TrainInput(batch_size=2, seed=7, augment=False))
    batches = _take(ds, 3 * steps)
    orders = []
    for epoch in range(3):
        order = [_case_of(x) for bx, _ in batches[epoch * steps : (epoch + 1) * steps] for x in bx]
        assert len(set(order)) == len(order) == steps * 2  # no case twice in an epoch
        assert order == list(np.random.default_rng([7, epoch]).permutation(N_CASES)[: steps * 2])
        orders.append(order)
    assert len({tuple(o) for o in orders}) > 1  # the order changes between epochs
    # without augmentation the batches are the cached arrays as they are
    first = orders[0][0]
    image, regions = _load(cases[first])
    np.testing.assert_array_equal(batches[0][0][0], image)
    np.testing.assert_array_equal(batches[0][1][0], regions)


@pytest.mark.parametrize("augment", [True, "nnunet"])
def test_deterministic_across_constructions(cases, augment):
    a = _take(make_train_dataset(cases, TrainInput(batch_size=2, seed=3, augment=augment)), 6)
    np.random.seed(123)  # the global generators batchgenerators draws from are not the source
    random.seed(123)
    b = _take(make_train_dataset(cases, TrainInput(batch_size=2, seed=3, augment=augment)), 6)
    _assert_equal_batches(a, b)
    c = _take(make_train_dataset(cases, TrainInput(batch_size=2, seed=4, augment=augment)), 6)
    assert any(not np.array_equal(xa, xc) for (xa, _), (xc, _) in zip(a, c))


@pytest.mark.parametrize("augment", [True, False, "nnunet"])
def test_resume_sees_the_same_batches(cases, augment):
    steps, k = steps_per_epoch(N_CASES, 2), 2
    uninterrupted = make_train_dataset(cases, TrainInput(batch_size=2, seed=11, augment=augment), initial_epoch=0)
    resumed = make_train_dataset(cases, TrainInput(batch_size=2, seed=11, augment=augment), initial_epoch=k)
    _assert_equal_batches(_take(uninterrupted.skip(k * steps), 2 * steps), _take(resumed, 2 * steps))


def test_step_cap_keeps_epochs_aligned(cases):
    # with a cap of 1 step, epoch e is the first batch of permutation (seed, e)
    capped = make_train_dataset(cases, TrainInput(batch_size=2, seed=5, augment=False, max_steps_per_epoch=1))
    orders = [[_case_of(x) for x in bx] for bx, _ in _take(capped, 3)]
    assert orders == [list(np.random.default_rng([5, e]).permutation(N_CASES)[:2]) for e in range(3)]
    spec = TrainInput(batch_size=2, seed=5, augment=True, max_steps_per_epoch=1)
    resumed = make_train_dataset(cases, spec, initial_epoch=2)
    full = make_train_dataset(cases, spec)
    _assert_equal_batches(_take(full.skip(2), 2), _take(resumed, 2))


def test_augmentation_is_flip_and_per_channel_scale_shift(cases):
    image, regions = _load(cases[1])
    flips = set()
    for k in range(12):  # on float32 input: exactly a flip and an affine map per channel
        seed = tf.constant([5, k], tf.int64)
        x, y = (t.numpy() for t in augment_case(tf.constant(image.astype(np.float32)), tf.constant(regions), seed))
        ref_image, ref_regions = image.astype(np.float32), regions
        flipped = not np.array_equal(y, ref_regions)
        if flipped:  # L-R flip along x, applied to image and regions alike
            ref_image, ref_regions = ref_image[::-1], ref_regions[::-1]
            np.testing.assert_array_equal(y, ref_regions)
        flips.add(flipped)
        for c in range(4):  # image = scale * original + shift, per channel
            scale, shift = np.polyfit(ref_image[..., c].ravel(), x[..., c].ravel(), 1)
            assert 0.9 - 1e-4 <= scale <= 1.1 + 1e-4
            assert -0.1 - 1e-3 <= shift <= 0.1 + 1e-3
            np.testing.assert_allclose(x[..., c], scale * ref_image[..., c] + shift, atol=1e-4)
    assert flips == {True, False}


def test_training_batches_are_the_augmented_cases_rounded_to_float16(cases):
    originals = [_load(c) for c in cases]
    augment = _augment_map(2)
    batches = _take(make_train_dataset(cases, TrainInput(batch_size=1, seed=2, augment=True)), 2 * N_CASES)
    for k, (x, y) in enumerate(batches):
        epoch, position = divmod(k, N_CASES)  # batch 1: one case per position
        image, regions = originals[_case_of(x[0])]
        want_x, want_y = augment(
            tf.constant(epoch, tf.int64),
            tf.constant(position, tf.int64),
            tf.constant(image.astype(np.float32)),
            tf.constant(regions),
        )
        assert x.dtype == np.float16 and y.dtype == np.uint8
        np.testing.assert_array_equal(x[0], want_x.numpy().astype(np.float16))  # computed in float32, rounded once
        np.testing.assert_array_equal(y[0], want_y.numpy())


def test_flair_only_and_wt_only(cases):
    train = make_train_dataset(cases, TrainInput(batch_size=2, seed=0, augment=False, in_channels=1, out_channels=1))
    assert train.element_spec[0].shape[-1] == 1 and train.element_spec[1].shape[-1] == 1
    for bx, by in _take(train, 2):
        for x, y in zip(bx, by):
            image, regions = _load(cases[_case_of(x)])
            np.testing.assert_array_equal(x, image[..., :1])  # FLAIR = channel 0
            np.testing.assert_array_equal(y, regions[..., :1])  # WT = channel 0


def test_eval_dataset_in_order_once(cases):
    batches = _take(make_eval_dataset(cases, batch_size=2), 10)
    assert [x.shape[0] for x, _ in batches] == [2, 2, 1]  # every case once, last batch smaller
    images = np.concatenate([x for x, _ in batches])
    regions = np.concatenate([y for _, y in batches])
    for i, case in enumerate(cases):
        image, region = _load(case)
        np.testing.assert_array_equal(images[i], image)
        np.testing.assert_array_equal(regions[i], region)
    flair_wt = _take(make_eval_dataset(cases, in_channels=1, out_channels=1), 10)
    assert len(flair_wt) == N_CASES
    assert flair_wt[0][0].shape == (1, *SHAPE, 1) and flair_wt[0][1].shape == (1, *SHAPE, 1)


def test_cache_is_memory_mapped(cases, monkeypatch):
    modes = []
    real_load = np.load

    def recording_load(path, *args, **kwargs):
        modes.append(kwargs.get("mmap_mode"))
        return real_load(path, *args, **kwargs)

    monkeypatch.setattr(np, "load", recording_load)
    _take(make_eval_dataset(cases), 2)
    assert modes and set(modes) == {"r"}


def test_bad_cache_entries_name_the_file(cases, tmp_path):
    (cases[1] / "regions.npy").unlink()
    with pytest.raises(FileNotFoundError, match=r"case_001.*regions\.npy.*prepare_data"):
        make_eval_dataset(cases)
    rng = np.random.default_rng(1)
    _write_case(tmp_path / "odd_shape", 9, rng, shape=(6, 5, 2))
    with pytest.raises(ValueError, match=r"odd_shape.*\(6, 5, 2\).*\(6, 5, 4\)"):
        make_eval_dataset([cases[0], tmp_path / "odd_shape"])
    _write_case(tmp_path / "float32", 9, rng, image_dtype=np.float32)
    with pytest.raises(ValueError, match=r"float32.*image\.npy.*float32.*expected float16"):
        make_eval_dataset([tmp_path / "float32"])


def test_argument_errors(cases):
    with pytest.raises(ValueError, match="in_channels.*got 3"):
        make_train_dataset(cases, TrainInput(2, seed=0, augment=False, in_channels=3))
    with pytest.raises(ValueError, match="out_channels.*got 0"):
        make_eval_dataset(cases, out_channels=0)
    with pytest.raises(ValueError, match=r"regions\.npy.*\(x, y, z, >= 4 channels\)"):
        make_eval_dataset(cases, out_channels=4)  # more outputs than the cached regions
    with pytest.raises(ValueError, match="seed.*-1"):
        make_train_dataset(cases, TrainInput(2, seed=-1, augment=False))
    with pytest.raises(ValueError, match="5 training case.*batch of 8"):
        make_train_dataset(cases, TrainInput(8, seed=0, augment=False))
    with pytest.raises(ValueError, match="empty"):
        make_eval_dataset([])
    with pytest.raises(TypeError, match="single path"):
        make_eval_dataset(str(cases[0]))


def test_feeds_keras_fit_with_loss_and_metrics(tmp_path):
    """Smoke: U-Net + loss + Dice metrics train on the pipeline for two short epochs."""
    import keras

    from brats_seg.config import ModelConfig
    from brats_seg.model.unet3d import build_unet3d
    from brats_seg.training.losses import SoftDiceBCELoss
    from brats_seg.training.metrics import make_dice_metrics

    rng = np.random.default_rng(3)
    dirs = [tmp_path / f"c{i}" for i in range(4)]
    for i, d in enumerate(dirs):
        _write_case(d, i, rng, shape=(8, 8, 4))
    cfg = ModelConfig(depth=2, base_filters=2, out_channels=3)
    model = build_unet3d(cfg, (8, 8, 4))
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=SoftDiceBCELoss(), metrics=make_dice_metrics())
    train = make_train_dataset(dirs, TrainInput(batch_size=2, seed=0, augment=True))
    history = model.fit(
        train,
        steps_per_epoch=steps_per_epoch(len(dirs), 2),
        epochs=2,
        validation_data=make_eval_dataset(dirs[:2], batch_size=2),
        shuffle=False,  # the dataset is already shuffled, deterministically
        verbose=0,
    )
    assert {"loss", "dice_wt", "dice_mean", "val_loss", "val_dice_mean"} <= set(history.history)
    assert len(history.history["loss"]) == 2 and np.all(np.isfinite(history.history["loss"]))


@pytest.mark.parametrize("workers,replicas", [(2, 1), (2, 2), (1, 2), (4, 1)])
def test_worker_shards_split_each_global_batch(tmp_path, workers, replicas):
    """Step s of a cluster trains on exactly the cases of one process's batch s, each once."""
    rng = np.random.default_rng(1)
    dirs = []
    for i in range(9):
        _write_case(tmp_path / f"case_{i:03d}", i, rng)
        dirs.append(tmp_path / f"case_{i:03d}")
    batch, steps = 4, 2  # 9 cases: 2 steps of 4 per epoch
    single = _take(make_train_dataset(dirs, TrainInput(batch, seed=5, augment=True)), 2 * steps)
    per_replica = batch // (workers * replicas)
    shards = [
        _take(
            make_train_dataset(
                dirs, TrainInput(batch, seed=5, augment=True), shard=(w, workers), replica_batch=per_replica
            ),
            2 * steps * replicas,
        )
        for w in range(workers)
    ]
    for s, (x, y) in enumerate(single):
        # the cluster's step s: each worker's next `replicas` batches, workers in order
        parts = [shards[w][s * replicas + r] for w in range(workers) for r in range(replicas)]
        np.testing.assert_array_equal(np.concatenate([p[0] for p in parts]), x)
        np.testing.assert_array_equal(np.concatenate([p[1] for p in parts]), y)


def test_resume_mid_epoch_skips_the_steps_done(cases):
    full = _take(make_train_dataset(cases, TrainInput(2, seed=7, augment=True)), 6)  # 3 epochs of 2 steps
    resumed = _take(make_train_dataset(cases, TrainInput(2, seed=7, augment=True), initial_epoch=1, initial_step=1), 3)
    _assert_equal_batches(full[3:6], resumed)


def test_a_batch_that_does_not_split_names_the_batch_size(cases):
    with pytest.raises(ValueError, match=r"trainer.batch_size=3 .*2 worker"):
        make_train_dataset(cases, TrainInput(3, seed=0, augment=False), shard=(0, 2))
    with pytest.raises(ValueError, match="initial_step"):
        make_train_dataset(cases, TrainInput(2, seed=0, augment=False), initial_step=2)


# ---------------------------------------------------------------------------------------
# The nnunet preset (batchgenerators)
# ---------------------------------------------------------------------------------------

BLOB_SHAPE = (24, 20, 16)


def _blob_case(rng):
    """A case whose FLAIR is 10 inside an off-centre ellipsoid (the WT region) and noise-free 0
    outside; the other channels are smooth ramps; TC and ET are parts of the blob."""
    x, y, z = np.meshgrid(*(np.arange(n, dtype=np.float32) for n in BLOB_SHAPE), indexing="ij")
    wt = ((x - 9) / 6) ** 2 + ((y - 12) / 4) ** 2 + ((z - 7) / 3) ** 2 <= 1
    image = np.stack([10.0 * wt, x / 10, y / 10, z / 10], axis=-1).astype(np.float16)
    regions = np.stack([wt, wt & (x < 9), wt & (x < 7)], axis=-1).astype(np.uint8)
    return image, regions


def _nnunet(**overrides):
    from brats_seg.config import AugmentationConfig
    from brats_seg.data.augment import nnunet_transforms

    none = dict(
        p_rotation=0.0,
        p_scale=0.0,
        p_noise=0.0,
        p_blur=0.0,
        p_brightness=0.0,
        p_contrast=0.0,
        p_low_res=0.0,
        p_gamma=0.0,
        p_gamma_inverted=0.0,
        mirror_axes=[],
    )
    return nnunet_transforms(BLOB_SHAPE, AugmentationConfig(**{**none, **overrides}))


def test_nnunet_spatial_transforms_move_the_regions_with_the_image():
    from brats_seg.data.augment import augment_nnunet_case

    image, regions = _blob_case(np.random.default_rng(0))
    transforms = _nnunet(p_rotation=1.0, p_scale=1.0, mirror_axes=[0, 1, 2])
    moved = 0
    for seed in range(8):
        x, y = augment_nnunet_case(image, regions, seed, transforms)
        assert x.shape == image.shape and x.dtype == np.float16 and y.shape == regions.shape and y.dtype == np.uint8
        assert set(np.unique(y)) <= {0, 1}
        assert np.all(y[..., 2] <= y[..., 1]) and np.all(y[..., 1] <= y[..., 0])  # ET in TC in WT, still
        flair_wt = x[..., 0].astype(np.float32) > 5  # the blob, resampled linearly
        dice = 2 * np.sum(flair_wt & (y[..., 0] > 0)) / (flair_wt.sum() + y[..., 0].sum())
        assert dice > 0.85, f"seed {seed}: the regions moved apart from the image (Dice {dice:.2f})"
        moved += not np.array_equal(y, regions)
    assert moved >= 6  # rotated, scaled or mirrored nearly every time (p 1, mirrors 7 in 8)


def test_nnunet_intensity_transforms_leave_the_regions_alone():
    from brats_seg.data.augment import augment_nnunet_case

    image, regions = _blob_case(np.random.default_rng(0))
    transforms = _nnunet(p_noise=1.0, p_blur=1.0, p_brightness=1.0, p_contrast=1.0, p_gamma=1.0)
    x, y = augment_nnunet_case(image, regions, 3, transforms)
    np.testing.assert_array_equal(y, regions)
    assert not np.array_equal(x, image) and np.all(np.isfinite(x.astype(np.float32)))


def test_nnunet_keeps_the_global_generators_where_they_were():
    from brats_seg.data.augment import augment_nnunet_case

    image, regions = _blob_case(np.random.default_rng(0))
    np.random.seed(7)
    random.seed(7)
    expected = np.random.random(), random.random()
    np.random.seed(7)
    random.seed(7)
    augment_nnunet_case(image, regions, 1, _nnunet(p_noise=1.0, mirror_axes=[0]))
    assert (np.random.random(), random.random()) == expected


def test_a_bad_preset_is_refused_naming_the_presets(cases):
    with pytest.raises(ValueError, match="augment='heavy': use one of none, light, nnunet"):
        make_train_dataset(cases, TrainInput(batch_size=2, seed=0, augment="heavy"))
