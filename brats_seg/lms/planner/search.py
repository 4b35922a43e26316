"""LMS planning: per-block keep | recompute | offload so a training step fits a budget.

:func:`plan_lms` solves the configured strategy: ``off`` / ``recompute`` / ``offload``
(:func:`fixed_config`) or ``auto`` (:func:`auto_config`: greedy by peak bytes saved per
overhead second, then a pass that undoes every move not needed to fit), and compares all
four (:func:`compare_strategies`). When the plan does not fit, it searches what would (the
largest batch, the largest standard resolution) for :class:`PlanDoesNotFitError`.
:func:`estimate_peak` predicts a fixed strategy without a budget.

The planner is pure Python, no TensorFlow or Keras import, so a plan can be made (and
printed, and checked against a budget) before TensorFlow is configured or imported. Its
modules: the U-Net (:mod:`brats_seg.model.topology`), the coefficients
(:mod:`~brats_seg.lms.planner.memory_model`), the cost tables (:mod:`~brats_seg.lms.planner.layer_cost`,
:mod:`~brats_seg.lms.planner.cost`), the timeline (:mod:`~brats_seg.lms.planner.timeline`), the price of
a configuration (:mod:`~brats_seg.lms.planner.accounting`), this search, the plan
(:mod:`~brats_seg.lms.planner.plan`) and byte units (:mod:`~brats_seg.lms.planner.units`). How the
coefficients were calibrated: ``docs/lms_calibration.md``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any

from brats_seg.config import STANDARD_RESOLUTIONS as CONFIG_RESOLUTIONS
from brats_seg.config import TrainConfig
from brats_seg.files import format_bytes
from brats_seg.lms.planner.accounting import block_row, plan_overhead
from brats_seg.lms.planner.cost import NetworkCost, compute_network_cost
from brats_seg.lms.planner.memory_model import MemoryModel
from brats_seg.lms.planner.plan import Plan, PlanDoesNotFitError
from brats_seg.lms.planner.timeline import Timeline, offloadable, simulate
from brats_seg.lms.planner.units import format_gb, parse_limit
from brats_seg.lms.planner.workload import FIXED_STRATEGIES, LMSOptions, Workload

__all__ = [
    "STANDARD_RESOLUTIONS",
    "auto_config",
    "compare_strategies",
    "estimate_peak",
    "fits_with",
    "fixed_config",
    "largest_batch",
    "largest_fitting",
    "largest_resolution",
    "plan_lms",
    "plan_lms_from_config",
    "planning_budget",
]

logger = logging.getLogger(__name__)

# The resolutions of configs/resolution, smallest first (name, (x, y, z)): the config's table.
STANDARD_RESOLUTIONS = tuple((name, shape) for name, _, shape in reversed(CONFIG_RESOLUTIONS))


def planning_budget(limit_bytes: int, memory_model: MemoryModel) -> int:
    """The largest peak a plan may predict under ``limit_bytes``: the limit less the
    preset's :attr:`~brats_seg.lms.planner.memory_model.MemoryModel.planning_margin` (room for the
    model's own under-prediction, so that the measured peak stays under the limit)."""
    return int(limit_bytes * (1.0 - memory_model.planning_margin))


