"""The entry scripts' config schemas, built on the run's (:mod:`brats_seg.config`), and their
registration with Hydra.

Every command but ``train.py`` composes one of these: the run ``train.py`` would make with keys of
its own (``PlanMemoryConfig``, ``BenchmarkScriptConfig``, ``DemoSeedsScriptConfig`` extend
``TrainConfig``), or a schema of its own (``prepare_data.py``, ``evaluate.py``, ``predict.py``,
``score.py``, the calibrations, the studies, ...). :func:`register_configs`, which every entry point
calls first, puts each in Hydra's ConfigStore, ``TrainConfig`` included.

They live in one module, not each beside its script's logic (``evaluation/``, ``benchmark/``,
``lms/``), because two modules low in the import order read every schema:
:mod:`brats_seg.config_reference`, which generates ``docs/configuration.md`` from them, and
:mod:`brats_seg.cli`, whose ``_ENTRY_SCHEMAS`` names each entry point's schema for the near-miss
hint of a bad key. Beside their logic, reading them would import those packages (TensorFlow with
some of them) into the doc generator and the entry-point glue, arrows pointing up. Like config.py
this module is plain dataclasses: it imports config.py and the leaves only (hydra and omegaconf
inside :func:`register_configs`), and config.py does not import it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from brats_seg.config import (
    BackendConfig,
    BenchmarkInput,
    DataConfig,
    EvaluateConfig,
    ExportFormat,
    Layout,
    PlanFormat,
    Precision,
    ResolutionConfig,
    Split,
    TrainConfig,
)
from brats_seg.sweeps import sweep_dirname

__all__ = [
    "AugmentProfileConfig",
    "BenchmarkConfig",
    "BenchmarkScriptConfig",
    "DemoSeedsScriptConfig",
    "EvaluateScriptConfig",
    "ExportScriptConfig",
    "InferencePeakConfig",
    "MakeSyntheticConfig",
    "MemoryCalibrationConfig",
    "MniGliomasScriptConfig",
    "OfficialMetricsCheckConfig",
    "PlanConfig",
    "PlanMemoryConfig",
    "PredictScriptConfig",
    "PrepareConfig",
    "RegionGradientsConfig",
    "ScalingScriptConfig",
    "ScoreScriptConfig",
    "StepTimeCalibrationConfig",
    "StudyScriptConfig",
    "register_configs",
]


@dataclass
class PlanConfig:
    format: PlanFormat = PlanFormat.table  # table | json
    cases: int = 0  # the time of a dataset of this many labelled cases (split by data.val_fraction, data.test_fraction, data.fold) instead of those at data.root: the cost before the download
    find: str = ""  # "" (plan the run) | max_input | max_batch | max_patch (trainer.patch_size, within resolution.shape): the largest that fits lms.limit, per strategy | max_width (model.base_filters, lms=auto, with the step time)


@dataclass
class BenchmarkConfig:
    steps: int = 5  # timed steps (the first is excluded from the median)
    input: BenchmarkInput = (
        BenchmarkInput.memory
    )  # memory: one random batch in memory | pipeline: the training input pipeline over random cache entries
    pipeline_only: bool = False  # time the input pipeline alone (volumes/s), no model
    sgemm: bool = False  # also measure a 4096^2 float32 SGEMM with the same threads, after the step (FLOP/s against it)
    sweep: str = ""  # a grid of overrides: a name in configs/benchmark_sweeps/ or a YAML path; JSONL + plots
    out: str = ""  # the sweep's JSON lines file; default outputs/benchmark/<sweep>/results.jsonl
    onednn_verbose: bool = (
        False  # the last timed step's oneDNN primitives (ONEDNN_VERBOSE): ms per kind, the reorder share
    )


@dataclass
class PrepareConfig:
    """Config of ``scripts/prepare_data.py``."""

    data: DataConfig = field(default_factory=DataConfig)
    resolution: ResolutionConfig = field(default_factory=ResolutionConfig)


@dataclass
class PlanMemoryConfig(TrainConfig):
    """Config of ``scripts/plan_memory.py``: the run ``train.py`` would make, and how to plan it."""

    plan: PlanConfig = field(default_factory=PlanConfig)


@dataclass
class BenchmarkScriptConfig(TrainConfig):
    """Config of ``scripts/benchmark.py`` (and ``scripts/profile_step.py``): the run ``train.py``
    would make, and how to time its step."""

    benchmark: BenchmarkConfig = field(default_factory=BenchmarkConfig)


@dataclass
class MakeSyntheticConfig:
    """Config of ``scripts/make_synthetic.py``: a synthetic BraTS-like dataset."""

    out: str = "???"  # required (Hydra's ???): dataset root to write (created if needed); relative = from the cwd
    layout: Layout = Layout.brats2021  # msd | brats2021 | brats2023 | brats2024: file names and label values
    n_cases: int = 10  # cases 0..n_cases-1; case i is the same whatever n_cases is
    seed: int = 0  # case i is drawn from np.random.default_rng([seed, i])
    labels: bool = True  # false: an unlabelled test set (no seg files; msd: imagesTs/ and "test")


@dataclass
class EvaluateScriptConfig:
    """Config of ``scripts/evaluate.py``."""

    run_dir: str = ""  # required: the training run's output folder (with runs=: the ensemble's folder)
    split: Split = Split.test  # val | test | all
    checkpoint: str = "best"  # best (by val Dice) | last
    on: str = ""  # another dataset with the split's case ids (a configs/data name, e.g. mni_gliomas_shifted): eval/<split>@<on>/
    runs: list[str] = field(
        default_factory=list
    )  # two or more run folders (e.g. the folds): run_dir becomes their ensemble (probabilities averaged)
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)
    backend: BackendConfig = field(default_factory=BackendConfig)


@dataclass
class PredictScriptConfig:
    """Config of ``scripts/predict.py``."""

    run_dir: str = ""  # the training run whose best model predicts (or export=; with runs=: the ensemble's folder)
    runs: list[str] = field(
        default_factory=list
    )  # two or more run folders: run_dir becomes their ensemble (probabilities averaged)
    export: str = ""  # an exported model's folder (scripts/export.py) instead of run_dir: predicts as the run would
    input: str = ""  # required: a case folder, an MSD 4D file, a .txt list of either, or a dataset root
    output: str = ""  # required: folder for <case_id>.nii.gz masks
    labels: str = ""  # the label values written: empty = the run's data.layout; brats2021 (ET 4) | brats2023 | brats2024 (ET 3) | msd
    checkpoint: str = "best"  # best | last: which of the run's checkpoints predicts
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)
    backend: BackendConfig = field(default_factory=BackendConfig)


@dataclass
class ExportScriptConfig:
    """Config of ``scripts/export.py``: a run's model as a SavedModel that serves without brats_seg."""

    run_dir: str = ""  # required: the training run whose model is exported
    checkpoint: str = "best"  # best (by val Dice) | last | a .keras file's path
    format: ExportFormat = (
        ExportFormat.saved_model
    )  # saved_model: TensorFlow SavedModel (TF Serving, tf.saved_model.load)
    output: str = ""  # the export's folder; empty = <run_dir>/export
    backend: BackendConfig = field(
        default_factory=BackendConfig
    )  # precision fp32 unless backend.precision= is given: portable


