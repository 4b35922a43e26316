"""A study (issue 31): the experiments declare their arms as Hydra sweeps, and scripts/study.py
reads fabricated run folders, pools seeds into arms, and writes study.json and its charts."""

from __future__ import annotations

import json
import math
import random
import statistics
from pathlib import Path

import matplotlib.image as mpimg
import pytest

from brats_seg.config import DataConfig, ResolutionConfig, TrainConfig
from brats_seg.evaluation.studies import study_run as study_script  # what scripts/study.py runs
from brats_seg.evaluation.studies.study import compute_time_to_reach, compute_timeline
from brats_seg.files import is_temporary, write_text_atomic
from brats_seg.run_dir import RunFolder
from brats_seg.script_configs import StudyScriptConfig
from brats_seg.sweeps import sweep_dirname

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"

REGIONS = ("wt", "tc", "et")
HALF = ResolutionConfig(name="half", spacing_mm=2.0, shape=[96, 112, 80])
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _summary(rng: random.Random) -> dict:
    """A summary.json with made-up means (and the other statistics evaluate.py writes)."""
    out = {"n_cases": 4}
    for metric, low, high in (("dice", 0.5, 0.95), ("hd95", 1.0, 12.0), ("lesion23_dice", 0.4, 0.95)):
        for r in REGIONS:
            mean = rng.uniform(low, high)
            out[f"{metric}_{r}"] = {"mean": mean, "median": mean, "std": rng.uniform(0.01, 0.1), "n": 4, "n_inf": 0}
    return out


def _history(rng: random.Random, epochs: int, with_train_time: bool = True) -> list[dict]:
    rows, total, dice = [], 0.0, 0.3
    for epoch in range(1, epochs + 1):
        train_s, val_s = rng.uniform(8, 12), rng.uniform(1, 2)
        total += train_s
        dice = min(0.95, dice + rng.uniform(0.05, 0.2))
        row = {
            "epoch": epoch,
            "seconds": round(train_s + val_s, 2),
            "val_s": val_s,
            "step_s": train_s / 5,
            "loss": 1 - dice,
            "val_dice_mean": dice,
            **{f"val_dice_{r}": dice + d for r, d in zip(REGIONS, (0.05, 0, -0.05))},
        }
        if with_train_time:
            row.update(train_time_s=total, train_s=train_s)
        rows.append(row)
    return rows


def make_run(
    root: Path,
    name: str,
    *,
    seed: int = 0,
    patch=None,
    resolution: ResolutionConfig = HALF,
    epochs: int = 6,
    done: int | None = None,
    sets=("test",),
    with_train_time: bool = True,
    **changes,
) -> RunFolder:
    """A fabricated run folder: config.json, state.json (history), eval/<set>/summary.json."""
    rng = random.Random(f"{name}-{seed}")
    cfg = TrainConfig(data=DataConfig(name="mni_gliomas", root="data/mni_gliomas"), resolution=resolution)
    cfg.model.depth, cfg.trainer.batch_size, cfg.trainer.seed = 4, 2, seed
    cfg.trainer.patch_size, cfg.trainer.epochs = patch, epochs
    for key, value in changes.items():
        group, field = key.split("__")
        setattr(getattr(cfg, group), field, value)
    folder = RunFolder(root / name)
    cfg.run_dir = str(folder.root)
    folder.write_config(cfg)
    history = _history(rng, epochs if done is None else done, with_train_time)
    best = max(history, key=lambda r: r["val_dice_mean"])
    state = {
        "epoch": len(history),
        "best_value": best["val_dice_mean"],
        "best_epoch": best["epoch"],
        "history": history,
        "iterations": 5 * len(history),
    }
    if with_train_time:
        state["train_time_s"] = history[-1]["train_time_s"]
    folder.write_state(state)
    for s in sets:
        write_text_atomic(folder.summary_json(s), json.dumps(_summary(rng)))
    return folder


def _outcome(root: Path, **kw):
    conf = StudyScriptConfig(dir=str(root), **{"evaluate": False, "mlflow": False, **kw})
    return study_script.run_study(conf)


def _run(root: Path, **kw) -> tuple[int, dict]:
    """The exit status and study.json as written (the returned study must be what was written)."""
    outcome = _outcome(root, **kw)
    written = json.loads((root / "study.json").read_text())
    assert written == json.loads(json.dumps(outcome.study, default=str))
    return outcome.status, written


