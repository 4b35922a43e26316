"""What each transform of the nnunet augmentation preset costs one volume, each forced on (p = 1).

Random data of a network grid, 4 image and 3 region channels (batchgenerators' channels-first
``(1, C, x, y, z)``), each transform alone (the others off), the best of two. The preset applies
each with its own probability (``trainer.augmentation``), so a case costs the sum of p x seconds
on average.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

__all__ = ["ALONE", "profile_augment"]

# Every transform off: the base each row of ALONE turns one (or two) on from.
OFF = dict(
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
# (label, the AugmentationConfig values that force it on), in the order printed.
ALONE = [
    ("spatial, rotation + scaling", dict(p_rotation=1.0, p_scale=1.0)),
    ("spatial, scaling", dict(p_scale=1.0)),
    ("Gaussian noise", dict(p_noise=1.0)),
    ("Gaussian blur", dict(p_blur=1.0)),
    ("brightness", dict(p_brightness=1.0)),
    ("contrast", dict(p_contrast=1.0)),
    ("simulated low resolution", dict(p_low_res=1.0)),
    ("gamma", dict(p_gamma=1.0)),
    ("mirroring", dict(mirror_axes=[0, 1, 2])),
    ("none drawn", {}),
]


def profile_augment(shape: tuple[int, int, int], repeats: int = 2) -> Iterator[tuple[str, float]]:
    """``(transform, seconds)`` for each row of :data:`ALONE` in turn, as it is measured: on one
    random volume of ``shape`` ``(x, y, z)``, the best of ``repeats`` (numpy's global seed 0, 1, ...)."""
    import numpy as np

    from brats_seg.config import AugmentationConfig
    from brats_seg.data.augment import nnunet_transforms

    shape = tuple(int(s) for s in shape)
    rng = np.random.default_rng(0)
    data = rng.standard_normal((1, 4, *shape), dtype=np.float32)
    seg = (rng.random((1, 3, *shape)) < 0.05).astype(np.float32)
    for label, on in ALONE:
        transforms = nnunet_transforms(shape, AugmentationConfig(**{**OFF, **on}))
        times = []
        for seed in range(repeats):
            np.random.seed(seed)
            t0 = time.perf_counter()
            transforms(data=data.copy(), seg=seg.copy())
            times.append(time.perf_counter() - t0)
        yield label, min(times)
