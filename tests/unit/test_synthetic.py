"""The synthetic BraTS-like generator: arrays, determinism, layouts on disk, difficulty.

Full cases are expensive (~1 s each), so a handful are generated once per module; the
writer's bookkeeping (skip, atomic write, unlabelled sets) is tested with a stand-in
generator that returns an already generated case.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest
from scipy import ndimage as ndi

from brats_seg.data.labels import LABELS
from brats_seg.data.phantoms import synthetic
from brats_seg.data.phantoms.synthetic import (
    AFFINE,
    MODALITIES,
    SHAPE,
    generate_case,
    sample_case_params,
    tissue_to_labels,
    write_synthetic_dataset,
)

REPO = Path(__file__).resolve().parents[2]
LAYOUTS = ("brats2021", "brats2023", "msd")


def _rng(seed: int, i: int) -> np.random.Generator:
    return np.random.default_rng([seed, i])


@pytest.fixture(scope="module")
def cases():
    """Cases 0-2 of seed 0: 0 and 1 with enhancing tumour, 2 without (and with a satellite)."""
    return [generate_case(_rng(0, i)) for i in range(3)]


@pytest.fixture
def fake_generator(cases, monkeypatch):
    """Replace the (slow) generator by one that returns case 0; counts calls."""
    calls = []

    def fake(rng):
        calls.append(rng)
        return cases[0]

    monkeypatch.setattr(synthetic, "generate_case", fake)
    return calls


def _brain(case) -> np.ndarray:
    return case.images["flair"] > 0


# --------------------------------------------------------------------------- arrays


def test_case_arrays_are_brats_like(cases):
    for case in cases:
        brain = _brain(case)
        assert np.array_equal(case.affine, AFFINE)
        assert nib.aff2axcodes(case.affine) == ("L", "P", "S")
        assert case.tissue.shape == SHAPE and case.tissue.dtype == np.uint8
        assert set(np.unique(case.tissue).tolist()) <= {0, 1, 2, 3}
        assert not case.tissue[~brain].any(), "tumour outside the brain"
        assert 0.9e6 < brain.sum() < 2.0e6  # a 0.9-2 litre brain
        for m in MODALITIES:
            img = case.images[m]
            assert img.shape == SHAPE and img.dtype == np.float32
            assert np.array_equal(img > 0, brain), f"{m}: brain mask differs from FLAIR's"
            assert np.array_equal(img, np.rint(img)) and img.max() <= 32767
            assert img[brain].min() >= 1 and not img[~brain].any()


def test_tumour_has_every_region_and_no_et_cases_have_no_rim(cases):
    for case in cases:
        counts = np.bincount(case.tissue.ravel(), minlength=4)
        assert counts[1] > 0 and counts[2] > 0, f"edema/core missing: {counts}"
        assert (counts[3] > 0) == case.has_enhancing, f"has_enhancing={case.has_enhancing}, counts {counts}"
    no_et = [case for case in cases if not case.has_enhancing]
    assert no_et, "seed 0 should give a case without enhancing tumour among cases 0-2"
    assert 4 not in np.unique(no_et[0].labels("brats2021"))


def test_sampled_population_varies_like_brats():
    params = [sample_case_params(_rng(0, i)) for i in range(300)]
    no_et = np.mean([not p.has_enhancing for p in params])
    assert 0.12 < no_et < 0.3, f"{no_et:.0%} cases without enhancing tumour; expected ~20%"
    r_wt = [p.lesions[0].r_wt_mm for p in params]
    assert min(r_wt) < 12 and max(r_wt) > 34  # small to large
    side = [p.lesions[0].centre_mm[0] > 0 for p in params]
    assert 0.35 < np.mean(side) < 0.65  # both hemispheres
    assert any(len(p.lesions) > 1 for p in params)  # satellites exist
    assert len({p.scales for p in params}) == len(params)  # per-case global scale


def test_same_generator_state_gives_the_same_case_and_another_seed_does_not(cases):
    again = generate_case(_rng(0, 0))
    other = generate_case(_rng(1, 0))
    for m in MODALITIES:
        assert np.array_equal(again.images[m], cases[0].images[m])
        assert not np.array_equal(other.images[m], cases[0].images[m])
    assert np.array_equal(again.tissue, cases[0].tissue)
    assert again.params == cases[0].params
    assert not np.array_equal(other.tissue, cases[0].tissue)


def test_tumour_contrasts_have_the_expected_signs(cases):
    for k, case in enumerate(cases):
        t = case.tissue
        normal_brain = _brain(case) & (t == 0)

        def mean(m, mask):
            return float(case.images[m][mask].mean())

        def normal(m):  # the median is white/grey matter; the mean is pulled by CSF
            return float(np.median(case.images[m][normal_brain]))

        edema, core, et = t == 1, t == 2, t == 3
        msg = f"case {k}"
        assert mean("flair", edema) > 1.2 * normal("flair"), msg
        assert mean("t2", edema) > 1.1 * normal("t2"), msg
        assert mean("t1", edema) < normal("t1"), msg
        assert mean("t2", core) > 1.3 * normal("t2"), msg
        assert mean("t1", core) < 0.8 * normal("t1"), msg
        if case.has_enhancing:
            assert mean("t1ce", et) > 1.3 * mean("t1ce", core), msg
            assert mean("t1ce", et) > 1.1 * normal("t1ce"), msg
        else:
            assert mean("t1ce", core) < normal("t1ce"), msg


def _best_threshold_dice(values: np.ndarray, target: np.ndarray) -> float:
    """Best Dice of ``values > t`` or ``values < t`` over every threshold t (exact)."""
    g = target[np.argsort(values, kind="stable")].astype(np.int64)
    best = 0.0
    for ordered in (g, g[::-1]):  # predicted = the k lowest, or the k highest values
        tp = np.cumsum(ordered)
        best = max(best, float(np.max(2 * tp / (np.arange(1, g.size + 1) + g.sum()))))
    return best


def test_no_single_channel_threshold_gives_the_whole_tumour(cases):
    for k, case in enumerate(cases):
        brain = _brain(case)
        wt = (case.tissue > 0)[brain]
        for m in MODALITIES:
            dice = _best_threshold_dice(case.images[m][brain], wt)
            assert dice < 0.8, f"case {k}: the best {m} threshold gives WT Dice {dice:.3f}"


def test_upsampling_is_linear_zoom():
    a = np.random.default_rng(0).standard_normal((5, 7, 3)).astype(np.float32)
    expected = ndi.zoom(a, 2, order=1, grid_mode=True, mode="nearest")
    np.testing.assert_allclose(synthetic._upsample2(a), expected, atol=1e-5)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_tissue_maps_to_the_layout_labels(layout):
    conv = LABELS[layout]
    tissue = np.arange(4, dtype=np.uint8).reshape(4, 1, 1)
    assert tissue_to_labels(tissue, layout).ravel().tolist() == [0, conv.edema, conv.core, conv.enhancing]


# --------------------------------------------------------------------------- files


def _expected_names(layout: str, n: int) -> set[str]:
    if layout == "brats2021":
        return {
            f"BraTS2021_{i:05d}/BraTS2021_{i:05d}_{m}.nii.gz"
            for i in range(n)
            for m in ("flair", "t1", "t1ce", "t2", "seg")
        }
    if layout == "brats2023":
        return {
            f"BraTS-GLI-{i:05d}-000/BraTS-GLI-{i:05d}-000-{m}.nii.gz"
            for i in range(n)
            for m in ("t2f", "t1n", "t1c", "t2w", "seg")
        }
    return {"dataset.json"} | {f"{d}/BRATS_{i + 1:03d}.nii.gz" for i in range(n) for d in ("imagesTr", "labelsTr")}


def _files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def written(tmp_path_factory, cases):
    """Two labelled cases of seed 0 in each layout. The writer is handed the module's cases 0 and 1
    when it asks for them (by the generator state they were drawn from) instead of generating them
    three times more; test_a_case_does_not_depend_on_n_cases writes one generated again."""
    known = {repr(_rng(0, i).bit_generator.state): cases[i] for i in range(2)}

    def generate(rng):
        key = repr(rng.bit_generator.state)
        return known[key] if key in known else generate_case(rng)

    base = tmp_path_factory.mktemp("synthetic_written")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(synthetic, "generate_case", generate)
        return {layout: (base / layout, write_synthetic_dataset(base / layout, layout, 2, 0)) for layout in LAYOUTS}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_layout_files_names_dtypes_affine_and_labels(written, cases, layout):
    root, ids = written[layout]
    assert _files(root) == _expected_names(layout, 2)
    assert (
        ids
        == {
            "brats2021": ["BraTS2021_00000", "BraTS2021_00001"],
            "brats2023": ["BraTS-GLI-00000-000", "BraTS-GLI-00001-000"],
            "msd": ["BRATS_001", "BRATS_002"],
        }[layout]
    )
    conv = LABELS[layout]
    for i in range(2):
        files = synthetic.case_files(root, layout, i)
        seg = nib.load(files["seg"])
        assert seg.get_data_dtype() == np.uint8 and seg.shape == SHAPE
        assert np.array_equal(seg.affine, AFFINE) and nib.aff2axcodes(seg.affine) == ("L", "P", "S")
        labels = np.asarray(seg.dataobj)
        assert set(np.unique(labels).tolist()) <= set(conv.values)
        assert {conv.edema, conv.core} <= set(np.unique(labels).tolist())
        images = [nib.load(files["image"])] if layout == "msd" else [nib.load(files[m]) for m in MODALITIES]
        for img in images:
            assert img.get_data_dtype() == np.int16
            assert np.array_equal(img.affine, AFFINE)
            assert img.header.get_zooms()[:3] == (1.0, 1.0, 1.0)
    # Case 0 on disk is exactly generate_case(default_rng([0, 0])).
    files = synthetic.case_files(root, layout, 0)
    labels = np.asarray(nib.load(files["seg"]).dataobj)
    assert np.array_equal(labels, cases[0].labels(layout))
    if layout == "msd":
        img = np.asarray(nib.load(files["image"]).dataobj)
        assert img.shape == (*SHAPE, 4)
        for c, m in enumerate(MODALITIES):  # FLAIR, T1w, T1gd, T2w
            assert np.array_equal(img[..., c], cases[0].images[m])
    else:
        for m in MODALITIES:
            assert np.array_equal(np.asarray(nib.load(files[m]).dataobj), cases[0].images[m])


def test_msd_dataset_json(written):
    root, _ = written["msd"]
    meta = json.loads((root / "dataset.json").read_text())
    assert meta["modality"] == {"0": "FLAIR", "1": "T1w", "2": "t1gd", "3": "T2w"}
    assert meta["labels"] == {"0": "background", "1": "edema", "2": "non-enhancing tumor", "3": "enhancing tumour"}
    assert meta["numTraining"] == 2 and meta["test"] == []
    assert meta["training"][0] == {"image": "./imagesTr/BRATS_001.nii.gz", "label": "./labelsTr/BRATS_001.nii.gz"}


def test_a_case_does_not_depend_on_n_cases(written, tmp_path):
    root, _ = written["brats2023"]
    write_synthetic_dataset(tmp_path, "brats2023", n_cases=1, seed=0)
    for name in _files(tmp_path):
        assert (tmp_path / name).read_bytes() == (root / name).read_bytes(), name


@pytest.mark.parametrize("layout", LAYOUTS)
def test_unlabelled_set_has_no_label_files(fake_generator, tmp_path, layout):
    ids = write_synthetic_dataset(tmp_path, layout, n_cases=2, seed=0, with_labels=False)
    names = _files(tmp_path)
    assert not any("seg" in n or "labelsTr" in n for n in names)
    if layout == "msd":
        assert names == {"dataset.json", "imagesTs/BRATS_001.nii.gz", "imagesTs/BRATS_002.nii.gz"}
        meta = json.loads((tmp_path / "dataset.json").read_text())
        assert meta["test"] == [f"./imagesTs/{i}.nii.gz" for i in ids] and meta["numTest"] == 2
        assert meta["training"] == [] and meta["numTraining"] == 0
    else:
        assert len(names) == 8


def test_msd_labelled_and_unlabelled_sets_share_dataset_json(fake_generator, tmp_path):
    write_synthetic_dataset(tmp_path, "msd", n_cases=1, seed=0)
    write_synthetic_dataset(tmp_path, "msd", n_cases=1, seed=1, with_labels=False)
    meta = json.loads((tmp_path / "dataset.json").read_text())
    assert (meta["numTraining"], meta["numTest"]) == (1, 1)


def test_existing_cases_are_skipped_and_incomplete_ones_redone(fake_generator, tmp_path):
    write_synthetic_dataset(tmp_path, "brats2021", n_cases=2, seed=0)
    assert len(fake_generator) == 2
    mtimes = {n: (tmp_path / n).stat().st_mtime_ns for n in _files(tmp_path)}
    write_synthetic_dataset(tmp_path, "brats2021", n_cases=2, seed=0)
    assert len(fake_generator) == 2
    assert {n: (tmp_path / n).stat().st_mtime_ns for n in _files(tmp_path)} == mtimes
    (tmp_path / "BraTS2021_00001" / "BraTS2021_00001_t2.nii.gz").unlink()
    write_synthetic_dataset(tmp_path, "brats2021", n_cases=3, seed=0)
    assert len(fake_generator) == 4  # case 1 redone, case 2 new
    assert _files(tmp_path) == _expected_names("brats2021", 3)


def test_an_interrupted_write_leaves_neither_a_partial_file_nor_a_temp_file(fake_generator, tmp_path, monkeypatch):
    real_to_file_map = nib.Nifti1Image.to_file_map
    written_files = []

    def crash_on_third_file(self, file_map=None, **kw):
        if len(written_files) == 2:
            file_map["image"].fileobj.write(b"half a header")
            raise KeyboardInterrupt("simulated interruption")
        written_files.append(1)
        return real_to_file_map(self, file_map, **kw)

    monkeypatch.setattr(nib.Nifti1Image, "to_file_map", crash_on_third_file)
    with pytest.raises(KeyboardInterrupt):
        write_synthetic_dataset(tmp_path, "brats2021", n_cases=1, seed=0)
    names = {p.name for p in tmp_path.rglob("*") if p.is_file()}
    assert names == {"BraTS2021_00000_flair.nii.gz", "BraTS2021_00000_t1.nii.gz"}, names
    for name in names:  # the two finished files are complete
        assert nib.load(next(tmp_path.rglob(name))).shape == SHAPE

    monkeypatch.setattr(nib.Nifti1Image, "to_file_map", real_to_file_map)
    write_synthetic_dataset(tmp_path, "brats2021", n_cases=1, seed=0)
    assert _files(tmp_path) == _expected_names("brats2021", 1)  # completed; no .tmp left


@pytest.mark.parametrize(
    "kwargs, message",
    [({"layout": "brats2019"}, "brats2019"), ({"n_cases": 0}, "n_cases"), ({"seed": -1}, "seed")],
)
def test_bad_arguments_name_the_value(tmp_path, kwargs, message):
    args = {"layout": "brats2021", "n_cases": 1, "seed": 0} | kwargs
    with pytest.raises(ValueError, match=message):
        write_synthetic_dataset(tmp_path / "out", **args)
    assert not (tmp_path / "out").exists()


# --------------------------------------------------------------------------- command line


def _run_cli(*overrides: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, str(REPO / "scripts" / "make_synthetic.py"), *overrides],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_cli_writes_where_asked_and_nothing_else(tmp_path):
    proc = _run_cli("out=ds", "layout=brats2023", "n_cases=1", "seed=3", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Wrote 1 labelled brats2023 cases" in proc.stdout and str(tmp_path / "ds") in proc.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]  # no outputs/, .hydra/ or .log
    assert _files(tmp_path / "ds") == _expected_names("brats2023", 1)


def test_cli_without_out_says_what_to_do(tmp_path):
    proc = _run_cli("n_cases=1", cwd=tmp_path)
    assert proc.returncode == 2  # as every entry point's user error (it exited 1 with its own usage line)
    assert "error: out is required: pass out=" in proc.stderr
    assert list(tmp_path.iterdir()) == []
    proc = _run_cli("out=ds", "layout=brats2025", cwd=tmp_path)
    assert proc.returncode == 2 and "layout='brats2025'" in proc.stderr and "Did you mean 'brats2024'" in proc.stderr
    assert list(tmp_path.iterdir()) == []
