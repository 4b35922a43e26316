"""Calibrating the step-time model on the user's own CPU, in minutes: a short measured sweep.

A CPU the shipped presets (``brats_seg/lms/presets/step_time.json``) do not know would be priced at
:data:`~brats_seg.lms.planner.step_time.UNCALIBRATED_FACTOR` times the slowest calibrated CPU: an
upper estimate, 3x over on a CPU as fast as the calibrated one. :func:`calibrate_here` measures
:data:`QUICK_POINTS` instead (a few widths at half resolution and four at full, depth 4,
batch 1, ``lms=off``; both precisions where the CPU has native bf16), each in a fresh
``scripts/benchmark.py`` process as the width sweeps are (``draws`` times round robin, fitted on
each point's median draw, when asked), fits the same model
(:func:`brats_seg.benchmark.step_time_fit.calibrate`, leave-one-out error per point) and caches it
for this CPU id (:func:`~brats_seg.lms.planner.step_time.user_calibration_path`), where the planner
reads it before the presets. It also checks the memory preset's kind against the CPU
(:func:`brats_seg.cpu.cpu_kind`) and records what it found.

Why one draw by default: on a shared 2-vCPU machine the same point measured in three fresh
processes lay 16-56% apart (docs/measurements/calibration_draws_emr/), yet fitting each point's
median of three did not predict held-out full-resolution points better than fitting one draw, in
two sessions on the same CPU (0 against 0-2 misses of ±25% in 8; 5 against 3-5 in 14:
docs/measurements/calibration_3draws_emr/draws.txt): the misses come from the model's form at widths
the sweep does not contain, not from the draw. Three draws cost three times the minutes.

``lms.calibrate`` decides when (:func:`ensure_calibrated`, called by ``train.py`` and
``scripts/plan_memory.py`` before planning):

- ``auto`` (default): on first use, when this CPU has neither a preset nor a cached calibration and
  the run's step, priced by the stand-in, would take :data:`AUTO_MIN_STEP_S` or more (a run where the
  minutes pay: the tiny test and demo runs are not calibrated for);
- ``now``: measure again and replace the cached calibration;
- ``never``: the stand-in (an upper estimate, said so).

``BRATS_SEG_CALIBRATE=never`` in the environment turns ``auto`` off for a machine that must not
measure (CI and the test suite, whose parallel workers would time each other's load); ``now`` on the
command line still measures.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["AUTO_MIN_STEP_S", "QUICK_DRAWS", "QUICK_POINTS", "calibrate_here", "ensure_calibrated"]

log = logging.getLogger(__name__)

#: (resolution, base filters) measured by the quick calibration, depth 4, batch 1, lms=off: widths
#: on both sides of the channel block at half resolution, and at full resolution the two cheapest
#: and the two that part the off-block rate from the rest where it costs most (12: channels off the
#: 16-block, 16: on it; without them that rate was fitted to 4 and 8 filters' small
#: convolutions: docs/measurements/forms_offline/forms.txt). Every other width and shape is held out.
QUICK_POINTS = (
    ("half", 4),
    ("half", 8),
    ("half", 16),
    ("half", 32),
    ("full", 4),
    ("full", 8),
    ("full", 12),
    ("full", 16),
)

#: each quick point is measured this many times, in fresh processes, round robin (drift between the
#: draws reaches every point alike), and fitted on its median draw; one by default: the median of
#: three was measured no better on held-out points (the module's doc) at three times the minutes
QUICK_DRAWS = 1

#: ``lms.calibrate=auto`` calibrates only for a run whose step the stand-in prices at this or more
AUTO_MIN_STEP_S = 2.0

_BASE = ["backend=cpu_onednn", "model.depth=4", "trainer.batch_size=1", "lms=off", "benchmark.steps=3"]


def _precisions() -> list[str]:
    from brats_seg.cpu import has_native_bf16

    return ["fp32", "bf16"] if has_native_bf16() else ["fp32"]


def calibrate_here(
    progress: bool = True,
    points=QUICK_POINTS,
    out: Path | None = None,
    held_out: list[str] | None = None,
    draws: int = QUICK_DRAWS,
) -> dict:
    """Measure ``points`` on this CPU ``draws`` times, fit the step-time model to each point's median
    and cache it (``out``: default the user's cache,
    :func:`~brats_seg.lms.planner.step_time.user_calibration_path`).

    ``held_out``: benchmark JSON lines measured on this CPU before (e.g. the full-resolution width
    sweep) that the fit is judged on, those of a measured configuration left out.

    Returns:
        The cached entry: the fit per dtype, each point's leave-one-out error, each point's draws
        (``draws_s``) and how far apart they lay, the seconds it took.

    Raises:
        ValueError: ``draws`` below 1.
        RuntimeError: fewer than 3 points of a dtype could be measured (their errors named).
    """
    from tqdm.auto import tqdm

    from brats_seg.benchmark.step_time_fit import calibrate
    from brats_seg.benchmark.sweep import measure_point
    from brats_seg.cpu import cpu_id, cpu_kind
    from brats_seg.files import write_text_atomic
    from brats_seg.lms.planner.memory_model import CPU_MEMORY_MODELS
    from brats_seg.lms.planner.step_time import cpu_time_model, user_calibration_path
    from brats_seg.project import project_dir

    if draws < 1:
        raise ValueError(
            f"draws={draws}: measure each point at least once (1, the default; 3 fits each point's median)."
        )
    t0 = time.perf_counter()
    combos = [(res, width, p) for p in _precisions() for res, width in points]
    measured: dict[tuple, list[dict]] = {combo: [] for combo in combos}
    failures = []
    bar = tqdm(total=draws * len(combos), desc="calibrating this CPU's step time", unit="point", disable=not progress)
    for draw in range(1, draws + 1):  # round robin: a slow spell of the machine reaches every point alike
        for res, width, precision in combos:
            bar.set_postfix_str(f"draw {draw}/{draws}: {res} {width} filters {precision}")
            cmd = [
                sys.executable,
                str(project_dir() / "scripts" / "benchmark.py"),
                *_BASE,
                f"resolution={res}",
                f"model.base_filters={width}",
                f"backend.precision={precision}",
                "tracking=none",
            ]
            result = measure_point(cmd, project_dir())  # as a sweep measures each of its points
            bar.update()
            if isinstance(result, str):
                failures.append(f"{res} {width} filters {precision} (draw {draw}): {result}")
                continue
            measured[(res, width, precision)].append(result)
    bar.close()
    records = [_median_record(draws_) for draws_ in measured.values() if draws_]
    with tempfile.TemporaryDirectory(prefix="brats_seg_calibration_") as tmp:
        path = Path(tmp) / "quick.jsonl"
        write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in records))
        try:
            entry = calibrate([str(path)], list(held_out or []))
        except ValueError as e:
            raise RuntimeError(f"the step-time calibration could not fit ({e}); points that failed: {failures}") from e
    entry["fitted_on"] = ["quick calibration (brats_seg.benchmark.self_calibration.QUICK_POINTS)"]
    for rows in (entry["fitted_points"], entry["leave_one_out"]):
        for row in rows:
            row["file"] = "quick calibration"
    entry["cpu_id"] = cpu_id()
    entry["points"] = [f"{r} {w} filters {p}" for r, w, p in combos]
    entry["draws"] = draws
    entry["draws_s"] = {f"{r} {w} filters {p}": [d["step_s"] for d in measured[(r, w, p)]] for r, w, p in combos}
    apart = [max(v) / min(v) - 1 for v in entry["draws_s"].values() if len(v) > 1]
    entry["draws_apart"] = round(max(apart), 4) if apart else None
    entry["failed"] = failures
    entry["seconds"] = round(time.perf_counter() - t0, 1)
    kind = cpu_kind()
    entry["memory_preset"] = {
        "cpu_kind": kind,
        "calibrated": kind in CPU_MEMORY_MODELS,
        "said": (
            f"the memory model has a calibrated preset for this CPU's kind ({kind})"
            if kind in CPU_MEMORY_MODELS
            else f"the memory model has no preset for this CPU's kind ({kind}): plans take the safe side "
            "(the field-wise largest preset); scripts/calibrate_memory.py calibrates one"
        ),
    }
    log.info("%s", entry["memory_preset"]["said"])
    fitted = {" ".join(sorted(row["point"].split())) for row in entry["fitted_points"]}
    entry["held_out"] = [row for row in entry["held_out"] if " ".join(sorted(row["point"].split())) not in fitted]
    if entry["held_out"]:
        from brats_seg.benchmark.step_time_fit import summary_line

        entry["summary"]["held_out"] = summary_line(entry["held_out"])
    else:  # the quick fit's own judge: each point predicted by a fit that did not see it
        entry["summary"]["held_out"] = entry["summary"]["leave_one_out"] + " (leave-one-out)"
    target = out or user_calibration_path()
    write_text_atomic(target, json.dumps(entry, indent=1) + "\n")
    cpu_time_model.cache_clear()
    log.info(
        "calibrated this CPU's step time in %.0f s on %d points%s (%s); cached in %s",
        entry["seconds"],
        len(records),
        f", {draws} draws each" if draws > 1 else "",
        entry["summary"]["leave_one_out"],
        target,
    )
    if apart:
        log.info("a point's draws lay up to %.0f%% apart (the fit takes each point's median)", 100 * max(apart))
    return entry


def _median_record(draws: list[dict]) -> dict:
    """One point's record over its draws: the draw whose step is the median (the upper of the two
    middle ones for an even count, the safe side), with every draw's step kept."""
    ordered = sorted(draws, key=lambda r: r["step_s"])
    return {**ordered[len(ordered) // 2], "draws_s": [r["step_s"] for r in draws]}


def _stand_in_step_s(conf) -> float:
    """The run's step as the uncalibrated stand-in prices it."""
    import dataclasses

    from brats_seg.lms.planner.cost import compute_network_cost
    from brats_seg.lms.planner.step_time import cpu_time_model
    from brats_seg.lms.planner.workload import Workload

    workload = dataclasses.replace(Workload.from_config(conf), input_batches=0, validates=False)
    return cpu_time_model().step_s(compute_network_cost(workload))


def ensure_calibrated(conf, device: str = "CPU", progress: bool = True) -> dict | None:
    """Apply ``conf.lms.calibrate`` before a run is planned (see the module's doc); the entry
    measured, or None when nothing was measured.

    Raises:
        ValueError: an unknown ``lms.calibrate``.
    """
    from brats_seg.lms.planner.step_time import cpu_time_model

    mode = str(conf.lms.calibrate)
    if mode not in ("auto", "now", "never"):
        raise ValueError(f"lms.calibrate={mode}: use auto (on first use, for runs of seconds a step), now or never.")
    if mode == "auto" and os.environ.get("BRATS_SEG_CALIBRATE", "").strip().lower() == "never":
        mode = "never"
    if mode == "never" or device != "CPU":
        return None
    if mode == "auto":
        model = cpu_time_model()
        if model.calibrated:
            return None
        step = _stand_in_step_s(conf)
        if step < AUTO_MIN_STEP_S:
            log.info(
                "this CPU has no step-time calibration; the run's step is priced at %.2f s at most, so it is "
                "not calibrated for (lms.calibrate=now measures one in minutes)",
                step,
            )
            return None
        log.warning(
            "this CPU has no step-time calibration and the run's step is priced at up to %.1f s: measuring "
            "one now, once (minutes: a few short points; cached per CPU; lms.calibrate=never skips it)",
            step,
        )
    return calibrate_here(progress=progress)
