"""Pre-flight memory check: plan the run before any model is built.

Used by training (a run predicted not to fit fails with the numbers and the fix) and by
``scripts/plan_memory.py``, each with a config :func:`brats_seg.resolve.resolve_run` resolved
(its model outputs set) and the device it decided. Pure Python: no TensorFlow import, so it
runs in a second.
"""

from __future__ import annotations

import logging

from brats_seg.config import TrainConfig
from brats_seg.lms.planner.capacity import Capacity, find_capacity, find_width
from brats_seg.lms.planner.memory_model import memory_model_for
from brats_seg.lms.planner.plan import Plan
from brats_seg.lms.planner.search import compare_strategies, plan_lms_from_config, planning_budget
from brats_seg.lms.planner.units import parse_limit
from brats_seg.lms.planner.workload import LMSOptions, Workload

__all__ = ["capacity_run", "compare_run", "lms_strategy", "plan_run"]

log = logging.getLogger(__name__)


def lms_strategy(lms: str, backend: str, device: str) -> tuple[str, str]:
    """``(strategy, reason)``: the LMS strategy a run plans with, the one rule (read by
    :func:`brats_seg.resolve.resolve_run`, which every planner's entry point goes through, and by
    the advice after running out of memory): ``lms=`` as given, except that ``backend=gpu_lms``
    with ``lms=off`` plans ``auto``.

    Raises:
        ValueError: ``lms=offload`` on a CPU-only run.
    """
    lms, backend = str(getattr(lms, "value", lms)), str(getattr(backend, "value", backend))
    if device == "CPU" and lms == "offload":
        raise ValueError(
            "lms=offload needs a GPU: a CPU-only run has no separate device memory to offload from. "
            "Use lms=recompute (or lms=auto) to fit a RAM budget on CPU."
        )
    if backend == "gpu_lms" and lms == "off":
        return "auto", "backend=gpu_lms with lms=off: planning with lms=auto"
    return lms, f"lms={lms} as configured"


def _checked(cfg: TrainConfig, device: str) -> str:
    """``device`` once ``cfg`` is known to be resolved (its precision was checked against the
    device when the run was resolved: :func:`brats_seg.backend.decide_backend`).

    Raises:
        ValueError: ``model.out_channels`` is unresolved (0): the run was not resolved first.
    """
    if not cfg.model.out_channels:
        raise ValueError(
            "model.out_channels=0 is unresolved: plan the config brats_seg.resolve.resolve_run returns "
            "(ResolvedRun.config), whose outputs follow data.layout."
        )
    return device


def plan_run(cfg: TrainConfig, device: str, strategy: str | None = None) -> Plan:
    """The plan for ``cfg`` (``lms.name`` unless ``strategy`` is given) against ``lms.limit``.

    On CPU the budget is a share of the RAM available now and offload is not allowed (a
    CPU-only run has no separate device memory to offload from).

    Raises:
        PlanDoesNotFitError: with the smallest predicted peak and what would fit.
    """
    from brats_seg.backend import device_memory_bytes

    device = _checked(cfg, device)
    if strategy is not None and strategy != cfg.lms.name:
        cfg = _with_strategy(cfg, strategy)
    return plan_lms_from_config(
        cfg,
        device_memory_bytes(device, cfg.backend.gpu_memory_limit_mb),
        allow_offload=device == "GPU",
        memory_model=memory_model_for(device),
    )


def compare_run(cfg: TrainConfig, device: str) -> tuple[int, int, dict]:
    """``(limit_bytes, budget_bytes, {strategy: prediction})`` for off/recompute/offload/auto
    (``budget_bytes``: what a plan may predict, :func:`~brats_seg.lms.planner.search.planning_budget`);
    never raises for fit."""
    from brats_seg.backend import device_memory_bytes

    device = _checked(cfg, device)
    limit = parse_limit(cfg.lms.limit, device_memory_bytes(device, cfg.backend.gpu_memory_limit_mb))
    # All four strategies are compared, whatever lms= names (offload reports why not on CPU).
    options = LMSOptions.from_config(cfg.lms, limit, allow_offload=device == "GPU", strategy="auto")
    mm = memory_model_for(device)
    return limit, planning_budget(limit, mm), compare_strategies(Workload.from_config(cfg), options, mm)


def capacity_run(cfg: TrainConfig, find: str, device: str) -> tuple[int, int, dict[str, Capacity]]:
    """``(limit_bytes, budget_bytes, {strategy: Capacity})``: the largest input (``find=max_input``, of the
    network input's proportions), batch (``max_batch``) or patch and cube (``max_patch``) each strategy
    fits in ``lms.limit``; for ``max_width``, ``(rows, chosen)`` of
    :func:`~brats_seg.lms.planner.capacity.find_width` in its place.

    ``max_patch`` searches within the network input of ``cfg`` (:func:`~brats_seg.config.network_input_shape`):
    pass ``cfg`` in patch mode at the largest patch ``resolution.shape`` allows
    (:func:`~brats_seg.lms.planner.capacity.largest_patch_allowed`), as ``scripts/plan_memory.py`` does,
    so the patches keep the grid's proportions and stop at the grid, not at a configured patch."""
    from brats_seg.backend import device_memory_bytes

    device = _checked(cfg, device)
    limit = parse_limit(cfg.lms.limit, device_memory_bytes(device, cfg.backend.gpu_memory_limit_mb))
    options = LMSOptions.from_config(cfg.lms, limit, allow_offload=device == "GPU", strategy="auto")
    mm = memory_model_for(device)
    if find == "max_width":  # (rows, the widest width that fits)
        return limit, planning_budget(limit, mm), find_width(Workload.from_config(cfg), mm, options)
    grid = tuple(int(v) for v in cfg.resolution.shape)  # max_patch: the grid the patches are cut from
    return (
        limit,
        planning_budget(limit, mm),
        find_capacity(find, Workload.from_config(cfg), mm, options, grid_shape=grid),
    )


def _with_strategy(cfg: TrainConfig, strategy: str) -> TrainConfig:
    import copy

    out = copy.deepcopy(cfg)
    out.lms.name = strategy
    return out
