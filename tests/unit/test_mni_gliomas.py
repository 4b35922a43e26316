"""The MNI152 glioma generator: seeded, realistic in the ways training depends on, and read
through the same discovery, loading and preparation code as real data."""

from __future__ import annotations

import hashlib

import nibabel as nib
import nilearn  # noqa: F401  (a dependency: its MNI152 templates)
import numpy as np
import pytest

from brats_seg.config import DataConfig
from brats_seg.data.case_io import load_case_image, load_case_label
from brats_seg.data.dataset import ensure_synthetic
from brats_seg.data.labels import labels_to_regions
from brats_seg.data.layouts import discover_cases
from brats_seg.data.phantoms import mni_gliomas
from brats_seg.data.phantoms.mni_gliomas import GRID_SHAPE, generate_mni_case, write_mni_glioma_dataset


# A case costs seconds (a 240 x 240 x 155 grid): the cases several tests need are generated once per
# module, and the writers below are given them (by the generator state they are drawn from) instead
# of generating them again. Where a test's point is that generating again gives the same case, it
# still generates again.
@pytest.fixture(scope="module")
def case_3_0():
    """Case 0 of seed 3, generated once for the module."""
    return generate_mni_case(np.random.default_rng([3, 0]))


@pytest.fixture(scope="module")
def case_0_0():
    """Case 0 of seed 0 (the default seed), generated once for the module."""
    return generate_mni_case(np.random.default_rng([0, 0]))


def _state(rng):
    return repr(rng.bit_generator.state)


def _reusing(*generated):
    """``generate_mni_case`` that returns a case already generated when it is asked for the matched
    case of the generator state that case was drawn from, and generates any other."""
    known = {_state(np.random.default_rng(seq)): case for seq, case in generated}

    def generate(rng, shift=None, shift_rng=None):
        if shift is None and _state(rng) in known:
            return known[_state(rng)]
        return generate_mni_case(rng, shift, shift_rng)

    return generate


@pytest.fixture(scope="module")
def seed0_root(tmp_path_factory, case_0_0):
    """Three cases of seed 0 written (case 0 the module's; 0 and 1 stored LPS, 2 RAS)."""
    root = tmp_path_factory.mktemp("mni")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(mni_gliomas, "generate_mni_case", _reusing(([0, 0], case_0_0)))
        ids = write_mni_glioma_dataset(root, n_cases=3, seed=0)
    return root, ids


def _digest(path):
    return hashlib.sha256(np.asarray(nib.load(path).dataobj).tobytes()).hexdigest()


def test_same_seed_same_case_other_seed_other_case(case_3_0, case_0_0):
    a, b = case_3_0, generate_mni_case(np.random.default_rng([3, 0]))  # generated again
    np.testing.assert_array_equal(a.labels, b.labels)
    np.testing.assert_array_equal(a.images["flair"], b.images["flair"])
    c = case_0_0  # case 0 of another seed
    assert not np.array_equal(a.labels, c.labels)


def test_cases_load_through_the_real_data_path(seed0_root):
    root, ids = seed0_root
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


def test_storage_orientations_are_mixed_and_loaded_as_ras(seed0_root, tmp_path, case_0_0, monkeypatch):
    root, ids = seed0_root
    codes = {nib.aff2axcodes(nib.load(root / i / f"{i}_seg.nii.gz").affine) for i in ids}
    assert codes == {("R", "A", "S"), ("L", "P", "S")}  # loaded as RAS: the test above
    # The same case written again is byte-identical (complete cases are kept; that generating again
    # gives the same case is the first test's).
    monkeypatch.setattr(mni_gliomas, "generate_mni_case", _reusing(([0, 0], case_0_0)))
    again = tmp_path / "again"
    write_mni_glioma_dataset(again, n_cases=1, seed=0)
    assert _digest(again / ids[0] / f"{ids[0]}_seg.nii.gz") == _digest(root / ids[0] / f"{ids[0]}_seg.nii.gz")


def test_data_config_generates_on_first_use(tmp_path, case_0_0, monkeypatch):
    monkeypatch.setattr(mni_gliomas, "generate_mni_case", _reusing(([0, 0], case_0_0)))
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