def plan_lms(workload: Workload, options: LMSOptions, memory_model: MemoryModel | None = None) -> Plan:
    """Decide keep | recompute | offload per block so one training step fits ``options.limit_bytes``
    (its predicted peak at most :func:`planning_budget`).

    Args:
        workload: model config, input shape, batch, dtype policy, optimizer.
        options: the budget, the strategy (``off`` / ``recompute`` / ``offload`` /
            ``auto``) and how transfers and recomputation are priced.
        memory_model: coefficients; default :class:`MemoryModel()`.

    Returns:
        The :class:`Plan`, with ``strategies`` filled by the comparison of all four.

    Raises:
        PlanDoesNotFitError: the strategy's predicted peak exceeds the limit; the message
            gives the smallest peak, the largest batch and resolution that fit.
        ValueError: no ``options.limit_bytes``.
    """
    mm = memory_model or MemoryModel()
    net, inputs = _prepare(workload, options, mm)
    plan = _solve(net, options.strategy, options, inputs)
    plan.strategies = _compare(net, options, inputs, auto_plan=plan if options.strategy == "auto" else None)
    if not plan.fits:
        fixed = _fixed_strategies(options.allow_offload)
        raise PlanDoesNotFitError.for_plan(
            plan,
            workload,
            fixed,
            largest_batch(workload, mm, fixed, options),
            largest_resolution(workload, mm, fixed, options),
        )
    if workload.model_cfg.norm == "batch" and options.strategy != "off":
        logger.warning(
            "model.norm=batch: blocks with BatchNormalization are always kept (recomputing them would "
            "update the moving statistics twice), so LMS can only act on the head; use "
            "model.norm=instance or group to let it act on every block."
        )
    logger.info(
        "LMS plan %s: predicted peak %s at %s (budget %s of limit %s), recompute %.1f GFLOP, move %s per step",
        options.strategy,
        format_gb(plan.predicted_peak_bytes),
        plan.peak_at,
        format_gb(plan.budget_bytes),
        format_gb(options.limit_bytes),
        plan.recomputed_flops / 1e9,
        format_bytes(plan.moved_bytes),
    )
    return plan


def solve_plan(workload: Workload, options: LMSOptions, memory_model: MemoryModel | None = None) -> Plan:
    """The plan of ``options.strategy`` whether or not it fits (``plan.fits`` says), without the
    comparison, the log line or the error of :func:`plan_lms`: for searches over many workloads."""
    net, inputs = _prepare(workload, options, memory_model or MemoryModel())
    return _solve(net, options.strategy, options, inputs)


def compare_strategies(
    workload: Workload, options: LMSOptions, memory_model: MemoryModel | None = None
) -> dict[str, Any]:
    """Predictions of ``off``, ``recompute``, ``offload`` and ``auto`` against ``options.limit_bytes``
    (``options.strategy`` is not used); never raises for fit.

    Returns:
        ``{strategy: {"predicted_peak_bytes", "recomputed_flops", "moved_bytes",
        "overhead_s", "peak_at", "fits"}}``; ``auto`` (when nothing fits) and ``offload``
        (when not allowed) have None values and a ``reason``.
    """
    net, inputs = _prepare(workload, options, memory_model or MemoryModel())
    return _compare(net, options, inputs)


def estimate_peak(workload: Workload, options: LMSOptions, memory_model: MemoryModel | None = None) -> Timeline:
    """The timeline of the fixed strategy ``options.strategy`` (``off``/``recompute``/``offload``).

    No budget is involved (``options.limit_bytes`` is not used); used by the benchmark and
    calibration, ``timeline.peak_bytes`` is the prediction.
    """
    if options.strategy not in FIXED_STRATEGIES:
        raise ValueError(f"estimate_peak takes a fixed strategy (off, recompute, offload), got {options.strategy!r}.")
    net = compute_network_cost(workload, memory_model)
    policies, skips = fixed_config(net, options.strategy, options)
    return simulate(net, policies, skips, options.size_bytes, options.prefetch)


def plan_lms_from_config(
    cfg: TrainConfig,
    device_bytes: int,
    allow_offload: bool,
    optimizer: str = "adam",
    memory_model: MemoryModel | None = None,
) -> Plan:
    """:func:`plan_lms` from the composed config (``lms``, ``model``, ``resolution``, ``trainer``, ``backend``).

    Args:
        cfg: the train config.
        device_bytes: device memory (RAM on CPU), for fractional ``lms.limit``.
        allow_offload: True on a GPU, False on CPU.
        optimizer: the trainer's optimizer (the config has no field for it; Adam is used).
        memory_model: coefficients; default :class:`MemoryModel()`.
    """
    options = LMSOptions.from_config(cfg.lms, parse_limit(cfg.lms.limit, device_bytes), allow_offload)
    return plan_lms(Workload.from_config(cfg, optimizer), options, memory_model)


