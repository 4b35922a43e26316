"""The simulated timeline (brats_seg.lms.planner.timeline): how predicted peaks order and grow."""

from __future__ import annotations

import pytest

from brats_seg.lms.planner.memory_model import MemoryModel
from brats_seg.lms.planner.timeline import simulate
from tests.unit.lms_workloads import FULL, HALF, ModelConfig, estimate, network, peaks


@pytest.mark.parametrize("strategy", ["off", "recompute", "offload"])
def test_peak_grows_with_batch_and_resolution(strategy):
    cfg = ModelConfig(depth=4)
    by_batch = [estimate(cfg, HALF, b, strategy=strategy).peak_bytes for b in (1, 2, 4)]
    assert by_batch == sorted(by_batch) and len(set(by_batch)) == 3
    by_shape = [estimate(cfg, s, 1, strategy=strategy).peak_bytes for s in ((48, 48, 48), HALF, FULL)]
    assert by_shape == sorted(by_shape) and len(set(by_shape)) == 3


@pytest.mark.parametrize(
    "cfg, shape, policy",
    [
        (ModelConfig(depth=4), FULL, "float32"),
        (ModelConfig(depth=4), HALF, "mixed_float16"),
        (ModelConfig(norm="group", upsample="trilinear"), HALF, "float32"),
        (ModelConfig(depth=3, base_filters=8), (48, 56, 40), "float32"),
        (ModelConfig(depth=2, base_filters=32, norm="group", groups=4), (64, 64, 64), "mixed_bfloat16"),
    ],
)
def test_recompute_below_off_and_offload_not_above_recompute(cfg, shape, policy):
    p = peaks(cfg, shape, 1, policy)
    # Recomputing adds its traced graphs (a fixed allowance): a tiny network's savings need
    # not cover it, every other one's do.
    assert p["recompute"] <= p["off"] + MemoryModel().rebuild_runtime_bytes
    if min(shape) >= 64:
        assert p["recompute"] < p["off"]
    assert p["offload"] <= p["recompute"]


def test_offload_peak_grows_with_prefetch():
    cfg = ModelConfig(depth=4)
    by_prefetch = [estimate(cfg, FULL, 1, strategy="offload", prefetch=k).peak_bytes for k in (0, 1, 3, 20)]
    assert by_prefetch == sorted(by_prefetch)


def test_mixed_precision_below_float32():
    p32, p16 = peaks(ModelConfig(depth=4), FULL, 1, "float32"), peaks(ModelConfig(depth=4), FULL, 1, "fp16")
    assert p16["off"] < p32["off"]


def test_simulate_names_a_bad_plan():
    net = network(ModelConfig(depth=1), (8, 8, 8))
    with pytest.raises(ValueError, match="one policy per block"):
        simulate(net, ["keep"] * 3)
    with pytest.raises(ValueError, match="'swap'"):
        simulate(net, ["keep", "swap", "keep", "keep"])
