"""The training step timed and its memory measured, as ``train.py`` would run it.

:func:`build_benchmark_step` builds the configured model and LMS plan exactly as training does and
returns one compiled training step (``brats_seg.training.steps.make_train_step`` under the
``distribute`` strategy) on random tensors; :func:`run_benchmark` times ``benchmark.steps`` of them
and reads the peak memory (device peak on GPU; process peak RSS on CPU, above the RSS just before the
model is built), beside the planner's predictions of both. :func:`measure_pipeline` times the input
pipeline alone, :func:`measure_sgemm_flops` the practical peak the step's FLOP/s is judged against.
TensorFlow is imported inside the functions, after :func:`brats_seg.backend.configure`.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import tempfile
import time
from pathlib import Path

from brats_seg.benchmark.onednn import capture_stdout, onednn_profile
from brats_seg.choices import check_choice
from brats_seg.config import BenchmarkInput

__all__ = [
    "build_benchmark_step",
    "make_input",
    "measure_pipeline",
    "measure_sgemm_flops",
    "plan_benchmark",
    "run_benchmark",
]


def plan_benchmark(run):
    """``(strategy, plan, predicted peak bytes)`` of the resolved run's step, as ``train.py`` plans it;
    a fixed strategy is measured whatever it takes (no limit), ``auto`` plans to ``lms.limit``."""
    from brats_seg.lms.planner.memory_model import memory_model_for
    from brats_seg.lms.planner.preflight import plan_run
    from brats_seg.lms.planner.search import estimate_peak
    from brats_seg.lms.planner.workload import LMSOptions, Workload

    conf, backend, strategy = run.config, run.backend, run.lms
    if strategy != "auto":
        conf = dataclasses.replace(conf, lms=dataclasses.replace(conf.lms, limit="1e15"))
    plan = plan_run(conf, backend.device, strategy)
    workload = Workload.from_config(conf)
    if conf.benchmark.input == "memory":  # fed from memory: no input pipeline buffers
        workload = dataclasses.replace(workload, input_batches=0)
    if strategy in ("off", "recompute", "offload"):
        options = LMSOptions.from_config(conf.lms, None, allow_offload=backend.device == "GPU", strategy=strategy)
        return strategy, plan, estimate_peak(workload, options, memory_model_for(backend.device)).peak_bytes
    return strategy, plan, plan.predicted_peak_bytes


def _random_cache(root: Path, conf, cases: int) -> list[Path]:
    """``cases`` cache entries of random data at the configured shape (float16 image, uint8 regions)."""
    import numpy as np

    from brats_seg.data.cache import IMAGE_FILE, REGIONS_FILE
    from brats_seg.files import atomic_dir

    rng = np.random.default_rng(conf.trainer.seed)
    shape = tuple(conf.resolution.shape)
    dirs = []
    for k in range(cases):
        case = root / f"case_{k:03d}"
        with atomic_dir(case) as entry:  # read back by the input pipeline, as a cache entry is
            np.save(entry / IMAGE_FILE, rng.standard_normal((*shape, 4), dtype=np.float32).astype(np.float16))
            np.save(entry / REGIONS_FILE, (rng.random((*shape, conf.model.out_channels)) < 0.05).astype(np.uint8))
        dirs.append(case)
    return dirs


def _whole_volumes(conf):
    """The training input the benchmark reads: the run's, of whole volumes and without a step cap."""
    from brats_seg.data.pipeline import TrainInput

    return dataclasses.replace(TrainInput.from_config(conf), patch_size=None, max_steps_per_epoch=None)


