"""LMS wired into training: the real U-Net's gradients, pre-flight, CPU rules, plan_memory.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from brats_seg.config import BackendConfig, LMSConfig, ModelConfig, ResolutionConfig, TrainConfig, TrainerConfig

REPO = Path(__file__).resolve().parents[2]
SMALL = ResolutionConfig(name="small", spacing_mm=4.0, shape=[16, 16, 8])


@pytest.fixture(scope="module")
def backend():
    from brats_seg.backend import configure, decide_backend

    return configure(decide_backend(BackendConfig(name="cpu_onednn")))


def _cfg(strategy: str) -> TrainConfig:
    from brats_seg.data.labels import resolve_model_outputs

    return resolve_model_outputs(
        TrainConfig(
            resolution=SMALL,
            model=ModelConfig(depth=2, base_filters=4),
            trainer=TrainerConfig(batch_size=2),
            lms=LMSConfig(name=strategy, limit="1e12", size=0),
        )
    )


def _resolved(cfg: TrainConfig, tmp_path, name: str = "cpu_onednn", gpus: int = 0, **backend):
    """``cfg`` resolved for training into a fresh ``run_dir`` on a backend ``name`` with ``gpus``
    visible: where the LMS strategy is decided and planned."""
    from brats_seg.resolve import resolve_run

    cfg.backend = BackendConfig(name=name, **backend)
    cfg.run_dir = str(tmp_path / f"run-{name}-{gpus}")
    return resolve_run(cfg, gpus=gpus)


def _gradients(strategy, backend):
    import keras
    import tensorflow as tf

    from brats_seg.lms.planner.preflight import plan_run
    from brats_seg.training.build import build_models
    from brats_seg.training.losses import SoftDiceBCELoss

    cfg = _cfg(strategy)
    plan = plan_run(cfg, "GPU" if strategy == "offload" else "CPU", strategy)  # offload plans need a GPU budget
    keras.utils.set_random_seed(0)
    model, export_model, _ = build_models(cfg, plan, backend)
    rng = np.random.default_rng(1)
    x = tf.constant(rng.standard_normal((2, 16, 16, 8, 4)), tf.float32)
    y = tf.constant(rng.random((2, 16, 16, 8, 3)) < 0.2, tf.float32)
    loss_fn = SoftDiceBCELoss()

    @tf.function(jit_compile=False)
    def step():
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        return loss, tape.gradient(loss, model.trainable_variables)

    loss, grads = step()
    names = [v.path for v in model.trainable_variables]
    assert [v.path for v in export_model.trainable_variables] == sorted(names, key=names.index)
    return float(loss), {n: g.numpy() for n, g in zip(names, grads)}, plan


@pytest.mark.parametrize("strategy", ["recompute", "offload"])
def test_real_unet_gradients_agree_with_keep(strategy, backend):
    loss_keep, g_keep, _ = _gradients("off", backend)
    loss_lms, g_lms, plan = _gradients(strategy, backend)
    assert any(p != "keep" for p in plan.policies.values())
    assert abs(loss_keep - loss_lms) < 1e-6
    assert set(g_keep) == set(g_lms)
    for name in g_keep:
        np.testing.assert_allclose(g_lms[name], g_keep[name], rtol=1e-5, atol=1e-7, err_msg=name)


def test_lms_checkpoint_loads_into_plain_model(backend, tmp_path):
    """The export twin shares the LMS model's weights and saves as .keras; evaluation loads it."""
    from brats_seg.lms.planner.preflight import plan_run
    from brats_seg.model.unet3d import build_unet3d
    from brats_seg.training.build import build_models

    cfg = _cfg("recompute")
    model, export_model, _ = build_models(cfg, plan_run(cfg, "CPU"), backend)
    assert model is not export_model
    model.trainable_variables[0].assign(model.trainable_variables[0] + 1.0)  # train the LMS model...
    export_model.save(tmp_path / "best.keras")  # ...save its twin
    plain = build_unet3d(cfg.model, tuple(cfg.resolution.shape))
    plain.load_weights(tmp_path / "best.keras")
    for a, b in zip(plain.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_run_predicted_not_to_fit_fails_before_building(tmp_path):
    cfg = _cfg("off")
    cfg.resolution = ResolutionConfig(name="full", spacing_mm=1.0, shape=[192, 224, 160])
    cfg.model = ModelConfig(depth=4, base_filters=16)
    cfg.lms.limit = "2GB"
    with pytest.raises(ValueError) as err:
        _resolved(cfg, tmp_path)
    msg = str(err.value)
    assert "2.00 GB" in msg and "lms=recompute" in msg and "resolution" in msg
    assert not (tmp_path / "run-cpu_onednn-0").exists()  # nothing written


def test_offload_on_cpu_is_refused_with_the_reason(tmp_path):
    with pytest.raises(ValueError, match="no separate device memory"):
        _resolved(_cfg("offload"), tmp_path)


def test_the_backend_and_lms_are_decided_in_one_place_with_the_reason(tmp_path, caplog):
    """resolve_run decides both: as configured on CPU; gpu_lms with lms=off plans (auto); a GPU
    that backend=auto chose, on which the plan without LMS does not fit, becomes gpu_lms with auto."""
    import logging

    with caplog.at_level(logging.INFO, logger="brats_seg.resolve"):
        cpu = _resolved(_cfg("off"), tmp_path)
    assert (cpu.backend.name, cpu.lms, cpu.plan.strategy) == ("cpu_onednn", "off", "off")
    assert "lms=off as configured" in cpu.reason and cpu.reason in caplog.text

    lms = _resolved(_cfg("off"), tmp_path, "gpu_lms", gpus=1, gpu_memory_limit_mb=8000)  # a GPU's size
    assert (lms.backend.name, lms.lms, lms.plan.strategy) == ("gpu_lms", "auto", "auto")
    assert "backend=gpu_lms with lms=off" in lms.reason

    full = _cfg("off")
    full.resolution = ResolutionConfig(name="full", spacing_mm=1.0, shape=[192, 224, 160])
    full.model = ModelConfig(depth=4, base_filters=16)
    full.trainer.batch_size = 1
    full.lms.limit = "7.5GB"  # off needs over 8 GB at full resolution; recomputing blocks fits
    chosen = _resolved(full, tmp_path, "auto", gpus=1, gpu_memory_limit_mb=16000)
    assert (chosen.backend.name, chosen.lms) == ("gpu_lms", "auto")
    assert "the plan without LMS does not fit" in chosen.reason and chosen.plan.predicted_peak_bytes < 7.5e9
    with pytest.raises(ValueError, match="strategy off predicts.*lms=auto"):  # backend=gpu asked: no silent change
        _resolved(full, tmp_path, "gpu", gpus=1, gpu_memory_limit_mb=16000)


def test_xla_is_decided_with_the_backend_and_applied_before_tensorflow_loads(tmp_path, monkeypatch):
    """backend.xla=true gets XLA on the GPU backend=auto chooses (it tested the raw name, so auto never
    did), not where the plan recomputes or offloads blocks (XLA drops their host placements), and never
    on a CPU; configure_environment sets TensorFlow's switch from the decision alone."""
    from brats_seg.backend import configure_environment

    fits = _resolved(_cfg("off"), tmp_path, "auto", gpus=1, gpu_memory_limit_mb=16000, xla=True)
    assert (fits.backend.name, fits.backend.xla) == ("gpu", True)
    full = _cfg("off")
    full.resolution = ResolutionConfig(name="full", spacing_mm=1.0, shape=[192, 224, 160])
    full.model = ModelConfig(depth=4, base_filters=16)
    full.trainer.batch_size, full.lms.limit = 1, "7.5GB"
    lms = _resolved(full, tmp_path, "auto", gpus=1, gpu_memory_limit_mb=16000, xla=True)
    assert (lms.backend.name, lms.backend.xla) == ("gpu_lms", False)
    recompute = _resolved(_cfg("recompute"), tmp_path, "gpu", gpus=1, gpu_memory_limit_mb=16000, xla=True)
    assert any(p != "keep" for p in recompute.plan.policies.values()) and not recompute.backend.xla
    assert not _resolved(_cfg("off"), tmp_path, "auto", gpus=0, xla=True).backend.xla

    monkeypatch.delitem(sys.modules, "tensorflow", raising=False)  # as an entry point before the import
    for key in ("TF_XLA_FLAGS", "CUDA_VISIBLE_DEVICES"):
        monkeypatch.delenv(key, raising=False)
    configure_environment(fits.backend)
    assert os.environ.get("TF_XLA_FLAGS") == "--tf_xla_auto_jit=2"
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
    monkeypatch.delenv("TF_XLA_FLAGS")
    configure_environment(lms.backend)
    assert "TF_XLA_FLAGS" not in os.environ


def test_a_backend_without_its_gpu_is_refused_where_decided_and_where_applied(backend):
    from brats_seg.backend import BackendError, configure, decide_backend

    with pytest.raises(BackendError, match="backend=cpu_onednn"):
        decide_backend(BackendConfig(name="gpu_lms"), 0)
    # nvidia-smi's word (a GPU) against TensorFlow's (none here): configure checks they agree
    with pytest.raises(BackendError, match="TensorFlow sees none"):
        configure(decide_backend(BackendConfig(name="gpu"), 1))


def _plan_memory(*args):
    return subprocess.run(
        [sys.executable, str(REPO / "scripts" / "plan_memory.py"), "backend=cpu_onednn", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )


def test_plan_memory_json_and_table():
    out = _plan_memory("resolution=full", "lms.limit=16GB", "trainer.batch_size=1", "plan.format=json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout.strip().splitlines()[-1])
    assert data["limit_bytes"] == 16 * 10**9
    assert set(data["strategies"]) == {"off", "recompute", "offload", "auto"}
    for name in ("off", "recompute", "auto"):
        assert {"predicted_peak_bytes", "recomputed_flops", "moved_bytes"} <= set(data["strategies"][name])
    assert data["strategies"]["recompute"]["predicted_peak_bytes"] < data["strategies"]["off"]["predicted_peak_bytes"]
    assert next(row["block"] for row in data["plan"]) == "enc0" and "policy" in data["plan"][0]
    table = _plan_memory("resolution=full", "lms.limit=16GB", "trainer.batch_size=1")
    assert table.returncode == 0 and "dec0" in table.stdout and "recompute" in table.stdout


def test_plan_memory_says_what_would_fit():
    out = _plan_memory("resolution=2x", "lms=recompute", "lms.limit=16GB", "trainer.batch_size=1")
    assert out.returncode == 1
    assert "does not fit" in out.stdout and "full 192x224x160" in out.stdout


def test_plan_memory_finds_the_largest_input_per_strategy():
    out = _plan_memory(
        "resolution=full",
        "model.depth=4",
        "trainer.batch_size=1",
        "lms.limit=8GB",
        "plan.find=max_input",
        "plan.format=json",
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout.strip().splitlines()[-1])
    s = data["strategies"]
    assert data["limit_bytes"] == 8 * 10**9 and set(s) == {"off", "recompute", "auto"}
    # A plan leaves the preset's margin free: the budget is below the limit, every answer within it.
    assert 0.5 * 8 * 10**9 < data["budget_bytes"] < 8 * 10**9
    assert all(
        v["predicted_peak_bytes"] <= data["budget_bytes"] and all(d % 16 == 0 for d in v["input_shape"])
        for v in s.values()
    )
    assert data["auto_over_off_voxels_per_step"] == pytest.approx(s["auto"]["voxels"] / s["off"]["voxels"], rel=1e-3)
    table = _plan_memory("resolution=half", "model.depth=4", "lms.limit=8GB", "plan.find=max_batch")
    assert table.returncode == 0 and "largest batch" in table.stdout and "auto trains" in table.stdout
    table = _plan_memory("resolution=full", "model.depth=4", "lms.limit=9.5GB", "plan.find=max_batch")
    assert table.returncode == 0 and "off fits nothing in this budget" in table.stdout


def test_plan_memory_plans_bf16_only_on_a_cpu_that_has_it():
    """On this host's CPU: refused with the reason where bf16 is not native (AVX2-only),
    planned where it is (AMX/AVX512-BF16); both branches with faked flags are in test_cpu.py."""
    from brats_seg.cpu import has_native_bf16

    out = _plan_memory("resolution=half", "model.depth=4", "backend.precision=bf16", "lms.limit=8GB")
    if has_native_bf16():
        assert out.returncode == 0, out.stderr
        assert "mixed_bfloat16" in out.stdout
    else:
        assert out.returncode == 2 and "backend.precision=bf16 needs a CPU" in out.stderr
        assert out.stdout == ""  # refused before anything was planned
