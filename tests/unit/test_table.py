"""Tests of brats_seg.evaluation.scoring.table: columns, CSV cells (373 / empty), summary, the printed table."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest

from brats_seg.evaluation.scoring.table import (
    INF_DISTANCE_MM,
    METRIC_NAMES,
    MetricsTable,
    format_summary_table,
    metric_columns,
)

REGIONS = ("wt", "tc", "et")


def _filled_table(n_cases=4, seed=0, regions=REGIONS):
    rng = np.random.default_rng(seed)
    table = MetricsTable(regions)
    expected = {}
    for i in range(n_cases):
        metrics = {c: float(rng.uniform(0, 10)) for c in metric_columns(regions)[1:]}
        table.add(f"case_{i:03d}", metrics)
        expected[f"case_{i:03d}"] = metrics
    return table, expected


def test_columns_are_grouped_by_metric_then_region_legacy_first():
    columns = metric_columns(("wt", "tc", "et", "rc"))
    assert columns[:13] == (
        "case_id",
        "dice_wt",
        "dice_tc",
        "dice_et",
        "dice_rc",
        "hd95_wt",
        "hd95_tc",
        "hd95_et",
        "hd95_rc",
        "sens_wt",
        "sens_tc",
        "sens_et",
        "sens_rc",
    )
    assert len(columns) == 1 + 4 * len(METRIC_NAMES)
    for name in (
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
    ):
        assert f"{name}_rc" in columns


def test_csv_rows_at_full_precision_and_no_temp_file_left(tmp_path):
    table, expected = _filled_table()
    path = table.save_csv(tmp_path / "eval" / "test" / "metrics.csv")
    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    assert tuple(rows[0]) == table.columns
    for row in rows[1:]:
        assert [float(v) for v in row[1:]] == [expected[row[0]][c] for c in table.columns[1:]]
    assert sorted(p.name for p in path.parent.iterdir()) == ["metrics.csv"]


def test_infinite_distances_are_373_and_undefined_values_empty_cells(tmp_path):
    table = MetricsTable(("wt",))
    row = dict.fromkeys(table.columns[1:], 0.5)
    table.add("a", {**row, "lesion_hd95_wt": math.inf, "lesion_dice_wt": math.nan, "lesion23_hd95_wt": 374.0})
    table.add("b", {**row, "lesion_hd95_wt": 10.0})
    path = table.save_csv(tmp_path / "metrics.csv")
    rows = {r["case_id"]: r for r in csv.DictReader(path.open())}
    assert rows["a"]["lesion_hd95_wt"] == "373" and rows["a"]["lesion_dice_wt"] == ""
    assert rows["a"]["lesion23_hd95_wt"] == "374.0"
    summary = table.summary()
    assert summary["lesion_hd95_wt"] == {
        "mean": (373 + 10) / 2,
        "median": (373 + 10) / 2,
        "std": (373 - 10) / 2,
        "n": 2,
        "n_inf": 1,
    }
    assert summary["lesion_dice_wt"]["n"] == 1 and summary["lesion_dice_wt"]["mean"] == 0.5
    assert INF_DISTANCE_MM == 373.0


def test_summary_against_numpy_and_json_round_trip(tmp_path):
    table, expected = _filled_table(n_cases=5)
    summary = table.summary()
    assert summary["n_cases"] == 5
    for c in table.columns[1:]:
        v = np.array([expected[k][c] for k in expected])
        assert summary[c]["mean"] == pytest.approx(np.mean(v))
        assert summary[c]["median"] == pytest.approx(np.median(v))
        assert summary[c]["std"] == pytest.approx(np.std(v))
        assert summary[c]["n"] == 5 and summary[c]["n_inf"] == 0
    path = table.save_summary_json(tmp_path / "summary.json")
    assert json.loads(path.read_text()) == summary


def test_csv_round_trip_keeps_undefined_cells(tmp_path):
    table, _ = _filled_table(regions=("wt", "tc", "et", "rc"))
    table.add("empty", dict.fromkeys(table.columns[1:], math.nan))
    loaded = MetricsTable.load_csv(table.save_csv(tmp_path / "metrics.csv"))
    assert loaded.case_ids == table.case_ids and loaded.regions == table.regions
    assert json.dumps(loaded.summary()) == json.dumps(table.summary())


def test_bad_cases_are_refused():
    table = MetricsTable(("wt",))
    good = dict.fromkeys(table.columns[1:], 1.0)
    table.add("a", good)
    with pytest.raises(ValueError, match="'a' is already"):
        table.add("a", good)
    with pytest.raises(ValueError, match=r"extra \['dice_tc'\]"):
        table.add("b", {**good, "dice_tc": 1.0})
    with pytest.raises(ValueError, match=r"missing \['dice_wt'\]"):
        table.add("c", {k: v for k, v in good.items() if k != "dice_wt"})
    with pytest.raises(ValueError, match="non-empty string"):
        table.add("", good)


def test_empty_table_summary_json(tmp_path):
    summary = json.loads(MetricsTable(("wt",)).save_summary_json(tmp_path / "summary.json").read_text())
    assert summary["n_cases"] == 0
    assert summary["dice_wt"] == {"mean": None, "median": None, "std": None, "n": 0, "n_inf": 0}


def test_printed_table_shows_the_ranked_metrics_per_region():
    table = MetricsTable(("wt", "et"))
    row = dict.fromkeys(table.columns[1:], 0.25)
    table.add("a", {**row, "lesion23_dice_wt": 0.75, "lesion_hd95_wt": math.inf, "nsd_et": math.nan})
    text = format_summary_table(table.summary(), ("wt", "et"))
    lines = text.splitlines()
    assert "BraTS 2023-24 rank" in lines[0] and "lesion-wise (2025+)" in lines[0]
    wt = next(line for line in lines if line.startswith("WT")).split()
    et = next(line for line in lines if line.startswith("ET")).split()
    assert wt[3] == "0.750" and wt[7] == "373.0*"  # the BraTS 2023 Dice; the infinite lesion HD95
    assert et[8] == "n/a"  # global NSD undefined for every case
