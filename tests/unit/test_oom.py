"""Out of memory costs nothing (issue 21, item 4): a run that runs out of memory ends in a message
with the plan's and the measured peak and settings the planner predicts to fit; each suggested
setting really plans under the budget; a run killed by the kernel is told apart on the next start
from its lock record; inference's out-of-memory errors carry the inference estimate."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from brats_seg.config import (
    BackendConfig,
    DataConfig,
    EvaluateConfig,
    LMSConfig,
    ModelConfig,
    ResolutionConfig,
    TrackingConfig,
    TrainConfig,
    TrainerConfig,
)
from brats_seg.data.labels import resolve_model_outputs
from brats_seg.lms.planner.advice import (
    MemoryFacts,
    OutOfMemoryError,
    advice_budget,
    format_limit,
    out_of_memory_error,
    settings_that_fit,
)
from brats_seg.lms.planner.memory_model import memory_model_for
from brats_seg.lms.planner.plan import PlanDoesNotFitError
from brats_seg.lms.planner.preflight import plan_run
from brats_seg.lms.planner.units import format_gb, parse_limit
from brats_seg.oom import is_out_of_memory
from tests.conftest import TINY, data_config

REPO = Path(__file__).resolve().parents[2]
HALF = ResolutionConfig(name="half", spacing_mm=2.0, shape=[96, 112, 80])

# --- the advice: settings that fit, planned by the planner ---------------------------------------

# (overrides as a user types them, the same config as dataclasses, the budget in bytes)
RUNS = [
    (
        ["resolution=half", "model.depth=3", "model.base_filters=16", "trainer.batch_size=4"],
        dict(resolution=HALF, model=ModelConfig(depth=3, base_filters=16), trainer=TrainerConfig(batch_size=4)),
        2_500_000_000,
    ),
    (
        [
            "resolution=full",
            "model.depth=4",
            "model.base_filters=16",
            "model.norm=group",
            "trainer.batch_size=2",
            "lms=recompute",
        ],
        dict(
            resolution=ResolutionConfig(name="full", spacing_mm=1.0, shape=[192, 224, 160]),
            model=ModelConfig(depth=4, base_filters=16, norm="group"),
            trainer=TrainerConfig(batch_size=2),
            lms=LMSConfig(name="recompute"),
        ),
        9_000_000_000,
    ),
    (
        ["resolution=tiny", "model.depth=2", "model.base_filters=8", "trainer.batch_size=2"],
        dict(
            resolution=dataclasses.replace(TINY),
            model=ModelConfig(depth=2, base_filters=8),
            trainer=TrainerConfig(batch_size=2),
        ),
        330_000_000,
    ),
]


def _compose(overrides: list[str]) -> TrainConfig:
    """The config ``train.py`` would run with these overrides (Hydra composition, as typed)."""
    from hydra import compose, initialize_config_dir

    from brats_seg.cli import to_config
    from brats_seg.script_configs import register_configs

    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        return resolve_model_outputs(to_config(compose("train", overrides=["backend=cpu_onednn", *overrides])))


@pytest.mark.parametrize("typed,fields,budget", RUNS, ids=["half-b4", "full-group-recompute", "tiny-b2"])
def test_each_suggested_setting_plans_under_the_budget(typed, fields, budget):
    """The run does not fit the budget; each suggestion, added to the same command as typed, makes a
    config that the pre-flight planner accepts under the budget, with the peak the advice quoted."""
    cfg = resolve_model_outputs(TrainConfig(data=DataConfig(layout="brats2021"), **fields))
    with pytest.raises(PlanDoesNotFitError):
        plan_run(dataclasses.replace(cfg, lms=dataclasses.replace(cfg.lms, limit=str(budget))), "CPU")
    settings = settings_that_fit(cfg, "CPU", budget)
    assert settings, "the planner should find something that fits"
    kinds = {s.overrides[0].split("=")[0] for s in settings}
    assert "trainer.batch_size" in kinds and (cfg.resolution.name == "tiny" or "resolution" in kinds)
    for setting in settings:
        assert setting.overrides[-1].startswith("lms.limit=")
        limit = parse_limit(setting.overrides[-1].split("=", 1)[1], None)
        assert budget - 10_000_000 < limit <= budget  # the budget, rounded down
        fixed = _compose([*typed, *setting.overrides])
        plan = plan_run(fixed, "CPU")  # raises PlanDoesNotFitError if the suggestion does not fit
        assert plan.fits and plan.limit_bytes == limit
        assert plan.predicted_peak_bytes == setting.predicted_peak_bytes, setting
        if "lms=auto" not in setting.overrides and not setting.overrides[0].startswith("lms"):
            assert plan.strategy == str(getattr(cfg.lms.name, "value", cfg.lms.name))  # the run's own strategy
    widths = [int(s.overrides[0].split("=")[1]) for s in settings if s.overrides[0].startswith("model.base_filters")]
    if cfg.model.norm == "group":
        assert all(w % cfg.model.groups == 0 for w in widths)


def test_the_largest_batch_is_suggested_not_just_one_that_fits():
    cfg = resolve_model_outputs(
        TrainConfig(
            data=DataConfig(layout="brats2021"),
            resolution=HALF,
            model=ModelConfig(depth=3, base_filters=8),
            trainer=TrainerConfig(batch_size=8),
        )
    )
    budget = 2_000_000_000
    batch = next(s for s in settings_that_fit(cfg, "CPU", budget) if s.overrides[0].startswith("trainer.batch_size"))
    b = int(batch.overrides[0].split("=")[1])
    assert 1 <= b < 8
    limit = batch.overrides[-1].split("=", 1)[1]
    bigger = dataclasses.replace(cfg, trainer=TrainerConfig(batch_size=b + 1), lms=LMSConfig(name="auto", limit=limit))
    with pytest.raises(PlanDoesNotFitError):  # one more does not fit, even with LMS
        plan_run(bigger, "CPU")


def test_the_message_has_the_numbers_and_the_settings():
    cfg = resolve_model_outputs(
        TrainConfig(
            data=DataConfig(layout="brats2021"),
            resolution=HALF,
            model=ModelConfig(depth=3, base_filters=16),
            trainer=TrainerConfig(batch_size=4),
        )
    )
    facts = MemoryFacts(
        available_bytes=4_346_000_000,
        available_note="memory cgroup /x: limit 5.00 GB",
        predicted_peak_bytes=4_567_000_000,
        plan_note="lms=off, lms.limit 20.00 GB",
        measured_peak_bytes=2_100_000_000,
        measured_note="at the failure",
    )
    err = out_of_memory_error(
        "out of memory in training epoch 3, step 2: ResourceExhaustedError: OOM",
        cfg,
        "CPU",
        facts,
        tail="The run folder keeps its last completed epoch (2).",
    )
    message = str(err)
    assert isinstance(err, OutOfMemoryError) and isinstance(err, RuntimeError) and "\n" not in message
    assert message.startswith("out of memory in training epoch 3, step 2: ResourceExhaustedError: OOM.")
    assert "The plan predicted a peak of 4.57 GB (lms=off, lms.limit 20.00 GB)" in message
    assert "Measured peak: 2.10 GB at the failure" in message
    assert "Memory available to the run: 4.35 GB (memory cgroup /x: limit 5.00 GB)" in message
    assert "Settings predicted to fit 4.34 GB (the 4.35 GB available)" in message  # 4.346 GB rounded down
    assert err.advice.settings
    for setting in err.advice.settings:
        assert f"`{setting}` ({format_gb(setting.predicted_peak_bytes)}" in message
    assert "`lms=auto lms.limit=4.34GB`" in message and "continue this run folder" in message
    assert message.endswith("The run folder keeps its last completed epoch (2).")


def test_the_advice_budget():
    mm = memory_model_for("CPU")
    # the plan did not fit the memory the run really had (a cgroup smaller than the RAM): that memory
    assert advice_budget(1_000_000_000, 3_000_000_000, None, mm)[0] == 1_000_000_000
    # memory ran out under a plan predicted to fit: plan below the plan's own prediction
    budget, why = advice_budget(10_000_000_000, 3_000_000_000, None, mm)
    assert budget == 3_000_000_000 and "the plan's own prediction" in why
    # ... less the share by which the measured peak exceeded it
    budget, why = advice_budget(10_000_000_000, 3_000_000_000, 3_600_000_000, mm)
    assert budget == 2_500_000_000 and "less the 20% by which the measured peak exceeded the plan" in why


def test_limits_are_rounded_down_and_read_back():
    for nbytes in (1, 999_999, 580_123_456, 1_000_000_000, 2_349_999_999, 123_456_789_012):
        text = format_limit(nbytes)
        assert 0 < parse_limit(text, None) <= max(nbytes, 1_000_000)
    assert format_limit(580_923_456) == "580MB" and format_limit(2_349_999_999) == "2.34GB"


def test_what_counts_as_out_of_memory():
    import tensorflow as tf

    assert is_out_of_memory(MemoryError())
    assert is_out_of_memory(tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor"))
    assert is_out_of_memory(tf.errors.UnknownError(None, None, "MemoryError: Unable to allocate 3.1 GiB"))
    assert is_out_of_memory(tf.errors.InternalError(None, None, "CUDA_ERROR_OUT_OF_MEMORY: out of memory"))
    assert not is_out_of_memory(tf.errors.InvalidArgumentError(None, None, "shapes do not match"))
    assert not is_out_of_memory(ValueError("this would run out of memory"))  # our own messages are not faults


# --- training: ResourceExhaustedError and MemoryError end in the message; the folder resumes ------


@pytest.fixture(scope="module")
def backend():
    from brats_seg.backend import configure, decide_backend

    return configure(decide_backend(BackendConfig(name="cpu_onednn")))


def _tiny(root, tmp_path, run_dir, epochs: int = 2) -> TrainConfig:
    return TrainConfig(
        data=data_config(root, "brats2021", tmp_path),
        resolution=dataclasses.replace(TINY),
        model=ModelConfig(depth=2, base_filters=8),
        trainer=TrainerConfig(epochs=epochs, batch_size=1, steps_per_epoch=1, seed=3),
        tracking=TrackingConfig(name="none"),
        run_dir=str(run_dir),
    )


class _RunOutOfMemory:
    """A Keras callback that raises ``error`` in the first step of ``epoch`` (1-based), reading the
    run folder's lock record just before."""

    def __new__(cls, *args, **kwargs):
        import keras

        class Callback(keras.callbacks.Callback):
            def __init__(self, error: BaseException, epoch: int, lock: Path):
                super().__init__()
                self.error, self.epoch, self.lock, self.current, self.record = error, epoch, lock, 0, None

            def on_epoch_begin(self, epoch, logs=None):
                self.current = epoch + 1

            def on_train_batch_end(self, batch, logs=None):
                if self.current == self.epoch:
                    self.record = json.loads(self.lock.read_text())
                    raise self.error

        return Callback(*args, **kwargs)


