#!/usr/bin/env python
"""What each transform of the nnunet augmentation preset costs one volume, each forced on (p = 1).

    python scripts/profile_augment.py [resolution=full]     # tiny | half | full | 2x
    python scripts/profile_augment.py 'resolution.shape=[128,160,112]'

Random data of the resolution's network grid (``resolution.shape``), 4 image and 3 region
channels, each transform alone (the others off), the best of two; prints seconds per transform.
The preset applies each with its own probability (``trainer.augmentation``), so a case costs the
sum of p x seconds on average. The work is :func:`brats_seg.benchmark.augment.profile_augment`'s.
"""

from __future__ import annotations

from brats_seg.cli import hydra_entry, to_config, user_errors
from brats_seg.script_configs import register_configs

register_configs()


@hydra_entry("../configs", "profile_augment")
def main(cfg) -> None:
    from brats_seg.benchmark.augment import profile_augment

    conf = to_config(cfg)
    shape = tuple(conf.resolution.shape)
    print(f"{conf.resolution.name} grid {shape}, 4 + 3 channels, seconds (best of 2):", flush=True)
    with user_errors():
        for label, seconds in profile_augment(shape):
            print(f"  {label:28s} {seconds:.2f}", flush=True)


if __name__ == "__main__":
    main()
