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
build on; None where TensorFlow keeps no statistics) and ``predicted_peak_bytes`` (the planner's prediction of ``peak_bytes - baseline_bytes``).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from brats_seg.cli import to_config, user_errors  # noqa: E402
from brats_seg.config import register_configs  # noqa: E402

register_configs()


def benchmark(conf, overrides: list[str]) -> dict:
    from brats_seg.backend import configure

    backend = configure(conf.backend)
    import numpy as np
    import tensorflow as tf

    from brats_seg.cpu import cpu_isa, cpu_model_name
    from brats_seg.distribute.strategy import make_strategy
    from brats_seg.lms.memory_model import memory_model_for
    from brats_seg.lms.preflight import plan_run
    from brats_seg.lms.search import estimate_peak
    from brats_seg.lms.stats import allocator_peak_bytes, current_rss_bytes, device_peak_bytes, reset_device_peak
    from brats_seg.lms.workload import LMSOptions, Workload
    from brats_seg.training.loop import compile_models, effective_lms, training_metrics
    from brats_seg.training.steps import make_train_step

    strategy = effective_lms(conf, backend)
    if strategy != "auto":  # a fixed strategy is measured whatever it takes; auto plans to lms.limit
        conf.lms.limit = "1e15"
    plan = plan_run(conf, backend.device, strategy)
    fixed = strategy if strategy in ("off", "recompute", "offload") else None
    if fixed:
        options = LMSOptions.from_config(conf.lms, None, allow_offload=backend.device == "GPU", strategy=fixed)
        predicted = estimate_peak(Workload.from_config(conf), options, memory_model_for(backend.device)).peak_bytes
    else:
        predicted = plan.predicted_peak_bytes

    replicas, _ = make_strategy(conf.distribute, backend.device)  # before any TensorFlow op runs
    b, shape = conf.trainer.batch_size, tuple(conf.resolution.shape)
    rng = np.random.default_rng(conf.trainer.seed)
    x = tf.constant(rng.standard_normal((b, *shape, conf.model.in_channels), dtype=np.float32))
    y = tf.constant((rng.random((b, *shape, conf.model.out_channels)) < 0.05).astype(np.float32))

    baseline = current_rss_bytes() if backend.device == "CPU" else 0  # just before the model is built
    reset_device_peak(backend.device)
    # The step training runs (training/loop.py): strategy.run of the tape, the update and the
    # per-sample metric sums. Keras' train_on_batch, measured before, holds 11-18% more.
    model, _, stats, loss = compile_models(conf, plan, backend, replicas, steps_per_epoch=100)
    step = make_train_step(replicas, model, loss, training_metrics(conf), b)
    iterator = iter(replicas.experimental_distribute_dataset(tf.data.Dataset.from_tensors((x, y)).repeat()))
    stop = tf.constant(False)
    times = []
    for _ in range(max(conf.benchmark.steps, 1) + 1):
        t0 = time.perf_counter()
        {k: v.numpy() for k, v in step(iterator, stop).items()}  # to the host, as the loop does
        times.append(time.perf_counter() - t0)
    peak = device_peak_bytes(backend.device)
    allocator_peak = allocator_peak_bytes(backend.device)
    step_s = statistics.median(times[1:])
    result = {
        "overrides": overrides,
        "backend": backend.name,
        "device": backend.device,
        "cpu": cpu_model_name(),
        "cpu_isa": cpu_isa(),
        "strategy": strategy,
        "resolution": conf.resolution.name,
        "shape": list(shape),
        "batch_size": b,
        "precision": conf.backend.precision,
        "steps": len(times) - 1,
        "step_s": round(step_s, 4),
        "first_step_s": round(times[0], 3),
        "voxels_per_s": round(b * float(np.prod(shape)) / step_s, 1),
        "peak_bytes": int(peak),
        "baseline_bytes": int(baseline),
        "measured_bytes": int(peak - baseline),
        "allocator_peak_bytes": allocator_peak,
        "predicted_peak_bytes": int(predicted),
        "prediction_error": round((predicted - (peak - baseline)) / max(peak - baseline, 1), 4),
        "recomputed_flops": plan.recomputed_flops,
        "moved_bytes": plan.moved_bytes,
    }
    if stats is not None:
        result.update({k: v for k, v in stats.result().items()})
    return result


@hydra.main(config_path="../configs", config_name="benchmark", version_base="1.3")
def main(cfg) -> None:
    conf = to_config(cfg)
    with user_errors():
        result = benchmark(conf, list(HydraConfig.get().overrides.task))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
