"""How a run's tracking takes a failed MLflow call: at most one warning, and training goes on.

:class:`FaultPolicy` is that policy, shared by both halves of a run's tracker (the run client and
the model and registry half): what a failure means (the store is gone, a value was refused, an
upload failed, the disk is full) and saying each thing once. A store that ran out of space is the
longest case. MLflow's SQL store logs a traceback of every database error before raising it, and its
system-metrics thread logs its own warning when it cannot write: on a full disk that is two or
three screens for one fact, which the tracker says in one line
(:func:`disk_full_message`: the file it could not write, the free space there, and that training
goes on) while :class:`MlflowDiskFullFilter` holds MLflow's records of it back.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable
from pathlib import Path

from brats_seg.files import disk_full_error, format_bytes, is_disk_full
from brats_seg.tracking.store import local_store_path

__all__ = ["REJECTED", "FaultPolicy", "MlflowDiskFullFilter", "disk_full_message", "short_error"]

log = logging.getLogger(__name__)

# MLflow error codes meaning "this call was refused", not "the store is gone".
REJECTED = {
    "INVALID_PARAMETER_VALUE",
    "RESOURCE_ALREADY_EXISTS",
    "RESOURCE_DOES_NOT_EXIST",
    "BAD_REQUEST",
    "INVALID_STATE",
}


def short_error(exc: BaseException, limit: int = 300) -> str:
    """``Type: message`` on one line, cut to ``limit`` characters, for a warning."""
    text = f"{type(exc).__name__}: {exc}".replace("\n", " ")
    return text if len(text) <= limit else text[:limit] + "..."


class MlflowDiskFullFilter(logging.Filter):
    """Keeps MLflow's own records that say the disk is full out of the log, and notes that one came.

    MLflow's SQL store logs a traceback of every database error before raising it, and its
    system-metrics thread logs its own warning when it cannot write: on a full disk that is two
    or three screens for one fact, which the tracker says in one line instead (also when only
    MLflow's thread met it: :attr:`seen`). The filter sits on the handlers MLflow's records reach
    (the ``mlflow`` logger's own, which MLflow sets up without propagation, and the root
    logger's), while a tracker's run is open; no logger name inside MLflow is relied on.
    """

    def __init__(self) -> None:
        super().__init__()
        self.seen = False
        self._handlers: set[logging.Handler] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith("mlflow"):
            return True
        try:
            full = is_disk_full(Exception(record.getMessage()))
        except Exception:  # noqa: BLE001 - a record that cannot be formatted is MLflow's business
            return True
        self.seen |= full
        return not full

    def attach(self) -> None:
        self._handlers = {*logging.getLogger("mlflow").handlers, *logging.getLogger().handlers}
        for handler in self._handlers:
            handler.addFilter(self)

    def detach(self) -> None:
        for handler in self._handlers:
            handler.removeFilter(self)
        self._handlers = set()


def _failed_file(exc: BaseException) -> str | None:
    """The file an OSError in ``exc``'s chain names (e.g. an artifact being copied), if any."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.filename:
            return str(exc.filename)
        exc = exc.__cause__ or exc.__context__
    return None


def disk_full_message(exc: BaseException, tracking_uri: str, run_dir: Path, target: str | None = None) -> str | None:
    """The warning for a store that ran out of space -- naming the file being written, else
    ``target``'s (an artifact's destination) or the store's, and the free space there -- or None
    if ``exc`` is another failure."""
    local = _failed_file(exc) or (local_store_path(target) if target else None) or local_store_path(tracking_uri)
    if local is None:  # a server: its disk is not ours to measure
        if not is_disk_full(exc):
            return None
        where = f"the MLflow tracking server {tracking_uri} reports that its disk is full"
    else:
        full = disk_full_error(exc, local)
        if full is None:
            return None
        free = "unknown" if full.free_bytes is None else format_bytes(full.free_bytes)
        where = f"MLflow cannot write {full.path}: no space left on its disk ({free} free there)"
    return (
        f"{where}: training goes on without MLflow; the run folder {run_dir} keeps the config, "
        "history, plan and checkpoints. Free some space there (or point tracking.uri elsewhere) for the "
        "next runs."
    )


class FaultPolicy:
    """What a failed MLflow call means for a run's tracker, said at most once; no call raises.

    A full disk (the store's, or the artifact's being written) stops the tracker with one warning
    naming the file, whether its own call or MLflow's system-metrics thread met it first; a call
    the store refuses (a bad value) only warns and the tracker stays connected; a failed artifact
    upload turns artifacts off; any other failure (or any failure before the run exists) means the
    store is unusable and the tracker stops contacting it.

    The base of :class:`~brats_seg.tracking.run_client.RunClient`, whose state it reads and sets
    (annotated below); every call of the tracker goes through :meth:`_call`.
    """

    run_dir: Path
    run_id: str | None
    tracking_uri: str | None
    _client: object | None  # an MlflowClient while the store is usable; None: nothing is sent
    _artifacts_ok: bool
    _warned: set[str]
    _mlflow_disk_full: MlflowDiskFullFilter

    def _call(self, what: str, fn: Callable[[], object], artifacts: bool = False, target: str | None = None) -> None:
        """Run an MLflow call unless MLflow is off; turn any failure into (at most one) warning.

        See the class: what a failure means, and ``target`` (the artifact being written), whose
        disk may be the full one.
        """
        self._say_mlflow_disk_full()
        if self._client is None or (artifacts and not self._artifacts_ok):
            return
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - tracking never stops training
            code = getattr(exc, "error_code", None)
            full = self._disk_full_warning(exc, target)
            if full is not None:  # every later call would fail too, or eat the last bytes: stop
                self._go_offline(f"could not {what} (no space left)", full)
            elif code in REJECTED and self.run_id is not None:
                self._warn_once(f"rejected:{what}", f"MLflow refused to {what} ({short_error(exc)}); training goes on.")
            elif artifacts:
                self._artifacts_ok = False
                self._warn_once(
                    "artifacts",
                    f"cannot upload artifacts to MLflow at {self.tracking_uri} "
                    f"({short_error(exc)}); training goes on, the files stay in {self.run_dir}.",
                )
            else:
                self._go_offline(f"could not {what} ({short_error(exc)})")

    def _say_mlflow_disk_full(self) -> None:
        """Once MLflow's own thread (system metrics) met a full disk, the tracker says so and stops
        sending, as if its own call had failed there (MLflow's records of it are filtered out)."""
        if self._client is not None and self._mlflow_disk_full.seen:
            self._go_offline(
                "MLflow could not write (no space left)",
                self._disk_full_warning(OSError(errno.ENOSPC, "No space left on device")),
            )

    def _disk_full_warning(self, exc: BaseException, target: str | None = None) -> str | None:
        return disk_full_message(exc, self.tracking_uri or "", self.run_dir, target)

    def _go_offline(self, reason: str, message: str | None = None) -> None:
        """Stop contacting the store, saying why once (``message``, else a warning built from
        ``reason``). MLflow's system-metrics monitor stops by itself at its next sample, when it
        cannot read the run or write to it; the run stays MLflow's active run until :meth:`end`."""
        self._warn_once(
            "offline",
            message
            or (
                f"MLflow tracking at {self.tracking_uri} is not usable: {reason}. Training goes on without MLflow; the "
                f"run folder {self.run_dir} keeps the config, history, plan and checkpoints. Start the server or fix "
                "tracking.uri (or use tracking=none) to silence this."
            ),
        )
        self._client = None

    def _warn_once(self, key: str, message: str) -> None:
        if key in self._warned:
            log.debug(message)
        else:
            self._warned.add(key)
            log.warning(message)
