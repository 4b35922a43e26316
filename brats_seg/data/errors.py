"""Errors of the data layer: what was wrong, with which case and file, and what to do."""

from __future__ import annotations

from pathlib import Path

__all__ = ["DataError", "CaseError", "DatasetError"]


class DataError(ValueError):
    """Base class: bad input data. The message is meant for the user as it stands."""


class DatasetError(DataError):
    """The dataset as a whole is unusable (root missing, dataset.json broken, no cases).

    Never skipped by ``data.on_error=skip``: there is nothing left to prepare.
    """


class CaseError(DataError):
    """One case is unusable; ``data.on_error=skip`` skips it and prepares the rest.

    Args:
        case_id: the case's id.
        path: the offending file (or folder).
        problem: what is wrong.
        hint: what to do about it.
    """

    def __init__(self, case_id: str, path: str | Path | None, problem: str, hint: str = "") -> None:
        self.case_id = case_id
        self.path = str(path) if path is not None else None
        self.problem = problem
        self.hint = hint
        where = f" ({self.path})" if self.path else ""
        tail = f" {hint}" if hint else ""
        super().__init__(f"case {case_id}{where}: {problem}.{tail}")

    def __reduce__(self):  # picklable across worker processes
        return (type(self), (self.case_id, self.path, self.problem, self.hint))
