"""Names in MLflow: the run's own (readable name, git commit), the metric keys its charts group
by, and the keys and values MLflow accepts.

MLflow refuses a whole batch for one bad key (a ``?`` in a config key) and caps values
(params at 6000 characters, tags at 8000). A refused batch would lose the good values with the
bad one, so keys are mended and values cut, the cut marked, before anything is sent.

**Chart sections.** MLflow's run page and its experiment's chart view put a metric in the section
named by its key up to the last ``/`` (``Dice/val_wt`` in "Dice", shown as ``val_wt``); a key
without one falls in "Model metrics", and the sections are ordered by name, capitals first
(MLflow 3.17 sorts them as plain strings), before "Model metrics" and "System metrics". A run
logs some 170 metrics (per-epoch losses, Dice, region monitors, memory; and an evaluation's
mean, median and std of every column of ``metrics.csv``), so the keys sent to MLflow are
chosen here, in one table, to lead with what a user looks for first, in capitalised sections:
``Dice`` (training and validation Dice per region and their mean), ``Eval <split>`` (an
evaluation's mean per column: the scores that count) and ``Loss``; everything else follows
in lower-case sections (``region monitors``, ``optimizer``, ``memory and time``,
``eval <split> median``/``std``). The run folder keeps the flat names (``history.csv``,
``metrics.csv``); only MLflow's keys are sectioned.
"""

from __future__ import annotations

import re
import subprocess
from datetime import datetime
from pathlib import Path

from brats_seg.tracking.store import find_project_root

__all__ = [
    "MAX_KEY_CHARS",
    "MAX_PARAM_CHARS",
    "MAX_TAG_CHARS",
    "evaluation_metric_key",
    "git_commit",
    "make_run_name",
    "mlflow_key",
    "mlflow_value",
    "training_metric_key",
]

MAX_KEY_CHARS = 250  # MLflow's longest param, tag or metric key
MAX_PARAM_CHARS = 6000  # MLflow's longest param value
MAX_TAG_CHARS = 8000  # MLflow's longest tag value
_TRUNCATED = "...[truncated]"
_BAD_KEY_CHARS = re.compile(r"[^/\w.\- ]")  # MLflow allows these (plus ':' off Windows)

# A training log key -> its MLflow key: (pattern on the flat name, section, name in the section).
# The first match wins; ``{split}`` is "val" for a validation value (``val_`` prefix), else "train".
_TRAINING_SECTIONS = (
    (re.compile(r"(?P<val>val_)?loss"), "Loss", "{split}"),
    (re.compile(r"best_val_dice_mean"), "Dice", "val_mean_best"),
    (re.compile(r"(?P<val>val_)?dice_(?P<rest>\w+)"), "Dice", "{split}_{rest}"),
    (re.compile(r"(?:val_)?(?:prob|vol|ref_vol)_\w+"), "region monitors", "{key}"),
    (re.compile(r"learning_rate"), "optimizer", "{key}"),
    (re.compile(r"\w+_s|\w+_bytes|lms_\w+"), "memory and time", "{key}"),  # step_s, val_s, peak_bytes
    (re.compile(r"steps|stage"), "schedule", "{key}"),  # the steps an epoch took; a patch schedule's stage
)


def make_run_name(
    data_name: str, resolution_name: str, model_desc: str, backend_name: str, lms_name: str, now: datetime | None = None
) -> str:
    """A run name readable in the MLflow UI, e.g. ``synthetic-tiny-unet3d_d3f8-cpu_onednn-lmsoff-1122-1430``.

    Args:
        data_name, resolution_name, model_desc, backend_name, lms_name: the run's set-up.
        now: time for the ``MMDD-HHMM`` suffix; default now (local time).
    """
    parts = [data_name, resolution_name, model_desc, backend_name, f"lms{lms_name}"]
    parts = [re.sub(r"[^\w.+]+", "_", str(p)).strip("_") or "x" for p in parts]
    return "-".join(parts) + (now or datetime.now()).strftime("-%m%d-%H%M")


def git_commit(root: Path | None = None) -> str:
    """Short sha of the project repository, ``+dirty`` with uncommitted changes, ``unknown`` outside git.

    MLflow's own ``mlflow.source.git.commit`` tag has the sha but not whether the working tree
    had changes, which is what tells a reproducible run from one that is not.
    """
    root = Path(root) if root is not None else find_project_root()

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()

    try:
        sha = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{sha}+dirty" if dirty else sha


def mlflow_key(key: object) -> str:
    """A key MLflow accepts: allowed characters only, no empty/``.``/``..`` segments, <= 250 chars."""
    text = _BAD_KEY_CHARS.sub("_", str(key))[:MAX_KEY_CHARS]
    segments = ["__" if s == ".." else s for s in text.split("/") if s not in ("", ".")]
    return "/".join(segments) or "_"


def mlflow_value(value: object, limit: int) -> str:
    """``str(value)`` cut to ``limit`` characters, the cut marked."""
    text = value if isinstance(value, str) else str(value)
    return text if len(text) <= limit else text[: limit - len(_TRUNCATED)] + _TRUNCATED


def training_metric_key(key: str) -> str:
    """The MLflow key of a per-epoch training value, in the chart section a user looks for it in.

    ``loss`` -> ``Loss/train``, ``val_loss`` -> ``Loss/val``, ``val_dice_wt`` -> ``Dice/val_wt``,
    ``dice_mean`` -> ``Dice/train_mean``, ``val_prob_tc`` -> ``region monitors/val_prob_tc``,
    ``peak_bytes`` -> ``memory and time/peak_bytes``; a key no rule knows is sent as it is (MLflow
    shows it under "Model metrics", after the sections). See the module's "Chart sections".
    """
    for pattern, section, name in _TRAINING_SECTIONS:
        match = pattern.fullmatch(key)
        if match:
            groups = match.groupdict()
            split = "val" if groups.get("val") else "train"
            return f"{section}/{name.format(split=split, rest=groups.get('rest'), key=key)}"
    return key


def evaluation_metric_key(split: str, column: str, stat: str) -> str:
    """The MLflow key of an evaluation's statistic of a ``metrics.csv`` column.

    The mean leads, in ``Eval <split>`` (``Eval test/dice_wt``); the median and the standard
    deviation follow in ``eval <split> median``/``eval <split> std``.
    """
    return f"Eval {split}/{column}" if stat == "mean" else f"eval {split} {stat}/{column}"
