"""What the LMS planner plans (:class:`Workload`) and how it bounds and prices a plan (:class:`LMSOptions`).

Both are checked when made, so a bad value is reported once, named, with what to use
instead, before anything is costed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from brats_seg.choices import check_choice
from brats_seg.config import LMSConfig, LMSStrategy, ModelConfig, TrainConfig, augment_preset, network_input_shape
from brats_seg.model.checks import check_batch_size, check_input_shape, check_model_config, check_policy
from brats_seg.model.topology import UNetTopology, unet_topology

if TYPE_CHECKING:
    from brats_seg.lms.planner.step_time import CpuTimeModel

__all__ = ["FIXED_STRATEGIES", "OPTIMIZER_SLOTS", "LMSOptions", "Workload", "pipeline_batches"]

FIXED_STRATEGIES = ("off", "recompute", "offload")  # LMSStrategy but auto: one policy for every block that allows it

# Optimizer -> float32 slot variables per trainable weight.
OPTIMIZER_SLOTS = {"adam": 2, "adamw": 2, "sgd": 0, "sgd_momentum": 1}

_LMS_DEFAULTS = LMSConfig()
DEFAULT_SIZE_BYTES = _LMS_DEFAULTS.size
DEFAULT_PREFETCH = _LMS_DEFAULTS.prefetch
DEFAULT_HOST_BANDWIDTH_BPS = _LMS_DEFAULTS.host_bandwidth_gbps * 1e9
DEFAULT_DEVICE_FLOPS = _LMS_DEFAULTS.device_tflops * 1e12


def pipeline_batches(prefetch_batches: int) -> int:
    """Batches the training input pipeline can hold besides the step's: ``prefetch_batches``
    finished ones, the one being assembled, and the case in its map call with its float32
    augmentation temporary (about one more batch at batch 1; ``brats_seg.data.pipeline``)."""
    if not isinstance(prefetch_batches, int) or prefetch_batches < 0:
        raise ValueError(f"data.prefetch_batches must be an integer >= 0, got {prefetch_batches!r}.")
    return prefetch_batches + 2


@dataclass(frozen=True)
class Workload:
    """One training step to plan.

    Attributes:
        model_cfg: the U-Net config, ``out_channels`` resolved (not 0; see
            :func:`brats_seg.data.labels.resolve_model_outputs`).
        input_shape: spatial ``(x, y, z)``, each divisible by ``2**depth``.
        batch_size: samples per step.
        policy: ``float32`` | ``mixed_float16`` | ``mixed_bfloat16``; ``fp32``, ``fp16`` and
            ``bf16`` (``backend.precision``) are stored as these.
        optimizer: a key of :data:`OPTIMIZER_SLOTS`.
        input_batches: batches the input pipeline holds besides the one the step reads
            (``brats_seg.data.pipeline``: the prefetched ones, the one being assembled and
            the case in its map call); 0 for a step fed from memory (the benchmark).
        validates: the process also runs the validation pass (forward only, one case at a
            time, with the training pipeline's buffers still held): ``train.py`` does, the
            benchmark does not. Planned as a step of its own after the training step.
        augment: the training augmentation preset (``trainer.augment``): ``nnunet`` adds its
            temporaries for the case in the pipeline's map call (``cost.augment_bytes``).
        validation_grid: the grid validation infers whole volumes on by sliding windows of the
            input shape, when it is not the input (a patch run or stage); None: validation runs
            the network on its input shape (whole-volume training).

    Raises:
        ValueError: a bad value, named, with what to use instead.
    """

    model_cfg: ModelConfig
    input_shape: tuple[int, int, int]
    batch_size: int
    policy: str = "float32"
    optimizer: str = "adam"
    input_batches: int = 0
    validates: bool = False
    augment: str = "light"
    validation_grid: tuple[int, int, int] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "policy", check_policy(self.policy))
        check_model_config(self.model_cfg)
        object.__setattr__(self, "input_shape", check_input_shape(self.input_shape, self.model_cfg.depth))
        check_batch_size(self.batch_size)
        check_choice(self.optimizer, OPTIMIZER_SLOTS, "optimizer")
        if not isinstance(self.input_batches, int) or self.input_batches < 0:
            raise ValueError(f"input_batches must be an integer >= 0, got {self.input_batches!r}.")
        object.__setattr__(self, "augment", augment_preset(self.augment))

    @classmethod
    def from_config(cls, cfg: TrainConfig, optimizer: str = "adam") -> Workload:
        """The workload of a composed train config (``model``, ``resolution``, ``trainer``,
        ``backend.precision``, ``data.prefetch_batches``; the network's input is the patch in patch
        mode, :func:`~brats_seg.config.network_input_shape`), ``model.out_channels`` resolved from
        ``data.layout``; ``cfg`` is not changed. The config has no optimizer field: the
        trainer's Adam is the default. The step is fed by the input pipeline, and the run
        validates."""
        from brats_seg.data.labels import output_regions

        model_cfg = dataclasses.replace(
            cfg.model, out_channels=len(output_regions(cfg.data.layout, cfg.model.out_channels))
        )
        shape, grid = network_input_shape(cfg), tuple(int(g) for g in cfg.resolution.shape)
        return cls(
            model_cfg,
            shape,
            cfg.trainer.batch_size,
            cfg.backend.precision,
            optimizer,
            input_batches=pipeline_batches(cfg.data.prefetch_batches),
            validates=True,
            augment=cfg.trainer.augment,
            validation_grid=None if tuple(shape) == grid else grid,
        )

    def topology(self) -> UNetTopology:
        """The U-Net under this workload's dtype policy."""
        return unet_topology(self.model_cfg, self.policy)

    def with_input(self, input_shape: tuple[int, int, int] | None = None, batch_size: int | None = None) -> Workload:
        """The same workload at another input shape and/or batch size."""
        return dataclasses.replace(
            self,
            input_shape=self.input_shape if input_shape is None else input_shape,
            batch_size=self.batch_size if batch_size is None else batch_size,
        )


@dataclass(frozen=True)
class LMSOptions:
    """How a plan is bounded, chosen and priced: the ``lms`` config group and the device.

    Attributes:
        limit_bytes: the device budget (see :func:`brats_seg.lms.planner.units.parse_limit`); None
            only where no budget is involved (:func:`brats_seg.lms.planner.search.estimate_peak`).
        strategy: ``off`` (keep all), ``recompute`` (all), ``offload`` (all blocks and
            skips whose tensors reach ``size_bytes``), ``auto`` (least predicted overhead
            that fits).
        size_bytes: tensors smaller than this are never offloaded (``lms.size``).
        prefetch: blocks ahead in backward at which copies back are issued (``lms.prefetch``).
        host_bandwidth_bps: host<->device bytes/s, to price transfers.
        device_flops: FLOP/s, to price recomputation and how much transfer it hides, on a GPU.
        allow_offload: False on CPU (host memory is the device): only keep/recompute.
        time_model: on a CPU, the measured step-time model that prices recomputation instead
            of ``device_flops`` (:mod:`brats_seg.lms.planner.step_time`); None on a GPU.

    Raises:
        ValueError: a bad value, named, with what to use instead.
    """

    limit_bytes: int | None = None
    strategy: str = "auto"
    size_bytes: int = DEFAULT_SIZE_BYTES
    prefetch: int = DEFAULT_PREFETCH
    host_bandwidth_bps: float = DEFAULT_HOST_BANDWIDTH_BPS
    device_flops: float = DEFAULT_DEVICE_FLOPS
    allow_offload: bool = True
    time_model: CpuTimeModel | None = None

    def __post_init__(self) -> None:
        check_choice(self.strategy, LMSStrategy, "lms strategy")
        if self.strategy == "offload" and not self.allow_offload:
            raise ValueError(
                "lms=offload needs a GPU (on CPU, host memory is the device); use lms=recompute or lms=auto."
            )
        if self.limit_bytes is not None and (not isinstance(self.limit_bytes, (int, float)) or self.limit_bytes <= 0):
            raise ValueError(
                f"limit_bytes must be a positive number of bytes, got {self.limit_bytes!r}; see parse_limit."
            )
        if not isinstance(self.size_bytes, int) or self.size_bytes < 0:
            raise ValueError(f"lms.size must be an integer number of bytes >= 0, got {self.size_bytes!r}.")
        if not isinstance(self.prefetch, int) or self.prefetch < 0:
            raise ValueError(f"lms.prefetch must be an integer >= 0 (blocks ahead), got {self.prefetch!r}.")
        if not self.host_bandwidth_bps > 0:
            raise ValueError(
                f"host bandwidth must be > 0 bytes/s, got {self.host_bandwidth_bps!r}; check lms.host_bandwidth_gbps."
            )
        if not self.device_flops > 0:
            raise ValueError(f"device FLOP rate must be > 0, got {self.device_flops!r}; check lms.device_tflops.")
        if self.limit_bytes is not None:
            object.__setattr__(self, "limit_bytes", int(self.limit_bytes))  # peaks are whole bytes
        object.__setattr__(self, "host_bandwidth_bps", float(self.host_bandwidth_bps))
        object.__setattr__(self, "device_flops", float(self.device_flops))

    @classmethod
    def from_config(
        cls, lms: LMSConfig, limit_bytes: int | None, allow_offload: bool, strategy: str | None = None
    ) -> LMSOptions:
        """The options of the ``lms`` config group (``strategy`` overrides ``lms.name``); without
        offload (a CPU: host memory is the device) recomputation is priced by this CPU's
        step-time model, not by ``lms.device_tflops``."""
        time_model = None
        if not allow_offload:
            from brats_seg.lms.planner.step_time import cpu_time_model

            time_model = cpu_time_model()
        return cls(
            limit_bytes=limit_bytes,
            strategy=strategy or lms.name,
            size_bytes=int(lms.size),
            prefetch=int(lms.prefetch),
            host_bandwidth_bps=lms.host_bandwidth_gbps * 1e9,
            device_flops=lms.device_tflops * 1e12,
            allow_offload=allow_offload,
            time_model=time_model,
        )
