"""Names in MLflow: the run's own (readable name, git commit) and the keys and values MLflow accepts.

MLflow refuses a whole batch for one bad key (a ``?`` in a config key) and caps values
(params at 6000 characters, tags at 8000). A refused batch would lose the good values with the
bad one, so keys are mended and values cut, the cut marked, before anything is sent.
"""

from __future__ import annotations

import re
import subprocess
from datetime import datetime
from pathlib import Path

from brats_seg.tracking.store import find_project_root

__all__ = ["MAX_KEY_CHARS", "MAX_PARAM_CHARS", "MAX_TAG_CHARS", "git_commit", "make_run_name", "mlflow_key",
           "mlflow_value"]

MAX_KEY_CHARS = 250  # MLflow's longest param, tag or metric key
MAX_PARAM_CHARS = 6000  # MLflow's longest param value
MAX_TAG_CHARS = 8000  # MLflow's longest tag value
_TRUNCATED = "...[truncated]"
_BAD_KEY_CHARS = re.compile(r"[^/\w.\- ]")  # MLflow allows these (plus ':' off Windows)


def make_run_name(data_name: str, resolution_name: str, model_desc: str, backend_name: str, lms_name: str,
                  now: datetime | None = None) -> str:
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
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10,
                              check=True).stdout.strip()

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
