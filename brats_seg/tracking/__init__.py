"""brats_seg.tracking: a run's MLflow tracking, which never stops training.

Training opens its run with ``Tracker.start`` (a new run, or the one ``mlflow.json`` in the
run folder names, so a resumed training goes on in the same MLflow run); evaluation logs into it
with ``Tracker.resume``; a worker that is not the chief holds a ``NullTracker``. How the parts fit:

* :mod:`~brats_seg.tracking.store` decides where runs go before any run exists: the tracking
  URI (a relative ``sqlite:///`` path is taken from the project root), the lock that lets the
  jobs of a sweep create a new SQLite store together, the plain-HTTP probe that finds an
  unreachable server in seconds, and the experiment (its artifacts beside a sqlite database,
  marked a model-training experiment so that MLflow's UI opens it on runs and charts).
* :mod:`~brats_seg.tracking.run_client` is the run itself, on MLflow's public API only:
  ``mlflow.start_run``/``end_run`` for MLflow's user, source and git tags and its system
  metrics, an ``MlflowClient`` with the run's id for params, tags, per-epoch metrics and
  artifacts. A store that fails is reported once and left alone; training goes on.
* :mod:`~brats_seg.tracking.tracker` is the model and registry half: a ``Tracker`` is a
  ``RunClient`` that also logs the run's model (``mlflow.pyfunc.log_model``) and registers it.
  :mod:`brats_seg.evaluation.mlflow_model` decides what to log, through :meth:`Tracker.log_model`
  and :meth:`Tracker.register_model`. A ``NullTracker`` is a ``Tracker`` that opens no run.
* :mod:`~brats_seg.tracking.pyfunc_model` is MLflow's "models from code" file of a logged model
  (the SavedModel export behind ``mlflow.pyfunc``): MLflow copies it into the model and runs it
  where the model loads, so it imports mlflow, numpy and tensorflow only, and nothing in brats_seg
  imports it (:mod:`brats_seg.evaluation.serving.mlflow_model` logs the model through
  :meth:`Tracker.log_model` and registers it with :meth:`Tracker.register_model`).
* :mod:`~brats_seg.tracking.faults` is what a failed call means to both halves (the store gone,
  a value refused, an upload failed, the disk full), each said once; it words a store whose disk
  is full (the file, the free space) and keeps MLflow's own tracebacks of it out of the log.
* :mod:`~brats_seg.tracking.names` makes the run's name and git tag, chooses the metric keys
  whose chart sections lead the run page with loss and Dice (``training_metric_key``,
  ``evaluation_metric_key``), and mends keys and cuts values so MLflow does not refuse a batch
  for one of them.

Nothing is recorded beside MLflow: the run folder (:mod:`brats_seg.run_dir`) already holds the
config, the per-epoch history, the plan, the checkpoints and the evaluation.
"""

from brats_seg.tracking.names import evaluation_metric_key, git_commit, make_run_name, training_metric_key
from brats_seg.tracking.store import (
    DEFAULT_URI,
    StoreUnreachable,
    artifact_location_for,
    experiment_id_for,
    find_project_root,
    open_store,
    probe_server,
    resolve_tracking_uri,
    ui_url,
)
from brats_seg.tracking.tracker import NullTracker, Tracker

__all__ = [
    "DEFAULT_URI",
    "NullTracker",
    "StoreUnreachable",
    "Tracker",
    "artifact_location_for",
    "evaluation_metric_key",
    "experiment_id_for",
    "find_project_root",
    "git_commit",
    "make_run_name",
    "open_store",
    "probe_server",
    "resolve_tracking_uri",
    "training_metric_key",
    "ui_url",
]
