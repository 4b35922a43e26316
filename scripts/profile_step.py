#!/usr/bin/env python
"""Where a training step's time goes: oneDNN's kernels and reorders, TensorFlow's other ops.

    python scripts/profile_step.py resolution=full model.depth=4 trainer.batch_size=1 backend=cpu_onednn
    python scripts/profile_step.py resolution=full model.depth=4 trainer.batch_size=1 backend=cpu_onednn \
        backend.precision=bf16 benchmark.steps=2

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

The command line is the benchmark's (``configs/benchmark.yaml``, checked here before the child
starts). The child is this script again (``--child profile <json>``, :func:`brats_seg.cli.child_command`),
not a Hydra command: ``ONEDNN_VERBOSE`` must be set before TensorFlow loads and its lines must go to
the child's own stdout; it composes the same config from the overrides its parent passes.
The work is :mod:`brats_seg.benchmark.profile`'s.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from hydra.core.hydra_config import HydraConfig

from brats_seg.cli import child_args, child_command, hydra_entry, to_config, user_errors
from brats_seg.project import compose_config
from brats_seg.script_configs import register_configs

register_configs()
REPO = Path(__file__).resolve().parents[1]  # the child runs here, as the benchmark's points do


def _print_table(title: str, times: dict[str, float], total: float, top: int = 40) -> None:
    print(f"\n{title}")
    for label, seconds in sorted(times.items(), key=lambda kv: -kv[1])[:top]:
        print(f"  {seconds:8.2f} s  {100 * seconds / total:5.1f}%  {label}")


@hydra_entry("../configs", "benchmark")
def main(cfg) -> None:
    from brats_seg.benchmark.profile import read_profile

    to_config(cfg)  # the overrides are checked here; the child composes them again
    overrides = list(HydraConfig.get().overrides.task)
    with user_errors(), tempfile.TemporaryDirectory() as logdir:
        env = {**os.environ, "ONEDNN_VERBOSE": "profile_exec", "TF_CPP_MIN_LOG_LEVEL": "2"}
        proc = subprocess.run(
            child_command(Path(__file__).resolve(), "profile", overrides=overrides, logdir=logdir),
            capture_output=True,
            text=True,
            env=env,
            cwd=REPO,
        )
        if proc.returncode != 0:
            sys.exit(f"profiling failed:\n{proc.stderr[-3000:]}")
        result = read_profile(proc.stdout, logdir)
    onednn, tf_ops = result["onednn"], result["tf_ops"]
    steps = len(result["step_s"])
    step_s = sum(result["step_s"]) / steps
    flops = result["flops"]
    print(f"{' '.join(overrides)}")
    print(
        f"step {step_s:.2f} s ({', '.join(f'{t:.2f}' for t in result['step_s'])}), {flops / 1e12:.2f} TFLOP: "
        f"{flops / step_s / 1e9:.0f} GFLOP/s; SGEMM 4096^2 float32, same threads: "
        f"{result['sgemm_flops_per_s'] / 1e9:.0f} GFLOP/s -> {flops / step_s / result['sgemm_flops_per_s']:.0%}"
    )
    op_total = sum(tf_ops.values())
    print(
        f"TensorFlow ops: {op_total / steps:.2f} s per step summed over threads; oneDNN primitives: "
        f"{sum(onednn.values()) / steps:.2f} s"
    )
    _print_table(
        "TensorFlow op types (s per step, share of op time)",
        {k: v / steps for k, v in tf_ops.items()},
        op_total / steps,
    )
    _print_table(
        "oneDNN primitives (s per step, share of op time)", {k: v / steps for k, v in onednn.items()}, op_total / steps
    )


def child(role: str, args: dict) -> None:
    """The profiled step, in the child process ``main`` started."""
    from brats_seg.benchmark.profile import profile_child

    if role != "profile":
        sys.exit(f"error: unknown child role {role!r}")
    profile_child(compose_config("benchmark", args["overrides"], config_dir=REPO / "configs"), args["logdir"])


if __name__ == "__main__":
    if (request := child_args()) is not None:
        child(*request)
    else:
        main()
