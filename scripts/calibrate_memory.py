#!/usr/bin/env python
"""Calibrate the planner's CPU memory model: measure, fit, and judge on points not fitted.

    python scripts/calibrate_memory.py                  # measure both grids (resumable), fit, report
    python scripts/calibrate_memory.py fit_only=true    # refit from the measurements on file
    python scripts/calibrate_memory.py fit_only=true out=brats_seg/lms/presets/cpu_avx512.json
    python scripts/calibrate_memory.py runs=3 validation_runs=4
    python scripts/calibrate_memory.py cross_validate=true [+rule.backward_release_lag_layers=100]

Every point is ``scripts/benchmark.py`` in a fresh subprocess (its own peak RSS), four training
steps, ``runs`` times on the calibration grid and ``validation_runs`` times on the validation grid;
a point's measurement is the largest of its runs. The fit adjusts the host CPU's preset on the
calibration grid only and reports its error on the validation grid; the preset's planning margin
comes from a leave-one-configuration-out cross-validation of that fit (``cross_validate=true``
runs that alone on the file, with other values of the model's rules, ``+rule.<field>=<value>``,
or another objective, ``under_weight`` and ``target_bias``, and writes nothing). Writes
``brats_seg/lms/presets/cpu_<kind>.json`` (``out`` to change), which the planner reads;
measurements are saved after every run, so an interrupted calibration continues where it stopped. The grids, the fit and the report are
:mod:`brats_seg.benchmark.memory_calibration`'s.
"""

from __future__ import annotations

import sys
from pathlib import Path

from brats_seg.cli import hydra_entry, to_config, user_errors
from brats_seg.script_configs import register_configs

register_configs()
BENCHMARK = Path(__file__).resolve().with_name("benchmark.py")  # each measurement: this in a fresh process


@hydra_entry("../configs", "calibrate_memory")
def main(cfg) -> None:
    from brats_seg.benchmark.memory_calibration import calibrate

    conf = to_config(cfg)
    with user_errors("the calibration"):
        path = calibrate(conf, [sys.executable, str(BENCHMARK)])
    if path is not None:
        print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
