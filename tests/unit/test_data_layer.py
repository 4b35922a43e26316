"""Layouts, labels, NIfTI round trip, resampling, cache and splits."""

from __future__ import annotations

import json
import os

import nibabel as nib
import numpy as np
import pytest

from brats_seg.data.cache import load_entry_meta, region_voxels
from brats_seg.data.dataset import compute_strata, prepare_dataset
from brats_seg.data.errors import CaseError, DataError
from brats_seg.data.labels import LABELS, check_label_map, labels_to_regions, output_regions, regions_to_labels
from brats_seg.data.layouts import discover_cases
from brats_seg.data.nifti import load_volume, save_mask
from brats_seg.data.preprocess import invert_to_native, resample
from brats_seg.data.splits import make_split
from tests.conftest import TINY, data_config

LAYOUTS = ("brats2021", "brats2023", "brats2024", "msd")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_each_layout_is_discovered(synthetic_root, layout):
    cases, skipped = discover_cases(synthetic_root[layout], layout)
    assert skipped == []
    assert len(cases) == 3
    for case in cases:
        assert case.label is not None and case.label.is_file()
        assert len(case.images) == (1 if layout == "msd" else 4)
        assert all(p.is_file() for p in case.images)
    if layout == "brats2021":  # project channel order, whatever the file order on disk
        assert [p.name.split("_")[-1] for p in cases[0].images] == [
            "flair.nii.gz",
            "t1.nii.gz",
            "t1ce.nii.gz",
            "t2.nii.gz",
        ]
    if layout == "brats2023":
        assert [p.name.split("-")[-1] for p in cases[0].images] == [
            "t2f.nii.gz",
            "t1n.nii.gz",
            "t1c.nii.gz",
            "t2w.nii.gz",
        ]


def test_brats2018_hgg_lgg_subfolders(dataset_copy):
    root = dataset_copy("brats2021")
    cases = sorted(p for p in root.iterdir() if p.is_dir())
    (root / "HGG").mkdir()
    (root / "LGG").mkdir()
    cases[0].rename(root / "HGG" / cases[0].name)
    cases[1].rename(root / "LGG" / cases[1].name)
    found, _ = discover_cases(root, "brats2021")
    assert sorted(c.case_id for c in found) == sorted(p.name for p in cases)


def test_unlabelled_cases_are_found_for_prediction(dataset_copy):
    root = dataset_copy("brats2023")
    for seg in root.glob("*/*-seg.nii.gz"):
        seg.unlink()
    cases, _ = discover_cases(root, "brats2023", require_labels=False)
    assert len(cases) == 3 and all(c.label is None for c in cases)


def test_brats2024_cases_carry_the_resection_cavity_and_prepare_four_regions(synthetic_root, tmp_path):
    root = synthetic_root["brats2024"]
    cases, _ = discover_cases(root, "brats2024")
    assert [c.case_id for c in cases] == ["BraTS-GLI-00000-100", "BraTS-GLI-00001-100", "BraTS-GLI-00002-100"]
    labels = [np.unique(load_volume(c.label, c.case_id).data) for c in cases]
    assert any(4 in v for v in labels)
    with pytest.raises(
        DataError,
        match=r"label values \[4\] are not in the brats2023.*use data=brats2024|"
        r"label values \[4\] are not in the brats2023.*data=brats2024",
    ):
        prepare_dataset(data_config(root, "brats2023", tmp_path / "as2023"), TINY, progress=False)
    ds = prepare_dataset(data_config(root, "brats2024", tmp_path), TINY, progress=False)
    regions = [np.load(e.regions_path) for e in ds.entries]
    assert all(r.shape[-1] == 4 for r in regions) and any(r[..., 3].any() for r in regions)
    assert all(not (r[..., 3] & r[..., 0]).any() for r in regions)  # the cavity is not tumour


def test_brats2023_layout_discovers_every_sub_challenge(dataset_copy):
    root = dataset_copy("brats2023")
    for folder, prefix in zip(sorted(p for p in root.iterdir() if p.is_dir()), ("MEN", "MET", "PED")):
        new_id = folder.name.replace("GLI", prefix)
        for f in folder.iterdir():
            f.rename(folder / f.name.replace(folder.name, new_id))
        folder.rename(root / new_id)
    (root / "BraTS-SSA-00007-000").mkdir()
    for f in (root / sorted(p.name for p in root.iterdir())[0]).iterdir():
        target = root / "BraTS-SSA-00007-000" / f.name.replace(f.parent.name, "BraTS-SSA-00007-000")
        target.write_bytes(f.read_bytes())
    ids = [c.case_id for c in discover_cases(root, "brats2023")[0]]
    assert [i.split("-")[1] for i in ids] == ["MEN", "MET", "PED", "SSA"]


