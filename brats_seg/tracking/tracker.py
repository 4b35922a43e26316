"""The run's tracker: the run client, and the model and Model Registry half; and its null twin.

A :class:`Tracker` is a :class:`~brats_seg.tracking.run_client.RunClient` (the run opened,
logged into and ended on MLflow's public API, no call raising into training) that can also log
the run's model and register it:

* :meth:`Tracker.log_model` logs an MLflow ``pyfunc`` model from code
  (``mlflow.pyfunc.log_model``, whose file is :mod:`~brats_seg.tracking.pyfunc_model`); it is the
  one call that depends on which thread holds MLflow's active run, since MLflow logs the model into
  that run, which must be the tracker's. :meth:`Tracker.find_model` finds a model the run already
  logged, so that the same export is not logged twice.
* :meth:`Tracker.register_model` registers a logged model in the Model Registry, reached through
  the run client's ``MlflowClient``; a name the registry refuses is said once and the model stays
  logged in the run.

What to export and when is :mod:`brats_seg.evaluation.mlflow_model`'s. A failed call is taken as
every call of the run client is (:class:`~brats_seg.tracking.faults.FaultPolicy`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from collections.abc import Sequence
from pathlib import Path

import mlflow
from mlflow.entities import LoggedModelStatus
from mlflow.environment_variables import MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR
from mlflow.exceptions import MlflowException

from brats_seg.tracking.faults import REJECTED, short_error
from brats_seg.tracking.run_client import RunClient

__all__ = ["NullTracker", "Tracker"]

log = logging.getLogger(__name__)


@contextlib.contextmanager
def _no_progress_bars():
    """MLflow's artifact progress bars (tqdm, on stderr) off for the block: a run's log is not a terminal."""
    name = MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR.name
    before = os.environ.get(name)
    os.environ[name] = "false"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


class Tracker(RunClient):
    """One run's tracking in MLflow (:class:`~brats_seg.tracking.run_client.RunClient`), with its
    model and the Model Registry. Build with :meth:`start` (training) or :meth:`resume`
    (evaluation, export); no method raises into the caller."""

    def find_model(self, name: str, tags: dict[str, str]) -> str | None:
        """The URI (``models:/<id>``) of a complete model this run logged as ``name`` whose tags
        include ``tags``; None if there is none, or MLflow is off."""
        found: list[str | None] = []
        self._call("search the run's models", lambda: found.append(self._find_model(name, tags)))
        return found[0] if found else None

    def log_model(
        self,
        name: str,
        python_model: Path,
        artifacts: dict[str, Path],
        signature,
        input_example=None,
        pip_requirements: Sequence[str] = (),
        tags: dict[str, str] | None = None,
        step: int = 0,
        code_paths: Sequence[Path] = (),
    ) -> str | None:
        """Log an MLflow ``pyfunc`` model into the run, from code (``mlflow.pyfunc.log_model``).

        Args:
            name: the model's name in the run (``runs:/<run_id>/<name>``).
            python_model: the models-from-code file (it calls ``mlflow.models.set_model``).
            artifacts: ``{key: local file or folder}`` copied into the model.
            signature: an ``mlflow.models.ModelSignature``.
            input_example: an input MLflow stores (and predicts once, to check serving); None: none.
            pip_requirements: the model's environment (``pip`` lines).
            tags: the logged model's tags.
            step: the training step (epoch) the model is of: the run's metrics at that step are
                linked to the model.
            code_paths: folders of code copied into the model (``code/``), first on ``sys.path``
                where it loads.

        Returns:
            The model's URI (``models:/<model_id>``), or None if it was not logged (MLflow off, or
            the call failed: said once, as for every call).
        """
        if self._client is not None and not self._active_here():
            self._warn_once(
                "model:thread",
                f"model {name!r} not logged: MLflow run {self.run_id} is not the active "
                "run of this thread (mlflow.pyfunc.log_model logs into that one).",
            )
            return None
        logged: list[str] = []
        self._call(
            f"log the model {name!r}",
            lambda: logged.append(
                self._send_model(
                    name, python_model, artifacts, signature, input_example, pip_requirements, tags, step, code_paths
                )
            ),
            artifacts=True,
            target=self._artifact_target(name),
        )
        return logged[0] if logged else None

    def register_model(self, model_uri: str, name: str) -> str | None:
        """Register the logged model ``model_uri`` (``models:/<id>``) in the Model Registry as ``name``.

        The registered model is created if new; a version of ``name`` that already holds this
        model is kept rather than made again. A name the registry refuses is said once, by name,
        and the model stays logged in the run.

        Returns:
            The version (``"1"``), or None if it was not registered.
        """
        versions: list[str | None] = []
        self._call(f"register the model as {name!r}", lambda: versions.append(self._send_registration(model_uri, name)))
        return versions[0] if versions else None

    # -- internals ------------------------------------------------------------------------------

    def _active_here(self) -> bool:
        active = mlflow.active_run()
        return active is not None and active.info.run_id == self.run_id

    def _find_model(self, name: str, tags: dict[str, str]) -> str | None:
        token = None
        while True:
            page = self._client.search_logged_models(
                experiment_ids=[self.experiment_id], filter_string=f"name = '{name}'", page_token=token
            )
            for model in page:
                if (
                    model.source_run_id == self.run_id
                    and model.status == LoggedModelStatus.READY
                    and all(model.tags.get(k) == v for k, v in tags.items())
                ):
                    return f"models:/{model.model_id}"
            if not page.token:
                return None
            token = page.token

    def _send_model(
        self,
        name: str,
        python_model: Path,
        artifacts: dict[str, Path],
        signature,
        input_example,
        pip_requirements: Sequence[str],
        tags: dict[str, str] | None,
        step: int,
        code_paths: Sequence[Path] = (),
    ) -> str:
        mlflow.set_tracking_uri(self.tracking_uri)  # mlflow.pyfunc.log_model's client uses the global URI
        with _no_progress_bars(), warnings.catch_warnings():
            if input_example is None:  # left out on purpose (and said by the caller): not MLflow's advice too
                warnings.filterwarnings("ignore", message=".*An input example was not provided", category=UserWarning)
            info = mlflow.pyfunc.log_model(
                name=name,
                python_model=str(python_model),
                artifacts={k: str(v) for k, v in artifacts.items()},
                signature=signature,
                input_example=input_example,
                pip_requirements=list(pip_requirements),
                tags=tags,
                step=int(step),
                code_paths=[str(p) for p in code_paths] or None,
            )
        return info.model_uri

    def _send_registration(self, model_uri: str, name: str) -> str | None:
        model_id = model_uri.removeprefix("models:/")
        try:
            try:
                self._client.create_registered_model(name)
            except MlflowException as exc:
                if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                    raise
            held = [
                v
                for v in self._client.search_model_versions(f"name = '{name}'")  # (the SQL registry
                if v.source == model_uri or getattr(v, "model_id", None) == model_id
            ]  # leaves model_id empty)
            version = (
                held[0]
                if held
                else self._client.create_model_version(
                    name, source=model_uri, run_id=self.run_id, model_id=model_id, await_creation_for=0
                )
            )
        except MlflowException as exc:
            if exc.error_code not in (*REJECTED, "PERMISSION_DENIED"):
                raise  # the registry is unreachable: as any failed call
            self._warn_once(
                f"register:{name}",
                (
                    f"the Model Registry at {self.tracking_uri} refused to register the model as {name!r} "
                    f"({short_error(exc)}); the model stays logged in run {self.run_id} as {model_uri}. Set "
                    f"tracking.register_as= to a name the registry takes, or register it with "
                    f"mlflow.register_model({model_uri!r}, '<name>')."
                ),
            )
            return None
        log.info(
            "%s %s as %r version %s in the Model Registry at %s",
            "already registered" if held else "registered",
            model_uri,
            name,
            version.version,
            self.tracking_uri,
        )
        return str(version.version)


class NullTracker(Tracker):
    """The tracker of a worker that is not the chief (the chief's run is the job's): a
    :class:`Tracker` that opens no run, so that it sends nothing and answers every method as one
    with ``tracking=none`` does; code that logs does not ask which one it holds."""

    def __init__(self) -> None:
        super().__init__(Path("."))  # no run folder of its own: it reads and writes none
