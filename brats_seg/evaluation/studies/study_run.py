"""A study's analysis run end to end: its run folders found, evaluated where a set is missing,
read, compared, written, drawn and logged (``scripts/study.py``).

:func:`run_study` finds every run folder under the study's folder (a training run's config and
state), runs ``scripts/evaluate.py`` for a finished run that lacks a requested set (one after
another, each logged to ``<dir>/logs/``), reads the summaries, and hands plain values to
:func:`brats_seg.evaluation.studies.study.compute_study`; it writes ``study.json``, draws the charts of
:mod:`brats_seg.plots.study` and logs both into each run's MLflow run. Progress and warnings
are logged; the report (the Markdown tables, what was not evaluated, what failed) is returned
(:class:`StudyOutcome`, :func:`format_report`) for ``scripts/study.py`` to print.
:func:`run_logged` is also how ``scripts/demo_seeds.py`` runs its commands.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from brats_seg.choices import choice_values
from brats_seg.config import Split
from brats_seg.project import project_dir

__all__ = [
    "SETS",
    "StepFailed",
    "StudyOutcome",
    "eval_name",
    "evaluate_missing",
    "find_runs",
    "format_report",
    "log_to_mlflow",
    "parse_sets",
    "read_records",
    "run_logged",
    "run_study",
]

log = logging.getLogger(__name__)

# name -> (split, on): evaluate.py writes eval/<split>[@<on>]/summary.json
SETS = {
    "test": ("test", ""),
    "matched": ("test", ""),
    "val": ("val", ""),
    "shifted": ("test", "mni_gliomas_shifted"),
    "heldout": ("all", "mni_gliomas_heldout"),
    "heldout_shifted": ("all", "mni_gliomas_heldout_shifted"),
    "heldout2": ("all", "mni_gliomas_heldout2"),
}


class StepFailed(SystemExit):
    """A command of a study failed (its exit status and log named); a SystemExit for the drivers
    that stop there, caught by the study, which goes on with the other runs."""


def run_logged(cmd: list[str], log_file: Path) -> float:
    """Run ``cmd`` in the project folder (:func:`brats_seg.project.project_dir`) with its output appended
    to ``log_file``; its wall time in seconds.

    Raises:
        StepFailed: the command exited non-zero (the status and the log named).
    """
    log.info("  %s", " ".join(cmd[1:]))
    log_file.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    with open(log_file, "a") as f:
        proc = subprocess.run(cmd, cwd=project_dir(), stdout=f, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise StepFailed(f"error: {Path(cmd[1]).name} failed (exit {proc.returncode}); see {log_file}")
    return time.time() - t0


def parse_sets(names) -> dict[str, tuple[str, str]]:
    """``{set name: (split, on)}`` of ``sets=`` (a name, ``a,b`` quoted, or a list); an unknown
    name raises ValueError naming the known ones."""
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    out = {}
    for name in names:
        split, at, on = str(name).partition("@")
        if name in SETS:
            out[name] = SETS[name]
        elif at and split in choice_values(Split) and on:
            out[name] = (split, on)
        else:
            raise ValueError(
                f"sets: {name!r} is not a set; use {', '.join(SETS)} or <split>@<data config> "
                f"with split in {', '.join(choice_values(Split))} (e.g. all@mni_gliomas_heldout)."
            )
    if not out:
        raise ValueError("sets is empty: name at least one, e.g. sets=test")
    return out


def eval_name(split: str, on: str) -> str:
    """The folder evaluate.py writes a set to (``eval/<name>``)."""
    return f"{split}@{on}" if on else split


def find_runs(root: Path) -> tuple[list[tuple], list[str]]:
    """``([(run folder, its TrainConfig, its state)], skipped)`` under ``root``, sorted: every
    folder holding a training run's config and state; a run folder's own subfolders (eval/,
    checkpoints/) are not searched. Skipped (with the reason): a config without a state (no epoch
    done yet) or files that cannot be read."""
    from brats_seg.run_dir import RunError, RunFolder

    runs, skipped = [], []
    for here, subdirs, _ in os.walk(root):
        folder = RunFolder(Path(here))
        if not folder.has_config():
            subdirs[:] = sorted(d for d in subdirs if not d.startswith(".") and d != "logs")
            continue
        subdirs[:] = []
        try:
            state = folder.read_state()
            if state is None:
                skipped.append(f"{folder.root}: no epoch done yet")
            else:
                runs.append((folder, folder.read_config(), state))
        except RunError as e:
            skipped.append(f"{folder.root}: {e}")
    return sorted(runs, key=lambda r: str(r[0].root)), sorted(skipped)


def _hydra_value(text: str) -> str:
    """``text`` as a Hydra override value: as it is if plain, else quoted (``=``, ``,``, brackets)."""
    if re.fullmatch(r"[\w./+\-~:@%]+", text):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _name(folder, root: Path) -> str:
    return folder.root.relative_to(root).as_posix()


def evaluate_missing(runs: list[tuple], root: Path, sets: dict, conf) -> tuple[list[dict], list[dict]]:
    """Evaluate each finished run's missing sets (``conf.evaluate``), or list them: ``(missing, failed)``."""
    from brats_seg.config import flatten_config
    from brats_seg.evaluation.studies.study import compute_finished

    missing, failed = [], []
    for folder, cfg, state in runs:
        finished, why = compute_finished(flatten_config(cfg), state)
        for name, (split, on) in sets.items():
            if folder.summary_json(eval_name(split, on)).is_file():
                continue
            command = [
                sys.executable,
                str(project_dir() / "scripts" / "evaluate.py"),
                f"run_dir={_hydra_value(str(folder.root))}",
                f"split={split}",
                *([f"on={on}"] if on else []),
                f"evaluate.overlays={str(conf.overlays).lower()}",
                *conf.evaluate_args,
            ]
            entry = {"run": _name(folder, root), "set": name, "command": " ".join(command[1:])}
            if not finished:
                missing.append(dict(entry, why=f"not finished: {why}"))
                continue
            if not conf.evaluate:
                missing.append(dict(entry, why="evaluate=false"))
                continue
            log.info("%s: evaluating %s", entry["run"], name)
            log_file = root / "logs" / f"{entry['run'].replace('/', '_')}.{name}.log"
            try:
                run_logged(command, log_file)
            except StepFailed as e:
                log.error("%s", e.code)
                failed.append(dict(entry, log=str(log_file)))
    return missing, failed


