"""What fits a budget: the largest input shape, batch or patch a strategy trains within ``lms.limit``.

``scripts/plan_memory.py plan.find=max_input|max_batch|max_patch`` answers it per strategy: ``off``
(everything kept), ``recompute`` and ``auto`` (and ``offload`` on a GPU). The ratio of the
largest input under ``auto`` to the one under ``off`` is the figure LMS is quoted by
("5x resolution"). ``auto`` fits whenever its last resort fits: the greedy of
:func:`brats_seg.lms.planner.search.auto_config` ends, with no move left, at the ``recompute``
strategy on a CPU and ``offload`` on a GPU, so ``auto`` can train what the cheapest fixed
strategy can.

``max_width`` asks the other question a fixed input raises: how wide a U-Net (``model.base_filters``)
trains within the budget, and how long its step takes. Each candidate width is planned with
``auto``; the answer is the widest that fits. On a CPU the step-time model
(:mod:`~brats_seg.lms.planner.step_time`) prices each, and a width whose step is predicted no faster
than a wider one that also fits is marked: it buys nothing (oneDNN pads channels to its vector).

``max_patch`` is the same search for patch mode (``trainer.patch_size``): patches keep the grid's
proportions, each side a multiple of ``2**depth`` and at most the grid on its axis (an axis that
reaches the grid stays there while the others grow), so the whole grid is the largest answer, and
an answer equal to it means patches are not needed for memory. The largest cube ``[s, s, s]``
(clipped to the grid on a short axis) is found alongside, since patches are quoted as cubes (128³).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from brats_seg.choices import check_choice, choice_values
from brats_seg.config import LMSStrategy
from brats_seg.lms.planner.memory_model import MemoryModel
from brats_seg.lms.planner.search import fits_with, largest_batch, largest_fitting, plan_lms, solve_plan
from brats_seg.lms.planner.workload import LMSOptions, Workload

__all__ = [
    "FINDS",
    "WIDTHS",
    "Capacity",
    "WidthRow",
    "cube_shape_at",
    "find_capacity",
    "find_width",
    "input_shape_at",
    "largest_input",
    "largest_patch",
    "largest_patch_allowed",
    "patch_shape_at",
]

Shape = tuple[int, int, int]  # spatial (x, y, z), voxels

FINDS = ("max_input", "max_batch", "max_patch", "max_width")
WIDTHS = (4, 6, 8, 10, 12, 16, 20, 24, 32)  # model.base_filters that plan.find=max_width tries
MAX_SCALE = 512  # the smallest axis is searched up to 512 x 2**depth voxels


@dataclass(frozen=True)
class Capacity:
    """The largest input (or batch, or patch) one strategy fits in the budget.

    Attributes:
        strategy: ``off`` | ``recompute`` | ``offload`` | ``auto``.
        input_shape: the spatial shape (``max_patch``: the patch); None when not even the smallest one fits.
        batch_size: the batch.
        predicted_peak_bytes: the prediction at that size (0 when nothing fits).
        cube_shape: ``max_patch`` only: the largest cube ``[s, s, s]`` that fits, clipped to the grid on
            an axis shorter than ``s``; None otherwise, or when not even ``2**depth`` per side fits.
    """

    strategy: str
    input_shape: Shape | None
    batch_size: int
    predicted_peak_bytes: int
    cube_shape: Shape | None = None

    @property
    def voxels(self) -> int:
        return math.prod(self.input_shape) if self.input_shape else 0

    def to_dict(self) -> dict:
        return {
            "strategy": self.strategy,
            "input_shape": list(self.input_shape) if self.input_shape else None,
            "batch_size": self.batch_size,
            "voxels": self.voxels,
            "predicted_peak_bytes": int(self.predicted_peak_bytes),
            "cube_shape": list(self.cube_shape) if self.cube_shape else None,
        }


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
    shape, peak = _largest_shape(
        workload, mm, strategy, options, lambda scale: input_shape_at(workload.input_shape, multiple, scale), MAX_SCALE
    )
    return Capacity(strategy, shape, workload.batch_size, peak)


def largest_patch_allowed(grid_shape: Sequence[int], multiple: int) -> Shape:
    """The largest patch of ``grid_shape``: each axis rounded down to a multiple of ``multiple``
    (``2**depth``), the rule of :func:`brats_seg.checks.check_patch_config`.

    Raises:
        ValueError: an axis shorter than ``multiple`` (no patch fits in it).
    """
    grid = tuple(int(s) for s in grid_shape)
    if len(grid) != 3 or min(grid) < multiple:
        raise ValueError(
            f"resolution.shape={list(grid)} has no patch of sides that are multiples of "
            f"{multiple} (2**model.depth): every axis must be at least {multiple}; lower model.depth."
        )
    x, y, z = (multiple * (s // multiple) for s in grid)
    return x, y, z


def patch_shape_at(grid_shape: Sequence[int], multiple: int, scale: int) -> Shape:
    """:func:`input_shape_at` of ``grid_shape``'s proportions, each axis capped at the largest
    patch the grid allows on it (:func:`largest_patch_allowed`)."""
    shape = input_shape_at(tuple(grid_shape), multiple, scale)
    x, y, z = (min(s, c) for s, c in zip(shape, largest_patch_allowed(grid_shape, multiple)))
    return x, y, z


def cube_shape_at(grid_shape: Sequence[int], multiple: int, scale: int) -> Shape:
    """The cube of side ``scale * multiple``, clipped on each axis to the largest patch the grid allows."""
    x, y, z = (min(scale * multiple, c) for c in largest_patch_allowed(grid_shape, multiple))
    return x, y, z


def largest_patch(
    workload: Workload, mm: MemoryModel, strategy: str, options: LMSOptions, grid_shape: Sequence[int] | None = None
) -> Capacity:
    """The largest patch of ``grid_shape``'s proportions (:func:`patch_shape_at`) and the largest
    cube (:func:`cube_shape_at`) that ``strategy`` trains at ``workload.batch_size`` within
    ``options.limit_bytes``; the peak reported is the patch's.

    Args:
        workload: the run; its input is replaced by each patch tried.
        mm: the memory model of the device.
        strategy: ``off`` | ``recompute`` | ``offload`` | ``auto``.
        options: the budget and whether offload is possible.
        grid_shape: the resolution grid (``resolution.shape``); default ``workload.input_shape``.
    """
    grid = tuple(grid_shape or workload.input_shape)
    multiple = 2**workload.model_cfg.depth
    whole = largest_patch_allowed(grid, multiple)

    def patch_at(scale: int) -> Shape:
        return patch_shape_at(grid, multiple, scale)

    def cube_at(scale: int) -> Shape:
        return cube_shape_at(grid, multiple, scale)

    # Past the scale at which every axis is capped the patch is the whole grid: searched no further.
    whole_scale = next(scale for scale in itertools.count(1) if patch_at(scale) == whole)
    patch, peak = _largest_shape(workload, mm, strategy, options, patch_at, whole_scale)
    cube, _ = _largest_shape(workload, mm, strategy, options, cube_at, max(whole) // multiple)
    return Capacity(strategy, patch, workload.batch_size, peak, cube_shape=cube)


def _largest_shape(
    workload: Workload,
    mm: MemoryModel,
    strategy: str,
    options: LMSOptions,
    shape_at: Callable[[int], Shape],
    max_scale: int,
) -> tuple[Shape | None, int]:
    """``(shape_at(scale), peak)`` at the largest ``scale`` in ``1..max_scale`` that ``strategy``
    fits (``shape_at`` growing with ``scale``: doubling, then bisection); ``(None, 0)`` if none."""
    strategies = _strategies_for(strategy, options.allow_offload)

    def fits(scale: int) -> tuple[bool, int]:
        return fits_with(workload.with_input(input_shape=shape_at(scale)), mm, strategies, options)

    scale, peak = largest_fitting(fits, max_scale)
    return (shape_at(scale), peak) if scale else (None, 0)


def find_capacity(
    find: str, workload: Workload, mm: MemoryModel, options: LMSOptions, grid_shape: Sequence[int] | None = None
) -> dict[str, Capacity]:
    """``{strategy: Capacity}`` for ``off``, ``recompute``, (``offload`` on a GPU) and ``auto``.

    Args:
        find: ``max_input`` (batch fixed, shape grown), ``max_batch`` (shape fixed) or
            ``max_patch`` (batch fixed, a patch of the grid grown up to the grid, and the largest cube).
        workload: the configured run; its shape gives the proportions, its batch the batch.
        mm: the memory model of the device.
        options: the budget (``limit_bytes``) and whether offload is possible.
        grid_shape: ``max_patch`` only: the resolution grid the patches are cut from; default
            ``workload.input_shape`` (so give a workload of the whole grid, not of a configured patch).

    Raises:
        ValueError: an unknown ``find``, or no budget.
    """
    check_choice(find, FINDS, "plan.find", hint="Leave it empty for a plan.")
    if options.limit_bytes is None:
        raise ValueError("plan.find needs a budget: set lms.limit (bytes, e.g. 8GB, or a share of memory, e.g. 0.9).")
    strategies = [s for s in choice_values(LMSStrategy) if options.allow_offload or s != "offload"]
    out = {}
    for strategy in strategies:
        if find == "max_input":
            out[strategy] = largest_input(workload, mm, strategy, options)
        elif find == "max_patch":
            out[strategy] = largest_patch(workload, mm, strategy, options, grid_shape)
        else:
            batch, peak = largest_batch(workload, mm, _strategies_for(strategy, options.allow_offload), options)
            out[strategy] = Capacity(strategy, tuple(workload.input_shape) if batch else None, batch, peak)
        found = out[strategy]
        if strategy == "auto" and found.input_shape:  # the plan auto makes there, not its last resort's peak
            plan = plan_lms(workload.with_input(found.input_shape, found.batch_size), options, mm)
            out[strategy] = dataclasses.replace(found, predicted_peak_bytes=plan.predicted_peak_bytes)
    return out


@dataclass(frozen=True)
class WidthRow:
    """One width of :func:`find_width`: ``auto``'s plan for it.

    Attributes:
        base_filters: the width.
        fits: the plan fits the budget.
        predicted_peak_bytes: its predicted peak (the smallest ``auto`` reaches when it does not fit).
        predicted_step_s: on a CPU, its predicted step time, recomputation included; None on a GPU.
        recomputed_flops: FLOPs recomputed a step.
        slower_than_wider: it fits, and a wider width that fits is predicted no slower.
    """

    base_filters: int
    fits: bool
    predicted_peak_bytes: int
    predicted_step_s: float | None
    recomputed_flops: float
    slower_than_wider: bool = False

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def find_width(
    workload: Workload, mm: MemoryModel, options: LMSOptions, widths: Sequence[int] = WIDTHS
) -> tuple[list[WidthRow], int | None]:
    """``(rows, chosen)``: ``auto``'s plan at each width in ``widths`` (those the model accepts: group
    norm needs its groups to divide them), and the widest that fits (None when none does).

    Raises:
        ValueError: no budget.
    """
    if options.limit_bytes is None:
        raise ValueError("plan.find needs a budget: set lms.limit (bytes, e.g. 8GB, or a share of memory, e.g. 0.9).")
    options = dataclasses.replace(options, strategy="auto")
    rows = []
    for width in sorted(set(widths)):
        try:
            model_cfg = dataclasses.replace(workload.model_cfg, base_filters=int(width))
            plan = solve_plan(dataclasses.replace(workload, model_cfg=model_cfg), options, mm)
        except ValueError:  # a width this model cannot have (e.g. group norm's groups)
            continue
        rows.append(
            WidthRow(
                int(width),
                bool(plan.fits),
                int(plan.predicted_peak_bytes),
                plan.predicted_step_s,
                plan.recomputed_flops,
            )
        )
    fitting = [r for r in rows if r.fits]
    for k, row in enumerate(rows):
        if (
            row.fits
            and row.predicted_step_s is not None
            and any(
                w.base_filters > row.base_filters
                and w.predicted_step_s is not None
                and w.predicted_step_s <= row.predicted_step_s
                for w in fitting
            )
        ):
            rows[k] = dataclasses.replace(row, slower_than_wider=True)
    return rows, (max(r.base_filters for r in fitting) if fitting else None)
