"""The run folder as training uses it: start or resume, refuse what would corrupt a resume, restore.

:func:`prepare_run_dir` writes ``config.json`` and ``split.json`` through
:class:`~brats_seg.run_dir.RunFolder` after :func:`check_resumable` has compared the stored
config (read by the one reader, which upgrades older runs) with this one; :func:`restore`
loads ``last.keras`` into the models and :func:`resume_position` says where in the epoch
the saved weights are.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import NamedTuple

from brats_seg.config import TrainConfig, flatten_config
from brats_seg.run_dir import OLD_BEHAVIOUR, RunFolder, has_progress

__all__ = [
    "ResumePosition",
    "check_resumable",
    "has_progress",
    "load_resume",
    "prepare_run_dir",
    "restore",
    "resume_position",
    "save_plan",
]

log = logging.getLogger(__name__)

# Keys that may change between a run and its resumption (length, patience, logging).
_RESUME_MUTABLE = {
    "trainer.epochs",
    "trainer.early_stopping_patience",
    "trainer.val_every",
    "trainer.time_budget_s",
    "run_name",
    "run_dir",
    "data.num_workers",
    "data.on_error",
    "tracking.",
    "backend.",
    "lms.",
    "distribute.",
}


def _mutable(key: str) -> bool:
    return any(key == m or (m.endswith(".") and key.startswith(m)) for m in _RESUME_MUTABLE)


def check_resumable(run_dir: Path, cfg: TrainConfig, progress: bool | None = None) -> None:
    """Refuse to continue a run folder written with a different (non-length) config.

    The stored config is read as evaluation reads it (:meth:`RunFolder.read_config`: an older
    run's config upgraded to this version's keys), so a run from an earlier version resumes.
    A folder without a completed step has nothing a changed config could corrupt: its config
    is replaced (said in the log), so the corrected command runs where the failed one did.

    Args:
        progress: :func:`has_progress` if the caller knows it (read from the folder otherwise).
    """
    folder = RunFolder(run_dir)
    if not folder.has_config():
        return
    old = flatten_config(folder.read_config())
    new = flatten_config(cfg)
    diff = {
        k: (old.get(k), new.get(k)) for k in sorted(set(old) | set(new)) if not _mutable(k) and old.get(k) != new.get(k)
    }
    if not diff:
        return
    lines = ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in list(diff.items())[:6])
    if not (has_progress(run_dir) if progress is None else progress):
        log.warning("run_dir %s had no completed step: its config is replaced (%s)", run_dir, lines)
        return
    # a run from before a key whose default changed: the value that resumes it (OLD_BEHAVIOUR)
    restore = [
        f"{k}={str(v).lower() if isinstance(v, bool) else v}"
        for k, v in OLD_BEHAVIOUR.items()
        if k in diff and old.get(k) == v
    ]
    hint = f" A run from before these keys existed: add {' '.join(restore)} to resume it." if restore else ""
    raise ValueError(
        f"run_dir {run_dir} holds a run with a different config ({lines}). Re-running the same "
        f"command resumes it; for a new experiment pass a new run_dir=.{hint}"
    )


def prepare_run_dir(cfg: TrainConfig, split: dict, split_path: Path) -> Path:
    """Create or reopen the run folder and write ``config.json`` and ``split.json``.

    Raises:
        ValueError: the folder has progress and a different config, or its test split changed.
    """
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    progress = has_progress(run_dir)
    check_resumable(run_dir, cfg, progress)
    folder = RunFolder(run_dir)
    folder.write_config(cfg)
    if folder.has_split() and progress:
        if folder.read_split().get("test") != split["test"]:
            raise ValueError(
                f"{folder.split_path}: the dataset's test split changed since this run started "
                f"({split_path}). Resuming would train on former test cases; start a new run_dir=."
            )
    else:  # the run's split (the seeded split's seed and fractions, or its fold and file, with the ids)
        folder.write_split(split)
    return run_dir


def save_plan(run, run_dir: Path) -> list[Path]:
    """``plan.txt`` and ``plan.json`` (the plan, each patch-schedule stage's, and the settings they
    were made for, :func:`~brats_seg.resolve.planned_for`): written before the first step, read back on resume
    (:func:`~brats_seg.resolve.stored_plan`)."""
    from brats_seg.resolve import planned_for

    record = {**run.plan.to_dict(), "planned_for": planned_for(run)}
    table = run.plan.format_table()
    if run.stages:  # a patch schedule: each stage's plan (the top-level one is the highest peak's)
        record["stages"] = [st.to_dict() for st in run.stages]
        table += "".join(
            f"\n\nstage {i + 1}/{len(run.stages)}: {st.stage.name}, batch {st.stage.batch_size}, share "
            f"{st.stage.share:.3g}\n{st.plan.format_table()}"
            for i, st in enumerate(run.stages)
        )
    return RunFolder(run_dir).write_plan(table, json.dumps(record, indent=2))


def restore(model, export_model, last: Path) -> None:
    """Weights and optimizer state of ``last.keras`` into the (shared) models.

    Optimizer variables are matched by path without the optimizer's own name, which
    depends on how many optimizers the process has made (``adam_3/enc0_conv1_kernel_momentum``).
    """
    import keras

    def key(v) -> str:
        return v.path.split("/", 1)[-1]

    restored = keras.models.load_model(last, compile=True)
    export_model.set_weights(restored.get_weights())
    model.optimizer.build(model.trainable_variables)
    theirs = {key(v): v for v in restored.optimizer.variables}
    missing = [v.path for v in model.optimizer.variables if key(v) not in theirs]
    if missing:
        raise ValueError(
            f"{last}: its optimizer state lacks {missing[:3]}: the checkpoint is from another model. "
            "Resume with the config it was trained with, or start a new run_dir=."
        )
    for v in model.optimizer.variables:
        v.assign(theirs[key(v)])


class ResumePosition(NamedTuple):
    """Where a run (re)starts: ``step`` steps of the 0-based ``epoch`` done."""

    epoch: int  # epochs completed (Keras' initial_epoch)
    step: int  # steps of ``epoch`` done (a run stopped mid-epoch by a signal), else 0
    partial: dict | None = None  # those steps' sums (EpochSums.to_dict), when state.json kept them


def resume_position(state, iterations: int | None, steps: int) -> ResumePosition:
    """The :class:`ResumePosition` to resume at: ``state.json``'s, checked against the
    optimizer step restored from ``last.keras``.

    ``state.json`` is written before ``last.keras`` and carries the state it replaces
    (``previous``). A run killed between the two writes leaves a state one save ahead of the
    weights: the optimizer step inside ``last.keras`` equals ``previous``'s, and the state is
    rolled back to it (in place: history, best and position), so the lost epoch is trained
    again and recorded once. Runs written by earlier versions wrote the weights first; for
    those, weights newer than the state are located by their optimizer step (one per training
    step; under fp16 loss scaling, skipped steps make this approximate), without partial sums.
    """
    recorded = state.get("iterations")
    previous = state.get("previous")
    if (
        iterations is not None
        and recorded is not None
        and int(iterations) != int(recorded)
        and isinstance(previous, dict)
        and previous.get("iterations") is not None
        and int(previous["iterations"]) == int(iterations)
    ):
        log.warning(
            "state.json is one save ahead of last.keras (optimizer step %d, the weights %d): stopped between "
            "the two writes; resuming from the save before (epoch %d step %d)",
            recorded,
            iterations,
            int(previous["epoch"]),
            int(previous.get("step", 0)),
        )
        state.clear()
        state.update(previous)
        recorded = state.get("iterations")
    epoch, step = int(state["epoch"]), int(state.get("step", 0))
    partial = state.get("partial") if state.get("partial_epoch") == epoch + 1 and step else None
    if iterations is not None and recorded is not None and int(iterations) != int(recorded):
        new_epoch, new_step = divmod(int(iterations), steps)
        log.warning(
            "last.keras holds optimizer step %d but state.json was written at step %d (epoch %d step %d): "
            "stopped between the two writes; resuming at epoch %d step %d from the weights",
            iterations,
            recorded,
            epoch,
            step,
            new_epoch + 1,
            new_step,
        )
        return ResumePosition(new_epoch, new_step)
    return ResumePosition(epoch, step, partial)


def load_resume(run_dir: Path, state, model, export_model, steps: int) -> ResumePosition:
    """Where the run starts: epoch 0 step 0 for a new run; for a resumed one, ``last.keras``
    restored into the models and the position it was saved at.

    Raises:
        FileNotFoundError: ``state.json`` records progress but ``last.keras`` is missing.
    """
    if not state:
        return ResumePosition(0, 0)
    folder = RunFolder(run_dir)
    last = folder.checkpoint_file("last")
    if not last.is_file():
        previous = state.get("previous")
        if isinstance(previous, dict) and not previous.get("epoch") and not previous.get("step"):
            # killed between the first state.json and the first last.keras: nothing was saved
            log.warning(
                "%s is one save ahead of a checkpoint that was never written: starting from the beginning",
                folder.state_path,
            )
            state.clear()
            state.update(previous)
            return ResumePosition(0, 0)
        raise FileNotFoundError(f"{folder.state_path} says {state['epoch']} epochs are done but {last} is missing.")
    restore(model, export_model, last)
    position = resume_position(state, int(model.optimizer.iterations.numpy()), steps)
    folder.write_history_csv(state.get("history", []))  # a run killed while writing it leaves it behind state.json
    return position