@pytest.fixture
def patches(tmp_path) -> Path:
    """Two arms (whole volume, 48^3 patches) over seeds 0-2, named as the sweep names them."""
    root = tmp_path / "patches_vs_whole"
    for patch in (None, [48, 48, 48]):
        for seed in range(3):
            make_run(
                root,
                sweep_dirname([f"trainer.patch_size={patch or 'null'}".replace(" ", ""), f"trainer.seed={seed}"]),
                seed=seed,
                patch=patch,
                sets=("test", "all@mni_gliomas_heldout"),
            )
    return root


def _fabricated(root: Path, run: str, set_name: str, key: str) -> float:
    return json.loads(RunFolder(root / run).summary_json(set_name).read_text())[key]["mean"]


def test_runs_are_pooled_over_seeds_into_arms_named_by_the_key_that_differs(patches):
    outcome = _outcome(patches)
    status, study = outcome.status, json.loads((patches / "study.json").read_text())
    assert status == 0
    assert study["arm_keys"] == ["trainer.patch_size"] and study["differing_keys"] == ["trainer.patch_size"]
    assert [a["label"] for a in study["arms"]] == ["whole", "patch 48x48x48"]
    assert [a["seeds"] for a in study["arms"]] == [[0, 1, 2], [0, 1, 2]]
    assert study["arms"][1]["runs"] == [f"patch_size-48x48x48_seed-{s}" for s in range(3)]
    assert {r["arm"] for r in study["runs"] if r["config"]["trainer.patch_size"] is None} == {"whole"}
    report = study_script.format_report(outcome)
    assert "| whole | 3 |" in report and "| patch 48x48x48 | 3 |" in report  # the Markdown table
    assert f"wrote {patches / 'study.json'}" in report and outcome.failure() is None


def test_mean_and_std_over_seeds_per_metric_region_and_set(patches):
    _, study = _run(patches, sets=["test", "heldout"])
    for arm in study["arms"]:
        for set_name, folder in (("test", "test"), ("heldout", "all@mni_gliomas_heldout")):
            for metric in ("dice", "hd95", "lesion23_dice"):
                for r in REGIONS:
                    values = [_fabricated(patches, run, folder, f"{metric}_{r}") for run in arm["runs"]]
                    stats = arm["sets"][set_name]["metrics"][f"{metric}_{r}"]
                    assert stats["mean"] == pytest.approx(statistics.mean(values))
                    assert stats["std"] == pytest.approx(statistics.stdev(values))
                    assert stats["n"] == 3
        assert arm["sets"]["test"]["n_cases"] == 4


def test_time_to_reach_a_validation_dice_and_its_mean_over_the_seeds_that_reached_it(patches):
    thresholds = [0.6, 0.8, 0.99]
    _, study = _run(patches, thresholds=thresholds)
    for arm in study["arms"]:
        reached = {t: [] for t in thresholds}
        for run in arm["runs"]:
            history = RunFolder(patches / run).read_state()["history"]
            for t in thresholds:
                first = next((row["train_time_s"] for row in history if row["val_dice_mean"] >= t), None)
                got = next(r for r in study["runs"] if r["name"] == run)["time_to_val_dice"][f"{t:g}"]
                if first is None:
                    assert got is None
                else:
                    assert got == pytest.approx(first, abs=1e-3)  # seconds, kept to the millisecond
                    reached[t].append(first)
        for t in thresholds:
            stats = arm["time_to_val_dice"][f"{t:g}"]
            assert stats["n"] == len(reached[t]) and stats["runs"] == 3
            if reached[t]:
                assert stats["mean"] == pytest.approx(statistics.mean(reached[t]), abs=1e-3)
            else:
                assert stats["mean"] is None
    assert all(r["time_source"] == "train_time_s" for r in study["runs"]) and study["notes"] == []


def test_a_run_without_train_time_s_falls_back_to_epoch_seconds_less_validation_and_says_so(tmp_path):
    folder = make_run(tmp_path / "old", "seed-0", with_train_time=False)
    history = folder.read_state()["history"]
    timeline = compute_timeline(history, REGIONS)
    expected = [sum(r["seconds"] - r["val_s"] for r in history[: i + 1]) for i in range(len(history))]
    assert timeline["train_time_s"] == pytest.approx(expected, abs=1e-3)
    assert "seconds - val_s" in timeline["source"]
    assert compute_time_to_reach(timeline, [0.0])["0"] == pytest.approx(expected[0], abs=1e-3)
    _, study = _run(tmp_path / "old")
    assert study["runs"][0]["train_time_s"] == pytest.approx(expected[-1], abs=1e-3)
    assert "seconds - val_s" in study["runs"][0]["time_source"] and "seed-0" in study["notes"][0]


