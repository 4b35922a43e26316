"""Evaluation and prediction continue where they stopped: what is reused, and what is redone.

The cases are the session's synthetic brats2021 cases at 2 mm (:func:`write_small_dataset`: every
second voxel, eight times fewer than the 1 mm originals, so a case is read, resampled back and
written in a fraction of a second).

Evaluation (in this process): a run folder over those cases whose
checkpoint file stands for the model -- its identity (size, SHA-256) is what the case records
hold -- and whose loaded model is the oracle of test_evaluate (each case's true regions). The
scores are a cheap stand-in computed from the written mask (test_evaluate checks the real ones;
here they take 5 s a case): varied floats, NaN and infinite distances, which a reused row must
give back exactly. Prediction: a double whose output is a fixed
function of the image, so the masks are not empty and equal from run to run. Interruptions
are real signals (SIGTERM to this process inside ``stop_on_signals``), as the entry points get.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import signal
import time
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

import brats_seg.evaluation.case_records as case_records
import brats_seg.evaluation.evaluate as evaluate
import brats_seg.evaluation.inference.predict as predict
from brats_seg.config import EvaluateConfig, TrainConfig
from brats_seg.data.layouts import discover_cases
from brats_seg.evaluation.evaluate import evaluate_run
from brats_seg.evaluation.inference.predict import MANIFEST, predict_new_cases
from brats_seg.evaluation.scoring.table import metric_columns
from brats_seg.run_dir import RunFolder
from brats_seg.signals import Interrupted, stop_on_signals
from tests.conftest import TINY
from tests.unit.test_evaluate import OracleModel, case_ids, make_run_dir, prepare_entries

NO_OVERLAYS = EvaluateConfig(overlays=False)


def write_small_dataset(source: Path, root: Path, n_cases: int) -> list[str]:
    """``n_cases`` brats2021 cases under ``root``: the cases of ``source`` at twice their spacing
    (every second voxel), in turn, as ``BraTS2021_00000``, ... Returns the case ids."""
    cases, ids = discover_cases(source, "brats2021")[0], []
    for i in range(n_cases):
        case, case_id = cases[i % len(cases)], f"BraTS2021_{i:05d}"
        (root / case_id).mkdir(parents=True)
        for src, kind in [*zip(case.images, ("flair", "t1", "t1ce", "t2")), (case.label, "seg")]:
            img = nib.load(src)
            affine = img.affine.copy()
            affine[:3, :3] *= 2
            out = nib.Nifti1Image(np.asarray(img.dataobj)[::2, ::2, ::2], affine)
            out.set_qform(affine, code=1)
            out.set_sform(affine, code=1)
            nib.save(out, root / case_id / f"{case_id}_{kind}.nii.gz")
        ids.append(case_id)
    return ids


@pytest.fixture(scope="module")
def small_root(synthetic_root, tmp_path_factory):
    root = tmp_path_factory.mktemp("small") / "brats2021"
    write_small_dataset(synthetic_root["brats2021"], root, 3)
    return root


# ---------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def base_run(small_root, tmp_path_factory):
    """A run folder (3 cases, split all) with a checkpoint file, its cache prepared; tests copy it."""
    base = tmp_path_factory.mktemp("resume_eval")
    root = small_root
    ids = case_ids(root, "brats2021")
    cfg = make_run_dir(base / "run", root, "brats2021", base, {"train": ids[:1], "val": ids[1:2], "test": ids[2:]})
    (base / "run" / "checkpoints").mkdir()
    (base / "run" / "checkpoints" / "best.keras").write_bytes(b"the weights of epoch 1")
    return base, cfg, prepare_entries(cfg, ids), ids


def stand_in_scores(case_id, labels, ref_labels, spacing_mm, layout, names, reference=None) -> dict:
    """Every metric column from the mask and the reference: fractions, NaN (undefined), inf (a distance)."""
    overlap, predicted, truth = (
        float(((labels > 0) & (ref_labels > 0)).sum()),
        float((labels > 0).sum()),
        float((ref_labels > 0).sum()),
    )
    scores = {c: (overlap + i) / (predicted + truth + 7.0) for i, c in enumerate(metric_columns(names)[1:])}
    scores["dice_wt"] = 2 * overlap / (predicted + truth)
    scores["lesion_nsd_et"], scores["hd95_tc"] = math.nan, math.inf
    return scores


class Counted:
    """Counts the cases evaluated and the models loaded (the oracle stands for the checkpoint)."""

    def __init__(self, entries, monkeypatch, stop_after: int | None = None) -> None:
        self.cases, self.loads, self.stop_after = [], 0, stop_after
        oracle, evaluate_case = OracleModel(entries), evaluate._evaluate_case

        def load_run_model(run_dir, checkpoint, config):
            self.loads += 1
            return oracle

        def counted_case(model, entry, *args, **kwargs):
            if self.stop_after is not None and len(self.cases) == self.stop_after:
                os.kill(os.getpid(), signal.SIGTERM)  # as `kill` does: mid-way through the next case
            self.cases.append(entry.case_id)
            return evaluate_case(model, entry, *args, **kwargs)

        monkeypatch.setattr(evaluate, "load_run_model", load_run_model)
        monkeypatch.setattr(evaluate, "_evaluate_case", counted_case)
        monkeypatch.setattr(evaluate, "score_case", stand_in_scores)


@pytest.fixture
def run(base_run, tmp_path):
    base, _cfg, entries, ids = base_run
    run_dir = Path(shutil.copytree(base / "run", tmp_path / "run"))
    return run_dir, entries, ids


def _evaluate(run_dir: Path, eval_cfg: EvaluateConfig = EvaluateConfig()):
    return evaluate_run(run_dir, "all", "best", eval_cfg, progress=False)


def _outputs(run_dir: Path) -> tuple[bytes, bytes]:
    folder = RunFolder(run_dir)
    return folder.metrics_csv("all").read_bytes(), folder.summary_json("all").read_bytes()


def _copy_evaluation(source: Path, run_dir: Path) -> None:
    """An earlier evaluation's files in the run folder: eval/ and the post-processing it chose."""
    shutil.copytree(source / "eval", run_dir / "eval")
    shutil.copy2(RunFolder(source).postprocess_path, RunFolder(run_dir).postprocess_path)


