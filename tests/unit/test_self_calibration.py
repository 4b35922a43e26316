"""A CPU the presets do not know, calibrated on the user's machine (issue 47): the cached calibration is
read before the presets, lms.calibrate decides when to measure, the plan says which model priced it,
and (slow) a real short sweep measures, fits and caches one."""

from __future__ import annotations

import dataclasses
import json

import pytest

from brats_seg.benchmark import self_calibration
from brats_seg.config import LMSConfig, ModelConfig, ResolutionConfig, TrainConfig
from brats_seg.lms.planner import step_time
from brats_seg.lms.planner.search import plan_lms
from brats_seg.lms.planner.step_time import cpu_time_model, user_calibration_path
from brats_seg.lms.planner.workload import LMSOptions, Workload
from tests.unit.test_step_time import _net, _preset

FIT = {
    "float32": {"per_flop_s": 1 / 50e9, "per_byte_s": 1 / 5e9, "per_step_s": 0.05},
    "bfloat16": {"per_flop_s": 1 / 90e9, "per_byte_s": 1 / 5e9, "per_step_s": 0.05},
}


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("BRATS_SEG_CACHE_DIR", str(tmp_path / "cache"))
    cpu_time_model.cache_clear()
    yield tmp_path / "cache"
    cpu_time_model.cache_clear()


def _cache_entry(cpu: str, fit=FIT) -> None:
    path = user_calibration_path(cpu)
    path.parent.mkdir(parents=True, exist_ok=True)
    summary = {"leave_one_out": "12 points, error -9.0% to +8.0%, median |error| 4.0%"}
    path.write_text(json.dumps({"cpu_id": cpu, "block": 16, "fit": fit, "date": "2026-11-28", "summary": summary}))


def test_the_cached_calibration_is_per_cpu_id_in_the_users_cache(cache, monkeypatch):
    assert (
        user_calibration_path("GenuineIntel family 6 model 85")
        == cache / "step_time" / "GenuineIntel_family_6_model_85.json"
    )
    monkeypatch.delenv("BRATS_SEG_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache / "xdg"))
    assert user_calibration_path("x y") == cache / "xdg" / "brats_seg" / "step_time" / "x_y.json"


def test_a_cpu_calibrated_here_is_priced_by_its_own_fit_not_the_stand_in(cache, tmp_path):
    presets = _preset(tmp_path)  # knows "CPU A" only
    before = cpu_time_model("CPU B", "avx512", presets)
    assert not before.calibrated and before.source == "uncalibrated"
    _cache_entry("CPU B")
    cpu_time_model.cache_clear()
    after = cpu_time_model("CPU B", "avx512", presets)
    assert after.calibrated and after.source.startswith("calibrated here (") and "CPU_B.json" in after.source
    assert after.held_out.startswith("12 points")
    net = _net(16)
    own = step_time.TimeCoefficients(**FIT["float32"])
    assert after.step_s(net) == pytest.approx(
        own.seconds(step_time.step_features(net, 16)["padded_flops"], step_time.step_features(net, 16)["bytes"])
    )
    # this machine's measurement comes before a preset of the same CPU
    _cache_entry("CPU A")
    cpu_time_model.cache_clear()
    assert cpu_time_model("CPU A", "avx512", presets).source.startswith("calibrated here")


def test_a_cached_file_of_another_cpu_or_not_a_calibration_is_ignored_with_a_warning(cache, tmp_path, caplog):
    _cache_entry("CPU Z")
    path = user_calibration_path("CPU B")
    path.write_text(user_calibration_path("CPU Z").read_text())  # another CPU's entry under B's name
    assert step_time.read_user_calibration("CPU B") is None
    path.write_text("{not json")
    assert step_time.read_user_calibration("CPU B") is None
    assert "is not a step-time calibration of this CPU" in caplog.text
    assert not cpu_time_model("CPU B", "avx512", _preset(tmp_path)).calibrated


def test_the_plan_says_which_step_time_model_priced_it(cache, tmp_path):
    _cache_entry("CPU B")
    cpu_time_model.cache_clear()
    model = cpu_time_model("CPU B", "avx512", _preset(tmp_path))
    workload = Workload(ModelConfig(depth=3, base_filters=8, out_channels=3), (96, 96, 64), 1, "fp32")
    plan = plan_lms(workload, LMSOptions(limit_bytes=10**12, strategy="off", allow_offload=False, time_model=model))
    assert plan.step_time_source == model.source and plan.step_time_calibrated
    assert f"step-time model: {model.source}" in plan.format_table()
    stand_in = cpu_time_model("CPU C", "avx512", _preset(tmp_path))
    plan = plan_lms(workload, LMSOptions(limit_bytes=10**12, strategy="off", allow_offload=False, time_model=stand_in))
    assert plan.step_time_source == "uncalibrated" and "lms.calibrate=now measures one" in plan.format_table()


def _conf(resolution: str, calibrate: str) -> TrainConfig:
    shapes = {"tiny": [48, 56, 40], "full": [192, 224, 160]}
    return TrainConfig(
        resolution=ResolutionConfig(name=resolution, spacing_mm=1.0, shape=shapes[resolution]),
        model=ModelConfig(depth=3 if resolution == "tiny" else 4, base_filters=16),
        lms=LMSConfig(calibrate=calibrate),
    )


@pytest.mark.parametrize(
    "calibrated,resolution,mode,env,device,measures",
    [
        (False, "full", "auto", "", "CPU", True),  # first use, seconds a step: measured
        (False, "tiny", "auto", "", "CPU", False),  # a tiny step: not worth minutes
        (True, "full", "auto", "", "CPU", False),  # a preset or a cached calibration: used
        (False, "full", "never", "", "CPU", False),
        (False, "full", "auto", "never", "CPU", False),  # BRATS_SEG_CALIBRATE=never (CI, the tests)
        (True, "full", "now", "never", "CPU", True),  # asked for: measured again
        (False, "full", "auto", "", "GPU", False),  # a GPU is priced by lms.device_tflops
    ],
)
def test_lms_calibrate_decides_when_this_cpu_is_measured(
    monkeypatch, tmp_path, calibrated, resolution, mode, env, device, measures
):
    presets = _preset(tmp_path)
    model = cpu_time_model("CPU A" if calibrated else "CPU B", "avx512", presets)
    monkeypatch.setattr(step_time, "cpu_time_model", lambda *a, **k: model)
    monkeypatch.setenv("BRATS_SEG_CALIBRATE", env)
    calls = []
    monkeypatch.setattr(self_calibration, "calibrate_here", lambda progress=True: calls.append(1) or {"fit": {}})
    result = self_calibration.ensure_calibrated(_conf(resolution, mode), device)
    assert bool(calls) == measures and (result is not None) == measures


def test_an_unknown_calibrate_value_is_refused_in_one_error_line_naming_the_choices():
    import subprocess
    import sys

    from tests.unit.test_evaluate import ROOT

    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "plan_memory.py"), "lms.calibrate=sometimes"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr[-2000:]
    assert "lms.calibrate" in errors[0] and "auto" in errors[0] and "never" in errors[0], errors[0]


