"""tf.data pipelines over the preprocessing cache: deterministic, resumable, memory-mapped.

A cache entry is a folder per case holding ``image.npy`` (float16, ``(x, y, z, 4)``:
FLAIR, T1, T1ce, T2) and ``regions.npy`` (uint8, ``(x, y, z, R)``: the layout's regions, WT
first: WT, TC, ET, and RC for brats2024), written by
``brats_seg.data.cache``. Arrays are opened with ``mmap_mode="r"`` and read one case at a
time, so the dataset never sits in memory. Elements are channels-last, in the cache's own
dtypes: ``image (B, x, y, z, in_channels)`` float16 and ``regions (B, x, y, z,
out_channels)`` uint8; the model casts the image on the device (to float32, then to its
compute dtype) and the loss reads the regions as they are. At 2x resolution a float32 image
batch is 0.9 GB and its float32 regions 0.66 GB: here they are 0.44 and 0.17 GB.

Memory is bounded and planned: each case is loaded and augmented by one call at a time
(``MAP_PARALLEL_CALLS``) and at most ``PREFETCH_BATCHES`` finished batches wait for the
step (``data.prefetch_batches``), with tf.data's own autotuning of buffers off, so the input
pipeline holds a fixed number of batches whatever the machine, which the LMS planner counts
(``brats_seg.lms.planner.workload.pipeline_batches``).

Training is a pure function of ``(case_dirs, seed)``: epoch ``e`` visits the cases in the
order ``default_rng([seed, e]).permutation(n)`` (its first ``steps * batch_size``), and the
augmentation of the case at position ``p`` of epoch ``e`` is drawn from a stateless seed
``(seed, e, p)``. A run resumed with ``initial_epoch=k`` therefore sees exactly the batches
an uninterrupted run sees from epoch ``k`` on, and batches never straddle epochs. In patch mode
(``patch_size``) the element at each position is a crop of the case, placed by
:mod:`brats_seg.data.patches` from ``(seed, e, p)`` too, and augmented as a whole volume is.

Distributed training splits each global batch of ``batch_size`` positions among the
workers: worker ``w`` of ``W`` reads the positions ``p`` with ``(p mod batch_size) //
(batch_size / W) == w`` (every case once per epoch across the cluster, no case read twice)
and batches them by the per-replica batch, so that step ``s`` of the cluster trains on
exactly the cases of a single process's batch ``s``.
"""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tensorflow as tf

from brats_seg.config import AugmentationConfig, TrainConfig, augment_preset
from brats_seg.data.cache import IMAGE_FILE, REGIONS_FILE  # the cache owns an entry's file names
from brats_seg.data.patches import PatchSampler, crops_per_case, steps_per_epoch

__all__ = [
    "IMAGE_FILE",
    "REGIONS_FILE",
    "TrainInput",
    "make_eval_dataset",
    "make_train_dataset",
]

logger = logging.getLogger(__name__)

CACHE_DTYPES = {IMAGE_FILE: np.float16, REGIONS_FILE: np.uint8}
FLIP_PROBABILITY = 0.5  # L-R flip along x
SCALE_RANGE = 0.1  # intensity scale in [1 - 0.1, 1 + 0.1], per channel
SHIFT_RANGE = 0.1  # intensity shift in [-0.1, 0.1] (z-scored units), per channel
MAP_PARALLEL_CALLS = 1  # cases loaded and augmented at once: a case takes ~0.1 s at full resolution, a step seconds
PREFETCH_BATCHES = 1  # default of data.prefetch_batches: finished batches waiting for the step