def _temporaries(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.name.startswith((".tmp-", ".old-"))]


@pytest.fixture(scope="module")
def uninterrupted(base_run, tmp_path_factory):
    """metrics.csv and summary.json of an evaluation that ran to the end in one go."""
    base, _cfg, entries, ids = base_run
    run_dir = Path(shutil.copytree(base / "run", tmp_path_factory.mktemp("uninterrupted") / "run"))
    with pytest.MonkeyPatch.context() as mp:
        counted = Counted(entries, mp)
        _evaluate(run_dir)
    assert counted.cases == ids and counted.loads == 1
    return _outputs(run_dir), run_dir


def test_the_same_evaluation_again_reuses_every_case_without_loading_the_model(run, uninterrupted, monkeypatch, caplog):
    run_dir, entries, ids = run
    _copy_evaluation(uninterrupted[1], run_dir)
    counted = Counted(entries, monkeypatch)
    with caplog.at_level(logging.INFO, logger="brats_seg.evaluation.evaluate"):
        summary = _evaluate(run_dir)
    assert counted.cases == [] and counted.loads == 0
    assert "3 of 3 cases were evaluated before with this checkpoint and these settings" in caplog.text
    assert _outputs(run_dir) == uninterrupted[0] and summary["n_cases"] == 3
    record = json.loads(RunFolder(run_dir).eval_case_file("all", ids[0]).read_text())
    assert record["case_id"] == ids[0] and record["metrics"]["dice_wt"] > 0.8  # the oracle's real scores


def test_a_case_whose_record_prediction_or_overlay_is_missing_or_replaced_is_evaluated_again(
    run, uninterrupted, monkeypatch
):
    run_dir, entries, ids = run
    _copy_evaluation(uninterrupted[1], run_dir)
    folder = RunFolder(run_dir)
    folder.eval_case_file("all", ids[0]).unlink()  # killed before its record
    folder.overlay_file("all", ids[1]).unlink()  # an overlay lost
    prediction = folder.prediction_file("all", ids[2])
    prediction.write_bytes(prediction.read_bytes())  # another writer's mask in its place (new mtime)
    counted = Counted(entries, monkeypatch)
    _evaluate(run_dir)
    assert counted.cases == ids and counted.loads == 1
    assert _outputs(run_dir) == uninterrupted[0]
    counted.cases.clear()
    _evaluate(run_dir, NO_OVERLAYS)  # other settings: every case again
    assert counted.cases == ids