# ---------------------------------------------------------------------------------------
# Per-block configurations
# ---------------------------------------------------------------------------------------


def fixed_config(net: NetworkCost, strategy: str, options: LMSOptions) -> tuple[list[str], list[bool]]:
    """Policies and skip flags of a fixed strategy (``off``/``recompute``/``offload``)."""
    n = len(net.blocks)
    if strategy == "off":
        return ["keep"] * n, [False] * n
    # Blocks that cannot be recomputed (batch norm) are kept by every strategy.
    if strategy == "recompute":
        return ["recompute" if blk.recomputable else "keep" for blk in net.blocks], [False] * n
    # offload: every block whose input can move goes to the host, and every skip.
    policies = [
        "keep" if not blk.recomputable else "offload" if can_offload(net, i, options) else "recompute"
        for i, blk in enumerate(net.blocks)
    ]
    skips = [can_offload_skip(net, i, options) for i in range(n)]
    return policies, skips


def can_offload(net: NetworkCost, i: int, options: LMSOptions) -> bool:
    """Block ``i`` can be offloaded: recomputable, with an input that may go to the host."""
    blk = net.blocks[i]
    return blk.recomputable and any(offloadable(net, t, options.size_bytes) for t in blk.inputs)


def can_offload_skip(net: NetworkCost, i: int, options: LMSOptions) -> bool:
    """``dec{l}``'s skip can wait on the host (its producer, not kept, does not pin it)."""
    skip = net.blocks[i].skip_input
    return (
        skip is not None and offloadable(net, skip, options.size_bytes) and net.blocks[net.producer[skip]].recomputable
    )


def auto_config(net: NetworkCost, options: LMSOptions) -> tuple[list[str], list[bool]]:
    """Greedy: from all-keep, apply the move with the most peak bytes saved per overhead
    second until the plan fits; then undo every move the fit does not need.

    Moves only ever go keep -> recompute -> offload and skip on-device -> host, and the
    loop stops only when the plan fits or no move is left; the plan with no move left
    is exactly the ``offload`` strategy (``recompute`` without offload; blocks that are
    not recomputable stay ``keep`` in both). So if that
    fits, the greedy fits. (A move usually lowers every step, but not always: under
    ``keep`` a decoder does not save its skip and the mixed-precision head does not
    save its fp16 input, while ``recompute`` must keep them for its own backward step.
    The greedy therefore prices moves by the simulated peak, not by a bytes count.)
    """
    n, allow_offload = len(net.blocks), options.allow_offload
    limit_bytes = planning_budget(options.limit_bytes, net.memory_model)
    policies, skips = ["keep"] * n, [False] * n

    def sim(p: Sequence[str], s: Sequence[bool]) -> Timeline:
        return simulate(net, p, s, options.size_bytes, options.prefetch)

    current = sim(policies, skips)
    cost = plan_overhead(net, policies, skips, options)
    while current.peak_bytes > limit_bytes:
        moves: list[tuple[list[str], list[bool]]] = []
        for i in range(n):
            nexts = {"keep": ["recompute", "offload"], "recompute": ["offload"], "offload": []}[policies[i]]
            for new in nexts if net.blocks[i].recomputable else ():
                if new == "offload" and not (allow_offload and can_offload(net, i, options)):
                    continue
                moves.append((policies[:i] + [new] + policies[i + 1 :], skips))
            if allow_offload and not skips[i] and can_offload_skip(net, i, options):
                moves.append((policies, skips[:i] + [True] + skips[i + 1 :]))
        if not moves:
            break
        best_key, best = None, None
        for p, s in moves:
            t = sim(p, s)
            extra_s = max(plan_overhead(net, p, s, options) - cost, 1e-12)
            saved_peak = current.peak_bytes - t.peak_bytes
            saved_area = sum(current.total_bytes) - sum(t.total_bytes)  # progress when the peak cannot move yet
            key = (saved_peak > 0, saved_peak / extra_s, saved_area / extra_s)
            if best_key is None or key > best_key:
                best_key, best = key, (p, s, t)
        policies, skips, current = list(best[0]), list(best[1]), best[2]
        cost = plan_overhead(net, policies, skips, options)
    if current.peak_bytes > limit_bytes:
        return policies, skips

    # Undo moves the fit does not need, most expensive block first.
    changed = True
    while changed:
        changed = False
        order = sorted(range(n), key=lambda i: -block_row(net, i, policies[i], skips[i], options).overhead_s)
        for i in order:
            if skips[i]:
                s = skips[:i] + [False] + skips[i + 1 :]
                if sim(policies, s).peak_bytes <= limit_bytes:
                    skips, changed = s, True
            for cheaper in ("keep", "recompute"):
                if policies[i] == cheaper or (cheaper == "recompute" and policies[i] != "offload"):
                    continue
                p = policies[:i] + [cheaper] + policies[i + 1 :]
                if sim(p, skips).peak_bytes <= limit_bytes:
                    policies, changed = p, True
                    break
    return policies, skips


