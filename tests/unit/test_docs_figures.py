"""The figures the pages lean on most are held to the committed records they name: the README's
results table to the demo's record over seeds, and the planner's quoted errors and margin to the
preset they were fitted into. A rerun that changes a record, or an edit that changes a page, fails
here until the two agree again."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PRESET = REPO / "brats_seg" / "lms" / "presets" / "cpu_avx512_amx.json"
PLANNER_PAGES = ("docs/lms_and_planner.md", "docs/lms_calibration.md", "docs/known_limits.md")


def _page(name: str) -> str:
    return re.sub(r"\s+", " ", (REPO / name).read_text())  # a figure may be broken across lines


def _range(errors: dict) -> str:
    return f"{min(errors.values()) * 100:+.1f}% / {max(errors.values()) * 100:+.1f}%"


@pytest.mark.parametrize(
    "kind, what, pages",
    [
        ("validation", "float32", PLANNER_PAGES),
        ("validation_bf16", "bfloat16", PLANNER_PAGES),
        ("calibration_bf16", "bfloat16 fitted", ("docs/lms_calibration.md",)),
    ],
)
def test_the_planners_quoted_errors_are_the_presets(kind, what, pages):
    errors = json.loads(PRESET.read_text())["errors"][kind]
    quoted = _range(errors)
    rms = f"{math.sqrt(sum(e * e for e in errors.values()) / len(errors)) * 100:.1f}%"
    for name in pages:
        text = _page(name)
        assert quoted in text, f"{name} does not quote the preset's {what} errors {quoted} ({PRESET.name})"
        if name != "docs/known_limits.md":  # the tables give the count and the rms beside the range
            row = re.search(rf"\| {len(errors)} \| \d+ \| {re.escape(quoted)} \| ([\d.]+%) \|", text)
            assert row and row.group(1) == rms, (
                f"{name}: the {what} row should read | {len(errors)} | .. | {quoted} | {rms} |"
            )


def test_the_planning_margin_quoted_is_the_presets():
    margin = json.loads(PRESET.read_text())["fit"]["fields"]["planning_margin"]
    quoted = f"{margin * 100:.1f}%"
    for name in ("docs/lms_and_planner.md", "docs/known_limits.md", "docs/lms_calibration.md"):
        assert (
            f"planning margin ({quoted}" in _page(name)
            or f"margin ({quoted}" in _page(name)
            or f"{quoted} (`fit.fields.planning_margin`)" in _page(name)
        ), f"{name} does not quote the margin {quoted}"


def _mean_std(means: dict, key: str) -> str:
    return f"{means[key]['mean']:.3f} ± {means[key]['std']:.3f}"


def test_the_readmes_results_table_is_the_demo_record():
    """README's Quickstart table: per region, the test split's Dice (mean ± std over seeds, and per
    seed), its lesion-wise Dice, and the same on the unseen phantoms, each as the record it names
    (scripts/demo_seeds.py's demo_seeds.json) has it."""
    readme = (REPO / "README.md").read_text()
    named = re.findall(r"docs/measurements/demo_recipe_zen5/[\w/]+/demo_seeds\.json", readme)
    assert named, "the README's results name no demo_seeds.json record"
    record = json.loads((REPO / named[0]).read_text())
    assert len(record["runs"]) >= 3, "a quality claim is over three seeds or more"
    rows = {
        m.group(1): [c.strip() for c in m.group(2).split("|")]
        for m in re.finditer(r"^\| (WT|TC|ET) \|(.*)\|$", readme, re.M)
    }
    assert set(rows) == {"WT", "TC", "ET"}, rows
    for region, cells in rows.items():
        r = region.lower()
        seeds = ", ".join(f"{run[f'dice_{r}']:.3f}" for run in record["runs"])
        held = ", ".join(f"{run['heldout'][f'dice_{r}']:.3f}" for run in record["runs"])
        assert cells == [
            _mean_std(record["means"], f"dice_{r}"),
            seeds,
            _mean_std(record["means"], f"lesion23_dice_{r}"),
            _mean_std(record["heldout_means"], f"dice_{r}"),
            held,
            _mean_std(record["heldout_means"], f"lesion23_dice_{r}"),
        ], (region, cells)
