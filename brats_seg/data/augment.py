"""Training augmentation presets (``trainer.augment=none|light|nnunet``), one case at a time.

* ``none``: the cached case as it is.
* ``light``: the project's first recipe, TensorFlow ops in the input graph: a left-right flip
  (p 0.5) and a per-channel intensity scale (x 0.9-1.1) and shift (+-0.1 z-scored units).
* ``nnunet``: nnU-Net's default augmentation for 3D (nnUNetTrainerV2), through the library it
  was written in, MIC-DKFZ's ``batchgenerators`` (numpy and scipy): rotation about each axis
  and isotropic scaling (the spatial transform, one resampling), Gaussian noise, Gaussian blur,
  multiplicative brightness, contrast, simulated low resolution, gamma (also on the inverted
  image) and mirroring on all three axes, with nnU-Net's ranges and probabilities
  (:class:`~brats_seg.config.AugmentationConfig`, ``trainer.augmentation.*``). One choice
  differs from nnU-Net, for time on a CPU that also runs the training step: the image is
  resampled linearly (``order_data=1``; nnU-Net: cubic) in the spatial transform and in
  simulated low resolution; the README gives what a case costs either way.

Channels-last in and out: ``image (x, y, z, C)`` float16 and ``regions (x, y, z, R)`` uint8
(binary region channels, WT first, which every transform moves with the image and resamples by
nearest neighbour). batchgenerators works on ``(batch, channels, x, y, z)`` float arrays and
draws from numpy's global generator (and Python's, for the noise variance): each case seeds both
from its own ``(seed, epoch, position)`` seed under a lock and puts their previous states back, so a case's augmentation does not depend on
what ran before it and a resumed run sees the same batches.
"""

from __future__ import annotations

import math
import random
import threading
from dataclasses import asdict

import numpy as np

from brats_seg.config import AugmentationConfig

__all__ = ["augment_nnunet_case", "describe", "nnunet_transforms"]

_RNG_LOCK = threading.Lock()  # numpy's and Python's global generators, which batchgenerators draws from


def nnunet_transforms(shape: tuple[int, int, int], params: AugmentationConfig):
    """The ``nnunet`` preset as a batchgenerators ``Compose`` for whole volumes of ``shape``.

    Args:
        shape: the spatial shape ``(x, y, z)`` of the volumes (the output keeps it).
        params: ranges and probabilities (``trainer.augmentation``).
    """
    from batchgenerators.transforms.abstract_transforms import Compose
    from batchgenerators.transforms.color_transforms import (
        BrightnessMultiplicativeTransform,
        ContrastAugmentationTransform,
        GammaTransform,
    )
    from batchgenerators.transforms.noise_transforms import GaussianBlurTransform, GaussianNoiseTransform
    from batchgenerators.transforms.resample_transforms import SimulateLowResolutionTransform
    from batchgenerators.transforms.spatial_transforms import MirrorTransform, SpatialTransform

    p = params
    angle = (-math.radians(p.rotation_deg), math.radians(p.rotation_deg))
    return Compose(
        [
            SpatialTransform(
                tuple(shape),
                patch_center_dist_from_border=None,
                do_elastic_deform=False,
                do_rotation=p.p_rotation > 0,
                angle_x=angle,
                angle_y=angle,
                angle_z=angle,
                p_rot_per_axis=1.0,
                do_scale=p.p_scale > 0,
                scale=tuple(p.scale_range),
                border_mode_data="constant",
                border_cval_data=0,
                order_data=p.order_data,
                border_mode_seg="constant",
                border_cval_seg=0,
                order_seg=0,
                random_crop=False,
                p_el_per_sample=0.0,
                p_scale_per_sample=p.p_scale,
                p_rot_per_sample=p.p_rotation,
            ),
            GaussianNoiseTransform(noise_variance=tuple(p.noise_variance), p_per_sample=p.p_noise),
            GaussianBlurTransform(
                tuple(p.blur_sigma),
                different_sigma_per_channel=True,
                p_per_sample=p.p_blur,
                p_per_channel=p.p_blur_per_channel,
            ),
            BrightnessMultiplicativeTransform(multiplier_range=tuple(p.brightness_range), p_per_sample=p.p_brightness),
            ContrastAugmentationTransform(contrast_range=tuple(p.contrast_range), p_per_sample=p.p_contrast),
            SimulateLowResolutionTransform(
                zoom_range=tuple(p.low_res_zoom),
                per_channel=True,
                p_per_channel=p.p_low_res_per_channel,
                order_downsample=0,
                order_upsample=p.order_data,
                p_per_sample=p.p_low_res,
                ignore_axes=None,
            ),
            GammaTransform(
                tuple(p.gamma_range),
                invert_image=True,
                per_channel=True,
                retain_stats=True,
                p_per_sample=p.p_gamma_inverted,
            ),
            GammaTransform(
                tuple(p.gamma_range), invert_image=False, per_channel=True, retain_stats=True, p_per_sample=p.p_gamma
            ),
        ]
        + ([MirrorTransform(tuple(p.mirror_axes))] if p.mirror_axes else [])
    )


def augment_nnunet_case(image: np.ndarray, regions: np.ndarray, seed: int, transforms) -> tuple[np.ndarray, np.ndarray]:
    """One case through :func:`nnunet_transforms`, drawn from ``seed`` alone.

    Args:
        image: ``(x, y, z, C)`` float16 (or float32).
        regions: ``(x, y, z, R)`` uint8, binary.
        seed: 0 <= seed < 2**32; equal seeds give equal results.
        transforms: :func:`nnunet_transforms` for this shape.

    Returns:
        ``(image, regions)`` in the input's shapes and dtypes.
    """
    data = np.ascontiguousarray(np.moveaxis(image.astype(np.float32), -1, 0)[None])  # (1, C, x, y, z)
    seg = np.ascontiguousarray(np.moveaxis(regions, -1, 0)[None]).astype(np.float32)  # (1, R, x, y, z)
    with _RNG_LOCK:
        previous = np.random.get_state(), random.getstate()
        np.random.seed(int(seed) % (1 << 32))
        random.seed(int(seed))  # the noise variance is drawn from Python's own generator
        try:
            out = transforms(data=data, seg=seg)
        finally:
            np.random.set_state(previous[0])
            random.setstate(previous[1])
    image_out = np.moveaxis(out["data"][0], 0, -1).astype(image.dtype)
    regions_out = (np.moveaxis(out["seg"][0], 0, -1) > 0.5).astype(regions.dtype)
    return np.ascontiguousarray(image_out), np.ascontiguousarray(regions_out)


def describe(params: AugmentationConfig) -> str:
    """One line for the log: the nnunet preset's settings."""
    return ", ".join(f"{k}={v}" for k, v in asdict(params).items())