@dataclass
class ScoreScriptConfig:
    """Config of ``scripts/score.py``: score existing masks, no model."""

    pred_dir: str = ""  # required: <case_id>.nii.gz masks in the layout's labels
    ref_dir: str = ""  # required: the dataset root holding the reference label files
    out: str = ""  # CSV path; empty = <pred_dir>/metrics.csv
    data: DataConfig = field(default_factory=DataConfig)


@dataclass
class StepTimeCalibrationConfig:
    """Config of ``scripts/calibrate_step_time.py``: the planner's step-time model fitted to benchmark sweeps."""

    fit: list[str] = field(
        default_factory=list
    )  # benchmark JSON lines whose lms=off points are fitted (a sweep's results.jsonl)
    held_out: list[str] = field(default_factory=list)  # JSON lines judged only: points the fit does not see
    out: str = ""  # default brats_seg/lms/presets/step_time.json (this CPU's entry replaced, others kept)
    write: bool = True  # false: report only
    figure: str = ""  # a PNG of predicted against measured step times (fitted, leave-one-out, held out)
    quick: bool = False  # measure this CPU now (a short sweep, minutes) instead of fit=, cached per CPU id in the user's cache (or out=)
    draws: int = 1  # quick=true: each point measured this many times round robin, fitted on its median draw (3 measured no better on held-out points, at 3x the time)