def test_throughput_counts_the_network_input_and_whole_volumes(patches):
    _, study = _run(patches)
    for record in study["runs"]:
        state = RunFolder(patches / record["name"]).read_state()
        patch = record["config"]["trainer.patch_size"]
        voxels_per_step = 2 * math.prod(patch or HALF.shape)
        assert record["voxels_per_step"] == voxels_per_step
        assert record["voxels_per_s"] == pytest.approx(state["iterations"] * voxels_per_step / state["train_time_s"])
        assert record["volumes_per_s"] == pytest.approx(record["voxels_per_s"] / math.prod(HALF.shape))
    whole = study["arms"][0]["voxels_per_s"]
    assert whole["mean"] == pytest.approx(statistics.mean(whole["values"]))


def test_a_schedule_runs_steps_voxels_and_memory_are_read_per_stage_as_recorded(tmp_path):
    """A grow run's throughput counts each epoch's steps at its stage's step size; steps are the
    steps taken; the process's peak and the peak above the runtime are apart, the latter against
    each stage's plan; the arm is named grow."""
    root = tmp_path / "study"
    folder = make_run(root, "arm-grow_seed-0", trainer__patch_schedule="grow", epochs=4, done=4)
    state = folder.read_state()
    stages = [(2 * 32**3), (2 * 48**3), (2 * 64**3), (2 * math.prod(HALF.shape))]  # grow at half, depth 4
    for row, stage, steps in zip(state["history"], (1, 2, 3, 4), (30, 20, 10, 5)):
        row.update(
            stage=stage,
            steps=steps,
            peak_bytes=5e9 + stage,
            measured_bytes=1e9 * stage,
            planned_bytes=1e9 * stage / 1.1,
        )
    folder.write_state(state)
    make_run(root, "arm-whole_seed-0", epochs=4, done=4)
    _, study = _run(root)
    record = next(r for r in study["runs"] if r["name"] == "arm-grow_seed-0")
    assert record["steps_taken"] == 65
    voxels = 30 * stages[0] + 20 * stages[1] + 10 * stages[2] + 5 * stages[3]
    assert record["voxels_per_s"] == pytest.approx(voxels / state["train_time_s"])
    assert record["peak_process_bytes"] == 5e9 + 4 and record["peak_above_runtime_bytes"] == 4e9
    assert {int(k): round(v, 6) for k, v in record["plan_error_by_stage"].items()} == {1: 0.1, 2: 0.1, 3: 0.1, 4: 0.1}
    assert sorted(a["label"] for a in study["arms"]) == ["grow", "whole"]


def test_the_charts_are_valid_pngs_and_no_temporary_file_is_left(patches):
    _run(patches, sets=["test", "heldout"])
    names = ["val_dice_vs_time.png", "throughput.png", "test_metrics.png", "heldout_metrics.png"]
    for name in names:
        path = patches / name
        assert path.read_bytes()[:8] == PNG_MAGIC
        assert mpimg.imread(path).shape[1] > 300
    assert not (patches / "resolution_study.png").exists()  # the arms do not differ in resolution
    assert not [p for p in patches.rglob("*") if is_temporary(p)]


def test_study_json_is_replaced_atomically(patches, monkeypatch):
    import brats_seg.files as files

    _run(patches)
    before = (patches / "study.json").read_text()
    real = files._replace

    def fail_on_study_json(src, dst):
        if Path(dst).name == "study.json":
            raise OSError("simulated crash before the rename")
        real(src, dst)

    monkeypatch.setattr(files, "_replace", fail_on_study_json)
    with pytest.raises(OSError, match="simulated"):
        _run(patches, thresholds=[0.5])
    assert (patches / "study.json").read_text() == before  # the old study, whole
    assert not [p for p in patches.iterdir() if is_temporary(p)]


def test_missing_evaluations_are_listed_with_evaluate_false(tmp_path):
    root = tmp_path / "s"
    make_run(root, "seed-0", seed=0)
    make_run(root, "seed-1", seed=1, sets=())  # finished, not evaluated
    make_run(root, "seed-2", seed=2, sets=(), done=3)  # stopped at epoch 3 of 6
    status, study = _run(root)
    assert status == 0
    missing = {m["run"]: m for m in study["missing"]}
    assert set(missing) == {"seed-1", "seed-2"}
    assert missing["seed-1"]["why"] == "evaluate=false" and "split=test" in missing["seed-1"]["command"]
    assert "not finished" in missing["seed-2"]["why"] and "3/6" in missing["seed-2"]["why"]
    assert study["arms"][0]["sets"]["test"]["n_runs"] == 1  # only the evaluated run counts


