"""Out of memory, in one place: the check before, the guards during, the diagnosis after.

* Before: :func:`check_inference_memory` holds the predicted peak of one case's evaluation or
  prediction to the run's ``lms.limit`` before any model is loaded (training's own check is
  the planner's pre-flight plan).
* During: TensorFlow's ``ResourceExhaustedError`` and Python's ``MemoryError`` (and a
  TensorFlow op error that says memory ran out: :func:`is_out_of_memory`) become one message
  with the numbers and what lowers the peak. In training, :func:`out_of_memory_guard` raises
  the :class:`~brats_seg.lms.planner.advice.OutOfMemoryError` of its :class:`MemoryWatch`:
  where the run was, the plan's predicted peak, the measured one (the peak so far on CPU or
  the allocator's on a GPU, and the last epochs'), the memory available, and the settings the
  planner predicts to fit (:func:`~brats_seg.lms.planner.advice.out_of_memory_error`); the run
  folder keeps its last completed epoch. In evaluation and prediction,
  :func:`inference_memory_guard` raises an :class:`InferenceOutOfMemoryError` with the
  inference estimate and the settings that lower it.
* After: a process killed by the kernel leaves its run folder's lock behind. While it trains,
  the lock's record (:class:`MemoryWatch`) carries what the next start needs to tell why it
  died: the memory cgroup and its ``oom_kill`` count, ``/proc/vmstat``'s, the boot id, the
  plan's predicted peak, the memory available when it started, and (per epoch) its position
  and measured peak. The next start takes the lock over and :func:`takeover_message`
  compares: the counters rose, so the out-of-memory killer killed it; they did not, so
  something else did; or it cannot be told.

Memory on CPU is counted as the plan counts it: above the runtime (the RSS just before the
model is built or loaded). What a run could use is the smaller of the system's available RAM
and its memory cgroup's room (a SLURM job or a container is held to its cgroup's limit
whatever the machine has). The facts come from below: the machine's memory from
:mod:`brats_seg.memory`, the settings that fit from :mod:`brats_seg.lms.planner.advice`,
the inference estimate from :mod:`brats_seg.lms.planner.inference`. Nothing here imports
TensorFlow or Keras at module level: the measured peak
(:func:`brats_seg.lms.runtime.stats.device_peak_bytes`) is read inside the functions, after
``brats_seg.backend.configure``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
from collections.abc import Iterator
from pathlib import Path

from brats_seg.backend import device_memory_bytes
from brats_seg.config import EvaluateConfig, TrainConfig
from brats_seg.cpu import device_has_native_bf16
from brats_seg.lms.planner.advice import MemoryFacts, OutOfMemoryError, advise, out_of_memory_error
from brats_seg.lms.planner.inference import InferenceEstimate, estimate_inference
from brats_seg.lms.planner.memory_model import MemoryModel, memory_model_for
from brats_seg.lms.planner.search import planning_budget
from brats_seg.lms.planner.units import format_gb, parse_limit
from brats_seg.lms.planner.workload import Workload
from brats_seg.locks import update_lock
from brats_seg.memory import boot_id, cgroup_state, memory_facts, system_oom_kills
from brats_seg.run_dir import RunError

__all__ = [
    "InferenceOutOfMemoryError",
    "MemoryWatch",
    "check_inference_memory",
    "first_line",
    "headroom",
    "inference_memory_guard",
    "inference_out_of_memory_error",
    "is_out_of_memory",
    "out_of_memory_guard",
    "takeover_message",
]

log = logging.getLogger(__name__)

#: TensorFlow errors whose message says memory ran out although their class does not
#: (a MemoryError inside a tf.data function, a CUDA allocation that failed in a kernel).
_OOM_WORDS = ("out of memory", "memoryerror", "cuda_error_out_of_memory", "oom when allocating")


# ---------------------------------------------------------------------------------------
# What counts as out of memory, and what is left
# ---------------------------------------------------------------------------------------


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` says memory ran out: Python's ``MemoryError``, TensorFlow's
    ``ResourceExhaustedError`` (told by class name, so TensorFlow need not be imported), or
    another TensorFlow op error whose message says so."""
    if isinstance(exc, MemoryError):
        return True
    names = {c.__name__ for c in type(exc).__mro__}
    if "ResourceExhaustedError" in names:
        return True
    return "OpError" in names and any(w in str(exc).lower() for w in _OOM_WORDS)


