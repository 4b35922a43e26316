"""Where runs are tracked: the tracking URI, the SQLite store's first-use lock, the server probe.

Everything here happens before a run exists, and is about the store, not the run:

* ``sqlite:///mlruns.db`` (the default): a relative sqlite path is taken from the project
  root (the folder holding ``pyproject.toml`` and ``brats_seg/``), so every run lands in one
  store whatever the cwd. Experiments created in a sqlite store get an artifact location
  beside the database (``<db folder>/mlartifacts/<experiment>``); MLflow would otherwise
  default to ``./mlruns/<id>`` under the cwd.
* The first client of a new SQLite store creates its schema. The jobs of a sweep starting
  together would each migrate it and break one another ("Online migration expected to match
  one row"), so opening a sqlite store is serialised by a lock file beside the database.
* An ``http(s)://`` server is probed once by a plain HTTP request with a short timeout and no
  retries: an unreachable server costs seconds, not MLflow's default minutes of retries.
  The calls after that get bounded retries through MLflow's documented environment variables
  (``MLFLOW_HTTP_REQUEST_MAX_RETRIES``, ``MLFLOW_HTTP_REQUEST_TIMEOUT``, set only if unset).

Any other URI (PostgreSQL, ``file:``, Databricks) is handed to MLflow as it is; its first call
tells whether it works.
"""

from __future__ import annotations

import logging
import os
import re
import ssl
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from mlflow import MlflowClient

from brats_seg.locks import file_lock

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_URI",
    "EXPERIMENT_KIND",
    "EXPERIMENT_KIND_TAG",
    "LOCAL_UI",
    "PROBE_TIMEOUT_S",
    "StoreUnreachable",
    "artifact_location_for",
    "experiment_id_for",
    "find_project_root",
    "local_store_path",
    "open_store",
    "probe_server",
    "resolve_tracking_uri",
    "ui_url",
]

DEFAULT_URI = "sqlite:///mlruns.db"
# The experiment tag MLflow's UI (3.x) reads to choose its view: "custom_model_development" is
# the view of training runs (runs, metrics, charts, artifacts); without it the UI guesses, and
# guessed the GenAI view (traces, token usage) for ours.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
# Where `mlflow ui` serves a local store by default, for links to runs in a sqlite or file store.
LOCAL_UI = "http://127.0.0.1:5000"
PROBE_TIMEOUT_S = 5.0  # one probe of an http(s) server, no retries
# Bounded retries for the calls after a successful probe. MLflow's defaults (7 retries, 120 s
# timeout) mean minutes per call once a server goes away; a user's own settings win.
_HTTP_ENV_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "30"}
_SQLITE = "sqlite:///"
# Any answer means the server is there; the path is the one the client asks first.
_PROBE_PATH = "/api/2.0/mlflow/experiments/get-by-name"


class StoreUnreachable(ConnectionError):
    """The tracking server did not answer; the message names the URI and what to do."""


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
    if not uri.startswith(_SQLITE):
        return uri
    path, sep, query = uri[len(_SQLITE) :].partition("?")
    if not path or path == ":memory:" or path.startswith("/"):
        return uri
    base = Path(root) if root is not None else find_project_root()
    return f"{_SQLITE}{(base / Path(path).expanduser()).resolve()}{sep}{query}"


def _sqlite_path(uri: str) -> Path | None:
    """The database file of an absolute ``sqlite:////...`` URI, else None."""
    if not uri.startswith(_SQLITE):
        return None
    path = uri[len(_SQLITE) :].partition("?")[0]
    return Path(path) if path.startswith("/") else None


def local_store_path(uri: str) -> Path | None:
    """The local file or folder a store at ``uri`` writes (a sqlite database, a ``file:`` store),
    for messages about its disk; None for a server or a database elsewhere."""
    db = _sqlite_path(uri)
    if db is not None:
        return db
    parsed = urllib.parse.urlparse(uri)
    if parsed.scheme == "file":
        return Path(urllib.parse.unquote(parsed.path))
    if not parsed.scheme and uri:  # a plain folder is a file store to MLflow
        return Path(uri).expanduser().resolve()
    return None


