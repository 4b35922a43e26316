"""A run resolved once: the backend decision, the derived config (never written into the user's),
and the plan file read back on resume."""

from __future__ import annotations

import dataclasses
import json
import logging

import pytest

from brats_seg.backend import BackendError, decide_backend
from brats_seg.config import (
    BackendConfig,
    DataConfig,
    LMSConfig,
    ModelConfig,
    ResolutionConfig,
    TrainConfig,
    TrainerConfig,
)

SMALL = ResolutionConfig(name="small", spacing_mm=4.0, shape=[16, 16, 8])
NO_BF16 = "model name\t: Some CPU\nflags\t\t: fpu sse avx avx2 fma\n"
BF16 = "model name\t: Some CPU\nflags\t\t: fpu sse sse2 avx avx2 fma avx512f avx512dq avx512cd avx512bw avx512vl avx512_bf16\n"


@pytest.mark.parametrize(
    "name, gpus, expected",
    [
        ("auto", 0, ("cpu_onednn", "CPU", "no GPU visible")),
        ("auto", 2, ("gpu", "GPU", "2 GPU(s) visible")),
        ("cpu_onednn", 1, ("cpu_onednn", "CPU", "")),
        ("gpu_lms", 1, ("gpu_lms", "GPU", "")),
    ],
)
def test_the_backend_device_and_precision_are_decided_in_one_function(name, gpus, expected):
    b = decide_backend(BackendConfig(name=name, precision="fp32", intra_op_threads=2), gpus)
    assert (b.name, b.device, b.reason) == expected
    assert (b.precision, b.policy, b.n_gpus, b.intra_op_threads) == ("fp32", "float32", gpus, 2)


def test_a_backend_this_machine_cannot_run_is_refused_by_name():
    with pytest.raises(BackendError, match="backend=gpu needs a GPU"):
        decide_backend(BackendConfig(name="gpu"), 0)
    assert decide_backend(BackendConfig(name="gpu"), 0, require_gpu=False).device == "GPU"  # planning for one
    with pytest.raises(BackendError, match="bf16 needs a CPU that computes bfloat16 natively"):
        decide_backend(BackendConfig(name="cpu_onednn", precision="bf16"), 0, NO_BF16)
    assert decide_backend(BackendConfig(name="cpu_onednn", precision="bf16"), 0, BF16).policy == "mixed_bfloat16"
    with pytest.raises(BackendError, match="fp16 needs a GPU"):
        decide_backend(BackendConfig(name="auto", precision="fp16"), 0)
    from brats_seg.checks import check_backend_config

    with pytest.raises(ValueError, match="backend='cpu'.*Did you mean 'gpu'"):  # its names checked once, before
        check_backend_config(BackendConfig(name="cpu"))


def test_resolving_derives_the_run_and_leaves_the_users_config_as_it_was(tmp_path):
    from brats_seg.resolve import resolve_run

    user = TrainConfig(
        data=DataConfig(layout="brats2024", root="data/x", cache_dir="data/cache"),
        resolution=SMALL,
        model=ModelConfig(depth=2, base_filters=4),
        backend=BackendConfig(name="auto"),
        run_dir=str(tmp_path / "run"),
    )
    before = json.dumps(dataclasses.asdict(user), default=str)
    run = resolve_run(user, gpus=0)
    assert json.dumps(dataclasses.asdict(user), default=str) == before  # nothing written into it
    assert run.config.model.out_channels == 4 and run.config.model.region_parents == [-1, 0, 0, -1]
    assert run.config.data.root.startswith("/") and run.config.data.root.endswith("data/x")
    assert (run.backend.name, run.device, run.replicas, run.chief) == ("cpu_onednn", "CPU", 1, True)
    assert (run.lms, run.plan.strategy) == ("off", "off")  # planned for training: the decision is whole
    assert resolve_run(run) is run  # a resolved run is not resolved again
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.lms = "auto"
    with pytest.raises(ValueError, match="trainer.batch_size=0"):  # checked where resolved
        resolve_run(dataclasses.replace(user, trainer=TrainerConfig(batch_size=0)), gpus=0)


def test_the_planner_refuses_a_config_that_was_not_resolved():
    from brats_seg.lms.planner.preflight import plan_run

    with pytest.raises(ValueError, match="out_channels=0 is unresolved.*resolve_run"):
        plan_run(TrainConfig(resolution=SMALL, model=ModelConfig(depth=2, base_filters=4)), "CPU")


def _planned(tmp_path, limit="1e12", batch=2):
    from brats_seg.resolve import resolve_run

    cfg = TrainConfig(
        resolution=SMALL,
        model=ModelConfig(depth=2, base_filters=4),
        backend=BackendConfig(name="cpu_onednn"),
        trainer=TrainerConfig(batch_size=batch),
        lms=LMSConfig(name="auto", limit=limit),
        run_dir=str(tmp_path / "run"),
    )
    return resolve_run(cfg, gpus=0)


def test_a_resumed_run_reads_its_plan_back_and_a_changed_memory_setting_replans_and_says_so(tmp_path, caplog):
    from brats_seg.resolve import stored_plan
    from brats_seg.run_dir import RunFolder
    from brats_seg.training.checkpoint import save_plan

    run = _planned(tmp_path)
    (tmp_path / "run").mkdir()
    save_plan(run, tmp_path / "run")
    record = json.loads((tmp_path / "run" / "plan.json").read_text())
    assert record["planned_for"]["lms"]["limit"] == "1e12" and record["planned_for"]["replica_batch"] == 2

    kept = stored_plan(tmp_path / "run", run)
    assert kept is not None and kept.to_dict() == run.plan.to_dict()
    RunFolder(tmp_path / "run").write_state({"epoch": 1, "step": 0})  # progress: a start resumes
    with caplog.at_level(logging.INFO, logger="brats_seg.resolve"):
        resumed = _planned(tmp_path)
    assert resumed.plan.to_dict() == kept.to_dict() and "resuming under the run's plan.json" in caplog.text

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="brats_seg.resolve"):
        assert stored_plan(tmp_path / "run", _planned(tmp_path, limit="5e11")) is None
        assert stored_plan(tmp_path / "run", run, 2) is None  # two replicas: one share of the batch each
    assert "re-planning on purpose: lms.limit: '1e12' -> '5e11'" in caplog.text
    assert "replica_batch: 2 -> 1" in caplog.text

    (tmp_path / "run" / "plan.json").write_text('{"planned_for": ')  # cut short: planned again, said
    with caplog.at_level(logging.WARNING, logger="brats_seg.resolve"):
        assert stored_plan(tmp_path / "run", run) is None
    assert "no readable plan.json" in caplog.text


def test_replicas_are_known_before_tensorflow_from_distribute_and_the_gpus():
    from brats_seg.config import DistributeConfig
    from brats_seg.distribute.resolve import planned_replicas

    assert planned_replicas(DistributeConfig(name="none"), "GPU", 4) == (1, True)
    assert planned_replicas(DistributeConfig(name="mirrored"), "GPU", 4) == (4, True)
    assert planned_replicas(DistributeConfig(name="mirrored"), "CPU", 0) == (1, True)
    assert planned_replicas(DistributeConfig(name="mirrored", devices=["/CPU:0", "/CPU:1"]), "CPU", 0) == (2, True)
    workers = DistributeConfig(name="multi_worker", workers=["a:1", "b:1", "c:1"], index=1)
    assert planned_replicas(workers, "CPU", 0) == (3, False)
    assert planned_replicas(workers, "GPU", 2) == (6, False)
