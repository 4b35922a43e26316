"""Structured config schemas: the single source of config field names, types and defaults.

Hydra composes ``configs/`` on top of these dataclasses (registered in the ConfigStore by
:func:`register_configs`); entry points convert the composed config once with
``OmegaConf.to_object`` and pass these plain dataclasses on. Nothing else under
``brats_seg/`` imports hydra or omegaconf but cli.py (the entry points' glue) and project.py (a
config composed from recorded overrides).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, List, Optional

from brats_seg.choices import check_choice, choice_type
from brats_seg.sweeps import sweep_dirname

# Closed sets of values: a value outside one fails at composition, naming the allowed ones
# (cli.config_error_line). Each is the one source of its set: the modules that act on a value
# import it from here (check_choice takes the Enum), and a table keyed by one covers exactly it
# (tests/unit/test_config_types.py).
Layout = choice_type("Layout", ("msd", "brats2021", "brats2023", "brats2024"), __name__)
OnError = choice_type("OnError", ("raise", "skip"), __name__)
Norm = choice_type("Norm", ("instance", "group", "batch"), __name__)
Upsample = choice_type("Upsample", ("transpose", "trilinear"), __name__)
Regions = choice_type("Regions", ("nested", "independent"), __name__)
LRSchedule = choice_type("LRSchedule", ("cosine", "constant"), __name__)
BackendName = choice_type("BackendName", ("auto", "gpu", "gpu_lms", "cpu_onednn"), __name__)
Precision = choice_type("Precision", ("fp32", "bf16", "fp16"), __name__)
LMSStrategy = choice_type("LMSStrategy", ("off", "recompute", "offload", "auto"), __name__)
TrackerName = choice_type("TrackerName", ("mlflow", "none"), __name__)
DistributeName = choice_type("DistributeName", ("none", "mirrored", "multi_worker"), __name__)
Collective = choice_type("Collective", ("auto", "ring", "nccl"), __name__)
LRScaling = choice_type("LRScaling", ("none", "linear"), __name__)
EvalMode = choice_type("EvalMode", ("whole", "sliding"), __name__)
PostprocessMode = choice_type("PostprocessMode", ("auto", "none"), __name__)
PlanFormat = choice_type("PlanFormat", ("table", "json"), __name__)
BenchmarkInput = choice_type("BenchmarkInput", ("memory", "pipeline"), __name__)
Split = choice_type("Split", ("val", "test", "all"), __name__)
ExportFormat = choice_type("ExportFormat", ("saved_model",), __name__)
CHOICES = {  # config key -> its closed set
    "data.layout": Layout, "data.on_error": OnError, "model.norm": Norm, "model.upsample": Upsample,
    "model.regions": Regions, "trainer.lr_schedule": LRSchedule, "backend": BackendName,
    "backend.precision": Precision, "lms": LMSStrategy, "tracking": TrackerName, "distribute": DistributeName,
    "distribute.collective": Collective, "distribute.lr_scaling": LRScaling, "evaluate.mode": EvalMode,
    "evaluate.postprocess": PostprocessMode,
    "plan.format": PlanFormat, "benchmark.input": BenchmarkInput, "split": Split, "format": ExportFormat,
}

# trainer.augment is not an Enum: it also takes true/false (the switch it used to be: light/none),
# which an Enum node refuses at composition; TrainerConfig checks it instead.
AUGMENT_PRESETS = ("none", "light", "nnunet")


def network_input_shape(cfg: "TrainConfig") -> tuple[int, int, int]:
    """The spatial shape the network trains on: ``trainer.patch_size`` (patch mode) or the whole
    ``resolution.shape``. What the memory planner plans and the training model is built for."""
    patch = cfg.trainer.patch_size
    return tuple(int(s) for s in (patch if patch else cfg.resolution.shape))


def augment_preset(value) -> str:
    """``trainer.augment`` as a preset name; ``true``/``false`` (the switch it used to be) mean light/none.

    Raises:
        ValueError: not a preset, naming the allowed ones.
    """
    if isinstance(value, bool):
        return "light" if value else "none"
    value = getattr(value, "value", value)
    return check_choice(value.lower() if isinstance(value, str) else value, AUGMENT_PRESETS, "trainer.augment",
                        hint="true and false mean light and none.")

__all__ = [
    "AUGMENT_PRESETS",
    "AugmentationConfig",
    "augment_preset",
    "CHOICES",
    "STANDARD_RESOLUTIONS",
    "DataConfig",
    "ResolutionConfig",
    "ModelConfig",
    "TrainerConfig",
    "BackendConfig",
    "LMSConfig",
    "TrackingConfig",
    "DistributeConfig",
    "EvaluateConfig",
    "PlanConfig",
    "BenchmarkConfig",
    "PrepareConfig",
    "MakeSyntheticConfig",
    "TrainConfig",
    "PlanMemoryConfig",
    "BenchmarkScriptConfig",
    "EvaluateScriptConfig",
    "PredictScriptConfig",
    "ExportScriptConfig",
    "ScoreScriptConfig",
    "register_configs",
    "config_to_dict",
    "config_from_dict",
    "flatten_config",
    "check_distribute_config",
]

@dataclass
class DataConfig:
    name: str = "synthetic"  # config name; `synthetic` generates a brats2021-layout dataset
    layout: Layout = Layout.brats2021  # msd | brats2021 | brats2023 | brats2024: how files and labels are laid out
    root: str = "data/synthetic"  # dataset folder; relative paths are taken from the cwd
    cache_dir: str = "data/cache"  # preprocessed cases live under <cache_dir>/<data.name>_<8 hex of the root's hash>/<resolution>/
    on_error: OnError = OnError["raise"]  # raise | skip: what a bad case does to preparation
    num_workers: int = 2  # parallel case preparation (processes); 2 = the cores of a small box
    prefetch_batches: int = 1  # training batches made ahead of the step; each costs memory (planned); 1 hides loading when a step takes longer than making a batch
    val_fraction: float = 0.15  # share of cases used for model selection
    test_fraction: float = 0.2  # share held out for the final score, never trained on
    split_seed: int = 0  # the split is a pure function of (case ids, seed, and each case's regions when stratified)
    stratify: bool = True  # val and test keep each group's share of cases, grouped by the regions a label holds (e.g. no ET): post-processing then sees them on val
    allow_crop: bool = False  # a brain box larger than resolution.shape: error (False) or warn+crop
    # Only for data=synthetic: generated on first use when `root` holds no cases.
    synthetic_cases: int = 40
    synthetic_seed: int = 0  # seed of the generated cases (data=synthetic): another seed, other phantoms


#: configs/resolution as (name, spacing in mm, network shape x, y, z), finest first: what a
#: message may suggest instead of a resolution that does not fit (tests/unit/test_cache_faults.py
#: checks it against the config files).
STANDARD_RESOLUTIONS = (
    ("2x", 0.5, (384, 448, 320)),
    ("full", 1.0, (192, 224, 160)),
    ("half", 2.0, (96, 112, 80)),
    ("tiny", 4.0, (48, 56, 40)),
)


@dataclass
class ResolutionConfig:
    name: str = "half"  # the resolution's name (configs/resolution/): cache folders and run names carry it
    spacing_mm: float = 2.0  # isotropic target spacing
    shape: List[int] = field(default_factory=lambda: [96, 112, 80])  # network input (x, y, z), RAS


@dataclass
class ModelConfig:
    name: str = "unet3d"  # the architecture (configs/model/); unet3d is the one there is
    depth: int = 3  # down-sampling steps; shape divisible by 2**depth (tiny allows 3; 4 at half/full, as in the experiments)
    base_filters: int = 16  # filters at level 0, doubled per level (Çiçek et al. use 32)
    norm: Norm = Norm.instance  # instance | group | batch (batch is unsafe with recompute)
    groups: int = 8  # groups for group norm
    upsample: Upsample = Upsample.transpose  # transpose | trilinear
    in_channels: int = 4  # 4 = FLAIR,T1,T1ce,T2; 1 = FLAIR only
    out_channels: int = 0  # 0 = one sigmoid output per region of data.layout (WT,TC,ET; +RC for brats2024); 1 = WT only
    foreground_prior: float = 0.01  # head bias = logit(prior): start near "background" everywhere
    regions: Regions = Regions.nested  # nested: sub-regions predicted within the tumour (P(TC) = P(WT) * P(TC|WT), same for ET), so the bulk of the volume cannot push a small region to empty; independent: one free sigmoid each
    region_parents: List[int] = field(default_factory=list)  # resolved from data.layout: the containing output of each output, -1 = none; empty = independent


@dataclass
class AugmentationConfig:
    """Ranges and probabilities of ``trainer.augment=nnunet``: nnU-Net's defaults for 3D (nnUNetTrainerV2,
    moreDA) unless said; a probability is per case unless its name says per channel."""

    p_rotation: float = 0.2  # rotate about x, y and z, each by an angle in +-rotation_deg
    rotation_deg: float = 30.0  # largest rotation, degrees, about each axis
    p_scale: float = 0.2  # zoom in or out, the same factor on every axis
    scale_range: List[float] = field(default_factory=lambda: [0.7, 1.4])  # [low, high] zoom factor
    order_data: int = 1  # image interpolation (spatial, low resolution); nnU-Net: 3, ~3x the time a case (docs/training.md)
    p_noise: float = 0.1  # additive Gaussian noise, variance drawn from noise_variance (z-scored units)
    noise_variance: List[float] = field(default_factory=lambda: [0.0, 0.1])  # [low, high] of the noise variance
    p_blur: float = 0.2  # Gaussian blur, sigma from blur_sigma (voxels), each channel with p_blur_per_channel
    p_blur_per_channel: float = 0.5  # within a blurred case, the chance each channel is blurred
    blur_sigma: List[float] = field(default_factory=lambda: [0.5, 1.0])  # [low, high] of the blur's sigma, voxels
    p_brightness: float = 0.15  # multiply by a factor from brightness_range
    brightness_range: List[float] = field(default_factory=lambda: [0.75, 1.25])  # [low, high] multiplier
    p_contrast: float = 0.15  # stretch about the mean by a factor from contrast_range
    contrast_range: List[float] = field(default_factory=lambda: [0.75, 1.25])  # [low, high] contrast factor
    p_low_res: float = 0.25  # down by a zoom from low_res_zoom and back up (thick slices, another scanner)
    p_low_res_per_channel: float = 0.5  # within such a case, the chance each channel is degraded
    low_res_zoom: List[float] = field(default_factory=lambda: [0.5, 1.0])  # [low, high] of the down-sampling zoom
    p_gamma: float = 0.3  # gamma from gamma_range on the image rescaled to [0, 1], its mean and std kept
    p_gamma_inverted: float = 0.1  # the same on the inverted image
    gamma_range: List[float] = field(default_factory=lambda: [0.7, 1.5])  # [low, high] gamma
    mirror_axes: List[int] = field(default_factory=lambda: [0, 1, 2])  # each mirrored with p 0.5

    def __post_init__(self) -> None:
        for name in [f.name for f in dataclasses.fields(self) if f.name.startswith("p_")]:
            value = getattr(self, name)
            if not 0.0 <= float(value) <= 1.0:
                raise ValueError(f"trainer.augmentation.{name}={value!r}: a probability, in [0, 1].")
        for name in ("scale_range", "noise_variance", "blur_sigma", "brightness_range", "contrast_range",
                     "low_res_zoom", "gamma_range"):
            pair = list(getattr(self, name))
            if len(pair) != 2 or not 0.0 <= float(pair[0]) <= float(pair[1]):
                raise ValueError(f"trainer.augmentation.{name}={pair!r}: use [low, high] with 0 <= low <= high.")
        if self.order_data not in (0, 1, 2, 3, 4, 5):
            raise ValueError(f"trainer.augmentation.order_data={self.order_data!r}: a spline order, 0 to 5 (1 linear, "
                             "3 cubic).")
        bad_axes = [a for a in self.mirror_axes if a not in (0, 1, 2)]
        if bad_axes:
            raise ValueError(f"trainer.augmentation.mirror_axes={list(self.mirror_axes)!r}: spatial axes 0 (x), 1 (y), "
                             "2 (z).")


@dataclass
class TrainerConfig:
    epochs: int = 120  # with the rest of the defaults: the demo; over seeds 0-2 on 40 unseen phantoms WT 0.83, ET 0.76 on 2 CPU cores (README)
    batch_size: int = 2  # the global batch: volumes (or patches) per step, split over replicas under distribute=
    seed: int = 0  # weights, data order and augmentation: a run is a function of its seed
    steps_per_epoch: Optional[int] = None  # cap on steps; None = one pass over the train split
    learning_rate: float = 3e-3  # Adam peak LR (after warm-up, cosine decay)
    lr_schedule: LRSchedule = LRSchedule.cosine  # cosine | constant
    warmup_epochs: int = 1  # epochs of linear warm-up from 0 to learning_rate (cosine schedule)
    early_stopping_patience: int = 0  # epochs without val-Dice gain before stopping; 0 = off
    augment: Any = "light"  # none | light (L-R flip, intensity scale/shift) | nnunet (brats_seg.data.augment); true/false = light/none
    augmentation: AugmentationConfig = field(default_factory=lambda: AugmentationConfig())  # the nnunet preset's ranges
    bce_weight: float = 1.0  # loss = soft Dice + bce_weight * BCE
    batch_dice: bool = True  # the soft Dice of each region over the batch (nnU-Net's batch_dice), not per sample; per replica under distribute=
    val_every: int = 1  # epochs between validations
    deterministic: bool = True  # TF op determinism: bit-identical resume; may slow some GPU kernels
    dead_region_epochs: int = 3  # epochs of an empty prediction (reference not empty) before warning that a region is dead; 0 = off
    patch_size: Optional[List[int]] = None  # [x, y, z]: train on random crops of this size (sliding-window inference); None = the whole volume
    foreground_fraction: float = 0.33  # patch mode: share of crops forced to contain tumour (nnU-Net's 1/3)
    time_budget_s: float = 0.0  # seconds of training (validation excluded) after which the run ends as if its epochs were done; 0 = off

    def __post_init__(self) -> None:
        # The preset's name (true/false, the switch this key used to be, mean light/none): a stored
        # config and a new one compare equal on resume, and code reads one of three strings.
        self.augment = augment_preset(self.augment)


@dataclass
class BackendConfig:
    name: BackendName = BackendName.auto  # auto | gpu | gpu_lms | cpu_onednn
    precision: Precision = Precision.fp32  # fp32 | bf16 | fp16 (fp16 only on GPU)
    intra_op_threads: int = 0  # 0 = physical cores
    inter_op_threads: int = 2  # two ops at a time: one was not faster, and its memory peak at full resolution was higher (docs/lms_calibration.md)
    onednn: bool = True  # TF_ENABLE_ONEDNN_OPTS on CPU
    memory_growth: bool = True  # GPU: allocate as needed instead of all at start
    xla: bool = False  # GPU only; forced off with LMS (XLA drops host placements)
    gpu_memory_limit_mb: int = 0  # >0: cap GPU 0 with a logical device limit (emulate a smaller GPU)
    log_level: str = "2"  # TF_CPP_MIN_LOG_LEVEL: 0 all, 1 no INFO, 2 no WARNING, 3 no ERROR


@dataclass
class LMSConfig:
    name: LMSStrategy = LMSStrategy.off  # off | auto | recompute | offload
    limit: str = "0.9"  # budget: bytes, "16GB", or a fraction of device memory (RAM on CPU)
    size: int = 1 << 20  # bytes; tensors smaller than this are never offloaded
    prefetch: int = 1  # blocks ahead in backward at which a copy back is issued
    host_bandwidth_gbps: float = 12.0  # host<->device link used to cost transfers (PCIe 3 x16 ~12)
    device_tflops: float = 10.0  # used to cost recomputation and to hide transfers


@dataclass
class TrackingConfig:
    name: TrackerName = TrackerName.mlflow  # mlflow | none
    uri: str = "sqlite:///mlruns.db"  # relative sqlite paths are taken from the project root
    experiment: str = "brats-seg"  # the MLflow experiment the runs are logged under
    system_metrics: bool = True  # MLflow system metrics (CPU, memory, GPU) beside the training curves
    register_as: str = ""  # a Model Registry name: the best model, logged at the end of training, is registered under it; "" = not registered


@dataclass
class DistributeConfig:
    name: DistributeName = DistributeName.none  # none | mirrored | multi_worker
    workers: List[str] = field(default_factory=list)  # host:port per worker (multi_worker); empty = TF_CONFIG, else SLURM
    index: int = 0  # this worker's index in `workers`
    devices: List[str] = field(default_factory=list)  # mirrored: e.g. ["/GPU:0", "/GPU:1"]; empty = all GPUs, else all logical CPUs
    port: int = 12345  # SLURM: port of a node's first task; its k-th task listens on port + k
    collective: Collective = Collective.auto  # multi_worker all-reduce: auto | ring (gRPC, CPU or GPU) | nccl (GPUs only)
    timeout_s: int = 90  # s; bounds the wait for a worker that never joins; 0 = wait forever
    # none | linear: trainer.batch_size is the global batch (split over replicas); linear multiplies
    # trainer.learning_rate by the replica count (Goyal et al. 2017), none keeps it as written.
    lr_scaling: LRScaling = LRScaling.none


@dataclass
class EvaluateConfig:
    mode: EvalMode = EvalMode.whole  # whole | sliding (windows, for volumes that do not fit at once)
    threshold: float = 0.5  # on the sigmoid probability, after resampling to the native grid
    overlays: bool = True  # a PNG per case: three slices with reference and prediction contours
    window: List[int] = field(default_factory=list)  # sliding window (x,y,z); empty = half the network grid
    window_overlap: float = 0.5  # sliding mode: fraction of the window shared by neighbours
    mirror: bool = True  # average with the L-R mirrored prediction (test-time mirroring, as nnU-Net); the mirrored pass runs after the first: about twice the time, one pass's memory plus the probabilities
    postprocess: PostprocessMode = PostprocessMode.auto  # auto: the run's postprocess.json (chosen on the val split by evaluate.py when missing or stale) | none


@dataclass
class PlanConfig:
    format: PlanFormat = PlanFormat.table  # table | json
    find: str = ""  # "" (plan the run) | max_input | max_batch | max_patch (trainer.patch_size, within resolution.shape): the largest that fits lms.limit, per strategy | max_width (model.base_filters, lms=auto, with the step time)


@dataclass
class BenchmarkConfig:
    steps: int = 5  # timed steps (the first is excluded from the median)
    input: BenchmarkInput = BenchmarkInput.memory  # memory: one random batch in memory | pipeline: the training input pipeline over random cache entries
    pipeline_only: bool = False  # time the input pipeline alone (volumes/s), no model
    sgemm: bool = False  # also measure a 4096^2 float32 SGEMM with the same threads, after the step (FLOP/s against it)
    sweep: str = ""  # a grid of overrides: a name in configs/benchmark_sweeps/ or a YAML path; JSONL + plots
    out: str = ""  # the sweep's JSON lines file; default outputs/benchmark/<sweep>/results.jsonl
    onednn_verbose: bool = False  # the last timed step's oneDNN primitives (ONEDNN_VERBOSE): ms per kind, the reorder share


@dataclass
class PrepareConfig:
    """Config of ``scripts/prepare_data.py``."""

    data: DataConfig = field(default_factory=DataConfig)
    resolution: ResolutionConfig = field(default_factory=ResolutionConfig)


@dataclass
class TrainConfig:
    """Config of ``train.py`` (and, with the same groups, the other entry points)."""

    data: DataConfig = field(default_factory=DataConfig)
    resolution: ResolutionConfig = field(default_factory=ResolutionConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    backend: BackendConfig = field(default_factory=BackendConfig)
    lms: LMSConfig = field(default_factory=LMSConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    distribute: DistributeConfig = field(default_factory=DistributeConfig)
    run_dir: str = ""  # empty = Hydra's output dir for this run
    run_name: str = ""  # empty = derived from data/resolution/model/backend


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

    run_dir: str = ""  # required: the training run's output folder
    split: Split = Split.test  # val | test | all
    checkpoint: str = "best"  # best (by val Dice) | last
    on: str = ""  # another dataset with the split's case ids (a configs/data name, e.g. mni_gliomas_shifted): eval/<split>@<on>/
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)
    backend: BackendConfig = field(default_factory=BackendConfig)


@dataclass
class PredictScriptConfig:
    """Config of ``scripts/predict.py``."""

    run_dir: str = ""  # the training run whose best model predicts (or export=)
    export: str = ""  # an exported model's folder (scripts/export.py) instead of run_dir: predicts as the run would
    input: str = ""  # required: a case folder, an MSD 4D file, a .txt list of either, or a dataset root
    output: str = ""  # required: folder for <case_id>.nii.gz masks
    checkpoint: str = "best"  # best | last: which of the run's checkpoints predicts
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)
    backend: BackendConfig = field(default_factory=BackendConfig)


@dataclass
class ExportScriptConfig:
    """Config of ``scripts/export.py``: a run's model as a SavedModel that serves without brats_seg."""

    run_dir: str = ""  # required: the training run whose model is exported
    checkpoint: str = "best"  # best (by val Dice) | last | a .keras file's path
    format: ExportFormat = ExportFormat.saved_model  # saved_model: TensorFlow SavedModel (TF Serving, tf.saved_model.load)
    output: str = ""  # the export's folder; empty = <run_dir>/export
    backend: BackendConfig = field(default_factory=BackendConfig)  # precision fp32 unless backend.precision= is given: portable


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

    fit: list[str] = field(default_factory=list)  # benchmark JSON lines whose lms=off points are fitted (a sweep's results.jsonl)
    held_out: list[str] = field(default_factory=list)  # JSON lines judged only: points the fit does not see
    out: str = ""  # default brats_seg/lms/presets/step_time.json (this CPU's entry replaced, others kept)
    write: bool = True  # false: report only
    figure: str = ""  # a PNG of predicted against measured step times (fitted, leave-one-out, held out)


