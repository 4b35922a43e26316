"""Errors of the data layer: what was wrong, with which case and file, and what to do."""

from __future__ import annotations

from pathlib import Path

__all__ = ["CacheSpaceError", "CaseError", "DataError", "DatasetError"]


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


class CacheSpaceError(DataError):
    """The cache's disk has less free space than the entries to build will take; raised before
    anything is written (the cache folder is not even created).

    Args:
        cache_root: the cache folder.
        need_bytes: what the entries to build will take on disk (predicted).
        free_bytes: free bytes on that disk now.
        n_cases: the entries to build.
        each_bytes: one entry's bytes.
        grid: the resolution's grid, e.g. ``(192, 224, 160)``.
    """

    def __init__(self, cache_root, need_bytes: int, free_bytes: int, n_cases: int, each_bytes: int, grid) -> None:
        from brats_seg.files import format_bytes

        self.cache_root, self.need_bytes, self.free_bytes = Path(cache_root), need_bytes, free_bytes
        self.n_cases, self.each_bytes, self.grid = n_cases, each_bytes, tuple(grid)
        grid_text = "x".join(str(int(n)) for n in self.grid)
        super().__init__(
            f"the cache needs {format_bytes(need_bytes)} for {n_cases} case(s) on the {grid_text} grid "
            f"({format_bytes(each_bytes)} each) in {self.cache_root}, and that disk has {format_bytes(free_bytes)} "
            f"free; nothing was written. Free {format_bytes(need_bytes - free_bytes)} or more there, or give "
            "data.cache_dir= a disk with room (a coarser resolution= takes less: half is 1/8 of full)."
        )

    def __reduce__(self):
        return (
            type(self),
            (self.cache_root, self.need_bytes, self.free_bytes, self.n_cases, self.each_bytes, self.grid),
        )
