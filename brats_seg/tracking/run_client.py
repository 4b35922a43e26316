"""One run's tracking on MLflow's public API, never stopping training: the run client.

How a :class:`RunClient` talks to MLflow (the model and the Model Registry are the
:class:`~brats_seg.tracking.tracker.Tracker`'s, which is a run client too):

* The run is opened with ``mlflow.start_run`` and closed with ``mlflow.end_run``, because that
  is how MLflow gives a run its user, source and git tags (``mlflow.user``, ``mlflow.source.*``)
  and its system metrics (``log_system_metrics``: MLflow's monitor samples CPU, memory, disk,
  network and GPUs into ``system/*`` and stops with the run). Both use MLflow's global tracking
  URI, which the client therefore sets.
* Every logging call goes through an ``MlflowClient`` with the run's id: params, tags and metrics
  in one ``log_batch`` each (the client splits large batches itself), artifacts and text, the
  data splits as dataset inputs (``log_inputs``; :mod:`~brats_seg.tracking.datasets` builds them)
  and tables (``log_table``). No call here depends on which thread holds MLflow's active run
  (logging a model does: :meth:`~brats_seg.tracking.tracker.Tracker.log_model`).
* ``mlflow.json`` in the run folder (its path and format belong to
  :class:`~brats_seg.run_dir.RunFolder`) names the run: re-running training with the same
  ``run_dir`` reopens it (:meth:`RunClient.start`), and evaluation logs into it (:meth:`RunClient.resume`).

No method raises into training: a failed call is taken as :class:`~brats_seg.tracking.faults.FaultPolicy`
says (the store gone or its disk full: ONE warning naming the URI, or the store's file and the free
space there, then nothing more is sent; a value the store refuses: one warning, still connected; a
failed upload: artifacts off). The run folder holds what a run needs whatever MLflow does (config,
history, plan, checkpoints, evaluation).

MLflow's active run is per thread, so a thread has one tracker at a time; a run already active
in the thread (a notebook's own) gets the tracker's run nested under it.
"""

from __future__ import annotations

import logging
import posixpath
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import mlflow
from mlflow.entities import DatasetInput, Metric, Param, RunTag

from brats_seg.choices import check_choice
from brats_seg.config import TrackerName, TrackingConfig
from brats_seg.files import write_text_atomic
from brats_seg.run_dir import RunFolder
from brats_seg.tracking.faults import FaultPolicy, MlflowDiskFullFilter, short_error
from brats_seg.tracking.names import MAX_PARAM_CHARS, MAX_TAG_CHARS, mlflow_key, mlflow_value
from brats_seg.tracking.store import experiment_id_for, open_store, resolve_tracking_uri, ui_url

__all__ = ["RunClient"]

log = logging.getLogger(__name__)

_STATUSES = ("FINISHED", "FAILED", "KILLED")