def _msd_with_modality(root, modality: dict) -> None:
    dj = root / "dataset.json"
    meta = json.loads(dj.read_text())
    meta["modality"] = modality
    dj.write_text(json.dumps(meta))


def test_msd_channels_are_mapped_by_the_names_in_dataset_json(dataset_copy, tmp_path):
    """A dataset whose 4D images hold T2w, t1gd, FLAIR, T1w is read as FLAIR, T1, T1ce, T2."""
    from brats_seg.data.case_io import load_case_image

    root = dataset_copy("msd")
    case = discover_cases(root, "msd")[0][0]
    reference, _ = load_case_image(case)  # MSD order
    img = nib.load(case.images[0])
    order = [3, 2, 0, 1]  # file channel i holds project channel order[i]
    data = np.asarray(img.dataobj)[..., order]
    nib.save(nib.Nifti1Image(data, img.affine, img.header), case.images[0])
    _msd_with_modality(root, {"0": "T2w", "1": "T1GD", "2": "flair", "3": "t1w"})
    moved = discover_cases(root, "msd")[0][0]
    assert moved.channels == (2, 3, 1, 0)
    image, _ = load_case_image(moved)
    np.testing.assert_array_equal(image, reference)


@pytest.mark.parametrize(
    "modality, match",
    [
        ({"0": "FLAIR", "1": "T1w", "2": "t1gd"}, "not the four contrasts"),
        ({"0": "FLAIR", "1": "T1w", "2": "DWI", "3": "T2w"}, "not the four contrasts"),
        ({"0": "FLAIR", "1": "FLAIR", "2": "t1gd", "3": "T2w"}, "not the four contrasts"),
        (None, "no 'modality' entry"),
    ],
)
def test_msd_unknown_modality_sets_are_errors_naming_the_file(dataset_copy, modality, match):
    from brats_seg.data.errors import DatasetError

    root = dataset_copy("msd")
    dj = root / "dataset.json"
    meta = json.loads(dj.read_text())
    if modality is None:
        del meta["modality"]
    else:
        meta["modality"] = modality
    dj.write_text(json.dumps(meta))
    with pytest.raises(DatasetError, match=match) as e:
        discover_cases(root, "msd")
    assert str(dj) in str(e.value)


# The table of DESIGN.md "Label conventions": region -> label values, per layout.
DESIGN_REGIONS = {
    "msd": {"wt": {1, 2, 3}, "tc": {2, 3}, "et": {3}},
    "brats2021": {"wt": {1, 2, 4}, "tc": {1, 4}, "et": {4}},
    "brats2023": {"wt": {1, 2, 3}, "tc": {1, 3}, "et": {3}},
    "brats2024": {"wt": {1, 2, 3}, "tc": {1, 3}, "et": {3}, "rc": {4}},
}


@pytest.mark.parametrize("layout", sorted(LABELS))
def test_label_region_label_round_trip(layout):
    table = LABELS[layout]
    rng = np.random.default_rng(0)
    label = rng.choice(np.array(table.values), size=(7, 6, 5)).astype(np.uint8)
    regions = labels_to_regions(label, layout)
    expected = DESIGN_REGIONS[layout]
    assert regions.shape == (7, 6, 5, len(expected)) and regions.dtype == np.uint8
    assert table.region_names == tuple(expected)
    # nested regions: ET ⊂ TC ⊂ WT
    assert np.all(regions[..., 2] <= regions[..., 1]) and np.all(regions[..., 1] <= regions[..., 0])
    np.testing.assert_array_equal(regions_to_labels(regions, layout), label)
    for i, values in enumerate(expected.values()):
        np.testing.assert_array_equal(regions[..., i].astype(bool), np.isin(label, list(values)))


