"""Ensembles of runs (issue 47): probabilities averaged, folds' val cases predicted out of fold,
members checked alike, the memory of the extra members planned, the CLI's runs=."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from brats_seg.config import ModelConfig, TrainConfig
from brats_seg.evaluation.inference.ensemble import ensemble_size, make_ensemble
from brats_seg.evaluation.inference.ensemble_model import Ensemble, member_for
from brats_seg.evaluation.inference.sliding import predict_volume
from brats_seg.lms.planner.inference import estimate_inference
from brats_seg.lms.planner.memory_model import memory_model_for
from brats_seg.lms.planner.workload import Workload
from brats_seg.run_dir import RunError, RunFolder
from tests.conftest import TINY
from tests.unit.test_evaluate import CLI_BACKEND, TINY_MODEL, case_ids, fixed_head_unet, make_run_dir, run_script


class ConstantModel:
    """A test double predicting ``value`` everywhere (``predict_volume`` uses input_shape, layers, call)."""

    layers = ()

    def __init__(self, value, regions: int = 3) -> None:
        self.input_shape = (None, *TINY.shape, 4)
        self.value, self.regions, self.calls = value, regions, 0

    def __call__(self, batch, training=False):
        self.calls += 1
        batch = np.asarray(batch)
        return np.full((*batch.shape[:4], self.regions), self.value, dtype=np.float32)


@pytest.mark.parametrize("mode", ["whole"])  # sliding windows call the members the same way (test doubles do not clone)
def test_an_ensemble_predicts_the_mean_of_its_members(mode):
    image = np.random.default_rng(0).normal(size=(*TINY.shape, 4)).astype(np.float16)
    members = [ConstantModel(0.9), ConstantModel(0.2), ConstantModel(0.4)]
    probs = predict_volume(Ensemble(members), image, mode=mode, window=[24, 24, 24], depth=2)
    assert probs.shape == (*TINY.shape, 3) and probs.dtype == np.float32
    np.testing.assert_allclose(probs, 0.5, rtol=1e-6)
    assert all(m.calls >= 1 for m in members)  # every member ran
    mirrored = predict_volume(Ensemble(members[:2]), image, mode=mode, window=[24, 24, 24], depth=2, mirror=True)
    np.testing.assert_allclose(mirrored, 0.55, rtol=1e-6)


def test_a_fold_ensemble_predicts_a_val_case_with_the_fold_that_held_it_out():
    a, b = ConstantModel(0.1), ConstantModel(0.9)
    ens = Ensemble([a, b], val_by={"c1": 0, "c2": 1})
    assert member_for(ens, "c1", "val") is a and member_for(ens, "c2", "val") is b
    assert member_for(ens, "c1", "test") is ens and member_for(ens, "c9", "val") is ens
    assert member_for(a, "c1", "val") is a  # a single run's model is itself


def test_the_ensembles_memory_holds_every_members_weights_and_one_more_probability_volume():
    cfg = TrainConfig(resolution=dataclasses.replace(TINY, shape=[96, 112, 80]), model=ModelConfig(depth=3))
    workload, mm = Workload.from_config(cfg), memory_model_for("CPU")
    one = estimate_inference(workload, mm, mirror=False)
    three = estimate_inference(workload, mm, mirror=False, members=3)
    from brats_seg.lms.planner.cost import compute_network_cost

    net = compute_network_cost(dataclasses.replace(workload, batch_size=1, input_batches=0, validates=False), mm)
    weights = net.persistent["weight_bytes"] + net.persistent["weight_cast_bytes"]
    probs = 96 * 112 * 80 * 3 * 4
    assert weights > 0
    assert three.forward_bytes - one.forward_bytes == pytest.approx(2 * weights + probs, abs=2)
    # on CPU the native grid's arrays come on top of the resident forward pass: the same difference
    assert three.native_bytes - one.native_bytes == pytest.approx(2 * weights + probs, abs=2)


def _runs(synthetic_root, tmp_path, vals, tests=None, biases=((3.0, -8.0, -8.0), (-2.0, -8.0, -8.0)), **kw):
    """Two run folders over the brats2021 synthetic cases with the given val parts."""
    root = synthetic_root["brats2021"]
    ids = case_ids(root, "brats2021")
    runs = []
    for i, (val, bias) in enumerate(zip(vals, biases)):
        test = tests[i] if tests else []
        split = {"train": [c for c in ids if c not in val and c not in test], "val": val, "test": test}
        run = tmp_path / f"fold_{i}"
        model_cfg = kw.get(f"run{i}", {}).get("model_cfg", TINY_MODEL)
        make_run_dir(run, root, "brats2021", tmp_path, split, model_cfg, model=fixed_head_unet(model_cfg, bias=bias))
        runs.append(run)
    return ids, runs


def test_folds_make_an_ensemble_whose_val_is_out_of_fold(synthetic_root, tmp_path):
    ids = case_ids(synthetic_root["brats2021"], "brats2021")
    _, runs = _runs(synthetic_root, tmp_path, [[ids[0]], [ids[1]]], tests=[[ids[2]], [ids[2]]])
    folder = make_ensemble(tmp_path / "ens", [str(r) for r in runs])
    split = RunFolder(folder).read_split()
    assert split["val"] == sorted(ids[:2]) and split["test"] == [ids[2]]
    assert split["val_predicted_by"] == {ids[0]: str(runs[0].resolve()), ids[1]: str(runs[1].resolve())}
    assert ensemble_size(folder) == 2 and ensemble_size(runs[0]) == 1
    identity = RunFolder(folder).checkpoint_identity("best")
    assert identity == {"ensemble": [RunFolder(r).checkpoint_identity("best") for r in runs]}
    # the same members again: accepted; other members into the same folder: refused
    assert make_ensemble(tmp_path / "ens", [str(r) for r in runs]) == folder
    with pytest.raises(RunError, match="an ensemble of other runs"):
        make_ensemble(tmp_path / "ens", [str(runs[1]), str(runs[0])])


def test_seeds_on_one_split_share_their_val_cases(synthetic_root, tmp_path):
    ids = case_ids(synthetic_root["brats2021"], "brats2021")
    _, runs = _runs(synthetic_root, tmp_path, [[ids[0]], [ids[0]]])
    split = RunFolder(make_ensemble(tmp_path / "ens", [str(r) for r in runs])).read_split()
    assert split["val"] == [ids[0]] and "val_predicted_by" not in split


def test_members_that_differ_are_refused_naming_the_runs(synthetic_root, tmp_path):
    ids = case_ids(synthetic_root["brats2021"], "brats2021")
    wt_only = ModelConfig(depth=2, base_filters=4, out_channels=1)
    _, runs = _runs(
        synthetic_root,
        tmp_path,
        [[ids[0]], [ids[1]]],
        biases=((3.0, -8.0, -8.0), (-2.0,)),
        run1={"model_cfg": wt_only},
    )
    with pytest.raises(RunError, match=r"has the regions \['wt'\].*fold_0 has \['wt', 'tc', 'et'\]"):
        make_ensemble(tmp_path / "ens", [str(r) for r in runs])


@pytest.mark.parametrize(
    "vals,tests,match",
    [
        ([[0], [0, 1]], None, "partly overlap"),
        ([[0], [1]], [[2], []], "hold out different test cases"),
    ],
)
def test_splits_that_do_not_ensemble_are_refused(synthetic_root, tmp_path, vals, tests, match):
    ids = case_ids(synthetic_root["brats2021"], "brats2021")
    ids_of = lambda parts: None if parts is None else [[ids[i] for i in p] for p in parts]  # noqa: E731
    _, runs = _runs(synthetic_root, tmp_path, ids_of(vals), tests=ids_of(tests))
    with pytest.raises(RunError, match=match):
        make_ensemble(tmp_path / "ens", [str(r) for r in runs])
    assert not (tmp_path / "ens").exists()  # nothing written


def test_an_ensemble_needs_two_runs_and_a_folder_of_its_own(synthetic_root, tmp_path):
    ids = case_ids(synthetic_root["brats2021"], "brats2021")
    _, runs = _runs(synthetic_root, tmp_path, [[ids[0]], [ids[1]]])
    with pytest.raises(RunError, match="two or more"):
        make_ensemble(tmp_path / "ens", [str(runs[0])])
    with pytest.raises(RunError, match="is one of runs="):
        make_ensemble(runs[0], [str(r) for r in runs])
    with pytest.raises(RunError, match="names a run twice"):
        make_ensemble(tmp_path / "ens", [str(runs[0]), str(runs[0])])
    make_run_dir(
        tmp_path / "trained", synthetic_root["brats2021"], "brats2021", tmp_path, {"train": [], "val": [], "test": []}
    )
    with pytest.raises(RunError, match="is a training run"):
        make_ensemble(tmp_path / "trained", [str(r) for r in runs])


def test_evaluating_a_fold_ensemble_scores_val_out_of_fold_and_test_by_the_mean(synthetic_root, tmp_path):
    """Fold 0's head says WT everywhere (sigmoid 3 = 0.95), fold 1's nothing (sigmoid -2 = 0.12): a
    val case is predicted by its own fold alone, a test case by the mean (0.54, WT everywhere)."""
    ids = case_ids(synthetic_root["brats2021"], "brats2021")
    _, runs = _runs(synthetic_root, tmp_path, [[ids[0]], [ids[1]]], tests=[[ids[2]], [ids[2]]])
    ens = tmp_path / "ens"
    runs_arg = "runs=[" + ",".join(str(r) for r in runs) + "]"
    common = [f"run_dir={ens}", runs_arg, "evaluate.overlays=false", "evaluate.postprocess=none", *CLI_BACKEND]
    val = run_script("evaluate.py", *common, "split=val")
    assert val.returncode == 0, val.stderr[-3000:]
    rows = {r["case_id"]: r for r in _csv(ens / "eval" / "val" / "metrics.csv")}
    assert float(rows[ids[0]]["dice_wt"]) > 0  # fold 0 (WT everywhere) overlaps the tumour
    assert float(rows[ids[1]]["dice_wt"]) == 0  # fold 1 (nothing) predicted its own val case
    test = run_script(
        "evaluate.py", f"run_dir={ens}", "evaluate.overlays=false", "evaluate.postprocess=none", *CLI_BACKEND
    )
    assert test.returncode == 0, test.stderr[-3000:]
    (row,) = _csv(ens / "eval" / "test" / "metrics.csv")
    assert row["case_id"] == ids[2] and float(row["dice_wt"]) == pytest.approx(float(rows[ids[0]]["dice_wt"]), abs=0.2)
    assert float(row["dice_wt"]) > 0  # the mean (0.54) is WT: neither fold 1 alone nor an empty mask


def test_the_cli_refuses_a_bad_ensemble_in_one_error_line(synthetic_root, tmp_path):
    ids = case_ids(synthetic_root["brats2021"], "brats2021")
    _, runs = _runs(synthetic_root, tmp_path, [[ids[0]], [ids[0], ids[1]]])
    result = run_script(
        "evaluate.py", f"run_dir={tmp_path / 'ens'}", "runs=[" + ",".join(map(str, runs)) + "]", *CLI_BACKEND
    )
    assert result.returncode == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "partly overlap" in errors[0], result.stderr[-2000:]
    assert not (tmp_path / "ens").exists()


def _csv(path):
    import csv

    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_ensemble_json_is_written_last_and_read_back(synthetic_root, tmp_path):
    ids = case_ids(synthetic_root["brats2021"], "brats2021")
    _, runs = _runs(synthetic_root, tmp_path, [[ids[0]], [ids[1]]])
    folder = make_ensemble(tmp_path / "ens", [str(r) for r in runs], checkpoint="best")
    record = json.loads((folder / "ensemble.json").read_text())
    assert record["kind"] == "brats_seg_ensemble" and record["val"] == "out_of_fold"
    assert [m["run_dir"] for m in record["members"]] == [str(r.resolve()) for r in runs]
    (folder / "ensemble.json").write_text("{")
    with pytest.raises(RunError, match="cannot be read"):
        RunFolder(folder).checkpoint_identity("best")