def ui_url(uri: str, experiment_id: str, run_id: str | None = None, server: str | None = None) -> str:
    """The address of an experiment's runs (or one run's page) in MLflow's UI, in its model-training view.

    MLflow 3.17's UI opens every experiment in the view its "GenAI | Model training" switch was
    left in, GenAI until a browser chooses otherwise (it keeps the choice in its local storage,
    and reads no experiment tag for it); the ``workflowType=machine_learning`` query chooses the
    training view, where runs, metric charts and artifacts are.

    Args:
        uri: the resolved tracking URI; an http(s) server is its own UI.
        experiment_id, run_id: what to open; without ``run_id`` the experiment's runs.
        server: the UI's address when ``uri`` is not a server (default :data:`LOCAL_UI`, where
            ``mlflow ui --backend-store-uri <uri>`` serves it).
    """
    base = uri if uri.startswith(("http://", "https://")) else (server or LOCAL_UI)
    page = f"#/experiments/{experiment_id}" + (f"/runs/{run_id}" if run_id else "")
    return f"{base.rstrip('/')}/{page}?workflowType=machine_learning"


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


def probe_server(uri: str, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """One plain HTTP request to an MLflow server; raises if nothing answers within ``timeout_s``.

    Any HTTP answer counts as reachable, an error status or a TLS certificate the standard
    library does not trust included: whether the client may use the server (credentials,
    its own CA bundle) is MLflow's call, and a refused call is handled where it happens.

    Raises:
        StoreUnreachable: no answer (refused, unknown host, timeout).
    """
    query = urllib.parse.urlencode({"experiment_name": "brats-seg-probe"})
    url = f"{uri.rstrip('/')}{_PROBE_PATH}?{query}"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s):
            return
    except urllib.error.HTTPError:
        return  # the server answered
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, ssl.SSLError):
            return  # something answered the TLS handshake
        reason = exc.reason
    except (OSError, ValueError) as exc:  # timeouts, resets, a malformed URI
        reason = exc
    raise StoreUnreachable(
        f"the tracking server {uri} did not answer within {timeout_s:g} s ({reason}); "
        "start it, or point tracking.uri at a reachable server or a sqlite file"
    )


def open_store(uri: str) -> MlflowClient:
    """A client of the store at ``uri``, checked before the first run is opened in it.

    A sqlite store's folder is created and its schema made under the lock; an http(s) server
    is probed and the HTTP retry defaults set. Other stores are not contacted here.

    Args:
        uri: a resolved tracking URI (see :func:`resolve_tracking_uri`).

    Raises:
        StoreUnreachable: an http(s) server does not answer.
        Exception: whatever MLflow raises for a store it cannot open (bad path, old schema).
    """
    if uri.startswith(("http://", "https://")):
        for name, value in _HTTP_ENV_DEFAULTS.items():
            os.environ.setdefault(name, value)
        probe_server(uri)
        return MlflowClient(tracking_uri=uri)
    db = _sqlite_path(uri)
    if db is None:
        return MlflowClient(tracking_uri=uri)
    db.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(db.with_name(db.name + ".lock")):
        client = MlflowClient(tracking_uri=uri)
        client.search_experiments(max_results=1)  # the first contact creates the schema
    return client


def experiment_id_for(client: MlflowClient, uri: str, name: str) -> str:
    """The id of experiment ``name``: restored if deleted, created (artifacts per
    :func:`artifact_location_for`) if missing, also when another job creates it at the same time.

    The experiment is marked a model-training one (:data:`EXPERIMENT_KIND`), so MLflow's UI opens
    it on its runs and charts rather than its GenAI view of traces; an experiment of ours made
    before the mark, or one the user made by hand without a kind, gets it; a kind the user chose
    is kept.
    """
    exp = client.get_experiment_by_name(name)
    if exp is not None and exp.lifecycle_stage == "deleted":
        log.info("restoring the deleted MLflow experiment %r to log into it", name)
        client.restore_experiment(exp.experiment_id)
    if exp is not None:
        if EXPERIMENT_KIND_TAG not in exp.tags:
            client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
        return exp.experiment_id
    try:
        return client.create_experiment(
            name, artifact_location=artifact_location_for(uri, name), tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND}
        )
    except Exception as exc:
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        log.debug("experiment %r created concurrently (%s)", name, exc)
        return exp.experiment_id
