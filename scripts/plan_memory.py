#!/usr/bin/env python
"""Predict a run's peak memory and plan Large Model Support for it (no TensorFlow needed).

    python scripts/plan_memory.py resolution=full lms.limit=16GB backend=gpu_lms
    python scripts/plan_memory.py resolution=2x lms=auto lms.limit=80GB plan.format=json
    python scripts/plan_memory.py resolution=full model.depth=4 backend=cpu_onednn lms.limit=8GB plan.find=max_input
    python scripts/plan_memory.py resolution=full model.depth=4 backend=cpu_onednn lms.limit=8GB plan.find=max_patch

Prints the plan table for the configured ``lms=`` strategy (``auto`` when lms=off),
for each strategy (off / recompute / offload / auto) the predicted peak and overhead, and on a CPU
what the run will take on the dataset at ``data.root`` (seconds per step, per epoch of training
and of validation, and for the whole run, with the step-time model's confidence:
:mod:`brats_seg.run_time`).
Exits 1 if the configured strategy does not fit ``lms.limit``, with what would fit. A plan
fits when its predicted peak is at most ``lms.limit`` less the device preset's planning
margin (the model's worst under-prediction in cross-validation; 11.9% on every CPU kind with the
shipped presets, 10% on a GPU: ``MemoryModel.planning_margin``).

``plan.find=max_input`` prints instead, per strategy, the largest input of the resolution's
proportions (each axis a multiple of ``2**depth``) that fits ``lms.limit`` at the configured
batch, and how many times more voxels per step ``auto`` trains than ``off``; ``plan.find=max_batch``
the largest batch at the configured shape. ``plan.find=max_patch`` prints, per strategy, the largest
patch for patch mode, as the ``trainer.patch_size=[x,y,z]`` to pass, at the configured batch: of
``resolution.shape``'s proportions (not those of a configured ``trainer.patch_size``), each side a
multiple of ``2**depth`` and at most the grid on its axis, and the largest cube ``[s,s,s]`` (clipped
to the grid on a short axis). A patch equal to the whole grid means that strategy trains whole
volumes (``trainer.patch_size=null``) in the budget: patches are not needed for memory.
"""

from __future__ import annotations

import dataclasses
import json

from brats_seg.cli import hydra_entry, to_config, user_errors
from brats_seg.script_configs import register_configs

register_configs()


def format_seconds(seconds) -> str:
    from brats_seg.lms.planner.units import format_seconds as fmt

    return fmt(seconds)


def _gb(n) -> str:
    return "-" if n is None else f"{n / 1e9:.2f} GB"


def _budget_line(conf, device: str, limit: int, budget: int) -> str:
    return (
        f"lms.limit={conf.lms.limit} ({_gb(limit)}) on {device}, of which a plan may predict {_gb(budget)} "
        f"(the planner keeps {1 - budget / limit:.1%} free for its own error)"
    )


def _patch_override(shape) -> str:
    return "trainer.patch_size=[" + ",".join(map(str, shape)) + "]"


def _grid(conf, found: dict) -> tuple[tuple, tuple, list[str]]:
    """``resolution.shape``, the largest patch it allows (each side rounded down to a multiple of
    ``2**depth``: the grid itself when it is divisible) and the strategies whose patch is all of that."""
    from brats_seg.lms.planner.capacity import largest_patch_allowed

    grid = tuple(int(s) for s in conf.resolution.shape)
    whole = largest_patch_allowed(grid, 2**conf.model.depth)
    return grid, whole, [k for k, c in found.items() if c.input_shape == whole]


def _print_capacity(conf, device: str, limit: int, budget: int, found: dict) -> None:
    off, auto = (found[k].voxels * found[k].batch_size for k in ("off", "auto"))  # voxels per step
    ratio = auto / off if off else None
    patches = conf.plan.find == "max_patch"
    grid, whole, whole_fits = _grid(conf, found) if patches else (None, None, [])
    if conf.plan.format == "json":
        print(
            json.dumps(
                {
                    "limit_bytes": limit,
                    "budget_bytes": budget,
                    "device": device,
                    "find": conf.plan.find,
                    "strategies": {k: c.to_dict() for k, c in found.items()},
                    "auto_over_off_voxels_per_step": round(ratio, 3) if ratio else None,
                    **(
                        {
                            "grid_shape": list(grid),
                            "largest_patch_allowed": list(whole),
                            "whole_volume_fits": whole_fits if whole == grid else [],
                        }
                        if patches
                        else {}
                    ),
                }
            )
        )
        return
    print(_capacity_header(conf, device, limit, budget, grid, whole))
    if patches and conf.trainer.patch_size:
        print(
            f"(the configured trainer.patch_size={list(conf.trainer.patch_size)} is not used: "
            "patches are searched within the grid)"
        )
    if patches:
        _print_patch_rows(found)
    else:
        print(f"{'strategy':<10} {'input':>16} {'batch':>6} {'voxels':>12} {'predicted peak':>15}")
        for name, c in found.items():
            shape = "x".join(map(str, c.input_shape)) if c.input_shape else "nothing fits"
            print(f"{name:<10} {shape:>16} {c.batch_size:>6} {c.voxels:>12,} {_gb(c.predicted_peak_bytes or None):>15}")
    if whole_fits:
        print(_whole_grid_line(conf, grid, whole, whole_fits))
    if ratio:
        print(f"auto trains {ratio:.2f}x the voxels per step of off")
    elif auto:
        print("off fits nothing in this budget; auto does (above)")
    else:
        print("nothing fits in this budget: raise lms.limit, or plan a smaller model or batch")


