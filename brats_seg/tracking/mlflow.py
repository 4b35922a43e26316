"""MLflow tracking that never stops training, with a local record of every call.

A :class:`Tracker` talks to MLflow through ``MlflowClient`` with an explicit run id (no
global active run), so several trackers can live in one process. Every call is first
written to ``<run_dir>/tracking/`` (``params.json``, ``tags.json``, ``metrics.jsonl``,
``artifacts.txt``, ``run.json``, ``text/``), then sent to MLflow. The first MLflow
failure logs ONE warning naming the URI and the local record, and the tracker stops
contacting the store; no tracking call ever raises into training.

Where things land:

* ``sqlite:///mlruns.db`` (the default): a relative sqlite path is taken from the project
  root (the folder holding ``pyproject.toml`` and ``brats_seg/``), so every run lands in
  one store whatever the cwd. Experiments created here get an explicit artifact location
  beside the database (``<db folder>/mlartifacts/<experiment>``): MLflow's client would
  otherwise default to ``./mlruns/<id>`` under the cwd.
* ``http(s)://`` servers are probed once at start (no retries, short timeout). For the
  calls after that, the MLflow HTTP retry settings get bounded defaults
  (``MLFLOW_HTTP_REQUEST_MAX_RETRIES``, ``MLFLOW_HTTP_REQUEST_TIMEOUT``, only if unset),
  so a server dying mid-run costs one short stall instead of minutes per call.
* ``<run_dir>/mlflow.json`` records the run; re-running with the same ``run_dir``
  (training resume) or :meth:`Tracker.resume` (evaluation) reopens that run.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Callable

from brats_seg.config import TrackingConfig
from brats_seg.files import file_lock, write_text_atomic

__all__ = [
    "NullTracker",
    "Tracker",
    "make_run_name",
    "git_commit",
    "find_project_root",
    "resolve_tracking_uri",
    "artifact_location_for",
    "RUN_FILE",
    "RECORD_DIR",
]

log = logging.getLogger(__name__)

DEFAULT_URI = "sqlite:///mlruns.db"
RUN_FILE = "mlflow.json"  # in run_dir: which MLflow run holds this run folder
RECORD_DIR = "tracking"  # in run_dir: the local record of every tracking call
_STATUSES = ("FINISHED", "FAILED", "KILLED")
_PROBE_TIMEOUT_S = 5  # connectivity probe of an http(s) server, no retries
# Bounded retries for calls after a successful probe (MLflow defaults: 7 retries, 120 s timeout,
# i.e. minutes per call when a server goes away). Set only if the user has not set them.
_HTTP_ENV_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "30"}
_MAX_KEY_CHARS = 250  # MLflow's MAX_ENTITY_KEY_LENGTH
_MAX_PARAM_CHARS = 6000  # MLflow's MAX_PARAM_VAL_LENGTH
_MAX_TAG_CHARS = 8000  # MLflow's MAX_TAG_VAL_LENGTH
_BATCH = 100  # MLflow's MAX_PARAMS_TAGS_PER_BATCH (metrics allow 1000)
_TRUNCATED = "...[truncated]"
# MLflow error codes meaning "this call was refused", not "the store is gone".
_REJECTED = {"INVALID_PARAMETER_VALUE", "RESOURCE_ALREADY_EXISTS", "RESOURCE_DOES_NOT_EXIST", "BAD_REQUEST",
             "INVALID_STATE"}
_BAD_KEY_CHARS = re.compile(r"[^/\w.\- ]")  # MLflow allows these (plus ':' off Windows)


# ---------------------------------------------------------------------------------------------
# Helpers: project root, URIs, names
# ---------------------------------------------------------------------------------------------

def find_project_root(start: Path | None = None) -> Path:
    """The brats-seg project folder: the first parent holding ``pyproject.toml`` and ``brats_seg/``.

    Args:
        start: where to start looking; default this file's folder.

    Returns:
        The project root, or the current working directory if none is found (installed copy).
    """
    here = Path(start if start is not None else Path(__file__).parent).resolve()
    for folder in (here, *here.parents):
        if (folder / "pyproject.toml").is_file() and (folder / "brats_seg").is_dir():
            return folder
    return Path.cwd()


def resolve_tracking_uri(uri: str, root: Path | None = None) -> str:
    """Make a relative ``sqlite:///`` path absolute, taken from the project root.

    Args:
        uri: a tracking URI; empty means ``$MLFLOW_TRACKING_URI`` or ``sqlite:///mlruns.db``.
        root: the folder relative sqlite paths are taken from; default :func:`find_project_root`.

    Returns:
        ``sqlite:////abs/path.db`` for sqlite files, any other URI unchanged.
    """
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI
    prefix = "sqlite:///"
    if not uri.startswith(prefix):
        return uri
    path, sep, query = uri[len(prefix):].partition("?")
    if not path or path == ":memory:" or path.startswith("/"):
        return uri
    base = Path(root) if root is not None else find_project_root()
    return f"{prefix}{(base / Path(path).expanduser()).resolve()}{sep}{query}"


def _sqlite_path(uri: str) -> Path | None:
    """The database file of an absolute ``sqlite:////...`` URI, else None."""
    prefix = "sqlite:///"
    if not uri.startswith(prefix):
        return None
    path = uri[len(prefix):].partition("?")[0]
    return Path(path) if path.startswith("/") else None


