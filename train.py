#!/usr/bin/env python
"""Train a 3D U-Net on BraTS (or the embedded synthetic dataset).

    python train.py                                     # synthetic data, minutes on a CPU
    python train.py data=brats2021 data.root=/data/BraTS2021 resolution=full
    python train.py run_dir=outputs/my_run              # re-run the same command to resume
    python train.py -m resolution=half,full lms=off,auto  # a sweep: one run folder and MLflow run per job

SIGTERM or Ctrl-C saves the current step and exits with status 75; the same command resumes.

Returns the best validation mean Dice, so Hydra sweeps can optimise it.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode

from brats_seg.cli import hydra_entry, to_config, user_errors
from brats_seg.config import TrainConfig
from brats_seg.script_configs import register_configs

register_configs()
log = logging.getLogger("train")


def run(conf: TrainConfig, extra_callbacks=(), tags=None, name_suffix: str = "") -> float:
    """Resolve the run once (every value checked, the backend, replicas, LMS strategy and plan
    decided, in a second, before TensorFlow is imported), apply the backend it decided, then train."""
    from brats_seg.backend import configure
    from brats_seg.benchmark.self_calibration import ensure_calibrated
    from brats_seg.resolve import resolve_run

    resolved = resolve_run(conf)
    # a CPU without a step-time calibration is measured first when the run is worth it (lms.calibrate);
    # one process per machine does it (the workers of a cluster would measure each other's load)
    if str(conf.distribute.name) == "none" and ensure_calibrated(conf, resolved.backend.device) is not None:
        resolved = resolve_run(conf)  # planned again with this CPU's own step times
    configure(resolved.backend)
    from brats_seg.training.loop import train

    result = train(resolved, extra_callbacks, tags=tags, name_suffix=name_suffix)
    print(
        f"best val Dice (mean of regions) {result.best_val_dice:.4f} at epoch {result.best_epoch}; "
        f"run folder {result.run_dir}"
    )
    print(f"evaluate: python scripts/evaluate.py run_dir={result.run_dir}")
    return result.best_val_dice


def sweep_job() -> tuple[dict[str, str], str]:
    """In a multirun (``-m``): MLflow tags and a run-name suffix telling the jobs apart.

    The suffix holds this job's values of the keys the sweep varies (``-lms=auto,resolution=half``),
    read from the sweep's ``multirun.yaml`` (the overrides as typed, ``lms=off,auto``) and from the
    experiment's ``hydra.sweeper.params``.
    """
    hc = HydraConfig.get()
    if hc.mode != RunMode.MULTIRUN:
        return {}, ""
    swept: set[str] = set()
    try:
        from omegaconf import OmegaConf

        typed = OmegaConf.load(Path(hc.sweep.dir) / "multirun.yaml").hydra.overrides.task
        swept = {
            o.split("=", 1)[0].lstrip("+~") for o in typed if "=" in o and re.search(r",|\w+\(", o.split("=", 1)[1])
        }
    except (OSError, ValueError, AttributeError) as e:
        log.debug("sweep overrides not read from multirun.yaml: %s", e)
    swept |= {str(k).lstrip("+~") for k in (hc.sweeper.get("params") or {})}  # an experiment's own sweep
    mine = [o for o in hc.overrides.task if o.split("=", 1)[0].lstrip("+~") in swept]
    label = ",".join(sorted(mine)) or f"job{hc.job.num}"
    return {"sweep_dir": str(hc.sweep.dir), "sweep_job": str(hc.job.num), "sweep_overrides": label}, f"-{label}"


@hydra_entry("configs", "train")
def main(cfg) -> float:
    conf = to_config(cfg)
    if not conf.run_dir:  # Hydra's output dir for this job, on a copy: the composed config is not written into
        conf = dataclasses.replace(conf, run_dir=HydraConfig.get().runtime.output_dir)
    tags, suffix = sweep_job()
    with user_errors():
        return run(conf, tags=tags, name_suffix=suffix)


if __name__ == "__main__":
    main()