def test_folders_that_are_not_runs_yet_are_passed_over_and_named(tmp_path):
    root = tmp_path / "s"
    make_run(root, "seed-0", seed=0)
    RunFolder(root / "seed-1").write_config(TrainConfig())  # started, no epoch done
    other = RunFolder(root / "other")  # another program's files under the same names
    other.write_state({"epoch": 1})
    other.config_path.write_text('{"something": "else"}')
    _, study = _run(root)
    assert [r["name"] for r in study["runs"]] == ["seed-0"]
    assert len(study["skipped"]) == 2
    assert study["skipped"][0].endswith(
        "other: " + f"{other.config_path} is not a brats-seg run's config.json "
        "(another program's file?): pass run_dir= a new folder, or the folder a "
        "training run wrote."
    )
    assert study["skipped"][1].endswith("seed-1: no epoch done yet")


def test_evaluate_true_runs_evaluate_py_for_finished_runs_only(tmp_path, monkeypatch):
    root = tmp_path / "s"
    make_run(root, "seed-0", seed=0)
    make_run(root, "seed-1", seed=1, sets=())
    make_run(root, "seed-2", seed=2, sets=(), done=3)
    calls = []

    def fake_run_logged(cmd, log):  # evaluate.py, as if it ran: writes the summary it would
        calls.append(cmd)
        args = dict(a.split("=", 1) for a in cmd[2:])
        folder = RunFolder(Path(args["run_dir"]))
        split = args["split"] + (f"@{args['on']}" if "on" in args else "")
        write_text_atomic(folder.summary_json(split), json.dumps(_summary(random.Random(1))))
        return 0.0

    monkeypatch.setattr(study_script, "run_logged", fake_run_logged)
    status, study = _run(root, evaluate=True, sets=["test", "heldout"], evaluate_args=["backend=cpu_onednn"])
    assert status == 0
    evaluated = sorted(
        (Path(dict(a.split("=", 1) for a in c[2:])["run_dir"]).name, dict(a.split("=", 1) for a in c[2:]).get("on", ""))
        for c in calls
    )
    assert evaluated == [("seed-0", "mni_gliomas_heldout"), ("seed-1", ""), ("seed-1", "mni_gliomas_heldout")]
    assert all(
        c[1].endswith("scripts/evaluate.py") and "backend=cpu_onednn" in c and "evaluate.overlays=false" in c
        for c in calls
    )
    assert [m["run"] for m in study["missing"]] == ["seed-2", "seed-2"]  # not finished: not evaluated
    assert study["arms"][0]["sets"]["heldout"]["n_runs"] == 2


def test_a_failed_evaluation_is_reported_and_the_study_still_written(tmp_path, monkeypatch):
    root = tmp_path / "s"
    make_run(root, "seed-0", seed=0, sets=())

    def failing(cmd, log):
        raise study_script.StepFailed(f"error: evaluate.py failed (exit 2); see {log}")

    monkeypatch.setattr(study_script, "run_logged", failing)
    outcome = _outcome(root, evaluate=True)
    study = json.loads((root / "study.json").read_text())
    assert outcome.status == 1 and study["failed_evaluations"][0]["run"] == "seed-0"
    assert "1 evaluation(s) failed: seed-0 (test): see" in outcome.failure()


def test_resolution_arms_are_ordered_coarse_to_fine_and_get_their_chart(tmp_path):
    root = tmp_path / "resolution_study"
    tiny = ResolutionConfig(name="tiny", spacing_mm=4.0, shape=[48, 64, 48])
    full = ResolutionConfig(name="full", spacing_mm=1.0, shape=[192, 224, 160])
    make_run(root, "resolution-half", resolution=HALF)
    make_run(root, "resolution-full", resolution=full)
    make_run(root, "resolution-tiny_shape-48x64x48", resolution=tiny)
    make_run(
        root,
        "epochs-4_lms-auto_resolution-2x",
        epochs=4,
        resolution=ResolutionConfig(name="2x", spacing_mm=0.5, shape=[384, 448, 320]),
        lms__name="auto",
    )
    _, study = _run(root)
    assert study["arm_keys"] == ["resolution.name"]  # shape, spacing, lms and epochs follow from it
    assert [a["label"] for a in study["arms"]] == [
        "resolution=tiny",
        "resolution=half",
        "resolution=full",
        "resolution=2x",
    ]
    assert (root / "resolution_study.png").read_bytes()[:8] == PNG_MAGIC