# ---------------------------------------------------------------------------------------
# What fits instead
# ---------------------------------------------------------------------------------------


def _fixed_strategies(allow_offload: bool) -> tuple[str, ...]:
    return FIXED_STRATEGIES if allow_offload else ("off", "recompute")


def fits_with(workload: Workload, mm: MemoryModel, strategies: Sequence[str], options: LMSOptions) -> tuple[bool, int]:
    """Whether any of the fixed ``strategies`` fits (:func:`planning_budget`), and the smallest of their peaks."""
    net = compute_network_cost(workload, mm)
    peak = min(
        simulate(net, *fixed_config(net, strategy, options), options.size_bytes, options.prefetch).peak_bytes
        for strategy in strategies
    )
    return peak <= planning_budget(options.limit_bytes, mm), peak


def largest_fitting(fits: Callable[[int], tuple[bool, int]], cap: int) -> tuple[int, int]:
    """The largest ``n`` in ``1..cap`` with ``fits(n)[0]``, and its ``fits(n)[1]`` (a peak),
    for ``fits`` monotone in ``n`` (doubling, then bisection); ``(0, 0)`` if 1 does not fit."""
    ok, peak = fits(1)
    if not ok:
        return 0, 0
    lo, lo_peak, hi = 1, peak, 2
    while hi <= cap:
        ok, peak = fits(hi)
        if not ok:
            break
        lo, lo_peak, hi = hi, peak, hi * 2
    hi = min(hi, cap + 1)
    while hi - lo > 1:  # lo fits, hi does not (or is past the cap)
        mid = (lo + hi) // 2
        ok, peak = fits(mid)
        lo, lo_peak, hi = (mid, peak, hi) if ok else (lo, lo_peak, mid)
    return lo, lo_peak


def largest_batch(
    workload: Workload, mm: MemoryModel, strategies: Sequence[str], options: LMSOptions, cap: int = 4096
) -> tuple[int, int]:
    """Largest batch (<= cap) at which one of the fixed ``strategies`` fits, and its peak;
    (0, 0) if batch 1 does not fit."""
    return largest_fitting(lambda batch: fits_with(workload.with_input(batch_size=batch), mm, strategies, options), cap)


def largest_resolution(
    workload: Workload, mm: MemoryModel, strategies: Sequence[str], options: LMSOptions, batch_size: int = 1
) -> tuple[tuple[str, tuple[int, int, int]], int] | None:
    """``((name, shape), peak)`` of the largest standard resolution (divisible by ``2**depth``)
    at which one of the fixed ``strategies`` fits at ``batch_size``, or None."""
    found = None
    for name, shape in STANDARD_RESOLUTIONS:
        if any(s % 2**workload.model_cfg.depth for s in shape):
            continue
        ok, peak = fits_with(workload.with_input(shape, batch_size), mm, strategies, options)
        if ok:
            found = (name, shape), peak
    return found


# ---------------------------------------------------------------------------------------
# Plans and their comparison
# ---------------------------------------------------------------------------------------


