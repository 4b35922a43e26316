"""Overlay pictures: reference and predicted region contours on three orthogonal slices.

Volumes are channels-last ``(x, y, z[, c])`` in RAS (x to the patient's Right, y to
Anterior, z to Superior). Slices are shown in the radiological convention: the
patient's right on the viewer's left in axial and coronal views, anterior at the top
of axial views, superior at the top of coronal and sagittal views, anterior on the
left of sagittal views. Pixels are drawn with their physical aspect when
``spacing_mm`` is given.

Rendering uses matplotlib's object API (:class:`matplotlib.figure.Figure`, which
saves through the Agg canvas): no pyplot, no display, no global backend switch.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from brats_seg.files import atomic_path

__all__ = ["REGION_COLOURS", "compute_overlay_centre", "save_overlay"]

logger = logging.getLogger(__name__)

# Okabe-Ito colours (colour-blind safe), one per region; reference solid, prediction dashed.
REGION_COLOURS = {"wt": "#F0E442", "tc": "#56B4E9", "et": "#D55E00", "rc": "#CC79A7"}
_FALLBACK_COLOURS = ("#009E73", "#E69F00", "#0072B2")
_LINESTYLES = {"ref": "solid", "pred": "dashed"}
# points; nested regions often share a boundary (TC and ET outer rims), so outer regions
# are drawn first and wider, leaving a visible rim around the inner region's line.
_INNER_LINEWIDTH = 1.2
_LINEWIDTH_STEP = 0.7
_WINDOW_PERCENTILES = (0.5, 99.5)  # robust grey window, % of non-zero voxels shown
_PANEL_INCHES = 4.0
_DPI = 100


def _check_regions(name: str, regions: np.ndarray | None, shape: tuple[int, ...]) -> np.ndarray | None:
    if regions is None:
        return None
    regions = np.asarray(regions)
    if regions.ndim != 4 or regions.shape[:3] != shape:
        raise ValueError(
            f"{name} should have shape (x, y, z, R) with (x, y, z) = image shape {shape}, "
            f"got {regions.shape}. Resample the masks to the image grid first."
        )
    return regions.astype(bool, copy=False)


def compute_overlay_centre(
    ref_regions: np.ndarray | None, pred_regions: np.ndarray | None, shape: tuple[int, int, int]
) -> tuple[int, int, int]:
    """Voxel the three slices pass through.

    Args:
        ref_regions: reference regions ``(x, y, z, R)`` (channel 0 = WT) or ``None``.
        pred_regions: predicted regions ``(x, y, z, R)`` or ``None``.
        shape: spatial shape ``(x, y, z)``.

    Returns:
        Rounded centre of mass of the reference WT if it is not empty, else of the
        predicted WT, else the volume centre; voxel indices ``(i, j, k)``.
    """
    for regions in (ref_regions, pred_regions):
        if regions is not None and regions[..., 0].any():
            idx = np.nonzero(regions[..., 0])
            return tuple(round(float(np.mean(a))) for a in idx)  # type: ignore[return-value]
    return tuple(s // 2 for s in shape)  # type: ignore[return-value]


def _to_display(slice_2d: np.ndarray) -> np.ndarray:
    """(horizontal axis, vertical axis) RAS slice -> image rows/cols, radiological.

    Both in-plane axes are reversed: the first (x in axial/coronal, y in sagittal)
    so that R (resp. A) is on the left, the second so that A (resp. S) is on top.
    """
    return slice_2d[::-1, ::-1].T


def _grey_window(slices: Sequence[np.ndarray]) -> tuple[float, float]:
    values = np.concatenate([s.ravel() for s in slices]).astype(np.float64)
    values = values[np.isfinite(values)]
    nonzero = values[values != 0]
    if nonzero.size:
        values = nonzero
    if values.size == 0:
        return 0.0, 1.0
    lo, hi = np.percentile(values, _WINDOW_PERCENTILES)
    return float(lo), float(hi if hi > lo else lo + 1.0)


def _region_colour(index: int, name: str) -> str:
    return REGION_COLOURS.get(name, _FALLBACK_COLOURS[index % len(_FALLBACK_COLOURS)])


def _region_linewidth(index: int, n_regions: int) -> float:
    return _INNER_LINEWIDTH + _LINEWIDTH_STEP * (n_regions - 1 - index)


def _draw_contours(ax, mask_2d: np.ndarray, colour: str, linestyle: str, linewidth: float) -> None:
    # A contour of a slice that is all-False or all-True has no level to draw.
    if mask_2d.any() and not mask_2d.all():
        ax.contour(
            mask_2d.astype(np.float32), levels=[0.5], colors=[colour], linestyles=linestyle, linewidths=linewidth
        )


def save_overlay(
    image: np.ndarray,
    ref_regions: np.ndarray | None,
    pred_regions: np.ndarray | None,
    path: str | os.PathLike,
    title: str = "",
    *,
    spacing_mm: Sequence[float] = (1.0, 1.0, 1.0),
    region_names: Sequence[str] | None = None,
) -> Path:
    """Save a PNG of axial, coronal and sagittal slices with region contours.

    The slices pass through the tumour centre (:func:`compute_overlay_centre`). The
    image is grey, windowed to its 0.5-99.5th percentiles over the shown non-zero
    pixels; reference contours are solid and prediction contours dashed, one colour
    per region (:data:`REGION_COLOURS`), with a legend. Written atomically.

    Args:
        image: ``(x, y, z)`` in RAS, e.g. FLAIR; a 4D ``(x, y, z, c)`` image shows
            channel 0 (FLAIR in the project's channel order).
        ref_regions: reference regions ``(x, y, z, R)``, bool or {0, 1}, channel 0 = WT;
            ``None`` for unlabelled cases.
        pred_regions: predicted regions ``(x, y, z, R)``, or ``None``.
        path: output ``.png`` path; parent folders are created.
        title: text put before the view convention in the figure title (e.g. case id
            and Dice).
        spacing_mm: voxel size ``(x, y, z)`` in mm, for the pixel aspect.
        region_names: one name per region channel; default ``("wt", "tc", "et", "rc")[:R]``.

    Returns:
        The path written.

    Raises:
        ValueError: shapes do not match, or ``region_names`` has the wrong length.
    """
    image = np.asarray(image)
    if image.ndim == 4:
        image = image[..., 0]
    if image.ndim != 3:
        raise ValueError(f"image should have shape (x, y, z) or (x, y, z, c), got {image.shape}.")
    shape = image.shape
    ref = _check_regions("ref_regions", ref_regions, shape)
    pred = _check_regions("pred_regions", pred_regions, shape)
    n_regions = max((r.shape[-1] for r in (ref, pred) if r is not None), default=0)
    names = tuple(region_names) if region_names is not None else ("wt", "tc", "et", "rc")[:n_regions]
    if len(names) < n_regions:
        raise ValueError(
            f"region_names {names} has {len(names)} names for {n_regions} region channels; pass one name per channel."
        )
    sx, sy, sz = (float(s) for s in spacing_mm)
    i, j, k = compute_overlay_centre(ref, pred, shape)

    # (title, 2D selector, pixel aspect = row height / col width, side letters L R T B)
    views = (
        (f"axial z={k}", np.s_[:, :, k], sy / sx, ("R", "L", "A", "P")),
        (f"coronal y={j}", np.s_[:, j, :], sz / sx, ("R", "L", "S", "I")),
        (f"sagittal x={i}", np.s_[i, :, :], sz / sy, ("A", "P", "S", "I")),
    )
    grey_slices = [_to_display(image[sel]) for _, sel, _, _ in views]
    vmin, vmax = _grey_window(grey_slices)

    fig = Figure(figsize=(3 * _PANEL_INCHES, _PANEL_INCHES + 0.9), dpi=_DPI, facecolor="black")
    axes = fig.subplots(1, 3)
    for ax, (label, sel, aspect, (left, right, top, bottom)), grey in zip(axes, views, grey_slices):
        ax.imshow(grey, cmap="gray", vmin=vmin, vmax=vmax, aspect=aspect, interpolation="nearest")
        for source, regions in (("ref", ref), ("pred", pred)):
            if regions is None:
                continue
            for r in range(regions.shape[-1]):
                mask = _to_display(regions[..., r][sel])
                _draw_contours(
                    ax, mask, _region_colour(r, names[r]), _LINESTYLES[source], _region_linewidth(r, n_regions)
                )
        ax.set_title(label, color="white", fontsize=10)
        for x, y, text, ha, va in (
            (0.02, 0.5, left, "left", "center"),
            (0.98, 0.5, right, "right", "center"),
            (0.5, 0.98, top, "center", "top"),
            (0.5, 0.02, bottom, "center", "bottom"),
        ):
            ax.text(x, y, text, transform=ax.transAxes, ha=ha, va=va, color="white", fontsize=9)
        ax.set_axis_off()

    handles = []
    for source, regions in (("ref", ref), ("pred", pred)):
        if regions is None:
            continue
        for r in range(regions.shape[-1]):
            handles.append(
                Line2D(
                    [],
                    [],
                    color=_region_colour(r, names[r]),
                    linestyle=_LINESTYLES[source],
                    linewidth=_region_linewidth(r, n_regions),
                    label=f"{source} {names[r].upper()}",
                )
            )
    if handles:
        fig.legend(
            handles=handles, loc="lower center", ncol=len(handles), frameon=False, labelcolor="white", fontsize=9
        )
    convention = "radiological view (patient R on viewer's left)"
    fig.suptitle(f"{title} | {convention}" if title else convention, color="white", fontsize=11)
    fig.subplots_adjust(left=0.01, right=0.99, top=0.88, bottom=0.1, wspace=0.03)

    return _save_figure_atomic(fig, Path(path))


def _save_figure_atomic(fig: Figure, path: Path) -> Path:
    with atomic_path(path) as tmp:  # DiskFullError (naming the PNG) if the disk is full
        fig.savefig(tmp, format="png", facecolor=fig.get_facecolor())
    logger.debug("Wrote overlay %s", path)
    return path