@pytest.mark.parametrize("layout", sorted(LABELS))
def test_non_nested_regions_are_painted_innermost_first(layout):
    """ET outside WT is ET; TC-only is the core label; a voxel of tumour and cavity is tumour."""
    table = LABELS[layout]
    names = table.region_names
    cases = {
        ("et",): table.enhancing,
        ("tc",): table.core,
        ("wt", "et"): table.enhancing,
        ("wt", "tc"): table.core,
        ("wt",): table.edema,
        (): 0,
    }
    if "rc" in names:
        cases.update({("rc",): table.cavity, ("wt", "rc"): table.edema, ("et", "rc"): table.enhancing})
    regions = np.zeros((len(cases), 1, 1, len(names)), bool)
    for i, on in enumerate(cases):
        for name in on:
            regions[i, 0, 0, names.index(name)] = True
    np.testing.assert_array_equal(regions_to_labels(regions, layout)[:, 0, 0], list(cases.values()))


def test_output_regions_follow_the_layout():
    assert output_regions("brats2024", 0) == ("wt", "tc", "et", "rc")
    assert output_regions("brats2021", 0) == output_regions("brats2021", 3) == ("wt", "tc", "et")
    assert output_regions("msd", 1) == ("wt",)
    with pytest.raises(ValueError, match="out_channels=3 does not fit data.layout=brats2024.*WT, TC, ET, RC"):
        output_regions("brats2024", 3)


def test_cavity_labels_in_a_brats2023_dataset_say_to_use_brats2024():
    with pytest.raises(CaseError, match=r"label values \[4\].*use data=brats2024|data=brats2024.*4 = RC"):
        check_label_map("BraTS-GLI-00001-100", "seg.nii.gz", np.array([0.0, 1, 2, 3, 4]), "brats2023", "fix it")


def _write(path, data, affine, header=None):
    img = nib.Nifti1Image(data, affine, header=header)
    img.set_qform(affine, 1)
    img.set_sform(affine, 1)
    nib.save(img, str(path))


@pytest.mark.parametrize(
    "affine",
    [
        np.array([[-1, 0, 0, 0], [0, -1, 0, 239], [0, 0, 1, 0], [0, 0, 0, 1.0]]),  # BraTS LPS
        np.array([[0, 0, 1.2, -10], [-0.9, 0, 0, 50], [0, 2.5, 0, 3], [0, 0, 0, 1.0]]),  # permuted, anisotropic
    ],
)
def test_prediction_nifti_round_trip_keeps_grid_and_header(tmp_path, affine):
    rng = np.random.default_rng(1)
    label = rng.integers(0, 3, size=(13, 11, 9)).astype(np.uint8)
    _write(tmp_path / "ref.nii.gz", label, affine)
    vol = load_volume(tmp_path / "ref.nii.gz", "c", dtype=np.uint8)
    assert nib.aff2axcodes(vol.affine_ras) == ("R", "A", "S")
    save_mask(vol.data, vol.original_affine, vol.original_header, tmp_path / "pred.nii.gz")
    ref, out = nib.load(tmp_path / "ref.nii.gz"), nib.load(tmp_path / "pred.nii.gz")
    assert out.shape == ref.shape
    np.testing.assert_array_equal(out.affine, ref.affine)
    assert nib.aff2axcodes(out.affine) == nib.aff2axcodes(ref.affine)
    np.testing.assert_array_equal(np.asanyarray(out.dataobj), label)
    for key in ref.header:
        np.testing.assert_array_equal(ref.header[key], out.header[key], err_msg=key)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def test_resampling_to_2mm_and_back_keeps_dice():
    x, y, z = np.mgrid[:120, :110, :90]
    mask = ((x - 60) / 22.0) ** 2 + ((y - 50) / 17.0) ** 2 + ((z - 44) / 14.0) ** 2 < 1  # tumour-sized ellipsoid
    down = resample(mask.astype(np.uint8), (1, 1, 1), 2.0, interpolation="nearest")
    assert down.shape == (60, 55, 45)
    back = resample(down.astype(np.float32), (2, 2, 2), (1, 1, 1), out_shape=mask.shape) > 0.5
    dice = 2 * (back & mask).sum() / (back.sum() + mask.sum())
    assert dice >= 0.95, dice