@dataclass
class StudyScriptConfig:
    """Config of ``scripts/study.py``: the analysis of a study's finished run folders (a sweep's)."""

    dir: str = ""  # required: the study's folder (the sweep's hydra.sweep.dir), searched for run folders
    sets: Any = field(default_factory=lambda: ["test"])  # evaluations compared, a name or a list ([test,heldout]): test | val | shifted | heldout | heldout_shifted | <split>@<data config>
    evaluate: bool = True  # run scripts/evaluate.py for a finished run that lacks a set (logged to <dir>/logs/); false: list them
    overlays: bool = False  # evaluate.overlays of those evaluations: the study reads summaries, pictures cost time
    evaluate_args: List[str] = field(default_factory=list)  # more overrides for every evaluate.py, e.g. ["backend=cpu_onednn"]
    thresholds: List[float] = field(default_factory=lambda: [0.7, 0.8, 0.85])  # val mean Dice levels: training seconds to reach each
    ignore: List[str] = field(default_factory=lambda: [  # config keys (fnmatch patterns) that do not make an arm
        "trainer.seed", "run_dir", "run_name", "tracking.*", "data.num_workers", "data.cache_dir",
        "backend.log_level", "backend.intra_op_threads", "backend.inter_op_threads", "plan.*", "benchmark.*"])
    mlflow: bool = True  # log the charts and study.json into each run's MLflow run (artifacts study/)