def make_input(conf, replicas, tmp: Path):
    """The step's iterator: one random batch repeated from memory, or the training input
    pipeline (augmentation, prefetch) over random cache entries."""
    import numpy as np
    import tensorflow as tf

    from brats_seg.data.pipeline import make_train_dataset

    b, shape = conf.trainer.batch_size, tuple(conf.resolution.shape)
    if conf.benchmark.input == "memory":  # the dtypes the input pipeline hands the step
        rng = np.random.default_rng(conf.trainer.seed)
        x = tf.constant(rng.standard_normal((b, *shape, conf.model.in_channels), dtype=np.float32).astype(np.float16))
        y = tf.constant((rng.random((b, *shape, conf.model.out_channels)) < 0.05).astype(np.uint8))
        dataset = tf.data.Dataset.from_tensors((x, y)).repeat()
    else:
        dirs = _random_cache(tmp, conf, max(2 * b, 2))
        dataset = make_train_dataset(dirs, _whole_volumes(conf))
    return iter(replicas.experimental_distribute_dataset(dataset))


def build_benchmark_step(run, tmp: Path):
    """Everything the benchmark runs: ``(info, run_once)``; ``run_once()`` runs one training
    step and brings its sums to the host, as the training loop does. ``info`` has the
    backend, the plan, the prediction, the step's FLOPs and the RSS just before the model
    was built (``baseline_bytes``). ``run``: the resolved run (its backend applied here if the
    entry point has not)."""
    from brats_seg.backend import configure

    conf, backend = run.config, configure(run.backend)
    import tensorflow as tf

    from brats_seg.distribute.strategy import make_strategy
    from brats_seg.lms.planner.cost import compute_network_cost, compute_step_flops
    from brats_seg.lms.planner.workload import Workload
    from brats_seg.lms.runtime.stats import current_rss_bytes, reset_device_peak
    from brats_seg.training.build import compile_models, training_metrics
    from brats_seg.training.steps import make_train_step

    strategy, plan, predicted = plan_benchmark(run)
    replicas, _ = make_strategy(conf.distribute, backend.device)  # before any TensorFlow op runs
    iterator = make_input(conf, replicas, tmp)
    baseline = current_rss_bytes() if backend.device == "CPU" else 0  # just before the model is built
    reset_device_peak(backend.device)
    # The step training runs (training/loop.py): strategy.run of the tape, the update and the
    # per-sample metric sums. Keras' train_on_batch, measured before, holds 11-18% more.
    model, _, stats, loss, _ = compile_models(conf, plan, backend, replicas, steps_per_epoch=100)
    step = make_train_step(replicas, model, loss, training_metrics(conf), conf.trainer.batch_size)
    stop = tf.constant(False)

    def run_once():
        return {k: v.numpy() for k, v in step(iterator, stop).items()}

    info = {
        "backend": backend,
        "strategy": strategy,
        "plan": plan,
        "predicted": predicted,
        "stats": stats,
        "baseline": baseline,
        "flops": compute_step_flops(compute_network_cost(Workload.from_config(conf))),
    }
    return info, run_once


def measure_sgemm_flops(n: int = 4096, repeats: int = 5) -> float:
    """FLOP/s of an ``n x n`` float32 matrix product with this process's threads (the best of
    ``repeats``): the practical peak the training step's FLOP/s is judged against."""
    import tensorflow as tf

    a = tf.random.normal((n, n))
    b = tf.random.normal((n, n))
    matmul = tf.function(lambda a, b: tf.reduce_sum(tf.linalg.matmul(a, b)))
    matmul(a, b).numpy()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        matmul(a, b).numpy()
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n**3 / best


def measure_pipeline(conf) -> dict:
    """Volumes per second of the training input pipeline alone (load, augment, batch), no model."""
    import tensorflow as tf

    from brats_seg.data.pipeline import make_train_dataset

    b = conf.trainer.batch_size
    with tempfile.TemporaryDirectory() as tmp:
        dirs = _random_cache(Path(tmp), conf, max(4 * b, 4))
        it = iter(make_train_dataset(dirs, _whole_volumes(conf)))
        next(it)  # start-up
        n = max(conf.benchmark.steps, 1) * 4
        t0 = time.perf_counter()
        for _ in range(n):
            x, _ = next(it)
            tf.debugging.assert_all_finite(tf.cast(x[:1, :1, :1, :1], tf.float32), "")
        seconds = time.perf_counter() - t0
    return {
        "mode": "pipeline_only",
        "augment": conf.trainer.augment,
        "shape": list(conf.resolution.shape),
        "batch_size": b,
        "batches": n,
        "seconds": round(seconds, 3),
        "volumes_per_s": round(n * b / seconds, 2),
    }


