"""Patch mode: where crops lie (determinism, foreground share, bounds), the patch dataset, the
wall-clock budget's learning-rate schedule and the keys' checks. Patch runs end to end (stopped by
a signal mid-epoch, resumed to the uninterrupted run's weights, evaluated by sliding windows on
the native grid; a budget's end): test_patch_schedule_training.py, whose stages are patch runs."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest

from brats_seg.data.patches import PatchSampler, crop_origin, crops_per_case, is_foreground_crop, tumour_locations
from tests.conftest import TINY, data_config

SHAPE = (48, 56, 40)
PATCH = (16, 24, 16)


def _regions(shape=SHAPE, box=((30, 36), (10, 14), (5, 9))) -> np.ndarray:
    """WT a small box, TC and ET one voxel row inside it: tumour is rare, as in BraTS."""
    regions = np.zeros((*shape, 3), np.uint8)
    (x0, x1), (y0, y1), (z0, z1) = box
    regions[x0:x1, y0:y1, z0:z1, 0] = 1
    regions[x0 + 1, y0:y1, z0 + 1, 1] = 1
    regions[x0 + 2, y0 + 1, z0 + 2, 2] = 1
    return regions


@pytest.mark.parametrize("fraction", [0.0, 0.33, 0.5, 1 / 3, 0.9, 1.0])
def test_the_foreground_share_is_exact_over_every_run_prefix(fraction):
    forced = np.cumsum([is_foreground_crop(g, fraction) for g in range(300)])
    for n in (10, 99, 300):
        assert abs(forced[n - 1] - fraction * n) < 1  # spread evenly, not clumped


def test_crops_are_a_pure_function_of_seed_epoch_and_position_and_stay_inside_the_grid():
    regions = _regions()
    a = PatchSampler(SHAPE, PATCH, seed=5, fraction=0.33, per_epoch=12)
    b = PatchSampler(SHAPE, PATCH, seed=5, fraction=0.33, per_epoch=12)
    visits = [(e, p) for e in range(3) for p in range(12)]
    first = [a.origin(e, p, 0, regions) for e, p in visits]
    assert [b.origin(e, p, 0, regions) for e, p in reversed(visits)] == first[::-1]  # order of visits is irrelevant
    other_seed = PatchSampler(SHAPE, PATCH, seed=6, fraction=0.33, per_epoch=12)
    assert [other_seed.origin(e, p, 0, regions) for e, p in visits] != first
    for ((origin, _),) in zip(first):
        assert all(0 <= o <= s - p for o, s, p in zip(origin, SHAPE, PATCH))


def test_forced_crops_hold_tumour_of_every_region_and_the_rest_are_spread_over_the_grid():
    regions = _regions()
    sampler = PatchSampler(SHAPE, PATCH, seed=0, fraction=0.33, per_epoch=30)
    image = np.zeros((*SHAPE, 4), np.float16)
    forced_regions, free_tumour, origins = [], 0, []
    for position in range(300):
        (x, y, z), forced = sampler.origin(0, position, 0, regions)
        crop = regions[x : x + PATCH[0], y : y + PATCH[1], z : z + PATCH[2]]
        origins.append((x, y, z))
        if forced:
            assert crop[..., 0].any(), (position, (x, y, z))  # every forced crop holds tumour
            forced_regions.append(tuple(bool(crop[..., r].any()) for r in range(3)))
        else:
            free_tumour += bool(crop[..., 0].any())
    assert len(forced_regions) == 99  # a third of 300, exactly
    assert sum(r[2] for r in forced_regions) >= 25  # ET (one voxel row) is centred on about a third of them
    assert free_tumour < 0.5 * 201  # unforced crops mostly miss a tumour this small
    xs = [o[0] for o in origins]
    assert min(xs) == 0 or (min(xs) < 4 and max(xs) > SHAPE[0] - PATCH[0] - 4)  # the grid's extent is reached
    img_crop, reg_crop = sampler.crop(0, 0, 0, image, regions)
    assert img_crop.shape == (*PATCH, 4) and reg_crop.shape == (*PATCH, 3) and img_crop.flags.c_contiguous


def test_a_case_without_tumour_is_cropped_anywhere_and_said_once(caplog):
    empty = np.zeros((*SHAPE, 3), np.uint8)
    sampler = PatchSampler(SHAPE, PATCH, seed=0, fraction=1.0, per_epoch=10)
    with caplog.at_level(logging.INFO, logger="brats_seg.data.patches"):
        results = [sampler.origin(0, p, 7, empty, "case_7") for p in range(10)]
    assert not any(forced for _, forced in results)
    assert len({origin for origin, _ in results}) > 1
    said = [r for r in caplog.records if "case_7 has no tumour" in r.getMessage()]
    assert len(said) == 1


def test_kept_tumour_voxels_are_capped_and_lie_in_their_region():
    regions = _regions(box=((0, 40), (0, 40), (0, 30)))
    kept = tumour_locations(regions, per_region=500)
    assert [len(k) for k in kept] == [500, 40, 1]
    for channel, coords in enumerate(kept):
        assert regions[coords[:, 0], coords[:, 1], coords[:, 2], channel].all()
    again = tumour_locations(regions, per_region=500)
    assert all(np.array_equal(a, b) for a, b in zip(kept, again))


def test_crop_origin_centres_on_the_voxel_and_moves_inside_at_the_edges():
    rng = np.random.default_rng(0)
    assert crop_origin(SHAPE, PATCH, rng, centre=(24, 28, 20)) == (16, 16, 12)
    assert crop_origin(SHAPE, PATCH, rng, centre=(0, 55, 39)) == (0, SHAPE[1] - PATCH[1], SHAPE[2] - PATCH[2])


def test_an_epoch_holds_as_many_crops_as_hold_a_case():
    assert crops_per_case((96, 112, 80), None) == 1
    assert crops_per_case((96, 112, 80), (48, 48, 48)) == round(96 * 112 * 80 / 48**3) == 8
    assert crops_per_case((96, 112, 80), (96, 112, 80)) == 1
    assert crops_per_case((192, 224, 160), (128, 128, 128)) == 3


def test_the_patch_dataset_yields_crops_deterministically_and_resumes_mid_epoch(synthetic_root, tmp_path):
    from brats_seg.data.dataset import prepare_dataset
    from brats_seg.data.pipeline import TrainInput, make_train_dataset

    ds = prepare_dataset(data_config(synthetic_root["brats2021"], "brats2021", tmp_path), TINY)
    dirs = [e.path for e in ds.entries]
    spec = TrainInput(2, 3, "light", patch_size=PATCH, foreground_fraction=0.5)
    steps = spec.steps_per_epoch(len(dirs), TINY.shape)
    assert steps == len(dirs) * crops_per_case(TINY.shape, PATCH) // 2

    def batches(n, **kw):
        it = iter(make_train_dataset(dirs, spec, **kw))
        return [tuple(t.numpy() for t in next(it)) for _ in range(n)]

    run = batches(steps + 2)
    assert run[0][0].shape == (2, *PATCH, 4) and run[0][1].shape == (2, *PATCH, 3)
    resumed = batches(3, initial_epoch=1, initial_step=0)
    for (xa, ya), (xb, yb) in zip(run[steps:], resumed):
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)
    mid = batches(2, initial_step=3)
    np.testing.assert_array_equal(mid[0][0], run[3][0])
    tumour = np.mean([y[..., 0].any(axis=(1, 2, 3)).mean() for _, y in run])
    assert tumour >= 0.5  # at least the forced half hold tumour


def test_the_budget_schedule_warms_up_then_reaches_its_floor_as_the_budget_ends():
    from brats_seg.training.budget import ALPHA, BudgetCosineDecay, TrainingClock

    schedule = BudgetCosineDecay(1e-3, warmup_steps=4)
    clock = TrainingClock(100.0, 0.0, schedule)
    assert float(schedule(0)) == 0.0 and math.isclose(float(schedule(2)), 5e-4, rel_tol=1e-6)
    assert math.isclose(float(schedule(10)), 1e-3, rel_tol=1e-6)  # no time spent yet: the peak
    clock.add(50.0)
    assert math.isclose(float(schedule(10)), 1e-3 * (ALPHA + (1 - ALPHA) * 0.5), rel_tol=1e-5)
    assert not clock.over
    clock.add(60.0)
    assert clock.over and math.isclose(float(schedule(10)), 1e-3 * ALPHA, rel_tol=1e-5)
    resumed = TrainingClock(100.0, 110.0)
    assert resumed.over and not TrainingClock(0.0, 1e9).over  # 0 = no budget


@pytest.mark.parametrize(
    "override, key",
    [
        ("trainer.patch_size=[64,32,32]", "trainer.patch_size=[64, 32, 32]"),  # larger than the 48x56x40 grid
        ("trainer.patch_size=[20,32,24]", "trainer.patch_size=[20, 32, 24]"),  # 20 not a multiple of 2**3
        ("trainer.patch_size=[32,32]", "trainer.patch_size=[32, 32]"),
        ("trainer.foreground_fraction=1.5", "trainer.foreground_fraction=1.5"),
        ("trainer.time_budget_s=-1", "trainer.time_budget_s=-1"),
        # trainer.patch_schedule: a stage's patch, the shares, a stage that cannot fit, both keys
        ("trainer.patch_schedule=[{patch:[20,32,24],share:1}]", "trainer.patch_schedule[0].patch=[20, 32, 24]"),
        ("trainer.patch_schedule=[{patch:whole,share:0.6},{patch:whole,share:0.5}]", "the shares sum to 1.1, not 1"),
        (
            "trainer.patch_schedule=[{patch:[16,16,16],share:0.5},{patch:whole,share:0.5,batch_size:64}] lms.limit=1GB",
            "trainer.patch_schedule stage 2 of 2, whole, batch 64: ",
        ),
        ("trainer.patch_schedule=grow trainer.patch_size=[16,16,16]", "trainer.patch_schedule='grow' both given"),
    ],
)
def test_a_bad_patch_key_is_one_error_line_exit_2_and_nothing_written(override, key, tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [
            sys.executable,
            str(repo / "train.py"),
            "resolution=tiny",
            "tracking=none",
            f"run_dir={run_dir}",
            *override.split(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and key in errors[0], done.stderr[-2000:]
    assert not run_dir.exists() or not any(run_dir.iterdir())