def test_a_new_checkpoint_or_other_settings_evaluate_every_case_again(run, uninterrupted, monkeypatch):
    run_dir, entries, ids = run
    _copy_evaluation(uninterrupted[1], run_dir)
    counted = Counted(entries, monkeypatch)
    other = EvaluateConfig(threshold=0.4, overlays=False)
    _evaluate(run_dir, other)
    assert counted.cases == ids
    counted.cases.clear()
    _evaluate(run_dir, other)
    assert counted.cases == []  # recorded with the new settings
    RunFolder(run_dir).checkpoint_file("best").write_bytes(b"the weights of epoch 2")
    _evaluate(run_dir, other)
    assert counted.cases == ids
    counted.cases.clear()
    import keras

    keras.mixed_precision.set_global_policy("mixed_bfloat16")  # backend.precision=bf16 for this evaluation
    try:
        _evaluate(run_dir, other)  # the same checkpoint and settings in another precision: not the same masks
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert counted.cases == ids


def test_a_model_given_in_memory_reuses_and_records_nothing(run, uninterrupted, monkeypatch):
    run_dir, entries, ids = run
    counted = Counted(entries, monkeypatch)
    evaluate_run(run_dir, "all", eval_cfg=NO_OVERLAYS, model=OracleModel(entries), progress=False)
    assert counted.cases == ids and not RunFolder(run_dir).eval_cases_dir("all").exists()
    assert _outputs(run_dir) == uninterrupted[0]  # the same files as the checkpoint's evaluation
    evaluate_run(run_dir, "all", eval_cfg=NO_OVERLAYS, model=OracleModel(entries), progress=False)
    assert counted.cases == ids + ids


def test_a_sigterm_mid_evaluation_keeps_the_cases_done_and_the_rerun_ends_as_an_uninterrupted_run(
    run, uninterrupted, monkeypatch
):
    run_dir, entries, ids = run
    counted = Counted(entries, monkeypatch, stop_after=2)
    with pytest.raises(Interrupted) as stopped, stop_on_signals("evaluation"):
        _evaluate(run_dir)
    assert str(stopped.value).startswith("SIGTERM: evaluation stopped after 2 of 3 cases;")
    folder = RunFolder(run_dir)
    assert sorted(p.stem for p in folder.eval_cases_dir("all").glob("*.json")) == ids[:2]
    assert not (folder.eval_dir("all") / ".lock").exists() and _temporaries(run_dir) == []
    assert not folder.metrics_csv("all").exists()  # written once every case is done

    counted.cases.clear()
    counted.stop_after = None
    _evaluate(run_dir)
    assert counted.cases == ids[2:]
    assert _outputs(run_dir) == uninterrupted[0]