def _capacity_header(conf, device: str, limit: int, budget: int, grid, whole) -> str:
    """What was searched, in what budget; ``grid``/``whole`` (``max_patch`` only, else None): the
    resolution grid and the largest patch it allows."""
    what = {"max_input": "input", "max_batch": "batch", "max_patch": "patch"}[conf.plan.find]
    multiple = 2**conf.model.depth
    head = (
        f"largest {what} within {_budget_line(conf, device, limit, budget)}; model depth {conf.model.depth}, "
        f"{conf.model.base_filters} filters, {conf.backend.precision}, "
    )
    if what == "batch":
        return head + f"input {tuple(conf.resolution.shape)}"
    if what == "input":
        return head + f"batch {conf.trainer.batch_size}, proportions of {tuple(conf.resolution.shape)}"
    rounded = f" (resolution.shape {grid} rounded down to multiples of {multiple})" if whole != grid else ""
    return (
        head + f"batch {conf.trainer.batch_size}, proportions of {whole}{rounded}, sides multiples of "
        f"{multiple}, each at most the grid's"
    )


def _whole_grid_line(conf, grid, whole, whole_fits: list[str]) -> str:
    """What the strategies whose patch is the largest the grid allows mean for patch mode."""
    fit = f"{', '.join(whole_fits)} {'fits' if len(whole_fits) == 1 else 'fit'}"
    if whole == grid:
        return (
            f"{fit} the whole {'x'.join(map(str, grid))} grid: train whole volumes (trainer.patch_size=null); "
            "a patch mode is not needed for memory"
        )
    return (
        f"{fit} the largest patch the {'x'.join(map(str, grid))} grid allows at model.depth={conf.model.depth} "
        f"({_patch_override(whole)}); whole volumes need a grid of multiples of {2**conf.model.depth}"
    )


def _print_widths(conf, device: str, limit: int, budget: int, rows, chosen) -> None:
    """plan.find=max_width: auto's plan at each width, and the widest that fits."""
    if conf.plan.format == "json":
        print(
            json.dumps(
                {
                    "limit_bytes": limit,
                    "budget_bytes": budget,
                    "device": device,
                    "find": "max_width",
                    "widths": [r.to_dict() for r in rows],
                    "chosen_base_filters": chosen,
                }
            )
        )
        return
    print(
        f"widest U-Net within {_budget_line(conf, device, limit, budget)}; model depth {conf.model.depth}, "
        f"{conf.model.norm} norm, {conf.backend.precision}, input {tuple(conf.resolution.shape)}, "
        f"batch {conf.trainer.batch_size}, lms=auto at each width"
    )
    print(f"{'base_filters':>12} {'predicted peak':>15} {'recompute':>12} {'step':>9}  fits")
    for r in rows:
        note = "yes" if r.fits else "no"
        if r.slower_than_wider:
            note += " (a wider width that fits is predicted as fast: prefer it)"
        print(
            f"{r.base_filters:>12} {_gb(r.predicted_peak_bytes):>15} {r.recomputed_flops / 1e9:>8.1f} GFLOP "
            f"{format_seconds(r.predicted_step_s):>9}  {note}"
        )
    if chosen is None:
        print("no width fits: raise lms.limit, lower model.depth, or train patches (plan.find=max_patch)")
    else:
        print(f"widest that fits: model.base_filters={chosen}")


def _print_patch_rows(found: dict) -> None:
    print(
        f"{'strategy':<10} {'patch (override)':>32} {'batch':>6} {'voxels':>12} {'predicted peak':>15} "
        f"{'largest cube':>15}"
    )
    for name, c in found.items():
        patch = _patch_override(c.input_shape) if c.input_shape else "nothing fits"
        cube = "[" + ",".join(map(str, c.cube_shape)) + "]" if c.cube_shape else "-"
        print(
            f"{name:<10} {patch:>32} {c.batch_size:>6} {c.voxels:>12,} {_gb(c.predicted_peak_bytes or None):>15} "
            f"{cube:>15}"
        )