# ---------------------------------------------------------------------------------------
# What the training batches are
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainInput:
    """What every training batch is made of, the same on every worker and at every resume (where a
    pipeline starts and which share of each batch it reads are :func:`make_train_dataset`'s own).

    ``augment`` is the preset (``trainer.augment``): ``none``, ``light`` (random L-R flip along x,
    per-channel intensity scale +-10% and shift +-0.1) or ``nnunet`` (:mod:`brats_seg.data.augment`,
    with ``augmentation``'s ranges and probabilities); True and False mean light and none.
    ``patch_size`` ``(px, py, pz)``: each element is a random crop of this size
    (:mod:`brats_seg.data.patches`), then augmented.
    """

    batch_size: int  # cases per step: the global batch, split among workers and replicas
    seed: int  # trainer.seed, >= 0: case order, crops and augmentation derive from it
    augment: str | bool  # the preset (above)
    in_channels: int = 4  # 4 (FLAIR, T1, T1ce, T2) or 1 (FLAIR only)
    out_channels: int = 3  # regions trained, the first out_channels of the cache (1 = WT only)
    max_steps_per_epoch: int | None = None  # trainer.steps_per_epoch: a cap on batches per epoch; None = no cap
    prefetch_batches: int = PREFETCH_BATCHES  # finished batches waiting for the step (data.prefetch_batches)
    augmentation: AugmentationConfig | None = None  # the nnunet preset's ranges (None: nnU-Net's)
    patch_size: Sequence[int] | None = None  # patch mode's crop (above); None = the whole cached volume
    foreground_fraction: float = 0.33  # patch mode: the share of crops centred on tumour

    @classmethod
    def from_config(cls, cfg: TrainConfig) -> TrainInput:
        """The run's: ``trainer.*``, the model's channels and ``data.prefetch_batches``."""
        t = cfg.trainer
        return cls(
            batch_size=t.batch_size,
            seed=t.seed,
            augment=t.augment,
            in_channels=cfg.model.in_channels,
            out_channels=cfg.model.out_channels,
            max_steps_per_epoch=t.steps_per_epoch,
            prefetch_batches=cfg.data.prefetch_batches,
            augmentation=t.augmentation,
            patch_size=t.patch_size,
            foreground_fraction=t.foreground_fraction,
        )

    def steps_per_epoch(self, n_cases: int, grid: Sequence[int]) -> int:
        """Batches (>= 1) per training epoch over ``n_cases`` cases cached on ``grid`` ``(x, y, z)``: the
        one count the loop and :func:`make_train_dataset` share, so that their epochs line up. Each case
        :func:`~brats_seg.data.patches.crops_per_case` times (patch mode: its voxels once), in full
        batches (remainder dropped), at most ``max_steps_per_epoch`` (None or 0: no cap).

        Raises:
            ValueError: fewer cases (crops) than one batch, or a bad batch size / cap.
        """
        return steps_per_epoch(n_cases, grid, self.patch_size, self.batch_size, self.max_steps_per_epoch)


# ---------------------------------------------------------------------------------------
# Cache reading
# ---------------------------------------------------------------------------------------


def _open(case_dir: Path, filename: str) -> np.ndarray:
    path = case_dir / filename
    if not path.is_file():
        raise FileNotFoundError(
            f"cache entry {case_dir} has no {filename}: the cache is incomplete; "
            f"re-run scripts/prepare_data.py to rebuild it."
        )
    try:
        return np.load(path, mmap_mode="r")
    except (ValueError, OSError) as error:
        raise ValueError(
            f"cannot read {path} ({error}); delete {case_dir} and re-run scripts/prepare_data.py."
        ) from error


def _check_cases(case_dirs: Sequence[Path], out_channels: int) -> tuple[int, int, int]:
    """Check every case's files (headers only) and return the common spatial shape."""
    if not case_dirs:
        raise ValueError("no case folders given: the split is empty; check data.root and the split file.")
    spatial: tuple[int, ...] | None = None
    first = case_dirs[0]
    for case_dir in case_dirs:
        for filename in (IMAGE_FILE, REGIONS_FILE):
            array = _open(case_dir, filename)
            expected_dtype = CACHE_DTYPES[filename]
            channels_ok = array.ndim == 4 and (
                array.shape[-1] == 4 if filename == IMAGE_FILE else array.shape[-1] >= out_channels
            )
            if not channels_ok or array.dtype != expected_dtype:
                expected = "4" if filename == IMAGE_FILE else f">= {out_channels}"
                raise ValueError(
                    f"{case_dir / filename} is {array.dtype} {array.shape}, expected "
                    f"{np.dtype(expected_dtype)} (x, y, z, {expected} channels); re-run scripts/prepare_data.py "
                    "(a model with more outputs than the cached regions was trained on another layout?)."
                )
            if spatial is None:
                spatial = tuple(array.shape[:3])
            elif tuple(array.shape[:3]) != spatial:
                raise ValueError(
                    f"{case_dir / filename} has spatial shape {tuple(array.shape[:3])} but "
                    f"{first} has {spatial}: the cache mixes resolutions; re-run scripts/prepare_data.py."
                )
    return spatial  # type: ignore[return-value]


