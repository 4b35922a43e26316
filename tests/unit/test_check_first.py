"""Check first, write after: a bad value or a plan that does not fit fails before data
preparation and before the run folder gets a file, and the corrected command trains in the
same ``run_dir`` (the newcomer's mistakes of issue 21)."""

from __future__ import annotations

import dataclasses
import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest

from brats_seg.config import BackendConfig, DataConfig, ModelConfig, TrackingConfig, TrainConfig, TrainerConfig
from tests.conftest import TINY, data_config

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def backend():
    from brats_seg.backend import configure, decide_backend

    return configure(decide_backend(BackendConfig(name="cpu_onednn")))


def _cfg(root, tmp_path, run_dir) -> TrainConfig:
    return TrainConfig(
        data=data_config(root, "brats2021", tmp_path),
        resolution=dataclasses.replace(TINY),
        model=ModelConfig(depth=2, base_filters=4),
        trainer=TrainerConfig(epochs=1, batch_size=1, steps_per_epoch=1, seed=3),
        tracking=TrackingConfig(name="none"),
        run_dir=str(run_dir),
    )


def _set(cfg: TrainConfig, key: str, value) -> TrainConfig:
    group, name = key.split(".")
    setattr(getattr(cfg, group), name, value)
    return cfg


BAD_VALUES = [
    ("trainer.batch_size", -1, r"trainer\.batch_size=-1: use an integer >= 1"),
    ("trainer.lr_schedule", "cosin", r"trainer\.lr_schedule='cosin': use cosine or constant\. Did you mean 'cosine'"),
    ("lms.limit", "1MB", r"LMS plan does not fit.*To fix"),
]


def test_the_corrected_command_trains_in_the_same_run_dir(synthetic_root, tmp_path, backend):
    """Each failed command wrote nothing (no config.json, no cache entry); the corrected one trains
    there. One folder takes the three failures in turn, then the training (one training, not three)."""
    from brats_seg.training.loop import train

    root = synthetic_root["brats2021"]
    run_dir = tmp_path / "run"
    for key, value, message in BAD_VALUES:
        with pytest.raises(ValueError, match=message):
            train(_set(_cfg(root, tmp_path, run_dir), key, value))
        assert not (run_dir / "config.json").exists() and not (run_dir / "split.json").exists(), key
        assert not (tmp_path / "cache").exists(), key  # failed before preparation
    assert train(_cfg(root, tmp_path, run_dir)).epochs_done == 1