def run_benchmark(conf, overrides: list[str]) -> dict:
    """Time the configured training step (or, ``benchmark.pipeline_only``, the input pipeline) and
    measure its memory: the record ``scripts/benchmark.py`` prints as one JSON line (the keys its
    docstring lists), ``overrides`` (the command line's) included to name the point."""
    from brats_seg.backend import configure
    from brats_seg.resolve import resolve_run

    check_choice(conf.benchmark.input, BenchmarkInput, "benchmark.input")
    run = resolve_run(conf, training=False)  # outputs derived, values checked, backend decided: once
    conf = run.config
    if conf.benchmark.onednn_verbose:  # read by oneDNN when TensorFlow loads it: before configure imports it
        os.environ["ONEDNN_VERBOSE"] = "1"
    backend = configure(run.backend)  # before anything imports TensorFlow
    import numpy as np

    from brats_seg.cpu import cpu_id, cpu_isa, cpu_kind, cpu_model_name
    from brats_seg.lms.runtime.stats import allocator_peak_bytes, device_peak_bytes

    if conf.benchmark.pipeline_only:
        return {"overrides": overrides, "cpu": cpu_model_name(), "cpu_kind": cpu_kind(), **measure_pipeline(conf)}
    with tempfile.TemporaryDirectory() as tmp:
        info, run_once = build_benchmark_step(run, Path(tmp))
        backend, plan, stats = info["backend"], info["plan"], info["stats"]
        times = []
        for _ in range(max(conf.benchmark.steps, 1) + 1):
            t0 = time.perf_counter()
            run_once()
            times.append(time.perf_counter() - t0)
        profile = {}
        if conf.benchmark.onednn_verbose:  # one more step, its primitives caught (the timed ones printed theirs)
            t0 = time.perf_counter()
            _, text = capture_stdout(run_once)
            profile = {**onednn_profile(text), "profiled_step_s": round(time.perf_counter() - t0, 3)}
        peak = device_peak_bytes(backend.device)
        allocator_peak = allocator_peak_bytes(backend.device)
    sgemm = measure_sgemm_flops() if conf.benchmark.sgemm else None  # after the memory was read
    b, shape = conf.trainer.batch_size, tuple(conf.resolution.shape)
    baseline, predicted = info["baseline"], info["predicted"]
    step_s = statistics.median(times[1:])
    result = {
        "overrides": overrides,
        "backend": backend.name,
        "device": backend.device,
        "cpu": cpu_model_name(),
        "cpu_id": cpu_id(),
        "cpu_isa": cpu_isa(),
        "cpu_kind": cpu_kind(),
        "strategy": info["strategy"],
        "resolution": conf.resolution.name,
        "shape": list(shape),
        "batch_size": b,
        "precision": conf.backend.precision,
        "depth": conf.model.depth,
        "base_filters": conf.model.base_filters,
        "input": conf.benchmark.input,
        "steps": len(times) - 1,
        "step_s": round(step_s, 4),
        "step_times_s": [round(t, 4) for t in times[1:]],  # the timed steps (the median is step_s): their spread
        "predicted_step_s": None if plan.predicted_step_s is None else round(plan.predicted_step_s, 3),
        "first_step_s": round(times[0], 3),
        "voxels_per_s": round(b * float(np.prod(shape)) / step_s, 1),
        "step_flops": info["flops"],
        "flops_per_s": round(info["flops"] / step_s, 1),
        "sgemm_flops_per_s": None if sgemm is None else round(sgemm, 1),
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
        result.update(dict(stats.result().items()))
    return {**result, **profile}