@pytest.mark.slow
def test_a_short_sweep_measures_fits_and_caches_this_cpu(cache):
    """Four half-resolution widths measured in fresh benchmark processes (fp32; a CPU with native
    bf16 adds them in bf16), fitted, cached for this CPU and read by the planner from then on. One
    draw each, the default: the rounds and their medians are the test above's."""
    points = (("half", 4), ("half", 8), ("half", 12), ("half", 16))
    entry = self_calibration.calibrate_here(progress=False, points=points, draws=1)
    from brats_seg.cpu import cpu_id

    assert entry["cpu_id"] == cpu_id() and not entry["failed"]
    assert len(entry["fitted_points"]) == len(entry["points"]) and "float32" in entry["fit"]
    assert entry["draws"] == 1 and all(len(v) == 1 and min(v) > 0 for v in entry["draws_s"].values())
    assert all(row["measured_s"] > 0 and row["predicted_s"] > 0 for row in entry["fitted_points"])
    assert entry["leave_one_out"] and entry["summary"]["held_out"].endswith("(leave-one-out)")
    assert entry["seconds"] > 0 and entry["memory_preset"]["cpu_kind"]
    model = cpu_time_model()
    assert model.calibrated and model.source.startswith("calibrated here")
    cfg = dataclasses.replace(_conf("full", "auto"))
    assert self_calibration.ensure_calibrated(cfg, "CPU") is None  # cached: not measured again


def test_each_quick_point_is_measured_in_rounds_and_fitted_on_its_median(cache, monkeypatch, tmp_path):
    """Three draws round robin (every point once before any twice); the fit sees each point's median
    draw, so one slow round (a busy machine) does not move it; a draw that failed leaves the others."""
    from brats_seg.benchmark import step_time_fit, sweep

    calls, fitted = [], []

    def measure(cmd, cwd):
        point = tuple(a.split("=", 1)[1] for a in cmd if a.startswith(("resolution=", "model.base_filters=")))
        calls.append(point)
        draw = sum(1 for c in calls if c == point)
        if point == ("half", "8") and draw == 3:
            return "error: out of memory"
        step = {1: 1.0, 2: 1.6, 3: 0.9}[draw] * int(point[1])  # round 2 is 60% slow throughout
        return {"strategy": "off", "step_s": step, "precision": "fp32", "point": point}

    def fit(paths, held):
        records = [json.loads(line) for line in open(paths[0])]
        fitted.extend(records)
        rows = [{"point": " ".join(r["point"]), "measured_s": r["step_s"]} for r in records]
        return {"fitted_points": rows, "leave_one_out": rows, "held_out": [], "summary": {"leave_one_out": "ok"}}

    monkeypatch.setattr(sweep, "measure_point", measure)
    monkeypatch.setattr(step_time_fit, "calibrate", fit)
    monkeypatch.setattr(self_calibration, "_precisions", lambda: ["fp32"])
    points = (("half", 4), ("half", 8), ("full", 4))
    entry = self_calibration.calibrate_here(progress=False, points=points, out=tmp_path / "c.json", draws=3)
    assert calls == [("half", "4"), ("half", "8"), ("full", "4")] * 3  # round robin
    steps = {tuple(r["point"]): r["step_s"] for r in fitted}
    assert steps == {("half", "4"): 4.0, ("half", "8"): 8.0 * 1.6, ("full", "4"): 4.0}  # medians; 2 draws: the upper
    assert entry["draws"] == 3 and entry["draws_s"]["half 8 filters fp32"] == [8.0, 12.8]
    assert entry["draws_apart"] == pytest.approx(1.6 / 0.9 - 1, abs=1e-4)  # the slow round against the fast one
    assert entry["failed"] == ["half 8 filters fp32 (draw 3): error: out of memory"]
    assert json.loads((tmp_path / "c.json").read_text())["draws_s"] == entry["draws_s"]
    with pytest.raises(ValueError, match="draws=0"):
        self_calibration.calibrate_here(progress=False, points=points, out=tmp_path / "d.json", draws=0)