@pytest.mark.parametrize(
    "key,value,message",
    [
        ("model.norm", "layer", r"model\.norm='layer': use one of instance, group, batch"),
        ("model.upsample", "nearest", r"model\.upsample='nearest'"),
        ("backend.precision", "fp8", r"backend\.precision='fp8': use one of fp32, bf16, fp16"),
        ("lms.name", "swap", r"lms='swap': use one of off, recompute, offload, auto"),
        ("lms.limit", "16gigs", r"lms\.limit '16gigs'"),
        ("resolution.shape", [50, 50, 50], r"\(50, 50, 50\).*model\.depth=2.*\(48, 48, 48\)"),
        ("trainer.epochs", 0, r"trainer\.epochs=0: use an integer >= 1"),
        ("trainer.learning_rate", -1e-3, r"trainer\.learning_rate=-0\.001"),
        ("trainer.val_every", 0, r"trainer\.val_every=0"),
        ("trainer.steps_per_epoch", 0, r"trainer\.steps_per_epoch=0"),
        ("data.val_fraction", 1.5, r"data\.val_fraction=1\.5"),
        ("data.on_error", "ignore", r"data\.on_error='ignore': use raise or skip"),
        ("data.num_workers", 0, r"data\.num_workers=0"),
        ("tracking.name", "wandb", r"tracking='wandb': use mlflow or none"),
        ("distribute.name", "horovod", r"distribute='horovod'"),
        # refused at the start, not after training, where the model is registered
        (
            "tracking.register_as",
            "team/model",
            r"tracking\.register_as='team/model': the Model Registry refuses "
            r"this name \(.*cannot contain '/'",
        ),
        ("tracking.register_as", "..", r"tracking\.register_as='\.\.': the Model Registry refuses"),
    ],
)
def test_a_bad_value_is_named_before_anything_is_written(tmp_path, key, value, message):
    from brats_seg.checks import check_train_config

    cfg = _set(
        TrainConfig(
            resolution=dataclasses.replace(TINY),
            model=ModelConfig(depth=2, base_filters=4, out_channels=3),
            run_dir=str(tmp_path / "run"),
        ),
        key,
        value,
    )
    with pytest.raises(ValueError, match=message) as err:
        check_train_config(cfg)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "name",
    [
        "brats-demo",
        "team/model",
        "a:b",
        "",
        "  ",
        ".",
        "..",
        "..x",
        "x..",
        "a.b",
        "BraTS 2023 (whole)",
        "models",
        "m-1_2",
    ],
)
def test_the_register_as_rule_agrees_with_the_registrys_own(name):
    """checks.check_register_as copies MLflow's rule (its validator is not public API, which the
    package does not import): this holds the copy to it."""
    from mlflow.exceptions import MlflowException
    from mlflow.utils.validation import _validate_model_name

    from brats_seg.checks import check_register_as

    try:
        _validate_model_name(name)
        mlflow_takes = True
    except MlflowException:
        mlflow_takes = False
    try:
        check_register_as("mlflow", name)
        ours = True
    except ValueError:
        ours = False
    assert ours == mlflow_takes or (name == "" and ours), name  # "" is register_as off, not a name


def test_register_as_without_mlflow_tracking_is_refused_and_a_good_name_passes(tmp_path):
    from brats_seg.checks import check_train_config

    cfg = TrainConfig(
        resolution=dataclasses.replace(TINY),
        model=ModelConfig(depth=2, base_filters=4, out_channels=3),
        tracking=TrackingConfig(name="none", register_as="brats-demo"),
        run_dir=str(tmp_path / "run"),
    )
    with pytest.raises(ValueError, match=r"register_as='brats-demo'.*tracking=none: use tracking=mlflow"):
        check_train_config(cfg)
    cfg.tracking.name = "mlflow"
    check_train_config(cfg)


def test_data_root_unset_says_so_not_no_cases_under_the_cwd(tmp_path, backend):
    from brats_seg.training.loop import train

    cfg = TrainConfig(
        data=DataConfig(name="brats2021", layout="brats2021", root="", cache_dir=str(tmp_path / "c")),
        resolution=TINY,
        model=ModelConfig(depth=2, base_filters=4),
        run_dir=str(tmp_path / "run"),
    )
    with pytest.raises(ValueError, match=r"data\.root is not set: pass data\.root=") as err:
        train(cfg)
    assert "no cases" not in str(err.value) and not (tmp_path / "run").exists()


# Runs an entry point as `python <script>` does, and says on stderr at exit whether TensorFlow was imported.
_WATCH_TF = (
    "import atexit, runpy, sys; script = sys.argv[1]; sys.argv = sys.argv[1:]; "
    "atexit.register(lambda: print('tensorflow imported:', 'tensorflow' in sys.modules, file=sys.stderr)); "
    "runpy.run_path(script, run_name='__main__')"
)


