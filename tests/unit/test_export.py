"""scripts/export.py: a run's model as a SavedModel that serves without brats_seg, its
preprocessing.json, and scripts/predict.py export= predicting as the run does.

The run is a folder as train.py writes it over one synthetic brats2021 case at 2 mm (a generated
case, every second voxel: :func:`write_small_dataset`), whose best.keras is a tiny U-Net (depth 2,
4 filters) with a random head: its regions vary over the brain, so the masks hold every label of
the layout, and a wrong weight, channel, grid or region order shows in them. A patch run beside it
(``trainer.patch_size``, depth 3, its checkpoint saved from the model built at the patch as
training builds it) exports a SavedModel that slides the patch's windows inside its graph.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import nibabel as nib
import numpy as np
import pytest

from brats_seg.config import EvaluateConfig, ModelConfig, TrainConfig, config_to_dict, flatten_config
from brats_seg.data.labels import LABELS, output_regions, resolve_model_outputs
from brats_seg.data.layouts import CHANNELS, discover_cases
from brats_seg.evaluation.inference.run import RunError
from brats_seg.evaluation.serving.export import check_export_output, describe_export, is_export_dir
from brats_seg.evaluation.serving.exported import check_export_settings, export_precision, predict_source, read_export
from brats_seg.run_dir import RunFolder
from tests.conftest import TINY
from tests.unit.test_evaluate import (
    CLI_BACKEND,
    CLI_ENV,
    ROOT,
    TINY_MODEL,
    fixed_head_unet,
    make_run_dir,
    run_script,
)
from tests.unit.test_resume_eval_predict import write_small_dataset

# Probabilities (in [0, 1]) of the SavedModel in another process against the Keras model's here, on
# the same float32 input with the same thread counts: the same kernels run, and they came out equal
# bit for bit. The tolerance is float32 rounding of reordered sums (oneDNN splits a convolution's
# sums by thread count: with other thread counts a steep head differed by up to 1.5e-4), far below
# what a wrong weight, channel or region gives (0.98 with the channels reversed).
ATOL = 1e-5


PATCH = [24, 32, 24]  # trainer.patch_size of the patch run: 3 x 3 x 3 windows over 48x56x40 at overlap 0.5
PATCH_MODEL = ModelConfig(depth=3, base_filters=4, out_channels=3)  # instance norm, as by default


def random_head_unet(model_cfg: ModelConfig = TINY_MODEL, shape=None):
    """The tiny U-Net with a random head (seeded): features decide, and the regions vary over the brain.
    ``shape``: the grid it is built at (None: the network grid; a patch run's training model: the patch)."""
    from brats_seg.model.unet3d import build_unet3d

    model = fixed_head_unet(model_cfg, bias=(2.0, 0.0, -0.5))
    if shape is not None:
        at_shape = build_unet3d(model_cfg, tuple(shape))
        at_shape.set_weights(model.get_weights())
        model = at_shape
    head = model.get_layer("head_conv")
    kernel, bias = head.get_weights()
    head.set_weights([np.random.default_rng(0).normal(0.0, 1.0, kernel.shape).astype(np.float32), bias])
    return model


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A run folder, its export (made in this process) and its one case."""
    from brats_seg.data.phantoms.synthetic import write_synthetic_dataset
    from brats_seg.evaluation.serving.export import export_run

    base = tmp_path_factory.mktemp("export")
    write_synthetic_dataset(base / "source", "brats2021", n_cases=1, seed=0)  # as the session's first case
    root = base / "data"
    write_small_dataset(base / "source", root, 1)
    run_dir = base / "run"
    config = make_run_dir(
        run_dir, root, "brats2021", base, {"train": [], "val": [], "test": []}, model=random_head_unet()
    )
    folder = export_run(run_dir, base / "saved")
    (case,) = discover_cases(root, "brats2021")[0]
    return SimpleNamespace(base=base, root=root, run_dir=run_dir, config=config, folder=folder, case=case)


@pytest.fixture(scope="module")
def patch_exported(exported):
    """A patch run (``trainer.patch_size=PATCH``) over the same data, and its export, timed."""
    import time

    from brats_seg.evaluation.serving.export import export_run

    base = exported.base / "patch"
    run_dir = base / "run"
    config = make_run_dir(
        run_dir,
        exported.root,
        "brats2021",
        base,
        {"train": [], "val": [], "test": []},
        model_cfg=PATCH_MODEL,
        model=random_head_unet(PATCH_MODEL, PATCH),
    )
    config.trainer.patch_size = list(PATCH)
    (run_dir / "config.json").write_text(json.dumps(config_to_dict(config), indent=1))
    start = time.perf_counter()
    folder = export_run(run_dir, base / "saved")
    export_s = time.perf_counter() - start
    print(
        f"export of the tiny patch run ({'x'.join(map(str, PATCH))} over {'x'.join(map(str, TINY.shape))}): "
        f"{export_s:.1f} s, saved_model.pb {(folder / 'saved_model.pb').stat().st_size / 1e6:.2f} MB"
    )
    return SimpleNamespace(run_dir=run_dir, config=config, folder=folder, export_s=export_s)


def _network_image(ex) -> np.ndarray:
    """The case preprocessed as brats_seg does: float16 ``(X, Y, Z, 4)`` on the network grid."""
    from brats_seg.data.case_io import load_case_image
    from brats_seg.data.preprocess import preprocess_case

    image, ref = load_case_image(ex.case)
    net, _, _ = preprocess_case(ex.case.case_id, image, ref.spacing_mm, TINY.spacing_mm, TINY.shape)
    return net


_CHILD = textwrap.dedent("""
    import json, sys
    import numpy as np
    import tensorflow as tf

    folder, inputs, out, intra, inter = sys.argv[1:6]
    tf.config.threading.set_intra_op_parallelism_threads(int(intra))
    tf.config.threading.set_inter_op_parallelism_threads(int(inter))
    serve = tf.saved_model.load(folder).signatures["serving_default"]
    spec = serve.structured_input_signature[1]["image"]
    batch = np.load(inputs)  # (2, X, Y, Z, 4) float32: the case and its left-right mirror
    probs = serve(image=tf.constant(batch))["probabilities"].numpy()
    try:
        serve(image=tf.constant(batch[:, :, :, :-8]))  # another grid
        other_grid = "accepted"
    except (ValueError, TypeError, tf.errors.InvalidArgumentError) as e:
        other_grid = type(e).__name__
    np.save(out, probs)
    print(json.dumps({"input_shape": spec.shape.as_list(), "input_dtype": spec.dtype.name,
                      "other_grid": other_grid, "brats_seg_imported": "brats_seg" in sys.modules}))
    assert "brats_seg" not in sys.modules
""")


def test_the_savedmodel_serves_in_a_process_without_brats_seg_as_the_keras_model_predicts(exported, tmp_path):
    import tensorflow as tf

    from brats_seg.evaluation.inference.run import load_run_model
    from brats_seg.evaluation.inference.sliding import predict_volume

    net = _network_image(exported)
    batch = np.stack([net, net[::-1]]).astype(np.float32)  # a batch of 2: the batch axis is free
    np.save(tmp_path / "inputs.npy", batch)
    model = load_run_model(exported.run_dir, "best")
    expected = np.stack([predict_volume(model, x) for x in batch])  # brats_seg's own whole-volume inference
    threads = [
        tf.config.threading.get_intra_op_parallelism_threads(),
        tf.config.threading.get_inter_op_parallelism_threads(),
    ]
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            _CHILD,
            str(exported.folder),
            str(tmp_path / "inputs.npy"),
            str(tmp_path / "out.npy"),
            *map(str, threads),
        ],
        cwd=tmp_path,
        env={k: v for k, v in CLI_ENV.items() if k != "PYTHONPATH"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    report = json.loads(child.stdout.strip().splitlines()[-1])
    assert report["brats_seg_imported"] is False
    assert report["input_shape"] == [None, *TINY.shape, 4] and report["input_dtype"] == "float32"
    assert report["other_grid"] != "accepted"
    probs = np.load(tmp_path / "out.npy")
    assert probs.shape == (2, *TINY.shape, 3) and probs.dtype == np.float32
    assert (probs.std(axis=(0, 1, 2, 3)) > 0.05).all()  # no region constant: the comparison tells models apart
    np.testing.assert_allclose(probs, expected, rtol=0, atol=ATOL)
    assert not np.allclose(probs[0], probs[1], atol=1e-3)  # the two cases of the batch were not mixed up


def test_preprocessing_json_describes_the_run(exported):
    description = json.loads((exported.folder / "preprocessing.json").read_text())
    config = RunFolder.of(exported.run_dir).read_config()
    table = LABELS["brats2021"]
    pre = description["preprocessing"]
    assert pre["spacing_mm"] == TINY.spacing_mm == config.resolution.spacing_mm
    assert pre["shape"] == list(TINY.shape) and pre["orientation"] == "RAS"
    assert description["signature"]["input"]["shape"] == [None, *TINY.shape, 4]
    assert description["signature"]["input"]["channels"] == list(CHANNELS) == ["flair", "t1", "t1ce", "t2"]
    assert description["signature"]["output"]["shape"] == [None, *TINY.shape, 3]
    assert [r["name"] for r in description["regions"]] == ["wt", "tc", "et"]
    assert [r["labels"] for r in description["regions"]] == [list(r.labels) for r in table.regions]
    assert description["labels"]["names"] == {"1": "NCR/NET", "2": "ED", "4": "ET"}
    assert description["postprocessing"]["threshold"] == EvaluateConfig().threshold == 0.5
    assert description["postprocessing"]["paint_order"] == [["wt", 2], ["tc", 1], ["et", 4]]
    assert description["precision"] == {"backend": "fp32", "dtype_policy": "float32", "trained": "fp32"}
    identity = RunFolder.of(exported.run_dir).checkpoint_identity("best")
    assert description["run"]["checkpoint_sha256"] == identity["sha256"]
    assert description["run"]["run_dir"] == str(exported.run_dir.resolve())
    assert description["brats_seg"]["version"] and description["brats_seg"]["git_commit"]
    # the run's config, whole: what predict.py export= rebuilds the run's preprocessing from
    assert flatten_config(read_export(exported.folder).config) == flatten_config(config)


@pytest.mark.parametrize(
    "layout,out_channels,regions,paint",
    [
        ("brats2024", 0, ["wt", "tc", "et", "rc"], [["rc", 4], ["wt", 2], ["tc", 1], ["et", 3]]),
        ("msd", 1, ["wt"], [["wt", 1]]),  # WT only: written with the edema label
    ],
)
def test_regions_and_paint_order_follow_the_layout_and_the_outputs(layout, out_channels, regions, paint):
    cfg = TrainConfig(resolution=TINY, model=ModelConfig(depth=2, base_filters=4, out_channels=out_channels))
    cfg.data.layout = layout
    description = describe_export(resolve_model_outputs(cfg), "run", "best", {"size": 1, "sha256": "x"}, "float32")
    assert [r["name"] for r in description["regions"]] == regions == list(output_regions(layout, out_channels))
    assert description["postprocessing"]["paint_order"] == paint
    assert description["signature"]["output"]["shape"][-1] == len(regions)


def test_predicting_with_the_export_writes_the_runs_masks(exported, tmp_path):
    from brats_seg.data.predict_inputs import find_input_cases
    from brats_seg.evaluation.inference.predict import predict_new_cases
    from brats_seg.evaluation.inference.run import load_run_model
    from brats_seg.evaluation.serving.exported import load_exported_model

    cases = find_input_cases(exported.case.images[0].parent, "brats2021")
    export = read_export(exported.folder)
    settings = EvaluateConfig(overlays=False)  # test-time mirroring on, as by default
    check_export_settings(export, settings)
    (by_run,) = predict_new_cases(
        load_run_model(exported.run_dir, "best"), cases, exported.config, tmp_path / "run", settings, progress=False
    )
    (by_export,) = predict_new_cases(
        load_exported_model(exported.folder),
        cases,
        export.config,
        tmp_path / "export",
        settings,
        progress=False,
        model_identity=export.identity,
    )
    run_mask, export_mask = nib.load(by_run), nib.load(by_export)
    assert set(np.unique(np.asarray(run_mask.dataobj))) == {0, 1, 2, 4}  # every label: a mask worth comparing
    np.testing.assert_array_equal(np.asarray(export_mask.dataobj), np.asarray(run_mask.dataobj))
    np.testing.assert_array_equal(export_mask.affine, run_mask.affine)
    manifest = json.loads((tmp_path / "export" / "predict.json").read_text())
    assert manifest["settings"]["model"] == export.identity


def test_a_patch_runs_savedmodel_serves_the_gaussian_blended_sliding_windows_of_its_patch(patch_exported):
    """The SavedModel, loaded with TensorFlow alone, gives predict_volume's sliding mode (window = the
    patch, overlap 0.5) on the whole grid, case by case; not the whole-grid forward pass (instance norm
    over a window is another computation, so the comparison tells the two apart)."""
    import tensorflow as tf

    from brats_seg.evaluation.inference.run import load_run_model
    from brats_seg.evaluation.inference.sliding import predict_volume

    batch = np.random.default_rng(1).normal(0.0, 1.0, (2, *TINY.shape, 4)).astype(np.float32)
    serve = tf.saved_model.load(str(patch_exported.folder)).signatures["serving_default"]
    assert serve.structured_input_signature[1]["image"].shape.as_list() == [None, *TINY.shape, 4]
    probs = serve(image=tf.constant(batch))["probabilities"].numpy()
    model = load_run_model(patch_exported.run_dir, "best")
    expected = np.stack(
        [predict_volume(model, x, mode="sliding", window=PATCH, overlap=0.5, depth=PATCH_MODEL.depth) for x in batch]
    )
    assert probs.shape == (2, *TINY.shape, 3) and probs.dtype == np.float32
    assert (probs.std(axis=(0, 1, 2, 3)) > 0.05).all()  # no region constant: the comparison tells models apart
    np.testing.assert_allclose(probs, expected, rtol=0, atol=ATOL)
    assert np.abs(probs[0] - predict_volume(model, batch[0])).max() > 0.05  # windows, not the whole grid
    assert not np.allclose(probs[0], probs[1], atol=1e-3)  # the two cases of the batch were not mixed up


def test_preprocessing_json_states_the_inference_sliding_for_a_patch_run_whole_otherwise(exported, patch_exported):
    import dataclasses

    description = json.loads((patch_exported.folder / "preprocessing.json").read_text())
    sliding = {"mode": "sliding", "window": PATCH, "overlap": 0.5, "blending": "gaussian", "sigma_scale": 0.125}
    assert description["inference"] == sliding
    assert description["signature"]["input"]["shape"] == [None, *TINY.shape, 4]  # clients send the whole grid
    assert description["signature"]["output"]["shape"] == [None, *TINY.shape, 3]
    info = read_export(patch_exported.folder)
    assert info.inference == sliding and info.config.trainer.patch_size == PATCH
    assert read_export(exported.folder).inference == {"mode": "whole"}
    assert json.loads((exported.folder / "preprocessing.json").read_text())["inference"] == {"mode": "whole"}
    old = {k: v for k, v in info.description.items() if k != "inference"}  # an export made before the key
    assert dataclasses.replace(info, description=old).inference == {"mode": "whole"}
    with pytest.raises(
        RunError,
        match="runs the run's sliding windows \\(24x32x24, overlap 0.5, Gaussian "
        "blending\\) inside it; use evaluate.mode=whole",
    ):
        check_export_settings(info, EvaluateConfig(mode="sliding"))
    check_export_settings(info, EvaluateConfig())  # whole: the SavedModel slides the windows itself
    check_export_settings(info, EvaluateConfig(window=list(PATCH)))  # its own window, said: fine
    with pytest.raises(RunError, match="evaluate.window=\\[32, 32, 24\\] with export=.*patch \\[24, 32, 24\\]"):
        check_export_settings(info, EvaluateConfig(window=[32, 32, 24]))  # would be ignored: refused
    with pytest.raises(RunError, match="evaluate.window_overlap=0.25 with export=.*with overlap 0.5 inside"):
        check_export_settings(info, EvaluateConfig(window_overlap=0.25))
    check_export_settings(read_export(exported.folder), EvaluateConfig(window_overlap=0.25))  # whole: as before


def test_predicting_with_a_patch_runs_export_writes_the_masks_of_its_sliding_windows(
    exported, patch_exported, tmp_path
):
    """predict.py export= (the export called as a whole-volume model, mirrored on the host) writes the
    masks the run's own model writes with the patch's sliding windows."""
    from brats_seg.data.predict_inputs import find_input_cases
    from brats_seg.evaluation.inference.predict import predict_new_cases
    from brats_seg.evaluation.inference.run import load_run_model
    from brats_seg.evaluation.serving.exported import load_exported_model

    cases = find_input_cases(exported.case.images[0].parent, "brats2021")
    export = read_export(patch_exported.folder)
    settings = EvaluateConfig(overlays=False)  # test-time mirroring on, as by default
    check_export_settings(export, settings)
    windows = EvaluateConfig(overlays=False, mode="sliding", window=list(PATCH), window_overlap=0.5)
    (by_run,) = predict_new_cases(
        load_run_model(patch_exported.run_dir, "best"),
        cases,
        patch_exported.config,
        tmp_path / "run",
        windows,
        progress=False,
    )
    (by_export,) = predict_new_cases(
        load_exported_model(patch_exported.folder),
        cases,
        export.config,
        tmp_path / "export",
        settings,
        progress=False,
        model_identity=export.identity,
    )
    run_mask = np.asarray(nib.load(by_run).dataobj)
    assert len(np.unique(run_mask)) > 1  # not an empty mask: a comparison worth making
    np.testing.assert_array_equal(np.asarray(nib.load(by_export).dataobj), run_mask)


def test_sliding_windows_are_refused_for_an_export(exported):
    """Even for a model whose run allows windows (batch norm): the signature takes the whole grid."""
    import dataclasses

    export = read_export(exported.folder)
    batch_norm = dataclasses.replace(export.config, model=dataclasses.replace(export.config.model, norm="batch"))
    with pytest.raises(
        RunError, match="evaluate.mode=sliding with export=.*whole network grid \\(48x56x40\\); use evaluate.mode=whole"
    ):
        check_export_settings(dataclasses.replace(export, config=batch_norm), EvaluateConfig(mode="sliding"))
    check_export_settings(dataclasses.replace(export, config=batch_norm), EvaluateConfig())  # whole: fine


def test_prediction_takes_an_export_by_either_key_and_a_run_by_run_dir(exported):
    assert predict_source(str(exported.run_dir), "", EvaluateConfig()) is None  # a training run
    for run_dir, export in ((str(exported.folder), ""), ("", str(exported.folder))):
        assert predict_source(run_dir, export, EvaluateConfig()).folder == exported.folder
    with pytest.raises(RunError, match="are both given: pass one"):
        predict_source(str(exported.run_dir), str(exported.folder), EvaluateConfig())
    with pytest.raises(RunError, match="run_dir is not set"):
        predict_source("", " ", EvaluateConfig())
    info = read_export(exported.folder)
    assert export_precision(info, None) == export_precision(info, info.precision) == "fp32"
    with pytest.raises(RunError, match="computes in fp32"):
        export_precision(info, "bf16")


def test_a_folder_that_is_not_an_export_is_refused_naming_it(exported, tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(RunError, match=f"export={tmp_path / 'empty'} is not a brats-seg export"):
        read_export(tmp_path / "empty")
    with pytest.raises(
        RunError, match=f"export={exported.run_dir} is a training run, not an export: pass run_dir={exported.run_dir}"
    ):
        read_export(exported.run_dir)
    with pytest.raises(RunError, match="does not exist"):
        read_export(tmp_path / "nowhere")
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "saved_model.pb").write_bytes(b"")
    (fake / "preprocessing.json").write_text('{"kind": "something else"}')
    with pytest.raises(RunError, match="is not a brats-seg export's description"):
        read_export(fake)


def test_an_export_never_replaces_a_folder_of_other_files(exported, tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(RunError, match="already holds files that are not a brats-seg export"):
        check_export_output(tmp_path / "mine")
    (tmp_path / "file").write_text("")
    with pytest.raises(RunError, match="is a file"):
        check_export_output(tmp_path / "file")
    assert check_export_output(exported.folder) == exported.folder  # a previous export is replaced whole
    assert is_export_dir(exported.folder) and not is_export_dir(exported.run_dir)


def test_predict_script_exits_2_with_one_line_on_a_folder_that_is_not_an_export(exported, tmp_path):
    result = run_script(
        "predict.py",
        f"export={exported.run_dir}",
        f"input={exported.root}",
        f"output={tmp_path / 'out'}",
        *CLI_BACKEND,
        timeout=120,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line == (
        f"error: export={exported.run_dir} is a training run, not an export: pass "
        f"run_dir={exported.run_dir}, or export it first: python scripts/export.py "
        f"run_dir={exported.run_dir}"
    )
    both = run_script(
        "predict.py",
        f"run_dir={exported.run_dir}",
        f"export={exported.folder}",
        f"input={exported.root}",
        f"output={tmp_path / 'out'}",
        *CLI_BACKEND,
        timeout=120,
    )
    assert both.returncode == 2 and "are both given: pass one" in both.stderr
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------
# The entry points, end to end
# ---------------------------------------------------------------------------------------


@pytest.mark.slow  # runs scripts/export.py, killed
def test_an_export_killed_before_it_is_in_place_leaves_the_previous_one(exported, tmp_path):
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(exported.folder, folder)  # a previous export
    before = (folder / "preprocessing.json").read_bytes()
    # SIGKILL once the new folder is complete, before it replaces the previous one (brats_seg.files)
    killed = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "export.py"),
            f"run_dir={exported.run_dir}",
            f"output={folder}",
            *CLI_BACKEND,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**CLI_ENV, "BRATS_SEG_CRASH_AT": "model"},
        timeout=300,
    )
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert (folder / "preprocessing.json").read_bytes() == before and is_export_dir(folder)
    assert [p.name.startswith(".tmp-model-") for p in tmp_path.iterdir() if p != folder] == [True]


def test_the_runs_post_processing_goes_into_the_export_and_prediction_takes_it_from_there(exported, tmp_path):
    import dataclasses
    import shutil
    from pathlib import Path

    from brats_seg.evaluation.postprocess import POSTPROCESS_KIND
    from brats_seg.evaluation.serving.exported import prediction_postprocessing

    export = read_export(exported.folder)
    assert export.description["postprocessing"]["chosen"] is None  # the run had none chosen
    assert prediction_postprocessing("", export, export.config, EvaluateConfig()) is None
    run_dir = Path(shutil.copytree(exported.run_dir, tmp_path / "run"))
    folder = RunFolder(run_dir)
    identity = folder.checkpoint_identity("best")
    rules = {"min_component_mm3": {"tc": 30.0}, "relabel_below_mm3": {"et": 500.0}}
    folder.write_postprocess(
        {
            "kind": POSTPROCESS_KIND,
            "version": 1,
            "rules": rules,
            "chosen_for": {"checkpoint": identity},
            "validation": {"cases": ["BraTS2021_00000"], "chosen": {"dice": {"wt": 0.9}}},
        }
    )
    description = describe_export(exported.config, run_dir, "best", identity, "float32")
    chosen = description["postprocessing"]["chosen"]
    assert chosen["rules"] == rules and chosen["chosen_for"]["checkpoint"] == identity
    assert chosen["validation"]["cases"] == ["BraTS2021_00000"]
    with_rules = dataclasses.replace(export, description=json.loads(json.dumps(description)))
    assert prediction_postprocessing("", with_rules, export.config, EvaluateConfig()).rules() == rules
    assert prediction_postprocessing("", with_rules, export.config, EvaluateConfig(postprocess="none")) is None


def test_an_export_onto_a_mount_point_is_refused_before_anything_is_written(tmp_path):
    """A container's /workspace/model volume: the export is written beside its folder and renamed,
    which a mount point cannot take; one line says where to export instead."""
    from brats_seg.evaluation.serving.export import check_export_output
    from tests.conftest import mounted_tmpfs, skip_outside_ci

    folder = tmp_path / "model"
    with mounted_tmpfs(folder, "1m") as why_not:
        if why_not:
            skip_outside_ci(f"cannot mount a tmpfs here ({why_not}); the image test refuses the same export in CI")
        with pytest.raises(RunError, match=r"is a mount point: an export is written beside its folder") as raised:
            check_export_output(folder)
        assert "\n" not in str(raised.value) and "-v <run_dir>/export:/workspace/model:ro" in str(raised.value)
        assert not list(folder.iterdir()) and not list(tmp_path.glob(".tmp-*"))
