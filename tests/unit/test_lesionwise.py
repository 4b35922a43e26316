"""Lesion-wise scoring, both definitions, on cases small enough to compute by hand.

Cubes on a 1 mm grid: a 4x4x4 cube is 64 voxels (64 mm^3, over the 50 mm^3 threshold),
a 2x2x2 cube 8 voxels (under it). A matched lesion predicted exactly has Dice 1 and
HD95 0; the 2023 definition scores every missed or false-positive lesion Dice 0 /
HD95 374 mm in the same average, panoptica averages matched lesions only and puts the
misses into the detection F1 ``rq = 2 TP / (2 TP + FP + FN)``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from brats_seg.data.errors import CaseError
from brats_seg.data.labels import region_label_values
from brats_seg.evaluation.scoring import panoptica_metrics
from brats_seg.evaluation.scoring.lesion23 import (
    LESION23_PARAMS,
    Lesion23Params,
    compute_lesion23_metrics,
    lesion23_params_for,
)
from brats_seg.evaluation.scoring.lesion_input import LesionwiseError
from brats_seg.evaluation.scoring.lesionwise import compute_lesionwise_metrics
from brats_seg.evaluation.scoring.panoptica_metrics import compute_panoptica_metrics
from brats_seg.evaluation.scoring.score import score_case

SHAPE = (32, 32, 32)
ISO = (1.0, 1.0, 1.0)
ONE = {"r": [1]}


def cube(mask, at, size=4):
    x, y, z = at
    mask[x : x + size, y : y + size, z : z + size] = 1
    return mask


def empty():
    return np.zeros(SHAPE, np.uint8)


def both(pred, ref, spacing=ISO, params=LESION23_PARAMS["GLI"]):
    return compute_lesion23_metrics(pred, ref, spacing, params), compute_panoptica_metrics(pred, ref, spacing, ONE)


def test_one_false_positive():
    ref = cube(empty(), (2, 2, 2))
    pred = cube(cube(empty(), (2, 2, 2)), (20, 20, 20), 2)
    l23, pano = both(pred, ref)
    assert (l23["tp"], l23["fn"], l23["fp"]) == (1, 0, 1)
    assert l23["dice"] == pytest.approx((1 + 0) / 2)
    assert l23["hd95"] == pytest.approx((0 + 374) / 2)
    assert (pano["lesions_ref_r"], pano["lesions_pred_r"], pano["lesions_tp_r"]) == (1, 2, 1)
    assert pano["lesion_dice_r"] == pytest.approx(1.0)  # matched lesions only
    assert pano["lesion_hd95_r"] == pytest.approx(0.0)
    assert pano["rq_r"] == pytest.approx(2 / 3)
    assert pano["pq_r"] == pytest.approx(2 / 3)


def test_one_missed_lesion():
    ref = cube(cube(empty(), (2, 2, 2)), (20, 20, 20))
    pred = cube(empty(), (2, 2, 2))
    l23, pano = both(pred, ref)
    assert (l23["tp"], l23["fn"], l23["fp"]) == (1, 1, 0)
    assert l23["dice"] == pytest.approx(0.5)
    assert l23["hd95"] == pytest.approx(187.0)
    assert pano["lesion_dice_r"] == pytest.approx(1.0)
    assert pano["rq_r"] == pytest.approx(2 / 3)
    assert (pano["lesions_ref_r"], pano["lesions_tp_r"]) == (2, 1)


def test_merged_lesions():
    """Two reference cubes four voxels apart are one lesion once dilated by 3 (2023), two
    instances for panoptica; predicting one of them: 2023 Dice 2*64/(128+64)."""
    ref = cube(cube(empty(), (2, 2, 2)), (10, 2, 2))
    pred = cube(empty(), (2, 2, 2))
    l23, pano = both(pred, ref)
    assert (l23["tp"], l23["fn"], l23["fp"]) == (1, 0, 0)
    assert l23["dice"] == pytest.approx(2 * 64 / (128 + 64))
    assert 4 < l23["hd95"] < 14  # the far face of the missed half is 8-12 mm from the prediction
    assert pano["lesions_ref_r"] == 2 and pano["lesions_tp_r"] == 1
    assert pano["lesion_dice_r"] == pytest.approx(1.0)
    # MET's single dilation does not bridge a 4-voxel gap: two lesions, one missed.
    met = compute_lesion23_metrics(pred, ref, ISO, LESION23_PARAMS["MET"])
    assert (met["tp"], met["fn"]) == (1, 1) and met["dice"] == pytest.approx(0.5)


def test_lesion_under_the_volume_threshold():
    ref = cube(cube(empty(), (2, 2, 2)), (20, 20, 20), 2)  # 64 and 8 voxels
    pred = cube(empty(), (2, 2, 2))
    l23, pano = both(pred, ref)
    assert (l23["tp"], l23["fn"]) == (1, 0)  # the 8 mm^3 miss is not counted
    assert (l23["dice"], l23["hd95"]) == (pytest.approx(1.0), pytest.approx(0.0))
    assert pano["rq_r"] == pytest.approx(2 / 3)  # panoptica has no threshold
    # At 2 mm voxels the small cube is 64 mm^3: counted, and missed.
    l23 = compute_lesion23_metrics(pred, ref, (2.0, 2.0, 2.0))
    assert (l23["tp"], l23["fn"]) == (1, 1)
    assert l23["dice"] == pytest.approx(0.5)


def test_both_empty():
    l23, pano = both(empty(), empty())
    assert (l23["dice"], l23["hd95"]) == (1.0, 0.0)  # the 2023 code's rule
    for key in ("nsd_r", "lesion_dice_r", "lesion_hd95_r", "lesion_nsd_r", "rq_r", "pq_r"):
        assert math.isnan(pano[key]), key  # undefined, not 0 and not 1
    assert (pano["lesions_ref_r"], pano["lesions_pred_r"], pano["lesions_tp_r"]) == (0, 0, 0)


def test_empty_reference_and_empty_prediction():
    blob = cube(empty(), (5, 5, 5))
    l23, pano = both(blob, empty())
    assert (l23["dice"], l23["hd95"]) == (0.0, 374.0)
    assert pano["lesion_dice_r"] == 0.0 and math.isinf(pano["lesion_hd95_r"]) and pano["rq_r"] == 0.0
    l23, pano = both(empty(), blob)
    assert (l23["dice"], l23["hd95"]) == (0.0, 374.0)
    assert pano["lesion_dice_r"] == 0.0 and math.isinf(pano["lesion_hd95_r"]) and pano["nsd_r"] == 0.0


def test_spacing_scales_distances():
    ref = cube(empty(), (4, 4, 4), 6)
    pred = np.roll(ref, 1, axis=2)
    hd_iso = compute_lesion23_metrics(pred, ref, ISO)["hd95"]
    hd_z3 = compute_lesion23_metrics(pred, ref, (1.0, 1.0, 3.0))["hd95"]
    assert hd_iso == pytest.approx(1.0)
    assert hd_z3 == pytest.approx(3.0)
    assert compute_panoptica_metrics(pred, ref, ISO, ONE)["lesion_hd95_r"] == pytest.approx(1.0)


@pytest.mark.parametrize(
    "stored, z_shift_mm, x_shift_mm",
    [
        ("as given", 1.5, 3.0),  # file axes (x, y, z): SimpleITK's array is (z, y, x), spacing (1.5, 1, 3)
        ("LPS", 1.5, 3.0),  # flips do not change which size goes with which axis
        ("y, x, z", 1.0, 1.5),  # file axes (y, x, z): array (z, x, y), spacing (1, 1.5, 3)
    ],
)
def test_panoptica_distances_pair_the_spacing_as_the_official_evaluation_reads_the_file(stored, z_shift_mm, x_shift_mm):
    """The official evaluation reads the file with SimpleITK, (k, j, i) array with the (i, j, k)
    spacing; the 2023 code measures each axis with its own size (z 3 mm, x 1.5 mm)."""
    spacing = (1.5, 1.0, 3.0)  # (x, y, z) mm
    affine = {
        "as given": np.diag([*spacing, 1.0]),
        "LPS": np.diag([-1.5, -1.0, 3.0, 1.0]),
        "y, x, z": np.array([[0, 1.5, 0, 0], [1.0, 0, 0, 0], [0, 0, 3.0, 0], [0, 0, 0, 1]]),
    }[stored]
    ref = cube(empty(), (4, 4, 4), 6)
    for axis, expected in ((2, z_shift_mm), (0, x_shift_mm)):
        pred = np.roll(ref, 1, axis=axis)
        values = compute_panoptica_metrics(pred, ref, spacing, ONE, stored_affine=affine)
        assert values["lesion_hd95_r"] == pytest.approx(expected)
        assert values["lesion_dice_r"] == pytest.approx(5 / 6)  # Dice and counts do not depend on it
    assert compute_lesion23_metrics(np.roll(ref, 1, axis=2), ref, spacing)["hd95"] == pytest.approx(3.0)


def test_regions_come_from_the_label_table():
    """brats2024: TC is {1, 3}; a necrosis-only lesion is TC and WT but not ET; RC is its own."""
    table = region_label_values("brats2024")
    ref, pred = empty(), empty()
    ref[cube(empty(), (2, 2, 2)) == 1] = 1
    pred[cube(empty(), (2, 2, 2)) == 1] = 1
    ref[cube(empty(), (20, 20, 20)) == 1] = 4
    values = compute_lesionwise_metrics(pred, ref, ISO, table)
    assert values["lesion23_dice_tc"] == pytest.approx(1.0) and values["lesion23_dice_wt"] == pytest.approx(1.0)
    assert values["lesion23_dice_et"] == 1.0 and math.isnan(values["lesion_dice_et"])  # both empty
    assert values["lesion23_dice_rc"] == 0.0 and values["lesions_ref_rc"] == 1 and values["lesions_tp_rc"] == 0
    assert set(values) == {
        f"{m}_{r}"
        for r in table
        for m in (
            "nsd",
            "lesion_dice",
            "lesion_hd95",
            "lesion_nsd",
            "lesions_ref",
            "lesions_pred",
            "lesions_tp",
            "rq",
            "pq",
            "lesion23_dice",
            "lesion23_hd95",
        )
    }


def test_sub_challenge_parameters():
    assert lesion23_params_for("BraTS-MET-00012-000") == Lesion23Params(1, 2.0)
    assert lesion23_params_for("BraTS-MEN-00012-000") == Lesion23Params(1, 50.0)
    assert lesion23_params_for("BraTS-PED-00012-000") == Lesion23Params(3, 50.0)
    assert lesion23_params_for("BraTS2021_00012") == LESION23_PARAMS["GLI"]
    assert lesion23_params_for("BRATS_001") == LESION23_PARAMS["GLI"]


def test_bad_input_is_a_named_error():
    with pytest.raises(LesionwiseError, match="one shape"):
        compute_panoptica_metrics(empty(), np.zeros((4, 4, 4), np.uint8), ISO, ONE)
    with pytest.raises(LesionwiseError, match="integer label map"):
        compute_panoptica_metrics(empty().astype(float), empty(), ISO, ONE)
    with pytest.raises(LesionwiseError, match="spacing"):
        compute_lesion23_metrics(empty(), empty(), (1.0, 0.0, 1.0))


def test_a_panoptica_failure_names_the_case(monkeypatch):
    class Broken:
        def evaluate(self, *a, **k):
            raise RuntimeError("matching exploded")

    monkeypatch.setattr(panoptica_metrics, "make_panoptica_evaluator", lambda table: Broken())
    ref = cube(empty(), (2, 2, 2))
    with pytest.raises(CaseError, match="BraTS2021_00042.*panoptica failed: RuntimeError: matching exploded"):
        score_case("BraTS2021_00042", ref, ref, ISO, "brats2021")
