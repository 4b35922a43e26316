"""Post-processing rules (brats_seg.evaluation.postprocess): what they do to a label map, how they
are read back, and how they are chosen on validation cases."""

from __future__ import annotations

import numpy as np
import pytest

from brats_seg.evaluation import postprocess as pp_module
from brats_seg.evaluation.postprocess import PostprocessError, PostProcessing, ValidationCase, choose_postprocessing

ED, NCR, ET = 2, 1, 4  # brats2021


def _box(labels: np.ndarray, corner, size, value) -> None:
    x, y, z = corner
    labels[x : x + size[0], y : y + size[1], z : z + size[2]] = value


def _tumour() -> np.ndarray:
    """A tumour (edema 10^3 with a 6^3 core holding a 4^3 enhancing part) and stray components."""
    labels = np.zeros((40, 40, 40), np.uint8)
    _box(labels, (2, 2, 2), (10, 10, 10), ED)
    _box(labels, (4, 4, 4), (6, 6, 6), NCR)
    _box(labels, (5, 5, 5), (4, 4, 4), ET)
    _box(labels, (30, 30, 30), (2, 2, 2), ED)  # a stray WT component of 8 voxels
    _box(labels, (20, 30, 5), (3, 3, 3), NCR)  # a stray core component (27 voxels, WT and TC)
    _box(labels, (20, 5, 30), (1, 1, 2), ET)  # a stray ET voxel pair: WT, TC and ET
    return labels


def test_small_components_leave_their_region_and_every_region_inside_it():
    labels = _tumour()
    out = PostProcessing({"wt": 10}).apply(labels, "brats2021", (1, 1, 1))
    assert (out[30:32, 30:32, 30:32] == 0).all() and (out[20, 5, 30:32] == 0).all()  # WT < 10 mm3: background
    assert (out[20:23, 30:33, 5:8] == NCR).all()  # 27 voxels: kept
    assert np.array_equal(out[:15, :15, :15], labels[:15, :15, :15])  # the tumour untouched
    out = PostProcessing({"tc": 30}).apply(labels, "brats2021", (1, 1, 1))
    assert (out[20:23, 30:33, 5:8] == ED).all()  # a core component -> edema: still WT
    assert (out[20, 5, 30:32] == ED).all()  # the ET pair is a TC component too (2 voxels): its ET goes with it
    out = PostProcessing({"et": 5}).apply(labels, "brats2021", (1, 1, 1))
    assert (out[20, 5, 30:32] == NCR).all()  # an ET component -> necrosis: still TC
    assert (out[5:9, 5:9, 5:9] == ET).all()


def test_volumes_are_in_mm3_of_the_voxel_size():
    labels = _tumour()
    # the 8-voxel WT component is 64 mm3 at 2 mm: kept by a 50 mm3 rule, removed at 1 mm
    assert PostProcessing({"wt": 50}).apply(labels, "brats2021", (2, 2, 2))[30, 30, 30] == ED
    assert PostProcessing({"wt": 50}).apply(labels, "brats2021", (1, 1, 1))[30, 30, 30] == 0


def test_a_small_total_et_is_relabelled_as_necrosis_and_tc_and_wt_do_not_change():
    labels = _tumour()
    et_total = int((labels == ET).sum())  # 64 + 2
    kept = PostProcessing({}, {"et": et_total}).apply(labels, "brats2021", (1, 1, 1))
    assert np.array_equal(kept, labels)  # not below
    out = PostProcessing({}, {"et": et_total + 1}).apply(labels, "brats2021", (1, 1, 1))
    assert not (out == ET).any()
    assert np.array_equal(out[labels == ET], np.full(et_total, NCR))
    assert np.array_equal(out > 0, labels > 0) and np.array_equal(np.isin(out, (1, 4)), np.isin(labels, (1, 4)))


def test_rules_hold_in_other_layouts_labels():
    labels = _tumour()
    as_2023 = np.select([labels == ED, labels == NCR, labels == ET], [2, 1, 3], 0).astype(np.uint8)
    out = PostProcessing({"wt": 10}, {"et": 100}).apply(as_2023, "brats2023", (1, 1, 1))
    assert not (out == 3).any() and (out[5:9, 5:9, 5:9] == 1).all() and out[30, 30, 30] == 0


def test_no_rule_is_the_identity_and_leaves_the_input_alone():
    labels = _tumour()
    copy = labels.copy()
    rules = PostProcessing({"wt": 0}, {"et": 0})
    assert rules.is_identity and np.array_equal(rules.apply(labels, "brats2021", (1, 1, 1)), labels)
    PostProcessing({"wt": 1000}, {"et": 1000}).apply(labels, "brats2021", (1, 1, 1))
    assert np.array_equal(labels, copy)


def test_rules_round_trip_and_bad_ones_are_refused_naming_the_file_and_key():
    rules = PostProcessing({"wt": 20.0, "et": 5.0}, {"et": 200.0})
    assert PostProcessing.from_rules(rules.rules(), "brats2021", "x.json") == rules
    for bad, match in [
        ({"min_component_mm3": {"nope": 1}}, "names region 'nope'"),
        ({"relabel_below_mm3": {"wt": 1}}, "'relabel_below_mm3' names region 'wt'"),
        ({"min_component_mm3": {"wt": -1}}, r"min_component_mm3\.wt' = -1"),
        ({"min_component_mm3": {"wt": True}}, "volume in mm3"),
        ({"min_component_mm3": {"wt": "10"}}, "volume in mm3"),
        ({"min_component_mm3": [1]}, "should map regions"),
    ]:
        with pytest.raises(PostprocessError, match=match) as e:
            PostProcessing.from_rules(bad, "brats2021", "/runs/a/postprocess.json")
        assert "/runs/a/postprocess.json" in str(e.value)


