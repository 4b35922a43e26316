"""trainer.patch_schedule before training: the stages parsed and checked, grow's stages, each
stage planned for memory at the start (refused there, named), the plans kept in plan.json and
read back on resume. Pure Python: nothing here loads TensorFlow."""

from __future__ import annotations

import json
import logging
import math

import pytest

from brats_seg.patch_schedule import GROW, WHOLE_AT, WHOLE_SHARE, Stage, grow_stages, parse_schedule, stage_epochs
from brats_seg.project import compose_config

HALF, FULL = (96, 112, 80), (192, 224, 160)


def _compose(tmp_path, *overrides):
    return compose_config(
        "train",
        [
            "resolution=half",
            "model.depth=4",
            "backend=cpu_onednn",
            "tracking=none",
            f"run_dir={tmp_path / 'run'}",
            *overrides,
        ],
    )


@pytest.mark.parametrize("grid", [HALF, FULL, (48, 56, 40), (240, 240, 160)])
@pytest.mark.parametrize("depth", [2, 3, 4])
def test_grow_grows_in_multiples_of_the_depth_and_ends_on_the_whole_volume_with_half_the_time(grid, depth):
    stages = grow_stages(grid, depth, 2)
    multiple = 2**depth
    *patches, last = stages
    assert last.patch is None and math.isclose(sum(s.share for s in stages), 1.0)
    assert math.isclose(last.share, WHOLE_SHARE if patches else 1.0)
    assert all(s.batch_size == 2 for s in stages)
    sizes = [math.prod(s.patch) for s in patches]
    assert sizes == sorted(set(sizes))  # growing, no stage twice
    for s in patches:
        assert all(p % multiple == 0 and p <= g for p, g in zip(s.patch, grid))
        assert math.prod(s.patch) < WHOLE_AT * math.prod(grid)  # else it is the whole volume
    if patches:
        assert min(patches[0].patch) == 2 * multiple  # a 2^3 bottleneck
        assert len({s.share for s in patches}) == 1


def test_a_grid_no_bigger_than_the_smallest_patch_grows_to_the_whole_volume_only():
    assert grow_stages((32, 32, 32), 4, 2) == (Stage(None, 1.0, 2),)


def test_stages_parse_with_their_own_batch_and_whole_and_none_means_none():
    stages = parse_schedule(
        [{"patch": [48, 48, 48], "share": 0.25}, {"patch": "whole", "share": 0.75, "batch_size": 1}], HALF, 4, 2
    )
    assert stages == (Stage((48, 48, 48), 0.25, 2), Stage(None, 0.75, 1))
    assert [s.name for s in stages] == ["48x48x48", "whole"]
    assert parse_schedule(None, HALF, 4, 2) is None and parse_schedule([], HALF, 4, 2) is None
    assert parse_schedule(GROW, HALF, 4, 2) == grow_stages(HALF, 4, 2)
    assert all(Stage.from_dict(s.to_dict()) == s for s in stages)


@pytest.mark.parametrize(
    "value, match",
    [
        ("shrink", r"trainer.patch_schedule='shrink': use 'grow'"),
        ([{"patch": [40, 48, 48], "share": 1.0}], r"patch_schedule\[0\].patch=\[40, 48, 48\]: each side .* 16"),
        ([{"patch": [48, 48], "share": 1.0}], r"patch_schedule\[0\].patch=\[48, 48\]: use 'whole' or 3"),
        ([{"patch": [48, 48, 128], "share": 1.0}], r"at most resolution.shape=\[96, 112, 80\]"),
        ([{"patch": "whole", "share": 0.6}, {"patch": "whole", "share": 0.5}], r"shares sum to 1.1, not 1"),
        ([{"patch": "whole", "share": 0}], r"patch_schedule\[0\].share=0: use a share"),
        ([{"patch": "whole", "share": 1.0, "batch_size": 0}], r"patch_schedule\[0\].batch_size=0"),
        ([{"patch": "whole", "share": 1.0, "size": 2}], r"unknown key\(s\) \['size'\]"),
        ([{"share": 1.0}], r"patch_schedule\[0\]=.*a stage is"),
    ],
)
def test_a_bad_stage_is_named_with_what_to_use(value, match):
    with pytest.raises(ValueError, match=match):
        parse_schedule(value, HALF, 4, 2)


def test_stage_epochs_follow_the_shares_and_give_each_stage_at_least_one():
    stages = [Stage((32, 32, 32), 0.25, 2), Stage((64, 64, 64), 0.25, 2), Stage(None, 0.5, 2)]
    assert stage_epochs(stages, 100) == [0, 25, 50]
    assert stage_epochs(stages, 3) == [0, 1, 2]
    assert stage_epochs([Stage(None, 0.001, 2), Stage(None, 0.999, 2)], 10) == [0, 1]
    with pytest.raises(ValueError, match="trainer.epochs=2 is fewer than the schedule's 3 stages"):
        stage_epochs(stages, 2)


