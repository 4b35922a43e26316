#!/usr/bin/env python
"""Fit this CPU's step-time model to benchmark sweeps, and judge it on points it did not see.

    python scripts/benchmark.py benchmark.sweep=width          # the points to fit (lms=off)
    python scripts/benchmark.py benchmark.sweep=step_time_check  # points to judge it on
    python scripts/calibrate_step_time.py 'fit=[outputs/benchmark/width/results.jsonl]' \\
        'held_out=[outputs/benchmark/step_time_check/results.jsonl]'

The model (``brats_seg/lms/planner/step_time.py``): seconds = per_flop_s x padded FLOPs +
per_byte_s x bytes touched + per_unaligned_byte_s x bytes of activations off the channel block +
per_step_s, per compute dtype, fitted (non-negative least squares
of the relative error) to the ``lms=off`` points of ``fit`` measured on this CPU. Prints every
point's prediction against its measurement: the fitted points, each again predicted by a fit
without it (leave-one-out), and the ``held_out`` points (any strategy: a ``recompute`` point's
prediction adds the planner's price of recomputing, so those judge that too). Writes the fit
with those errors into ``brats_seg/lms/presets/step_time.json`` under this CPU's id
(:func:`brats_seg.cpu.cpu_id`); the planner reads it from there.

    python scripts/calibrate_step_time.py quick=true      # this CPU, measured now, in minutes

``quick=true`` is the calibration of a CPU the presets do not know
(``brats_seg.benchmark.self_calibration``; ``train.py`` runs it on first use, ``lms.calibrate``): a
short sweep measured now (``draws=3``: each point three times round robin, fitted on the medians),
fitted the same way and cached for this CPU in the user's cache folder (``~/.cache/brats_seg/step_time/``;
``out=`` elsewhere), which the planner reads before the presets; ``held_out=`` judges it on earlier measurements of this CPU.
"""

from __future__ import annotations

import json
from pathlib import Path

from brats_seg.cli import hydra_entry, to_config, user_errors
from brats_seg.script_configs import register_configs

register_configs()


@hydra_entry("../configs", "calibrate_step_time")
def main(cfg) -> None:
    from brats_seg.benchmark.step_time_fit import calibrate
    from brats_seg.cpu import cpu_id
    from brats_seg.files import write_text_atomic
    from brats_seg.lms.planner.step_time import PRESET_FILE

    conf = to_config(cfg)
    if conf.quick:  # this CPU measured now, cached for it (the presets left as they are)
        from brats_seg.benchmark.self_calibration import calibrate_here
        from brats_seg.lms.planner.step_time import user_calibration_path

        with user_errors():
            out = Path(conf.out) if conf.out else user_calibration_path()
            entry = calibrate_here(out=out, held_out=list(conf.held_out), draws=conf.draws)
        _report(entry, conf.figure)
        how = ""
        if entry["draws"] > 1 and entry["draws_apart"] is not None:
            how = f" {entry['draws']} times each (fitted on their medians; a point's draws up to {entry['draws_apart']:.0%} apart)"
        print(f"\nmeasured {len(entry['points'])} points{how} in {entry['seconds']:.0f} s; wrote {out}")
        for failure in entry["failed"]:
            print(f"  not measured: {failure}")
        print(entry["memory_preset"]["said"])
        return
    with user_errors():
        entry = calibrate(list(conf.fit), list(conf.held_out))
    _report(entry, conf.figure)
    if not conf.write:
        return
    out = Path(conf.out) if conf.out else PRESET_FILE
    record = json.loads(out.read_text()) if out.is_file() else {"cpus": {}}
    record["cpus"][cpu_id()] = entry
    write_text_atomic(out, json.dumps(record, indent=1) + "\n")
    print(f"\nwrote {cpu_id()} into {out}")


def _report(entry: dict, figure: str) -> None:
    from brats_seg.cpu import cpu_id

    for name in ("fitted_points", "leave_one_out", "held_out"):
        print(f"\n{name.replace('_', ' ')}: {entry['summary'][name]}")
        for r in entry[name]:
            print(
                f"  {r['point']:<90} measured {r['measured_s']:7.2f} s  predicted {r['predicted_s']:7.2f} s  "
                f"{r['error']:+.1%}"
            )
    for dtype, c in entry["fit"].items():
        print(
            f"{dtype}: convolution channels padded to {c['block']}, activations counted padded to "
            f"{c.get('bytes_block', 1)}, "
            f"{1 / c['per_flop_s'] / 1e9 if c['per_flop_s'] else float('inf'):.0f} GFLOP/s of padded "
            f"convolution, {1 / c['per_byte_s'] / 1e9 if c['per_byte_s'] else float('inf'):.1f} GB/s of layer "
            f"traffic, {c['per_step_s']:.3f} s a step"
            + (
                f"; activations whose channels are not multiples of {c['align']}: "
                f"+{c.get('per_unaligned_byte_s', 0.0) * 1e9:.3f} s per GB"
                if c.get("align")
                else ""
            )
        )
    if figure:
        from brats_seg.plots import plot_step_time_fit

        groups = {
            "fitted": entry["fitted_points"],
            "leave one out": entry["leave_one_out"],
            "held out": entry["held_out"],
        }
        title = f"{entry['cpu_name']} ({cpu_id()}): step-time model"
        print(f"wrote {plot_step_time_fit(groups, figure, title=title)}")


if __name__ == "__main__":
    main()
