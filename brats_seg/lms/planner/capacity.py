"""What fits a budget: the largest input shape or batch a strategy trains within ``lms.limit``.

``scripts/plan_memory.py plan.find=max_input|max_batch`` answers it per strategy: ``off``
(everything kept), ``recompute`` and ``auto`` (and ``offload`` on a GPU). The ratio of the
largest input under ``auto`` to the one under ``off`` is the figure LMS is quoted by
("5x resolution"). ``auto`` fits whenever its last resort fits: the greedy of
:func:`brats_seg.lms.planner.search.auto_config` ends, with no move left, at the ``recompute``
strategy on a CPU and ``offload`` on a GPU, so ``auto`` can train what the cheapest fixed
strategy can.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from brats_seg.choices import check_choice
from brats_seg.lms.planner.memory_model import MemoryModel
from brats_seg.lms.planner.search import fits_with, largest_batch, largest_fitting, plan_lms
from brats_seg.lms.planner.workload import LMSOptions, Workload

__all__ = ["Capacity", "FINDS", "find_capacity", "input_shape_at", "largest_input"]

FINDS = ("max_input", "max_batch")
MAX_SCALE = 512  # the smallest axis is searched up to 512 x 2**depth voxels


@dataclass(frozen=True)
class Capacity:
    """The largest input (or batch) one strategy fits in the budget.

    Attributes:
        strategy: ``off`` | ``recompute`` | ``offload`` | ``auto``.
        input_shape: the spatial shape; None when not even the smallest one fits.
        batch_size: the batch.
        predicted_peak_bytes: the prediction at that size (0 when nothing fits).
    """

    strategy: str
    input_shape: tuple[int, int, int] | None
    batch_size: int
    predicted_peak_bytes: int

    @property
    def voxels(self) -> int:
        return math.prod(self.input_shape) if self.input_shape else 0

    def to_dict(self) -> dict:
        return {"strategy": self.strategy, "input_shape": list(self.input_shape) if self.input_shape else None,
                "batch_size": self.batch_size, "voxels": self.voxels,
                "predicted_peak_bytes": int(self.predicted_peak_bytes)}


def _strategies_for(strategy: str, allow_offload: bool) -> tuple[str, ...]:
    """The fixed strategies whose fit decides ``strategy``'s (auto: its last resort)."""
    if strategy == "auto":
        return ("offload",) if allow_offload else ("recompute",)
    return (strategy,)


def input_shape_at(aspect_shape: tuple[int, int, int], multiple: int, scale: int) -> tuple[int, int, int]:
    """The shape of ``aspect_shape``'s proportions whose smallest axis is ``scale * multiple``,
    every axis rounded to a multiple of ``multiple`` (``2**depth``)."""
    smallest = min(aspect_shape)
    return tuple(multiple * max(1, round(scale * s / smallest)) for s in aspect_shape)


def largest_input(workload: Workload, mm: MemoryModel, strategy: str, options: LMSOptions) -> Capacity:
    """The largest shape of ``workload.input_shape``'s proportions, divisible by ``2**depth``,
    that ``strategy`` trains at ``workload.batch_size`` within ``options.limit_bytes``.

    Memory grows with the input, so the smallest axis is searched by doubling, then bisection.
    """
    multiple = 2**workload.model_cfg.depth
    strategies = _strategies_for(strategy, options.allow_offload)

    def fits(scale: int) -> tuple[bool, int]:
        shape = input_shape_at(workload.input_shape, multiple, scale)
        return fits_with(workload.with_input(input_shape=shape), mm, strategies, options)

    scale, peak = largest_fitting(fits, MAX_SCALE)
    if not scale:
        return Capacity(strategy, None, workload.batch_size, 0)
    return Capacity(strategy, input_shape_at(workload.input_shape, multiple, scale), workload.batch_size, peak)


def find_capacity(find: str, workload: Workload, mm: MemoryModel, options: LMSOptions) -> dict[str, Capacity]:
    """``{strategy: Capacity}`` for ``off``, ``recompute``, (``offload`` on a GPU) and ``auto``.

    Args:
        find: ``max_input`` (batch fixed, shape grown) or ``max_batch`` (shape fixed).
        workload: the configured run; its shape gives the proportions, its batch the batch.
        mm: the memory model of the device.
        options: the budget (``limit_bytes``) and whether offload is possible.

    Raises:
        ValueError: an unknown ``find``, or no budget.
    """
    check_choice(find, FINDS, "plan.find", hint="Leave it empty for a plan.")
    if options.limit_bytes is None:
        raise ValueError("plan.find needs a budget: set lms.limit (bytes, e.g. 8GB, or a share of memory, e.g. 0.9).")
    strategies = ("off", "recompute", "offload", "auto") if options.allow_offload else ("off", "recompute", "auto")
    out = {}
    for strategy in strategies:
        if find == "max_input":
            out[strategy] = largest_input(workload, mm, strategy, options)
        else:
            batch, peak = largest_batch(workload, mm, _strategies_for(strategy, options.allow_offload), options)
            out[strategy] = Capacity(strategy, tuple(workload.input_shape) if batch else None, batch, peak)
        found = out[strategy]
        if strategy == "auto" and found.input_shape:  # the plan auto makes there, not its last resort's peak
            plan = plan_lms(workload.with_input(found.input_shape, found.batch_size), options, mm)
            out[strategy] = dataclasses.replace(found, predicted_peak_bytes=plan.predicted_peak_bytes)
    return out