def first_line(exc: BaseException, limit: int = 200) -> str:
    """``ClassName: first line of the message``, cut to ``limit`` characters (TensorFlow's are long)."""
    text = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    text = text if len(text) <= limit else text[: limit - 3] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def headroom(facts: dict, cgroup_limit_bytes: int | None = None) -> tuple[int, str]:
    """``(bytes, where from)``: memory this process can still take, per ``facts`` (the smaller of the
    system's available RAM and the cgroup's room; ``cgroup_limit_bytes`` replaces the recorded limit)."""
    system = int(facts["available_bytes"])
    cgroup = facts.get("cgroup") or {}
    limit = cgroup_limit_bytes if cgroup_limit_bytes is not None else cgroup.get("limit_bytes")
    if limit is not None and cgroup.get("usage_bytes") is not None and limit - cgroup["usage_bytes"] < system:
        room = max(int(limit - cgroup["usage_bytes"]), 0)
        return room, (f"memory cgroup {cgroup['path']}: limit {format_gb(limit)}, "
                      f"{format_gb(cgroup['usage_bytes'])} in use before the model was built")
    return system, f"RAM available before the model was built, of {format_gb(facts['total_bytes'])}"


def _peak_at_failure(device: str, baseline_bytes: int | None) -> int | None:
    """The peak measured now, as the plan counts it: above ``baseline_bytes`` (the runtime's RSS) on
    CPU (None without a baseline), the allocator's on a GPU; None where it cannot be read."""
    try:
        from brats_seg.lms.runtime.stats import device_peak_bytes  # imports TensorFlow

        peak = device_peak_bytes(device)
    except Exception as e:  # a diagnosis aid: never hide the out-of-memory error behind another
        log.debug("no peak measured at the failure: %s", e)
        return None
    if device == "CPU":
        return peak - baseline_bytes if baseline_bytes is not None else None
    return peak


# ---------------------------------------------------------------------------------------
# Training: what the running process knows, in its lock record
# ---------------------------------------------------------------------------------------