@dataclass
class MemoryCalibrationConfig:
    """Config of ``scripts/calibrate_memory.py``: this CPU's memory preset measured, fitted and judged."""

    runs: int = 2  # benchmark runs per calibration point; the largest counts (the planner is to err high)
    validation_runs: int = 3  # benchmark runs per validation point
    fit_only: bool = False  # refit and report from the measurements on file; measure nothing
    timeout_s: int = 1800  # seconds one benchmark run may take before the calibration stops
    out: str = ""  # the preset file; empty = brats_seg/lms/presets/cpu_<kind>.json of this CPU's kind
    cross_validate: bool = False  # leave each calibration configuration out in turn, fit, report its error; writes nothing
    rule: dict[str, float] = field(default_factory=dict)  # with cross_validate: other values of MemoryModel rules, each given as +rule.<field>=<value> (e.g. +rule.backward_release_lag_layers=100)
    under_weight: Optional[float] = None  # with cross_validate: the fit's weight of under-prediction; null = the calibration's own
    target_bias: Optional[float] = None  # with cross_validate: how far above the measurements the fit aims; null = the calibration's own


@dataclass
class ScalingScriptConfig:
    """Config of ``scripts/scaling.py``: data-parallel workers against one process on the same cores."""

    resolution: ResolutionConfig = field(default_factory=ResolutionConfig)  # the grid both set-ups train at (resolution=half, or its keys)
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

    shape: List[int] = field(default_factory=list)  # required: the network grid (x, y, z), each divisible by 2^depth, e.g. [96,112,80]
    depth: int = 3  # U-Net depth of the measured model
    filters: int = 8  # U-Net base filters of the measured model
    mirror: bool = True  # test-time mirroring as evaluation runs it; false = one pass
    precision: Precision = Precision.fp32  # fp32 | bf16: the model's dtype policy, as evaluate.py backend.precision= runs it