def _stale_lock(run_dir: Path, memory: dict) -> None:
    """A lock left by a dead process of this host (a PID that is not running, or not since then)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (run_dir / ".lock").write_text(
        json.dumps(
            {
                "pid": int(dead.stdout),
                "pid_start": 1.0,
                "host": socket.gethostname(),
                "since": "2026-11-25 01:00:00",
                "command": "train.py run_dir=run",
                "memory": memory,
            }
        )
    )


def _fake_cgroup(folder: Path, oom_kill: int, limit_bytes: int = 1_500_000_000, usage_bytes: int = 400_000_000) -> Path:
    """A folder with a v1 memory cgroup's files."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "memory.oom_control").write_text(f"oom_kill_disable 0\nunder_oom 0\noom_kill {oom_kill}\n")
    (folder / "memory.limit_in_bytes").write_text(f"{limit_bytes}\n")
    (folder / "memory.usage_in_bytes").write_text(f"{usage_bytes}\n")
    (folder / "memory.stat").write_text(f"total_inactive_file 0\nhierarchical_memory_limit {limit_bytes}\n")
    return folder


def _dead_record(
    cgroup: Path | None, oom_kill: int | None, vmstat: int | None, boot_id: str | None, stage: str = "training"
) -> dict:
    """What a run that died in epoch 2 left in its lock (as MemoryWatch writes it)."""
    cg = (
        None
        if cgroup is None
        else {
            "version": 1,
            "path": str(cgroup),
            "limit_bytes": 1_500_000_000,
            "usage_bytes": 300_000_000,
            "oom_kill": oom_kill,
        }
    )
    start = {
        "available_bytes": 20_000_000_000,
        "total_bytes": 24_000_000_000,
        "cgroup": cg,
        "vmstat_oom_kill": vmstat,
        "boot_id": boot_id,
    }
    before = {**start, "cgroup": None if cg is None else {**cg, "usage_bytes": 400_000_000}}
    return {
        "device": "CPU",
        "stage": stage,
        "start": start,
        "before_model": before,
        "baseline_bytes": 600_000_000,
        "predicted_peak_bytes": 1_800_000_000,
        "limit_bytes": 21_000_000_000,
        "strategy": "off",
        "epoch": 2,
        "epochs_done": 1,
        "measured_peak_bytes": 1_200_000_000,
        "measured_epoch": 1,
    }