def test_invert_to_native_puts_regions_back(synthetic_root, tmp_path):
    ds = prepare_dataset(data_config(synthetic_root["brats2021"], "brats2021", tmp_path), TINY, progress=False)
    entry = ds.entries[0]
    meta = entry.meta
    regions = np.load(entry.regions_path).astype(np.float32)
    native = invert_to_native(regions, meta["record"]) > 0.5
    ref = load_volume(meta["label"], entry.case_id, dtype=np.uint8).data
    ref_wt = labels_to_regions(ref, "brats2021")[..., 0].astype(bool)
    assert native.shape[:3] == ref.shape
    dice = 2 * (native[..., 0] & ref_wt).sum() / (native[..., 0].sum() + ref_wt.sum())
    assert dice > 0.85, dice  # 4 mm nearest then back: coarse, but on the right place


def test_prepare_writes_cache_and_split(synthetic_root, tmp_path):
    cfg = data_config(synthetic_root["msd"], "msd", tmp_path)
    ds = prepare_dataset(cfg, TINY, progress=False)
    assert len(ds.entries) == 3 and ds.n_built == 3
    for e in ds.entries:
        image = np.load(e.image_path, mmap_mode="r")
        regions = np.load(e.regions_path, mmap_mode="r")
        assert image.shape == (48, 56, 40, 4) and image.dtype == np.float16
        assert regions.shape == (48, 56, 40, 3) and regions.dtype == np.uint8
        brain = np.any(image != 0, axis=-1)
        # z-scored over the brain
        assert abs(float(image[..., 0][brain].astype(np.float32).mean())) < 0.05
        assert regions[..., 0].sum() > 0
    split = json.loads(ds.split_path.read_text())
    assert sorted(split["train"] + split["val"] + split["test"]) == [e.case_id for e in ds.entries]
    assert split["test"] and split["val"]


