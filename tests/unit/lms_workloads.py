"""Workloads and shorthands shared by the LMS planner tests (pure Python, no TensorFlow)."""

from __future__ import annotations

import math

from brats_seg.config import ModelConfig as _ModelConfig
from brats_seg.lms.planner.cost import NetworkCost, compute_network_cost
from brats_seg.lms.planner.memory_model import MemoryModel
from brats_seg.lms.planner.search import compare_strategies, estimate_peak, planning_budget
from brats_seg.lms.planner.timeline import Timeline
from brats_seg.lms.planner.workload import LMSOptions, Workload

FULL = (192, 224, 160)
HALF = (96, 112, 80)
GB = 10**9


def ModelConfig(**kw) -> _ModelConfig:  # noqa: N802 - the planner needs resolved outputs (WT, TC, ET)
    return _ModelConfig(**{"out_channels": 3, **kw})


def network(
    cfg: _ModelConfig, shape, batch: int = 1, policy: str = "float32", memory_model: MemoryModel | None = None
) -> NetworkCost:
    """The cost tables of ``cfg`` at ``shape`` (Adam)."""
    return compute_network_cost(Workload(cfg, shape, batch, policy), memory_model)


def estimate(
    cfg: _ModelConfig,
    shape,
    batch: int = 1,
    policy: str = "float32",
    strategy: str = "off",
    memory_model: MemoryModel | None = None,
    **options,
) -> Timeline:
    """The timeline of a fixed strategy (``options``: other LMSOptions fields)."""
    return estimate_peak(Workload(cfg, shape, batch, policy), LMSOptions(strategy=strategy, **options), memory_model)


def limit_for(budget: int, memory_model: MemoryModel | None = None) -> int:
    """The smallest ``lms.limit`` whose planning budget (the limit less the model's planning
    margin, :func:`brats_seg.lms.planner.search.planning_budget`) holds a peak of ``budget`` bytes."""
    limit = math.ceil(budget / (1.0 - (memory_model or MemoryModel()).planning_margin))
    while planning_budget(limit, memory_model or MemoryModel()) < budget:  # rounding
        limit += 1
    return limit


def peaks(cfg: _ModelConfig, shape, batch: int = 1, policy: str = "float32", **options) -> dict[str, int]:
    """Predicted peak per strategy (auto only when it fits)."""
    out = compare_strategies(Workload(cfg, shape, batch, policy), LMSOptions(limit_bytes=10**15, **options))
    return {k: v["predicted_peak_bytes"] for k, v in out.items()}
