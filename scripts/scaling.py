#!/usr/bin/env python
"""Data-parallel scaling on one machine: 2 workers x 1 thread against 1 process x 2 threads.

    python scripts/scaling.py                                   # half resolution, depth 3, 16 filters
    python scripts/scaling.py resolution=tiny steps=20          # quick
    python scripts/scaling.py workers=2 threads=1 out=scaling.json

Both set-ups train the same global batch (``batch``, split over the workers in the
second) on the synthetic dataset for two epochs of ``steps`` steps without validation;
the time of the second epoch (``history.csv``'s ``seconds``, the first one traces the step)
gives the throughput in cases/s. The efficiency is the workers' throughput over the single
process's: 1.0 means the workers, with the same cores in all, train as fast as one
process using all of them. It is a measurement, not a target: on one 2-core machine the
workers add gradient all-reduces over loopback gRPC and lose intra-op parallelism.
Run it on an otherwise idle machine. The work is :func:`brats_seg.benchmark.scaling.measure_scaling`'s.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from brats_seg.cli import hydra_entry, to_config, user_errors
from brats_seg.script_configs import register_configs

register_configs()
TRAIN = Path(__file__).resolve().parents[1] / "train.py"


@hydra_entry("../configs", "scaling")
def main(cfg) -> None:
    from brats_seg.benchmark.scaling import measure_scaling
    from brats_seg.files import write_text_atomic

    conf = to_config(cfg)
    with user_errors("the scaling measurement"):
        try:
            result = measure_scaling(conf, [sys.executable, str(TRAIN)])
        except RuntimeError as e:  # a training process failed: its output's tail
            sys.exit(f"error: {e}")
    single, multi = result["single_process"], result["workers"]
    rows = [
        (f"1 process x {single['threads']} threads", single),
        (f"{multi['workers']} workers x {multi['threads_each']} thread(s)", multi),
    ]
    print(f"\n{'set-up':<28} {'epoch (s)':>10} {'cases/s':>9}")
    for label, r in rows:
        print(f"{label:<28} {r['epoch_s']:>10.1f} {r['cases_per_s']:>9.3f}")
    print(f"scaling efficiency (workers / single): {result['efficiency']:.2f}")
    if conf.out:
        write_text_atomic(conf.out, json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
