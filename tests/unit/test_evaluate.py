"""Evaluation of a run: sliding-window inference, native-grid masks, metrics files, the CLI.

Fake run folders (config.json, split.json, checkpoints/best.keras) over the session's
synthetic datasets at the tiny resolution. Most evaluations use an *oracle* model (a test
double returning each cached case's true regions), so scores must be high: an
orientation, crop or resampling bug in the way back to the native grid shows as a low
Dice. The checkpoint path is exercised with a tiny U-Net whose head predicts nothing
(empty masks keep HD95 cheap; the untrained head's noisy masks cost ~15 s per case).
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import os
import subprocess
import sys
import types
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from brats_seg.config import EvaluateConfig, ModelConfig, TrackingConfig, TrainConfig, config_to_dict
from brats_seg.data.cache import prepare_cases
from brats_seg.data.dataset import dataset_cache_dir
from brats_seg.data.labels import LABELS
from brats_seg.data.layouts import discover_cases
from brats_seg.evaluation.evaluate import evaluate_run, split_case_ids
from brats_seg.evaluation.inference.predict import regions_to_mask
from brats_seg.evaluation.inference.run import RunError, check_evaluate_config
from brats_seg.evaluation.inference.sliding import (
    default_window,
    gaussian_importance_map,
    predict_volume,
    sliding_window_starts,
)
from brats_seg.evaluation.scoring.metrics import HD95_EMPTY_MM
from brats_seg.evaluation.scoring.score import score_masks
from brats_seg.evaluation.scoring.table import metric_columns
from tests.conftest import TINY, data_config

ROOT = Path(__file__).resolve().parents[2]
TINY_MODEL = ModelConfig(depth=2, base_filters=4, out_channels=3)
CONTRACT_COLUMNS = [
    "case_id",
    "dice_wt",
    "dice_tc",
    "dice_et",
    "hd95_wt",
    "hd95_tc",
    "hd95_et",
    "sens_wt",
    "sens_tc",
    "sens_et",
    "spec_wt",
    "spec_tc",
    "spec_et",
]
# Scripts in subprocesses: one thread each (2 cores are shared), CPU backend.
CLI_BACKEND = ["backend=cpu_onednn", "backend.intra_op_threads=1", "backend.inter_op_threads=1"]
CLI_ENV = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "-1"}


# ---------------------------------------------------------------------------------------
# Helpers shared with test_score_predict.py
# ---------------------------------------------------------------------------------------


def make_run_dir(
    run_dir: Path,
    root: Path,
    layout: str,
    cache_base: Path,
    split: dict,
    model_cfg: ModelConfig = TINY_MODEL,
    tracking: str = "none",
    model=None,
) -> TrainConfig:
    """A run folder as train.py writes it: config.json, split.json, optionally checkpoints/best.keras."""
    cfg = TrainConfig(
        data=data_config(root, layout, cache_base),
        resolution=TINY,
        model=model_cfg,
        tracking=TrackingConfig(name=tracking),
        run_dir=str(run_dir),
    )
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps(config_to_dict(cfg), indent=1))
    (run_dir / "split.json").write_text(json.dumps({"seed": 0, **split}))
    if model is not None:
        (run_dir / "checkpoints").mkdir(exist_ok=True)
        model.save(run_dir / "checkpoints" / "best.keras")
    return cfg


def fixed_head_unet(model_cfg: ModelConfig = TINY_MODEL, bias=(-8.0, -8.0, -8.0)):
    """A tiny U-Net whose head ignores its features: sigmoid(bias) everywhere (-8: empty, +8: full)."""
    import keras

    from brats_seg.model.unet3d import build_unet3d

    keras.utils.set_random_seed(0)
    model = build_unet3d(model_cfg, TINY.shape)
    head = model.get_layer("head_conv")
    kernel, _ = head.get_weights()
    head.set_weights([np.zeros_like(kernel), np.asarray(bias[: model_cfg.out_channels], dtype=np.float32)])
    return model


def _image_key(image: np.ndarray) -> str:
    return hashlib.sha1(np.ascontiguousarray(image, dtype=np.float32).tobytes()).hexdigest()


class OracleModel:
    """Test double of a Keras model: returns each cached case's true regions as probabilities.

    ``predict_volume`` only uses ``input_shape``, ``layers`` and ``__call__``. Regions become
    0.05 / 0.95, so the 0.5 threshold recovers them after linear resampling.
    """

    layers = ()

    def __init__(self, entries, out_channels: int = 3, transform=None) -> None:
        self.input_shape = (None, *TINY.shape, 4)
        self._truth = {}
        for entry in entries:
            image = np.load(entry.image_path).astype(np.float32)
            regions = np.load(entry.regions_path)[..., :out_channels]
            regions = transform(regions) if transform is not None else regions
            truth = 0.05 + 0.9 * regions.astype(np.float32)
            self._truth[_image_key(image)] = truth
            # test-time mirroring (evaluate.mirror) asks for the L-R mirrored image too
            self._truth[_image_key(np.ascontiguousarray(image[::-1]))] = np.ascontiguousarray(truth[::-1])

    def __call__(self, batch, training=False):
        return np.stack([self._truth[_image_key(x)] for x in np.asarray(batch)])


def case_ids(root: Path, layout: str) -> list[str]:
    return [c.case_id for c in discover_cases(root, layout)[0]]


def prepare_entries(cfg: TrainConfig, ids: list[str]):
    """Cache entries of ``ids`` where evaluate_run looks for them."""
    cases = [c for c in discover_cases(cfg.data.root, cfg.data.layout)[0] if c.case_id in ids]
    cache_root = dataset_cache_dir(cfg.data) / cfg.resolution.name
    entries, errors, _ = prepare_cases(cases, cache_root, TINY.spacing_mm, TINY.shape, num_workers=1, progress=False)
    assert not errors
    return entries


def read_csv(path: Path) -> tuple[list[str], list[dict]]:
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames), list(reader)


def run_script(name: str, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / name), *args],
        cwd=ROOT,
        env=CLI_ENV,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# ---------------------------------------------------------------------------------------
# Sliding windows
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "size,window,overlap,expected",
    [
        (48, 24, 0.5, [0, 12, 24]),
        (56, 28, 0.5, [0, 14, 28]),
        (40, 40, 0.5, [0]),
        (10, 4, 0.0, [0, 3, 6]),  # no overlap asked; evenly spread windows still overlap a little
        (40, 16, 0.75, [0, 4, 8, 12, 16, 20, 24]),
        (7, 3, 0.5, [0, 1, 3, 4]),  # steps of 4/3 voxel, rounded
    ],
)
def test_sliding_window_starts(size, window, overlap, expected):
    starts = sliding_window_starts(size, window, overlap)
    assert starts == expected
    assert starts[0] == 0 and starts[-1] + window == size  # every voxel covered, none past the end
    assert all(b - a <= math.ceil(window * (1 - overlap)) for a, b in zip(starts, starts[1:]))


@pytest.mark.parametrize(
    "shape,depth,expected",
    [
        ((48, 56, 40), 2, (24, 28, 20)),
        ((48, 56, 40), 4, (32, 32, 16)),
        ((96, 112, 80), 4, (48, 64, 48)),  # halves 48, 56, 40: ties round up
        ((16, 16, 16), 4, (16, 16, 16)),  # never below 2**depth
    ],
)
def test_default_window_is_half_the_grid_rounded(shape, depth, expected):
    assert default_window(shape, depth) == expected


def test_gaussian_importance_map_peaks_at_the_centre_and_is_never_zero():
    w = gaussian_importance_map((24, 28, 20))
    assert w.shape == (24, 28, 20) and w.dtype == np.float32
    assert w.max() == pytest.approx(1.0) and w.min() > 0
    assert np.allclose(w, w[::-1, ::-1, ::-1])  # symmetric about the centre
    assert w[0, 0, 0] < 1e-6 * w.max()  # corners count next to nothing (sigma = window / 8)


def _image(seed: int = 0) -> np.ndarray:
    """A smooth-ish (48, 56, 40, 4) image: low-frequency blobs, zero 'background' border."""
    from scipy import ndimage as ndi

    rng = np.random.default_rng(seed)
    image = ndi.gaussian_filter(rng.standard_normal((*TINY.shape, 4)), sigma=(3, 3, 3, 0)) * 5
    image[:4], image[-4:], image[:, :4], image[:, -4:] = 0, 0, 0, 0
    return image.astype(np.float32)


def _conv_model(kernel_size: int):
    import keras

    keras.utils.set_random_seed(0)
    inp = keras.Input((*TINY.shape, 4))
    init = "glorot_uniform" if kernel_size == 1 else keras.initializers.Constant(1.0 / (4 * kernel_size**3))
    out = keras.layers.Conv3D(3, kernel_size, padding="same", kernel_initializer=init, activation="sigmoid")(inp)
    return keras.Model(inp, out)


def test_sliding_equals_whole_for_a_pointwise_model():
    # A 1x1x1 model gives every window the same value per voxel, so the Gaussian-weighted mean
    # must return it exactly: this checks coverage, weighting and normalisation (float32 error only).
    model, image = _conv_model(1), _image()
    whole = predict_volume(model, image)
    sliding = predict_volume(model, image, mode="sliding", depth=2, batch_size=2)
    assert whole.shape == sliding.shape == (*TINY.shape, 3) and sliding.dtype == np.float32
    np.testing.assert_allclose(sliding, whole, atol=1e-5)


def test_sliding_agrees_with_whole_for_a_smooth_local_model():
    # A 3x3x3 mean filter: sliding differs from whole only in the 1-voxel rim of each window's
    # inner faces (zero padding there), and the Gaussian gives that rim a weight of ~e^-8
    # relative to the centre of the windows that also cover those voxels. Measured: mean
    # 1.4e-6, max 1.3e-4; the bounds below leave ~10x margin.
    model, image = _conv_model(3), _image()
    diff = np.abs(predict_volume(model, image, mode="sliding", depth=2) - predict_volume(model, image))
    assert diff.mean() < 2e-5 and diff.max() < 2e-3


def test_sliding_agrees_with_whole_for_a_unet():
    # A depth-2 U-Net (inference-mode BatchNorm: the same affine map in every window) sees ~40
    # voxels around each output, more than a window, so windows do differ from the whole
    # volume near their inner faces; the Gaussian blend keeps that small. Measured with
    # 32^3 windows: mean 2.8e-4, 99th percentile 2.1e-3, max 9e-3 of probabilities in
    # [0, 1]; thresholded masks agree with Dice 0.97. Bounds: ~4x the measured values.
    import keras

    from brats_seg.model.unet3d import build_unet3d

    keras.utils.set_random_seed(0)
    # foreground_prior=0.5: head bias 0, probabilities spread around 0.5 (the sensitive case).
    model = build_unet3d(
        ModelConfig(depth=2, base_filters=4, norm="batch", foreground_prior=0.5, out_channels=3), TINY.shape
    )
    image = _image(1)
    whole = predict_volume(model, image)
    sliding = predict_volume(model, image, mode="sliding", window=[32, 32, 32], overlap=0.5)
    diff = np.abs(sliding - whole)
    assert diff.mean() < 1e-3 and np.percentile(diff, 99) < 1e-2 and diff.max() < 4e-2
    a, b = whole > 0.5, sliding > 0.5
    assert 2 * np.sum(a & b) / (a.sum() + b.sum()) > 0.9


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(mode="sliding", window=[30, 32, 32]), "not divisible by 2\\*\\*depth = 4"),
        (dict(mode="tiles"), "evaluate.mode='tiles'"),
        (dict(mode="sliding", overlap=1.0), "window_overlap=1.0"),
    ],
)
def test_predict_volume_rejects_bad_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        predict_volume(_conv_model(1), _image(), depth=2, **kwargs)


def test_wt_only_regions_are_written_with_the_edema_label():
    wt = np.zeros((4, 4, 4, 1), dtype=bool)
    wt[1:3, 1:3, 1:3] = True
    for layout, conv in LABELS.items():
        mask = regions_to_mask(wt, layout, ("wt",))
        assert set(np.unique(mask)) == {0, conv.edema}
        assert np.array_equal(mask > 0, wt[..., 0])


# ---------------------------------------------------------------------------------------
# evaluate_run on fake runs
# ---------------------------------------------------------------------------------------


def _evaluate_fake_run(layout: str, synthetic_root, tmp_path_factory):
    base = tmp_path_factory.mktemp(f"eval_{layout}")
    root = synthetic_root[layout]
    ids = case_ids(root, layout)
    split = {"train": ids[:1], "val": [], "test": ids[1:]}
    cfg = make_run_dir(base / "run", root, layout, base, split)
    entries = prepare_entries(cfg, ids[1:])
    summary = evaluate_run(base / "run", "test", model=OracleModel(entries), progress=False)
    return types.SimpleNamespace(
        layout=layout,
        root=root,
        base=base,
        run_dir=base / "run",
        cfg=cfg,
        split=split,
        test_ids=ids[1:],
        entries=entries,
        summary=summary,
    )


@pytest.fixture(scope="module")
def brats_eval(synthetic_root, tmp_path_factory):
    return _evaluate_fake_run("brats2021", synthetic_root, tmp_path_factory)


@pytest.fixture(scope="module")
def msd_eval(synthetic_root, tmp_path_factory):
    return _evaluate_fake_run("msd", synthetic_root, tmp_path_factory)


@pytest.fixture(params=["brats2021", "msd"])
def evaluated(request):
    return request.getfixturevalue({"brats2021": "brats_eval", "msd": "msd_eval"}[request.param])


def _label_file(ev, case_id: str) -> Path:
    return next(c.label for c in discover_cases(ev.root, ev.layout)[0] if c.case_id == case_id)


def test_masks_sit_on_the_original_label_grid(evaluated):
    header_keys = (
        "dim",
        "pixdim",
        "qform_code",
        "sform_code",
        "quatern_b",
        "quatern_c",
        "quatern_d",
        "qoffset_x",
        "qoffset_y",
        "qoffset_z",
        "srow_x",
        "srow_y",
        "srow_z",
        "xyzt_units",
    )
    for case_id in evaluated.test_ids:
        ref = nib.load(_label_file(evaluated, case_id))
        mask = nib.load(evaluated.run_dir / "eval" / "test" / "predictions" / f"{case_id}.nii.gz")
        assert mask.shape == ref.shape
        np.testing.assert_allclose(mask.affine, ref.affine, atol=1e-6)
        for key in header_keys:
            np.testing.assert_array_equal(mask.header[key], ref.header[key], err_msg=key)
        data = np.asarray(mask.dataobj)
        assert data.dtype == np.uint8
        assert set(np.unique(data)) <= set(LABELS[evaluated.layout].values)
        # The oracle's mask overlaps the reference labels voxel for voxel on the file's grid.
        ref_data = np.asarray(ref.dataobj)
        assert 2 * np.sum((data > 0) & (ref_data > 0)) / (np.sum(data > 0) + np.sum(ref_data > 0)) > 0.8


def test_metrics_csv_has_the_contract_columns_and_one_row_per_test_case(evaluated):
    columns, rows = read_csv(evaluated.run_dir / "eval" / "test" / "metrics.csv")
    assert columns[: len(CONTRACT_COLUMNS)] == CONTRACT_COLUMNS  # the legacy columns first, as before
    assert columns == list(metric_columns(("wt", "tc", "et")))
    assert [r["case_id"] for r in rows] == evaluated.test_ids
    for row in rows:  # the oracle scores well only if the way back to the native grid is right
        assert float(row["dice_wt"]) > 0.8 and float(row["hd95_wt"]) < 10
        assert all(math.isfinite(float(row[c])) for c in CONTRACT_COLUMNS[1:])
        assert float(row["lesion_dice_wt"]) > 0.8 and float(row["lesion23_dice_wt"]) > 0.7
        assert int(float(row["lesions_ref_wt"])) >= 1 and float(row["rq_wt"]) > 0


def test_summary_json_has_mean_median_std_per_column(evaluated):
    summary = json.loads((evaluated.run_dir / "eval" / "test" / "summary.json").read_text())
    assert set(summary) == {"n_cases", "postprocess", *metric_columns(("wt", "tc", "et"))[1:]}
    assert summary["n_cases"] == len(evaluated.test_ids)
    assert summary["postprocess"] is None  # the run has no val cases to choose it on
    for column in metric_columns(("wt", "tc", "et"))[1:]:
        assert {"mean", "median", "std", "n", "n_inf"} <= set(summary[column])
    assert summary["dice_wt"]["mean"] == pytest.approx(evaluated.summary["dice_wt"]["mean"])


def test_overlays_are_written(evaluated):
    for case_id in evaluated.test_ids:
        png = evaluated.run_dir / "eval" / "test" / "overlays" / f"{case_id}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _assert_score_py_reproduces(run_dir: Path, root: Path, layout: str, test_ids, tmp_path) -> list[dict]:
    """scripts/score.py's code path on the written masks gives metrics.csv cell for cell."""
    result = score_masks(
        run_dir / "eval" / "test" / "predictions", root, layout, out=tmp_path / "scores.csv", progress=False
    )
    columns, evaluated_rows = read_csv(run_dir / "eval" / "test" / "metrics.csv")
    scored_columns, scored_rows = read_csv(result.csv_path)
    assert scored_columns == columns
    scored = {r["case_id"]: r for r in scored_rows}
    for row in evaluated_rows:
        assert scored[row["case_id"]] == row
    assert result.missing == [c for c in case_ids(root, layout) if c not in test_ids]
    return evaluated_rows