def read_records(runs: list[tuple], root: Path, sets: dict, thresholds: list[float]):
    """``(records, configs, regions)`` of the runs (:func:`brats_seg.evaluation.studies.study.compute_run_record`),
    their evaluations read again (the ones just made included)."""
    import math

    from brats_seg.config import flatten_config, network_input_shape
    from brats_seg.data.labels import region_names
    from brats_seg.evaluation.studies.study import compute_run_record

    regions = [
        r for r in region_names(runs[0][1].data.layout) if all(r in region_names(cfg.data.layout) for _, cfg, _ in runs)
    ]
    records, configs = [], {}
    for folder, cfg, state in runs:
        name = _name(folder, root)
        summaries = {}
        for set_name, (split, on) in sets.items():
            path = folder.summary_json(eval_name(split, on))
            summaries[set_name] = json.loads(path.read_text()) if path.is_file() else None
        configs[name] = flatten_config(cfg)
        records.append(
            compute_run_record(
                name,
                configs[name],
                state,
                summaries,
                regions,
                thresholds,
                voxels_per_step=cfg.trainer.batch_size * math.prod(network_input_shape(cfg)),
                volume_voxels=math.prod(cfg.resolution.shape),
                stage_voxels=_stage_voxels(cfg),
            )
        )
    return records, configs, regions


def _stage_voxels(cfg) -> dict[int, int] | None:
    """A patch schedule's voxels per step by stage (1-based), None without one."""
    import math

    from brats_seg.patch_schedule import parse_schedule

    t = cfg.trainer
    stages = parse_schedule(t.patch_schedule, cfg.resolution.shape, cfg.model.depth, t.batch_size)
    if not stages:
        return None
    return {i: s.batch_size * math.prod(s.patch or cfg.resolution.shape) for i, s in enumerate(stages, start=1)}


def log_to_mlflow(runs: list[tuple], files: list[Path]) -> int:
    """Log ``files`` into each tracked run's MLflow run (artifacts ``study/``); the runs logged.

    A store that cannot be opened or written is reported once and left alone, a run the store
    no longer has is reported and passed over: the files on disk are the study's result. A
    sqlite store that is not there (the runs trained elsewhere) is not created."""
    from brats_seg.tracking import open_store, resolve_tracking_uri

    clients: dict[str, object] = {}
    logged = 0
    for folder, _, _ in runs:
        record = folder.read_tracking()
        if not isinstance(record, dict) or not record.get("run_id") or not record.get("tracking_uri"):
            continue
        uri = resolve_tracking_uri(str(record["tracking_uri"]))
        if uri not in clients:
            clients[uri] = _open_store(uri, open_store)
        if clients[uri] is None:
            continue
        try:
            for path in files:
                clients[uri].log_artifact(record["run_id"], str(path), "study")
            logged += 1
        except Exception as e:  # noqa: BLE001 - tracking never fails the study
            gone = getattr(e, "error_code", None) == "RESOURCE_DOES_NOT_EXIST"
            log.warning(
                "cannot log the study into MLflow run %s of %s at %s (%s: %s); %s",
                record["run_id"],
                folder.root,
                uri,
                type(e).__name__,
                str(e)[:300],
                "the store no longer has it."
                if gone
                else "the store is left alone; the files stay in the study's folder.",
            )
            if not gone:
                clients[uri] = None
    return logged


