"""The chief's tracked run of a training: its start (tags, the split as dataset inputs, the plan)
and its end (artifacts, the best value, the best checkpoint as the run's MLflow model)."""

from __future__ import annotations

from pathlib import Path

from brats_seg.config import flatten_config
from brats_seg.evaluation.serving.mlflow_model import log_best_model
from brats_seg.resolve import ResolvedRun
from brats_seg.run_dir import RunFolder
from brats_seg.tracking import Tracker, git_commit, training_metric_key
from brats_seg.tracking.datasets import split_inputs

__all__ = ["end_tracking", "start_tracking"]


def start_tracking(
    run: ResolvedRun, run_dir: Path, run_name: str, replicas: int, plan_files, tags: dict[str, str] | None
):
    """The chief's tracked run, with its tags, the split (``split.json``, and each split as an MLflow
    dataset input: :mod:`brats_seg.tracking.datasets`) and the plan."""
    cfg, backend = run.config, run.backend
    tracker = Tracker.start(
        cfg.tracking,
        run_dir,
        run_name,
        params=flatten_config(cfg),
        tags={
            "backend": backend.name,
            "device": backend.device,
            "precision": backend.precision,
            "lms": run.lms,
            "lms_reason": run.reason,
            "resolution": cfg.resolution.name,
            "data": cfg.data.name,
            "git_commit": git_commit(),
            "run_dir": str(run_dir),
            "distribute": cfg.distribute.name,
            "replicas": str(replicas),
            **({"patch_schedule": " > ".join(st.stage.name for st in run.stages)} if run.stages else {}),
            **(tags or {}),
        },
    )
    folder = RunFolder(run_dir)
    tracker.log_artifact(folder.split_path)
    tracker.log_datasets(split_inputs(cfg.data, cfg.resolution, folder.read_split()))
    for path in plan_files:
        tracker.log_artifact(path, "plan")
    return tracker


def end_tracking(tracker, state, run_dir: Path, is_chief: bool, status: str) -> None:
    """Log the final artifacts and the best value, then, if training finished, the best checkpoint as
    the run's MLflow model (registered as ``tracking.register_as`` if set:
    :mod:`brats_seg.evaluation.serving.mlflow_model`), last, so that nothing waits on it; end the tracked run."""
    folder = RunFolder(run_dir)
    try:
        if is_chief and folder.checkpoint_file("best").is_file():
            tracker.log_artifact(folder.checkpoint_file("best"), "checkpoints")
        if is_chief and folder.history_path.is_file():
            tracker.log_artifact(folder.history_path)
        tracker.log_metrics(
            {training_metric_key("best_val_dice_mean"): state["best_value"] or 0.0}, step=state["epoch"]
        )
        if is_chief and status == "FINISHED":
            log_best_model(tracker, run_dir, step=state["best_epoch"] or 0)
    finally:
        tracker.end(status)
