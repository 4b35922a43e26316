"""score.py's lesion-wise, NSD and detection columns equal the official BraTS evaluation's.

The official values (``brats-evaluation`` on panoptica, run on NIfTI files with its GLI
configuration) of three small anisotropic multi-lesion cases, each stored differently
(LPS, RAS, ASL) and with a different voxel size on each axis, in the brats2024 layout and
as brats2023 files (the cavity folded into label 1), are test data:
``tests/data/official_metrics/anisotropic_cases.json`` (numbers only; the command that
regenerated it and the versions are in the file). The cases are built by
``scripts/check_official_metrics.py`` (``small_case``), without random numbers; here they
are written as files and scored by :func:`brats_seg.evaluation.scoring.score.score_masks`, the
function ``scripts/score.py`` calls.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from brats_seg.evaluation.scoring.score import score_masks

REPO = Path(__file__).resolve().parents[2]
EXPECTED = REPO / "tests" / "data" / "official_metrics" / "anisotropic_cases.json"
from brats_seg.evaluation.scoring.official_cases import SMALL_CASES, write_small_cases  # the cases the values are of

DOC = json.loads(EXPECTED.read_text())
TOL, TOL_MM = 1e-6, 1e-4  # values; distances (mm)


def test_the_expected_values_are_of_the_cases_built_here():
    """The test data and the case design agree (else: regenerate with the file's command)."""
    assert [(tuple(c["voxel_mm"]), c["storage"]) for c in DOC["cases"]] == list(SMALL_CASES), DOC["command"]
    for spacing, _ in SMALL_CASES:
        assert len(set(spacing)) == 3  # a different voxel size on each axis


def _cell(text: str) -> float:
    return math.nan if text == "" else float(text)


@pytest.mark.parametrize("layout", ["brats2024", "brats2023"])
def test_score_py_equals_the_official_evaluation_on_anisotropic_files(layout, tmp_path):
    cases = write_small_cases(tmp_path / "ref", tmp_path / "pred", layout)
    result = score_masks(tmp_path / "pred", tmp_path / "ref", layout, progress=False)
    with open(result.csv_path, newline="") as f:
        rows = {r["case_id"]: r for r in csv.DictReader(f)}
    checked = 0
    for case, expected in zip(cases, DOC["cases"]):
        official = expected[layout]
        assert official["case_id"] == case["case_id"]
        row = rows[case["case_id"]]
        for region, values in official.items():
            if region == "case_id":
                continue
            for column, want in values.items():
                got, want = _cell(row[f"{column}_{region}"]), math.nan if want is None else want
                where = (
                    f"{case['case_id']} ({case['voxel_mm']} mm, {case['storage']}) {column}_{region}: "
                    f"ours {got!r}, official {want!r} (brats-evaluation {DOC['versions']['brats_evaluation']}, "
                    f"panoptica {DOC['versions']['panoptica']})"
                )
                if math.isnan(want):
                    assert math.isnan(got), where
                else:
                    assert got == pytest.approx(want, rel=0, abs=TOL_MM if "hd95" in column else TOL), where
                checked += 1
    assert checked >= len(SMALL_CASES) * 3 * 9  # three regions or more, nine columns each