@dataclass
class MniGliomasScriptConfig:
    """Config of ``scripts/make_mni_gliomas.py``: the MNI152 glioma dataset (brats2021 layout) written ahead of training."""

    out: str = "data/mni_gliomas"  # the dataset root; complete cases already there are kept
    n_cases: int = 20  # cases 0..n_cases-1 (about 8 s each)
    seed: int = 0  # the same seed writes the same files


@dataclass
class OfficialMetricsCheckConfig:
    """Config of ``scripts/check_official_metrics.py``: score.py against the official BraTS evaluation code."""

    work: str = "/tmp/brats_official_check"  # scratch folder: the designed cases, the official code fetched, their outputs
    n_cases: int = 10  # designed cases per label convention (brats2024, brats2023, brats2021, msd)
    official: str = ""  # a folder holding brats_evaluation/ (an unpacked wheel, a site-packages); empty = installed here, else <work>/be/unpacked
    metrics_2023: str = ""  # a clone of rachitsaluja/BraTS-2023-Metrics; empty = <work>/ref2023, else lesion23_* are not checked
    download: bool = False  # fetch what is missing: brats-evaluation with pip download --no-deps, the 2023 code with git clone
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

    resolution: ResolutionConfig = field(default_factory=ResolutionConfig)  # random data of its network grid (resolution.shape)