class RunClient(FaultPolicy):
    """One run's tracking in MLflow, or nothing (``tracking=none``, or the store is unusable).

    Build with :meth:`start` (training) or :meth:`resume` (evaluation of a trained run). No
    method raises into the caller. Usable as a context manager: leaving the block ends the run
    (FAILED on an exception, KILLED on Ctrl-C).

    Attributes:
        run_id: the MLflow run id, or None when nothing is sent to MLflow.
        run_dir: the run's output folder.
        tracking_uri: the resolved tracking URI, or None with ``tracking=none``.
        register_as: ``tracking.register_as``: the Model Registry name the run's model is registered
            under (:meth:`~brats_seg.tracking.tracker.Tracker.register_model`), or ``""``.
    """

    def __init__(self, run_dir: Path, run_name: str = "") -> None:
        self.run_dir = Path(run_dir)
        self.run_name = run_name
        self.run_id: str | None = None
        self.experiment_id: str | None = None
        self.tracking_uri: str | None = None
        self._folder = RunFolder(self.run_dir)
        self._client = None  # MlflowClient while the store is usable, None otherwise
        self._artifacts_ok = True
        self._warned: set[str] = set()
        self._logged_params: dict[str, str] = {}  # what the MLflow run already holds (params are immutable)
        self._restore_status: str | None = None  # set by resume(): end() puts this status back
        self._stage = "evaluation"  # resume()'s caller: end() tags its status as <stage>.status
        self.register_as = ""
        self._run_active = False  # our run is on MLflow's active-run stack: end() takes it off
        self._ended = False
        self._mlflow_disk_full = MlflowDiskFullFilter()  # attached while the store is in use
        self._artifact_uri: str | None = None  # where the run's artifacts go (file:///..., s3://...)

    # -- construction ---------------------------------------------------------------------------

    @classmethod
    def start(
        cls, cfg: TrackingConfig, run_dir: Path, run_name: str, params: dict[str, object], tags: dict[str, str]
    ) -> RunClient:
        """Open the run of ``run_dir``: reopen the one ``mlflow.json`` names, or create a new one.

        Args:
            cfg: ``tracking.*``; ``name=none`` sends nothing.
            run_dir: the run's output folder.
            run_name: the name shown in the MLflow UI (see :func:`~brats_seg.tracking.names.make_run_name`);
                a reopened run keeps its own.
            params: flattened config (``{"model.depth": 4, ...}``); values are logged as strings.
            tags: run tags (backend, device, ...), added to MLflow's user, source and git tags.

        Raises:
            ValueError: ``cfg.name`` is neither ``mlflow`` nor ``none``.
        """
        check_choice(cfg.name, TrackerName, "tracking", hint="(tracking=mlflow or tracking=none)")
        tracker = cls(run_dir, run_name)
        tracker.register_as = cfg.register_as
        if cfg.name == "none":
            log.info("tracking=none: nothing is sent to MLflow; the run folder %s keeps the run", tracker.run_dir)
            return tracker
        saved = tracker._read_saved()
        uri = resolve_tracking_uri(cfg.uri)
        if saved and saved.get("tracking_uri") and saved["tracking_uri"] != uri:
            log.info(
                "resumed run %s stays in its store %s (tracking.uri is %s)", saved["run_id"], saved["tracking_uri"], uri
            )
            uri = saved["tracking_uri"]
        if tracker._connect(uri):
            tracker._call("open the run", lambda: tracker._open(saved, cfg, params, tags))
        return tracker

    @classmethod
    def resume(cls, run_dir: Path, fallback: TrackingConfig | None = None, stage: str = "evaluation") -> RunClient:
        """Reopen the training run ``mlflow.json`` names (e.g. to log evaluation into it).

        Without ``mlflow.json`` nothing is sent. :meth:`end` puts the run's previous status back
        (evaluation does not change whether training finished) and records its own status as
        the tag ``<stage>.status``.

        Args:
            run_dir: the training run's output folder.
            fallback: settings ``mlflow.json`` does not hold: ``name=none`` disables MLflow,
                ``system_metrics`` (default off), ``uri`` if the file lacks one, ``experiment``
                if the recorded run no longer exists and a new one must be created.
            stage: what reopens the run (``evaluation``, ``export``): names the status tag.
        """
        cfg = fallback or TrackingConfig(system_metrics=False)
        tracker = cls(run_dir)
        tracker._stage, tracker.register_as = stage, cfg.register_as
        saved = tracker._read_saved()
        if saved is None or cfg.name == "none":
            log.info(
                "no MLflow run to reopen (%s); nothing is sent to MLflow",
                "tracking=none" if saved else f"no {tracker._folder.tracking_path}",
            )
            return tracker
        tracker.run_name = str(saved.get("run_name", ""))
        uri = resolve_tracking_uri(saved.get("tracking_uri") or cfg.uri)
        if tracker._connect(uri):
            tracker._call("reopen the run", lambda: tracker._open(saved, cfg, {}, {}, evaluation=True))
        return tracker

    def _read_saved(self) -> dict | None:
        """``mlflow.json`` if it names a run; a file that cannot be read is reported, then ignored."""
        try:
            saved = self._folder.read_tracking()
            why = "not a JSON object with a run_id"
        except OSError as exc:
            saved, why = None, short_error(exc)
        if isinstance(saved, dict) and saved.get("run_id"):
            return saved
        if self._folder.tracking_path.is_file():
            log.warning(
                "cannot read %s (%s); a new MLflow run is created. Delete or fix the file to silence this.",
                self._folder.tracking_path,
                why,
            )
        return None

    def _connect(self, uri: str) -> bool:
        """A client of the store at ``uri``; False (and one warning) if it cannot be used."""
        self.tracking_uri = uri
        self._mlflow_disk_full.attach()  # until end()
        try:
            self._client = open_store(uri)
        except Exception as exc:  # noqa: BLE001 - tracking never stops training
            self._go_offline(f"cannot connect ({short_error(exc)})", self._disk_full_warning(exc))
            return False
        return True

    def _open(
        self, saved: dict | None, cfg: TrackingConfig, params: dict, tags: dict, evaluation: bool = False
    ) -> None:
        """Start (or restart) the MLflow run, name it in ``mlflow.json`` if new, log the params."""
        run = self._recorded_run(saved) if saved else None
        clean_tags = {mlflow_key(k): mlflow_value(v, MAX_TAG_CHARS) for k, v in tags.items()}
        mlflow.set_tracking_uri(self.tracking_uri)
        outer = mlflow.active_run()
        if outer is not None:
            log.info("MLflow run %s is already active in this thread; this run is nested under it", outer.info.run_id)
        if run is None:
            self.run_name = self.run_name or (saved or {}).get("run_name", "") or self.run_dir.name
            experiment_id = experiment_id_for(self._client, self.tracking_uri, cfg.experiment)
            active = mlflow.start_run(
                experiment_id=experiment_id,
                run_name=self.run_name,
                tags=clean_tags,
                nested=outer is not None,
                log_system_metrics=cfg.system_metrics,
            )
        else:
            if evaluation:
                self._restore_status = run.info.status
            self._logged_params = dict(run.data.params)
            active = mlflow.start_run(
                run_id=run.info.run_id,
                tags=clean_tags or None,
                nested=outer is not None,
                log_system_metrics=cfg.system_metrics,
            )
        self._run_active = True
        self.run_id = active.info.run_id
        self.experiment_id = active.info.experiment_id
        self.run_name = active.info.run_name
        self._artifact_uri = active.info.artifact_uri
        if run is None:
            self._folder.write_tracking(
                {
                    "run_id": self.run_id,
                    "experiment_id": self.experiment_id,
                    "tracking_uri": self.tracking_uri,
                    "run_name": self.run_name,
                }
            )
        self._send_params(params)
        served = self.tracking_uri.startswith(("http://", "https://"))
        log.info(
            "MLflow run %s %s (%s), experiment %s, store %s: %s%s",
            "created" if run is None else "reopened",
            self.run_name,
            self.run_id,
            self.experiment_id,
            self.tracking_uri,
            ui_url(self.tracking_uri, self.experiment_id, self.run_id),
            "" if served else f" once `mlflow ui --backend-store-uri {self.tracking_uri}` runs",
        )

    def _recorded_run(self, saved: dict):
        """The run ``mlflow.json`` names, or None (with a warning) if the store lost or deleted it."""
        run = None
        try:
            run = self._client.get_run(saved["run_id"])
        except Exception as exc:
            if getattr(exc, "error_code", None) != "RESOURCE_DOES_NOT_EXIST":
                raise
        if run is None or run.info.lifecycle_stage == "deleted":
            log.warning(
                "MLflow run %s named in %s is missing or deleted in %s; a new run is created and the file rewritten.",
                saved["run_id"],
                self._folder.tracking_path,
                self.tracking_uri,
            )
            return None
        return run

    # -- logging --------------------------------------------------------------------------------

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        """Log numeric metrics at ``step`` (default 0); values that are not numbers are skipped."""
        timestamp_ms = int(time.time() * 1000)
        step = int(step) if step is not None else 0
        batch = []
        for key, value in metrics.items():
            try:
                batch.append(Metric(mlflow_key(key), float(value), timestamp_ms, step))
            except (TypeError, ValueError):
                self._warn_once(f"metric:{key}", f"metric {key!r}={value!r} is not a number; not logged.")
        if batch:
            self._call("log metrics", lambda: self._client.log_batch(self.run_id, metrics=batch))

    def log_params(self, params: dict) -> None:
        """Log params (strings, cut to 6000 chars); a param the run already holds keeps its first value."""
        self._call("log params", lambda: self._send_params(params))

    def set_tags(self, tags: dict[str, str]) -> None:
        """Set (or overwrite) run tags."""
        self._call("set tags", lambda: self._send_tags(tags))

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        """Upload a file (or a folder's content) under ``artifact_path``."""
        path = Path(path)
        if not path.exists():
            self._warn_once(f"missing:{path}", f"artifact {path} does not exist; not logged.")
            return
        target = self._artifact_target(artifact_path, None if path.is_dir() else path.name)
        if path.is_dir():
            self._call(
                "log artifacts",
                lambda: self._client.log_artifacts(self.run_id, str(path), artifact_path),
                artifacts=True,
                target=target,
            )
        else:
            self._call(
                "log artifact",
                lambda: self._client.log_artifact(self.run_id, str(path), artifact_path),
                artifacts=True,
                target=target,
            )

    def log_artifacts(self, folder: Path, artifact_path: str | None = None) -> None:
        """Upload every file under ``folder`` under ``artifact_path``."""
        self.log_artifact(folder, artifact_path)

    def log_text(self, text: str, artifact_file: str) -> None:
        """Save ``text`` as the artifact ``artifact_file`` (e.g. ``plan/memory.txt``)."""
        self._call(
            "log text",
            lambda: self._client.log_text(self.run_id, text, artifact_file),
            artifacts=True,
            target=self._artifact_target(artifact_file),
        )

    def log_datasets(self, inputs: Sequence[DatasetInput]) -> None:
        """Log dataset inputs (:mod:`~brats_seg.tracking.datasets`) that the run does not hold yet.

        A reopened run already holds its splits: an input whose dataset (name and digest) the run
        has is not sent again, whichever store it is (MLflow's SQL store would drop it; not every
        store does).
        """
        if inputs:
            self._call("log datasets", lambda: self._send_datasets(list(inputs)))

    def log_table(self, columns: dict[str, list], artifact_file: str) -> None:
        """Save ``{column: values}`` as MLflow's table artifact ``artifact_file`` (``.json``), which
        the UI's artifact view shows as a table. Logged again, the table replaces the one there
        (``MlflowClient.log_table`` alone appends the new rows to it)."""
        self._call(
            "log a table",
            lambda: self._send_table(columns, artifact_file),
            artifacts=True,
            target=self._artifact_target(artifact_file),
        )

    @property
    def sending(self) -> bool:
        """Whether calls reach MLflow: a run is open and its store and artifact store answered so far."""
        return self._client is not None and self.run_id is not None and self._artifacts_ok

    def end(self, status: str = "FINISHED") -> None:
        """End the run: FINISHED, FAILED or KILLED. Later calls do nothing."""
        if self._ended:
            return
        self._ended = True
        status = str(status).upper()
        if status not in _STATUSES:
            self._warn_once("status", f"unknown run status {status!r} (use one of {_STATUSES}); ending as FAILED.")
            status = "FAILED"
        final = status
        if self._restore_status is not None:  # resume(): evaluation's outcome is a tag, not the run's status
            self._call("set tags", lambda: self._send_tags({f"{self._stage}.status": status}))
            final = self._restore_status
        try:
            self._close_run(final)
        finally:
            self._say_mlflow_disk_full()  # e.g. the system-metrics thread's last write failed
            self._mlflow_disk_full.detach()

    def __enter__(self) -> RunClient:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.end("FINISHED" if exc_type is None else "KILLED" if issubclass(exc_type, KeyboardInterrupt) else "FAILED")
        return False

    # -- internals ------------------------------------------------------------------------------

    def _close_run(self, status: str) -> None:
        """Take our run off MLflow's active-run stack with ``status``; that also stops its system metrics.

        From another thread than the one that opened it, the run is not this thread's active
        run: its status is set through the client, and MLflow's monitor stops by itself on
        seeing that the run is no longer RUNNING. After the store failed, ending the run is one
        last, quiet attempt: it clears the active run and, if the store is back, records the status.
        """
        if not self._run_active:
            return
        self._run_active = False
        active = mlflow.active_run()
        ours = active is not None and active.info.run_id == self.run_id
        if self._client is None:
            try:
                if ours:
                    mlflow.set_tracking_uri(self.tracking_uri)
                    mlflow.end_run(status)
            except Exception as exc:  # noqa: BLE001 - the store was already reported unusable
                log.debug("MLflow run %s not ended in %s: %s", self.run_id, self.tracking_uri, short_error(exc))
            return
        if ours:
            mlflow.set_tracking_uri(self.tracking_uri)
            self._call("end the run", lambda: mlflow.end_run(status))
        else:
            self._call("end the run", lambda: self._client.set_terminated(self.run_id, status))

    def _send_params(self, params: dict) -> None:
        new: dict[str, str] = {}
        changed = []
        for key, value in params.items():
            k, v = mlflow_key(key), mlflow_value(value, MAX_PARAM_CHARS)
            if k in self._logged_params or k in new:
                if self._logged_params.get(k, new.get(k)) != v:
                    changed.append(f"{k}: {self._logged_params.get(k, new.get(k))!r} -> {v!r}")
                continue
            new[k] = v
        if changed:
            log.info(
                "MLflow params cannot change; run %s keeps its first values for %s (config.json in %s has the "
                "new ones)",
                self.run_id,
                "; ".join(changed),
                self.run_dir,
            )
        if new:
            self._client.log_batch(self.run_id, params=[Param(k, v) for k, v in new.items()])
            self._logged_params.update(new)

    def _send_datasets(self, inputs: list[DatasetInput]) -> None:
        held = self._client.get_run(self.run_id).inputs
        held = {(d.dataset.name, d.dataset.digest) for d in (getattr(held, "dataset_inputs", None) or [])}
        new = [d for d in inputs if (d.dataset.name, d.dataset.digest) not in held]
        if new:
            self._client.log_inputs(self.run_id, datasets=new)

    def _send_table(self, columns: dict[str, list], artifact_file: str) -> None:
        import pandas as pd  # MLflow's own dependency, and what its tables are made of

        frame = pd.DataFrame(columns)
        folder, name = posixpath.split(artifact_file)
        if artifact_file not in {f.path for f in self._client.list_artifacts(self.run_id, folder or None)}:
            self._client.log_table(self.run_id, data=frame, artifact_file=artifact_file)  # marks it a table
            return
        with tempfile.TemporaryDirectory() as tmp:  # already a table: replaced, in the format log_table writes
            path = Path(tmp) / name
            write_text_atomic(path, frame.to_json(orient="split", index=False, date_format="iso"))
            self._client.log_artifact(self.run_id, str(path), folder or None)

    def _send_tags(self, tags: dict) -> None:
        items = {mlflow_key(k): mlflow_value(v, MAX_TAG_CHARS) for k, v in tags.items()}
        if items:
            self._client.log_batch(self.run_id, tags=[RunTag(k, v) for k, v in items.items()])

    def _artifact_target(self, *parts: str | None) -> str | None:
        """The artifact's URI (``file:///.../artifacts/checkpoints/best.keras``), for messages."""
        if not self._artifact_uri:
            return None
        return "/".join([self._artifact_uri.rstrip("/"), *(p.strip("/") for p in parts if p)])