def test_patch_size_and_a_schedule_together_are_refused(tmp_path):
    from brats_seg.resolve import resolve_run

    cfg = _compose(tmp_path, "trainer.patch_size=[48,48,48]", "trainer.patch_schedule=grow")
    with pytest.raises(ValueError, match=r"trainer.patch_size=\[48, 48, 48\] and trainer.patch_schedule='grow' both"):
        resolve_run(cfg)


def test_each_stage_is_planned_at_the_start_and_grow_shares_mean_time_without_a_budget(tmp_path, caplog):
    from brats_seg.data.patches import crops_per_case
    from brats_seg.resolve import resolve_run

    with caplog.at_level(logging.INFO, logger="brats_seg.resolve"):
        run = resolve_run(_compose(tmp_path, "trainer.patch_schedule=grow", "trainer.epochs=120"))
    assert [s.stage for s in run.stages] == list(grow_stages(HALF, 4, 2))
    peaks = [s.plan.predicted_peak_bytes for s in run.stages]
    assert peaks == sorted(peaks) and run.plan.predicted_peak_bytes == max(peaks)  # the run's plan: the highest
    firsts = [s.first_epoch for s in run.stages]
    assert firsts[0] == 0 and firsts == sorted(set(firsts)) and firsts[-1] < 120
    # the epochs each stage gets are its time share over its predicted epoch time (step x steps per epoch)
    epochs = [b - a for a, b in zip(firsts, [*firsts[1:], 120])]
    seconds = [
        n * crops_per_case(HALF, s.stage.patch) / s.stage.batch_size * s.plan.predicted_step_s
        for n, s in zip(epochs, run.stages)
    ]
    shares = [x / sum(seconds) for x in seconds]
    assert all(abs(a - s.stage.share) < 0.03 for a, s in zip(shares, run.stages)), shares
    assert "stage 4/4 whole, batch 2, share 0.5" in caplog.text


def test_with_a_budget_the_clock_places_the_stages(tmp_path):
    from brats_seg.resolve import resolve_run

    run = resolve_run(_compose(tmp_path, "trainer.patch_schedule=grow", "trainer.time_budget_s=100"))
    assert [s.first_epoch for s in run.stages] == [None] * len(run.stages)


def test_a_stage_that_cannot_fit_is_refused_at_the_start_named(tmp_path):
    from brats_seg.resolve import resolve_run

    cfg = _compose(
        tmp_path,
        "trainer.patch_schedule=[{patch:[48,48,48],share:0.5},{patch:whole,share:0.5,batch_size:8}]",
        "lms.limit=3GB",
    )
    with pytest.raises(ValueError, match=r"^trainer.patch_schedule stage 2 of 2, whole, batch 8: "):
        resolve_run(cfg)


def test_a_stage_batch_must_divide_among_the_replicas(tmp_path):
    from brats_seg.resolve import resolve_run

    cfg = _compose(
        tmp_path,
        "trainer.patch_schedule=[{patch:[48,48,48],share:0.5,batch_size:3},{patch:whole,share:0.5}]",
        "distribute=mirrored",
        "distribute.devices=[/CPU:0,/CPU:1]",  # two replicas (logical CPUs, as tests make them)
    )
    with pytest.raises(ValueError, match=r"trainer.patch_schedule\[0\].batch_size=3 is a global batch"):
        resolve_run(cfg)


def test_plan_json_keeps_each_stage_and_a_resumed_run_reads_them_back(tmp_path, caplog):
    from brats_seg.resolve import resolve_run
    from brats_seg.run_dir import RunFolder
    from brats_seg.training.checkpoint import save_plan

    cfg = _compose(tmp_path, "trainer.patch_schedule=grow")
    run = resolve_run(cfg)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    save_plan(run, run_dir)
    record = json.loads((run_dir / "plan.json").read_text())
    assert [s["patch"] for s in record["stages"]][-1] == "whole"
    assert "stage 4/4: whole, batch 2" in (run_dir / "plan.txt").read_text()
    (run_dir / "state.json").write_text(json.dumps({"epoch": 3, "history": []}))  # progress: a resume
    assert RunFolder(run_dir).read_plan() is not None
    with caplog.at_level(logging.INFO, logger="brats_seg.resolve"):
        resumed = resolve_run(cfg)
    assert "resuming under the run's plan.json" in caplog.text and "4 stages" in caplog.text
    assert resumed.stages == run.stages