class MemoryWatch:
    """What an out-of-memory message needs, collected as the run goes, and kept in the run
    folder's lock record (``memory``) for the next start.

    Args:
        cfg: the run's config (its global batch; :meth:`planned` gives the replicas).
        device: ``CPU`` or ``GPU``.
    """

    def __init__(self, cfg: TrainConfig, device: str) -> None:
        self.cfg, self.device, self.replicas = cfg, device, 1
        self.lock: Path | None = None
        self.baseline_bytes: int | None = None
        self.step: int | None = None
        self.record: dict = {"device": device, "stage": "starting", "start": memory_facts()}

    def lock_record(self) -> dict:
        """Fields for ``hold_lock(record=...)``."""
        return {"memory": self.record}

    def _save(self, **fields) -> None:
        self.record.update(fields)
        if self.lock is not None:
            update_lock(self.lock, memory=self.record)

    def planned(self, plan, strategy: str, replicas: int) -> None:
        """The run's plan (its predicted peak, limit and strategy), per replica."""
        self.replicas = replicas
        self._save(predicted_peak_bytes=int(plan.predicted_peak_bytes), limit_bytes=int(plan.limit_bytes),
                   strategy=strategy, stage="preparing the data")

    def started(self, baseline_bytes: int | None, state: dict | None) -> None:
        """Before the model is built: the runtime's RSS and the memory left; the measured peaks
        of the epochs already done (a resumed run's ``state.json``)."""
        self.baseline_bytes = baseline_bytes
        facts = memory_facts()
        fields = {"stage": "building the model", "baseline_bytes": baseline_bytes, "before_model": facts,
                  "epochs_done": int((state or {}).get("epoch") or 0)}
        peaks = [_measured(row, self.device) for row in (state or {}).get("history", ())]
        if any(p is not None for p in peaks):
            epoch, peak = max(((i + 1, p) for i, p in enumerate(peaks) if p is not None), key=lambda kv: kv[1])
            fields.update(measured_peak_bytes=int(peak), measured_epoch=epoch)
        self._save(**fields)

    def epoch_begin(self, epoch: int) -> None:
        self.step = None
        self._save(stage="training", epoch=epoch + 1)

    def epoch_end(self, epoch: int, logs: dict | None) -> None:
        peak = _measured(logs or {}, self.device)
        fields = {"stage": "between epochs", "epoch": epoch + 1, "epochs_done": epoch + 1}
        known = self.record.get("measured_peak_bytes")
        if peak is not None and (known is None or peak >= known):  # the first epoch's always (it may be < 0)
            fields.update(measured_peak_bytes=int(peak), measured_epoch=epoch + 1)
        self._save(**fields)

    def validating(self) -> None:
        self._save(stage="validating")

    def position(self) -> str:
        """Where the run was, in words: ``in training epoch 2, step 3``."""
        return _position(self.record, self.step)

    def error(self, exc: BaseException) -> OutOfMemoryError:
        """The :class:`OutOfMemoryError` for ``exc``, raised at the current position."""
        at_failure = _peak_at_failure(self.device, self.baseline_bytes)  # the statistics callback resets it per epoch
        known = self.record.get("measured_peak_bytes")
        measured, note = None, ""
        if at_failure is not None:
            measured, note = at_failure, "at the failure (the allocation that failed not counted)"
        if known is not None and (measured is None or known > measured):
            measured, note = known, f"in epoch {self.record.get('measured_epoch')}"
        facts = MemoryFacts(*self._available(), predicted_peak_bytes=self.record.get("predicted_peak_bytes"),
                            plan_note=_plan_note(self.record), measured_peak_bytes=measured, measured_note=note)
        done = self.record.get("epochs_done") or 0
        tail = (f"The run folder keeps its last completed epoch ({done}): the same command resumes it."
                if done else "No epoch was completed, so nothing was saved to resume from.")
        return out_of_memory_error(f"out of memory {self.position()}: {first_line(exc)}", self.cfg, self.device,
                                   facts, replicas=self.replicas, tail=tail)

    def _available(self) -> tuple[int | None, str]:
        if self.device == "GPU":
            return device_memory_bytes("GPU", self.cfg.backend.gpu_memory_limit_mb), "GPU memory"
        facts = self.record.get("before_model") or self.record["start"]
        return headroom(facts)


def _measured(logs: dict, device: str) -> float | None:
    """An epoch's measured peak as the plan counts it: above the runtime on CPU, the allocator's on a GPU."""
    value = logs.get("measured_bytes" if device == "CPU" else "peak_bytes")
    return float(value) if value is not None else None


def _plan_note(record: dict) -> str:
    if record.get("limit_bytes") is None:
        return ""
    return f"lms={record.get('strategy')}, lms.limit {format_gb(record['limit_bytes'])}"


def _position(record: dict, step: int | None = None) -> str:
    stage, epoch = record.get("stage", "starting"), record.get("epoch")
    if stage == "training" and epoch:
        return f"in training epoch {epoch}" + (f", step {step + 1}" if step is not None else "")
    if stage == "validating" and epoch:
        return f"in the validation of epoch {epoch}"
    if stage == "between epochs" and epoch:
        return f"after epoch {epoch}"
    return f"while {stage}"


@contextlib.contextmanager
def out_of_memory_guard(watch: MemoryWatch) -> Iterator[None]:
    """Turn running out of memory inside the block into an :class:`OutOfMemoryError` with the
    watch's numbers and the settings that fit; other errors pass unchanged."""
    try:
        yield
    except OutOfMemoryError:
        raise
    except Exception as e:
        if not is_out_of_memory(e):
            raise
        raise watch.error(e) from e


