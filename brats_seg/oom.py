"""Out of memory in training, and what every out-of-memory message shares.

* What counts as out of memory (:func:`is_out_of_memory`: TensorFlow's
  ``ResourceExhaustedError``, Python's ``MemoryError``, a TensorFlow op error that says memory ran
  out), what this process can still take (:func:`headroom`) and the peak measured at a failure
  (:func:`peak_at_failure`): read by training here and by evaluation and prediction in
  :mod:`brats_seg.oom_inference` (their check before, their guard during).
* During training: :func:`out_of_memory_guard` raises the
  :class:`~brats_seg.lms.planner.advice.OutOfMemoryError` of its :class:`MemoryWatch`:
  where the run was, the plan's predicted peak, the measured one (the peak so far on CPU or
  the allocator's on a GPU, and the last epochs'), the memory available, and the settings the
  planner predicts to fit (:func:`~brats_seg.lms.planner.advice.out_of_memory_error`); the run
  folder keeps its last completed epoch. (Training's own check before is the planner's
  pre-flight plan.)
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
:mod:`brats_seg.memory`, the settings that fit from :mod:`brats_seg.lms.planner.advice`.
Nothing here imports TensorFlow or Keras at module level: the measured peak
(:func:`brats_seg.lms.runtime.stats.device_peak_bytes`) is read inside the functions, after
``brats_seg.backend.configure``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

from brats_seg.backend import device_memory_bytes
from brats_seg.config import TrainConfig
from brats_seg.lms.planner.advice import MemoryFacts, OutOfMemoryError, advise, out_of_memory_error
from brats_seg.lms.planner.units import format_gb
from brats_seg.locks import update_lock
from brats_seg.memory import boot_id, cgroup_state, memory_facts, system_oom_kills

__all__ = [
    "MemoryWatch",
    "first_line",
    "headroom",
    "is_out_of_memory",
    "out_of_memory_guard",
    "peak_at_failure",
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
        return room, (
            f"memory cgroup {cgroup['path']}: limit {format_gb(limit)}, "
            f"{format_gb(cgroup['usage_bytes'])} in use before the model was built"
        )
    return system, f"RAM available before the model was built, of {format_gb(facts['total_bytes'])}"


def peak_at_failure(device: str, baseline_bytes: int | None) -> int | None:
    """The peak measured now, as the plan counts it: above ``baseline_bytes`` (the runtime's RSS) on
    CPU (None without a baseline), the allocator's on a GPU; None where it cannot be read."""
    try:
        from brats_seg.lms.runtime.stats import device_peak_bytes  # imports TensorFlow

        peak = device_peak_bytes(device)
    except Exception as e:  # noqa: BLE001 - a diagnosis aid: never hide the out-of-memory error behind another
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
        self._save(
            predicted_peak_bytes=int(plan.predicted_peak_bytes),
            limit_bytes=int(plan.limit_bytes),
            strategy=strategy,
            stage="preparing the data",
        )

    def started(self, baseline_bytes: int | None, state: dict | None) -> None:
        """Before the model is built: the runtime's RSS and the memory left; the measured peaks
        of the epochs already done (a resumed run's ``state.json``)."""
        self.baseline_bytes = baseline_bytes
        facts = memory_facts()
        fields = {
            "stage": "building the model",
            "baseline_bytes": baseline_bytes,
            "before_model": facts,
            "epochs_done": int((state or {}).get("epoch") or 0),
        }
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
        at_failure = peak_at_failure(self.device, self.baseline_bytes)  # the statistics callback resets it per epoch
        known = self.record.get("measured_peak_bytes")
        measured, note = None, ""
        if at_failure is not None:
            measured, note = at_failure, "at the failure (the allocation that failed not counted)"
        if known is not None and (measured is None or known > measured):
            measured, note = known, f"in epoch {self.record.get('measured_epoch')}"
        facts = MemoryFacts(
            *self._available(),
            predicted_peak_bytes=self.record.get("predicted_peak_bytes"),
            plan_note=_plan_note(self.record),
            measured_peak_bytes=measured,
            measured_note=note,
        )
        done = self.record.get("epochs_done") or 0
        tail = (
            f"The run folder keeps its last completed epoch ({done}): the same command resumes it."
            if done
            else "No epoch was completed, so nothing was saved to resume from."
        )
        return out_of_memory_error(
            f"out of memory {self.position()}: {first_line(exc)}",
            self.cfg,
            self.device,
            facts,
            replicas=self.replicas,
            tail=tail,
        )

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
            return True, (
                f"was killed by the kernel's out-of-memory killer (memory cgroup {recorded['path']}{limit}: "
                f"oom_kill {recorded['oom_kill']} -> {now['oom_kill']} since it started)"
            )
    vmstat = system_oom_kills()  # every OOM kill on the machine, cgroups' included
    if start.get("vmstat_oom_kill") is not None and vmstat is not None:
        if vmstat > start["vmstat_oom_kill"]:
            return True, (
                "was most likely killed by the kernel's out-of-memory killer (it killed "
                f"{vmstat - start['vmstat_oom_kill']} process(es) on this machine since the run started: "
                "/proc/vmstat oom_kill)"
            )
        return False, (
            "ended without saving, but not by the kernel's out-of-memory killer (it killed nothing on "
            "this machine since the run started): it was killed with SIGKILL, by a user or a scheduler"
        )
    return None, (
        "ended without saving (killed: SIGKILL, out of memory, or a power loss; this machine does not tell which)"
    )


def takeover_message(dead: dict, cfg: TrainConfig, device: str, replicas: int = 1) -> str:
    """The diagnosis of the run that held the lock ``dead`` (its record): why it died, its memory
    facts and, when memory may be why, the settings predicted to fit the memory it had."""
    memory = dead.get("memory") or {}
    who = f"the previous run (PID {dead.get('pid', '?')}, started {dead.get('since', '?')})"
    if not memory:
        return (
            f"{who} ended without saving (killed: SIGKILL, out of memory, or a power loss; its lock records no "
            "memory facts to tell which). Resuming from its last saved epoch."
        )
    oom, why = _why_it_died(memory)
    where = _position(memory)
    parts = [f"{who} {why}, {where}."]
    recorded = (memory.get("start") or {}).get("cgroup") or {}
    now = cgroup_state(recorded["path"], recorded.get("version", 1)) if recorded.get("path") else None
    facts_then = memory.get("before_model") or memory.get("start")
    available, note = (
        headroom(facts_then, now.get("limit_bytes") if now else None) if facts_then and device == "CPU" else (None, "")
    )
    measured = memory.get("measured_peak_bytes")
    facts = MemoryFacts(
        available,
        note,
        memory.get("predicted_peak_bytes"),
        _plan_note(memory),
        int(measured) if measured is not None else None,
        f"in epoch {memory.get('measured_epoch')}" if measured is not None else "",
    )
    parts.append(facts.describe())
    if oom is not False and device == "CPU":
        try:
            advice = advise(cfg, device, facts, replicas=replicas)
        except Exception as e:  # noqa: BLE001 - advice must not stop a resume (a config the planner refuses says so later)
            log.debug("no advice for the dead run: %s", e)
            advice = None
        if advice is not None:
            parts.append(advice.describe())
    elif oom is not False:
        parts.append(
            "On a GPU run the kernel counts host memory (the input pipeline, offloaded tensors), which the "
            "plan does not bound: lower data.prefetch_batches or leave host memory to this run."
        )
    done = memory.get("epochs_done") or 0
    parts.append(
        f"Resuming from its last saved epoch ({done})."
        if done
        else "It had completed no epoch: training starts from the beginning."
    )
    return " ".join(parts)