def test_the_shifted_case_is_the_same_tumour_acquired_as_another_scanner_would(case_3_0):
    from brats_seg.data.phantoms.mni_gliomas import SHIFT

    matched = case_3_0
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
    # 4 mm slices, resampled back: smoother along one axis than along the others (all carry the added noise)
    assert min(ratios) < 0.75 * sorted(ratios)[1], f"no axis of thick slices: {ratios}"
    again = generate_mni_case(np.random.default_rng([3, 0]), SHIFT, np.random.default_rng([3, 0, 1]))
    np.testing.assert_array_equal(again.images["t2"], shifted.images["t2"])  # seeded like the matched set


def test_the_shifted_protocol_shows_less_tumour_contrast_and_more_noise():
    from dataclasses import replace

    from brats_seg.data.phantoms.mni_gliomas import GEOMETRY_SHIFT

    same = replace(GEOMETRY_SHIFT, gamma=(1.0, 1.0), bias=0.0)
    plain = generate_mni_case(np.random.default_rng([3, 0]), same, np.random.default_rng([3, 0, 1]))
    # Both changes in one case (each generation costs seconds): the tumour's contrast is read where
    # the added noise averages out (medians over the compartments), the noise where the contrast
    # does not reach (brain away from the tumour).
    faint = generate_mni_case(
        np.random.default_rng([3, 0]), replace(same, contrast=(0.5, 0.5), noise=0.08), np.random.default_rng([3, 0, 1])
    )
    et, core = plain.labels == 4, plain.labels == 1
    assert et.sum() > 100 and core.sum() > 100

    def enhancement(case):  # how much brighter the enhancing rim is than the core it surrounds, T1ce
        return float(np.median(case.images["t1ce"][et]) / np.median(case.images["t1ce"][core]) - 1)

    # half the difference in pure tissue; less measured over labels blurred by partial volume and 4 mm slices
    assert enhancement(plain) > 0.2 and enhancement(faint) < 0.8 * enhancement(plain), (
        enhancement(plain),
        enhancement(faint),
    )
    np.testing.assert_array_equal(faint.labels, plain.labels)  # the same tumour, seen differently

    from scipy import ndimage as ndi

    away = (plain.images["flair"] > 0) & ~ndi.binary_dilation(plain.labels > 0, iterations=8)
    added = (faint.images["flair"] - plain.images["flair"])[away]  # everything else drawn alike
    level = float(np.median(plain.images["flair"][plain.images["flair"] > 0]))
    # 8 % per acquired slice; between slices the linear resampling averages two of them (down to 8/sqrt 2)
    assert 0.05 < float(np.std(added)) / level < 0.085


def test_a_root_written_with_another_acquisition_is_written_again(tmp_path, caplog):
    import json
    import logging

    from brats_seg.data.phantoms.mni_gliomas import GEOMETRY_SHIFT, SHIFT, _check_shift_record

    def case_dir(root):
        (root / "MNIG_00000").mkdir(parents=True)
        (root / "MNIG_00000" / "MNIG_00000_seg.nii.gz").write_bytes(b"a case")

    matched, shifted = tmp_path / "matched", tmp_path / "shifted"
    case_dir(matched)
    _check_shift_record(matched, None)  # a matched root from before the record: its cases are what it holds
    assert (matched / "MNIG_00000").is_dir() and json.loads((matched / "acquisition.json").read_text()) == {
        "shift": None
    }
    case_dir(shifted)  # written by the first shift, before the record
    with caplog.at_level(logging.WARNING):
        _check_shift_record(shifted, SHIFT)
    assert not (shifted / "MNIG_00000").exists() and "writing them again" in caplog.text
    assert json.loads((shifted / "acquisition.json").read_text())["shift"]["noise"] == SHIFT.noise
    case_dir(shifted)
    _check_shift_record(shifted, SHIFT)  # the same acquisition: kept
    assert (shifted / "MNIG_00000").is_dir()
    _check_shift_record(shifted, GEOMETRY_SHIFT)  # another one: written again
    assert not (shifted / "MNIG_00000").exists()