def test_post_processing_is_chosen_on_the_val_split_once_per_checkpoint_and_its_rules_are_applied(
    run, uninterrupted, monkeypatch, caplog
):
    run_dir, entries, ids = run
    folder = RunFolder(run_dir)
    chosen = json.loads(RunFolder(uninterrupted[1]).postprocess_path.read_text())
    assert chosen["chosen_for"]["val_cases"] == ids[1:2]
    assert chosen["chosen_for"]["checkpoint"] == RunFolder(uninterrupted[1]).checkpoint_identity("best")
    assert chosen["validation"]["cases"] == ids[1:2] and chosen["validation"]["steps"]
    summary = json.loads(RunFolder(uninterrupted[1]).summary_json("all").read_text())
    assert summary["postprocess"]["rules"] == chosen["rules"]

    # Rules edited in the file (chosen for this checkpoint and these settings) are what is applied:
    # every ET relabelled as necrosis, WT and TC unchanged.
    _copy_evaluation(uninterrupted[1], run_dir)
    chosen["rules"] = {"min_component_mm3": {}, "relabel_below_mm3": {"et": 1e9}}
    folder.postprocess_path.write_text(json.dumps(chosen))
    counted = Counted(entries, monkeypatch)
    _evaluate(run_dir)
    assert counted.cases == ids and counted.loads == 1  # other rules: every case again; the choice kept
    enhancing = 0
    for case_id in ids:
        before = np.asarray(nib.load(RunFolder(uninterrupted[1]).prediction_file("all", case_id)).dataobj)
        after = np.asarray(nib.load(folder.prediction_file("all", case_id)).dataobj)
        enhancing += int((before == 4).sum())
        assert np.array_equal(after, np.where(before == 4, 1, before))
    assert enhancing > 0
    applied = json.loads(folder.summary_json("all").read_text())["postprocess"]
    assert applied["rules"]["relabel_below_mm3"] == {"et": 1e9}
    # the effect: masks changed, and the means as thresholded are those of the first evaluation (whose
    # rules, chosen on the oracle's exact val prediction, changed nothing)
    first = json.loads(RunFolder(uninterrupted[1]).summary_json("all").read_text())
    assert first["postprocess"]["cases_changed"] == 0
    assert applied["cases_changed"] == sum(
        (np.asarray(nib.load(RunFolder(uninterrupted[1]).prediction_file("all", i)).dataobj) == 4).any() for i in ids
    )
    assert applied["unprocessed_mean"] == {c: first[c]["mean"] for c in applied["unprocessed_mean"]}
    assert set(applied["unprocessed_mean"]) >= {"dice_et", "lesion23_dice_et", "lesion_dice_et"}

    # evaluate.postprocess=none: the thresholded masks, and the file is left as it is
    counted.cases.clear()
    _evaluate(run_dir, EvaluateConfig(postprocess="none"))
    assert counted.cases == ids and json.loads(folder.summary_json("all").read_text())["postprocess"] is None
    assert json.loads(folder.postprocess_path.read_text())["rules"] == chosen["rules"]

    # A new checkpoint: chosen again (and recorded for it); an unreadable file: chosen again, said
    folder.checkpoint_file("best").write_bytes(b"the weights of epoch 2")
    _evaluate(run_dir)
    again = json.loads(folder.postprocess_path.read_text())
    assert again["chosen_for"]["checkpoint"] == folder.checkpoint_identity("best") and again["rules"] != chosen["rules"]
    folder.postprocess_path.write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="brats_seg.evaluation.evaluate"):
        _evaluate(run_dir)
    assert f"{folder.postprocess_path} cannot be read" in caplog.text
    assert json.loads(folder.postprocess_path.read_text())["rules"] == again["rules"]


def test_nan_and_infinite_metrics_come_back_from_a_record_as_they_went_in():
    row = {"dice_et": float("nan"), "hd95_et": float("inf"), "dice_wt": 0.1 + 0.2, "lesions_ref_wt": 3.0}
    encoded = json.loads(json.dumps(case_records.encode_row(row), allow_nan=False))
    decoded = case_records.decode_row(encoded)
    assert np.isnan(decoded["dice_et"]) and decoded["hd95_et"] == float("inf")
    assert decoded["dice_wt"] == 0.1 + 0.2 and decoded["lesions_ref_wt"] == 3.0


# ---------------------------------------------------------------------------------------
# Prediction
# ---------------------------------------------------------------------------------------


class FlairModel:
    """A model double: WT where FLAIR is bright, TC/ET where brighter (a fixed function of the image)."""

    layers = ()
    input_shape = (None, *TINY.shape, 4)

    def __call__(self, batch, training=False):
        flair = np.asarray(batch, dtype=np.float32)[..., :1]
        return np.concatenate([flair > 1.0, flair > 2.0, flair > 2.5], axis=-1).astype(np.float32) * 0.9 + 0.05


@pytest.fixture
def predicted(monkeypatch):
    """The case ids predict_new_case is called for, in order."""
    calls, predict_case = [], predict.predict_new_case

    def counted(model, case, *args, **kwargs):
        calls.append(case.case_id)
        return predict_case(model, case, *args, **kwargs)

    monkeypatch.setattr(predict, "predict_new_case", counted)
    return calls


