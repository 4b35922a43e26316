#!/usr/bin/env python
"""The memory of whole-volume inference at its first call, against the planner's estimate.

    python scripts/measure_inference_peak.py 'shape=[96,112,80]' depth=3 filters=8
    python scripts/measure_inference_peak.py 'shape=[128,160,112]' depth=4 filters=8 mirror=false
    python scripts/measure_inference_peak.py 'shape=[192,224,160]' depth=4 filters=6 precision=bf16

Builds the U-Net (random weights, oneDNN as ``backend=cpu_onednn``, ``precision=fp32|bf16``), runs
``brats_seg.evaluation.inference.sliding.predict_volume`` on a random float16 image of the shape (as the
cache holds it) with test-time mirroring, and prints one JSON line: the RSS peak of that first
call above the RSS before it (the traced graph, oneDNN's primitives, the activations: what an
evaluation pays per process), TensorFlow's allocator peak of a second call, and the inference
estimate's forward term (``brats_seg.lms.planner.inference.estimate_inference``, this CPU's
preset). Run each point in a fresh process on an otherwise idle machine. The work is
:func:`brats_seg.benchmark.inference.measure_inference_peak`'s.
"""

from __future__ import annotations

import json

from brats_seg.cli import hydra_entry, to_config, user_errors
from brats_seg.script_configs import register_configs

register_configs()


@hydra_entry("../configs", "measure_inference_peak")
def main(cfg) -> None:
    from brats_seg.benchmark.inference import measure_inference_peak

    conf = to_config(cfg)
    with user_errors():
        result = measure_inference_peak(
            tuple(conf.shape), conf.depth, conf.filters, mirror=conf.mirror, precision=conf.precision
        )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