def artifact_location_for(uri: str, experiment: str) -> str | None:
    """Artifact location for a new experiment: beside a sqlite database, else MLflow's choice.

    Args:
        uri: a resolved tracking URI (see :func:`resolve_tracking_uri`).
        experiment: the experiment name.

    Returns:
        ``file:///<db folder>/mlartifacts/<experiment>`` for a sqlite file store; None (let the
        server or MLflow decide) otherwise.
    """
    db = _sqlite_path(uri)
    if db is None:
        return None
    slug = re.sub(r"[^\w.-]+", "_", experiment).strip("._") or "experiment"
    return (db.parent / "mlartifacts" / slug).as_uri()


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
    """Short sha of the project repository, ``+dirty`` with uncommitted changes, ``unknown`` outside git."""
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


def _mlflow_key(key: object) -> str:
    """A key MLflow accepts: allowed characters only, no empty/``.``/``..`` segments, <= 250 chars."""
    text = _BAD_KEY_CHARS.sub("_", str(key))[:_MAX_KEY_CHARS]
    segments = ["__" if s == ".." else s for s in text.split("/") if s not in ("", ".")]
    return "/".join(segments) or "_"


def _mlflow_value(value: object, limit: int) -> str:
    """``str(value)`` cut to ``limit`` characters, the cut marked."""
    text = value if isinstance(value, str) else str(value)
    return text if len(text) <= limit else text[: limit - len(_TRUNCATED)] + _TRUNCATED


def _write_json_atomic(path: Path, obj: object) -> None:
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def _read_run_file(run_dir: Path) -> dict | None:
    path = run_dir / RUN_FILE
    if not path.is_file():
        return None
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        log.warning("cannot read %s (%s); a new MLflow run is created. Delete or fix the file to silence this.",
                    path, exc)
        return None
    return saved if isinstance(saved, dict) and saved.get("run_id") else None


def _short(exc: BaseException, limit: int = 300) -> str:
    text = f"{type(exc).__name__}: {exc}".replace("\n", " ")
    return text if len(text) <= limit else text[:limit] + "..."


# ---------------------------------------------------------------------------------------------
# Local record
# ---------------------------------------------------------------------------------------------

class _LocalRecord:
    """``<run_dir>/tracking/``: what every tracking call asked for, whatever MLflow did with it."""

    def __init__(self, folder: Path, warn_once: Callable[[str, str], None]) -> None:
        self.folder = folder
        self._warn_once = warn_once
        self._lock = threading.Lock()

    def _guard(self, fn: Callable[[], object]) -> None:
        try:
            with self._lock:
                self.folder.mkdir(parents=True, exist_ok=True)
                fn()
        except Exception as exc:  # noqa: BLE001 - the record must never stop training
            self._warn_once("record", f"cannot write the local tracking record in {self.folder} ({_short(exc)}); "
                                      "check free disk space and permissions. Training goes on.")

    def merge_json(self, name: str, values: dict) -> None:
        """Merge ``values`` into ``<name>`` (a JSON object), atomically."""
        def write() -> None:
            path = self.folder / name
            current = json.loads(path.read_text()) if path.is_file() else {}
            current.update({str(k): v for k, v in values.items()})
            _write_json_atomic(path, current)
        self._guard(write)

    def append(self, name: str, lines: list[str]) -> None:
        def write() -> None:
            with open(self.folder / name, "a", encoding="utf-8") as f:
                f.writelines(line + "\n" for line in lines)
        self._guard(write)

    def write_text(self, artifact_file: str, text: str) -> Path:
        path = self.folder / "text" / _mlflow_key(artifact_file)

        def write() -> None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        self._guard(write)
        return path