@hydra_entry("../configs", "plan_memory")
def main(cfg) -> None:
    from brats_seg.benchmark.self_calibration import ensure_calibrated
    from brats_seg.lms.planner.plan import PlanDoesNotFitError
    from brats_seg.lms.planner.preflight import capacity_run, compare_run, plan_run
    from brats_seg.resolve import resolve_run

    with user_errors():
        run = resolve_run(to_config(cfg), training=False)  # outputs derived, values checked, device decided: once
        if ensure_calibrated(run.config, run.device) is not None:  # lms.calibrate: this CPU measured first
            run = resolve_run(to_config(cfg), training=False)
    conf, device = run.config, run.device
    if conf.plan.find:
        with user_errors():
            limit, budget, found = capacity_run(conf, conf.plan.find, device)
        if conf.plan.find == "max_width":
            _print_widths(conf, device, limit, budget, *found)
            return
        _print_capacity(conf, device, limit, budget, found)
        return
    strategy = run.lms  # the strategy train.py would plan (lms=, or auto for backend=gpu_lms with lms=off)
    with user_errors():
        limit, budget, strategies = compare_run(conf, device)
        try:
            plan, error = plan_run(conf, device, strategy), None
        except PlanDoesNotFitError as e:
            plan, error = None, e
    if conf.plan.format == "json":
        print(
            json.dumps(
                {
                    "limit_bytes": limit,
                    "budget_bytes": budget,
                    "device": device,
                    "strategy": strategy,
                    "strategies": strategies,
                    "plan": plan.to_dict()["plan"] if plan else None,
                    "error": str(error) if error else None,
                }
            )
        )
    else:
        if plan is not None:
            print(plan.format_table())
        print(f"\n{_budget_line(conf, device, limit, budget)}")
        print(f"{'strategy':<10} {'peak':>10} {'recompute':>12} {'moved':>10} {'overhead/step':>14} {'step':>9}  fits")
        for name, s in strategies.items():
            if s.get("predicted_peak_bytes") is None:
                print(f"{name:<10} {'-':>10} {'':>12} {'':>10} {'':>14}  {s.get('reason', 'no')}")
                continue
            print(
                f"{name:<10} {_gb(s['predicted_peak_bytes']):>10} {s['recomputed_flops'] / 1e9:>8.1f} GFLOP "
                f"{_gb(s['moved_bytes']):>10} {format_seconds(s['overhead_s']):>14} "
                f"{format_seconds(s.get('step_s')):>9}  {'yes' if s['fits'] else 'no'}"
            )
        if error is not None:
            print(f"\n{error}")
        else:
            _print_time(dataclasses.replace(run, plan=plan))
    if error is not None:
        raise SystemExit(1)


def _print_time(run) -> None:
    """Seconds per step, per epoch and for the run on this dataset and CPU (brats_seg.run_time),
    when data.root holds the dataset or plan.cases gives its size; a GPU has no step-time model."""
    from brats_seg.data.dataset import split_sizes
    from brats_seg.run_time import predict_run_time

    if run.config.trainer.patch_schedule:  # each stage planned, as training plans them
        from brats_seg.resolve import planned

        run = planned(run)
    data = run.config.data
    if run.config.plan.cases:  # a dataset not downloaded yet: its split's sizes from the count
        from pathlib import Path

        from brats_seg.data.dataset import run_split

        ids = [f"case_{i:05d}" for i in range(run.config.plan.cases)]  # the sizes depend on the count alone
        split, _, _ = run_split(dataclasses.replace(data, split_file=""), ids, None, Path("/nonexistent"))
        sizes = len(split["train"]), len(split["val"]), len(split["test"])
    else:
        sizes = split_sizes(data)
    if sizes is not None and run.config.trainer.val_cases:
        sizes = (sizes[0], min(sizes[1], run.config.trainer.val_cases), sizes[2])
    if sizes is None:
        print(f"\ntime: no dataset at data.root={run.config.data.root} yet, so no epoch or run time (the step: above)")
        return
    try:
        estimate = predict_run_time(run, sizes[0], sizes[1])
    except ValueError as e:  # e.g. fewer training cases than a batch: what training would refuse, said now
        print(f"\ntime: {e}")
        return
    if estimate is None:
        print("\ntime: no step-time model on a GPU (the step times above are the planner's overhead only)")
        return
    print("\n" + "\n".join(estimate.lines()))


if __name__ == "__main__":
    main()
