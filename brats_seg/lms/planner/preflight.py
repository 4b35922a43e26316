"""Pre-flight memory check: plan the run before any model is built.

Used by ``train.py`` (a run predicted not to fit fails with the numbers and the fix) and by
``scripts/plan_memory.py``. Pure Python: no TensorFlow import, so it runs in a second.
"""

from __future__ import annotations

import logging
import shutil

from brats_seg.config import TrainConfig
from brats_seg.data.labels import resolve_model_outputs
from brats_seg.lms.planner.capacity import Capacity, find_capacity, find_width
from brats_seg.lms.planner.memory_model import memory_model_for
from brats_seg.lms.planner.plan import Plan
from brats_seg.lms.planner.search import compare_strategies, plan_lms_from_config, planning_budget
from brats_seg.lms.planner.units import parse_limit
from brats_seg.lms.planner.workload import LMSOptions, Workload

__all__ = ["capacity_run", "compare_run", "plan_run", "planning_device"]

log = logging.getLogger(__name__)


def planning_device(cfg: TrainConfig) -> str:
    """``GPU`` or ``CPU``: the device the run's memory must fit on (no TensorFlow import)."""
    if cfg.backend.name in ("gpu", "gpu_lms"):
        return "GPU"
    if cfg.backend.name == "cpu_onednn":
        return "CPU"
    return "GPU" if shutil.which("nvidia-smi") else "CPU"


def plan_run(cfg: TrainConfig, device: str | None = None, strategy: str | None = None) -> Plan:
    """The plan for ``cfg`` (``lms.name`` unless ``strategy`` is given) against ``lms.limit``.

    On CPU the budget is a share of the RAM available now and offload is not allowed (a
    CPU-only run has no separate device memory to offload from).

    Raises:
        PlanDoesNotFitError: with the smallest predicted peak and what would fit.
        BackendError: a precision the device cannot train in (bf16 on a CPU without it).
    """
    from brats_seg.backend import check_precision, device_memory_bytes

    device = device or planning_device(cfg)
    check_precision(cfg.backend.precision, device)
    resolve_model_outputs(cfg)
    if strategy is not None and strategy != cfg.lms.name:
        cfg = _with_strategy(cfg, strategy)
    return plan_lms_from_config(cfg, device_memory_bytes(device, cfg.backend.gpu_memory_limit_mb),
                                allow_offload=device == "GPU", memory_model=memory_model_for(device))


def compare_run(cfg: TrainConfig, device: str | None = None) -> tuple[int, int, dict]:
    """``(limit_bytes, budget_bytes, {strategy: prediction})`` for off/recompute/offload/auto
    (``budget_bytes``: what a plan may predict, :func:`~brats_seg.lms.planner.search.planning_budget`);
    never raises for fit."""
    from brats_seg.backend import check_precision, device_memory_bytes

    device = device or planning_device(cfg)
    check_precision(cfg.backend.precision, device)
    resolve_model_outputs(cfg)
    limit = parse_limit(cfg.lms.limit, device_memory_bytes(device, cfg.backend.gpu_memory_limit_mb))
    # All four strategies are compared, whatever lms= names (offload reports why not on CPU).
    options = LMSOptions.from_config(cfg.lms, limit, allow_offload=device == "GPU", strategy="auto")
    mm = memory_model_for(device)
    return limit, planning_budget(limit, mm), compare_strategies(Workload.from_config(cfg), options, mm)


def capacity_run(cfg: TrainConfig, find: str, device: str | None = None) -> tuple[int, int, dict[str, Capacity]]:
    """``(limit_bytes, budget_bytes, {strategy: Capacity})``: the largest input (``find=max_input``, of the
    network input's proportions), batch (``max_batch``) or patch and cube (``max_patch``) each strategy
    fits in ``lms.limit``; for ``max_width``, ``(rows, chosen)`` of
    :func:`~brats_seg.lms.planner.capacity.find_width` in its place.

    ``max_patch`` searches within the network input of ``cfg`` (:func:`~brats_seg.config.network_input_shape`):
    pass ``cfg`` in patch mode at the largest patch ``resolution.shape`` allows
    (:func:`~brats_seg.lms.planner.capacity.largest_patch_allowed`), as ``scripts/plan_memory.py`` does,
    so the patches keep the grid's proportions and stop at the grid, not at a configured patch."""
    from brats_seg.backend import check_precision, device_memory_bytes

    device = device or planning_device(cfg)
    check_precision(cfg.backend.precision, device)
    limit = parse_limit(cfg.lms.limit, device_memory_bytes(device, cfg.backend.gpu_memory_limit_mb))
    options = LMSOptions.from_config(cfg.lms, limit, allow_offload=device == "GPU", strategy="auto")
    mm = memory_model_for(device)
    if find == "max_width":  # (rows, the widest width that fits)
        return limit, planning_budget(limit, mm), find_width(Workload.from_config(cfg), mm, options)
    grid = tuple(int(v) for v in cfg.resolution.shape)  # max_patch: the grid the patches are cut from
    return limit, planning_budget(limit, mm), find_capacity(find, Workload.from_config(cfg), mm, options, grid_shape=grid)


def _with_strategy(cfg: TrainConfig, strategy: str) -> TrainConfig:
    import copy

    out = copy.deepcopy(cfg)
    out.lms.name = strategy
    return out
