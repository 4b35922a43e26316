"""Planner accuracy on CPU where it was not fitted: predicted vs measured training memory.

Each point runs ``scripts/benchmark.py`` in a fresh subprocess (its own peak RSS), four
training steps, once, and compares ``predicted_peak_bytes`` with ``peak_bytes -
baseline_bytes``. None of the points is in the calibration grid of
``scripts/calibrate_memory.py``: other batch sizes (1-3), depths (3-5), widths (8-24),
shapes that are no standard resolution, trilinear up-sampling, and ``lms=auto`` under a
budget, which must also measure under that budget. The printed table is the one the
README quotes.

Asserted: never more than 8% under the measured peak (the side that ends a run in an
out-of-memory crash; or the preset's planning margin where that is larger, as it is set to
cover the worst single run calibration measured), never more than 60% over it (a plan so high wastes what LMS is for), and
``lms=auto`` under its limit. A single run of one configuration moves by up to 50% between
runs on the Sapphire Rapids (TensorFlow's executor orders independent ops by measured cost,
and the allocator's peak moves with the order: docs/lms_calibration.md), so one run can read
far under its preset's calibrated envelope; the lower bound is what the planning margin must
cover. A CPU kind without a calibrated preset (AVX-512 without AMX) plans with the
field-by-field largest of the calibrated ones and reads higher still: there only the lower bound
and the limit are asserted.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
UNDER, OVER = -0.08, 0.60
POINTS = [  # (name, overrides, lms)
    (
        "d5 f8 96x128x96 b1",
        ["model.depth=5", "model.base_filters=8", "resolution.shape=[96,128,96]", "trainer.batch_size=1"],
        "off",
    ),
    (
        "d4 f24 80x96x64 b2",
        ["model.depth=4", "model.base_filters=24", "resolution.shape=[80,96,64]", "trainer.batch_size=2"],
        "recompute",
    ),
    (
        "d3 f12 112x128x96 b2",
        ["model.depth=3", "model.base_filters=12", "resolution.shape=[112,128,96]", "trainer.batch_size=2"],
        "off",
    ),
    (
        "d3 f12 96x112x80 b2 trilinear",
        [
            "model.depth=3",
            "model.base_filters=12",
            "resolution.shape=[96,112,80]",
            "trainer.batch_size=2",
            "model.upsample=trilinear",
        ],
        "recompute",
    ),
    ("d3 f16 half b3", ["model.depth=3", "model.base_filters=16", "resolution=half", "trainer.batch_size=3"], "auto"),
]


def _bench(overrides):
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "benchmark.py"), *overrides, "benchmark.steps=4", "backend=cpu_onednn"],
        capture_output=True,
        text=True,
        timeout=1800,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(record["step_times_s"]) == 4  # the steps timed after the first, step_s their median
    assert record["step_s"] == pytest.approx(statistics.median(record["step_times_s"]), abs=2e-4)
    return record


def _auto_limit(overrides) -> int:
    """A limit whose planning budget (the limit less the preset's margin) lies half-way between
    the host preset's off and recompute predictions, so that the plan must recompute some blocks
    and can. (Half-way for the limit itself left the budget under recompute's prediction on a
    CPU whose off and recompute differ by less than the margin: AVX2.)"""
    from brats_seg.benchmark.memory_calibration import predict
    from brats_seg.lms.planner.memory_model import memory_model_for

    mm = memory_model_for("CPU")
    off, rec = (predict(overrides, s, mm) for s in ("off", "recompute"))
    return int((rec + 0.5 * (off - rec)) / (1.0 - mm.planning_margin))


@pytest.mark.slow
@pytest.mark.alone  # its peaks and step times are the machine's, not shared with another test
def test_predicted_peak_within_bounds_where_not_fitted():
    from brats_seg.cpu import cpu_kind
    from brats_seg.lms.planner.memory_model import CPU_MEMORY_MODELS, memory_model_for

    rows, over_limit = [], []
    for name, overrides, strategy in POINTS:
        extra = [f"lms={strategy}"]
        limit = None
        if strategy == "auto":
            limit = _auto_limit(overrides)
            extra.append(f"lms.limit={limit}")
        r = _bench([*overrides, *extra])
        rows.append(
            (name, strategy, r["measured_bytes"], r["predicted_peak_bytes"], r["prediction_error"], r["step_s"])
        )
        if limit is not None and r["measured_bytes"] > limit:
            over_limit.append((name, r["measured_bytes"], limit))
    lines = [f"{'point':<26} {'lms':<10} {'measured':>10} {'predicted':>10} {'error':>7} {'step_s':>7}"]
    lines += [f"{n:<26} {s:<10} {m / 1e9:>8.2f}GB {p / 1e9:>8.2f}GB {e:>+7.1%} {t:>7.2f}" for n, s, m, p, e, t in rows]
    print(f"\n{cpu_kind()} CPU\n" + "\n".join(lines))
    assert not over_limit, f"lms=auto measured above its lms.limit: {over_limit}"
    # the planning margin covers the worst under-prediction calibration measured (a single run
    # can read that far above the others): so it bounds one run here, where it exceeds 8%
    under = -max(-UNDER, memory_model_for("CPU").planning_margin)
    low = [r for r in rows if r[4] < under]
    assert not low, f"predicted more than {-under:.1%} under the measured peak: {low}"
    if cpu_kind() in CPU_MEMORY_MODELS:  # a preset calibrated on this kind
        high = [r for r in rows if r[4] > OVER]
        assert not high, f"predicted more than {OVER:.0%} over the measured peak: {high}"
