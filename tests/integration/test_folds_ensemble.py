"""End to end (issue 47): two folds trained with one command each, their ensemble evaluated
(post-processing chosen on both folds' val cases together, each predicted by its own fold) and
predicting a raw case on its native grid."""

from __future__ import annotations

import json

import nibabel as nib
import numpy as np
import pytest

from tests.integration.scripts import REPO, run_script


@pytest.mark.slow
def test_two_folds_train_and_their_ensemble_evaluates_and_predicts_on_the_native_grid(tmp_path):
    data = [
        "resolution=tiny",
        "data=synthetic",
        f"data.root={tmp_path / 'synthetic'}",
        "data.synthetic_cases=7",
        f"data.cache_dir={tmp_path / 'cache'}",
        "data.num_folds=2",
    ]
    folds = []
    for k in (0, 1):
        run = tmp_path / f"fold_{k}"
        run_script(
            [
                str(REPO / "train.py"),
                *data,
                f"data.fold={k}",
                "model.depth=2",
                "model.base_filters=4",
                "trainer.epochs=1",
                "trainer.batch_size=1",
                "tracking=none",
                f"run_dir={run}",
            ],
            cwd=tmp_path,
        )
        folds.append(run)
    splits = [json.loads((f / "split.json").read_text()) for f in folds]
    assert [s["fold"] for s in splits] == [0, 1] and splits[0]["test"] == splits[1]["test"]
    assert splits[0]["val"] == splits[1]["train"] and splits[1]["val"] == splits[0]["train"]
    shipped = sorted((tmp_path / "cache").glob("synthetic_*/folds_seed0_k2_stratified.json"))
    assert len(shipped) == 1 and json.loads(shipped[0].read_text())["folds"][1]["val"] == splits[1]["val"]

    ens = tmp_path / "ensemble"
    runs = "runs=[" + ",".join(map(str, folds)) + "]"
    out = run_script(
        [str(REPO / "scripts" / "evaluate.py"), f"run_dir={ens}", runs, "evaluate.overlays=false"], cwd=tmp_path
    )
    assert "post-processing: " in out.stdout
    chosen = json.loads((ens / "postprocess.json").read_text())
    # chosen on every fold's val cases together (the cross-validation predictions)
    assert chosen["validation"]["cases"] == sorted(splits[0]["val"] + splits[1]["val"])
    summary = json.loads((ens / "eval" / "test" / "summary.json").read_text())
    assert summary["n_cases"] == len(splits[0]["test"]) and np.isfinite(summary["dice_wt"]["mean"])

    case = tmp_path / "synthetic" / splits[0]["test"][0]
    masks = tmp_path / "masks"
    run_script(
        [str(REPO / "scripts" / "predict.py"), f"run_dir={ens}", f"input={case}", f"output={masks}"], cwd=tmp_path
    )
    flair = nib.load(case / f"{case.name}_flair.nii.gz")
    mask = nib.load(masks / f"{case.name}.nii.gz")
    assert mask.shape == flair.shape
    np.testing.assert_allclose(mask.affine, flair.affine, atol=1e-6)
    # the ensemble's mask is the one its evaluation wrote for the same case (same mean, same rules)
    evaluated = nib.load(ens / "eval" / "test" / "predictions" / f"{case.name}.nii.gz")
    np.testing.assert_array_equal(np.asarray(mask.dataobj), np.asarray(evaluated.dataobj))
