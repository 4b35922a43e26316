"""scripts/score.py (existing masks, no model) and scripts/predict.py (new, unlabelled cases)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import nibabel as nib
import numpy as np
import pytest

from brats_seg.config import EvaluateConfig, ModelConfig, TrainConfig
from brats_seg.data.errors import CaseError, DatasetError
from brats_seg.data.labels import LABELS
from brats_seg.data.layouts import discover_cases
from brats_seg.data.predict_inputs import find_input_cases
from brats_seg.evaluation.scoring.metrics import HD95_EMPTY_MM
from brats_seg.evaluation.scoring.score import score_masks
from brats_seg.evaluation.scoring.table import metric_columns
from tests.conftest import TINY
from tests.unit.test_evaluate import (
    CLI_BACKEND,
    CLI_ENV,
    CONTRACT_COLUMNS,
    ROOT,
    fixed_head_unet,
    make_run_dir,
    read_csv,
    run_script,
)


def _copy_references(root, layout, pred_dir, skip=()):
    """Masks equal to the reference label files, as <pred_dir>/<case_id>.nii.gz."""
    pred_dir.mkdir(parents=True, exist_ok=True)
    cases = discover_cases(root, layout)[0]
    for case in cases:
        if case.case_id not in skip:
            shutil.copyfile(case.label, pred_dir / f"{case.case_id}.nii.gz")
    return [c.case_id for c in cases]


# ---------------------------------------------------------------------------------------
# score
# ---------------------------------------------------------------------------------------


def test_masks_equal_to_the_references_score_perfectly(synthetic_root, tmp_path):
    ids = _copy_references(synthetic_root["brats2023"], "brats2023", tmp_path / "pred")
    result = score_masks(tmp_path / "pred", synthetic_root["brats2023"], "brats2023", progress=False)
    assert result.csv_path == tmp_path / "pred" / "metrics.csv"
    assert result.summary_path == tmp_path / "pred" / "summary.json" and result.summary_path.is_file()
    columns, rows = read_csv(result.csv_path)
    assert columns[: len(CONTRACT_COLUMNS)] == CONTRACT_COLUMNS and [r["case_id"] for r in rows] == ids
    for row in rows:
        for region in ("wt", "tc", "et"):
            assert float(row[f"dice_{region}"]) == 1.0 and float(row[f"hd95_{region}"]) == 0.0
            assert float(row[f"sens_{region}"]) == 1.0 and float(row[f"spec_{region}"]) == 1.0
            if row[f"lesions_ref_{region}"] not in ("", "0.0"):  # a region with lesions: every one matched
                assert float(row[f"lesion_dice_{region}"]) == 1.0 and float(row[f"lesion_hd95_{region}"]) == 0.0
                assert row[f"lesions_tp_{region}"] == row[f"lesions_ref_{region}"] == row[f"lesions_pred_{region}"]
                assert float(row[f"rq_{region}"]) == 1.0 and float(row[f"lesion23_dice_{region}"]) == 1.0
    assert result.missing == [] and result.unmatched == []


def test_a_missing_mask_is_scored_as_an_empty_prediction(synthetic_root, tmp_path, caplog):
    root = synthetic_root["brats2023"]
    ids = _copy_references(root, "brats2023", tmp_path / "pred", skip=("BraTS-GLI-00001-000",))
    (tmp_path / "pred" / "stray-case.nii.gz").write_bytes(b"")  # a mask without a reference: ignored
    result = score_masks(tmp_path / "pred", root, "brats2023", out=tmp_path / "out" / "scores.csv", progress=False)
    assert result.missing == ["BraTS-GLI-00001-000"] and result.unmatched == ["stray-case"]
    assert "count as empty masks" in caplog.text and "BraTS-GLI-00001-000" in caplog.text
    assert (tmp_path / "out" / "summary.json").is_file()
    _, rows = read_csv(tmp_path / "out" / "scores.csv")
    assert [r["case_id"] for r in rows] == ids  # the missing case is a row, not dropped
    row = next(r for r in rows if r["case_id"] == "BraTS-GLI-00001-000")
    assert float(row["dice_wt"]) == 0.0 and float(row["hd95_wt"]) == HD95_EMPTY_MM and float(row["sens_wt"]) == 0.0
    assert result.summary["dice_wt"]["mean"] == pytest.approx((len(ids) - 1) / len(ids))


def _write_like(path, data, reference):
    ref = nib.load(reference)
    nib.save(nib.Nifti1Image(data.astype(np.uint8), ref.affine, ref.header), path)


def test_a_mask_on_another_grid_is_an_error_naming_both_files(synthetic_root, tmp_path):
    root = synthetic_root["brats2021"]
    _copy_references(root, "brats2021", tmp_path / "pred")
    case = discover_cases(root, "brats2021")[0][0]
    img = nib.load(case.label)
    shifted = img.affine.copy()
    shifted[:3, 3] += 5.0  # same shape, 5 mm off
    nib.save(nib.Nifti1Image(np.asarray(img.dataobj), shifted), tmp_path / "pred" / f"{case.case_id}.nii.gz")
    with pytest.raises(CaseError, match="differs from that of the reference") as err:
        score_masks(tmp_path / "pred", root, "brats2021", progress=False)
    assert str(tmp_path / "pred" / f"{case.case_id}.nii.gz") in str(err.value) and str(case.label) in str(err.value)


def test_mask_labels_outside_the_layout_are_an_error(synthetic_root, tmp_path):
    root = synthetic_root["brats2023"]
    _copy_references(root, "brats2023", tmp_path / "pred")
    case = discover_cases(root, "brats2023")[0][0]
    data = np.asarray(nib.load(case.label).dataobj).copy()
    data[data == 3] = 4  # brats2021's ET value in a brats2023 mask
    _write_like(tmp_path / "pred" / f"{case.case_id}.nii.gz", data, case.label)
    with pytest.raises(CaseError, match=r"label values \[4\] are not in the brats2023 label set \[0, 1, 2, 3\]"):
        score_masks(tmp_path / "pred", root, "brats2023", progress=False)


def test_score_script(synthetic_root, tmp_path):
    root = synthetic_root["msd"]
    ids = _copy_references(root, "msd", tmp_path / "pred", skip=("BRATS_002",))
    out = tmp_path / "scores" / "msd.csv"
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "score.py"),
            f"pred_dir={tmp_path / 'pred'}",
            f"ref_dir={root}",
            "data=msd",
            f"out={out}",
        ],
        cwd=ROOT,
        env=CLI_ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "BraTS 2023-24 rank" in result.stdout
    assert "1 case(s) had no mask" in result.stdout and "BRATS_002" in result.stdout and "empty" in result.stdout
    columns, rows = read_csv(out)
    assert columns == list(metric_columns(("wt", "tc", "et"))) and [r["case_id"] for r in rows] == ids
    summary = json.loads((out.parent / "summary.json").read_text())
    assert summary["n_cases"] == len(ids)


def test_score_brats2024_writes_the_resection_cavity_columns(synthetic_root, tmp_path):
    """score.py data=brats2024: WT, TC, ET and RC columns; RC scored from label 4 alone."""
    root = synthetic_root["brats2024"]
    ids = _copy_references(root, "brats2024", tmp_path / "pred")
    cavity_case = next(
        c for c in discover_cases(root, "brats2024")[0] if 4 in np.unique(np.asarray(nib.load(c.label).dataobj))
    )
    mask = tmp_path / "pred" / f"{cavity_case.case_id}.nii.gz"
    img = nib.load(mask)
    data = np.asarray(img.dataobj).copy()
    data[data == 4] = 0  # the cavity missed: RC empty, the tumour regions untouched
    nib.save(nib.Nifti1Image(data, img.affine, img.header), mask)
    out = tmp_path / "scores.csv"
    result = run_script(
        "score.py", f"pred_dir={tmp_path / 'pred'}", f"ref_dir={root}", "data=brats2024", f"out={out}", timeout=120
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "RC" in result.stdout
    columns, rows = read_csv(out)
    assert columns == list(metric_columns(("wt", "tc", "et", "rc"))) and [r["case_id"] for r in rows] == ids
    row = next(r for r in rows if r["case_id"] == cavity_case.case_id)
    assert float(row["dice_wt"]) == float(row["dice_et"]) == 1.0
    assert float(row["dice_rc"]) == 0.0 and float(row["hd95_rc"]) == HD95_EMPTY_MM
    assert float(row["lesion_dice_rc"]) == 0.0 and row["lesion_hd95_rc"] == "373"  # infinite: the parser's 373
    assert float(row["lesions_pred_rc"]) == 0.0 and float(row["lesions_ref_rc"]) >= 1
    assert float(row["lesion23_dice_rc"]) == 0.0 and float(row["lesion23_hd95_rc"]) == 374.0
    no_cavity = next(r for r in rows if r["case_id"] != cavity_case.case_id and float(r["dice_rc"]) == 1.0)
    assert no_cavity["lesion_dice_rc"] == "" and no_cavity["nsd_rc"] == ""  # no lesion on either side: undefined


def test_score_script_exits_2_on_a_bad_reference_root(tmp_path):
    result = run_script(
        "score.py", f"pred_dir={tmp_path}", f"ref_dir={tmp_path / 'nowhere'}", "data=brats2021", timeout=60
    )
    assert result.returncode == 2 and "does not exist" in result.stderr and "Traceback" not in result.stderr


def test_scoring_does_not_import_tensorflow():
    code = (
        "import sys; import brats_seg.evaluation.evaluate, brats_seg.evaluation.scoring.score, "
        "brats_seg.evaluation.inference.predict, brats_seg.data.layouts; "
        "print(sorted(m for m in ('tensorflow', 'keras') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=CLI_ENV, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr


# ---------------------------------------------------------------------------------------
# input discovery for predict
# ---------------------------------------------------------------------------------------


def test_find_input_cases_accepts_every_documented_input(synthetic_root, tmp_path):
    brats21, brats23, msd = synthetic_root["brats2021"], synthetic_root["brats2023"], synthetic_root["msd"]
    case_dir = next(p for p in sorted(brats21.iterdir()) if p.is_dir())
    (one,) = find_input_cases(case_dir, "brats2021")
    assert one.case_id == case_dir.name and len(one.images) == 4 and one.images[0].name.endswith("_flair.nii.gz")
    # A brats2023 case folder is read as such even for a brats2021 run (labels follow the run).
    case23 = next(p for p in sorted(brats23.iterdir()) if p.is_dir())
    (other,) = find_input_cases(case23, "brats2021")
    assert other.layout == "brats2023" and other.images[0].name.endswith("-t2f.nii.gz")
    image4d = sorted((msd / "imagesTr").glob("*.nii.gz"))[0]
    (four,) = find_input_cases(image4d, "msd")
    assert four.images == (image4d,) and four.case_id == image4d.name[: -len(".nii.gz")]
    assert len(find_input_cases(msd / "imagesTr", "msd")) == 3  # a folder of 4D images
    assert len(find_input_cases(msd, "msd")) == 3  # a dataset root (dataset.json)
    assert [c.case_id for c in find_input_cases(brats21, "brats2021")] == sorted(
        p.name for p in brats21.iterdir() if p.is_dir()
    )
    listing = tmp_path / "cases.txt"
    listing.write_text(f"# to segment\n{case_dir}\n\n{image4d}  # the MSD one\n")
    assert [c.case_id for c in find_input_cases(listing, "brats2021")] == [one.case_id, four.case_id]


@pytest.mark.parametrize(
    "source,match",
    [
        ("", "input is not set"),
        ("/no/such/case", "input /no/such/case does not exist"),
    ],
)
def test_find_input_cases_errors(source, match):
    with pytest.raises(DatasetError, match=match):
        find_input_cases(source, "brats2021")


def test_a_case_folder_missing_a_modality_is_the_data_layers_error(dataset_copy):
    root = dataset_copy("brats2021")
    case_dir = next(p for p in sorted(root.iterdir()) if p.is_dir())
    (case_dir / f"{case_dir.name}_t1.nii.gz").unlink()
    with pytest.raises(CaseError, match="missing t1 modality file"):
        find_input_cases(case_dir, "brats2021")


# ---------------------------------------------------------------------------------------
# predict
# ---------------------------------------------------------------------------------------


def test_predict_script_writes_a_mask_with_the_inputs_header(dataset_copy, tmp_path):
    root = dataset_copy("brats2021")
    case_dir = next(p for p in sorted(root.iterdir()) if p.is_dir())
    (case_dir / f"{case_dir.name}_seg.nii.gz").unlink()  # an unlabelled case
    run_dir = tmp_path / "run"
    # WT head at +8, TC/ET at -8: WT everywhere in the network window, so the mask is not empty.
    make_run_dir(
        run_dir,
        root,
        "brats2021",
        tmp_path,
        {"train": [], "val": [], "test": []},
        model=fixed_head_unet(bias=(8.0, -8.0, -8.0)),
    )
    out = tmp_path / "masks"
    result = run_script("predict.py", f"run_dir={run_dir}", f"input={case_dir}", f"output={out}", *CLI_BACKEND)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "wrote 1 mask(s) (brats2021 labels" in result.stdout

    flair = nib.load(case_dir / f"{case_dir.name}_flair.nii.gz")
    mask = nib.load(out / f"{case_dir.name}.nii.gz")
    assert mask.shape == flair.shape
    np.testing.assert_allclose(mask.affine, flair.affine, atol=1e-6)
    for key in ("qform_code", "sform_code", "pixdim", "srow_x", "srow_y", "srow_z"):
        np.testing.assert_array_equal(
            mask.header[key][:4] if key == "pixdim" else mask.header[key],
            flair.header[key][:4] if key == "pixdim" else flair.header[key],
            err_msg=key,
        )
    data = np.asarray(mask.dataobj)
    assert data.dtype == np.uint8 and set(np.unique(data)) == {0, LABELS["brats2021"].edema}
    assert (out / "overlays" / f"{case_dir.name}.png").is_file()


def test_predict_script_exits_2_on_bad_input(synthetic_root, tmp_path):
    run_dir = tmp_path / "run"
    make_run_dir(run_dir, synthetic_root["brats2021"], "brats2021", tmp_path, {"train": [], "val": [], "test": []})
    (run_dir / "checkpoints").mkdir()
    (run_dir / "checkpoints" / "best.keras").write_bytes(b"")  # never loaded: input is checked first
    result = run_script(
        "predict.py",
        f"run_dir={run_dir}",
        f"input={tmp_path / 'nowhere'}",
        f"output={tmp_path / 'out'}",
        *CLI_BACKEND,
        timeout=60,
    )
    assert result.returncode == 2 and "does not exist" in result.stderr and "Traceback" not in result.stderr


def test_brats2024_trains_four_outputs_and_predicts_the_cavity_label(synthetic_root, tmp_path):
    """Training on brats2024 derives 4 sigmoid outputs (no model.out_channels given) and
    monitors dice_rc; a model predicting RC writes label 4."""
    from brats_seg.backend import configure, decide_backend
    from brats_seg.config import BackendConfig, TrackingConfig, TrainerConfig
    from brats_seg.evaluation.inference.predict import predict_new_cases
    from brats_seg.training.loop import train
    from tests.conftest import data_config

    root = synthetic_root["brats2024"]
    cfg = TrainConfig(
        data=data_config(root, "brats2024", tmp_path),
        resolution=TINY,
        model=ModelConfig(depth=2, base_filters=4),
        trainer=TrainerConfig(epochs=1, batch_size=1, steps_per_epoch=1, val_every=1),
        tracking=TrackingConfig(name="none"),
        run_dir=str(tmp_path / "run"),
    )
    cfg.data.val_fraction, cfg.data.test_fraction = 0.34, 0.0
    configure(decide_backend(BackendConfig(name="cpu_onednn")))
    train(cfg)
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["model"]["out_channels"] == 4
    history = json.loads((tmp_path / "run" / "state.json").read_text())["history"]
    assert "dice_rc" in history[0] and "val_dice_rc" in history[0]

    model = fixed_head_unet(ModelConfig(depth=2, base_filters=4, out_channels=4), bias=(-8.0, -8.0, -8.0, 8.0))
    case = discover_cases(root, "brats2024")[0][0]
    (written,) = predict_new_cases(
        model,
        find_input_cases(case.images[0].parent, "brats2024"),
        cfg,
        tmp_path / "out",
        EvaluateConfig(overlays=False),
        progress=False,
    )
    assert set(np.unique(np.asarray(nib.load(written).dataobj))) == {0, 4}


def test_predict_an_msd_4d_image_keeps_its_affine(synthetic_root, tmp_path):
    from brats_seg.evaluation.inference.predict import predict_new_cases

    image4d = sorted((synthetic_root["msd"] / "imagesTr").glob("*.nii.gz"))[0]
    cfg = TrainConfig(resolution=TINY, model=ModelConfig(depth=2, base_filters=4))
    cfg.data.layout = "msd"
    model = fixed_head_unet(bias=(8.0, -8.0, -8.0))
    (written,) = predict_new_cases(
        model, find_input_cases(image4d, "msd"), cfg, tmp_path / "out", EvaluateConfig(overlays=False), progress=False
    )
    src, mask = nib.load(image4d), nib.load(written)
    assert mask.shape == src.shape[:3] and mask.header["dim"][0] == 3
    np.testing.assert_allclose(mask.affine, src.affine, atol=1e-6)
    assert set(np.unique(np.asarray(mask.dataobj))) == {0, LABELS["msd"].edema}