# ---------------------------------------------------------------------------------------
# Evaluation and prediction: the estimate before, the guard during
# ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _InferenceCase:
    """The largest case of an inference as the planner sees it (voxel counts None: the network grid)."""

    workload: Workload
    memory_model: MemoryModel
    resampled_voxels: int | None
    native_voxels: int | None
    mirror: bool
    scoring: bool

    def estimate(self, workload: Workload | None = None, mirror: bool | None = None) -> InferenceEstimate:
        return estimate_inference(self.workload if workload is None else workload, self.memory_model,
                                  mirror=self.mirror if mirror is None else mirror,
                                  resampled_voxels=self.resampled_voxels, native_voxels=self.native_voxels,
                                  scoring=self.scoring)


def _largest_case(run: TrainConfig, eval_cfg: EvaluateConfig, device: str, policy: str, records,
                  scoring: bool) -> _InferenceCase:
    return _InferenceCase(
        workload=dataclasses.replace(Workload.from_config(run), policy=policy),
        memory_model=memory_model_for(device),
        resampled_voxels=max((math.prod(r["resampled_shape"]) for r in records), default=None),
        native_voxels=max((math.prod(r["native_shape"]) for r in records), default=None),
        mirror=eval_cfg.mirror and eval_cfg.mode == "whole",
        scoring=scoring,
    )


def check_inference_memory(run: TrainConfig, eval_cfg: EvaluateConfig, device: str, policy: str, records=(),
                           scoring: bool = True) -> InferenceEstimate:
    """Predict a case's evaluation (``scoring``) or prediction peak and hold it to the run's
    ``lms.limit`` (less the planning margin), before any model is loaded.

    Args:
        run: the run's config.
        eval_cfg: mirroring and mode.
        device: ``CPU`` or ``GPU``.
        policy: the dtype policy the model infers in (``float32``, ``mixed_bfloat16``).
        records: the cases' ``PreprocessRecord`` dicts (their resampled and native grids);
            none: the network grid stands for both.

    Returns:
        The :class:`~brats_seg.lms.planner.inference.InferenceEstimate` of the largest case.

    Raises:
        RunError: the estimate is over the budget, with the numbers and what to change.
    """
    case = _largest_case(run, eval_cfg, device, policy, records, scoring)
    workload, estimate = case.workload, case.estimate()
    limit = parse_limit(run.lms.limit, device_memory_bytes(device, run.backend.gpu_memory_limit_mb))
    budget = planning_budget(limit, case.memory_model)
    log.info("inference of a case (%s, %s): predicted peak %s at its %s step, budget %s (lms.limit %s)",
             "x".join(map(str, workload.input_shape)), workload.policy, format_gb(estimate.peak_bytes),
             estimate.peak_at, format_gb(budget), format_gb(limit))
    if estimate.peak_bytes > budget:
        hints = _inference_hints(case, eval_cfg, bf16=workload.policy == "float32" and device_has_native_bf16(device))
        hints.append("a machine with more memory, or a larger lms.limit in the run's config.json")
        raise RunError(
            f"inference of one case at {'x'.join(map(str, workload.input_shape))} ({workload.policy}) is predicted to "
            f"need {format_gb(estimate.peak_bytes)} at its {estimate.peak_at} step, over the budget "
            f"{format_gb(budget)} (lms.limit {format_gb(limit)} less the planner's margin). Try: "
            + "; ".join(hints) + ".")
    return estimate


