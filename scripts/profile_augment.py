#!/usr/bin/env python
"""What each transform of the nnunet augmentation preset costs one volume, each forced on (p = 1).

    python scripts/profile_augment.py [resolution=full]     # tiny | half | full | 2x

Random data of the resolution's network grid, 4 image and 3 region channels, each transform alone
(the others off), the best of two; prints seconds per transform. The preset applies each with its
own probability (``trainer.augmentation``), so a case costs the sum of p x seconds on average.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

GRIDS = {"tiny": (48, 56, 40), "half": (96, 112, 80), "full": (192, 224, 160), "2x": (384, 448, 320)}
OFF = dict(p_rotation=0.0, p_scale=0.0, p_noise=0.0, p_blur=0.0, p_brightness=0.0, p_contrast=0.0, p_low_res=0.0,
           p_gamma=0.0, p_gamma_inverted=0.0, mirror_axes=[])
ALONE = [("spatial, rotation + scaling", dict(p_rotation=1.0, p_scale=1.0)), ("spatial, scaling", dict(p_scale=1.0)),
         ("Gaussian noise", dict(p_noise=1.0)), ("Gaussian blur", dict(p_blur=1.0)),
         ("brightness", dict(p_brightness=1.0)), ("contrast", dict(p_contrast=1.0)),
         ("simulated low resolution", dict(p_low_res=1.0)), ("gamma", dict(p_gamma=1.0)),
         ("mirroring", dict(mirror_axes=[0, 1, 2])), ("none drawn", {})]


def main(argv: list[str]) -> int:
    import numpy as np

    from brats_seg.config import AugmentationConfig
    from brats_seg.data.augment import nnunet_transforms

    args = dict(a.split("=", 1) for a in argv if "=" in a)
    name = args.get("resolution", "full")
    if name not in GRIDS or len(args) != len(argv) or set(args) - {"resolution"}:
        print(f"usage: python scripts/profile_augment.py [resolution={'|'.join(GRIDS)}]", file=sys.stderr)
        return 2
    shape = GRIDS[name]
    rng = np.random.default_rng(0)
    data = rng.standard_normal((1, 4, *shape), dtype=np.float32)
    seg = (rng.random((1, 3, *shape)) < 0.05).astype(np.float32)
    print(f"{name} grid {shape}, 4 + 3 channels, seconds (best of 2):")
    for label, on in ALONE:
        transforms = nnunet_transforms(shape, AugmentationConfig(**{**OFF, **on}))
        times = []
        for seed in range(2):
            np.random.seed(seed)
            t0 = time.perf_counter()
            transforms(data=data.copy(), seg=seg.copy())
            times.append(time.perf_counter() - t0)
        print(f"  {label:28s} {min(times):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
