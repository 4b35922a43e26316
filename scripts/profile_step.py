#!/usr/bin/env python
"""Where a training step's time goes: oneDNN's kernels and reorders, TensorFlow's other ops.

    python scripts/profile_step.py resolution=full model.depth=4 trainer.batch_size=1 backend=cpu_onednn
    python scripts/profile_step.py resolution=full model.depth=4 trainer.batch_size=1 backend=cpu_onednn backend.precision=bf16 benchmark.steps=2

Runs the step ``scripts/benchmark.py`` times (the one training runs) in a child process with
``ONEDNN_VERBOSE=profile_exec`` and TensorFlow's profiler on, over ``benchmark.steps`` steps
after one warm-up step, and prints:

- the step's seconds, its FLOPs (``brats_seg.lms.planner.cost.compute_step_flops``), the FLOP/s it
  reaches and, measured in the same process just before, a 4096x4096 float32 SGEMM's rate
  with the same threads (the machine's practical peak for this work);
- oneDNN's share: seconds per primitive kind and implementation (convolutions by direction,
  reorders by source and destination layout: the copies between TensorFlow's plain layout
  and oneDNN's blocked ones);
- TensorFlow's ops by type (from the profiler's trace: every op of the step, oneDNN's
  included, summed over the inter-op threads), so concatenations, pads, transposes, casts,
  the norms and the loss show with their share.

Percentages are of the summed op time. Run on an otherwise idle machine.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

MARK = "PROFILE_STEPS"


def _child(overrides: list[str], logdir: str) -> None:
    """Build the step as the benchmark does, measure SGEMM, then profile ``benchmark.steps`` steps."""
    from hydra import compose, initialize_config_dir

    from brats_seg.cli import to_config
    from brats_seg.config import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        conf = to_config(compose(config_name="benchmark", overrides=overrides))
    from benchmark import build_benchmark_step, measure_sgemm_flops

    from brats_seg.resolve import resolve_run

    conf = resolve_run(conf, training=False).config  # outputs derived, values checked: once
    step, run_once = build_benchmark_step(conf, Path(tempfile.mkdtemp(dir=logdir)))
    import tensorflow as tf

    sgemm = measure_sgemm_flops()
    run_once()  # trace, warm up
    run_once()
    print(f"{MARK} BEGIN", flush=True)
    tf.profiler.experimental.start(logdir)
    times = []
    for _ in range(max(conf.benchmark.steps, 1)):
        t0 = time.perf_counter()
        run_once()
        times.append(time.perf_counter() - t0)
    tf.profiler.experimental.stop()
    print(f"{MARK} END", flush=True)
    print(f"{MARK} RESULT " + json.dumps({"step_s": times, "sgemm_flops_per_s": sgemm, "flops": step["flops"]}),
          flush=True)


def _onednn_times(lines: list[str]) -> dict[str, float]:
    """Seconds per ``kind impl`` (reorders: ``reorder src->dst``) from profile_exec lines."""
    out: dict[str, float] = collections.defaultdict(float)
    for line in lines:
        if not line.startswith("onednn_verbose") or ",exec," not in line:
            continue
        parts = line.strip().split(",")
        try:
            ms = float(parts[-1])
            i = parts.index("exec")
            kind, impl, prop = parts[i + 2], parts[i + 3], parts[i + 4]
        except (ValueError, IndexError):
            continue
        if kind == "reorder":
            mds = [p for p in parts if p.startswith(("src:", "dst:"))]
            label = "reorder " + " -> ".join(m.split(":")[1] + ":" + m.split(":")[3] for m in mds[:2])
        else:
            label = f"{kind} {prop} {impl}"
        out[label] += ms / 1000.0
    return dict(out)


def _tf_op_times(logdir: str) -> dict[str, float]:
    """Seconds per TensorFlow op type summed over the host threads of the trace."""
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


def _print_table(title: str, times: dict[str, float], total: float, top: int = 40) -> None:
    print(f"\n{title}")
    for label, seconds in sorted(times.items(), key=lambda kv: -kv[1])[:top]:
        print(f"  {seconds:8.2f} s  {100 * seconds / total:5.1f}%  {label}")


def main(argv: list[str]) -> None:
    if argv and argv[0] == "--child":
        _child(argv[2:], argv[1])
        return
    with tempfile.TemporaryDirectory() as logdir:
        env = {**os.environ, "ONEDNN_VERBOSE": "profile_exec", "TF_CPP_MIN_LOG_LEVEL": "2"}
        proc = subprocess.run([sys.executable, __file__, "--child", logdir, *argv], capture_output=True, text=True,
                              env=env, cwd=REPO)
        if proc.returncode != 0:
            sys.exit(f"profiling failed:\n{proc.stderr[-3000:]}")
        lines = proc.stdout.splitlines()
        begin, end = lines.index(f"{MARK} BEGIN"), lines.index(f"{MARK} END")
        result = json.loads(next(line for line in lines if line.startswith(f"{MARK} RESULT")).split(" ", 2)[2])
        onednn = _onednn_times(lines[begin:end])
        tf_ops = _tf_op_times(logdir)
    steps = len(result["step_s"])
    step_s = sum(result["step_s"]) / steps
    flops = result["flops"]
    print(f"{' '.join(argv)}")
    print(f"step {step_s:.2f} s ({', '.join(f'{t:.2f}' for t in result['step_s'])}), {flops / 1e12:.2f} TFLOP: "
          f"{flops / step_s / 1e9:.0f} GFLOP/s; SGEMM 4096^2 float32, same threads: "
          f"{result['sgemm_flops_per_s'] / 1e9:.0f} GFLOP/s -> {flops / step_s / result['sgemm_flops_per_s']:.0%}")
    op_total = sum(tf_ops.values())
    print(f"TensorFlow ops: {op_total / steps:.2f} s per step summed over threads; oneDNN primitives: "
          f"{sum(onednn.values()) / steps:.2f} s")
    _print_table("TensorFlow op types (s per step, share of op time)", {k: v / steps for k, v in tf_ops.items()},
                 op_total / steps)
    _print_table("oneDNN primitives (s per step, share of op time)", {k: v / steps for k, v in onednn.items()},
                 op_total / steps)


if __name__ == "__main__":
    main(sys.argv[1:])