def _open_store(uri: str, open_store):
    """A client of the store at ``uri``, or None after one warning."""
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///") :]).is_file():
        log.warning("the MLflow store %s is not on this machine; the study is not logged there.", uri)
        return None
    try:
        return open_store(uri)
    except Exception as e:  # noqa: BLE001 - tracking never fails the study
        log.warning(
            "cannot log the study to MLflow at %s (%s: %s); the files stay in the study's folder.",
            uri,
            type(e).__name__,
            str(e)[:300],
        )
        return None


@dataclass
class StudyOutcome:
    """What :func:`run_study` did: the study (as written to ``path``), its charts, the MLflow runs
    it was logged into, and the evaluations that failed (then the exit status is 1)."""

    study: dict
    path: Path
    figures: list[Path]
    logged: int = 0
    failed: list[dict] = field(default_factory=list)

    @property
    def status(self) -> int:
        return 1 if self.failed else 0

    def failure(self) -> str | None:
        """The error line naming each failed evaluation and its log; None if none failed."""
        if not self.failed:
            return None
        return f"error: {len(self.failed)} evaluation(s) failed: " + "; ".join(
            f"{f['run']} ({f['set']}): see {f['log']}" for f in self.failed
        )


def run_study(conf) -> StudyOutcome:
    """The study of ``conf.dir``: evaluate, compute, write, draw, log. Everything is written even
    when an evaluation failed (``outcome.failed``, ``outcome.status`` 1)."""
    from brats_seg.evaluation.studies.study import compute_study
    from brats_seg.files import write_text_atomic
    from brats_seg.plots.study import plot_study

    if not str(conf.dir).strip():
        raise ValueError("dir is not set: pass dir=<the study's folder> (e.g. dir=outputs/patches_vs_whole).")
    root = Path(conf.dir).expanduser().resolve()
    if not root.is_dir():
        raise FileNotFoundError(
            f"dir={conf.dir}: no such folder; run the study's sweep first "
            "(python train.py -m experiment=<study>) or pass the sweep's folder."
        )
    sets = parse_sets(conf.sets)
    runs, skipped = find_runs(root)
    if not runs:
        raise ValueError(
            f"no run folder under {root} (a training run's folder with its config and state); "
            "run the study's sweep first: python train.py -m experiment=<study>"
        )
    log.info("%d run(s) under %s", len(runs), root)
    missing, failed = evaluate_missing(runs, root, sets, conf)
    records, configs, regions = read_records(runs, root, sets, list(conf.thresholds))
    study = compute_study(records, configs, list(sets), regions, list(conf.thresholds), list(conf.ignore))
    study.update(
        dir=str(root),
        set_definitions={n: {"split": s, "on": on} for n, (s, on) in sets.items()},
        missing=missing,
        failed_evaluations=failed,
        skipped=skipped,
    )
    path = write_text_atomic(root / "study.json", json.dumps(study, indent=1, default=str) + "\n")
    figures = plot_study(study, root, title=root.name)
    logged = log_to_mlflow(runs, [*figures, path]) if conf.mlflow else 0
    return StudyOutcome(study, path, list(figures), logged, failed)


def format_report(outcome: StudyOutcome) -> str:
    """The study's report as ``scripts/study.py`` prints it: the arms, the Markdown tables, the
    notes, what is not in the study or not evaluated, where it was logged and written."""
    from brats_seg.evaluation.studies.study import format_study_markdown

    study, root = outcome.study, Path(outcome.study["dir"])
    parts = [
        f"\n{root.name}: arms by {', '.join(study['arm_keys']) or '(one arm)'}; "
        "mean ± std over seeds; training time excludes validation\n",
        format_study_markdown(study),
    ]
    parts += [f"\nnote: {note}" for note in study["notes"]]
    if study["skipped"]:
        parts.append("\nnot in the study:\n" + "\n".join(f"  {s}" for s in study["skipped"]))
    if study["missing"]:
        parts.append(
            "\nnot evaluated:\n"
            + "\n".join(f"  {m['run']} ({m['set']}; {m['why']}): python {m['command']}" for m in study["missing"])
        )
    if outcome.logged:
        parts.append(f"\nlogged the charts and study.json to {outcome.logged} MLflow run(s), artifacts study/")
    parts.append(f"\nwrote {outcome.path}\n" + "\n".join(f"      {p}" for p in outcome.figures))
    return "\n".join(parts)