def _case(i: int, ref: np.ndarray, pred: np.ndarray) -> ValidationCase:
    return ValidationCase(f"BraTS2021_{i:05d}", pred, ref, (1.0, 1.0, 1.0))


def test_et_relabelling_is_chosen_below_the_smallest_true_enhancing_volume():
    cases = []
    ref, pred = np.zeros((2, 32, 32, 32), np.uint8)
    _box(ref, (4, 4, 4), (12, 12, 12), ED), _box(ref, (6, 6, 6), (8, 8, 8), NCR), _box(ref, (7, 7, 7), (6, 6, 6), ET)
    pred[:] = ref  # ET of 216 voxels, predicted
    cases.append(_case(0, ref, pred))
    for i, et_size in ((1, 4), (2, 5)):  # no ET in the reference, a false one of 64 / 125 voxels predicted
        ref, pred = np.zeros((2, 32, 32, 32), np.uint8)
        _box(ref, (4, 4, 4), (12, 12, 12), ED), _box(ref, (6, 6, 6), (8, 8, 8), NCR)
        pred[:] = ref
        _box(pred, (7, 7, 7), (et_size,) * 3, ET)
        cases.append(_case(i, ref, pred))
    rules, report = choose_postprocessing(cases, "brats2021", ("wt", "tc", "et"))
    assert 125 < rules.relabel_below_mm3["et"] <= 216  # both false ETs gone, the true one kept
    assert report["unprocessed"]["dice"]["et"] == pytest.approx(1 / 3)
    assert report["chosen"]["dice"]["et"] == 1.0 and report["chosen"]["lesion23_dice"]["et"] == 1.0
    assert report["chosen"]["dice"]["tc"] == report["unprocessed"]["dice"]["tc"] == 1.0  # relabelled, not removed
    step = report["steps"][0]
    assert step["rule"] == "relabel_below_mm3" and len(step["candidates"]) == len(pp_module.RELABEL_CANDIDATES_MM3)


def _strays_case() -> ValidationCase:
    """One tumour predicted exactly, ten tiny true lesions (40 voxels: under the 2023 scoring's 50 mm3)
    predicted exactly, and one 45-voxel false positive far away."""
    ref = np.zeros((64, 64, 64), np.uint8)
    _box(ref, (2, 2, 2), (10, 10, 10), ED)
    for k in range(10):  # 8 voxels apart: not merged by the 2023 scoring's dilation (3 each side)
        _box(ref, (16 + 10 * (k % 5), 20 + 12 * (k // 5), 40), (2, 4, 5), ED)
    pred = ref.copy()
    _box(pred, (50, 50, 2), (3, 3, 5), ED)
    return _case(7, ref, pred)


def test_a_component_rule_that_costs_legacy_dice_beyond_the_tolerance_is_not_chosen(monkeypatch):
    case = _strays_case()
    # Removing components under 50 mm3 takes the false positive away (lesion-wise Dice 0.5 -> 1) but
    # also the 400 true voxels of the tiny lesions (legacy Dice 0.98 -> 0.83): refused.
    rules, report = choose_postprocessing([case], "brats2021", ("wt",))
    assert rules.is_identity and report["chosen"] == report["unprocessed"]
    wt_step = report["steps"][0]
    refused = [c for c in wt_step["candidates"] if not c["allowed"]]
    assert refused and all(c["lesion23_dice_mean"] > 0.99 for c in refused)
    monkeypatch.setattr(pp_module, "LEGACY_TOLERANCE", 1.0)  # the guard is what kept it
    rules, _ = choose_postprocessing([case], "brats2021", ("wt",))
    assert rules.min_component_mm3 == {"wt": 50.0}


def test_the_smallest_of_equally_good_thresholds_is_chosen():
    ref = np.zeros((48, 48, 48), np.uint8)
    _box(ref, (2, 2, 2), (10, 10, 10), ED)
    pred = ref.copy()
    _box(pred, (30, 30, 30), (3, 3, 3), ED)  # a 27-voxel false positive: any threshold in (27, 1000] removes it
    rules, report = choose_postprocessing([_case(3, ref, pred)], "brats2021", ("wt",))
    assert rules.min_component_mm3 == {"wt": 50.0}
    assert report["chosen"]["lesion23_dice"]["wt"] == 1.0 and report["unprocessed"]["lesion23_dice"]["wt"] == 0.5


def test_a_cropped_case_scores_as_the_whole_volume():
    case = _strays_case()
    cropped = case.cropped()
    assert cropped.pred.size < case.pred.size
    whole = pp_module._Scorer([case], "brats2021", ("wt",))
    whole.cases = [case]  # not cropped
    whole.refs = [np.asarray(case.ref > 0)[..., None]]
    rules = PostProcessing({"wt": 50})
    assert pp_module._Scorer([case], "brats2021", ("wt",)).score(rules) == whole.score(rules)