@dataclass
class RegionGradientsConfig:
    """Config of ``scripts/region_gradients.py``: which way the loss pushes each region's output, on a run's cases."""

    run_dir: str = ""  # required: the training run whose model and cached cases are read
    split: str = "test"  # train | val | test: the cases of the run's split file
    checkpoint: str = "best"  # init (freshly initialised with the run's seed, as training starts) | best | last
    backend: BackendConfig = field(default_factory=BackendConfig)  # where the model runs


def register_configs() -> None:
    """Register the schemas with Hydra's ConfigStore, the ``or_else`` resolver that lets
    ``train.yaml`` put Hydra's run folder at ``run_dir`` when one is given, and ``sweep_dirname``,
    which names a study's job folders (entry-point glue only)."""
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


def config_to_dict(cfg) -> dict:
    """Plain nested dict of a config dataclass (JSON-able)."""
    return dataclasses.asdict(cfg)


def config_from_dict(cls, values: dict):
    """Rebuild a config dataclass from :func:`config_to_dict` output (unknown keys rejected)."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ValueError(f"unknown {cls.__name__} keys {unknown}; was this run written by a newer brats-seg?")
    kwargs = {}
    for name, value in values.items():
        default = fields[name].default_factory() if fields[name].default_factory is not dataclasses.MISSING else None
        kwargs[name] = config_from_dict(type(default), value) if dataclasses.is_dataclass(default) else value
    return cls(**kwargs)


def flatten_config(cfg, prefix: str = "") -> dict[str, object]:
    """``{"data.root": ..., "model.depth": ...}``: the flattened config, e.g. for MLflow params."""
    out: dict[str, object] = {}
    for key, value in config_to_dict(cfg).items() if dataclasses.is_dataclass(cfg) else cfg.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten_config(value, name + "."))
        else:
            out[name] = value
    return out


_DISTRIBUTE_CHOICES = {"name": DistributeName, "collective": Collective, "lr_scaling": LRScaling}


def check_distribute_config(cfg: DistributeConfig) -> None:
    """Check the ``distribute`` group's values (the cluster itself is checked when resolved).

    Raises:
        ValueError: an unknown choice, a port outside 1..65535, a negative timeout or
            index, or ``distribute.devices`` with a strategy other than mirrored.
    """
    for key, choices in _DISTRIBUTE_CHOICES.items():
        check_choice(getattr(cfg, key), choices, "distribute" if key == "name" else f"distribute.{key}")
    if not 1 <= cfg.port <= 65535:
        raise ValueError(f"distribute.port={cfg.port}: use a TCP port in 1..65535 (e.g. 12345).")
    if cfg.timeout_s < 0:
        raise ValueError(f"distribute.timeout_s={cfg.timeout_s}: use seconds >= 0 (0 = wait forever).")
    if cfg.index < 0:
        raise ValueError(f"distribute.index={cfg.index}: use this worker's 0-based position in distribute.workers.")
    if cfg.devices and cfg.name != "mirrored":
        raise ValueError(
            f"distribute.devices={list(cfg.devices)} only applies to distribute=mirrored (distribute={cfg.name}): "
            "drop it, or restrict a multi_worker worker's GPUs with CUDA_VISIBLE_DEVICES."
        )