@pytest.fixture(scope="module")
def input_cases(small_root, tmp_path_factory):
    """Two input cases (copied: one test touches a file)."""
    dst = tmp_path_factory.mktemp("predict_inputs")
    for case in discover_cases(small_root, "brats2021")[0][:2]:
        shutil.copytree(case.images[0].parent, dst / case.case_id)
    return dst


def _cases(root: Path):
    return discover_cases(root, "brats2021", require_labels=False)[0]


def _config() -> TrainConfig:
    return TrainConfig(resolution=TINY)


IDENTITY = {"checkpoint": {"size": 1, "sha256": "a" * 64}}


def _predict(cases, output: Path, eval_cfg=NO_OVERLAYS, identity=IDENTITY):
    return predict_new_cases(FlairModel(), cases, _config(), output, eval_cfg, progress=False, model_identity=identity)


def _masks(output: Path) -> dict[str, np.ndarray]:
    return {p.name: np.asarray(nib.load(p).dataobj) for p in sorted(output.glob("*.nii.gz"))}


def _assert_same_masks(a: Path, b: Path) -> None:
    ma, mb = _masks(a), _masks(b)
    assert list(ma) == list(mb) and all(np.array_equal(ma[k], mb[k]) for k in ma)


@pytest.fixture(scope="module")
def predicted_once(input_cases, tmp_path_factory):
    out = tmp_path_factory.mktemp("predicted_once") / "out"
    written = _predict(_cases(input_cases), out)
    assert [p.name for p in written] == [f"{c.case_id}.nii.gz" for c in _cases(input_cases)]
    assert all(m.any() for m in _masks(out).values())  # something predicted: the comparisons below mean something
    return out


def test_the_same_prediction_again_skips_the_cases_written_by_the_same_model_and_settings(
    input_cases, predicted_once, predicted, tmp_path, caplog
):
    out = Path(shutil.copytree(predicted_once, tmp_path / "out"))
    cases = _cases(input_cases)
    manifest = json.loads((out / MANIFEST).read_text())
    assert sorted(manifest["cases"]) == [c.case_id for c in cases] and manifest["settings"]["model"] == IDENTITY
    mtimes = {p.name: p.stat().st_mtime_ns for p in out.glob("*.nii.gz")}
    with caplog.at_level(logging.INFO, logger="brats_seg.evaluation.inference.predict"):
        written = _predict(cases, out)
    assert predicted == [] and "2 of 2 cases were predicted before by this model" in caplog.text
    assert [p.name for p in written] == sorted(mtimes) and {p.name: p.stat().st_mtime_ns for p in written} == mtimes
    assert not (out / ".lock").exists()


def test_prediction_redoes_a_missing_mask_a_changed_input_another_model_or_other_settings(
    input_cases, predicted_once, predicted, tmp_path
):
    out = Path(shutil.copytree(predicted_once, tmp_path / "out"))
    inputs = Path(shutil.copytree(input_cases, tmp_path / "inputs"))
    cases = _cases(inputs)  # other paths than the manifest's: every case is new to it
    ids = [c.case_id for c in cases]
    _predict(cases, out)
    assert predicted == ids
    (out / f"{ids[0]}.nii.gz").unlink()
    os.utime(cases[1].images[2], ns=(time.time_ns(), time.time_ns()))  # an input file changed since
    _predict(cases, out)
    assert predicted == ids * 2
    other_model = {"checkpoint": {"size": 1, "sha256": "b" * 64}}
    _predict(cases[:1], out, identity=other_model)
    assert predicted == ids * 2 + ids[:1]
    _predict(cases[:1], out, identity=other_model)
    assert predicted == ids * 2 + ids[:1]  # recorded for that model now
    _predict(cases[:1], out, eval_cfg=EvaluateConfig(overlays=False, threshold=0.6), identity=other_model)
    assert predicted == ids * 2 + ids[:1] * 2
    manifest = (out / MANIFEST).read_bytes()
    _predict(cases[:1], out, identity=None)  # no identity: nothing known, everything predicted, nothing recorded
    assert predicted == ids * 2 + ids[:1] * 3 and (out / MANIFEST).read_bytes() == manifest
    _assert_same_masks(out, predicted_once)


