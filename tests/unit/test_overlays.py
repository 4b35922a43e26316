"""Tests of brats_seg.evaluation.overlays: a readable 3-panel PNG whose contours show."""

from __future__ import annotations

import matplotlib.image as mpimg
import numpy as np
import pytest

from brats_seg.evaluation.overlays import compute_overlay_centre, save_overlay

SHAPE = (48, 56, 40)  # (x, y, z), the tiny resolution
TUMOUR_CENTRE = (32, 38, 24)  # patient's right, anterior, superior of the volume centre


@pytest.fixture(scope="module")
def case():
    """A noisy ellipsoid 'brain' with a spherical tumour: image, nested regions (x, y, z, 3)."""
    rng = np.random.default_rng(0)
    x, y, z = np.meshgrid(*(np.arange(s) for s in SHAPE), indexing="ij")
    c = np.array(SHAPE) / 2
    brain = ((x - c[0]) / 20) ** 2 + ((y - c[1]) / 25) ** 2 + ((z - c[2]) / 17) ** 2 < 1
    r = np.sqrt(sum((a - t) ** 2 for a, t in zip((x, y, z), TUMOUR_CENTRE)))
    wt, tc, et = r < 8, r < 5, (r < 5) & (r >= 3)
    image = np.where(brain, 1.0 + 0.2 * rng.standard_normal(SHAPE), 0.0).astype(np.float32)
    image[wt] += 0.8
    return image, np.stack([wt, tc, et], axis=-1).astype(np.uint8)


def _read(path):
    img = mpimg.imread(path)
    assert img.ndim == 3 and img.shape[2] in (3, 4)
    return img


def test_overlay_png_is_written_and_readable(case, tmp_path):
    image, ref = case
    path = save_overlay(image, ref, ref, tmp_path / "overlays" / "case_000.png", title="case_000")
    assert path.exists()
    img = _read(path)
    height, width = img.shape[:2]
    assert 2.0 < width / height < 3.5  # three panels side by side
    assert sorted(p.name for p in path.parent.iterdir()) == ["case_000.png"]  # no temp left


def test_overlay_contours_change_with_prediction(case, tmp_path):
    image, ref = case
    same = _read(save_overlay(image, ref, ref, tmp_path / "same.png"))
    shifted_pred = np.roll(ref, shift=(4, -3, 2), axis=(0, 1, 2))
    shifted = _read(save_overlay(image, ref, shifted_pred, tmp_path / "shifted.png"))
    assert same.shape == shifted.shape
    changed = np.any(np.abs(same - shifted) > 0.05, axis=-1)
    assert changed.mean() > 0.001  # the dashed predicted contours moved
    # No contours at all differs from contours drawn.
    bare = _read(save_overlay(image, None, None, tmp_path / "bare.png"))
    assert np.any(np.abs(bare - same) > 0.05)


def test_overlay_without_reference(case, tmp_path):
    image, ref = case
    path = save_overlay(image, None, ref[..., :1], tmp_path / "pred_only.png", spacing_mm=(1.0, 1.5, 3.0))
    assert _read(path).shape[0] > 100


def test_overlay_accepts_4d_image(case, tmp_path):
    image, ref = case
    four = np.stack([image, -image], axis=-1)
    a = _read(save_overlay(four, ref, ref, tmp_path / "four.png"))
    b = _read(save_overlay(image, ref, ref, tmp_path / "three.png"))
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    "ref_wt, pred_wt, expected",
    [
        (True, True, TUMOUR_CENTRE),  # reference wins
        (False, True, (10, 11, 12)),  # else prediction
        (False, False, (24, 28, 20)),  # else volume centre
    ],
)
def test_overlay_centre(ref_wt, pred_wt, expected):
    ref = np.zeros(SHAPE + (3,), bool)
    pred = np.zeros(SHAPE + (3,), bool)
    if ref_wt:
        ref[tuple(slice(t - 2, t + 3) for t in TUMOUR_CENTRE) + (0,)] = True
    if pred_wt:
        pred[9:12, 10:13, 11:14, 0] = True
    assert compute_overlay_centre(ref, pred, SHAPE) == expected


def test_overlay_shape_mismatch_raises(case, tmp_path):
    image, ref = case
    with pytest.raises(ValueError, match=r"image shape \(48, 56, 40\)"):
        save_overlay(image, ref[:-1], ref, tmp_path / "bad.png")
    assert not (tmp_path / "bad.png").exists()
