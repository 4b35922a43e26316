"""The largest input and batch a strategy fits in a budget (brats_seg.lms.planner.capacity, plan.find)."""

from __future__ import annotations

import math

import pytest

from brats_seg.lms.planner.capacity import find_capacity, input_shape_at, largest_input
from brats_seg.lms.planner.memory_model import memory_model_for
from brats_seg.lms.planner.search import fits_with, largest_batch, plan_lms
from brats_seg.lms.planner.workload import LMSOptions, Workload
from tests.unit.lms_workloads import FULL, GB, HALF, ModelConfig

MM = memory_model_for("CPU", "avx2")  # the plan an AVX2 CPU makes (the safe side until calibrated)


def test_shapes_keep_the_resolutions_proportions_in_multiples_of_two_to_the_depth():
    assert input_shape_at(FULL, 16, 10) == FULL  # full resolution itself at depth 4
    assert input_shape_at(FULL, 16, 5) == (96, 112, 80)  # = half
    for scale in range(1, 30):
        shape = input_shape_at(FULL, 32, scale)
        assert all(s % 32 == 0 for s in shape) and min(shape) == 32 * scale


@pytest.mark.parametrize("strategy", ["off", "recompute", "auto"])
def test_largest_input_fits_and_the_next_size_does_not(strategy):
    workload = Workload(ModelConfig(depth=4, base_filters=16), FULL, 1)
    options = LMSOptions(limit_bytes=4 * GB, allow_offload=False)
    cap = largest_input(workload, MM, strategy, options)
    assert cap.input_shape is not None and cap.predicted_peak_bytes <= 4 * GB
    fixed = ["recompute"] if strategy == "auto" else [strategy]
    scale = min(cap.input_shape) // 16
    ok, peak = fits_with(workload.with_input(input_shape=cap.input_shape), MM, fixed, options)
    assert ok and peak == cap.predicted_peak_bytes
    ok, _ = fits_with(workload.with_input(input_shape=input_shape_at(FULL, 16, scale + 1)), MM, fixed, options)
    assert not ok


def test_auto_trains_more_voxels_than_off_in_the_same_budget():
    workload = Workload(ModelConfig(depth=4, base_filters=16), FULL, 1)
    found = find_capacity("max_input", workload, MM, LMSOptions(limit_bytes=8 * GB, allow_offload=False))
    assert set(found) == {"off", "recompute", "auto"}  # no offload on a CPU
    assert found["auto"].voxels > found["off"].voxels
    assert found["auto"].voxels == math.prod(found["auto"].input_shape)
    gpu = find_capacity("max_input", workload, MM, LMSOptions(limit_bytes=8 * GB, allow_offload=True))
    assert "offload" in gpu and gpu["auto"].voxels >= gpu["off"].voxels


@pytest.mark.parametrize("find", ["max_input", "max_batch"])
def test_auto_reports_the_peak_of_the_plan_it_makes_there(find):
    """Where off fits too (4 GB, depth 4, 16 filters), auto keeps everything: its row shows
    that plan's peak, not the peak of its last resort (recompute) at the same size."""
    workload = Workload(ModelConfig(depth=4, base_filters=16), FULL if find == "max_input" else HALF, 1)
    options = LMSOptions(limit_bytes=4 * GB, allow_offload=False)
    found = find_capacity(find, workload, MM, options)
    auto = found["auto"]
    at = workload.with_input(auto.input_shape, auto.batch_size)
    assert auto.predicted_peak_bytes == plan_lms(at, options, MM).predicted_peak_bytes <= 4 * GB
    if (auto.input_shape, auto.batch_size) == (found["off"].input_shape, found["off"].batch_size):
        assert auto.predicted_peak_bytes == found["off"].predicted_peak_bytes > found["recompute"].predicted_peak_bytes


def test_max_batch_is_the_largest_batch_that_fits():
    workload = Workload(ModelConfig(depth=4, base_filters=16), HALF, 1)
    options = LMSOptions(limit_bytes=4 * GB, allow_offload=False)
    found = find_capacity("max_batch", workload, MM, options)
    assert found["off"].batch_size == largest_batch(workload, MM, ["off"], options)[0] >= 1
    assert found["auto"].batch_size > found["off"].batch_size
    assert found["off"].input_shape == HALF


def test_nothing_fits_and_bad_requests_are_said():
    workload = Workload(ModelConfig(depth=4, base_filters=16), FULL, 1)
    tiny_budget = LMSOptions(limit_bytes=10**6, allow_offload=False)
    assert largest_input(workload, MM, "off", tiny_budget).input_shape is None
    with pytest.raises(ValueError, match="plan.find='biggest'"):
        find_capacity("biggest", workload, MM, tiny_budget)
    with pytest.raises(ValueError, match="lms.limit"):
        find_capacity("max_input", workload, MM, LMSOptions(allow_offload=False))