def test_the_study_logs_its_charts_into_each_tracked_run(patches, tmp_path):
    from mlflow import MlflowClient

    from brats_seg.config import TrackingConfig
    from brats_seg.tracking import Tracker

    uri = f"sqlite:///{tmp_path}/mlruns.db"
    tracked = sorted(p for p in patches.iterdir() if p.is_dir())[:2]
    run_ids = []
    for run_dir in tracked:
        with Tracker.start(
            TrackingConfig(uri=uri, experiment="study", system_metrics=False), run_dir, run_dir.name, {}, {}
        ) as tracker:
            run_ids.append(tracker.run_id)
    outcome = _outcome(patches, mlflow=True)
    assert outcome.status == 0 and outcome.logged == 2
    client = MlflowClient(tracking_uri=uri)
    for run_id in run_ids:
        names = {Path(a.path).name for a in client.list_artifacts(run_id, "study")}
        assert {"study.json", "val_dice_vs_time.png", "throughput.png", "test_metrics.png"} <= names
    assert "logged the charts and study.json to 2 MLflow run(s)" in study_script.format_report(outcome)


def test_a_store_that_fails_is_reported_once_and_the_study_goes_on(patches, caplog):
    for run_dir in sorted(p for p in patches.iterdir() if p.is_dir())[:2]:
        RunFolder(run_dir).write_tracking({"run_id": "abc", "tracking_uri": "http://127.0.0.1:9"})
    with caplog.at_level("WARNING", logger="brats_seg.evaluation.studies.study_run"):
        status, study = _run(patches, mlflow=True)
    warned = [r for r in caplog.records if "cannot log the study to MLflow" in r.getMessage()]
    assert status == 0 and study["arms"] and len(warned) == 1 and warned[0].levelname == "WARNING"


