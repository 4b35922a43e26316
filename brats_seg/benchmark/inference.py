"""Whole-volume inference's memory at its first call, against the planner's inference estimate.

What an evaluation pays per process: the traced graph, oneDNN's primitives and the activations
of the first :func:`brats_seg.evaluation.inference.sliding.predict_volume` call, beside the forward term of
:func:`brats_seg.lms.planner.inference.estimate_inference` (this CPU's preset). Channels-last:
the image is ``(x, y, z, 4)``.
"""

from __future__ import annotations

import time

__all__ = ["measure_inference_peak"]


def measure_inference_peak(
    shape: tuple[int, int, int], depth: int, filters: int, mirror: bool = True, precision: str = "fp32"
) -> dict:
    """Build a U-Net (random weights, ``backend=cpu_onednn`` at ``precision``), run whole-volume inference
    twice on a random float16 image of ``shape`` (as the cache holds it), and return the record:
    ``first_call_peak_bytes`` (the RSS peak of the first call above the RSS before it),
    ``allocator_peak_bytes`` (TensorFlow's allocator peak of the second), ``estimate_forward_bytes``
    and their ``ratio``. Run each point in a fresh process on an otherwise idle machine.

    Raises:
        ValueError: a shape that is not three sides divisible by ``2**depth``.
    """
    shape = tuple(int(s) for s in shape)
    if len(shape) != 3 or any(s <= 0 or s % 2**depth for s in shape):
        raise ValueError(
            f"shape=[{','.join(map(str, shape))}]: give the network grid as [x,y,z], each side a positive multiple of "
            f"2^depth = {2**depth} (e.g. shape=[96,112,80])."
        )
    from brats_seg.backend import configure, decide_backend
    from brats_seg.config import BackendConfig, ModelConfig

    backend = configure(decide_backend(BackendConfig(name="cpu_onednn", precision=precision)))
    import numpy as np
    import tensorflow as tf

    from brats_seg.cpu import cpu_kind, cpu_model_name
    from brats_seg.evaluation.inference.sliding import predict_volume
    from brats_seg.lms.planner.inference import estimate_inference
    from brats_seg.lms.planner.memory_model import memory_model_for
    from brats_seg.lms.planner.workload import Workload
    from brats_seg.lms.runtime.stats import current_rss_bytes, peak_rss_bytes, reset_peak_rss
    from brats_seg.model.unet3d import build_unet3d

    cfg = ModelConfig(depth=depth, base_filters=filters, out_channels=3, region_parents=[-1, 0, 0])
    model = build_unet3d(cfg, shape)
    image = np.random.default_rng(0).standard_normal((*shape, 4)).astype(np.float16)
    base = current_rss_bytes()
    reset_peak_rss()
    started = time.perf_counter()
    predict_volume(model, image, mirror=mirror)
    first_s = time.perf_counter() - started
    first = peak_rss_bytes() - base
    tf.config.experimental.reset_memory_stats("CPU:0")
    current = tf.config.experimental.get_memory_info("CPU:0")["current"]
    started = time.perf_counter()
    predict_volume(model, image, mirror=mirror)
    second_s = time.perf_counter() - started
    allocator = tf.config.experimental.get_memory_info("CPU:0")["peak"] - current
    est = estimate_inference(
        Workload(cfg, shape, 1, backend.policy), memory_model_for("CPU"), mirror=mirror, scoring=False
    )
    return {
        "cpu": cpu_model_name(),
        "cpu_kind": cpu_kind(),
        "shape": list(shape),
        "depth": depth,
        "filters": filters,
        "mirror": mirror,
        "precision": precision,
        "policy": backend.policy,
        "first_call_peak_bytes": int(first),
        "allocator_peak_bytes": int(allocator),
        "estimate_forward_bytes": int(est.forward_bytes),
        "first_call_s": round(first_s, 2),
        "second_call_s": round(second_s, 2),
        "ratio": round(first / est.forward_bytes, 3),
    }
