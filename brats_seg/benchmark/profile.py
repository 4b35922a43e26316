"""Where a training step's time goes: oneDNN's primitives and TensorFlow's ops, profiled.

The step is profiled in a child process (``scripts/profile_step.py`` starts it): oneDNN's
``profile_exec`` lines must go to the child's own stdout, and its environment must be set before
TensorFlow loads. :func:`profile_child` runs in the child, :func:`read_profile` reads what it left
(its stdout between the markers, TensorFlow's trace in ``logdir``).
"""

from __future__ import annotations

import collections
import json
import sys
import tempfile
import time
from pathlib import Path

from brats_seg.benchmark.onednn import onednn_seconds

__all__ = ["MARK", "profile_child", "read_profile", "tf_op_seconds"]

MARK = "PROFILE_STEPS"  # the child's lines to the parent: MARK BEGIN, MARK END, MARK RESULT <json>


def _say(line: str) -> None:
    """A line of the child's protocol, on the stdout oneDNN writes to (in order with its lines)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def profile_child(conf, logdir: str) -> None:
    """In the child: build the step as the benchmark does, measure SGEMM, warm up twice, then time
    ``benchmark.steps`` steps under TensorFlow's profiler (trace into ``logdir``)."""
    from brats_seg.benchmark.step import build_benchmark_step, measure_sgemm_flops
    from brats_seg.resolve import resolve_run

    run = resolve_run(conf, training=False)  # outputs derived, values checked, backend decided: once
    conf = run.config
    step, run_once = build_benchmark_step(run, Path(tempfile.mkdtemp(dir=logdir)))
    import tensorflow as tf

    sgemm = measure_sgemm_flops()
    run_once()  # trace, warm up
    run_once()
    _say(f"{MARK} BEGIN")
    tf.profiler.experimental.start(logdir)
    times = []
    for _ in range(max(conf.benchmark.steps, 1)):
        t0 = time.perf_counter()
        run_once()
        times.append(time.perf_counter() - t0)
    tf.profiler.experimental.stop()
    _say(f"{MARK} END")
    _say(f"{MARK} RESULT " + json.dumps({"step_s": times, "sgemm_flops_per_s": sgemm, "flops": step["flops"]}))


def tf_op_seconds(logdir: str) -> dict[str, float]:
    """Seconds per TensorFlow op type summed over the host threads of the trace in ``logdir``."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    out: dict[str, float] = collections.defaultdict(float)
    for path in Path(logdir).rglob("*.xplane.pb"):
        space = xplane_pb2.XSpace()
        space.ParseFromString(path.read_bytes())
        for plane in space.planes:
            if not plane.name.startswith("/host:CPU"):
                continue
            names = {k: m.name for k, m in plane.event_metadata.items()}
            for line in plane.lines:
                if "TraceMe" in line.name or "python" in line.name.lower():
                    continue
                for event in line.events:
                    name = names.get(event.metadata_id, "")
                    # TF op events are "name:Type"; "Scope::Event" ones (ExecutorState::Process,
                    # Iterator::Prefetch, ...) enclose ops or are tf.data's and would count twice.
                    if ":" not in name or "::" in name:
                        continue
                    out[name.rsplit(":", 1)[1]] += event.duration_ps / 1e12
    return dict(out)


def read_profile(stdout: str, logdir: str) -> dict:
    """What the child measured: ``step_s`` (each profiled step), ``flops``, ``sgemm_flops_per_s``,
    ``onednn`` (seconds per primitive, :func:`brats_seg.benchmark.onednn.onednn_seconds`) and
    ``tf_ops`` (seconds per op type, :func:`tf_op_seconds`), both summed over the profiled steps."""
    lines = stdout.splitlines()
    begin, end = lines.index(f"{MARK} BEGIN"), lines.index(f"{MARK} END")
    result = json.loads(next(line for line in lines if line.startswith(f"{MARK} RESULT")).split(" ", 2)[2])
    return {**result, "onednn": onednn_seconds(lines[begin:end]), "tf_ops": tf_op_seconds(logdir)}
