"""Cross-validation folds and split files (issue 47): data.fold, data.num_folds, data.split_file."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from brats_seg.config import DataConfig
from brats_seg.data.dataset import prepare_dataset, run_split
from brats_seg.data.folds import SplitFileError, check_fold, make_folds, read_split_file
from tests.conftest import TINY, data_config

REPO = Path(__file__).resolve().parents[2]
IDS = [f"BraTS2021_{i:05d}" for i in range(40)]
# a quarter without enhancing tumour, as in the generated demo
STRATA = {c: ("WT TC" if i % 4 == 0 else "WT TC ET") for i, c in enumerate(IDS)}


@pytest.mark.parametrize("n_cases,n_folds", [(40, 5), (23, 5), (7, 3), (2, 2)])
def test_folds_partition_the_cases_with_sizes_within_one(n_cases, n_folds):
    ids = IDS[:n_cases]
    folds = make_folds(ids, n_folds, seed=0)
    assert len(folds) == n_folds
    vals = [c for f in folds for c in f["val"]]
    assert sorted(vals) == sorted(ids)  # each case validated on exactly once
    sizes = [len(f["val"]) for f in folds]
    assert max(sizes) - min(sizes) <= 1
    for f in folds:
        assert not set(f["train"]) & set(f["val"])
        assert sorted(f["train"] + f["val"]) == sorted(ids)


def test_stratified_folds_give_each_fold_its_share_of_each_group():
    folds = make_folds(IDS, 5, seed=0, strata=STRATA)
    for f in folds:
        groups = Counter(STRATA[c] for c in f["val"])
        assert groups == {"WT TC": 2, "WT TC ET": 6}  # 10 and 30 cases over 5 folds
    plain = make_folds(IDS, 5, seed=0)
    assert any(Counter(STRATA[c] for c in f["val"])["WT TC"] != 2 for f in plain)


def test_folds_are_a_function_of_seed_and_ids_and_adding_a_case_moves_few():
    a, b = make_folds(IDS, 5, 0), make_folds(list(reversed(IDS)), 5, 0)
    assert a == b
    assert make_folds(IDS, 5, 1) != a
    grown = make_folds([*IDS, "BraTS2021_99999"], 5, 0)
    moved = sum(
        1
        for c in IDS
        if next(i for i, f in enumerate(a) if c in f["val"]) != next(i for i, f in enumerate(grown) if c in f["val"])
    )
    assert moved <= len(IDS) // 2  # a dealt order: cases after the new one shift by one fold


@pytest.mark.parametrize("n_folds,n_cases,match", [(1, 10, "at least 2"), (5, 4, "4 training cases cannot make")])
def test_too_few_folds_or_cases_are_refused(n_folds, n_cases, match):
    with pytest.raises(SplitFileError, match=match):
        make_folds(IDS[:n_cases], n_folds, 0)


@pytest.mark.parametrize("fold,expect", [("0", 0), ("4", 4), (3, 3), ("all", None), ("ALL", None)])
def test_check_fold_accepts_indices_and_all(fold, expect):
    assert check_fold(fold, 5) == expect


@pytest.mark.parametrize("fold", ["5", "-1", "x", "1.5"])
def test_a_fold_out_of_range_is_refused_with_the_choices(fold):
    with pytest.raises(SplitFileError, match=rf"data.fold={fold}: the split has 5 folds, choose 0..4 or all"):
        check_fold(fold, 5)


def _data(tmp_path, **kw) -> DataConfig:
    return replace(DataConfig(), root=str(tmp_path / "none"), cache_dir=str(tmp_path / "cache"), **kw)


def test_a_fold_keeps_the_seeded_test_split_and_partitions_the_rest(tmp_path):
    plain, plain_path, _ = run_split(_data(tmp_path), IDS, STRATA, tmp_path)
    seen_val = []
    for k in range(5):
        split, path, writes = run_split(_data(tmp_path, fold=str(k)), IDS, STRATA, tmp_path)
        assert split["test"] == plain["test"]  # test cases stay out of every fold
        assert split["fold"] == k and split["n_folds"] == 5
        assert sorted(split["train"] + split["val"]) == sorted(plain["train"] + plain["val"])
        seen_val += split["val"]
        assert path.name == "folds_seed0_k5_stratified.json"
        assert [p for p, _ in writes] == [plain_path, path]
        record = writes[1][1]
        assert record["kind"] == "brats_seg_folds" and record["test"] == plain["test"] and len(record["folds"]) == 5
    assert sorted(seen_val) == sorted(plain["train"] + plain["val"])


def test_fold_all_trains_on_every_training_case_and_says_its_val_was_trained_on(tmp_path):
    plain, _, _ = run_split(_data(tmp_path), IDS, STRATA, tmp_path)
    split, _, _ = run_split(_data(tmp_path, fold="all"), IDS, STRATA, tmp_path)
    fold0, _, _ = run_split(_data(tmp_path, fold="0"), IDS, STRATA, tmp_path)
    assert split["fold"] == "all" and split["val_trained_on"] is True
    assert sorted(split["train"]) == sorted(plain["train"] + plain["val"])
    assert split["val"] == fold0["val"] and set(split["val"]) <= set(split["train"])
    assert split["test"] == plain["test"]


def _write(tmp_path, name, obj) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(obj))
    return path


def test_nnunet_splits_final_is_read_and_unnamed_cases_are_test(tmp_path):
    pool, test = IDS[:32], IDS[32:]
    folds = make_folds(pool, 5, 7)
    path = _write(tmp_path, "splits_final.json", folds)  # nnU-Net's shape: a list of {train, val}
    split, got_path, writes = run_split(_data(tmp_path, split_file=str(path), fold="2"), IDS, None, tmp_path)
    assert got_path == path and writes == []  # the user's file is not rewritten
    assert split["train"] == folds[2]["train"] and split["val"] == folds[2]["val"]
    assert split["test"] == sorted(test) and split["format"] == "nnunet" and split["split_file"] == str(path)


def test_a_plain_split_file_is_used_as_it_is_or_folded(tmp_path):
    given = {"train": IDS[:30], "val": IDS[30:34], "test": IDS[34:]}
    path = _write(tmp_path, "split.json", given)
    split, _, _ = run_split(_data(tmp_path, split_file=str(path)), IDS, STRATA, tmp_path)
    assert {k: split[k] for k in ("train", "val", "test")} == given
    fold, _, _ = run_split(_data(tmp_path, split_file=str(path), fold="1", num_folds=4), IDS, STRATA, tmp_path)
    assert fold["test"] == given["test"] and fold["n_folds"] == 4
    assert sorted(fold["train"] + fold["val"]) == sorted(given["train"] + given["val"])


def test_a_folds_file_written_here_reads_back_as_the_same_folds(tmp_path):
    split, _, writes = run_split(_data(tmp_path, fold="3"), IDS, STRATA, tmp_path)
    written = _write(tmp_path, "shipped.json", writes[1][1])
    again, _, _ = run_split(_data(tmp_path, split_file=str(written), fold="3"), IDS, None, tmp_path)
    assert {k: again[k] for k in ("train", "val", "test")} == {k: split[k] for k in ("train", "val", "test")}


BAD = [
    ("missing", None, "no such file"),
    ("notjson", "{", "cannot be read as JSON"),
    ("shape", {"cases": []}, "is not a split file"),
    ("unknown", {"train": IDS[:5] + ["BraTS2021_77777"], "val": IDS[5:8], "test": IDS[8:]}, "1 case.*BraTS2021_77777"),
    (
        "trainval",
        {"train": IDS[:10], "val": IDS[9:12], "test": IDS[12:]},
        "both in 'train' and in 'val': BraTS2021_00009",
    ),
    (
        "overlap",
        [{"train": IDS[5:20], "val": IDS[:5]}, {"train": IDS[4:20], "val": IDS[:4] + ["BraTS2021_00020"]}],
        "validated on in fold 0 and in fold 1",
    ),
    (
        "testinfold",
        {"test": IDS[:3], "folds": [{"train": IDS[2:10], "val": IDS[10:12]}, {"train": IDS[10:12], "val": IDS[3:10]}]},
        "fold 0 uses test case",
    ),
    ("onefold", [{"train": IDS[:5], "val": IDS[5:8]}], "holds 1 fold"),
]


@pytest.mark.parametrize("name,content,match", BAD, ids=[b[0] for b in BAD])
def test_bad_split_files_are_refused_naming_the_file(tmp_path, name, content, match):
    path = tmp_path / f"{name}.json"
    if content is not None:
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(SplitFileError, match=match) as err:
        read_split_file(path, IDS)
    assert str(path) in str(err.value)


def test_a_folds_file_without_data_fold_asks_for_one(tmp_path):
    path = _write(tmp_path, "splits_final.json", make_folds(IDS, 5, 0))
    with pytest.raises(SplitFileError, match=r"holds 5 folds: choose one with data.fold=0..4 or all"):
        run_split(_data(tmp_path, split_file=str(path)), IDS, None, tmp_path)


def test_prepare_dataset_writes_the_folds_file_and_the_fold_split(synthetic_root, tmp_path):
    # three cases: the seeded split keeps one for test, two folds over the other two
    cfg = replace(data_config(synthetic_root["brats2021"], "brats2021", tmp_path), fold="1", num_folds=2)
    ds = prepare_dataset(cfg, TINY, progress=False)
    assert ds.split["fold"] == 1 and len(ds.split["train"]) == 1 and len(ds.split["val"]) == 1
    record = json.loads(ds.split_path.read_text())
    assert ds.split_path.name == "folds_seed0_k2_stratified.json" and record["kind"] == "brats_seg_folds"
    assert record["folds"][1]["val"] == ds.split["val"] and record["test"] == ds.split["test"]
    assert [e.case_id for e in ds.entries_of("val")] == ds.split["val"]


def test_a_bad_fold_is_refused_before_the_cache_is_written(synthetic_root, tmp_path):
    cfg = replace(data_config(synthetic_root["brats2021"], "brats2021", tmp_path), fold="2", num_folds=2)
    with pytest.raises(SplitFileError, match="data.fold=2: the split has 2 folds"):
        prepare_dataset(cfg, TINY, progress=False)
    assert not any(p.is_file() for p in (tmp_path).rglob("*.npy"))


def test_prepare_data_script_refuses_a_bad_split_file_in_one_error_line(synthetic_root, tmp_path):
    bad = _write(tmp_path, "splits_final.json", [{"train": ["BraTS2021_00000"], "val": ["nope"]}] * 2)
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "prepare_data.py"),
            "data=brats2021",  # data=synthetic would generate the missing cases of its 40 into the shared root
            f"data.root={synthetic_root['brats2021']}",
            f"data.cache_dir={tmp_path / 'cache'}",
            "resolution=tiny",
            f"data.split_file={bad}",
            "data.fold=0",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and str(bad) in errors[0] and "nope" in errors[0], proc.stderr[-2000:]
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").rglob("*.npy"))
