"""Each bad input of the data layer: a clear error naming case, file and fix; nothing lost."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from brats_seg.data.cache import load_entry_meta
from brats_seg.data.dataset import PreparationFailed, dataset_cache_dir, prepare_dataset
from brats_seg.data.errors import DataError, DatasetError
from tests.conftest import TINY, data_config

REPO = Path(__file__).resolve().parents[2]


def _case_dirs(root):
    return sorted(p for p in root.iterdir() if p.is_dir())


def _rewrite(path, fn):
    """Rewrite a NIfTI file with fn(data, affine) -> (data, affine)."""
    img = nib.load(str(path))
    data, affine = fn(np.asanyarray(img.dataobj).copy(), img.affine.copy())
    out = nib.Nifti1Image(data, affine)
    nib.save(out, str(path))


def _missing_modality(root):
    case = _case_dirs(root)[0]
    (case / f"{case.name}_t1ce.nii.gz").unlink()
    return case.name, f"{case.name}_t1ce.nii.gz", "missing t1ce modality"


def _missing_label(root):
    case = _case_dirs(root)[0]
    (case / f"{case.name}_seg.nii.gz").unlink()
    return case.name, f"{case.name}_seg.nii.gz", "missing label"


def _truncated(root):
    case = _case_dirs(root)[0]
    p = case / f"{case.name}_t2.nii.gz"
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 3])
    return case.name, p.name, "cannot be read as NIfTI"


def _not_nifti(root):
    case = _case_dirs(root)[0]
    p = case / f"{case.name}_flair.nii.gz"
    p.write_bytes(b"this is not a NIfTI file at all")
    return case.name, p.name, "cannot be read as NIfTI"


def _shape_mismatch(root):
    case = _case_dirs(root)[0]
    p = case / f"{case.name}_t1.nii.gz"
    _rewrite(p, lambda d, a: (d[:-2], a))
    return case.name, p.name, "shape"


def _affine_mismatch(root):
    case = _case_dirs(root)[0]
    p = case / f"{case.name}_t2.nii.gz"

    def shift(d, a):
        a[0, 3] += 5.0
        return d, a

    _rewrite(p, shift)
    return case.name, p.name, "affine differs"


def _bad_label_value(root):
    case = _case_dirs(root)[0]
    p = case / f"{case.name}_seg.nii.gz"

    def add3(d, a):
        d[d == 2] = 3  # 3 is not a brats2021 label
        return d, a

    _rewrite(p, add3)
    return case.name, p.name, "label values [3]"


def _nan_voxels(root):
    case = _case_dirs(root)[0]
    p = case / f"{case.name}_flair.nii.gz"

    def nan(d, a):
        d = d.astype(np.float32)
        d[100, 100, 70] = np.nan
        d[101, 100, 70] = np.inf
        return d, a

    _rewrite(p, nan)
    return case.name, p.name, "2 voxels are NaN or Inf"


def _4d_where_3d(root):
    case = _case_dirs(root)[0]
    p = case / f"{case.name}_t1.nii.gz"
    _rewrite(p, lambda d, a: (np.stack([d, d], axis=-1), a))
    return case.name, p.name, "expected a 3D volume"


BRATS_CASES = {
    "missing_modality": _missing_modality,
    "missing_label": _missing_label,
    "truncated": _truncated,
    "not_nifti": _not_nifti,
    "shape_mismatch": _shape_mismatch,
    "affine_mismatch": _affine_mismatch,
    "label_outside_set": _bad_label_value,
    "nan_inf": _nan_voxels,
    "4d_where_3d": _4d_where_3d,
}


@pytest.mark.parametrize("name", sorted(BRATS_CASES))
def test_bad_case_is_reported_and_skippable(name, dataset_copy, tmp_path):
    root = dataset_copy("brats2021")
    case_id, filename, problem = BRATS_CASES[name](root)
    cfg = data_config(root, "brats2021", tmp_path)
    with pytest.raises(DataError) as err:
        prepare_dataset(cfg, TINY, progress=False)
    msg = str(err.value)
    assert case_id in msg and filename in msg and problem in msg, msg
    assert "data.on_error=skip" in msg  # says what to do
    good_ids = {p.name for p in _case_dirs(root)} - {case_id}
    cache = dataset_cache_dir(cfg) / "tiny"
    # nothing half-written: the bad case has no entry, the good ones have complete entries
    if name in ("missing_modality", "missing_label"):  # found by discovery, before any preprocessing
        assert not cache.exists()
    else:
        assert {p.name for p in cache.iterdir()} == good_ids
        assert all(load_entry_meta(cache / c) for c in good_ids)
    cfg.on_error = "skip"
    ds = prepare_dataset(cfg, TINY, progress=False)
    assert {e.case_id for e in ds.entries} == good_ids
    assert [cid for cid, _ in ds.skipped] == [case_id]


def test_failure_never_corrupts_another_entry(dataset_copy, tmp_path):
    root = dataset_copy("brats2021")
    cfg = data_config(root, "brats2021", tmp_path)
    ds = prepare_dataset(cfg, TINY, progress=False)
    before = {e.case_id: np.load(e.image_path).copy() for e in ds.entries}
    _truncated(root)  # now case 0 changes and breaks
    with pytest.raises(PreparationFailed):
        prepare_dataset(cfg, TINY, progress=False)
    for e in ds.entries[1:]:
        np.testing.assert_array_equal(np.load(e.image_path), before[e.case_id])
    # the broken case's old entry stays as it was, but it is stale and never handed out
    cfg.on_error = "skip"
    assert ds.entries[0].case_id not in {e.case_id for e in prepare_dataset(cfg, TINY, progress=False).entries}


def test_msd_3d_where_4d_expected(dataset_copy, tmp_path):
    root = dataset_copy("msd")
    img = sorted((root / "imagesTr").iterdir())[0]
    _rewrite(img, lambda d, a: (d[..., 0], a))
    with pytest.raises(PreparationFailed) as err:
        prepare_dataset(data_config(root, "msd", tmp_path), TINY, progress=False)
    assert img.name in str(err.value) and "expected a 4D image" in str(err.value)


@pytest.mark.parametrize(
    "content, problem",
    [(None, "dataset.json not found"), ("{not json", "is not valid JSON"), ('{"training": 3}', "'training' list")],
)
def test_msd_dataset_json_missing_or_malformed(dataset_copy, tmp_path, content, problem):
    root = dataset_copy("msd")
    if content is None:
        (root / "dataset.json").unlink()
    else:
        (root / "dataset.json").write_text(content)
    with pytest.raises(DatasetError) as err:
        prepare_dataset(data_config(root, "msd", tmp_path), TINY, progress=False)
    assert problem in str(err.value) and "dataset.json" in str(err.value)


def test_msd_path_escaping_root(dataset_copy, tmp_path):
    root = dataset_copy("msd")
    meta = json.loads((root / "dataset.json").read_text())
    meta["training"][0]["image"] = "../../etc/passwd"
    (root / "dataset.json").write_text(json.dumps(meta))
    with pytest.raises(DatasetError) as err:
        prepare_dataset(data_config(root, "msd", tmp_path), TINY, progress=False)
    assert "escapes the dataset root" in str(err.value) and "../../etc/passwd" in str(err.value)


def test_zero_cases_found_suggests_the_layout(dataset_copy, tmp_path):
    root = dataset_copy("brats2023")
    with pytest.raises(DatasetError) as err:
        prepare_dataset(data_config(root, "brats2021", tmp_path), TINY, progress=False)
    assert "no cases found" in str(err.value) and "data=brats2023" in str(err.value)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DatasetError, match="no cases found"):
        prepare_dataset(data_config(empty, "brats2021", tmp_path), TINY, progress=False)


def test_brain_box_larger_than_shape(synthetic_root, tmp_path):
    small = type(TINY)(name="small", spacing_mm=4.0, shape=[16, 16, 16])
    cfg = data_config(synthetic_root["brats2023"], "brats2023", tmp_path)
    with pytest.raises(PreparationFailed) as err:
        prepare_dataset(cfg, small, progress=False)
    assert "brain bounding box" in str(err.value) and "resolution.shape" in str(err.value)
    cfg.allow_crop = True  # asked for: cut with a warning
    ds = prepare_dataset(cfg, small, progress=False)
    assert all(max(e.meta["record"]["cropped_voxels"]) > 0 for e in ds.entries)


def test_data_root_does_not_exist(tmp_path):
    with pytest.raises(DatasetError, match="does not exist"):
        prepare_dataset(data_config(tmp_path / "nope", "brats2021", tmp_path), TINY, progress=False)


def test_cli_exits_nonzero_with_message_and_skip_lists_cases(dataset_copy, tmp_path):
    root = dataset_copy("brats2021")
    case_id, _, _ = _bad_label_value(root)
    base = [
        sys.executable,
        str(REPO / "scripts/prepare_data.py"),
        "data=brats2021",
        f"data.root={root}",
        f"data.cache_dir={tmp_path / 'cache'}",
        "resolution=tiny",
        "data.num_workers=2",
    ]
    bad = subprocess.run(base, capture_output=True, text=True, cwd=tmp_path)
    assert bad.returncode != 0
    assert case_id in bad.stderr and "label values [3]" in bad.stderr and "Traceback" not in bad.stderr
    ok = subprocess.run(base + ["data.on_error=skip"], capture_output=True, text=True, cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert "prepared 2 cases" in ok.stdout and "skipped 1 case" in ok.stdout and case_id in ok.stdout