# ---------------------------------------------------------------------------------------------
# Tracker
# ---------------------------------------------------------------------------------------------

class Tracker:
    """One run's tracking: MLflow (if reachable) plus the local record in ``<run_dir>/tracking/``.

    Build with :meth:`start` (training) or :meth:`resume` (evaluation of a finished run).
    No method raises into the caller; MLflow failures are logged once at warning, then at debug.
    Usable as a context manager: leaving the block ends the run (FAILED on an exception,
    KILLED on Ctrl-C).

    Attributes:
        run_id: the MLflow run id, or None when only the local record is kept.
        run_dir: the run's output folder.
        tracking_uri: the resolved tracking URI, or None with ``tracking=none``.
    """

    def __init__(self, run_dir: Path, run_name: str = "") -> None:
        self.run_dir = Path(run_dir)
        self.run_name = run_name
        self.run_id: str | None = None
        self.experiment_id: str | None = None
        self.tracking_uri: str | None = None
        self._client = None  # MlflowClient while MLflow is usable, None otherwise
        self._artifacts_ok = True
        self._warned: set[str] = set()
        self._logged_params: dict[str, str] = {}  # what the MLflow run already holds (params are immutable)
        self._monitor = None  # SystemMetricsMonitor
        self._restore_status: str | None = None  # set by resume(): end() puts this status back
        self._ended = False
        self.record = _LocalRecord(self.run_dir / RECORD_DIR, self._warn_once)

    # -- construction ---------------------------------------------------------------------------

    @classmethod
    def start(cls, cfg: TrackingConfig, run_dir: Path, run_name: str, params: dict[str, object],
              tags: dict[str, str]) -> Tracker:
        """Open the run of ``run_dir``: reopen the one in ``mlflow.json`` or create a new one.

        Args:
            cfg: ``tracking.*``; ``name=none`` keeps only the local record.
            run_dir: the run's output folder (created if missing).
            run_name: the name shown in the MLflow UI (see :func:`make_run_name`).
            params: flattened config (``{"model.depth": 4, ...}``); values are logged as strings.
            tags: extra run tags (backend, git commit, ...).

        Raises:
            ValueError: ``cfg.name`` is neither ``mlflow`` nor ``none``.
        """
        if cfg.name not in ("mlflow", "none"):
            raise ValueError(f"tracking.name must be 'mlflow' or 'none', got {cfg.name!r}; "
                             "use tracking=mlflow or tracking=none.")
        tracker = cls(run_dir, run_name)
        tracker.run_dir.mkdir(parents=True, exist_ok=True)
        tracker.record.merge_json("params.json", params)
        tracker.record.merge_json("tags.json", tags)
        if cfg.name == "none":
            log.info("tracking=none: tracking calls are only recorded in %s", tracker.record.folder)
            tracker._write_run_record("RUNNING")
            return tracker
        saved = _read_run_file(tracker.run_dir)
        uri = resolve_tracking_uri(cfg.uri)
        if saved and saved.get("tracking_uri") and saved["tracking_uri"] != uri:
            log.info("resumed run %s stays in its store %s (tracking.uri is %s)", saved["run_id"],
                     saved["tracking_uri"], uri)
            uri = saved["tracking_uri"]
        if tracker._connect(uri, cfg.experiment):
            tracker._call("open the run", lambda: tracker._open(saved, cfg, params, tags))
        if tracker._client is not None and tracker.run_id and cfg.system_metrics:
            tracker._start_system_metrics(resumed=saved is not None)
        tracker._write_run_record("RUNNING")
        return tracker

    @classmethod
    def resume(cls, run_dir: Path, fallback: TrackingConfig | None = None) -> Tracker:
        """Reopen the training run recorded in ``<run_dir>/mlflow.json`` (e.g. to log evaluation).

        Without ``mlflow.json`` the tracker keeps only the local record. :meth:`end` puts the
        run's previous status back (evaluation does not change whether training finished) and
        records its own status as the tag ``evaluation.status``.

        Args:
            run_dir: the training run's output folder.
            fallback: settings ``mlflow.json`` does not hold: ``name=none`` disables MLflow,
                ``system_metrics`` (default off), ``uri`` if the file lacks one, ``experiment``
                if the recorded run no longer exists and a new one must be created.
        """
        cfg = fallback or TrackingConfig(system_metrics=False)
        tracker = cls(run_dir)
        saved = _read_run_file(tracker.run_dir)
        if saved is None or cfg.name == "none":
            log.info("no MLflow run to reopen (%s); tracking calls are only recorded in %s",
                     "tracking=none" if saved else f"no {tracker.run_dir / RUN_FILE}", tracker.record.folder)
            return tracker
        tracker.run_name = str(saved.get("run_name", ""))
        uri = resolve_tracking_uri(saved.get("tracking_uri") or cfg.uri)
        if tracker._connect(uri, cfg.experiment):
            tracker._call("reopen the run", lambda: tracker._open(saved, cfg, {}, {}, evaluation=True))
        if tracker._client is not None and tracker.run_id and cfg.system_metrics:
            tracker._start_system_metrics(resumed=True)
        return tracker

    def _connect(self, uri: str, experiment: str) -> bool:
        """Client for ``uri``; an http(s) server is probed once. False (and one warning) if unusable."""
        self.tracking_uri = uri
        try:
            from mlflow.tracking import MlflowClient

            if uri.startswith(("http://", "https://")):
                for name, value in _HTTP_ENV_DEFAULTS.items():
                    os.environ.setdefault(name, value)
                _probe_http(uri, experiment)
            db = _sqlite_path(uri)
            if db is not None:
                db.parent.mkdir(parents=True, exist_ok=True)
                # The first client of a new SQLite store creates its schema; the jobs of a
                # sweep starting together would migrate it at once and break each other
                # ("Online migration expected to match one row"): one at a time.
                with file_lock(db.with_name(db.name + ".lock")):
                    self._client = MlflowClient(tracking_uri=uri)
                    self._client.search_experiments(max_results=1)
            else:
                self._client = MlflowClient(tracking_uri=uri)
        except Exception as exc:  # noqa: BLE001
            self._go_offline(f"cannot connect ({_short(exc)})")
            return False
        return True

    def _open(self, saved: dict | None, cfg: TrackingConfig, params: dict, tags: dict,
              evaluation: bool = False) -> None:
        client = self._client
        run = None
        created = False
        if saved:
            try:
                run = client.get_run(saved["run_id"])
            except Exception as exc:  # noqa: BLE001
                if getattr(exc, "error_code", None) != "RESOURCE_DOES_NOT_EXIST":
                    raise
            if run is None or run.info.lifecycle_stage == "deleted":
                log.warning("MLflow run %s recorded in %s is missing or deleted in %s; a new run is created "
                            "and %s is rewritten.", saved["run_id"], self.run_dir / RUN_FILE, self.tracking_uri,
                            RUN_FILE)
                run = None
        if run is None:
            self.run_name = self.run_name or (saved or {}).get("run_name", "") or self.run_dir.name
            run = self._create_run(cfg.experiment, tags)
            created = True
            _write_json_atomic(self.run_dir / RUN_FILE, {
                "run_id": run.info.run_id, "experiment_id": run.info.experiment_id,
                "tracking_uri": self.tracking_uri, "run_name": run.info.run_name})
        else:
            if evaluation:
                self._restore_status = run.info.status
            client.update_run(run.info.run_id, status="RUNNING")
            self._logged_params = dict(run.data.params)
        self.run_id = run.info.run_id
        self.experiment_id = run.info.experiment_id
        self.run_name = run.info.run_name
        if tags and not created:
            self._send_tags(tags)
        self._send_params(params)
        log.info("MLflow run %s %s (%s), experiment %s, store %s", "created" if created else "reopened",
                 self.run_name, self.run_id, self.experiment_id, self.tracking_uri)

    def _create_run(self, experiment: str, tags: dict):
        from mlflow.tracking.context import registry as context_registry

        try:  # user, source file, git commit: the columns the UI shows for fluent runs
            all_tags = context_registry.resolve_tags(dict(tags))
        except Exception as exc:  # noqa: BLE001
            log.debug("MLflow context tags not resolved: %s", exc)
            all_tags = dict(tags)
        clean = {_mlflow_key(k): _mlflow_value(v, _MAX_TAG_CHARS) for k, v in all_tags.items()}
        return self._client.create_run(self._experiment_id(experiment), tags=clean, run_name=self.run_name)

    def _experiment_id(self, name: str) -> str:
        client = self._client
        exp = client.get_experiment_by_name(name)
        if exp is not None and exp.lifecycle_stage == "deleted":
            log.info("restoring the deleted MLflow experiment %r to log into it", name)
            client.restore_experiment(exp.experiment_id)
        if exp is not None:
            return exp.experiment_id
        try:
            return client.create_experiment(name, artifact_location=artifact_location_for(self.tracking_uri, name))
        except Exception as exc:  # noqa: BLE001 - another process may have created it meanwhile
            exp = client.get_experiment_by_name(name)
            if exp is None:
                raise
            log.debug("experiment %r created concurrently (%s)", name, exc)
            return exp.experiment_id

    def _start_system_metrics(self, resumed: bool) -> None:
        try:
            from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

            self._monitor = SystemMetricsMonitor(self.run_id, tracking_uri=self.tracking_uri, resume_logging=resumed)
            self._monitor.start()
        except Exception as exc:  # noqa: BLE001
            self._monitor = None
            self._warn_once("system_metrics", f"system metrics are not logged ({_short(exc)}); "
                                              "set tracking.system_metrics=false to silence this.")

    # -- logging --------------------------------------------------------------------------------

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        """Log numeric metrics at ``step`` (default 0); values that are not numbers are skipped."""
        ts_ms = int(time.time() * 1000)
        step = int(step) if step is not None else 0
        values: dict[str, float] = {}
        for key, value in metrics.items():
            try:
                values[str(key)] = float(value)
            except (TypeError, ValueError):
                self._warn_once(f"metric:{key}", f"metric {key!r}={value!r} is not a number; not logged.")
        if not values:
            return
        self.record.append("metrics.jsonl", [json.dumps({"key": k, "value": v, "step": step, "timestamp": ts_ms})
                                             for k, v in values.items()])

        def send() -> None:
            from mlflow.entities import Metric

            batch = [Metric(_mlflow_key(k), v, ts_ms, step) for k, v in values.items()]
            for i in range(0, len(batch), 1000):
                self._client.log_batch(self.run_id, metrics=batch[i:i + 1000])
        self._call("log metrics", send)

    def log_params(self, params: dict) -> None:
        """Log params (strings, cut to 6000 chars); a param the run already holds keeps its first value."""
        self.record.merge_json("params.json", params)
        self._call("log params", lambda: self._send_params(params))

    def set_tags(self, tags: dict[str, str]) -> None:
        """Set (or overwrite) run tags."""
        self.record.merge_json("tags.json", tags)
        self._call("set tags", lambda: self._send_tags(tags))

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        """Upload a file (or a folder's content) under ``artifact_path``."""
        path = Path(path)
        self.record.append("artifacts.txt", [f"{path.resolve()}\t{artifact_path or ''}".rstrip("\t")])
        if not path.exists():
            self._warn_once(f"missing:{path}", f"artifact {path} does not exist; not logged.")
            return
        if path.is_dir():
            self._call("log artifacts", lambda: self._client.log_artifacts(self.run_id, str(path), artifact_path),
                       artifacts=True)
        else:
            self._call("log artifact", lambda: self._client.log_artifact(self.run_id, str(path), artifact_path),
                       artifacts=True)

    def log_artifacts(self, folder: Path, artifact_path: str | None = None) -> None:
        """Upload every file under ``folder`` under ``artifact_path``."""
        self.log_artifact(folder, artifact_path)

    def log_text(self, text: str, artifact_file: str) -> None:
        """Save ``text`` as the artifact ``artifact_file`` (e.g. ``plan/memory.txt``)."""
        local = self.record.write_text(artifact_file, text)
        self.record.append("artifacts.txt", [f"{local.resolve()}\t{artifact_file}"])
        self._call("log text", lambda: self._client.log_text(self.run_id, text, artifact_file), artifacts=True)

    def end(self, status: str = "FINISHED") -> None:
        """End the run: FINISHED, FAILED or KILLED. Later calls do nothing."""
        if self._ended:
            return
        self._ended = True
        status = str(status).upper()
        if status not in _STATUSES:
            self._warn_once("status", f"unknown run status {status!r} (use one of {_STATUSES}); ending as FAILED.")
            status = "FAILED"
        if self._monitor is not None:
            monitor, self._monitor = self._monitor, None
            self._call("stop system metrics", monitor.finish)
        final = status
        if self._restore_status is not None:  # resume(): evaluation's outcome is a tag, not the run's status
            self._call("set tags", lambda: self._send_tags({"evaluation.status": status}))
            final = self._restore_status
        self._call("end the run", lambda: self._client.set_terminated(self.run_id, final) if final in _STATUSES
                   else self._client.update_run(self.run_id, status=final))
        self._write_run_record(status)

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.end("FINISHED" if exc_type is None else "KILLED" if issubclass(exc_type, KeyboardInterrupt)
                 else "FAILED")
        return False

    # -- internals ------------------------------------------------------------------------------

    def _send_params(self, params: dict) -> None:
        from mlflow.entities import Param

        new: dict[str, str] = {}
        changed = []
        for key, value in params.items():
            k, v = _mlflow_key(key), _mlflow_value(value, _MAX_PARAM_CHARS)
            if k in self._logged_params or k in new:
                if self._logged_params.get(k, new.get(k)) != v:
                    changed.append(f"{k}: {self._logged_params.get(k, new.get(k))!r} -> {v!r}")
                continue
            new[k] = v
        if changed:
            log.info("MLflow params cannot change; run %s keeps its first values for %s (the local record %s has "
                     "the new ones)", self.run_id, "; ".join(changed), self.record.folder / "params.json")
        items = [Param(k, v) for k, v in new.items()]
        for i in range(0, len(items), _BATCH):
            self._client.log_batch(self.run_id, params=items[i:i + _BATCH])
            self._logged_params.update((p.key, p.value) for p in items[i:i + _BATCH])

    def _send_tags(self, tags: dict) -> None:
        from mlflow.entities import RunTag

        items = list({_mlflow_key(k): RunTag(_mlflow_key(k), _mlflow_value(v, _MAX_TAG_CHARS))
                      for k, v in tags.items()}.values())
        for i in range(0, len(items), _BATCH):
            self._client.log_batch(self.run_id, tags=items[i:i + _BATCH])

    def _call(self, what: str, fn: Callable[[], object], artifacts: bool = False) -> None:
        """Run an MLflow call unless MLflow is off; turn any failure into (at most one) warning.

        A refused call (bad value) only warns; a failed artifact upload turns artifacts off;
        any other failure (or any failure before the run exists) means the store is unusable
        and the tracker stops contacting it.
        """
        if self._client is None or (artifacts and not self._artifacts_ok):
            return
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - tracking never stops training
            code = getattr(exc, "error_code", None)
            if code in _REJECTED and self.run_id is not None:
                self._warn_once(f"rejected:{what}", f"MLflow refused to {what} ({_short(exc)}); training goes on, "
                                                    f"the local record in {self.record.folder} has the values.")
            elif artifacts:
                self._artifacts_ok = False
                self._warn_once("artifacts", f"cannot upload artifacts to MLflow at {self.tracking_uri} "
                                             f"({_short(exc)}); training goes on, artifacts stay local (listed in "
                                             f"{self.record.folder / 'artifacts.txt'}).")
            else:
                self._go_offline(f"could not {what} ({_short(exc)})")

    def _go_offline(self, reason: str) -> None:
        self._warn_once("offline", f"MLflow tracking at {self.tracking_uri} is not usable: {reason}. Training goes "
                                   f"on without MLflow; every tracking call is recorded locally in "
                                   f"{self.record.folder}. Start the server or fix tracking.uri "
                                   "(or use tracking=none) to silence this.")
        self._client = None
        if self._monitor is not None:  # no join/flush: that would contact the store again
            self._monitor._shutdown_event.set()
            self._monitor = None

    def _warn_once(self, key: str, message: str) -> None:
        if key in self._warned:
            log.debug(message)
        else:
            self._warned.add(key)
            log.warning(message)

    def _write_run_record(self, status: str) -> None:
        now = datetime.now().isoformat(timespec="seconds")
        values = {"run_name": self.run_name, "run_id": self.run_id, "experiment_id": self.experiment_id,
                  "tracking_uri": self.tracking_uri, "status": status}
        values["end_time" if status in _STATUSES else "start_time"] = now
        self.record.merge_json("run.json", values)


def _probe_http(uri: str, experiment: str) -> None:
    """One request to an MLflow server, no retries, short timeout; raises if it does not answer.

    Any HTTP answer (even an error status) counts as reachable: refused calls are handled later.
    """
    from mlflow.utils.credentials import get_default_host_creds
    from mlflow.utils.rest_utils import http_request

    http_request(get_default_host_creds(uri), "/api/2.0/mlflow/experiments/get-by-name", "GET",
                 max_retries=0, backoff_factor=0, backoff_jitter=0, timeout=_PROBE_TIMEOUT_S,
                 raise_on_status=False, params={"experiment_name": experiment})


class NullTracker:
    """The tracker of a worker that is not the chief: records nothing (the chief's run is the job's)."""

    run_id: str | None = None

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        pass

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        pass

    def log_artifacts(self, folder: Path, artifact_path: str | None = None) -> None:
        pass

    def end(self, status: str = "FINISHED") -> None:
        pass