def _make_loader(case_dirs: Sequence[Path], in_channels: int, out_channels: int):
    """A numpy function: case index -> (image float16 (x,y,z,in), regions uint8 (x,y,z,out))."""

    def load(index) -> tuple[np.ndarray, np.ndarray]:
        case_dir = case_dirs[int(index)]
        image = _open(case_dir, IMAGE_FILE)[..., :in_channels]  # FLAIR is channel 0
        regions = _open(case_dir, REGIONS_FILE)[..., :out_channels]  # WT is channel 0
        return np.ascontiguousarray(image), np.ascontiguousarray(regions)

    return load


def _patch_map(case_dirs, spatial, patch, in_channels, out_channels, seed, fraction, per_epoch):
    """``(epoch, position, index) -> (image crop, regions crop)`` for ``Dataset.map`` (patch mode):
    the crop of :class:`~brats_seg.data.patches.PatchSampler`, read from the memory-mapped case."""
    sampler = PatchSampler(spatial, patch, seed, fraction, per_epoch)

    def load(epoch, position, index) -> tuple[np.ndarray, np.ndarray]:
        case_dir = case_dirs[int(index)]
        image = _open(case_dir, IMAGE_FILE)[..., :in_channels]
        regions = _open(case_dir, REGIONS_FILE)[..., :out_channels]
        return sampler.crop(int(epoch), int(position), int(index), image, regions, case_dir.name)

    def load_crop(epoch, position, index):
        image, regions = tf.numpy_function(load, [epoch, position, index], [tf.float16, tf.uint8], stateful=False)
        return tf.ensure_shape(image, (*patch, in_channels)), tf.ensure_shape(regions, (*patch, out_channels))

    return load_crop


def _check_channels(in_channels: int, out_channels: int) -> None:
    if in_channels not in (1, 4):
        raise ValueError(f"in_channels must be 4 (FLAIR,T1,T1ce,T2) or 1 (FLAIR only), got {in_channels!r}.")
    if not isinstance(out_channels, (int, np.integer)) or out_channels < 1:
        raise ValueError(f"out_channels must be the number of regions trained (>= 1, WT first), got {out_channels!r}.")


def _load_map(case_dirs, spatial, in_channels, out_channels):
    """``index -> (image float16 (x,y,z,in), regions uint8 (x,y,z,out))`` for ``Dataset.map``."""
    load = _make_loader(case_dirs, in_channels, out_channels)

    def load_case(index):
        image, regions = tf.numpy_function(load, [index], [tf.float16, tf.uint8], stateful=False)
        image = tf.ensure_shape(image, (*spatial, in_channels))
        regions = tf.ensure_shape(regions, (*spatial, out_channels))
        return image, regions

    return load_case


# ---------------------------------------------------------------------------------------
# Augmentation
# ---------------------------------------------------------------------------------------


def augment_case(image, regions, seed):
    """Random L-R flip (both tensors) and per-channel intensity scale/shift (image only).

    Args:
        image: ``(x, y, z, C)`` float16 (or float32).
        regions: ``(x, y, z, R)`` (any dtype; only flipped).
        seed: ``(2,)`` int64 stateless seed; equal seeds give equal results.

    Returns:
        ``(image, regions)`` with the same shapes and dtypes; the intensity change is
        computed in float32 and rounded to the image's dtype.
    """
    flip_seed, scale_seed, shift_seed = (tf.random.experimental.stateless_fold_in(seed, k) for k in range(3))
    channels = image.shape[-1]
    flip = tf.random.stateless_uniform((), flip_seed) < FLIP_PROBABILITY
    image, regions = tf.cond(
        flip,
        lambda: (tf.reverse(image, axis=[0]), tf.reverse(regions, axis=[0])),
        lambda: (image, regions),
    )
    scale = tf.random.stateless_uniform((channels,), scale_seed, 1.0 - SCALE_RANGE, 1.0 + SCALE_RANGE)
    shift = tf.random.stateless_uniform((channels,), shift_seed, -SHIFT_RANGE, SHIFT_RANGE)
    return tf.cast(tf.cast(image, tf.float32) * scale + shift, image.dtype), regions


def _augment_map(seed: int):
    """``(epoch, position, image, regions) -> (image, regions)``, seeded by (seed, epoch, position)."""

    def augment(epoch, position, image, regions):
        case_seed = tf.random.experimental.stateless_fold_in(tf.stack([tf.constant(seed, tf.int64), epoch]), position)
        return augment_case(image, regions, case_seed)

    return augment


def nnunet_case_seed(seed: int, epoch: int, position: int) -> int:
    """The numpy seed of the ``nnunet`` preset for the case at ``position`` of ``epoch``."""
    return int(np.random.SeedSequence([int(seed), int(epoch), int(position)]).generate_state(1)[0])


