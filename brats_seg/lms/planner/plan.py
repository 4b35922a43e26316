"""A per-block LMS plan: its rows, totals, table and JSON, and the error when none fits.

Printed sizes are SI (1 GB = 1e9 bytes).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from brats_seg.files import format_bytes
from brats_seg.lms.planner.units import format_gb, format_seconds, format_shape
from brats_seg.lms.planner.workload import Workload

__all__ = ["BlockPlan", "Plan", "PlanDoesNotFitError"]


@dataclass
class BlockPlan:
    """One row of a plan.

    Attributes:
        block: block name.
        policy: ``keep`` | ``recompute`` | ``offload``.
        kept_bytes: device bytes this block needs kept from its forward to its backward
            (keep: every tensor its layers save; recompute: its inputs; offload: its
            inputs under ``lms.size``). Neighbours share tensors (a block's output is
            the next one's input), so the column does not add up to the peak.
        moved_bytes: bytes crossing the host link per step (each offloaded tensor twice:
            to the host in forward, back in backward or before the skip's reader).
        recomputed_flops: forward FLOPs run again in backward.
        skip_offloaded: ``dec{l}`` only: its skip tensor (``enc{l}``'s output) waits in
            host memory during the middle of the forward pass; :attr:`Plan.offload_skips`
            lists the producers, the names ``brats_seg.lms.runtime.offload`` takes.
        keep_bytes: what ``keep`` would keep (for comparison).
        input_bytes: bytes of the block's inputs.
        skip_bytes: bytes of the skip input (``dec{l}``), else 0.
        forward_flops: forward FLOPs of the block.
        overhead_s: predicted extra seconds per step (recompute + transfers not hidden).
        tail_kept: the block's last conv unit is kept, only the rest is recomputed /
            offloaded (the last block before the head; see
            :func:`~brats_seg.lms.planner.timeline.tail_kept`).
            :attr:`Plan.keep_tails` lists them for ``brats_seg.lms.runtime.offload``.
    """

    block: str
    policy: str
    kept_bytes: int
    moved_bytes: int
    recomputed_flops: float
    skip_offloaded: bool = False
    keep_bytes: int = 0
    input_bytes: int = 0
    skip_bytes: int = 0
    forward_flops: float = 0.0
    overhead_s: float = 0.0
    tail_kept: bool = False


@dataclass
class Plan:
    """A per-block LMS plan and its predictions.

    Attributes:
        strategy: ``off`` | ``recompute`` | ``offload`` | ``auto``.
        blocks: one :class:`BlockPlan` per block, forward order.
        predicted_peak_bytes: predicted device peak of one training step.
        peak_at: the step where it happens (``backward dec0``).
        limit_bytes: ``lms.limit`` in bytes.
        fits: ``predicted_peak_bytes <= budget_bytes``.
        peak_breakdown: bytes by kind at the peak step.
        inputs: the workload and costing inputs (model config, shape, batch, ...).
        timeline: ``(step, bytes)`` per step.
        strategies: predictions of the four strategies (see
            :func:`~brats_seg.lms.planner.search.compare_strategies`).
        budget_bytes: the largest peak the plan may predict: ``limit_bytes`` less the
            memory model's ``planning_margin`` (:func:`~brats_seg.lms.planner.search.planning_budget`);
            None reads as ``limit_bytes`` (a plan saved before the margin existed).
        base_step_s: on a CPU, the step-time model's seconds of the step without
            recomputation (:mod:`~brats_seg.lms.planner.step_time`); None on a GPU.
        step_time_calibrated: False where this CPU has no step-time calibration of its own
            (the time is an upper estimate).
        step_time_source: which step-time model priced it (:attr:`CpuTimeModel.source
            <brats_seg.lms.planner.step_time.CpuTimeModel.source>`: the shipped preset, this
            machine's own calibration, or none); "" on a GPU.
    """

    strategy: str
    blocks: list[BlockPlan]
    predicted_peak_bytes: int
    peak_at: str
    limit_bytes: int
    fits: bool
    peak_breakdown: dict[str, int] = field(default_factory=dict)
    inputs: dict[str, Any] = field(default_factory=dict)
    timeline: list[tuple[str, int]] = field(default_factory=list)
    strategies: dict[str, Any] | None = None
    budget_bytes: int | None = None
    base_step_s: float | None = None
    step_time_calibrated: bool = True
    step_time_source: str = ""

    def __post_init__(self) -> None:
        if self.budget_bytes is None:
            self.budget_bytes = int(self.limit_bytes)

    @property
    def margin(self) -> float:
        """The share of the limit the plan kept free (``1 - budget / limit``)."""
        return 1.0 - self.budget_bytes / self.limit_bytes if self.limit_bytes else 0.0

    @property
    def recomputed_flops(self) -> float:
        return sum(b.recomputed_flops for b in self.blocks)

    @property
    def moved_bytes(self) -> int:
        return sum(b.moved_bytes for b in self.blocks)

    @property
    def overhead_s(self) -> float:
        return sum(b.overhead_s for b in self.blocks)

    @property
    def predicted_step_s(self) -> float | None:
        """Seconds a training step is predicted to take, recomputation included (CPU only)."""
        return None if self.base_step_s is None else self.base_step_s + self.overhead_s

    @property
    def totals(self) -> dict[str, float]:
        return {
            "recomputed_flops": self.recomputed_flops,
            "moved_bytes": self.moved_bytes,
            "overhead_s": self.overhead_s,
        }

    @property
    def policies(self) -> dict[str, str]:
        """Block name -> policy, the mapping the LMS block wrapper reads."""
        return {b.block: b.policy for b in self.blocks}

    @property
    def offload_skips(self) -> set[str]:
        """Producers (``enc{l}``) of the skips held on the host: ``BlockWrapper(offload_skips=...)``."""
        return {f"enc{b.block.removeprefix('dec')}" for b in self.blocks if b.skip_offloaded}

    @property
    def keep_tails(self) -> set[str]:
        """Blocks whose last conv unit is kept: ``BlockWrapper(keep_tails=...)``."""
        return {b.block for b in self.blocks if b.tail_kept}

    def format_table(self) -> str:
        """A fixed-width table for logs and the terminal."""
        i = self.inputs
        verdict = "<=" if self.fits else "EXCEEDS"
        lines = [
            f"LMS plan: strategy {self.strategy}, predicted peak {format_gb(self.predicted_peak_bytes)} "
            f"(at {self.peak_at}) {verdict} budget {format_gb(self.budget_bytes)} "
            f"(lms.limit {format_gb(self.limit_bytes)} less {self.margin:.1%} for the model's error)",
        ]
        if i:
            m = i.get("model", {})
            lines.append(
                f"model depth {m.get('depth')}, base {m.get('base_filters')}, {m.get('norm')} norm, "
                f"{m.get('upsample')} up; input {format_shape(i.get('input_shape', ()))} x{m.get('in_channels')}, "
                f"batch {i.get('batch_size')}, {i.get('policy')}, {i.get('optimizer')}"
            )
        header = (
            f"{'block':<11} {'policy':<10} {'kept':>10} {'moved':>10} {'recompute':>13} "
            f"{'skip>host':>9} {'overhead':>10}"
        )
        lines += [header, "-" * len(header)]
        for b in self.blocks:
            skip = "yes" if b.skip_offloaded else "-"
            policy = b.policy + ("*" if b.tail_kept else "")
            lines.append(
                f"{b.block:<11} {policy:<10} {format_bytes(b.kept_bytes):>10} {format_bytes(b.moved_bytes):>10} "
                f"{b.recomputed_flops / 1e9:>7.1f} GFLOP {skip:>9} {format_seconds(b.overhead_s):>10}"
            )
        lines.append("-" * len(header))
        lines.append(
            f"{'total':<11} {'':<10} {'':>10} {format_bytes(self.moved_bytes):>10} "
            f"{self.recomputed_flops / 1e9:>7.1f} GFLOP {'':>9} {format_seconds(self.overhead_s):>10}"
        )
        if self.predicted_step_s is not None:
            lines.append(
                f"predicted step {format_seconds(self.predicted_step_s)} (the step "
                f"{format_seconds(self.base_step_s)} + recomputation {format_seconds(self.overhead_s)})"
                + (
                    ""
                    if self.step_time_calibrated
                    else ": an upper estimate, this CPU has no step-time calibration (lms.calibrate=now measures one)"
                )
            )
            if self.step_time_source:
                lines.append(f"step-time model: {self.step_time_source}")
        if self.keep_tails:
            lines.append(
                f"* {', '.join(sorted(self.keep_tails))}: last conv unit kept (its backward follows at once), "
                "the rest recomputed"
            )
        if self.peak_breakdown:
            parts = ", ".join(
                f"{k.removesuffix('_bytes').replace('_', ' ')} {format_bytes(v)}"
                for k, v in self.peak_breakdown.items()
            )
            lines.append(f"at the peak: {parts}")
        if self.strategies:
            lines.append(
                "strategies: "
                + "; ".join(
                    f"{name} {format_gb(s['predicted_peak_bytes'])}"
                    if s.get("predicted_peak_bytes") is not None
                    else f"{name} n/a ({s.get('reason', '')})"
                    for name, s in self.strategies.items()
                )
            )
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: ``limit_bytes``, ``strategies``, ``plan`` (rows) and the rest."""
        return {
            "limit_bytes": int(self.limit_bytes),
            "budget_bytes": int(self.budget_bytes),
            "strategy": self.strategy,
            "fits": bool(self.fits),
            "predicted_peak_bytes": int(self.predicted_peak_bytes),
            "peak_at": self.peak_at,
            "peak_breakdown": dict(self.peak_breakdown),
            "totals": self.totals,
            "strategies": self.strategies,
            "plan": [dataclasses.asdict(b) for b in self.blocks],
            "inputs": self.inputs,
            "timeline": [{"step": s, "bytes": int(v)} for s, v in self.timeline],
            "base_step_s": self.base_step_s,
            "predicted_step_s": self.predicted_step_s,
            "step_time_calibrated": self.step_time_calibrated,
            "step_time_source": self.step_time_source,
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Plan:
        """Inverse of :meth:`to_dict` (e.g. a plan saved in a run directory)."""
        try:
            return cls(
                strategy=data["strategy"],
                blocks=[BlockPlan(**row) for row in data["plan"]],
                predicted_peak_bytes=int(data["predicted_peak_bytes"]),
                peak_at=data["peak_at"],
                limit_bytes=int(data["limit_bytes"]),
                fits=bool(data["fits"]),
                peak_breakdown=dict(data.get("peak_breakdown", {})),
                inputs=dict(data.get("inputs", {})),
                timeline=[(row["step"], int(row["bytes"])) for row in data.get("timeline", [])],
                strategies=data.get("strategies"),
                budget_bytes=data.get("budget_bytes"),
                base_step_s=data.get("base_step_s"),
                step_time_calibrated=bool(data.get("step_time_calibrated", True)),
                step_time_source=str(data.get("step_time_source", "")),
            )
        except (KeyError, TypeError) as err:
            raise ValueError(f"not a saved LMS plan ({err!r}); re-create it with scripts/plan_memory.py.") from err

    @classmethod
    def from_json(cls, text: str) -> Plan:
        return cls.from_dict(json.loads(text))


class PlanDoesNotFitError(RuntimeError):
    """No plan fits the memory limit; the message says what would.

    Attributes:
        smallest_peak_bytes: the smallest predicted peak over the strategies allowed.
        best_strategy: the strategy achieving it.
        limit_bytes: the budget.
        max_batch_size: largest batch that fits with one of the fixed strategies allowed
            (off, recompute, and offload unless on CPU); 0: none.
        max_resolution: ``(name, shape)`` of the largest standard resolution (divisible by
            ``2**depth``) that fits at batch 1 likewise, or None.
    """

    def __init__(
        self,
        message: str,
        smallest_peak_bytes: int,
        best_strategy: str,
        limit_bytes: int,
        max_batch_size: int,
        max_resolution: tuple[str, tuple[int, int, int]] | None,
    ):
        super().__init__(message)
        self.smallest_peak_bytes = smallest_peak_bytes
        self.best_strategy = best_strategy
        self.limit_bytes = limit_bytes
        self.max_batch_size = max_batch_size
        self.max_resolution = max_resolution

    @classmethod
    def for_plan(
        cls,
        plan: Plan,
        workload: Workload,
        fixed_strategies: Sequence[str],
        largest_batch: tuple[int, int],
        largest_resolution: tuple[tuple[str, tuple[int, int, int]], int] | None,
    ) -> PlanDoesNotFitError:
        """The error for a plan over its limit: the smallest peak and what would fit.

        Args:
            plan: the plan that does not fit, its ``strategies`` compared.
            workload: what it plans.
            fixed_strategies: the ``lms=`` choices the advice is about.
            largest_batch: ``(batch, peak)`` of the largest batch that fits with one of
                ``fixed_strategies``; ``(0, 0)`` when none does.
            largest_resolution: ``((name, shape), peak)`` of the largest standard
                resolution that fits at batch 1 likewise, or None.
        """
        limit_bytes, budget_bytes, strategy = plan.limit_bytes, plan.budget_bytes, plan.strategy
        candidates = {
            k: v["predicted_peak_bytes"]
            for k, v in (plan.strategies or {}).items()
            if v.get("predicted_peak_bytes") is not None
        }
        candidates[strategy] = plan.predicted_peak_bytes  # auto's best attempt when it failed
        best_strategy = min(candidates, key=candidates.get)
        smallest = candidates[best_strategy]
        max_batch, batch_peak = largest_batch
        max_res, res_peak = largest_resolution or (None, 0)
        shape = format_shape(workload.input_shape)
        lms_choices = "lms=" + "/".join(fixed_strategies)
        head = (
            f"LMS plan does not fit: strategy {strategy} predicts {format_gb(plan.predicted_peak_bytes)} "
            f"(at {plan.peak_at}) for batch {workload.batch_size} at {shape} ({workload.policy}), over the budget "
            f"{format_gb(budget_bytes)} (lms.limit {format_gb(limit_bytes)} less the {plan.margin:.1%} the planner "
            f"keeps for its own error). Smallest predicted peak: {format_gb(smallest)} with lms={best_strategy}."
        )
        if max_batch:
            batch_part = f" With {lms_choices} the largest batch that fits is {max_batch} ({format_gb(batch_peak)})."
        else:
            batch_part = f" No batch size fits at {shape} with {lms_choices}."
        if max_res:
            res_part = (
                f" The largest standard resolution that fits at batch 1 is {max_res[0]} "
                f"{format_shape(max_res[1])} ({format_gb(res_peak)})."
            )
        else:
            res_part = " No standard resolution fits at batch 1."
        advice = []
        if strategy != "auto" and smallest <= budget_bytes:
            advice.append(f"use lms=auto or lms={best_strategy}")
        if max_batch and max_batch < workload.batch_size:
            advice.append(f"lower trainer.batch_size to {max_batch}")
        on_gpu = "offload" in fixed_strategies  # offload is only offered where there is device memory
        precision = (
            "backend.precision=bf16/fp16" if on_gpu else "backend.precision=bf16 (on a CPU with AMX or AVX512-BF16)"
        )
        advice += [
            "choose a smaller resolution",
            "lower model.base_filters" + (f" or use {precision}" if workload.policy == "float32" else ""),
            "or raise lms.limit",
        ]
        message = head + batch_part + res_part + " To fix: " + ", ".join(advice) + "."
        return cls(message, int(smallest), best_strategy, int(limit_bytes), max_batch, max_res)