def test_scoring_the_written_masks_reproduces_the_evaluation(evaluated, tmp_path):
    _assert_score_py_reproduces(evaluated.run_dir, evaluated.root, evaluated.layout, evaluated.test_ids, tmp_path)


def test_non_nested_network_output_is_scored_as_the_mask_that_is_written(brats_eval, tmp_path):
    """A network whose ET sticks out of its WT and TC (and whose TC misses its ET): the file
    written is the nested label map (ET wins), and metrics.csv scores that file, so score.py
    on the written masks gives the same CSV, and WT includes the ET voxels outside WT."""

    def shift_et(regions):
        out = regions.copy()
        out[..., 2] = np.roll(regions[..., 2], 6, axis=0)  # ET moved 6 voxels (24 mm) along x
        out[..., 1] = regions[..., 1] & ~regions[..., 2]  # TC without its ET
        return out

    run_dir = brats_eval.base / "run_non_nested"
    make_run_dir(run_dir, brats_eval.root, "brats2021", brats_eval.base, brats_eval.split)
    evaluate_run(
        run_dir,
        "test",
        eval_cfg=EvaluateConfig(overlays=False, mirror=False),
        model=OracleModel(brats_eval.entries, transform=shift_et),
        progress=False,
    )
    rows = _assert_score_py_reproduces(run_dir, brats_eval.root, "brats2021", brats_eval.test_ids, tmp_path)
    table = LABELS["brats2021"]
    with_et = 0
    for row in rows:
        mask = np.asarray(nib.load(run_dir / "eval" / "test" / "predictions" / f"{row['case_id']}.nii.gz").dataobj)
        ref = np.asarray(nib.load(_label_file(brats_eval, row["case_id"])).dataobj)
        wt, tc, et = (np.isin(mask, r.labels) for r in table.regions)
        if np.isin(ref, table.regions[2].labels).any():  # the generator makes some cases without ET
            with_et += 1
            assert (et & ~np.isin(ref, table.regions[0].labels)).any(), row["case_id"]  # ET outside the true WT is kept
        assert np.all(et <= tc) and np.all(tc <= wt)  # and the written map is nested
        ref_wt = np.isin(ref, table.regions[0].labels)
        expected = 2 * np.sum(wt & ref_wt) / (wt.sum() + ref_wt.sum())
        assert float(row["dice_wt"]) == pytest.approx(expected, abs=1e-12)
    assert with_et >= 1


