"""scripts/demo_seeds.py's reading of an arm: the means it reports and the ET errors it names come
from the evaluation's files, for the test split and for the unseen set alike."""

from __future__ import annotations

import csv
import json

import pytest

from brats_seg.evaluation.studies.demo_seeds import _scores, compute_means, format_demo_seeds, train_overrides
from brats_seg.run_dir import RunFolder

REGIONS = ("wt", "tc", "et")


def _write_eval(folder: RunFolder, split: str, cases: dict[str, tuple[int, int]], dice_et: float) -> None:
    """``cases``: case id -> (ET lesions in the reference, ET lesions predicted)."""
    out = folder.eval_dir(split)
    out.mkdir(parents=True)
    summary = {
        "n_cases": len(cases),
        "postprocess": {
            "described": "ET < 200 mm3 in total relabelled",
            "unprocessed_mean": {"dice_et": dice_et - 0.1},
        },
    }
    for m in ("dice", "lesion23_dice"):
        for r in REGIONS:
            summary[f"{m}_{r}"] = {"mean": dice_et if r == "et" else 0.9}
    folder.summary_json(split).write_text(json.dumps(summary))
    with open(folder.metrics_csv(split), "w", newline="") as f:
        writer = csv.DictWriter(f, ["case_id", "lesions_ref_et", "lesions_pred_et"])
        writer.writeheader()
        for case, (ref, pred) in cases.items():
            writer.writerow({"case_id": case, "lesions_ref_et": ref, "lesions_pred_et": pred})


def test_an_arms_scores_name_false_and_missed_et_for_each_set(tmp_path):
    folder = RunFolder(tmp_path)
    _write_eval(folder, "test", {"a": (1, 1), "b": (0, 2), "c": (0, 0)}, 0.8)
    _write_eval(folder, "all@synthetic_heldout", {"a": (2, 0), "b": (0, 0)}, 0.7)
    test, held = _scores(folder, "test"), _scores(folder, "all@synthetic_heldout")
    assert (test["et_false"], test["et_missed"], test["without_et"], test["n_cases"]) == (["b"], [], 2, 3)
    assert (held["et_false"], held["et_missed"], held["without_et"]) == ([], ["a"], 1)
    assert test["dice_et"] == 0.8 and test["dice_et_unprocessed"] == pytest.approx(0.7)
    assert test["dice_wt_unprocessed"] == 0.9  # a region post-processing did not change: as after


def test_means_over_seeds_and_the_tables_of_both_sets():
    runs = [
        {
            "seed": s,
            "dice_et": v,
            "train_s": 60.0,
            "n_cases": 8,
            "without_et": 2,
            "et_false": [],
            "et_missed": [],
            **{f"{m}_{r}{u}": v for m in ("dice", "lesion23_dice") for r in REGIONS for u in ("", "_unprocessed")},
        }
        for s, v in ((0, 0.8), (1, 0.9), (2, 0.7))
    ]
    means = compute_means(runs)
    assert means["dice_et"]["mean"] == pytest.approx(0.8) and means["dice_et"]["std"] == pytest.approx(0.1)
    for run in runs:
        run["heldout"] = {**run, "set": "synthetic_heldout", "n_cases": 40, "without_et": 9}
    text = format_demo_seeds(
        {
            "cpu": "AMD EPYC",
            "cpu_kind": "avx512",
            "overrides": [],
            "runs": runs,
            "means": means,
            "heldout_means": compute_means([r["heldout"] for r in runs]),
        }
    )
    assert "test split (8 cases, 2 without ET)" in text and "synthetic_heldout: 40 cases (9 without ET)" in text
    assert text.count("| mean ± std | 0.800 ± 0.100") == 2


def test_the_driver_keeps_its_own_keys_and_refuses_what_each_arm_sets():
    assert train_overrides(["seeds=[0,1]", "out=x", "heldout=", "trainer.epochs=2"]) == ["trainer.epochs=2"]
    with pytest.raises(ValueError, match="each arm sets trainer.seed itself"):
        train_overrides(["trainer.seed=3"])