def _vmstat_oom_kills() -> int | None:
    for line in Path("/proc/vmstat").read_text().splitlines():
        if line.startswith("oom_kill "):
            return int(line.split()[1])
    return None


def _boot_id() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def _half_cfg(tmp_path) -> TrainConfig:
    return resolve_model_outputs(
        TrainConfig(
            data=DataConfig(layout="brats2021"),
            resolution=HALF,
            model=ModelConfig(depth=3, base_filters=16),
            trainer=TrainerConfig(batch_size=2),
            run_dir=str(tmp_path / "run"),
        )
    )


@pytest.mark.parametrize("case", ["cgroup counter rose", "no kill counted", "cannot tell", "machine restarted"])
def test_the_next_start_tells_why_the_previous_run_died(tmp_path, caplog, case):
    """A fabricated lock of a dead process, its counters below (or at) today's: the takeover logs
    the diagnosis, the memory facts and, where memory may be why, the settings predicted to fit."""
    from brats_seg.locks import hold_lock
    from brats_seg.training.oom import warn_about_dead_run

    vmstat = _vmstat_oom_kills()
    cgroup = _fake_cgroup(tmp_path / "cg", oom_kill=3)  # three OOM kills in it now
    record = {
        "cgroup counter rose": _dead_record(cgroup, 1, None, _boot_id()),
        "no kill counted": _dead_record(cgroup, 3, vmstat, _boot_id()),
        "cannot tell": _dead_record(None, None, None, None),
        "machine restarted": _dead_record(cgroup, 1, vmstat, "another-boot"),
    }[case]
    if case == "no kill counted" and vmstat is None:
        pytest.skip("this kernel has no oom_kill counter in /proc/vmstat")
    run_dir = tmp_path / "run"
    _stale_lock(run_dir, record)
    cfg = _half_cfg(tmp_path)
    with caplog.at_level(logging.WARNING, logger="brats_seg.training.oom"):
        with hold_lock(run_dir, "run folder", on_takeover=warn_about_dead_run(cfg, "CPU", run_dir)):
            pass
    text = " ".join(r.getMessage() for r in caplog.records if r.name == "brats_seg.training.oom")
    assert text.startswith(f"run folder {run_dir}: the previous run (PID ") and "\n" not in text
    assert "in training epoch 2" in text and text.endswith("Resuming from its last saved epoch (1).")
    assert "The plan predicted a peak of 1.80 GB (lms=off, lms.limit 21.00 GB)" in text
    assert "Measured peak: 1.20 GB in epoch 1" in text
    if case == "cgroup counter rose":
        assert (
            f"was killed by the kernel's out-of-memory killer (memory cgroup {cgroup}, limit 1.50 GB: "
            "oom_kill 1 -> 3 since it started)" in text
        )
        # the room the cgroup left above the runtime: limit less the working set before the model
        assert f"Memory available to the run: 1.10 GB (memory cgroup {cgroup}: limit 1.50 GB" in text
        assert "Settings predicted to fit 1.10 GB (the 1.10 GB available): `" in text
    elif case == "no kill counted":
        assert "not by the kernel's out-of-memory killer" in text and "Settings predicted" not in text
    elif case == "cannot tell":
        assert "ended without saving (killed: SIGKILL, out of memory, or a power loss" in text
        assert "Memory available to the run: 20.00 GB (RAM available" in text and "Settings predicted to fit" in text
    else:
        assert "ended when the machine restarted" in text and "Settings predicted" not in text