def _nnunet_map(seed: int, spatial, params: AugmentationConfig | None):
    """The ``nnunet`` preset (:mod:`brats_seg.data.augment`) as a ``Dataset.map`` function."""
    from brats_seg.data.augment import augment_nnunet_case, describe, nnunet_transforms

    params = params or AugmentationConfig()
    transforms = nnunet_transforms(tuple(spatial), params)
    logger.info("nnunet augmentation (batchgenerators): %s", describe(params))

    def augment_numpy(epoch, position, image, regions):
        return augment_nnunet_case(image, regions, nnunet_case_seed(seed, epoch, position), transforms)

    def augment(epoch, position, image, regions):
        out_image, out_regions = tf.numpy_function(
            augment_numpy, [epoch, position, image, regions], [image.dtype, regions.dtype], stateful=False
        )
        return tf.ensure_shape(out_image, image.shape), tf.ensure_shape(out_regions, regions.shape)

    return augment


# ---------------------------------------------------------------------------------------
# Datasets
# ---------------------------------------------------------------------------------------


def _epoch_order(n_cases: int, seed: int, epoch: int, per_epoch: int, repeats: int = 1) -> np.ndarray:
    """The case indices epoch ``epoch`` visits, in order: a pure function of (seed, epoch).
    ``repeats``: each case that many times (patch mode's crops per case)."""
    if repeats == 1:
        return np.random.default_rng([seed, epoch]).permutation(n_cases)[:per_epoch]
    return np.random.default_rng([seed, epoch]).permutation(n_cases * repeats)[:per_epoch] % n_cases


def _index_stream(
    n_cases: int,
    seed: int,
    first_epoch: int,
    per_epoch: int,
    first_position: int = 0,
    owns=lambda position: True,
    repeats: int = 1,
) -> Iterator[tuple[int, int, int]]:
    """Endless ``(epoch, position, case_index)`` from position ``first_position`` of
    ``first_epoch`` on, the positions ``owns`` accepts."""
    for epoch in itertools.count(first_epoch):
        for position, case in enumerate(_epoch_order(n_cases, seed, epoch, per_epoch, repeats)):
            if (epoch > first_epoch or position >= first_position) and owns(position):
                yield epoch, position, int(case)


def _as_paths(case_dirs: Sequence[str | os.PathLike]) -> list[Path]:
    if isinstance(case_dirs, (str, os.PathLike)):
        raise TypeError(f"case_dirs must be a list of case folders, got the single path {case_dirs!r}.")
    return [Path(p) for p in case_dirs]


def _options() -> tf.data.Options:
    options = tf.data.Options()
    options.deterministic = True  # parallel map keeps order: needed for resume equivalence
    # Fixed buffers (module doc): no autotuned buffer sizes, no prefetch injected after the map.
    options.autotune.enabled = False
    options.experimental_optimization.inject_prefetch = False
    return options