@dataclass
class StudyScriptConfig:
    """Config of ``scripts/study.py``: the analysis of a study's finished run folders (a sweep's)."""

    dir: str = ""  # required: the study's folder (the sweep's hydra.sweep.dir), searched for run folders
    sets: Any = field(
        default_factory=lambda: ["test"]
    )  # evaluations compared, a name or a list ([test,heldout]): test | val | shifted | heldout | heldout_shifted | <split>@<data config>
    evaluate: bool = (
        True  # run scripts/evaluate.py for a finished run that lacks a set (logged to <dir>/logs/); false: list them
    )
    overlays: bool = False  # evaluate.overlays of those evaluations: the study reads summaries, pictures cost time
    evaluate_args: list[str] = field(
        default_factory=list
    )  # more overrides for every evaluate.py, e.g. ["backend=cpu_onednn"]
    thresholds: list[float] = field(
        default_factory=lambda: [0.7, 0.8, 0.85]
    )  # val mean Dice levels: training seconds to reach each
    ignore: list[str] = field(
        default_factory=lambda: [  # config keys (fnmatch patterns) that do not make an arm
            "trainer.seed",
            "run_dir",
            "run_name",
            "tracking.*",
            "data.num_workers",
            "data.cache_dir",
            "backend.log_level",
            "backend.intra_op_threads",
            "backend.inter_op_threads",
            "plan.*",
            "benchmark.*",
        ]
    )
    mlflow: bool = True  # log the charts and study.json into each run's MLflow run (artifacts study/)


@dataclass
class MemoryCalibrationConfig:
    """Config of ``scripts/calibrate_memory.py``: this CPU's memory preset measured, fitted and judged."""

    runs: int = 2  # benchmark runs per calibration point; the largest counts (the planner is to err high)
    validation_runs: int = 3  # benchmark runs per validation point
    fit_only: bool = False  # refit and report from the measurements on file; measure nothing
    timeout_s: int = 1800  # seconds one benchmark run may take before the calibration stops
    out: str = ""  # the preset file; empty = brats_seg/lms/presets/cpu_<kind>.json of this CPU's kind
    cross_validate: bool = (
        False  # leave each calibration configuration out in turn, fit, report its error; writes nothing
    )
    rule: dict[str, float] = field(
        default_factory=dict
    )  # with cross_validate: other values of MemoryModel rules, each given as +rule.<field>=<value> (e.g. +rule.backward_release_lag_layers=100)
    under_weight: float | None = (
        None  # with cross_validate: the fit's weight of under-prediction; null = the calibration's own
    )
    target_bias: float | None = (
        None  # with cross_validate: how far above the measurements the fit aims; null = the calibration's own
    )


@dataclass
class ScalingScriptConfig:
    """Config of ``scripts/scaling.py``: data-parallel workers against one process on the same cores."""

    resolution: ResolutionConfig = field(
        default_factory=ResolutionConfig
    )  # the grid both set-ups train at (resolution=half, or its keys)
    depth: int = 3  # model.depth of both set-ups
    filters: int = 16  # model.base_filters of both set-ups
    batch: int = 2  # the global batch, split over the workers (a multiple of workers)
    steps: int = 8  # steps per epoch; the second of two epochs is timed (the first traces the step)
    cases: int = 24  # synthetic cases written: enough for steps x batch
    workers: int = 2  # training processes of the data-parallel set-up (distribute=multi_worker)
    threads: int = 1  # intra-op threads per worker; the single process gets workers x threads
    out: str = ""  # also write the result here as JSON; empty = print it only


@dataclass
class InferencePeakConfig:
    """Config of ``scripts/measure_inference_peak.py``: whole-volume inference's first-call memory against the planner."""

    shape: list[int] = field(
        default_factory=list
    )  # required: the network grid (x, y, z), each divisible by 2^depth, e.g. [96,112,80]
    depth: int = 3  # U-Net depth of the measured model
    filters: int = 8  # U-Net base filters of the measured model
    mirror: bool = True  # test-time mirroring as evaluation runs it; false = one pass
    precision: Precision = (
        Precision.fp32
    )  # fp32 | bf16: the model's dtype policy, as evaluate.py backend.precision= runs it


@dataclass
class MniGliomasScriptConfig:
    """Config of ``scripts/make_mni_gliomas.py``: the MNI152 glioma dataset (brats2021 layout) written ahead of training."""

    out: str = "data/mni_gliomas"  # the dataset root; complete cases already there are kept
    n_cases: int = 20  # cases 0..n_cases-1 (about 8 s each)
    seed: int = 0  # the same seed writes the same files


