#!/usr/bin/env python
"""Train a 3D U-Net on BraTS (or the embedded synthetic dataset).

    python train.py                                     # synthetic data, minutes on a CPU
    python train.py data=brats2021 data.root=/data/BraTS2021 resolution=full
    python train.py run_dir=outputs/my_run              # re-run the same command to resume

Returns the best validation mean Dice, so Hydra sweeps can optimise it.
"""

from __future__ import annotations

import logging

import hydra
from hydra.core.hydra_config import HydraConfig

from brats_seg.cli import to_config, user_errors
from brats_seg.config import TrainConfig, register_configs

register_configs()
log = logging.getLogger("train")


def run(conf: TrainConfig, extra_callbacks=()) -> float:
    """Configure the backend (before TensorFlow is imported), then train."""
    from brats_seg.backend import configure

    backend = configure(conf.backend)
    from brats_seg.training.loop import train

    result = train(conf, backend, extra_callbacks)
    print(f"best val Dice (mean of regions) {result.best_val_dice:.4f} at epoch {result.best_epoch}; "
          f"run folder {result.run_dir}")
    print(f"evaluate: python scripts/evaluate.py run_dir={result.run_dir}")
    return result.best_val_dice


@hydra.main(config_path="configs", config_name="train", version_base="1.3")
def main(cfg) -> float:
    conf = to_config(cfg)
    if not conf.run_dir:
        conf.run_dir = HydraConfig.get().runtime.output_dir
    with user_errors():
        return run(conf)


if __name__ == "__main__":
    main()