class _FakeTracker:
    """Stands in for brats_seg.tracking.Tracker: records what evaluation logs."""

    calls: list = []

    @classmethod
    def resume(cls, run_dir, fallback=None):
        cls.calls.append(("resume", Path(run_dir), fallback))
        return cls()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.calls.append(("end",))
        return False

    def log_metrics(self, metrics, step=None):
        self.calls.append(("metrics", dict(metrics), step))

    def log_artifacts(self, folder, artifact_path=None):
        self.calls.append(("artifacts", Path(folder), artifact_path))

    def log_datasets(self, inputs):
        self.calls.append(("datasets", list(inputs)))

    def log_table(self, columns, artifact_file):
        self.calls.append(("table", dict(columns), artifact_file))


def test_wt_only_model_scores_wt_and_logs_to_mlflow(evaluated, monkeypatch):
    from brats_seg.tracking import datasets  # noqa: F401 - imported while brats_seg.tracking is itself
    from brats_seg.tracking.names import evaluation_metric_key

    monkeypatch.setitem(
        sys.modules,
        "brats_seg.tracking",
        types.SimpleNamespace(Tracker=_FakeTracker, evaluation_metric_key=evaluation_metric_key),
    )
    _FakeTracker.calls = []
    run_dir = evaluated.base / "run_wt"
    make_run_dir(
        run_dir,
        evaluated.root,
        evaluated.layout,
        evaluated.base,
        evaluated.split,
        model_cfg=ModelConfig(depth=2, base_filters=4, out_channels=1),
        tracking="mlflow",
    )
    summary = evaluate_run(
        run_dir,
        "test",
        eval_cfg=EvaluateConfig(overlays=False),
        model=OracleModel(evaluated.entries, out_channels=1),
        progress=False,
    )

    columns, rows = read_csv(run_dir / "eval" / "test" / "metrics.csv")
    assert columns == list(metric_columns(("wt", "tc", "et")))
    for row in rows:
        assert float(row["dice_wt"]) > 0.8 and float(row["lesion_dice_wt"]) > 0.8
        assert all(row[c] == "" for c in columns if c.endswith(("_tc", "_et")))  # not predicted: undefined
    assert summary["dice_tc"]["n"] == 0 and math.isnan(summary["dice_tc"]["mean"])
    saved = json.loads((run_dir / "eval" / "test" / "summary.json").read_text())
    assert saved["dice_et"]["mean"] is None
    edema = LABELS[evaluated.layout].edema
    for case_id in evaluated.test_ids:
        mask = np.asarray(nib.load(run_dir / "eval" / "test" / "predictions" / f"{case_id}.nii.gz").dataobj)
        assert set(np.unique(mask)) == {0, edema}

    kinds = [c[0] for c in _FakeTracker.calls]
    assert kinds == ["resume", "metrics", "datasets", "artifacts", "table", "end"]
    metrics = _FakeTracker.calls[1][1]
    assert metrics["Eval test/dice_wt"] == pytest.approx(summary["dice_wt"]["mean"])
    assert "eval test median/hd95_wt" in metrics and "Eval test/dice_tc" not in metrics  # NaN not logged
    (scored,) = _FakeTracker.calls[2][1]  # the split it scored, an MLflow dataset input
    assert scored.dataset.name == f"{evaluated.layout}/eval/test"
    assert {t.key: t.value for t in scored.tags} == {"mlflow.data.context": "evaluation"}
    assert json.loads(scored.dataset.profile)["cases"] == len(evaluated.test_ids)
    assert _FakeTracker.calls[3][1:] == (run_dir / "eval" / "test", "eval/test")
    table, artifact = _FakeTracker.calls[4][1:]  # metrics.csv as MLflow's table artifact
    assert artifact == "eval/test/metrics_table.json"
    assert list(table) == columns and table["case_id"] == [row["case_id"] for row in rows]
    assert table["dice_wt"] == pytest.approx([float(row["dice_wt"]) for row in rows])