@pytest.mark.parametrize(
    "script, args, message",
    [
        (
            "train.py",
            ["data=brats2021", "data.root={tmp}/nowhere"],
            r"error: data root .*/nowhere does not exist or is not a folder: check data\.root=\.$",
        ),
        (
            "train.py",
            ["data=brats2023", "data.root={synthetic}"],
            r"error: no cases found under .* for layout brats2023 .*try data=brats2021",
        ),
        (
            "train.py",
            ["data=msd", "data.root={tmp}"],
            r"error: no cases found under .* for layout msd \(expected dataset\.json",
        ),
        ("scripts/evaluate.py", ["run_dir={tmp}/none"], r"error: run folder .*/none does not exist"),
    ],
)
def test_a_path_that_can_be_checked_without_tensorflow_fails_before_it_is_imported(
    synthetic_root, tmp_path, script, args, message
):
    """A missing or wrong data.root (a missing run folder for evaluation) is said in about a second
    (0.9-1.4 s on an AMD EPYC Zen 5), where TensorFlow's import alone takes 5-16 s and prints its
    own lines first (one an alarming 'CUDA error'). Decisive: TensorFlow is never imported; the
    time bound is loose (10x the Zen 5's figure, for the slowest CPU kind on a busy machine)."""
    import time

    filled = [a.format(tmp=tmp_path, synthetic=synthetic_root["brats2021"]) for a in args]
    t0 = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            _WATCH_TF,
            str(REPO / script),
            *filled,
            f"run_dir={tmp_path}/run" if script == "train.py" else "split=test",
            "tracking=none" if script == "train.py" else "checkpoint=best",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    seconds = time.monotonic() - t0
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "tensorflow imported: False" in lines, proc.stderr[-2000:]
    errors = [i for i, line in enumerate(lines) if line.startswith("error:")]
    assert len(errors) == 1 and re.search(message, lines[errors[0]]), proc.stderr[-2000:]
    assert not any(re.match(r"[IWEF]\d{4} ", line) for line in lines[: errors[0]]), proc.stderr[
        -2000:
    ]  # no TF/absl line
    assert seconds < 12, f"{seconds:.1f} s"
    assert not (tmp_path / "run").exists()


def test_a_folder_without_a_completed_step_takes_a_changed_config(tmp_path, caplog):
    """Written by a start that failed later (say, in the first step): no progress, so the
    changed config replaces it, and the log says so; with progress it is refused."""
    import json

    from brats_seg.data.labels import resolve_model_outputs
    from brats_seg.run_dir import RunFolder
    from brats_seg.training.checkpoint import prepare_run_dir

    split = tmp_path / "split.json"
    split.write_text(json.dumps({"train": ["a"], "val": ["b"], "test": ["c"]}))
    first = resolve_model_outputs(TrainConfig(model=ModelConfig(base_filters=8), run_dir=str(tmp_path / "run")))
    prepare_run_dir(first, json.loads(split.read_text()), split)
    second = resolve_model_outputs(TrainConfig(model=ModelConfig(base_filters=4), run_dir=str(tmp_path / "run")))
    with caplog.at_level(logging.WARNING, logger="brats_seg.training.checkpoint"):
        prepare_run_dir(second, json.loads(split.read_text()), split)
    assert "config is replaced (model.base_filters: 8 -> 4)" in caplog.text
    assert RunFolder.of(tmp_path / "run").read_config().model.base_filters == 4

    RunFolder.of(tmp_path / "run").write_state({"epoch": 1, "step": 0})
    with pytest.raises(ValueError, match=r"model\.base_filters: 4 -> 8.*new run_dir"):
        prepare_run_dir(first, json.loads(split.read_text()), split)


def test_train_py_with_a_bad_value_exits_2_and_leaves_no_folder(tmp_path):
    """One line on stderr naming the key; no run folder, no stray outputs/<date>/<time>/."""
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "train.py"),
            "resolution=tiny",
            f"data.root={tmp_path / 'synthetic'}",
            f"data.cache_dir={tmp_path / 'cache'}",
            "backend=cpu_onednn",
            "tracking=none",
            "trainer.batch_size=-1",
            f"run_dir={run_dir}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors == ["error: trainer.batch_size=-1: use an integer >= 1 (the global batch)."], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "outputs").exists() and not (tmp_path / "cache").exists()
    assert not (run_dir / "config.json").exists() and not (run_dir / ".hydra").exists()
