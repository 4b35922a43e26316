"""The training-curve figure of a run: loss and Dice per region, per epoch, training and validation.

Drawn from the run's history rows (``state.json``'s ``history``, the rows of ``history.csv``):
``epoch``, ``loss``, ``val_loss``, ``dice_<r>``, ``val_dice_<r>``, ``dice_mean``,
``val_dice_mean``. Validation may be missing from some epochs; each line has a point where its
value exists.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from brats_seg.plots.common import plt, region_colors, save_figure

__all__ = ["plot_training_curves"]


def _points(history: Sequence[Mapping], key: str) -> tuple[list[float], list[float]]:
    """``(epochs, values)`` of the rows where ``key`` holds a finite number."""
    xs, ys = [], []
    for row in history:
        value = row.get(key)
        if value is not None and math.isfinite(float(value)):
            xs.append(float(row["epoch"]))
            ys.append(float(value))
    return xs, ys


def plot_training_curves(history: Sequence[Mapping], regions: Sequence[str], path: str | Path, title: str = "") -> Path:
    """Loss (left) and Dice per region (right) against the epoch, training dashed, validation solid.

    The best validation mean Dice (the epoch ``best.keras`` holds) is marked on both panels and
    given in the legend.

    Args:
        history: per-epoch rows, each with ``epoch`` and the values logged that epoch.
        regions: the model's regions in output order (``("wt", "tc", "et")``).
        path: the PNG to write.
        title: the figure's title (e.g. the run's name).

    Returns:
        ``path``.

    Raises:
        ValueError: ``history`` has no row with an epoch.
    """
    history = [row for row in history if row.get("epoch") is not None]
    if not history:
        raise ValueError("no epoch in the history: nothing to plot; train at least one epoch.")
    fig, (ax_loss, ax_dice) = plt.subplots(1, 2, figsize=(11, 4.2))
    for key, style, label in (("loss", "--", "training"), ("val_loss", "-o", "validation")):
        xs, ys = _points(history, key)
        if xs:
            ax_loss.plot(xs, ys, style, color="black", markersize=3, label=label)
    ax_loss.set(xlabel="epoch", ylabel="loss", title="loss")
    for region, color in zip(regions, region_colors(regions)):
        xs, ys = _points(history, f"dice_{region}")
        if xs:
            ax_dice.plot(xs, ys, "--", color=color, alpha=0.6, linewidth=1, label=f"{region.upper()} training")
        xs, ys = _points(history, f"val_dice_{region}")
        if xs:
            ax_dice.plot(xs, ys, "-o", color=color, markersize=3, label=f"{region.upper()} validation")
    xs, ys = _points(history, "val_dice_mean")
    if xs:
        best = max(range(len(ys)), key=ys.__getitem__)  # the first of equal bests, as the checkpoint keeps
        ax_dice.plot(
            xs, ys, "-", color="black", linewidth=2, label=f"mean validation (best {ys[best]:.3f}, epoch {xs[best]:g})"
        )
        for ax in (ax_loss, ax_dice):
            ax.axvline(xs[best], color="grey", linestyle=":", linewidth=1)
    ax_dice.set(xlabel="epoch", ylabel="Dice (network grid)", ylim=(0, 1.02), title="Dice per region")
    for ax in (ax_loss, ax_dice):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, ncol=2 if ax is ax_dice else 1)
        ax.xaxis.get_major_locator().set_params(integer=True)
    last = history[-1]["epoch"]
    fig.suptitle(f"{title + ': ' if title else ''}{last} epoch{'s' if last != 1 else ''}", fontsize=10)
    return save_figure(fig, path)