def test_split_all_is_every_case_of_split_json(brats_eval):
    assert split_case_ids(brats_eval.run_dir, "all") == case_ids(brats_eval.root, "brats2021")


def test_unknown_split_is_refused(brats_eval):
    with pytest.raises(RunError, match="split='train': use one of val, test, all"):
        evaluate_run(brats_eval.run_dir, "train")


def test_run_without_config_or_checkpoint_says_train_first(brats_eval, tmp_path):
    with pytest.raises(RunError, match="train first: python train.py run_dir="):
        evaluate_run(tmp_path)
    with pytest.raises(RunError, match="checkpoints/best.keras not found.*train first"):
        evaluate_run(brats_eval.run_dir, "test")  # the oracle run has no checkpoint


def test_bad_evaluate_settings_are_refused_before_any_work(brats_eval):
    run_dir = brats_eval.base / "run_batchnorm"
    make_run_dir(
        run_dir,
        brats_eval.root,
        "brats2021",
        brats_eval.base,
        brats_eval.split,
        model_cfg=ModelConfig(depth=2, base_filters=4, out_channels=3, norm="batch"),
    )
    with pytest.raises(RunError, match="evaluate.window=\\[30, 32, 32\\] is not divisible"):
        evaluate_run(
            run_dir, "test", eval_cfg=EvaluateConfig(mode="sliding", window=[30, 32, 32]), model=OracleModel([])
        )


