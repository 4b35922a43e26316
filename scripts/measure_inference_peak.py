#!/usr/bin/env python
"""The memory of whole-volume inference at its first call, against the planner's estimate.

    python scripts/measure_inference_peak.py 96x112x80 --depth 3 --filters 8
    python scripts/measure_inference_peak.py 128x160x112 --depth 4 --filters 8 --no-mirror

Builds the U-Net (random weights, float32, oneDNN as ``backend=cpu_onednn``), runs
``brats_seg.evaluation.sliding.predict_volume`` on a random float16 image of the shape (as the
cache holds it) with test-time mirroring, and prints one JSON line: the RSS peak of that first
call above the RSS before it (the traced graph, oneDNN's primitives, the activations: what an
evaluation pays per process), TensorFlow's allocator peak of a second call, and the inference
estimate's forward term (``brats_seg.lms.planner.inference.estimate_inference``, this CPU's
preset). Run each point in a fresh process on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("shape", help="network grid x*y*z, e.g. 96x112x80")
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--filters", type=int, default=8)
    parser.add_argument("--no-mirror", action="store_true")
    args = parser.parse_args()
    shape = tuple(int(s) for s in args.shape.split("x"))

    from brats_seg.backend import configure
    from brats_seg.config import BackendConfig, ModelConfig

    configure(BackendConfig(name="cpu_onednn"))
    import numpy as np
    import tensorflow as tf

    from brats_seg.cpu import cpu_kind, cpu_model_name
    from brats_seg.evaluation.sliding import predict_volume
    from brats_seg.lms.planner.inference import estimate_inference
    from brats_seg.lms.planner.memory_model import memory_model_for
    from brats_seg.lms.planner.workload import Workload
    from brats_seg.lms.runtime.stats import current_rss_bytes, peak_rss_bytes, reset_peak_rss
    from brats_seg.model.unet3d import build_unet3d

    cfg = ModelConfig(depth=args.depth, base_filters=args.filters, out_channels=3, region_parents=[-1, 0, 0])
    model = build_unet3d(cfg, shape)
    image = np.random.default_rng(0).standard_normal((*shape, 4)).astype(np.float16)
    mirror = not args.no_mirror
    base = current_rss_bytes()
    reset_peak_rss()
    predict_volume(model, image, mirror=mirror)
    first = peak_rss_bytes() - base
    tf.config.experimental.reset_memory_stats("CPU:0")
    current = tf.config.experimental.get_memory_info("CPU:0")["current"]
    predict_volume(model, image, mirror=mirror)
    allocator = tf.config.experimental.get_memory_info("CPU:0")["peak"] - current
    est = estimate_inference(Workload(cfg, shape, 1, "float32"), memory_model_for("CPU"), mirror=mirror, scoring=False)
    print(json.dumps({"cpu": cpu_model_name(), "cpu_kind": cpu_kind(), "shape": list(shape), "depth": args.depth,
                      "filters": args.filters, "mirror": mirror, "first_call_peak_bytes": int(first),
                      "allocator_peak_bytes": int(allocator), "estimate_forward_bytes": int(est.forward_bytes),
                      "ratio": round(first / est.forward_bytes, 3)}))


if __name__ == "__main__":
    main()
