"""A tracking store that ran out of space: the message that says so once, and MLflow's own
reports of it kept out of the log.

MLflow's SQL store logs a traceback of every database error before raising it, and its
system-metrics thread logs its own warning when it cannot write: on a full disk that is two or
three screens for one fact, which :class:`~brats_seg.tracking.run_client.RunClient` says in one line
(:func:`disk_full_message`: the file it could not write, the free space there, and that training
goes on) while :class:`MlflowDiskFullFilter` holds MLflow's records of it back.
"""

from __future__ import annotations

import logging
from pathlib import Path

from brats_seg.files import disk_full_error, format_bytes, is_disk_full
from brats_seg.tracking.store import local_store_path

__all__ = ["MlflowDiskFullFilter", "disk_full_message"]


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
    return (f"{where}: training goes on without MLflow; the run folder {run_dir} keeps the config, "
            "history, plan and checkpoints. Free some space there (or point tracking.uri elsewhere) for the "
            "next runs.")