def _inference_hints(case: _InferenceCase, eval_cfg: EvaluateConfig, bf16: bool, below: int | None = None
                     ) -> list[str]:
    """What lowers one case's inference peak, each with the estimate it gives: no mirroring,
    and (``bf16``) bfloat16; with ``below``, only those whose estimate is lower than it."""
    hints = []
    if case.mirror:
        no_mirror = case.estimate(mirror=False).peak_bytes
        if below is None or no_mirror < below:
            hints.append(f"evaluate.mirror=false ({format_gb(no_mirror)})")
    if bf16:
        peak = case.estimate(dataclasses.replace(case.workload, policy="mixed_bfloat16"),
                             mirror=eval_cfg.mirror).peak_bytes
        if below is None or peak < below:
            hints.append(f"backend.precision=bf16 on a CPU with native bf16 ({format_gb(peak)})")
    return hints


class InferenceOutOfMemoryError(RunError):
    """Evaluation or prediction ran out of memory; the message gives the estimate, the measured
    peak and what lowers it (:func:`inference_memory_guard`).

    Attributes:
        estimate: the :class:`~brats_seg.lms.planner.inference.InferenceEstimate` of the largest case.
        measured_bytes: the peak measured at the failure (above the runtime on CPU), or None.
    """

    def __init__(self, message: str, estimate=None, measured_bytes: int | None = None) -> None:
        super().__init__(message)
        self.estimate = estimate
        self.measured_bytes = measured_bytes


@contextlib.contextmanager
def inference_memory_guard(run: TrainConfig, eval_cfg: EvaluateConfig, device: str, policy: str, records=(),
                           scoring: bool = True, baseline_bytes: int | None = None) -> Iterator[None]:
    """Turn running out of memory inside the block (TensorFlow's ``ResourceExhaustedError``,
    Python's ``MemoryError``) into an :class:`InferenceOutOfMemoryError`: the estimate of
    :func:`check_inference_memory` for the same cases, the measured peak, the memory available
    and what would lower the peak. Other errors pass unchanged.

    Args:
        run, eval_cfg, device, policy, records, scoring: as :func:`check_inference_memory`.
        baseline_bytes: on CPU, the RSS before the model was loaded (the measured peak is
            reported above it, as the estimate counts); None: no peak is reported on CPU.

    Raises:
        InferenceOutOfMemoryError: memory ran out inside the block.
    """
    try:
        yield
    except Exception as e:
        if not is_out_of_memory(e):
            raise
        raise inference_out_of_memory_error(e, run, eval_cfg, device, policy, records, scoring, baseline_bytes) from e


def inference_out_of_memory_error(exc: BaseException, run: TrainConfig, eval_cfg: EvaluateConfig, device: str,
                                  policy: str, records=(), scoring: bool = True,
                                  baseline_bytes: int | None = None) -> InferenceOutOfMemoryError:
    """The :class:`InferenceOutOfMemoryError` for ``exc`` (see :func:`inference_memory_guard`)."""
    case = _largest_case(run, eval_cfg, device, policy, records, scoring)
    workload, estimate = case.workload, case.estimate()
    measured = _peak_at_failure(device, baseline_bytes)
    facts = [f"The inference of one case at {'x'.join(map(str, workload.input_shape))} ({workload.policy}"
             f"{', mirrored' if case.mirror else ''}) was predicted to need {format_gb(estimate.peak_bytes)} at its "
             f"{estimate.peak_at} step."]
    if measured is not None:
        facts.append(f"Measured peak: {format_gb(measured)} at the failure (the allocation that failed not counted).")
    if device == "CPU":
        room, where = headroom(memory_facts())
        facts.append(f"Memory available: {format_gb(room)} ({where.replace(' before the model was built', ' now')}).")
    hints = _inference_hints(case, eval_cfg, bf16=workload.policy == "float32" and device_has_native_bf16(device),
                             below=estimate.peak_bytes)
    hints.append(f"a machine (or job) with more memory free than the {format_gb(estimate.peak_bytes)} predicted "
                 "(lms.limit in the run's config.json at most what is free, so that the check before loading "
                 "the model refuses what does not fit)")
    what = "evaluating" if scoring else "predicting"
    message = (f"out of memory {what} a case: {first_line(exc)}. " + " ".join(facts)
               + " Try: " + "; ".join(hints) + ".")
    return InferenceOutOfMemoryError(message, estimate, measured)