@pytest.mark.parametrize("norm", ["instance", "group"])
def test_sliding_windows_are_refused_for_volume_normalised_models(brats_eval, norm):
    """Instance/group norm statistics over a window differ from the whole volume the model
    trained on: refused with the reason, before any model is loaded or case prepared."""
    cfg = EvaluateConfig(mode="sliding")
    model = ModelConfig(depth=2, base_filters=4, out_channels=3, norm=norm)
    with pytest.raises(RunError, match=f"evaluate.mode=sliding with model.norm={norm}.*evaluate.mode=whole"):
        check_evaluate_config(cfg, model)
    check_evaluate_config(EvaluateConfig(mode="whole"), model)
    check_evaluate_config(cfg, ModelConfig(depth=2, base_filters=4, out_channels=3, norm="batch"))
    with pytest.raises(RunError, match="model.norm=instance"):
        evaluate_run(brats_eval.run_dir, "test", eval_cfg=cfg, model=OracleModel([]))


def test_instance_norm_statistics_differ_between_a_window_and_the_whole_volume():
    """Why the refusal: the same voxels give other outputs in a window than in the whole volume."""
    import keras

    from brats_seg.model.unet3d import build_unet3d

    keras.utils.set_random_seed(0)
    model = build_unet3d(ModelConfig(depth=2, base_filters=4, out_channels=3, foreground_prior=0.5), TINY.shape)
    image = _image(2)
    whole = predict_volume(model, image)
    window = predict_volume(model, image[:32, :32, :32])  # the corner window, whole-volume mode on it
    diff = np.abs(window[8:24, 8:24, 8:24] - whole[8:24, 8:24, 8:24])  # interior: no padding effect
    assert diff.mean() > 1e-3


