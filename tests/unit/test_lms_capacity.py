"""The largest input, batch and patch a strategy fits in a budget (brats_seg.lms.planner.capacity, plan.find)."""

from __future__ import annotations

import itertools
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from brats_seg.lms.planner.capacity import (
    cube_shape_at,
    find_capacity,
    input_shape_at,
    largest_input,
    largest_patch,
    largest_patch_allowed,
    patch_shape_at,
)
from brats_seg.lms.planner.memory_model import memory_model_for
from brats_seg.lms.planner.search import fits_with, largest_batch, plan_lms, planning_budget
from brats_seg.lms.planner.workload import LMSOptions, Workload
from tests.unit.lms_workloads import FULL, GB, HALF, ModelConfig

REPO = Path(__file__).resolve().parents[2]
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


# ---------------------------------------------------------------------------------------
# plan.find=max_patch: the largest patch (trainer.patch_size) and cube within the grid
# ---------------------------------------------------------------------------------------

TINY = (48, 56, 40)  # resolution=tiny: not a multiple of 16 on y and z
LIMITS = (10**6, 1 * GB, 2 * GB, 4 * GB, 8 * GB, 16 * GB, 10**13)


def _patch_steps(grid, multiple) -> list[tuple[int, int, int]]:
    """The distinct patches the search walks through, smallest first, up to the whole grid."""
    whole, steps = largest_patch_allowed(grid, multiple), []
    for scale in itertools.count(1):
        shape = patch_shape_at(grid, multiple, scale)
        if not steps or shape != steps[-1]:
            steps.append(shape)
        if shape == whole:
            return steps


def _obeys_patch_rules(shape, grid, multiple) -> bool:
    return len(shape) == 3 and all(0 < s <= g and s % multiple == 0 for s, g in zip(shape, grid))


@pytest.mark.parametrize("grid", [FULL, HALF, TINY, (80, 200, 48)])
@pytest.mark.parametrize("multiple", [4, 8, 16])
def test_patches_and_cubes_stay_in_the_grid_in_multiples_of_two_to_the_depth(grid, multiple):
    whole = largest_patch_allowed(grid, multiple)
    assert _obeys_patch_rules(whole, grid, multiple) and all(g - w < multiple for g, w in zip(grid, whole))
    previous = (0, 0, 0)
    for scale in range(1, 80):
        patch, cube = patch_shape_at(grid, multiple, scale), cube_shape_at(grid, multiple, scale)
        assert _obeys_patch_rules(patch, grid, multiple) and _obeys_patch_rules(cube, grid, multiple)
        assert all(p >= q for p, q in zip(patch, previous))  # an axis that reached the grid stays there
        assert all(c == scale * multiple or c == w < scale * multiple for c, w in zip(cube, whole))
        previous = patch
    assert previous == whole  # the whole grid is the largest patch
    with pytest.raises(ValueError, match="lower model.depth"):
        largest_patch_allowed(grid, 2 * max(grid))


@pytest.mark.parametrize("strategy", ["off", "recompute", "auto"])
def test_largest_patch_fits_and_the_next_larger_one_does_not(strategy):
    workload = Workload(ModelConfig(depth=4, base_filters=16), FULL, 1)
    options = LMSOptions(limit_bytes=4 * GB, allow_offload=False)
    cap = largest_patch(workload, MM, strategy, options)
    fixed = ["recompute"] if strategy == "auto" else [strategy]
    budget = planning_budget(options.limit_bytes, MM)
    for shape, steps in (
        (cap.input_shape, _patch_steps(FULL, 16)),
        (cap.cube_shape, [cube_shape_at(FULL, 16, s) for s in range(1, max(FULL) // 16 + 1)]),
    ):
        assert shape is not None and _obeys_patch_rules(shape, FULL, 16)
        ok, peak = fits_with(workload.with_input(input_shape=shape), MM, fixed, options)
        assert ok and peak <= budget
        larger = steps[steps.index(shape) + 1 :]
        if larger:  # not the whole grid: the next larger step does not fit
            assert not fits_with(workload.with_input(input_shape=larger[0]), MM, fixed, options)[0]
    if strategy != "auto":
        assert cap.predicted_peak_bytes == fits_with(workload.with_input(cap.input_shape), MM, fixed, options)[1]
    assert cap.predicted_peak_bytes <= budget


def test_a_bigger_budget_never_gives_a_smaller_patch():
    workload = Workload(ModelConfig(depth=4, base_filters=16), FULL, 1)
    previous = {}
    for limit in LIMITS:
        found = find_capacity("max_patch", workload, MM, LMSOptions(limit_bytes=limit, allow_offload=False))
        for name, cap in found.items():
            before = previous.get(name)
            for now, then in (
                (cap.input_shape, before and before.input_shape),
                (cap.cube_shape, before and before.cube_shape),
            ):
                assert then is None or (now is not None and all(a >= b for a, b in zip(now, then)))
            assert cap.input_shape is None or _obeys_patch_rules(cap.input_shape, FULL, 16)
        previous = found


def test_a_large_budget_gives_the_whole_grid_and_a_tiny_one_nothing():
    workload = Workload(ModelConfig(depth=4, base_filters=16), FULL, 2)
    huge = find_capacity("max_patch", workload, MM, LMSOptions(limit_bytes=10**13, allow_offload=True))
    assert set(huge) == {"off", "recompute", "offload", "auto"}
    assert all(c.input_shape == c.cube_shape == FULL and c.batch_size == 2 for c in huge.values())
    tiny = find_capacity("max_patch", workload, MM, LMSOptions(limit_bytes=10**6, allow_offload=False))
    assert all(c.input_shape is None and c.cube_shape is None and c.predicted_peak_bytes == 0 for c in tiny.values())
    assert tiny["off"].to_dict()["input_shape"] is None and huge["off"].to_dict()["cube_shape"] == list(FULL)


def test_max_patch_takes_the_grid_not_the_configured_patch():
    """A workload at a configured patch, told the grid, searches the grid; a grid that is not a
    multiple of 2**depth is searched up to the largest patch it allows."""
    options = LMSOptions(limit_bytes=4 * GB, allow_offload=False)
    whole = find_capacity("max_patch", Workload(ModelConfig(depth=4, base_filters=16), FULL, 1), MM, options)
    patch = Workload(ModelConfig(depth=4, base_filters=16), (32, 32, 32), 1)
    assert find_capacity("max_patch", patch, MM, options, grid_shape=FULL) == whole
    tiny = largest_patch(patch, MM, "off", LMSOptions(limit_bytes=10**13, allow_offload=False), grid_shape=TINY)
    assert tiny.input_shape == tiny.cube_shape == largest_patch_allowed(TINY, 16) == (48, 48, 32)


def test_plan_memory_prints_the_largest_patch_to_pass():
    out = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "plan_memory.py"),
            "resolution=full",
            "model.depth=4",
            "lms.limit=4GB",
            "backend=cpu_onednn",
            "plan.find=max_patch",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert out.returncode == 0, out.stderr
    rows = {line.split()[0]: line for line in out.stdout.splitlines() if "trainer.patch_size=[" in line}
    assert set(rows) == {"off", "recompute", "auto"}  # no offload on a CPU
    for row in rows.values():
        patch = json.loads(re.search(r"trainer\.patch_size=(\[[0-9,]+\])", row).group(1))
        assert _obeys_patch_rules(patch, FULL, 16)
    assert "largest patch within lms.limit=4GB" in out.stdout
