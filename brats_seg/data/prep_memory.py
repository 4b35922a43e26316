"""Memory of preparing a case: how many cases fit at once, and what to change when one does not.

A case's memory is estimated from its first image's header, without reading a voxel
(:func:`~brats_seg.data.preprocess.estimate_preparation_bytes`): :func:`workers_that_fit` lowers
``data.num_workers`` to what the memory available holds, and a case that still runs out of memory
gets a :class:`~brats_seg.data.errors.CaseError` with its estimate, what was available and the
settings that would fit (:func:`preparation_memory_advice`: fewer workers, or the finest standard
resolution whose case fits).
"""

from __future__ import annotations

import logging

from brats_seg.config import STANDARD_RESOLUTIONS
from brats_seg.data.errors import CaseError
from brats_seg.data.layouts import Case
from brats_seg.data.preprocess import estimate_preparation_bytes
from brats_seg.files import format_bytes

__all__ = [
    "case_native_grid",
    "out_of_memory_error",
    "prediction_records",
    "preparation_memory_advice",
    "workers_that_fit",
]

log = logging.getLogger(__name__)


def case_native_grid(case: Case) -> tuple[tuple, tuple] | None:
    """``(shape, zooms)`` of a case's first image, from its header (no voxels read), or None."""
    import nibabel as nib

    try:
        header = nib.load(str(case.images[0])).header
        return tuple(int(n) for n in header.get_data_shape()), tuple(float(z) for z in header.get_zooms())
    except Exception:  # noqa: BLE001 - a bad file is reported by its preparation, with its name
        return None


def prediction_records(cases: list[Case], spacing_mm: float, shape) -> list[dict]:
    """What the inference planner needs of cases predicted from their files, from their headers
    (no voxels read): each case's ``native_shape``, ``resampled_shape`` (its extent at
    ``spacing_mm``) and ``preparation_bytes``
    (:func:`~brats_seg.data.preprocess.estimate_preparation_bytes`). A case whose header cannot be
    read is left out: its prediction reports it by file."""
    from brats_seg.data.preprocess import resampled_shape

    records = []
    for case in cases:
        grid = case_native_grid(case)
        if grid is None:
            continue
        native, zooms = grid[0][:3], grid[1][:3]
        records.append(
            {
                "native_shape": list(native),
                "resampled_shape": list(resampled_shape(native, zooms, spacing_mm)),
                "preparation_bytes": estimate_preparation_bytes(native, zooms, spacing_mm, shape),
            }
        )
    return records


def preparation_memory_advice(
    native_shape, native_spacing_mm, spacing_mm: float, shape, num_workers: int, available_bytes: int
) -> tuple[str, str]:
    """``(what happened, what to do)`` for a case whose preparation ran out of memory, computed
    from its estimated memory (:func:`~brats_seg.data.preprocess.estimate_preparation_bytes`).

    ``available_bytes`` is measured while the other ``num_workers - 1`` workers hold their cases,
    so the workers had about ``available_bytes + (num_workers - 1) * need`` between them. The
    advice: as many workers as that holds (fewer than now); for a case that failed alone, the
    finest standard resolution whose case fits in what was available.

    Args:
        native_shape, native_spacing_mm: the case's grid (its first image's header).
        spacing_mm, shape: the resolution it was prepared at.
        num_workers: the cases prepared at once when it failed.
        available_bytes: memory available then.
    """
    need = estimate_preparation_bytes(native_shape, native_spacing_mm, spacing_mm, shape)
    num_workers = max(1, int(num_workers))
    room = int(available_bytes) + (num_workers - 1) * need
    grid = "x".join(str(int(n)) for n in native_shape[:3])
    zooms = "x".join(f"{float(z):g}" for z in native_spacing_mm[:3])
    at_once = (
        f"{num_workers} cases prepared at once (data.num_workers={num_workers})"
        if num_workers > 1
        else "one case prepared at a time"
    )
    problem = (
        f"out of memory preparing it at {spacing_mm:g} mm: a case needs about {format_bytes(need)} "
        f"(estimated from its header: {grid} voxels of {zooms} mm) and {format_bytes(int(available_bytes))} "
        f"was available, with {at_once}"
    )
    hints = []
    if num_workers > 1:  # the others' share alone holds a case, so fewer workers always fit
        workers = min(int(room // max(need, 1)), num_workers - 1)
        hints.append(
            f"data.num_workers={workers} (about {format_bytes(workers * need)} for {workers} "
            f"case{'s' if workers > 1 else ''} at once)"
        )
    else:
        for name, mm, net_shape in STANDARD_RESOLUTIONS:  # finest first
            nbytes = estimate_preparation_bytes(native_shape, native_spacing_mm, mm, net_shape)
            if mm > spacing_mm and nbytes <= room:
                hints.append(f"resolution={name} (about {format_bytes(nbytes)} a case at {mm:g} mm)")
                break
    if not hints:
        hints.append(f"none: no standard resolution coarser than {spacing_mm:g} mm fits in {format_bytes(room)}")
    note = ""
    if need <= available_bytes:  # the estimate fits what is free now: something else set the bound
        note = (
            f" By the estimate one more case fits in the {format_bytes(int(available_bytes))} available now, so a limit "
            "on this process (ulimit -v, a container's or job's memory limit) may be below the machine's "
            "free memory, or another program used it meanwhile."
        )
    fix = (
        f"Settings that would fit: {'; or '.join(hints)}. Or free memory (other programs) or use a machine with "
        f"more.{note} The cases already prepared are kept."
    )
    return problem, fix


def out_of_memory_error(case: Case, spacing_mm: float, shape, num_workers: int) -> CaseError:
    """The :class:`CaseError` of a case whose preparation raised MemoryError, with the advice."""
    import psutil

    available = psutil.virtual_memory().available
    grid = case_native_grid(case)
    if grid is None:
        return CaseError(
            case.case_id,
            case.images[0],
            f"out of memory preparing it ({format_bytes(available)} available)",
            "Use fewer data.num_workers or a coarser resolution.",
        )
    problem, fix = preparation_memory_advice(grid[0], grid[1], spacing_mm, shape, num_workers, available)
    return CaseError(case.case_id, None, problem, fix)


def workers_that_fit(case: Case, spacing_mm: float, shape, num_workers: int) -> int:
    """``num_workers``, lowered so that the workers' cases fit in half the RAM available now.

    A case's memory is estimated from its first image's header (no voxels read): at 0.5 mm
    about 2.6 GB, so a 24 GB machine prepares 2x resolution one or a few cases at a time.
    """
    if num_workers <= 1:
        return max(num_workers, 1)
    import psutil

    grid = case_native_grid(case)
    if grid is None:
        return num_workers
    per_case = estimate_preparation_bytes(grid[0], grid[1], spacing_mm, shape)
    fit = max(1, int(0.5 * psutil.virtual_memory().available // max(per_case, 1)))
    if fit < num_workers:
        log.info(
            "preparing %d case(s) at a time instead of data.num_workers=%d: a case at %.2g mm needs about %.1f GB",
            fit,
            num_workers,
            spacing_mm,
            per_case / 1e9,
        )
    return min(num_workers, fit)