def test_load_run_model_restores_the_checkpoint(tmp_path):
    from brats_seg.evaluation.inference.run import load_run_model

    model = fixed_head_unet(bias=(1.0, 0.0, -1.0))
    cfg = make_run_dir(
        tmp_path / "run", tmp_path / "data", "brats2021", tmp_path, {"train": [], "val": [], "test": []}, model=model
    )
    loaded = load_run_model(tmp_path / "run", "best", cfg)
    image = _image()
    np.testing.assert_allclose(predict_volume(loaded, image), predict_volume(model, image), atol=1e-6)


# ---------------------------------------------------------------------------------------
# scripts/evaluate.py
# ---------------------------------------------------------------------------------------


def test_evaluate_script_runs_on_a_checkpoint(brats_eval, tmp_path):
    run_dir = tmp_path / "run"
    make_run_dir(run_dir, brats_eval.root, "brats2021", brats_eval.base, brats_eval.split, model=fixed_head_unet())
    result = run_script("evaluate.py", f"run_dir={run_dir}", "split=test", "evaluate.overlays=false", *CLI_BACKEND)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "BraTS 2023-24 rank" in result.stdout and "lesion-wise (2025+)" in result.stdout and "WT" in result.stdout
    assert str(run_dir / "eval" / "test" / "metrics.csv") in result.stdout
    _, rows = read_csv(run_dir / "eval" / "test" / "metrics.csv")
    assert [r["case_id"] for r in rows] == brats_eval.test_ids
    for row in rows:  # the head predicts nothing: the empty-mask rule
        assert float(row["dice_wt"]) == 0.0 and float(row["hd95_wt"]) == HD95_EMPTY_MM
    assert len(list((run_dir / "eval" / "test" / "predictions").glob("*.nii.gz"))) == len(rows)