def make_train_dataset(
    case_dirs: Sequence[str | os.PathLike],
    spec: TrainInput,
    initial_epoch: int = 0,
    initial_step: int = 0,
    shard: tuple[int, int] = (0, 1),
    replica_batch: int | None = None,
) -> tf.data.Dataset:
    """Endless, shuffled, augmented training batches, deterministic in ``(seed, epoch)``.

    Args:
        case_dirs: cache folders of the training cases.
        spec: what the batches are made of (:class:`TrainInput`; a run's: ``TrainInput.from_config``);
            the loop must be given ``spec.steps_per_epoch(len(case_dirs), grid)`` steps per epoch.
        initial_epoch: first epoch yielded (the resume point; Keras' ``initial_epoch``).
        initial_step: steps of ``initial_epoch`` already trained (a run resumed mid-epoch
            after a preemption): its first batches are skipped.
        shard: ``(index, count)``: this worker's share of each global batch (module doc).
        replica_batch: cases per yielded batch, the per-replica batch (default
            ``batch_size / count``); a worker with R replicas yields R of them per step.

    Returns:
        Dataset of ``(image float16 (B, x, y, z, in_channels), regions uint8
        (B, x, y, z, out_channels))`` (``x, y, z`` the patch in patch mode), repeated forever; each epoch is
        ``spec.steps_per_epoch(...)`` full batches (of ``batch_size``, split as above).

    Raises:
        ValueError: a batch that does not split evenly among workers and replicas.
    """
    paths = _as_paths(case_dirs)
    batch_size, seed, augment, patch_size = spec.batch_size, spec.seed, spec.augment, spec.patch_size
    in_channels, out_channels, foreground_fraction = spec.in_channels, spec.out_channels, spec.foreground_fraction
    _check_channels(in_channels, out_channels)
    if not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}.")
    if not isinstance(initial_epoch, (int, np.integer)) or initial_epoch < 0:
        raise ValueError(f"initial_epoch must be an integer >= 0, got {initial_epoch!r}.")
    spatial = _check_cases(paths, out_channels)
    repeats = crops_per_case(spatial, patch_size)  # patch mode: an epoch holds every case's voxels once
    steps = spec.steps_per_epoch(len(paths), spatial)
    if not 0 <= initial_step < steps:
        raise ValueError(f"initial_step must be in 0..{steps - 1} (steps per epoch), got {initial_step!r}.")
    index, count = shard
    share = batch_size // count
    replica_batch = replica_batch or share
    if batch_size % count or share % replica_batch or not 0 <= index < count:
        raise ValueError(
            f"trainer.batch_size={batch_size} (the global batch) does not split evenly among {count} worker(s) "
            f"in replica batches of {replica_batch}: use a batch size divisible by the number of replicas."
        )
    per_epoch = steps * batch_size
    seed, initial_epoch = int(seed), int(initial_epoch)

    def owns(position: int) -> bool:
        return (position % batch_size) // share == index

    indices = tf.data.Dataset.from_generator(
        lambda: _index_stream(len(paths), seed, initial_epoch, per_epoch, initial_step * batch_size, owns, repeats),
        output_signature=(tf.TensorSpec((), tf.int64),) * 3,
    )
    if patch_size:
        element = tuple(int(p) for p in patch_size)
        load_crop = _patch_map(paths, spatial, element, in_channels, out_channels, seed, foreground_fraction, per_epoch)
    else:
        element, load_whole = spatial, _load_map(paths, spatial, in_channels, out_channels)

        def load_crop(epoch, position, case):
            return load_whole(case)

    preset = augment_preset(augment)
    augment_fn = {
        "none": lambda: None,
        "light": lambda: _augment_map(seed),
        "nnunet": lambda: _nnunet_map(seed, element, spec.augmentation),
    }[preset]()

    def load_and_augment(epoch, position, case):
        image, regions = load_crop(epoch, position, case)
        return augment_fn(epoch, position, image, regions) if augment_fn else (image, regions)

    ds = indices.map(load_and_augment, num_parallel_calls=MAP_PARALLEL_CALLS, deterministic=True)
    ds = ds.batch(replica_batch, drop_remainder=True).prefetch(spec.prefetch_batches)
    logger.info(
        "train dataset: %d cases, %d steps/epoch of %d (worker %d/%d, batches of %d), shape %s, seed %d, "
        "from epoch %d step %d, augment=%s%s",
        len(paths),
        steps,
        batch_size,
        index,
        count,
        replica_batch,
        spatial,
        seed,
        initial_epoch,
        initial_step,
        preset,
        f", crops {element} ({foreground_fraction:g} on tumour)" if patch_size else "",
    )
    return ds.with_options(_options())


def make_eval_dataset(
    case_dirs: Sequence[str | os.PathLike],
    batch_size: int = 1,
    in_channels: int = 4,
    out_channels: int = 3,
) -> tf.data.Dataset:
    """Every case once, in the given order, without augmentation.

    Args:
        case_dirs: cache folders of the cases.
        batch_size: cases per batch; the last batch may be smaller.
        in_channels: 4 (FLAIR, T1, T1ce, T2) or 1 (FLAIR only).
        out_channels: regions trained, the first ``out_channels`` of the cache (1 = WT only).

    Returns:
        Dataset of ``(image float16 (B, x, y, z, in_channels), regions uint8
        (B, x, y, z, out_channels))``.
    """
    paths = _as_paths(case_dirs)
    _check_channels(in_channels, out_channels)
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}.")
    spatial = _check_cases(paths, out_channels)
    ds = tf.data.Dataset.range(len(paths)).map(
        _load_map(paths, spatial, in_channels, out_channels), num_parallel_calls=MAP_PARALLEL_CALLS, deterministic=True
    )
    # One case a batch (validation): a static batch dimension, so the model's instance norm runs
    # its fast kernel (brats_seg.model.norm); with larger batches the last one may be smaller.
    return ds.batch(batch_size, drop_remainder=batch_size == 1).prefetch(PREFETCH_BATCHES).with_options(_options())
