#!/usr/bin/env python
"""Time the real training step and measure its memory; print one JSON line.

    python scripts/benchmark.py resolution=half lms=recompute benchmark.steps=3
    python scripts/benchmark.py resolution=full lms=off trainer.batch_size=1 backend=cpu_onednn

Builds the configured model and LMS plan exactly as ``train.py`` does, runs the compiled
training step (``brats_seg.training.steps.make_train_step``, the step training runs, under
the ``distribute`` strategy) on a batch of random tensors, and
prints: the overrides, ``step_s`` (median seconds per step, first excluded),
``voxels_per_s``, ``peak_bytes`` (device peak on GPU; process peak RSS on CPU),
``baseline_bytes`` (0 on GPU; on CPU the RSS just before the model is built),
``allocator_peak_bytes`` (TensorFlow's allocator's own peak of live tensors, from the model
build on; None where TensorFlow keeps no statistics), ``predicted_peak_bytes`` (the planner's
prediction of ``peak_bytes - baseline_bytes``) and, on a CPU, ``predicted_step_s`` (the
planner's step-time model, recomputation included, beside the measured ``step_s``).
``benchmark.onednn_verbose=true`` adds one more step with oneDNN's primitives caught: the
milliseconds per primitive kind and the share spent in reorders (layout changes).
``benchmark.sweep=<name>`` runs a grid of these, each point in a fresh process
(:mod:`brats_seg.benchmark.sweep`). The work is :mod:`brats_seg.benchmark.step`'s.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from hydra.core.hydra_config import HydraConfig

from brats_seg.cli import hydra_entry, to_config, user_errors
from brats_seg.script_configs import register_configs

register_configs()


@hydra_entry("../configs", "benchmark")
def main(cfg) -> None:
    from brats_seg.benchmark.step import run_benchmark
    from brats_seg.benchmark.sweep import run_sweep

    conf = to_config(cfg)
    overrides = list(HydraConfig.get().overrides.task)
    with user_errors():
        if conf.benchmark.sweep:  # each point is this script again, in a fresh process
            print(f"results in {run_sweep(conf, overrides, [sys.executable, str(Path(__file__).resolve())])}")
            return
        result = run_benchmark(conf, overrides)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