def test_bad_arguments_end_in_a_message(tmp_path):
    with pytest.raises(ValueError, match="sets: 'nope' is not a set; use test, matched"):
        study_script.parse_sets(["nope"])
    assert study_script.parse_sets("test,heldout") == {"test": ("test", ""), "heldout": ("all", "mni_gliomas_heldout")}
    assert study_script.parse_sets(["all@mni_gliomas_shifted"]) == {
        "all@mni_gliomas_shifted": ("all", "mni_gliomas_shifted")
    }
    with pytest.raises(FileNotFoundError, match="no such folder"):
        _run(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no run folder"):
        _run(tmp_path / "empty")


@pytest.mark.parametrize(
    "overrides, name",
    [
        (
            ["trainer.patch_size=[48,48,48]", "trainer.seed=0", "experiment=patches_vs_whole"],
            "patch_size-48x48x48_seed-0",
        ),
        (["trainer.patch_size=null", "trainer.seed=2", "experiment=patches_vs_whole"], "patch_size-null_seed-2"),
        (
            ["resolution=2x", "lms=auto", "lms.limit=21GB", "trainer.epochs=12", "experiment=resolution_study"],
            "epochs-12_limit-21GB_lms-auto_resolution-2x",
        ),
        (["model.name=a", "data.name=b", "experiment=x"], "data.name-b_model.name-a"),  # the same last part: whole keys
    ],
)
def test_job_folders_are_named_by_their_overrides_without_characters_an_override_cannot_take(overrides, name):
    assert sweep_dirname(overrides, ["experiment"]) == name


def test_a_long_job_folder_name_is_capped_and_still_names_one_job():
    from brats_seg.sweeps import MAX_DIRNAME

    long = [f"data.root=/cluster/projects/glioma/{'x' * 150}", "model.base_filters=16"]
    name = sweep_dirname(long)
    assert len(name) == MAX_DIRNAME and name.startswith("base_filters-16_root-cluster-projects")
    assert sweep_dirname(long) == name != sweep_dirname([long[0], "model.base_filters=32"])


def test_a_plain_sweep_names_its_job_folders_by_their_values_so_the_same_command_continues_them():
    """``python train.py -m hydra/launcher=slurm model.base_filters=16,32`` (the README's sweep): each
    job's folder is multirun/<its values>, the same on every launch (Hydra's default, multirun/<date>/<time>/<n>,
    was another folder each time, so a sweep never resumed); where it is tracked and a pinned run_dir= are
    not part of the name."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    register = __import__("brats_seg.script_configs", fromlist=["register_configs"]).register_configs
    register()
    typed = [
        "hydra/launcher=slurm",
        "hydra.launcher.partition=gpu",
        "model.base_filters=16,32",
        "resolution=full",
        "tracking.uri=http://mlflow.example:5000",
    ]
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        launches = []
        for _ in range(2):
            jobs = _jobs({}, typed)
            launches.append(
                [
                    OmegaConf.select(compose("train", overrides=job, return_hydra_config=True), "hydra.sweep")
                    for job in jobs
                ]
            )
        first, again = launches
        assert [(j.dir, j.subdir) for j in first] == [(j.dir, j.subdir) for j in again]
        assert [j.dir for j in first] == ["multirun", "multirun"]
        assert [j.subdir for j in first] == ["base_filters-16_resolution-full", "base_filters-32_resolution-full"]
        pinned = compose(
            "train", overrides=["model.base_filters=16", "run_dir=outputs/a", "tracking=none"], return_hydra_config=True
        )
        assert pinned.hydra.sweep.subdir == "base_filters-16"


def _jobs(sweep_params, typed: list[str]) -> list[list[str]]:
    """The jobs ``python train.py -m <typed>`` launches (Hydra's basic sweeper: its params, then the
    command line's overrides, a key given on both taking the command line's value)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    params = [f"{k}={v}" for k, v in sweep_params.items()]
    overrides = OverridesParser.create().parse_overrides([*params, *typed])
    return [job for batch in BasicSweeper.split_arguments(overrides, None) for job in batch]


@pytest.mark.parametrize(
    "experiment, extra, arms, folder",
    [
        (
            "patches_vs_whole",
            [],
            {"+arm": "whole,patch48,grow", "trainer.seed": "0,1,2"},
            "outputs/patches_vs_whole",
        ),
        (
            "patches_vs_whole_30",
            [],
            {"+arm": "whole,patch48,grow", "trainer.seed": "0,1,2"},
            "outputs/patches_vs_whole_30",
        ),
        (
            "patches_vs_whole_full",
            [],
            {"+arm": "whole,patch96,grow", "trainer.seed": "0,1,2"},
            "outputs/patches_vs_whole_full",
        ),
        ("resolution_study", [], {"resolution": "half,full"}, "outputs/resolution_study"),
        (
            "resolution_study",
            ["resolution=tiny", "resolution.shape=[48,64,48]"],
            {"resolution": "half,full"},
            "outputs/resolution_study",
        ),
        ("precision_study", [], {"backend.precision": "fp32,bf16", "trainer.seed": "0,1,2"}, "outputs/precision_study"),
        ("recipe_study", [], {"trainer.augment": "light,nnunet", "trainer.seed": "0,1,2"}, "outputs/recipe_study"),
    ],
)
def test_each_study_is_a_sweep_whose_jobs_compose_and_pass_the_checks(experiment, extra, arms, folder, tmp_path):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from brats_seg.checks import check_train_config
    from brats_seg.cli import to_config
    from brats_seg.data.labels import resolve_model_outputs
    from brats_seg.script_configs import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = compose("train", overrides=[f"experiment={experiment}", *extra], return_hydra_config=True)
        assert {k: str(v) for k, v in cfg.hydra.sweeper.params.items()} == arms
        assert cfg.hydra.sweep.dir == folder
        jobs = _jobs(cfg.hydra.sweeper.params, [f"experiment={experiment}", *extra])
        names = set()
        for job in jobs:
            name = OmegaConf.select(compose("train", overrides=job, return_hydra_config=True), "hydra.sweep.subdir")
            assert not set(name) & set("=,[] '\""), name  # usable as run_dir= unquoted
            names.add(name)
            conf = to_config(compose("train", overrides=job))
            conf.run_dir = str(tmp_path / name)
            if experiment != "precision_study" or conf.backend.precision == "fp32":
                check_train_config(resolve_model_outputs(conf))
        if experiment.startswith("patches_vs_whole"):  # grow composes the schedule, no patch
            grow = to_config(compose("train", overrides=[f"experiment={experiment}", "+arm=grow"]))
            assert grow.trainer.patch_schedule == "grow" and grow.trainer.patch_size is None
    assert len(names) == len(jobs)  # one folder per job
    if experiment.startswith("patches_vs_whole"):  # three arms of three seeds
        assert len(jobs) == 9 and {"arm-grow_seed-2", "arm-whole_seed-0"} <= names
    if extra:  # a key given on the command line replaces the sweep's own
        assert names == {"resolution-tiny_shape-48x64x48"}