# ---------------------------------------------------------------------------------------
# The next start: why the previous one died
# ---------------------------------------------------------------------------------------


def _why_it_died(memory: dict) -> tuple[bool | None, str]:
    """``(killed by the OOM killer: True / False / None unknown, in words)`` from a dead run's record."""
    start = memory.get("start") or {}
    boot = boot_id() or ""
    if start.get("boot_id") and boot and start["boot_id"] != boot:
        return False, "ended when the machine restarted (a power loss, a crash or a reboot)"
    recorded = start.get("cgroup") or {}
    if recorded.get("oom_kill") is not None:
        now = cgroup_state(recorded["path"], recorded.get("version", 1))
        if now is not None and now.get("oom_kill") is not None and now["oom_kill"] > recorded["oom_kill"]:
            limit = f", limit {format_gb(now['limit_bytes'])}" if now.get("limit_bytes") else ""
            return True, (f"was killed by the kernel's out-of-memory killer (memory cgroup {recorded['path']}{limit}: "
                          f"oom_kill {recorded['oom_kill']} -> {now['oom_kill']} since it started)")
    vmstat = system_oom_kills()  # every OOM kill on the machine, cgroups' included
    if start.get("vmstat_oom_kill") is not None and vmstat is not None:
        if vmstat > start["vmstat_oom_kill"]:
            return True, ("was most likely killed by the kernel's out-of-memory killer (it killed "
                          f"{vmstat - start['vmstat_oom_kill']} process(es) on this machine since the run started: "
                          "/proc/vmstat oom_kill)")
        return False, ("ended without saving, but not by the kernel's out-of-memory killer (it killed nothing on "
                       "this machine since the run started): it was killed with SIGKILL, by a user or a scheduler")
    return None, ("ended without saving (killed: SIGKILL, out of memory, or a power loss; "
                  "this machine does not tell which)")


def takeover_message(dead: dict, cfg: TrainConfig, device: str, replicas: int = 1) -> str:
    """The diagnosis of the run that held the lock ``dead`` (its record): why it died, its memory
    facts and, when memory may be why, the settings predicted to fit the memory it had."""
    memory = dead.get("memory") or {}
    who = f"the previous run (PID {dead.get('pid', '?')}, started {dead.get('since', '?')})"
    if not memory:
        return (f"{who} ended without saving (killed: SIGKILL, out of memory, or a power loss; its lock records no "
                "memory facts to tell which). Resuming from its last saved epoch.")
    oom, why = _why_it_died(memory)
    where = _position(memory)
    parts = [f"{who} {why}, {where}."]
    recorded = (memory.get("start") or {}).get("cgroup") or {}
    now = cgroup_state(recorded["path"], recorded.get("version", 1)) if recorded.get("path") else None
    facts_then = memory.get("before_model") or memory.get("start")
    available, note = (headroom(facts_then, now.get("limit_bytes") if now else None) if facts_then and device == "CPU"
                       else (None, ""))
    measured = memory.get("measured_peak_bytes")
    facts = MemoryFacts(available, note, memory.get("predicted_peak_bytes"), _plan_note(memory),
                        int(measured) if measured is not None else None,
                        f"in epoch {memory.get('measured_epoch')}" if measured is not None else "")
    parts.append(facts.describe())
    if oom is not False and device == "CPU":
        try:
            advice = advise(cfg, device, facts, replicas=replicas)
        except Exception as e:  # advice must not stop a resume (a config the planner refuses says so later)
            log.debug("no advice for the dead run: %s", e)
            advice = None
        if advice is not None:
            parts.append(advice.describe())
    elif oom is not False:
        parts.append("On a GPU run the kernel counts host memory (the input pipeline, offloaded tensors), which the "
                     "plan does not bound: lower data.prefetch_batches or leave host memory to this run.")
    done = memory.get("epochs_done") or 0
    parts.append(f"Resuming from its last saved epoch ({done})." if done else
                 "It had completed no epoch: training starts from the beginning.")
    return " ".join(parts)
