"""LMS planning (brats_seg.lms.planner.search): strategies, the auto search, what fits instead."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from brats_seg.config import TrainConfig
from brats_seg.lms.planner.memory_model import MemoryModel
from brats_seg.lms.planner.plan import Plan, PlanDoesNotFitError
from brats_seg.lms.planner.search import compare_strategies, estimate_peak, plan_lms, plan_lms_from_config
from brats_seg.lms.planner.workload import LMSOptions, Workload
from tests.unit.lms_workloads import FULL, GB, HALF, ModelConfig, limit_for, network, peaks


def test_auto_with_huge_limit_keeps_everything():
    plan = plan_lms(Workload(ModelConfig(depth=4), FULL, 1), LMSOptions(limit_bytes=10**15, strategy="auto"))
    assert all(b.policy == "keep" and not b.skip_offloaded for b in plan.blocks)
    assert plan.recomputed_flops == 0 and plan.moved_bytes == 0 and plan.overhead_s == 0
    assert plan.predicted_peak_bytes == plan.strategies["off"]["predicted_peak_bytes"]


@pytest.mark.parametrize(
    "cfg, shape, batch, policy",
    [
        (ModelConfig(depth=4), FULL, 1, "float32"),
        (ModelConfig(depth=4), HALF, 3, "mixed_float16"),
        (ModelConfig(norm="group", upsample="trilinear"), HALF, 2, "float32"),
        (ModelConfig(depth=3, base_filters=8), (48, 56, 40), 2, "mixed_bfloat16"),
    ],
)
@pytest.mark.parametrize("fraction", [0.0, 0.05, 0.3, 0.6, 0.95])
def test_auto_fits_whenever_offload_fits(cfg, shape, batch, policy, fraction):
    p = peaks(cfg, shape, batch, policy, size_bytes=0)
    limit = limit_for(int(p["offload"] + fraction * (p["off"] - p["offload"])))
    plan = plan_lms(Workload(cfg, shape, batch, policy), LMSOptions(limit_bytes=limit, strategy="auto", size_bytes=0))
    assert plan.fits and plan.predicted_peak_bytes <= plan.budget_bytes < limit
    assert plan.overhead_s <= plan.strategies["offload"]["overhead_s"] + 1e-12


@pytest.mark.parametrize("fraction", [0.0, 0.3, 0.9])
def test_auto_without_offload_fits_whenever_recompute_fits(fraction):
    p = peaks(ModelConfig(depth=4), FULL, 1, allow_offload=False)
    assert p["offload"] is None
    limit = limit_for(int(p["recompute"] + fraction * (p["off"] - p["recompute"])))
    plan = plan_lms(
        Workload(ModelConfig(depth=4), FULL, 1), LMSOptions(limit_bytes=limit, strategy="auto", allow_offload=False)
    )
    assert plan.fits and plan.predicted_peak_bytes <= plan.budget_bytes < limit


@pytest.mark.parametrize("limit_gb", [1e6, 8.0, 6.5, 5.8, 4.0])
def test_allow_offload_false_never_offloads(limit_gb):
    try:
        plan = plan_lms(
            Workload(ModelConfig(depth=4), FULL, 1),
            LMSOptions(limit_bytes=int(limit_gb * GB), strategy="auto", allow_offload=False),
        )
    except PlanDoesNotFitError as err:
        assert err.best_strategy != "offload" and "offload" not in str(err)
        return
    assert all(b.policy in ("keep", "recompute") and not b.skip_offloaded and b.moved_bytes == 0 for b in plan.blocks)
    assert plan.strategies["offload"]["predicted_peak_bytes"] is None
    assert plan.strategies["offload"]["reason"]


def test_offload_strategy_needs_a_gpu():
    with pytest.raises(ValueError, match="lms=recompute or lms=auto"):
        plan_lms(
            Workload(ModelConfig(depth=4), HALF, 1),
            LMSOptions(limit_bytes=10**15, strategy="offload", allow_offload=False),
        )


def test_size_threshold_respected():
    cfg = ModelConfig(depth=4)
    net = network(cfg, HALF, 1)
    size = 20 * 10**6  # between the small deep tensors and the big shallow ones at half resolution
    sizes = list(net.tensor_bytes.values())
    assert min(sizes) < size < max(sizes)
    plan = plan_lms(Workload(cfg, HALF, 1), LMSOptions(limit_bytes=10**15, strategy="offload", size_bytes=size))
    for row, blk in zip(plan.blocks, net.blocks):
        moved = [t for t in blk.inputs if t != "image" and net.tensor_bytes[t] >= size]
        expected = 2 * sum(net.tensor_bytes[t] for t in moved)
        if row.skip_offloaded:
            assert blk.tensor_bytes[blk.skip_input] >= size
            expected += 2 * blk.skip_bytes
        assert row.moved_bytes == expected
        assert row.policy == ("offload" if moved else "recompute")
    assert any(row.moved_bytes for row in plan.blocks)

    # Nothing reaches a huge threshold: offload moves nothing and predicts what recompute does.
    huge = plan_lms(Workload(cfg, HALF, 1), LMSOptions(limit_bytes=10**15, strategy="offload", size_bytes=10**15))
    assert huge.moved_bytes == 0 and all(b.policy == "recompute" for b in huge.blocks)
    assert huge.predicted_peak_bytes == huge.strategies["recompute"]["predicted_peak_bytes"]


def test_offload_strategy_sends_skips_to_host():
    workload = Workload(ModelConfig(depth=4), FULL, 1)
    plan = plan_lms(workload, LMSOptions(limit_bytes=10**15, strategy="offload", size_bytes=0))
    assert [b.block for b in plan.blocks if b.skip_offloaded] == ["dec3", "dec2", "dec1", "dec0"]
    assert plan.offload_skips == {"enc0", "enc1", "enc2", "enc3"}  # the names brats_seg.lms.runtime.offload takes
    recompute = plan_lms(workload, LMSOptions(limit_bytes=10**15, strategy="recompute"))
    assert not any(b.skip_offloaded for b in recompute.blocks)


@pytest.mark.parametrize("strategy", ["recompute", "offload", "auto"])
def test_batch_norm_blocks_are_always_kept(strategy):
    """Recomputing BatchNormalization updates its moving statistics twice (offload.py refuses it)."""
    cfg = ModelConfig(norm="batch")
    p = peaks(cfg, FULL)
    limit = limit_for(p["offload"]) if strategy == "auto" else 10**15
    plan = plan_lms(Workload(cfg, FULL, 1), LMSOptions(limit_bytes=limit, strategy=strategy))
    assert all(b.policy == "keep" for b in plan.blocks if b.block != "head")
    assert not plan.offload_skips


def test_too_small_limit_suggests_batch_and_resolution():
    cfg = ModelConfig(depth=4)
    one, two = peaks(cfg, FULL, 1)["offload"], peaks(cfg, FULL, 2)["offload"]
    limit = (one + two) // 2
    with pytest.raises(PlanDoesNotFitError) as info:
        plan_lms(Workload(cfg, FULL, 2), LMSOptions(limit_bytes=limit, strategy="auto"))
    err = info.value
    message = str(err)
    assert err.max_batch_size == 1 and "largest batch that fits is 1" in message
    assert err.max_resolution == ("full", FULL) and "full 192x224x160" in message
    assert f"{limit / 1e9:.2f} GB" in message
    assert f"{err.smallest_peak_bytes / 1e9:.2f} GB with lms=" in message
    assert "lower trainer.batch_size to 1" in message


def test_much_too_small_limit_suggests_a_smaller_resolution():
    cfg = ModelConfig(depth=4)
    limit = (peaks(cfg, HALF)["offload"] + peaks(cfg, FULL)["offload"]) // 2
    with pytest.raises(PlanDoesNotFitError) as info:
        plan_lms(Workload(cfg, FULL, 1), LMSOptions(limit_bytes=limit, strategy="auto"))
    assert info.value.max_batch_size == 0 and "No batch size fits" in str(info.value)
    assert info.value.max_resolution == ("half", HALF) and "half 96x112x80" in str(info.value)


def test_fixed_strategy_over_the_limit_points_to_auto():
    cfg = ModelConfig(depth=4)
    p = peaks(cfg, FULL)
    limit = (p["off"] + p["offload"]) // 2
    with pytest.raises(PlanDoesNotFitError, match="use lms=auto"):
        plan_lms(Workload(cfg, FULL, 1), LMSOptions(limit_bytes=limit, strategy="off"))


def test_a_plan_keeps_the_planning_margin_of_the_limit_free():
    """lms.limit is what the run may measure; a plan may predict the limit less the memory
    model's planning_margin (room for the model's own under-prediction)."""
    cfg, work = ModelConfig(depth=4), Workload(ModelConfig(depth=4), FULL, 1)
    off = peaks(cfg, FULL)["off"]
    limit = int(off / 0.95)  # off predicts 95% of the limit: within it, over a 10% margin's budget
    with pytest.raises(PlanDoesNotFitError, match=r"over the budget .* less the 10.0% the planner keeps"):
        plan_lms(work, LMSOptions(limit_bytes=limit, strategy="off"), MemoryModel(planning_margin=0.1))
    plan = plan_lms(work, LMSOptions(limit_bytes=limit, strategy="off"), MemoryModel(planning_margin=0.0))
    assert plan.fits and plan.budget_bytes == limit and plan.margin == 0.0

    plan = plan_lms(
        work, LMSOptions(limit_bytes=limit, strategy="auto", allow_offload=False), MemoryModel(planning_margin=0.1)
    )
    assert plan.budget_bytes == int(0.9 * limit) and plan.predicted_peak_bytes <= plan.budget_bytes < off
    assert plan.recomputed_flops > 0 and plan.margin == pytest.approx(0.1, abs=1e-6)
    assert f"budget {plan.budget_bytes / 1e9:.2f} GB (lms.limit {limit / 1e9:.2f} GB less 10.0%" in plan.format_table()
    saved = plan.to_dict()
    assert Plan.from_dict(saved).budget_bytes == plan.budget_bytes
    del saved["budget_bytes"]  # a plan saved before the margin: its limit was its budget
    assert Plan.from_dict(saved).budget_bytes == limit


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"input_shape": (48, 56, 40)}, "not divisible by 2\\*\\*depth = 16"),
        ({"policy": "float64"}, "dtype policy"),
        ({"optimizer": "lion"}, "optimizer"),
        ({"strategy": "swap"}, "lms strategy"),
        ({"batch_size": 0}, "batch_size"),
        ({"limit_bytes": -1}, "limit_bytes"),
        ({"limit_bytes": None}, "limit_bytes"),
        ({"size_bytes": -1}, "lms.size"),
        ({"prefetch": 1.5}, "lms.prefetch"),
        ({"model_cfg": ModelConfig(depth=4, in_channels=2)}, "in_channels"),
    ],
)
def test_bad_arguments_are_named(kwargs, match):
    workload = {
        "model_cfg": ModelConfig(depth=4),
        "input_shape": HALF,
        "batch_size": 1,
        "policy": "float32",
        "optimizer": "adam",
    }
    options = {"limit_bytes": 10**15, "strategy": "auto"}
    for key, value in kwargs.items():
        (workload if key in workload else options)[key] = value
    with pytest.raises(ValueError, match=match):
        plan_lms(Workload(**workload), LMSOptions(**options))


def test_plan_from_train_config():
    cfg = TrainConfig()
    cfg.lms = dataclasses.replace(cfg.lms, name="auto", limit="0.9")
    plan = plan_lms_from_config(cfg, device_bytes=64 * GB, allow_offload=True)
    assert plan.limit_bytes == int(0.9 * 64 * GB) and plan.strategy == "auto"
    assert plan.inputs["input_shape"] == list(cfg.resolution.shape) and plan.inputs["policy"] == "float32"
    assert cfg.model.out_channels == 0 and plan.inputs["model"]["out_channels"] == 3  # resolved, cfg unchanged


def test_auto_strategy_absent_with_reason_when_nothing_fits():
    out = compare_strategies(Workload(ModelConfig(depth=4), FULL, 1), LMSOptions(limit_bytes=10**8))
    assert out["auto"]["predicted_peak_bytes"] is None and "no plan fits" in out["auto"]["reason"]
    assert out["off"]["fits"] is False and out["off"]["predicted_peak_bytes"] > 10**8


def test_estimate_peak_takes_a_fixed_strategy():
    with pytest.raises(ValueError, match="fixed strategy"):
        estimate_peak(Workload(ModelConfig(depth=4), HALF, 1), LMSOptions(strategy="auto"))


def test_planner_does_not_import_tensorflow():
    code = (
        "import sys; from brats_seg.config import ModelConfig; "
        "from brats_seg.lms.planner.search import plan_lms; from brats_seg.lms.planner.workload import LMSOptions, Workload; "
        "plan_lms(Workload(ModelConfig(depth=4, out_channels=3), (96, 112, 80), 1), LMSOptions(10**15)); "
        "bad = [m for m in ('tensorflow', 'keras') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
