#!/usr/bin/env python
"""Predict a run's peak memory and plan Large Model Support for it (no TensorFlow needed).

    python scripts/plan_memory.py resolution=full lms.limit=16GB backend=gpu_lms
    python scripts/plan_memory.py resolution=2x lms=auto lms.limit=80GB plan.format=json

Prints the plan table for the configured ``lms=`` strategy (``auto`` when lms=off) and,
for each strategy (off / recompute / offload / auto), the predicted peak and overhead.
Exits 1 if the configured strategy does not fit ``lms.limit``, with what would fit.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import hydra

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from brats_seg.cli import to_config, user_errors  # noqa: E402
from brats_seg.config import register_configs  # noqa: E402

register_configs()


def _gb(n) -> str:
    return "-" if n is None else f"{n / 1e9:.2f} GB"


@hydra.main(config_path="../configs", config_name="plan_memory", version_base="1.3")
def main(cfg) -> None:
    from brats_seg.lms.plan import PlanDoesNotFitError
    from brats_seg.lms.preflight import compare_run, plan_run, planning_device

    conf = to_config(cfg)
    device = planning_device(conf)
    strategy = "auto" if conf.lms.name == "off" else conf.lms.name
    with user_errors():
        limit, strategies = compare_run(conf, device)
        try:
            plan, error = plan_run(conf, device, strategy), None
        except PlanDoesNotFitError as e:
            plan, error = None, e
    if conf.plan.format == "json":
        print(json.dumps({"limit_bytes": limit, "device": device, "strategy": strategy,
                          "strategies": strategies, "plan": plan.to_dict()["plan"] if plan else None,
                          "error": str(error) if error else None}))
    else:
        if plan is not None:
            print(plan.format_table())
        print(f"\n{device} budget lms.limit={conf.lms.limit} -> {_gb(limit)}")
        print(f"{'strategy':<10} {'peak':>10} {'recompute':>12} {'moved':>10} {'overhead/step':>14}  fits")
        for name, s in strategies.items():
            if s.get("predicted_peak_bytes") is None:
                print(f"{name:<10} {'-':>10} {'':>12} {'':>10} {'':>14}  {s.get('reason', 'no')}")
                continue
            print(f"{name:<10} {_gb(s['predicted_peak_bytes']):>10} {s['recomputed_flops'] / 1e9:>8.1f} GFLOP "
                  f"{_gb(s['moved_bytes']):>10} {s['overhead_s'] * 1e3:>11.1f} ms  {'yes' if s['fits'] else 'no'}")
        if error is not None:
            print(f"\n{error}")
    if error is not None:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