def test_a_sigterm_mid_prediction_keeps_the_masks_done_and_the_rerun_predicts_only_the_rest(
    input_cases, predicted_once, predicted, tmp_path, monkeypatch
):
    out = tmp_path / "out"
    cases = _cases(input_cases)
    counted = predict.predict_new_case

    def stopping(model, case, *args, **kwargs):
        if case.case_id == cases[1].case_id:
            os.kill(os.getpid(), signal.SIGTERM)  # as `kill` does: mid-way through the second case
        return counted(model, case, *args, **kwargs)

    monkeypatch.setattr(predict, "predict_new_case", stopping)
    with pytest.raises(Interrupted) as stopped, stop_on_signals("prediction"):
        _predict(cases, out)
    assert str(stopped.value).startswith("SIGTERM: prediction stopped after 1 of 2 cases;")
    assert sorted(json.loads((out / MANIFEST).read_text())["cases"]) == [cases[0].case_id]
    assert sorted(p.name for p in out.iterdir()) == sorted([MANIFEST, f"{cases[0].case_id}.nii.gz"])  # nothing half

    monkeypatch.setattr(predict, "predict_new_case", counted)
    predicted.clear()
    _predict(cases, out)
    assert predicted == [cases[1].case_id]
    _assert_same_masks(out, predicted_once)


def test_prediction_applies_the_post_processing_and_redoes_masks_when_the_rules_change(
    input_cases, predicted_once, predicted, tmp_path
):
    from brats_seg.evaluation.postprocess import PostProcessing

    out = Path(shutil.copytree(predicted_once, tmp_path / "out"))
    cases = _cases(input_cases)
    relabel = PostProcessing({}, {"et": 1e9})  # every ET becomes necrosis
    predict_new_cases(
        FlairModel(), cases, _config(), out, NO_OVERLAYS, progress=False, model_identity=IDENTITY, postprocess=relabel
    )
    assert predicted == [c.case_id for c in cases]  # other rules: every mask again
    before, after = _masks(predicted_once), _masks(out)
    assert any((m == 4).any() for m in before.values())
    assert all(np.array_equal(after[k], np.where(before[k] == 4, 1, before[k])) for k in before)
    assert json.loads((out / MANIFEST).read_text())["settings"]["postprocess"] == relabel.rules()


def test_prediction_takes_the_runs_post_processing_and_says_when_there_is_none(run, caplog):
    from brats_seg.evaluation.postprocess import POSTPROCESS_KIND
    from brats_seg.evaluation.serving.exported import prediction_postprocessing

    run_dir, _, _ = run
    folder, config = RunFolder(run_dir), _config()
    with caplog.at_level(logging.WARNING):
        assert prediction_postprocessing(str(run_dir), None, config, EvaluateConfig()) is None
    assert "has no post-processing chosen yet" in caplog.text and "scripts/evaluate.py" in caplog.text
    record = {
        "kind": POSTPROCESS_KIND,
        "version": 1,
        "rules": {"min_component_mm3": {"wt": 20.0}, "relabel_below_mm3": {"et": 300.0}},
        "chosen_for": {"checkpoint": folder.checkpoint_identity("best")},
    }
    folder.postprocess_path.write_text(json.dumps(record))
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        rules = prediction_postprocessing(str(run_dir), None, config, EvaluateConfig())
    assert rules.rules() == record["rules"] and caplog.text == ""
    assert prediction_postprocessing(str(run_dir), None, config, EvaluateConfig(postprocess="none")) is None
    folder.checkpoint_file("best").write_bytes(b"the weights of epoch 2")  # chosen for another checkpoint: said
    with caplog.at_level(logging.WARNING):
        assert prediction_postprocessing(str(run_dir), None, config, EvaluateConfig()).rules() == record["rules"]
    assert "was chosen for another checkpoint" in caplog.text
    record["rules"]["min_component_mm3"] = {"wt": -5}
    folder.postprocess_path.write_text(json.dumps(record))
    with pytest.raises(evaluate.RunError, match=r"postprocess\.json: 'min_component_mm3\.wt' = -5"):
        prediction_postprocessing(str(run_dir), None, config, EvaluateConfig())
    folder.postprocess_path.write_text("{half")
    with pytest.raises(evaluate.RunError, match="cannot be read"):
        prediction_postprocessing(str(run_dir), None, config, EvaluateConfig())
