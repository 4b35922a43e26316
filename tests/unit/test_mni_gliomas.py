"""The MNI152 glioma generator: seeded, realistic in the ways training depends on, and read
through the same discovery, loading and preparation code as real data."""

from __future__ import annotations

import hashlib

import nibabel as nib
import numpy as np
import pytest

from brats_seg.config import DataConfig
from brats_seg.data.case_io import load_case_image, load_case_label
from brats_seg.data.dataset import ensure_synthetic
from brats_seg.data.labels import labels_to_regions
from brats_seg.data.layouts import discover_cases
from brats_seg.data.phantoms.mni_gliomas import GRID_SHAPE, generate_mni_case, write_mni_glioma_dataset

import nilearn  # noqa: F401  (a dependency: its MNI152 templates)


@pytest.fixture(scope="module")
def mni_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("mni")
    ids = write_mni_glioma_dataset(root, n_cases=2, seed=3)
    return root, ids


def _digest(path):
    return hashlib.sha256(np.asarray(nib.load(path).dataobj).tobytes()).hexdigest()


def test_same_seed_same_case_other_seed_other_case():
    a, b = generate_mni_case(np.random.default_rng([3, 0])), generate_mni_case(np.random.default_rng([3, 0]))
    np.testing.assert_array_equal(a.labels, b.labels)
    np.testing.assert_array_equal(a.images["flair"], b.images["flair"])
    c = generate_mni_case(np.random.default_rng([4, 0]))
    assert not np.array_equal(a.labels, c.labels)


def test_cases_load_through_the_real_data_path(mni_root):
    root, ids = mni_root
    cases, skipped = discover_cases(root, "brats2021", require_labels=True)
    assert [c.case_id for c in cases] == ids and not skipped
    for case in cases:
        image, ref = load_case_image(case)
        label = load_case_label(case, ref)
        assert image.shape == (*GRID_SHAPE, 4)
        regions = labels_to_regions(label.data, "brats2021").astype(bool)
        wt, tc, et = (regions[..., k].sum() for k in range(3))
        assert wt > tc > 0 and tc >= et  # nested, with a tumour core
        assert 0.01 < tc / wt < 0.9
        # The tumour is brighter than brain on FLAIR (oedema), as in real scans.
        flair = image[..., 0]
        brain = flair > 0
        assert flair[regions[..., 0] & ~regions[..., 1]].mean() > 1.2 * flair[brain & ~regions[..., 0]].mean()


def test_storage_orientations_are_mixed_and_loaded_as_ras(tmp_path):
    ids = write_mni_glioma_dataset(tmp_path, n_cases=4, seed=0)
    codes = {nib.aff2axcodes(nib.load(tmp_path / i / f"{i}_seg.nii.gz").affine) for i in ids}
    assert codes == {("R", "A", "S"), ("L", "P", "S")}
    # The same seed written again is byte-identical (complete cases are kept, and regenerating gives the same data).
    again = tmp_path / "again"
    write_mni_glioma_dataset(again, n_cases=1, seed=0)
    assert _digest(again / ids[0] / f"{ids[0]}_seg.nii.gz") == _digest(tmp_path / ids[0] / f"{ids[0]}_seg.nii.gz")


def test_data_config_generates_on_first_use(tmp_path):
    data = DataConfig(name="mni_gliomas", layout="brats2021", root=str(tmp_path / "m"), synthetic_cases=1)
    ensure_synthetic(data)
    assert (tmp_path / "m" / "MNIG_00000" / "MNIG_00000_seg.nii.gz").is_file()
    with pytest.raises(ValueError, match="brats2021 layout"):
        ensure_synthetic(DataConfig(name="mni_gliomas", layout="msd", root=str(tmp_path / "m")))


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="n_cases"):
        write_mni_glioma_dataset("/nonexistent", n_cases=0)
    with pytest.raises(ValueError, match="seed"):
        write_mni_glioma_dataset("/nonexistent", n_cases=1, seed=-1)


def test_the_shifted_case_is_the_same_tumour_acquired_as_another_scanner_would():
    from brats_seg.data.phantoms.mni_gliomas import SHIFT

    matched = generate_mni_case(np.random.default_rng([3, 0]))
    shifted = generate_mni_case(np.random.default_rng([3, 0]), SHIFT, np.random.default_rng([3, 0, 1]))
    for label in (1, 2, 4):  # the same tumour: each compartment's volume kept by the rotation (nearest)
        a, b = np.count_nonzero(matched.labels == label), np.count_nonzero(shifted.labels == label)
        assert abs(a - b) <= 0.1 * max(a, 50), f"label {label}: {a} voxels matched, {b} shifted"
    overlap = np.count_nonzero((matched.labels > 0) & (shifted.labels > 0)) / np.count_nonzero(matched.labels > 0)
    assert overlap < 0.9  # but the head is turned: the tumour is elsewhere on the grid
    brain = (matched.images["flair"] > 0) & (shifted.images["flair"] > 0)

    def roughness(img, axis):  # mean step between neighbouring slices inside the brain
        return float(np.mean(np.abs(np.diff(img, axis=axis))[np.take(brain, range(brain.shape[axis] - 1), axis)]))

    ratios = [roughness(shifted.images["t1"], a) / roughness(matched.images["t1"], a) for a in range(3)]
    assert min(ratios) < 0.75, f"no axis of thick slices: {ratios}"  # 4 mm slices, resampled back: smoother
    again = generate_mni_case(np.random.default_rng([3, 0]), SHIFT, np.random.default_rng([3, 0, 1]))
    np.testing.assert_array_equal(again.images["t2"], shifted.images["t2"])  # seeded like the matched set
