"""The run folder: every file a training run and its evaluation keep, and the one place their names are joined.

    <run_dir>/config.json        the resolved config (read_config upgrades older ones)
              split.json         train/val/test case ids
              plan.txt plan.json the memory plan
              state.json         epoch, optimizer step, partial sums, history, best
              history.csv        per-epoch metrics
              training_curves.png  loss and Dice per region per epoch (redrawn as epochs end)
              mlflow.json        the MLflow run this folder logs to
              checkpoints/last.keras best.keras
              eval/<split>/metrics.csv summary.json per_case.png predictions/ overlays/
              eval/<split>/cases/<case_id>.json  a case's metrics and what made them (resumes evaluation)
              export/            the model as a SavedModel with preprocessing.json (scripts/export.py)
              postprocess.json   the post-processing chosen on the val split, and for which checkpoint
                                 and inference settings (brats_seg.evaluation.postprocess)

An ensemble's folder (``ensemble.json`` names its runs: brats_seg.evaluation.inference.ensemble) reads as a run.

Training, resume, evaluation, prediction and the scripts ask a :class:`RunFolder` for these
paths and files instead of joining names. Every file a later step reads is written through
:mod:`brats_seg.files` (temporary file, fsync, rename), so a run killed at any moment never
leaves a half-written one to be read back. Nothing here imports TensorFlow.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from brats_seg.config import TrainConfig, config_from_dict, config_to_dict
from brats_seg.data.errors import DataError
from brats_seg.data.labels import resolve_model_outputs
from brats_seg.files import write_text_atomic

__all__ = ["CHECKPOINTS", "OLD_BEHAVIOUR", "RunError", "RunFolder", "has_progress", "upgrade_config_dict"]

CHECKPOINTS = ("best", "last")  # checkpoints/<name>.keras

_CONFIG = "config.json"
_SPLIT = "split.json"
_STATE = "state.json"
_HISTORY = "history.csv"
_CURVES = "training_curves.png"
_PLAN = ("plan.txt", "plan.json")
_TRACKING = "mlflow.json"
_CHECKPOINT_DIR = "checkpoints"
_EVAL = "eval"
_LOCK = ".lock"
_EVAL_CASES = "cases"  # eval/<split>/cases/<case_id>.json
_LOG = "train.log"
_EXPORT = "export"  # scripts/export.py's default output: the model as a SavedModel
_POSTPROCESS = "postprocess.json"
# Everything a run folder may hold before its config.json is written (a failed or new run).
_OURS = {
    _CONFIG,
    _SPLIT,
    _STATE,
    _HISTORY,
    _CURVES,
    *_PLAN,
    _TRACKING,
    _CHECKPOINT_DIR,
    _EVAL,
    _LOCK,
    _LOG,
    _EXPORT,
    _POSTPROCESS,
}


class RunError(DataError):
    """A run folder or the inference settings cannot be used (no config.json, no checkpoint,
    unreadable files, a bad ``evaluate.*`` value); the message says what to do."""


#: Keys whose default changed meaning, with the value a run written before the key existed had
#: (what upgrade_config_dict writes out, and what such a run needs on the command line to resume).
OLD_BEHAVIOUR = {"model.regions": "independent", "trainer.batch_dice": False, "data.stratify": False}


def upgrade_config_dict(stored: dict) -> dict:
    """A stored ``config.json`` brought to this version's keys (in place; returned).

    Keys added since a run was written take their defaults when the dataclasses are filled
    (:func:`~brats_seg.config.config_from_dict`). Where a default changed meaning, the old
    behaviour is written out here: runs from before ``model.regions`` had independent
    sigmoids, runs from before ``trainer.batch_dice`` a per-sample Dice, runs from before
    ``data.stratify`` a plain random split. Keys that were removed are dropped: ``lms.enabled`` (IBM's switch, which
    ``lms=off`` already says and nothing read), ``evaluate`` (the first versions kept the
    inference settings in the training config; they are ``scripts/evaluate.py``'s now) and
    ``plan`` and ``benchmark`` (``scripts/plan_memory.py``'s and ``scripts/benchmark.py``'s own
    groups, which training never read).
    """
    for key, old in OLD_BEHAVIOUR.items():
        group, name = key.split(".")
        if isinstance(stored.get(group), dict):
            stored[group].setdefault(name, old)
    if isinstance(stored.get("lms"), dict):
        stored["lms"].pop("enabled", None)
    for removed in ("evaluate", "plan", "benchmark"):
        stored.pop(removed, None)
    return stored


@dataclass(frozen=True)
class RunFolder:
    """One run's folder (``run_dir``).

    Attributes:
        root: the folder (user paths expanded; it need not exist yet).
    """

    root: Path

    @classmethod
    def of(cls, run_dir: str | Path) -> RunFolder:
        """The folder named by ``run_dir`` (a config value or a path).

        Raises:
            RunError: ``run_dir`` is empty.
        """
        if not str(run_dir).strip():
            raise RunError("run_dir is not set: pass run_dir=<the training run's folder> (e.g. outputs/<run>).")
        return cls(Path(run_dir).expanduser())

    # -- paths -------------------------------------------------------------------------

    @property
    def config_path(self) -> Path:
        return self.root / _CONFIG

    @property
    def split_path(self) -> Path:
        return self.root / _SPLIT

    @property
    def state_path(self) -> Path:
        return self.root / _STATE

    @property
    def history_path(self) -> Path:
        return self.root / _HISTORY

    @property
    def training_curves_path(self) -> Path:
        """``training_curves.png``: the figure of :func:`brats_seg.plots.plot_training_curves`."""
        return self.root / _CURVES

    @property
    def plan_paths(self) -> tuple[Path, Path]:
        """``(plan.txt, plan.json)``."""
        return self.root / _PLAN[0], self.root / _PLAN[1]

    @property
    def tracking_path(self) -> Path:
        return self.root / _TRACKING

    @property
    def checkpoints_dir(self) -> Path:
        return self.root / _CHECKPOINT_DIR

    def checkpoint_file(self, name: str) -> Path:
        """Where checkpoint ``name`` (``best`` | ``last``) is written (it need not exist)."""
        if name not in CHECKPOINTS:  # a name in code, not a value a user types (they pass checkpoint=best|last|path)
            raise ValueError(f"checkpoint {name!r}: the run keeps {', '.join(CHECKPOINTS)}.")
        return self.checkpoints_dir / f"{name}.keras"

    @property
    def export_dir(self) -> Path:
        """``export/``: where ``scripts/export.py`` writes the model when no ``output=`` is given."""
        return self.root / _EXPORT

    def eval_dir(self, split: str) -> Path:
        return self.root / _EVAL / split

    def metrics_csv(self, split: str) -> Path:
        return self.eval_dir(split) / "metrics.csv"

    def summary_json(self, split: str) -> Path:
        return self.eval_dir(split) / "summary.json"

    def case_scores_figure(self, split: str) -> Path:
        """``eval/<split>/per_case.png``: every case's Dice and HD95 per region."""
        return self.eval_dir(split) / "per_case.png"

    def predictions_dir(self, split: str) -> Path:
        return self.eval_dir(split) / "predictions"

    def overlays_dir(self, split: str) -> Path:
        return self.eval_dir(split) / "overlays"

    def prediction_file(self, split: str, case_id: str) -> Path:
        """``eval/<split>/predictions/<case_id>.nii.gz``: a case's mask in the layout's labels."""
        return self.predictions_dir(split) / f"{case_id}.nii.gz"

    def overlay_file(self, split: str, case_id: str) -> Path:
        """``eval/<split>/overlays/<case_id>.png``."""
        return self.overlays_dir(split) / f"{case_id}.png"

    def eval_cases_dir(self, split: str) -> Path:
        """``eval/<split>/cases/``: one record per evaluated case, so an interrupted evaluation
        continues where it stopped."""
        return self.eval_dir(split) / _EVAL_CASES

    def eval_case_file(self, split: str, case_id: str) -> Path:
        return self.eval_cases_dir(split) / f"{case_id}.json"

    @property
    def log_path(self) -> Path:
        """``train.log``: the training's log, appended to by each start and resume."""
        return self.root / _LOG

    def check_can_hold_a_run(self) -> None:
        """Refuse a folder that holds something other than a brats-seg run (before anything is written).

        A missing or empty folder, or one a training run wrote (its ``config.json`` is read by
        :meth:`read_config`, which refuses another program's), is fine. A folder without
        ``config.json`` but with other files (a dataset, a home directory, another project's
        outputs) would get our files mixed into its own: refused, naming a few of them.

        Raises:
            RunError: the folder is a file, holds another program's config.json, or holds
                files that are not a run's.
        """
        if not self.root.exists():
            return
        if not self.root.is_dir():
            raise RunError(f"run_dir {self.root} is a file, not a folder: pass run_dir= a new or empty folder.")
        if self.has_config():
            self.read_config()  # another program's config.json is refused here, naming it
            return
        foreign = sorted(
            p.name for p in self.root.iterdir() if p.name not in _OURS and not p.name.startswith((".tmp-", ".old-"))
        )
        if foreign:
            shown = ", ".join(foreign[:4]) + (f" and {len(foreign) - 4} more" if len(foreign) > 4 else "")
            raise RunError(
                f"run_dir {self.root} already holds files that are not a brats-seg run ({shown}): "
                "pass run_dir= a new or empty folder, so that the run's files are not mixed with them."
            )

    # -- config ------------------------------------------------------------------------

    def has_config(self) -> bool:
        return self.config_path.is_file()

    def read_config(self) -> TrainConfig:
        """The :class:`TrainConfig` the run was trained with, upgraded to this version
        (:func:`upgrade_config_dict`) and with its outputs resolved: the one reader, for
        training's resume check, evaluation and prediction alike.

        Raises:
            RunError: the folder or its config.json is missing or unreadable.
        """
        if not self.has_config():
            what = "does not exist" if not self.root.is_dir() else "has no config.json"
            raise RunError(
                f"run folder {self.root} {what}, so it is not a training run; train first: "
                f"python train.py run_dir={self.root}"
            )
        try:
            stored = json.loads(self.config_path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise RunError(
                f"{self.config_path} is not readable JSON ({e}); it is not a brats-seg run's config: "
                "pass run_dir= a new folder, or the folder a training run wrote."
            ) from e
        if not isinstance(stored, dict) or not {"data", "model", "trainer"} <= set(stored):
            raise RunError(
                f"{self.config_path} is not a brats-seg run's config.json (another program's file?): "
                "pass run_dir= a new folder, or the folder a training run wrote."
            )
        try:
            stored = upgrade_config_dict(stored)
            return resolve_model_outputs(config_from_dict(TrainConfig, stored))
        except (json.JSONDecodeError, UnicodeDecodeError, TypeError, ValueError, AttributeError) as e:
            raise RunError(
                f"{self.config_path} cannot be read as a brats-seg run config ({e}). "
                "Re-run training into a new run_dir."
            ) from e

    def write_config(self, cfg: TrainConfig) -> Path:
        return write_text_atomic(self.config_path, json.dumps(config_to_dict(cfg), indent=1))

    # -- split -------------------------------------------------------------------------

    def has_split(self) -> bool:
        return self.split_path.is_file()

    def read_split(self) -> dict[str, list[str]]:
        """``{"train": [...], "val": [...], "test": [...]}`` of the run.

        Raises:
            RunError: no or an unreadable split.json.
        """
        try:
            split = json.loads(self.split_path.read_text())
        except FileNotFoundError:
            raise RunError(
                f"{self.split_path} not found: the run has not started training; train first: "
                f"python train.py run_dir={self.root}"
            ) from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise RunError(f"{self.split_path} cannot be read ({e}); re-run training into a new run_dir.") from e
        if not isinstance(split, dict):
            raise RunError(f"{self.split_path} is not a train/val/test split; re-run training into a new run_dir.")
        return split

    def write_split(self, split: Mapping[str, Any]) -> Path:
        """``split.json``: the case ids per split (and whatever else the dataset's split file
        records, e.g. its seed and fractions)."""
        return write_text_atomic(
            self.split_path,
            json.dumps({k: list(v) if isinstance(v, (list, tuple)) else v for k, v in split.items()}, indent=1),
        )

    # -- training state ----------------------------------------------------------------

    def read_state(self) -> dict[str, Any] | None:
        """``state.json`` (completed epochs, position, history, best), or None for a new run."""
        if not self.state_path.is_file():
            return None
        try:
            return json.loads(self.state_path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise RunError(f"{self.state_path} cannot be read ({e}); the run cannot be resumed from it.") from e

    def write_state(self, state: Mapping[str, Any]) -> Path:
        return write_text_atomic(self.state_path, json.dumps(dict(state), indent=1))

    def write_history_csv(self, history: Sequence[Mapping[str, Any]]) -> Path:
        """``history.csv``: one row per epoch, every key any epoch has (empty where it lacks one)."""
        keys: list[str] = []
        for row in history:
            keys.extend(k for k in row if k not in keys)
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=keys, restval="")
        writer.writeheader()
        for row in history:
            writer.writerow({k: ("" if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()})
        return write_text_atomic(self.history_path, buf.getvalue())

    # -- plan and tracking -------------------------------------------------------------

    def read_plan(self) -> dict[str, Any] | None:
        """``plan.json`` as written by :meth:`write_plan`; None if missing or unreadable."""
        path = self.plan_paths[1]
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            return None
        return record if isinstance(record, dict) else None

    def write_plan(self, table: str, plan_json: str) -> list[Path]:
        """``plan.txt`` (the table) and ``plan.json``."""
        txt, js = self.plan_paths
        return [write_text_atomic(txt, table), write_text_atomic(js, plan_json)]

    def read_tracking(self) -> dict[str, Any] | None:
        """``mlflow.json`` (the MLflow run this folder logs to), or None."""
        if not self.tracking_path.is_file():
            return None
        try:
            return json.loads(self.tracking_path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            return None  # a new MLflow run is started instead

    def write_tracking(self, record: Mapping[str, Any]) -> Path:
        return write_text_atomic(self.tracking_path, json.dumps(dict(record), indent=1))

    # -- post-processing ---------------------------------------------------------------

    @property
    def postprocess_path(self) -> Path:
        """``postprocess.json``: the post-processing chosen on the val split (when chosen)."""
        return self.root / _POSTPROCESS

    def read_postprocess(self) -> dict[str, Any] | None:
        """``postprocess.json`` as written, or None if there is none.

        Raises:
            RunError: the file exists but is not readable JSON (naming it).
        """
        try:
            record = json.loads(self.postprocess_path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
            raise RunError(
                f"{self.postprocess_path} cannot be read ({e}): delete it and run scripts/evaluate.py "
                f"run_dir={self.root} to choose the post-processing again, or pass "
                "evaluate.postprocess=none."
            ) from e
        if not isinstance(record, dict):
            raise RunError(
                f"{self.postprocess_path} is not a post-processing record: delete it and run "
                f"scripts/evaluate.py run_dir={self.root} to choose it again."
            )
        return record

    def write_postprocess(self, record: Mapping[str, Any]) -> Path:
        return write_text_atomic(self.postprocess_path, json.dumps(dict(record), indent=1, allow_nan=False) + "\n")

    # -- evaluation progress -----------------------------------------------------------

    def read_eval_case(self, split: str, case_id: str) -> dict[str, Any] | None:
        """A case's evaluation record (its metrics row and the fingerprint of what made it), or
        None if there is none or it cannot be read (the case is then evaluated again)."""
        try:
            record = json.loads(self.eval_case_file(split, case_id).read_text())
        except (OSError, json.JSONDecodeError, UnicodeDecodeError):
            return None
        return record if isinstance(record, dict) else None

    def write_eval_case(self, split: str, case_id: str, record: Mapping[str, Any]) -> Path:
        """Write a case's evaluation record (JSON-able, no NaN) atomically, after its prediction."""
        return write_text_atomic(
            self.eval_case_file(split, case_id), json.dumps(dict(record), indent=1, allow_nan=False) + "\n"
        )

    # -- checkpoints -------------------------------------------------------------------

    def checkpoint(self, which: str = "best") -> Path:
        """The checkpoint to load: ``best`` | ``last`` of this run, or a ``.keras`` file's path; of an
        ensemble's folder, its ``ensemble.json`` once every member's ``which`` checkpoint is there.

        Raises:
            RunError: an unknown name, or a checkpoint not saved yet.
        """
        members = self.ensemble_members()
        if members:
            if which not in CHECKPOINTS:
                raise RunError(f"checkpoint={which!r}: an ensemble loads each member's best or last checkpoint.")
            for member in members:
                member.checkpoint(which)
            return self.ensemble_path
        if which in CHECKPOINTS:
            path = self.checkpoint_file(which)
        elif which.endswith(".keras"):
            path = Path(which).expanduser()
        else:
            raise RunError(f"checkpoint={which!r}: use best, last, or the path of a .keras file.")
        if not path.is_file():
            raise RunError(
                f"checkpoint {path} not found: the run has not saved a model yet; train first: "
                f"python train.py run_dir={self.root}"
            )
        return path

    def checkpoint_identity(self, which: str = "best") -> dict[str, Any]:
        """What tells the weights of checkpoint ``which`` apart: its size and the SHA-256 of its
        bytes (of an ensemble's folder: each member's, in order). Outputs recorded with an
        identity are reused only while it holds: a new save changes it, while moving or copying
        the run folder does not.

        Raises:
            RunError: as :meth:`checkpoint`.
        """
        members = self.ensemble_members()
        if members:
            self.checkpoint(which)
            return {"ensemble": [member.checkpoint_identity(which) for member in members]}
        path = self.checkpoint(which)
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        return {"size": path.stat().st_size, "sha256": digest.hexdigest()}

    @property
    def ensemble_path(self) -> Path:
        return self.root / "ensemble.json"

    def ensemble_members(self) -> list[RunFolder]:
        """The member runs of an ensemble's folder (its ``ensemble.json``; unreadable: RunError); ``[]`` for a run."""
        try:
            members = [RunFolder(Path(m["run_dir"])) for m in json.loads(self.ensemble_path.read_text())["members"]]
        except FileNotFoundError:
            return []
        except (OSError, ValueError, TypeError, KeyError) as e:
            raise RunError(
                f"{self.ensemble_path} cannot be read ({e!r}); make the ensemble again in a new folder."
            ) from e
        if not members:
            raise RunError(f"{self.ensemble_path} names no member runs; make the ensemble again in a new folder.")
        return members


def has_progress(run_dir: str | Path) -> bool:
    """Whether the run folder holds a completed step (a checkpoint or a recorded position)."""
    folder = RunFolder(Path(run_dir))
    state = folder.read_state()
    return bool(state and (state.get("epoch") or state.get("step"))) or folder.checkpoint_file("last").is_file()
