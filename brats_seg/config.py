"""Structured config schemas of a run: the single source of config field names, types and defaults.

These dataclasses are the run's (``TrainConfig`` and its groups, ``evaluate`` included) and the
closed sets of values; the entry scripts' schemas are built on them in
:mod:`brats_seg.script_configs`, whose :func:`~brats_seg.script_configs.register_configs` puts
both in Hydra's ConfigStore. Hydra composes ``configs/`` on top of them; entry points convert the
composed config once with ``OmegaConf.to_object`` and pass these plain dataclasses on. Nothing
here imports hydra or omegaconf, nor anything of brats_seg but the leaves.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from brats_seg.choices import check_choice, choice_type

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
Calibrate = choice_type("Calibrate", ("auto", "now", "never"), __name__)
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
    "data.layout": Layout,
    "data.on_error": OnError,
    "model.norm": Norm,
    "model.upsample": Upsample,
    "model.regions": Regions,
    "trainer.lr_schedule": LRSchedule,
    "backend": BackendName,
    "backend.precision": Precision,
    "lms": LMSStrategy,
    "lms.calibrate": Calibrate,
    "tracking": TrackerName,
    "distribute": DistributeName,
    "distribute.collective": Collective,
    "distribute.lr_scaling": LRScaling,
    "evaluate.mode": EvalMode,
    "evaluate.postprocess": PostprocessMode,
    "plan.format": PlanFormat,
    "benchmark.input": BenchmarkInput,
    "split": Split,
    "format": ExportFormat,
}

# trainer.augment is not an Enum: it also takes true/false (the switch it used to be: light/none),
# which an Enum node refuses at composition; TrainerConfig checks it instead.
AUGMENT_PRESETS = ("none", "light", "nnunet")


def network_input_shape(cfg: TrainConfig) -> tuple[int, int, int]:
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
    return check_choice(
        value.lower() if isinstance(value, str) else value,
        AUGMENT_PRESETS,
        "trainer.augment",
        hint="true and false mean light and none.",
    )


__all__ = [
    "AUGMENT_PRESETS",
    "CHOICES",
    "STANDARD_RESOLUTIONS",
    "AugmentationConfig",
    "BackendConfig",
    "DataConfig",
    "DistributeConfig",
    "EvaluateConfig",
    "LMSConfig",
    "ModelConfig",
    "ResolutionConfig",
    "TrackingConfig",
    "TrainConfig",
    "TrainerConfig",
    "augment_preset",
    "check_distribute_config",
    "config_from_dict",
    "config_to_dict",
    "flatten_config",
]


@dataclass
class DataConfig:
    name: str = "synthetic"  # config name; `synthetic` generates a brats2021-layout dataset
    layout: Layout = Layout.brats2021  # msd | brats2021 | brats2023 | brats2024: how files and labels are laid out
    root: str = "data/synthetic"  # dataset folder; relative paths are taken from the cwd
    cache_dir: str = (
        "data/cache"  # preprocessed cases live under <cache_dir>/<data.name>_<8 hex of the root's hash>/<resolution>/
    )
    on_error: OnError = OnError["raise"]  # raise | skip: what a bad case does to preparation
    num_workers: str = "auto"  # parallel case preparation (processes): auto = the cores this process may use (affinity, cgroup quota), lowered to what memory holds; or a count
    prefetch_batches: int = 1  # training batches made ahead of the step; each costs memory (planned); 1 hides loading when a step takes longer than making a batch
    val_fraction: float = 0.15  # share of cases used for model selection
    test_fraction: float = 0.2  # share held out for the final score, never trained on
    split_seed: int = 0  # the split is a pure function of (case ids, seed, and each case's regions when stratified)
    split_file: str = (
        ""  # a split (train/val/test), a folds file or nnU-Net's splits_final.json; empty = the seeded split
    )
    fold: str = ""  # 0..num_folds-1: that cross-validation fold of the training cases (test stays out) | all: train on every training case | empty: no folds
    num_folds: int = 5  # folds of data.fold when they are made here (a folds split file brings its own)
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
    shape: list[int] = field(default_factory=lambda: [96, 112, 80])  # network input (x, y, z), RAS


@dataclass
class ModelConfig:
    name: str = "unet3d"  # the architecture (configs/model/); unet3d is the one there is
    depth: int = (
        3  # down-sampling steps; shape divisible by 2**depth (tiny allows 3; 4 at half/full, as in the experiments)
    )
    base_filters: int = 16  # filters at level 0, doubled per level (Çiçek et al. use 32)
    norm: Norm = Norm.instance  # instance | group | batch (batch is unsafe with recompute)
    groups: int = 8  # groups for group norm
    upsample: Upsample = Upsample.transpose  # transpose | trilinear
    in_channels: int = 4  # 4 = FLAIR,T1,T1ce,T2; 1 = FLAIR only
    out_channels: int = 0  # 0 = one sigmoid output per region of data.layout (WT,TC,ET; +RC for brats2024); 1 = WT only
    foreground_prior: float = 0.01  # head bias = logit(prior): start near "background" everywhere
    regions: Regions = Regions.nested  # nested: sub-regions predicted within the tumour (P(TC) = P(WT) * P(TC|WT), same for ET), so the bulk of the volume cannot push a small region to empty; independent: one free sigmoid each
    region_parents: list[int] = field(
        default_factory=list
    )  # resolved from data.layout: the containing output of each output, -1 = none; empty = independent


@dataclass
class AugmentationConfig:
    """Ranges and probabilities of ``trainer.augment=nnunet``: nnU-Net's defaults for 3D (nnUNetTrainerV2,
    moreDA) unless said; a probability is per case unless its name says per channel."""

    p_rotation: float = 0.2  # rotate about x, y and z, each by an angle in +-rotation_deg
    rotation_deg: float = 30.0  # largest rotation, degrees, about each axis
    p_scale: float = 0.2  # zoom in or out, the same factor on every axis
    scale_range: list[float] = field(default_factory=lambda: [0.7, 1.4])  # [low, high] zoom factor
    order_data: int = (
        1  # image interpolation (spatial, low resolution); nnU-Net: 3, ~3x the time a case (docs/training.md)
    )
    p_noise: float = 0.1  # additive Gaussian noise, variance drawn from noise_variance (z-scored units)
    noise_variance: list[float] = field(default_factory=lambda: [0.0, 0.1])  # [low, high] of the noise variance
    p_blur: float = 0.2  # Gaussian blur, sigma from blur_sigma (voxels), each channel with p_blur_per_channel
    p_blur_per_channel: float = 0.5  # within a blurred case, the chance each channel is blurred
    blur_sigma: list[float] = field(default_factory=lambda: [0.5, 1.0])  # [low, high] of the blur's sigma, voxels
    p_brightness: float = 0.15  # multiply by a factor from brightness_range
    brightness_range: list[float] = field(default_factory=lambda: [0.75, 1.25])  # [low, high] multiplier
    p_contrast: float = 0.15  # stretch about the mean by a factor from contrast_range
    contrast_range: list[float] = field(default_factory=lambda: [0.75, 1.25])  # [low, high] contrast factor
    p_low_res: float = 0.25  # down by a zoom from low_res_zoom and back up (thick slices, another scanner)
    p_low_res_per_channel: float = 0.5  # within such a case, the chance each channel is degraded
    low_res_zoom: list[float] = field(default_factory=lambda: [0.5, 1.0])  # [low, high] of the down-sampling zoom
    p_gamma: float = 0.3  # gamma from gamma_range on the image rescaled to [0, 1], its mean and std kept
    p_gamma_inverted: float = 0.1  # the same on the inverted image
    gamma_range: list[float] = field(default_factory=lambda: [0.7, 1.5])  # [low, high] gamma
    mirror_axes: list[int] = field(default_factory=lambda: [0, 1, 2])  # each mirrored with p 0.5

    def __post_init__(self) -> None:
        for name in [f.name for f in dataclasses.fields(self) if f.name.startswith("p_")]:
            value = getattr(self, name)
            if not 0.0 <= float(value) <= 1.0:
                raise ValueError(f"trainer.augmentation.{name}={value!r}: a probability, in [0, 1].")
        for name in (
            "scale_range",
            "noise_variance",
            "blur_sigma",
            "brightness_range",
            "contrast_range",
            "low_res_zoom",
            "gamma_range",
        ):
            pair = list(getattr(self, name))
            if len(pair) != 2 or not 0.0 <= float(pair[0]) <= float(pair[1]):
                raise ValueError(f"trainer.augmentation.{name}={pair!r}: use [low, high] with 0 <= low <= high.")
        if self.order_data not in (0, 1, 2, 3, 4, 5):
            raise ValueError(
                f"trainer.augmentation.order_data={self.order_data!r}: a spline order, 0 to 5 (1 linear, 3 cubic)."
            )
        bad_axes = [a for a in self.mirror_axes if a not in (0, 1, 2)]
        if bad_axes:
            raise ValueError(
                f"trainer.augmentation.mirror_axes={list(self.mirror_axes)!r}: spatial axes 0 (x), 1 (y), 2 (z)."
            )


@dataclass
class TrainerConfig:
    epochs: int = 120  # with the rest of the defaults: the demo; over seeds 0-2 on 40 unseen phantoms WT 0.83, ET 0.76 on 2 CPU cores (README)
    batch_size: int = 2  # the global batch: volumes (or patches) per step, split over replicas under distribute=
    seed: int = 0  # weights, data order and augmentation: a run is a function of its seed
    steps_per_epoch: int | None = None  # cap on steps; None = one pass over the train split
    learning_rate: float = 3e-3  # Adam peak LR (after warm-up, cosine decay)
    lr_schedule: LRSchedule = LRSchedule.cosine  # cosine | constant
    warmup_epochs: int = 1  # epochs of linear warm-up from 0 to learning_rate (cosine schedule)
    early_stopping_patience: int = 0  # epochs without val-Dice gain before stopping; 0 = off
    augment: Any = "light"  # none | light (L-R flip, intensity scale/shift) | nnunet (brats_seg.data.augment); true/false = light/none
    augmentation: AugmentationConfig = field(default_factory=lambda: AugmentationConfig())  # the nnunet preset's ranges
    bce_weight: float = 1.0  # loss = soft Dice + bce_weight * BCE
    batch_dice: bool = True  # the soft Dice of each region over the batch (nnU-Net's batch_dice), not per sample; per replica under distribute=
    val_every: int = 1  # epochs between validations
    val_cases: int = 0  # validation during training on this many of the val cases (a fixed seeded subset: 188 whole volumes a pass at full resolution is minutes); 0 = all. Post-processing and evaluate.py split=val use them all
    deterministic: bool = True  # TF op determinism: bit-identical resume; may slow some GPU kernels
    dead_region_epochs: int = (
        3  # epochs of an empty prediction (reference not empty) before warning that a region is dead; 0 = off
    )
    patch_size: list[int] | None = (
        None  # [x, y, z]: train on random crops of this size (sliding-window inference); None = the whole volume
    )
    patch_schedule: Any = None  # grow | [{patch: [x, y, z] | whole, share: s, batch_size: b}, ...]: patch sizes in stages, each its share of the budget (or epochs); null = trainer.patch_size throughout
    foreground_fraction: float = 0.33  # patch mode: share of crops forced to contain tumour (nnU-Net's 1/3)
    time_budget_s: float = (
        0.0  # seconds of training (validation excluded) after which the run ends as if its epochs were done; 0 = off
    )

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
    calibrate: Calibrate = Calibrate.auto  # auto: a CPU without a step-time calibration is measured on first use (minutes, cached per CPU) for runs of seconds a step | now: measure again | never


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
    workers: list[str] = field(
        default_factory=list
    )  # host:port per worker (multi_worker); empty = TF_CONFIG, else SLURM
    index: int = 0  # this worker's index in `workers`
    devices: list[str] = field(
        default_factory=list
    )  # mirrored: e.g. ["/GPU:0", "/GPU:1"]; empty = all GPUs, else all logical CPUs
    port: int = 12345  # SLURM: port of a node's first task; its k-th task listens on port + k
    collective: Collective = (
        Collective.auto
    )  # multi_worker all-reduce: auto | ring (gRPC, CPU or GPU) | nccl (GPUs only)
    timeout_s: int = 90  # s; bounds the wait for a worker that never joins; 0 = wait forever
    # none | linear: trainer.batch_size is the global batch (split over replicas); linear multiplies
    # trainer.learning_rate by the replica count (Goyal et al. 2017), none keeps it as written.
    lr_scaling: LRScaling = LRScaling.none


@dataclass
class EvaluateConfig:
    mode: EvalMode = EvalMode.whole  # whole | sliding (windows, for volumes that do not fit at once)
    threshold: float = 0.5  # on the sigmoid probability, after resampling to the native grid
    overlays: bool = True  # a PNG per case: three slices with reference and prediction contours
    window: list[int] = field(default_factory=list)  # sliding window (x,y,z); empty = half the network grid
    window_overlap: float = 0.5  # sliding mode: fraction of the window shared by neighbours
    mirror: bool = True  # average with the L-R mirrored prediction (test-time mirroring, as nnU-Net); the mirrored pass runs after the first: about twice the time, one pass's memory plus the probabilities
    postprocess: PostprocessMode = (
        PostprocessMode.auto
    )  # auto: the run's postprocess.json (chosen on the val split by evaluate.py when missing or stale) | none


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