def _prepare(workload: Workload, options: LMSOptions, mm: MemoryModel) -> tuple[NetworkCost, dict[str, Any]]:
    """The cost tables and the ``Plan.inputs`` record; a budget is required."""
    if options.limit_bytes is None:
        raise ValueError("limit_bytes must be a positive number of bytes, got None; see parse_limit.")
    inputs = {
        "model": dataclasses.asdict(workload.model_cfg),
        "input_shape": [int(s) for s in workload.input_shape],
        "batch_size": workload.batch_size,
        "policy": workload.policy,
        "optimizer": workload.optimizer,
        "size_bytes": options.size_bytes,
        "prefetch": options.prefetch,
        "host_bandwidth_bps": options.host_bandwidth_bps,
        "device_flops": options.device_flops,
        "allow_offload": options.allow_offload,
        "memory_model": dataclasses.asdict(mm),
    }
    return compute_network_cost(workload, mm), inputs


def _make_plan(
    net: NetworkCost,
    strategy: str,
    policies: Sequence[str],
    skips: Sequence[bool],
    options: LMSOptions,
    inputs: dict[str, Any],
) -> Plan:
    timeline = simulate(net, policies, skips, options.size_bytes, options.prefetch)
    rows = [block_row(net, i, p, s, options) for i, (p, s) in enumerate(zip(policies, skips))]
    budget = planning_budget(options.limit_bytes, net.memory_model)
    return Plan(
        strategy=strategy,
        blocks=rows,
        predicted_peak_bytes=timeline.peak_bytes,
        peak_at=timeline.peak_at,
        limit_bytes=int(options.limit_bytes),
        fits=timeline.peak_bytes <= budget,
        budget_bytes=budget,
        peak_breakdown=timeline.breakdown(),
        inputs=inputs,
        timeline=list(zip(timeline.steps, timeline.total_bytes)),
        base_step_s=None if options.time_model is None else options.time_model.step_s(net),
        step_time_calibrated=options.time_model is None or options.time_model.calibrated,
        step_time_source="" if options.time_model is None else getattr(options.time_model, "source", ""),
    )


def _solve(net: NetworkCost, strategy: str, options: LMSOptions, inputs: dict[str, Any]) -> Plan:
    """The plan of one strategy, whether or not it fits."""
    if strategy == "auto":
        policies, skips = auto_config(net, options)
    else:
        policies, skips = fixed_config(net, strategy, options)
    return _make_plan(net, strategy, policies, skips, options, inputs)


def _summary(plan: Plan) -> dict[str, Any]:
    return {
        "predicted_peak_bytes": int(plan.predicted_peak_bytes),
        "recomputed_flops": plan.recomputed_flops,
        "moved_bytes": int(plan.moved_bytes),
        "overhead_s": plan.overhead_s,
        "step_s": plan.predicted_step_s,
        "peak_at": plan.peak_at,
        "fits": bool(plan.fits),
    }


def _compare(
    net: NetworkCost, options: LMSOptions, inputs: dict[str, Any], auto_plan: Plan | None = None
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for strategy in FIXED_STRATEGIES:
        if strategy == "offload" and not options.allow_offload:
            out[strategy] = {
                "predicted_peak_bytes": None,
                "recomputed_flops": None,
                "moved_bytes": None,
                "reason": "offload is not available on this device (CPU: host memory is the device)",
            }
            continue
        out[strategy] = _summary(_solve(net, strategy, options, inputs))
    auto_plan = auto_plan or _solve(net, "auto", options, inputs)
    if auto_plan.fits:
        out["auto"] = _summary(auto_plan)
    else:
        out["auto"] = {
            "predicted_peak_bytes": None,
            "recomputed_flops": None,
            "moved_bytes": None,
            "reason": f"no plan fits the budget {format_gb(auto_plan.budget_bytes)} of the limit "
            f"{format_gb(options.limit_bytes)} (smallest peak "
            f"{format_gb(auto_plan.predicted_peak_bytes)})",
        }
    return out