@pytest.mark.parametrize(
    "args,message",
    [
        ([], "train first: python train.py run_dir="),
        (["split=train"], "split='train': use one of val, test, all"),
    ],
)
def test_evaluate_script_exits_2_with_a_message(tmp_path, args, message):
    result = run_script("evaluate.py", f"run_dir={tmp_path / 'no_run'}", *args, *CLI_BACKEND, timeout=60)
    assert result.returncode == 2
    assert message in result.stderr and "Traceback" not in result.stderr


def test_mirror_averages_the_left_right_mirrored_prediction():
    """Test-time mirroring: mean of f(x) and flip(f(flip(x))) along x, exactly."""
    import keras

    inp = keras.Input((8, 8, 8, 4))
    out = keras.layers.Conv3D(3, 3, padding="same", activation="sigmoid", kernel_initializer="glorot_uniform")(inp)
    model = keras.Model(inp, out)
    image = np.random.default_rng(0).standard_normal((8, 8, 8, 4)).astype(np.float32)
    plain = predict_volume(model, image)
    flipped = predict_volume(model, np.ascontiguousarray(image[::-1]))[::-1]
    np.testing.assert_allclose(predict_volume(model, image, mirror=True), 0.5 * (plain + flipped), rtol=1e-6)
    assert not np.allclose(plain, flipped)  # the model is not symmetric, so mirroring changes something


