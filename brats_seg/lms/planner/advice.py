"""After running out of memory: the settings the planner predicts to fit, and the message that says so.

A run that ran out of memory (TensorFlow's ``ResourceExhaustedError``, Python's ``MemoryError``,
or the kernel's out-of-memory killer) ends in one paragraph: what happened, the plan's
predicted peak, the measured peak where known, the memory the run had, and the settings
predicted to fit it, each as the overrides a user adds to the same command with its
predicted peak::

    settings predicted to fit 0.58 GB (...): `lms=auto lms.limit=580MB` (0.51 GB; recompute enc0, dec0);
    `trainer.batch_size=1 lms.limit=580MB` (0.45 GB); `resolution=tiny lms.limit=580MB` (0.27 GB); ...

Every setting carries ``lms.limit``, so the pre-flight check holds the corrected run to the
memory it really has (a fraction of the RAM psutil reports is not that inside a memory
cgroup). The searches are the planner's own (:func:`~brats_seg.lms.planner.search.compare_strategies`,
:func:`~brats_seg.lms.planner.search.largest_batch`, :func:`~brats_seg.lms.planner.search.largest_resolution`,
:func:`~brats_seg.lms.planner.search.largest_fitting`); nothing here imports TensorFlow. Which
faults count as out of memory, and where the message is raised (training, evaluation, the next
start after a kill), is :mod:`brats_seg.oom`'s.

The budget the settings are planned against (:func:`advice_budget`): the memory available;
but when memory ran out under a plan predicted to fit it, the plan's own prediction (the run
needed more than the plan said, so settings are planned below it), less the share by which a
measured peak exceeded the prediction.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from brats_seg.config import TrainConfig
from brats_seg.cpu import device_has_native_bf16
from brats_seg.lms.planner.cost import compute_network_cost
from brats_seg.lms.planner.memory_model import MemoryModel, memory_model_for
from brats_seg.lms.planner.preflight import lms_strategy
from brats_seg.lms.planner.search import (
    auto_config,
    compare_strategies,
    fits_with,
    largest_batch,
    largest_fitting,
    largest_resolution,
    planning_budget,
)
from brats_seg.lms.planner.units import format_gb, format_shape, parse_limit
from brats_seg.lms.planner.workload import LMSOptions, Workload

__all__ = [
    "Advice",
    "MemoryFacts",
    "OutOfMemoryError",
    "Setting",
    "advice_budget",
    "advise",
    "format_limit",
    "out_of_memory_error",
    "settings_that_fit",
]

#: The narrowest U-Net suggested: below 4 filters at the first level the planner would fit almost
#: anything, but such a network is no longer the experiment the user meant.
MIN_BASE_FILTERS = 4


class OutOfMemoryError(RuntimeError):
    """A run ran out of memory; the message gives the numbers and the settings predicted to fit.

    Attributes:
        facts: the :class:`MemoryFacts` the message was made from.
        advice: the :class:`Advice` (its ``settings`` may be empty: nothing the planner knows fits).
    """

    def __init__(self, message: str, facts: MemoryFacts | None = None, advice: Advice | None = None) -> None:
        super().__init__(message)
        self.facts = facts
        self.advice = advice


def format_limit(nbytes: int) -> str:
    """``lms.limit`` text for ``nbytes``, rounded down (so it never promises more): ``1.23GB``, ``580MB``."""
    if nbytes >= 1e9:
        return f"{math.floor(nbytes / 1e7) / 100:.2f}GB"
    return f"{max(int(nbytes // 1e6), 1)}MB"


@dataclass(frozen=True)
class Setting:
    """One way to fit: the overrides to add to the same command, and what the planner predicts.

    Attributes:
        overrides: ``key=value`` overrides, as typed (``("trainer.batch_size=1", "lms.limit=580MB")``).
        predicted_peak_bytes: the planner's peak for the run with them.
        note: what the plan does (``recompute enc0, dec0``), or empty.
        resumes: the overrides only change keys a run folder with progress may change
            (``lms.*``, ``backend.*``): the same run folder continues with them.
    """

    overrides: tuple[str, ...]
    predicted_peak_bytes: int
    note: str = ""
    resumes: bool = False

    def __str__(self) -> str:
        return " ".join(self.overrides)

    def describe(self) -> str:
        note = f"; {self.note}" if self.note else ""
        return f"`{self}` ({format_gb(self.predicted_peak_bytes)}{note})"


@dataclass(frozen=True)
class MemoryFacts:
    """What is known about a run that ran out of memory (bytes; None where unknown).

    Attributes:
        available_bytes: the memory the run could use for what the plan predicts: on CPU the
            RAM free above the runtime (the smaller of the system's and the memory cgroup's
            room), on a GPU the device's memory.
        available_note: where that number comes from (``memory cgroup ... limit 1.50 GB``).
        predicted_peak_bytes: the plan's predicted peak.
        plan_note: the plan in words (``lms=off, lms.limit 20.74 GB``).
        measured_peak_bytes: the largest measured peak, comparable to the prediction (on CPU the
            peak RSS above the runtime, on a GPU the allocator's peak).
        measured_note: when it was measured (``at the failure``, ``in epoch 2``).
    """

    available_bytes: int | None = None
    available_note: str = ""
    predicted_peak_bytes: int | None = None
    plan_note: str = ""
    measured_peak_bytes: int | None = None
    measured_note: str = ""

    def describe(self) -> str:
        """One or three sentences: the plan's peak, the measured one, the memory available."""
        parts = []
        if self.predicted_peak_bytes is not None:
            note = f" ({self.plan_note})" if self.plan_note else ""
            parts.append(f"The plan predicted a peak of {format_gb(self.predicted_peak_bytes)}{note}.")
        else:
            parts.append("No memory plan was made before it ended.")
        if self.measured_peak_bytes is not None:
            when = f" {self.measured_note}" if self.measured_note else ""
            parts.append(f"Measured peak: {format_gb(self.measured_peak_bytes)}{when}.")
        else:
            parts.append("No peak was measured.")
        if self.available_bytes is not None:
            note = f" ({self.available_note})" if self.available_note else ""
            parts.append(f"Memory available to the run: {format_gb(self.available_bytes)}{note}.")
        return " ".join(parts)


@dataclass(frozen=True)
class Advice:
    """The settings predicted to fit ``budget_bytes``, and why that budget.

    Attributes:
        budget_bytes: what the settings are planned against (their ``lms.limit``).
        reason: why that budget, in words.
        settings: the :class:`Setting` s, LMS first, then batch, resolution, width, precision.
    """

    budget_bytes: int
    reason: str
    settings: list[Setting] = field(default_factory=list)

    def describe(self) -> str:
        """The advice sentence(s), ready to follow the facts."""
        head = f"Settings predicted to fit {format_gb(self.budget_bytes)} ({self.reason})"
        if not self.settings:
            return (
                f"{head}: none that the planner knows (the smallest resolution, batch and width do not fit): "
                "run on a machine (or in a job) with more memory."
            )
        text = f"{head}: " + "; ".join(s.describe() for s in self.settings) + "."
        if any(s.resumes for s in self.settings) and not all(s.resumes for s in self.settings):
            text += (
                " Added to the same command, lms.* and backend.* changes continue this run folder; the others "
                "change the model or its data, so a run folder with progress needs a new run_dir= for them."
            )
        elif not any(s.resumes for s in self.settings):
            text += " They change the model or its data: a run folder with progress needs a new run_dir= for them."
        return text


def advice_budget(
    available_bytes: int, predicted_peak_bytes: int | None, measured_peak_bytes: int | None, memory_model: MemoryModel
) -> tuple[int, str]:
    """``(budget_bytes, reason)``: what settings are planned against after running out of memory.

    The memory available; but if the plan predicted a peak within it (less the planner's
    margin), the run needed more than predicted, so the plan's own prediction; and if a
    measured peak exceeded the prediction, that budget less the share it exceeded it by.
    """
    budget, reason = int(available_bytes), f"the {format_gb(available_bytes)} available"
    if predicted_peak_bytes and predicted_peak_bytes <= planning_budget(available_bytes, memory_model):
        budget = int(predicted_peak_bytes)
        reason = (
            f"the plan's own prediction: {format_gb(predicted_peak_bytes)} was predicted within the "
            f"{format_gb(available_bytes)} available, so running out means the run needed more than predicted"
        )
    if predicted_peak_bytes and measured_peak_bytes and measured_peak_bytes > predicted_peak_bytes:
        share = measured_peak_bytes / predicted_peak_bytes
        budget = int(budget / share)
        reason += f", less the {share - 1:.0%} by which the measured peak exceeded the plan"
    return budget, reason


def _fixed_for(strategy: str, allow_offload: bool) -> tuple[str, ...]:
    """The fixed strategies whose fit decides ``strategy``'s: ``auto`` fits when its last resort does."""
    if strategy == "auto":
        return ("offload",) if allow_offload else ("recompute",)
    return (strategy,)


def _predicted(workload: Workload, strategy: str, options: LMSOptions, mm: MemoryModel) -> int | None:
    """The plan's peak for ``strategy`` if it fits the budget, else None (the planner's comparison)."""
    summary = compare_strategies(workload, options, mm).get(strategy) or {}
    return int(summary["predicted_peak_bytes"]) if summary.get("fits") else None


def _auto_choice(workload: Workload, options: LMSOptions, mm: MemoryModel) -> str:
    """What ``lms=auto`` does at this budget, in words: ``recompute enc0, dec0; offload enc1``."""
    net = compute_network_cost(workload, mm)
    policies, skips = auto_config(net, options)
    names = [b.name for b in net.blocks]
    parts = []
    for policy in ("recompute", "offload"):
        blocks = [n for n, p in zip(names, policies) if p == policy]
        if blocks:
            parts.append(f"{policy} {', '.join(blocks)}")
    if any(skips):
        parts.append("skips of " + ", ".join(n for n, s in zip(names, skips) if s) + " on the host")
    return "; ".join(parts) or "keeps every block"


def settings_that_fit(
    cfg: TrainConfig, device: str, limit_bytes: int, memory_model: MemoryModel | None = None, replicas: int = 1
) -> list[Setting]:
    """The settings the planner predicts to fit ``limit_bytes``, each a change of one thing.

    Args:
        cfg: the run's config (``model.out_channels`` resolved); its ``trainer.batch_size``
            the global batch.
        device: ``CPU`` or ``GPU`` (offload only on a GPU; bf16 only where it is native).
        limit_bytes: the memory to fit (what ``lms.limit`` promises); the settings carry it,
            rounded down (:func:`format_limit`), and are planned against that.
        memory_model: the device's coefficients; default :func:`memory_model_for` ``(device)``.
        replicas: devices sharing the global batch (each plans its share).

    Returns:
        In order, where one fits: ``lms=auto`` (or, already auto, the limit alone), the largest
        smaller ``trainer.batch_size``, the largest smaller standard ``resolution`` (divisible by
        ``2**depth``), the largest smaller ``model.base_filters`` (a multiple of ``model.groups``
        under group norm), and ``backend.precision=bf16`` for a float32 run (a GPU, or a CPU
        with native bf16). Batch, resolution and width are searched with LMS allowed; each keeps
        the run's strategy where that fits, and adds ``lms=auto`` where it does not.
    """
    mm = memory_model or memory_model_for(device)
    allow_offload = device == "GPU"
    limit_text = format_limit(limit_bytes)
    limit = f"lms.limit={limit_text}"
    options = LMSOptions.from_config(cfg.lms, parse_limit(limit_text, None), allow_offload, strategy="auto")
    strategy, _ = lms_strategy(cfg.lms.name, cfg.backend.name, device)  # the run's (offload never starts on CPU)
    per_replica = max(cfg.trainer.batch_size // max(replicas, 1), 1)
    workload = Workload.from_config(cfg).with_input(batch_size=per_replica)
    fixed = _fixed_for("auto", allow_offload)  # what fits with LMS allowed (auto's last resort)
    out: list[Setting] = []

    def one_change(override: str, changed: Workload, note: str = "") -> None:
        """The change alone if the run's strategy fits with it, else with ``lms=auto``."""
        peak = _predicted(changed, strategy, options, mm)
        if peak is not None:
            out.append(Setting((override, limit), peak, note, resumes=override.startswith(("lms", "backend"))))
        elif strategy != "auto" and (peak := _predicted(changed, "auto", options, mm)) is not None:
            note = "; ".join(n for n in (note, _auto_choice(changed, options, mm)) if n)
            out.append(
                Setting((override, "lms=auto", limit), peak, note, resumes=override.startswith(("lms", "backend")))
            )

    peak = _predicted(workload, "auto", options, mm)
    if peak is not None:
        lms = (limit,) if strategy == "auto" else ("lms=auto", limit)
        out.append(Setting(lms, peak, _auto_choice(workload, options, mm), resumes=True))

    if per_replica > 1:
        batch, _ = largest_batch(workload, mm, fixed, options, cap=per_replica - 1)
        if batch:
            one_change(f"trainer.batch_size={batch * max(replicas, 1)}", workload.with_input(batch_size=batch))

    found = largest_resolution(workload, mm, fixed, options, batch_size=per_replica)
    if found is not None and math.prod(found[0][1]) < math.prod(workload.input_shape):
        (name, shape), _ = found
        one_change(f"resolution={name}", workload.with_input(input_shape=shape), format_shape(shape))

    width = _largest_width(workload, mm, fixed, options)
    if width is not None:
        one_change(f"model.base_filters={width}", _with_width(workload, width))

    if workload.policy == "float32" and device_has_native_bf16(device):
        one_change("backend.precision=bf16", dataclasses.replace(workload, policy="mixed_bfloat16"))
    return out


def _with_width(workload: Workload, base_filters: int) -> Workload:
    return dataclasses.replace(workload, model_cfg=dataclasses.replace(workload.model_cfg, base_filters=base_filters))


def _largest_width(workload: Workload, mm: MemoryModel, strategies: Sequence[str], options: LMSOptions) -> int | None:
    """The largest ``model.base_filters`` from :data:`MIN_BASE_FILTERS` up to below the run's at which
    ``strategies`` fit (group norm: multiples of ``model.groups``, which must divide every level's width),
    or None."""
    m = workload.model_cfg
    widths = [f for f in range(MIN_BASE_FILTERS, m.base_filters) if m.norm != "group" or f % m.groups == 0]
    if not widths:
        return None
    n, _ = largest_fitting(
        lambda i: fits_with(_with_width(workload, widths[i - 1]), mm, strategies, options), len(widths)
    )
    return widths[n - 1] if n else None


def advise(
    cfg: TrainConfig, device: str, facts: MemoryFacts, memory_model: MemoryModel | None = None, replicas: int = 1
) -> Advice | None:
    """The :class:`Advice` for a run that ran out of memory, or None when the memory available is unknown."""
    if not facts.available_bytes:
        return None
    mm = memory_model or memory_model_for(device)
    budget, reason = advice_budget(facts.available_bytes, facts.predicted_peak_bytes, facts.measured_peak_bytes, mm)
    budget = parse_limit(format_limit(budget), None)  # the lms.limit the settings carry
    return Advice(budget, reason, settings_that_fit(cfg, device, budget, mm, replicas))


def out_of_memory_error(
    what: str,
    cfg: TrainConfig,
    device: str,
    facts: MemoryFacts,
    memory_model: MemoryModel | None = None,
    replicas: int = 1,
    tail: str = "",
) -> OutOfMemoryError:
    """The :class:`OutOfMemoryError` whose message is ``what``, the facts, the advice and ``tail``.

    Args:
        what: what happened, a sentence (``out of memory in training epoch 2, step 1: MemoryError``).
        cfg, device, memory_model, replicas: as :func:`settings_that_fit`.
        facts: the numbers known.
        tail: a last sentence (what became of the run folder).
    """
    advice = advise(cfg, device, facts, memory_model, replicas)
    parts = [what.rstrip(".") + ".", facts.describe()]
    if advice is not None:
        parts.append(advice.describe())
    if tail:
        parts.append(tail)
    return OutOfMemoryError(" ".join(parts), facts, advice)