def test_cache_rebuilds_only_the_changed_case(dataset_copy, tmp_path):
    root = dataset_copy("brats2021")
    cfg = data_config(root, "brats2021", tmp_path)
    first = prepare_dataset(cfg, TINY, progress=False)
    assert first.n_built == 3
    stamps = {e.case_id: (e.path / "meta.json").stat().st_mtime_ns for e in first.entries}
    again = prepare_dataset(cfg, TINY, progress=False)
    assert again.n_built == 0
    changed = first.entries[1].case_id
    flair = root / changed / f"{changed}_flair.nii.gz"
    st = flair.stat()
    os.utime(flair, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    third = prepare_dataset(cfg, TINY, progress=False)
    assert third.n_built == 1
    for e in third.entries:
        same = (e.path / "meta.json").stat().st_mtime_ns == stamps[e.case_id]
        assert same == (e.case_id != changed)
    # a changed preprocessing config is a separate cache (per resolution) and rebuilds there
    other = prepare_dataset(cfg, type(TINY)(name="tiny", spacing_mm=4.0, shape=[48, 56, 48]), progress=False)
    assert other.n_built == 3


def test_split_is_deterministic_and_disjoint():
    ids = [f"case{i:03d}" for i in range(40)]
    a = make_split(ids, 0.15, 0.2, seed=3)
    b = make_split(list(reversed(ids)), 0.15, 0.2, seed=3)
    assert a == b
    assert len(a["test"]) == 8 and len(a["val"]) == 6 and len(a["train"]) == 26
    assert not set(a["test"]) & (set(a["train"]) | set(a["val"]))
    c = make_split(ids, 0.15, 0.2, seed=4)
    assert c["test"] != a["test"]
    # adding a case keeps most of the test set where it was
    d = make_split(ids + ["case999"], 0.15, 0.2, seed=3)
    assert len(set(d["test"]) & set(a["test"])) >= 7


def _strata(n: int, without_et: int, empty: int = 0) -> dict[str, str]:
    ids = [f"case{i:03d}" for i in range(n)]
    return {c: "none" if i < empty else "WT TC" if i < empty + without_et else "WT TC ET" for i, c in enumerate(ids)}


@pytest.mark.parametrize(
    "n, without_et, empty", [(40, 8, 0), (40, 3, 0), (12, 3, 0), (40, 8, 2), (1251, 150, 4), (5, 1, 0)]
)
def test_stratified_split_gives_val_and_test_each_groups_share(n, without_et, empty):
    strata = _strata(n, without_et, empty)
    ids = sorted(strata)
    plain = make_split(ids, 0.15, 0.2, seed=3)
    split = make_split(ids, 0.15, 0.2, seed=3, strata=strata)
    for part in ("train", "val", "test"):  # the same sizes as the random split's
        assert len(split[part]) == len(plain[part]), part
    assert sorted(split["train"] + split["val"] + split["test"]) == ids
    for group in set(strata.values()):
        members = {c for c, g in strata.items() if g == group}
        counts = {part: len(members & set(split[part])) for part in ("train", "val", "test")}
        assert counts == split["strata"][group]
        if len(members) >= 3:  # a group of three or more is in every part
            assert min(counts.values()) >= 1, (group, counts)
        for part in ("val", "test"):  # and in proportion: within one case of its share
            assert abs(counts[part] - len(split[part]) * len(members) / n) < 1 + 1e-9, (group, part, counts)
    assert make_split(list(reversed(ids)), 0.15, 0.2, seed=3, strata=strata) == split
    assert make_split(ids, 0.15, 0.2, seed=4, strata=strata)["test"] != split["test"]


def test_a_random_split_of_the_demo_can_leave_val_without_a_case_lacking_et():
    # why the split is stratified: 40 cases, 8 without enhancing tumour, 6 in val: a random split
    # leaves none of the 8 in val about one time in four (C(32,6)/C(40,6) = 0.24); a stratified one never
    strata = _strata(40, 8)
    unlucky = [
        s
        for s in range(20)
        if not {c for c, g in strata.items() if g == "WT TC"} & set(make_split(sorted(strata), 0.15, 0.2, s)["val"])
    ]
    assert unlucky  # some seeds do leave val without such a case
    for s in unlucky:
        val = make_split(sorted(strata), 0.15, 0.2, s, strata=strata)["val"]
        assert sum(strata[c] == "WT TC" for c in val) >= 1


def test_a_case_without_a_stratum_is_refused():
    with pytest.raises(ValueError, match=r"case001.*no stratum"):
        make_split(["case000", "case001"], 0.15, 0.2, seed=0, strata={"case000": "WT"})


def test_the_split_is_stratified_by_the_regions_each_cached_case_holds(synthetic_root, tmp_path):
    ds = prepare_dataset(data_config(synthetic_root["brats2021"], "brats2021", tmp_path), TINY, progress=False)
    assert ds.split_path.name == "split_seed0_stratified.json"
    for e in ds.entries:
        regions = np.load(e.regions_path)
        expected = {name: int(regions[..., i].sum()) for i, name in enumerate(("wt", "tc", "et"))}
        assert e.meta["region_voxels"] == expected  # recorded when the entry was built
    strata = compute_strata(ds.entries)
    assert sum(ds.split["strata"][g][p] for g in ds.split["strata"] for p in ("train", "val", "test")) == 3
    assert set(ds.split["strata"]) == set(strata.values())
    # an entry cached before the count was recorded is counted from regions.npy once and keeps it
    entry = ds.entries[0]
    meta = json.loads((entry.path / "meta.json").read_text())
    counts = meta.pop("region_voxels")
    (entry.path / "meta.json").write_text(json.dumps(meta))
    assert region_voxels(entry) == counts
    assert json.loads((entry.path / "meta.json").read_text())["region_voxels"] == counts
    assert load_entry_meta(entry.path)["fingerprint"] == meta["fingerprint"]  # still a valid entry
    again = prepare_dataset(data_config(synthetic_root["brats2021"], "brats2021", tmp_path), TINY, progress=False)
    assert again.n_built == 0 and again.split == ds.split
    plain = prepare_dataset(
        data_config(synthetic_root["brats2021"], "brats2021", tmp_path, stratify=False), TINY, progress=False
    )
    assert plain.split_path.name == "split_seed0.json" and "strata" not in plain.split


def test_incomplete_entry_is_never_read(synthetic_root, tmp_path):
    cfg = data_config(synthetic_root["brats2021"], "brats2021", tmp_path)
    ds = prepare_dataset(cfg, TINY, progress=False)
    entry = ds.entries[0]
    (entry.path / "meta.json").unlink()  # as if the process died before the entry was complete
    assert load_entry_meta(entry.path) is None
    again = prepare_dataset(cfg, TINY, progress=False)
    assert again.n_built == 1
    assert load_entry_meta(entry.path)["case_id"] == entry.case_id