def test_the_settings_in_a_diagnosis_plan_under_the_memory_the_dead_run_had(tmp_path):
    from brats_seg.oom import takeover_message

    cgroup = _fake_cgroup(tmp_path / "cg", oom_kill=2)
    message = takeover_message(
        {"pid": 1, "since": "x", "memory": _dead_record(cgroup, 1, None, _boot_id())}, _half_cfg(tmp_path), "CPU"
    )
    suggested = message.split("`")[1::2]  # each setting is quoted: `key=value lms.limit=...`
    assert suggested, message
    for typed in suggested:
        fixed = _compose(
            ["resolution=half", "model.depth=3", "model.base_filters=16", "trainer.batch_size=2", *typed.split()]
        )
        plan = plan_run(fixed, "CPU")
        assert plan.fits and plan.limit_bytes <= 1_100_000_000


@pytest.mark.parametrize("error", ["ResourceExhaustedError", "MemoryError"])
def test_training_out_of_memory_ends_in_the_numbers_and_resumes(
    synthetic_root, tmp_path, backend, monkeypatch, caplog, error
):
    """The error injected in a training step (epoch 2 after a saved epoch 1; or epoch 1) ends in
    OutOfMemoryError with the plan's peak (plan.json), the measured one, the memory available and
    settings that fit; the tracked run ends FAILED, the lock is released, and the same call resumes
    and trains to the end. The MemoryError run starts over a dead run's lock: its diagnosis is logged."""
    import tensorflow as tf

    import brats_seg.training.loop as loop

    statuses = []
    end_tracking = loop.end_tracking
    monkeypatch.setattr(loop, "end_tracking", lambda *a: (statuses.append(a[-1]), end_tracking(*a)))
    run_dir = tmp_path / "run"
    root = synthetic_root["brats2021"]
    if error == "MemoryError":
        exc, epoch = MemoryError(), 1
        _stale_lock(run_dir, _dead_record(_fake_cgroup(tmp_path / "cg", oom_kill=1), 0, None, _boot_id(), "starting"))
    else:
        exc, epoch = (
            tf.errors.ResourceExhaustedError(
                None,
                None,
                "OOM when allocating tensor with shape[1,8,48,56,40]\nHint: If you want to see a list of allocated",
            ),
            2,
        )
    injector = _RunOutOfMemory(exc, epoch, run_dir / ".lock")
    with caplog.at_level(logging.WARNING, logger="brats_seg.training.oom"):
        with pytest.raises(OutOfMemoryError) as err:
            loop.train(_tiny(root, tmp_path, run_dir), extra_callbacks=[injector])
    message = str(err.value)
    plan = json.loads((run_dir / "plan.json").read_text())
    assert message.startswith(f"out of memory in training epoch {epoch}, step 1: {error}") and "\n" not in message
    assert f"The plan predicted a peak of {format_gb(plan['predicted_peak_bytes'])} (lms=off, lms.limit " in message
    assert "Measured peak: " in message and "Memory available to the run: " in message
    assert "Settings predicted to fit " in message
    for setting in err.value.advice.settings:  # each plans under the budget it was given
        assert setting.predicted_peak_bytes <= err.value.advice.budget_bytes
    assert statuses == ["FAILED"] and not (run_dir / ".lock").exists()
    record = injector.record["memory"]  # what the lock carried at the failure
    assert record["predicted_peak_bytes"] == plan["predicted_peak_bytes"] and record["epoch"] == epoch
    assert record["stage"] == "training" and record["start"]["boot_id"] and record["baseline_bytes"] > 0
    assert injector.record["pid"] == os.getpid()
    if error == "MemoryError":
        assert "No epoch was completed, so nothing was saved to resume from." in message
        assert "killed by the kernel's out-of-memory killer" in caplog.text and "while starting" in caplog.text
    else:
        # epoch 1's peak, as its history row recorded it (above the runtime's baseline: about 0 for this tiny
        # model in a long pytest process whose allocator already holds the pages; -160 KB was seen)
        first = json.loads((run_dir / "state.json").read_text())["history"][0]
        assert record["measured_epoch"] == 1 and record["measured_peak_bytes"] == int(first["measured_bytes"])
        assert "The run folder keeps its last completed epoch (1): the same command resumes it." in message
    assert loop.train(_tiny(root, tmp_path, run_dir)).epochs_done == 2
    assert statuses[-1] == "FINISHED"