@dataclass
class OfficialMetricsCheckConfig:
    """Config of ``scripts/check_official_metrics.py``: score.py against the official BraTS evaluation code."""

    work: str = (
        "/tmp/brats_official_check"  # scratch folder: the designed cases, the official code fetched, their outputs
    )
    n_cases: int = 10  # designed cases per label convention (brats2024, brats2023, brats2021, msd)
    official: str = ""  # a folder holding brats_evaluation/ (an unpacked wheel, a site-packages); empty = installed here, else <work>/be/unpacked
    metrics_2023: str = (
        ""  # a clone of rachitsaluja/BraTS-2023-Metrics; empty = <work>/ref2023, else lesion23_* are not checked
    )
    download: bool = (
        False  # fetch what is missing: brats-evaluation with pip download --no-deps, the 2023 code with git clone
    )
    expected: str = ""  # write the official values of the small cases to this JSON (tests' data) instead of checking


@dataclass
class DemoSeedsScriptConfig(TrainConfig):
    """Config of ``scripts/demo_seeds.py``: ``make demo``'s recipe (experiment=demo) over seeds; every train.py key is passed on."""

    seeds: Any = field(default_factory=lambda: [0, 1, 2])  # the seeds, an arm each: a list ([0,1,2]) or one seed (3)
    out: str = "outputs/demo_seeds"  # the arms' run folders <out>/seed<seed>, their logs and demo_seeds.json
    heldout: str = "synthetic_heldout"  # a configs/data set with the run's case ids, never seen while the recipe was chosen: scored as split=all on=<it>; empty = none


@dataclass
class AugmentProfileConfig:
    """Config of ``scripts/profile_augment.py``: each transform of the nnunet augmentation preset alone, on one volume."""

    resolution: ResolutionConfig = field(
        default_factory=ResolutionConfig
    )  # random data of its network grid (resolution.shape)


@dataclass
class RegionGradientsConfig:
    """Config of ``scripts/region_gradients.py``: which way the loss pushes each region's output, on a run's cases."""

    run_dir: str = ""  # required: the training run whose model and cached cases are read
    split: str = "test"  # train | val | test: the cases of the run's split file
    checkpoint: str = "best"  # init (freshly initialised with the run's seed, as training starts) | best | last
    backend: BackendConfig = field(default_factory=BackendConfig)  # where the model runs


def register_configs() -> None:
    """Register every entry point's schema (``train.py``'s and the scripts') with Hydra's
    ConfigStore, the ``or_else`` resolver that lets ``train.yaml`` put Hydra's run folder at
    ``run_dir`` when one is given, and ``sweep_dirname``, which names a study's job folders
    (entry-point glue only)."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("or_else"):
        OmegaConf.register_new_resolver("or_else", lambda value, default: value or default)
    if not OmegaConf.has_resolver("sweep_dirname"):  # a study's job folders (configs/experiment/*: hydra.sweep.subdir)
        OmegaConf.register_new_resolver("sweep_dirname", sweep_dirname)

    cs = ConfigStore.instance()
    cs.store(name="train_schema", node=TrainConfig)
    cs.store(name="plan_memory_schema", node=PlanMemoryConfig)
    cs.store(name="benchmark_schema", node=BenchmarkScriptConfig)
    cs.store(name="prepare_schema", node=PrepareConfig)
    cs.store(name="make_synthetic_schema", node=MakeSyntheticConfig)
    cs.store(name="evaluate_schema", node=EvaluateScriptConfig)
    cs.store(name="predict_schema", node=PredictScriptConfig)
    cs.store(name="export_schema", node=ExportScriptConfig)
    cs.store(name="score_schema", node=ScoreScriptConfig)
    cs.store(name="step_time_schema", node=StepTimeCalibrationConfig)
    cs.store(name="study_schema", node=StudyScriptConfig)
    cs.store(name="memory_calibration_schema", node=MemoryCalibrationConfig)
    cs.store(name="scaling_schema", node=ScalingScriptConfig)
    cs.store(name="inference_peak_schema", node=InferencePeakConfig)
    cs.store(name="mni_gliomas_schema", node=MniGliomasScriptConfig)
    cs.store(name="official_metrics_schema", node=OfficialMetricsCheckConfig)
    cs.store(name="demo_seeds_schema", node=DemoSeedsScriptConfig)
    cs.store(name="augment_profile_schema", node=AugmentProfileConfig)
    cs.store(name="region_gradients_schema", node=RegionGradientsConfig)