def test_a_split_scored_on_another_dataset_of_its_cases_goes_to_its_own_folder(brats_eval, tmp_path):
    """``on=``: the run's test cases read from another dataset (here a copy, so the scores must be
    the run's own), written beside the run's evaluation, not over it."""
    import dataclasses
    import shutil

    copy = Path(shutil.copytree(brats_eval.root, tmp_path / "copy"))
    other = dataclasses.replace(brats_eval.cfg.data, name="copy", root=str(copy))
    own = (brats_eval.run_dir / "eval" / "test" / "metrics.csv").read_bytes()
    summary = evaluate_run(
        brats_eval.run_dir, "test", model=OracleModel(brats_eval.entries), progress=False, data=other
    )
    out = brats_eval.run_dir / "eval" / "test@copy"
    assert read_csv(out / "metrics.csv") == read_csv(brats_eval.run_dir / "eval" / "test" / "metrics.csv")
    assert (brats_eval.run_dir / "eval" / "test" / "metrics.csv").read_bytes() == own  # untouched
    assert summary["n_cases"] == len(brats_eval.test_ids) and (out / "predictions").is_dir()
    with pytest.raises(RunError, match="data=copy is in the msd layout, the run .* was trained on brats2021"):
        evaluate_run(
            brats_eval.run_dir,
            "test",
            model=OracleModel(brats_eval.entries),
            progress=False,
            data=dataclasses.replace(other, layout="msd"),
        )