# --- inference -------------------------------------------------------------------------------------


@pytest.mark.parametrize("native_bf16", [False, True])
def test_inference_out_of_memory_carries_the_estimate_and_what_lowers_it(monkeypatch, native_bf16):
    import tensorflow as tf

    import brats_seg.cpu
    from brats_seg.lms.planner.inference import estimate_inference
    from brats_seg.lms.planner.workload import Workload
    from brats_seg.lms.runtime.stats import current_rss_bytes
    from brats_seg.oom_inference import InferenceOutOfMemoryError, inference_memory_guard
    from brats_seg.run_dir import RunError

    monkeypatch.setattr(brats_seg.cpu, "has_native_bf16", lambda *a: native_bf16)
    run = resolve_model_outputs(
        TrainConfig(data=DataConfig(layout="brats2021"), resolution=HALF, model=ModelConfig(depth=3, base_filters=32))
    )
    workload, mm = Workload.from_config(run), memory_model_for("CPU")
    # on CPU scoring comes on top of the resident forward pass: its peak, which mirroring and bf16 lower
    expected = estimate_inference(workload, mm, mirror=True)
    bf16 = estimate_inference(dataclasses.replace(workload, policy="mixed_bfloat16"), mm, mirror=True)
    assert expected.peak_at == "scoring" and bf16.peak_bytes < expected.peak_bytes
    for injected in (MemoryError(), tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor")):
        with pytest.raises(InferenceOutOfMemoryError) as err:
            with inference_memory_guard(run, EvaluateConfig(), "CPU", "float32", baseline_bytes=current_rss_bytes()):
                raise injected
        message = str(err.value)
        assert isinstance(err.value, RunError) and "\n" not in message  # a user error, one paragraph
        assert message.startswith(f"out of memory evaluating a case: {type(injected).__name__}")
        assert f"96x112x80 (float32, mirrored) was predicted to need {format_gb(expected.peak_bytes)}" in message
        assert "at its scoring step" in message and err.value.estimate == expected
        assert "Measured peak: " in message and "Memory available: " in message
        assert "evaluate.mirror=false (" in message
        # bf16 only where the CPU computes it natively
        assert (
            f"backend.precision=bf16 on a CPU with native bf16 ({format_gb(bf16.peak_bytes)})" in message
        ) == native_bf16
    # predicting from files on a large native grid (0.5 mm): the next case's preprocessing is the peak
    records = [{"resampled_shape": [90, 110, 78], "native_shape": [480, 480, 310], "preparation_bytes": 3 * 10**9}]
    with pytest.raises(InferenceOutOfMemoryError) as err:
        with inference_memory_guard(run, EvaluateConfig(), "CPU", "float32", records, scoring=False):
            raise MemoryError()
    assert str(err.value).startswith("out of memory predicting a case") and "at its preprocessing step" in str(
        err.value
    )
    with pytest.raises(ValueError, match="not memory"):  # anything else passes unchanged
        with inference_memory_guard(run, EvaluateConfig(), "CPU", "float32"):
            raise ValueError("not memory")


_PHASES_SCRIPT = r"""
import json, mmap, sys
from pathlib import Path

import numpy as np

from brats_seg.lms.runtime.stats import (
    MemoryStatsCallback, current_file_rss_bytes, current_rss_bytes, reset_peak_rss,
)

mb = 2**20
if not reset_peak_rss() or current_file_rss_bytes() is None:
    print(json.dumps({"unsupported": True}))
    sys.exit(0)
data = Path(sys.argv[1])
data.write_bytes(b"\1" * (64 * mb))
stats = MemoryStatsCallback("CPU", baseline_bytes=current_rss_bytes(), baseline_file_bytes=current_file_rss_bytes())
stats.on_epoch_begin(0)
train = np.ones(300 * mb, np.uint8)  # the training steps' peak: 300 MB
del train
stats.on_test_begin()
val = np.ones(120 * mb, np.uint8)  # the validation pass's: 120 MB, below the training peak
del val
with data.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
    assert sum(mapped[i] for i in range(0, len(mapped), 4096)) == 64 * mb // 4096  # every page read
    first: dict = {}
    stats.on_epoch_end(0, first)
stats.on_epoch_begin(1)  # an epoch without validation
second: dict = {}
stats.on_epoch_end(1, second)
print(json.dumps({"first": first, "second": second, "baseline": stats.baseline_bytes}))
"""


def test_the_epochs_memory_is_split_into_the_training_steps_and_the_validation_pass(tmp_path):
    """history.csv's train_measured_bytes and val_measured_bytes are each phase's own peak above the
    runtime, measured_bytes the larger; file_bytes the mapped files' resident pages above the runtime's.

    The phases run in a fresh interpreter: the RSS peak is the whole process's, and threads an earlier
    test left in this pytest worker (tf.data, MLflow) allocate into it (CI once read 383 MB for the
    120 MB validation pass)."""
    from tests.conftest import skip_outside_ci

    done = subprocess.run(
        [sys.executable, "-c", _PHASES_SCRIPT, str(tmp_path / "mapped.bin")],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    if out.get("unsupported"):  # Linux >= 4.5 has both; CI must run it
        skip_outside_ci("this kernel lets a process not reset its peak RSS or not read RssFile (/proc/self)")
    mb = 2**20
    logs, later = out["first"], out["second"]
    assert 280 * mb < logs["train_measured_bytes"] < 400 * mb
    assert 100 * mb < logs["val_measured_bytes"] < 250 * mb  # not the training peak: reset between them
    assert logs["measured_bytes"] == logs["train_measured_bytes"]
    assert logs["peak_bytes"] == logs["measured_bytes"] + out["baseline"]
    assert 60 * mb < logs["file_bytes"] < 200 * mb  # the mapped file's pages
    # an epoch without validation: its training peak is the epoch's
    assert "val_measured_bytes" not in later and later["train_measured_bytes"] == later["measured_bytes"]
