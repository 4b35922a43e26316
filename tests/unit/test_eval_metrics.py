"""Tests of brats_seg.evaluation.scoring.metrics: per-mask maths, BraTS empty rules, per case."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import surface_distance
from scipy import ndimage

from brats_seg.evaluation.scoring.metrics import (
    HD95_EMPTY_MM,
    LEGACY_METRICS,
    compute_case_metrics,
    compute_dice,
    compute_hd95_mm,
    compute_sensitivity,
    compute_specificity,
)


def _mask(shape, *boxes):
    """Bool mask of ``shape`` with the given index boxes (tuples of slices) set."""
    m = np.zeros(shape, dtype=bool)
    for box in boxes:
        m[box] = True
    return m


def _blob(shape, seed, fill=0.08, smooth=1.5):
    """A seeded random blobby mask: smoothed noise thresholded at a quantile."""
    rng = np.random.default_rng(seed)
    field = ndimage.gaussian_filter(rng.standard_normal(shape), smooth)
    return field > np.quantile(field, 1.0 - fill)


def _reference_hd95(pred, ref, spacing_mm):
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        d = surface_distance.compute_surface_distances(ref, pred, spacing_mm)
    return surface_distance.compute_robust_hausdorff(d, 95)


# ---------------------------------------------------------------------------------------
# Dice / sensitivity / specificity by hand
# ---------------------------------------------------------------------------------------

SHAPE = (4, 5, 3)  # 60 voxels
# ref: 8 voxels, pred: 6 voxels, overlap: 4 voxels -> TP 4, FN 4, FP 2, TN 50
REF = _mask(SHAPE, np.s_[0:2, 0:2, 0:2])
PRED = _mask(SHAPE, np.s_[1:2, 0:2, 0:2], np.s_[3:4, 4:5, 0:2])


def test_dice_sens_spec_by_hand():
    assert compute_dice(PRED, REF) == pytest.approx(2 * 4 / (6 + 8))
    assert compute_sensitivity(PRED, REF) == pytest.approx(4 / 8)
    assert compute_specificity(PRED, REF) == pytest.approx(50 / 52)


def test_dice_is_symmetric_and_accepts_uint8():
    assert compute_dice(REF.astype(np.uint8), PRED.astype(np.uint8)) == compute_dice(PRED, REF)


def test_identical_masks_are_perfect():
    assert compute_dice(REF, REF) == 1.0
    assert compute_sensitivity(REF, REF) == 1.0
    assert compute_specificity(REF, REF) == 1.0
    assert compute_hd95_mm(REF, REF, (1.0, 1.5, 3.0)) == 0.0


EMPTY = np.zeros(SHAPE, dtype=bool)
FULL = np.ones(SHAPE, dtype=bool)


@pytest.mark.parametrize(
    "pred, ref, dice, hd95, sens, spec",
    [
        pytest.param(EMPTY, EMPTY, 1.0, 0.0, 1.0, 1.0, id="both-empty"),
        pytest.param(PRED, EMPTY, 0.0, HD95_EMPTY_MM, 0.0, 54 / 60, id="ref-empty"),
        pytest.param(EMPTY, REF, 0.0, HD95_EMPTY_MM, 0.0, 1.0, id="pred-empty"),
        pytest.param(FULL, FULL, 1.0, 0.0, 1.0, 1.0, id="both-full"),
        pytest.param(PRED, FULL, 2 * 6 / 66, None, 6 / 60, 0.0, id="ref-full-pred-partial"),
    ],
)
def test_empty_mask_rules(pred, ref, dice, hd95, sens, spec):
    assert compute_dice(pred, ref) == pytest.approx(dice)
    assert compute_sensitivity(pred, ref) == pytest.approx(sens)
    assert compute_specificity(pred, ref) == pytest.approx(spec)
    if hd95 is not None:
        assert compute_hd95_mm(pred, ref, (1.0, 1.5, 3.0)) == pytest.approx(hd95)


def test_hd95_empty_constant_is_the_brats_diagonal():
    assert pytest.approx(math.sqrt(240**2 + 240**2 + 155**2), abs=0.01) == HD95_EMPTY_MM


def test_specificity_mirrors_sensitivity_on_background():
    for seed in range(3):
        pred, ref = _blob((9, 8, 7), seed), _blob((9, 8, 7), seed + 10)
        assert compute_specificity(pred, ref) == compute_sensitivity(~pred, ~ref)


@pytest.mark.parametrize(
    "pred, ref, match",
    [
        (
            np.zeros((3, 3, 3), bool),
            np.zeros((3, 3, 4), bool),
            r"pred \(3, 3, 3\) and ref \(3, 3, 4\)",
        ),
        (np.zeros((3, 3, 3), np.float32), np.zeros((3, 3, 3), bool), "dtype float32"),
        (np.full((3, 3, 3), 2, np.uint8), np.zeros((3, 3, 3), bool), r"values in \[2, 2\]"),
    ],
)
def test_bad_masks_raise(pred, ref, match):
    with pytest.raises(ValueError, match=match):
        compute_dice(pred, ref)


@pytest.mark.parametrize("spacing", [(1.0, 1.0), (1.0, 0.0, 1.0), (1.0, float("nan"), 1.0)])
def test_hd95_bad_spacing_raises(spacing):
    with pytest.raises(ValueError, match="spacing_mm"):
        compute_hd95_mm(REF, REF, spacing)


# ---------------------------------------------------------------------------------------
# HD95 against the DeepMind reference
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape, spacing_mm, seed",
    [
        ((17, 23, 11), (1.0, 1.5, 3.0), 0),
        ((17, 23, 11), (1.0, 1.5, 3.0), 1),
        ((31, 13, 9), (0.5, 2.0, 1.25), 2),
        ((9, 19, 27), (3.0, 1.0, 1.0), 3),
        ((21, 21, 21), (1.0, 1.0, 1.0), 4),
    ],
)
def test_hd95_matches_surface_distance(shape, spacing_mm, seed):
    pred, ref = _blob(shape, seed), _blob(shape, seed + 100)
    expected = _reference_hd95(pred, ref, spacing_mm)
    assert compute_hd95_mm(pred, ref, spacing_mm) == pytest.approx(expected)
    as_uint8 = compute_hd95_mm(pred.astype(np.uint8), ref.astype(np.uint8), spacing_mm)
    assert as_uint8 == pytest.approx(expected)
    assert 0 < expected < HD95_EMPTY_MM


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_hd95_two_voxels_by_hand(axis):
    # Two single voxels 4 voxels apart along `axis`: the surfaces (voxel cubes) are
    # translates of each other, so every surface point is 4 * spacing from the other.
    shape, spacing_mm = (11, 12, 13), (1.0, 1.5, 3.0)
    a_idx, b_idx = [5, 6, 6], [5, 6, 6]
    b_idx[axis] += 4
    pred, ref = np.zeros(shape, bool), np.zeros(shape, bool)
    ref[tuple(a_idx)] = True
    pred[tuple(b_idx)] = True
    assert compute_hd95_mm(pred, ref, spacing_mm) == pytest.approx(4 * spacing_mm[axis])


# ---------------------------------------------------------------------------------------
# Per case
# ---------------------------------------------------------------------------------------


def _regions(shape, seed, n_regions=3):
    """Nested regions (x, y, z, R): WT a blob, TC and ET successively eroded."""
    wt = _blob(shape, seed, fill=0.3, smooth=3.0)
    regs = [wt]
    for _ in range(n_regions - 1):
        regs.append(ndimage.binary_erosion(regs[-1]))
    return np.stack(regs, axis=-1).astype(np.uint8)


def test_case_metrics_three_regions():
    shape, spacing = (15, 14, 13), (1.0, 1.5, 3.0)
    ref, pred = _regions(shape, 0), _regions(shape, 1)
    pred[..., 2] = 0  # predicted ET empty
    assert ref[..., 2].any()
    m = compute_case_metrics(pred, ref, spacing)
    assert tuple(m) == tuple(f"{name}_{r}" for name in LEGACY_METRICS for r in ("wt", "tc", "et"))
    for i, r in enumerate(("wt", "tc", "et")):
        p, q = pred[..., i].astype(bool), ref[..., i].astype(bool)
        assert m[f"dice_{r}"] == pytest.approx(compute_dice(p, q))
        assert m[f"hd95_{r}"] == pytest.approx(compute_hd95_mm(p, q, spacing))
        assert m[f"sens_{r}"] == pytest.approx(compute_sensitivity(p, q))
        assert m[f"spec_{r}"] == pytest.approx(compute_specificity(p, q))
    reference = _reference_hd95(pred[..., 0] > 0, ref[..., 0] > 0, spacing)
    assert m["hd95_wt"] == pytest.approx(reference)
    assert m["dice_et"] == 0.0 and m["hd95_et"] == HD95_EMPTY_MM and m["sens_et"] == 0.0
    assert 0.0 < m["dice_wt"] < 1.0 and 0.0 < m["hd95_tc"] < HD95_EMPTY_MM
    assert all(isinstance(v, float) for v in m.values())


def test_case_metrics_one_region():
    shape = (10, 9, 8)
    ref, pred = _regions(shape, 2, 1), _regions(shape, 2, 1)
    m = compute_case_metrics(pred, ref, (1, 1, 1), region_names=("wt",))
    assert list(m) == ["dice_wt", "hd95_wt", "sens_wt", "spec_wt"]
    assert m == {"dice_wt": 1.0, "hd95_wt": 0.0, "sens_wt": 1.0, "spec_wt": 1.0}


def test_case_metrics_shape_mismatch_names_both_shapes():
    with pytest.raises(ValueError, match=r"\(4, 5, 6, 3\).*\(4, 5, 7, 3\)"):
        compute_case_metrics(np.zeros((4, 5, 6, 3), bool), np.zeros((4, 5, 7, 3), bool), (1, 1, 1))


@pytest.mark.parametrize(
    "shape, region_names, spacing, match",
    [
        ((4, 5, 6), ("wt",), (1, 1, 1), r"\(x, y, z, R\)"),
        ((4, 5, 6, 3), ("wt",), (1, 1, 1), "3 channels"),
        ((4, 5, 6, 3), ("wt", "tc", "et"), (1, 1), "3 values"),
    ],
)
def test_case_metrics_bad_arguments(shape, region_names, spacing, match):
    with pytest.raises(ValueError, match=match):
        compute_case_metrics(np.zeros(shape, bool), np.zeros(shape, bool), spacing, region_names)
