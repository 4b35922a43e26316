"""The figure of an evaluation: every case's Dice and HD95 per region, beside ``summary.json``.

One point per case over a box per region (median, quartiles), so the spread and the cases that
fail are seen at once; the worst case of each region is named. HD95 is on a log scale (a few mm
to the 373 mm penalty); a case whose prediction or reference is empty for a region scores the
penalty (BraTS' 373 mm) and is drawn as a cross at its level.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from brats_seg.plots.common import plt, region_colors, save_figure

__all__ = ["plot_case_scores"]

_NAMED_CASES = 40  # up to this many cases, the worst case of each region is named


def _strip(ax, values: Sequence[np.ndarray], colors: Sequence[str], seed: int = 0) -> list[np.ndarray]:
    """A box per region and its cases as jittered points; returns each point's x."""
    finite = [v[np.isfinite(v)] for v in values]
    ax.boxplot(
        [v if v.size else [np.nan] for v in finite],
        positions=range(len(values)),
        widths=0.5,
        showfliers=False,
        medianprops={"color": "black"},
    )
    rng = np.random.default_rng(seed)  # the same jitter every time: figures of two runs compare
    xs = []
    for i, (v, color) in enumerate(zip(values, colors)):
        x = i + rng.uniform(-0.15, 0.15, size=v.size)
        ax.scatter(x, v, s=14, color=color, alpha=0.8, zorder=3)
        xs.append(x)
    return xs


def plot_case_scores(
    case_ids: Sequence[str],
    dice: Mapping[str, np.ndarray],
    hd95: Mapping[str, np.ndarray],
    path: str | Path,
    title: str = "",
    penalty_mm: float = 373.0,
) -> Path:
    """Dice (left) and HD95 (right) of every case, a box and points per region.

    Args:
        case_ids: the cases, in the order of the value arrays.
        dice: region -> ``(n_cases,)`` Dice on the native grid (NaN: undefined, left out).
        hd95: region -> ``(n_cases,)`` HD95 in mm (inf or ``penalty_mm``: one side empty).
        path: the PNG to write.
        title: the figure's title (run and split).
        penalty_mm: what an infinite distance counts as (drawn as a cross).

    Returns:
        ``path``.

    Raises:
        ValueError: no case, or arrays whose length is not the number of cases.
    """
    regions = list(dice)
    n = len(case_ids)
    if n == 0:
        raise ValueError("no case to plot.")
    for name, table in (("dice", dice), ("hd95", hd95)):
        bad = {r: np.shape(v) for r, v in table.items() if np.shape(v) != (n,)}
        if bad:
            raise ValueError(f"{name} values should have one value per case ({n}), got shapes {bad}.")
    colors = region_colors(regions)
    labels = [r.upper() for r in regions]
    fig, (ax_dice, ax_hd) = plt.subplots(1, 2, figsize=(10, 4.5))

    dice_values = [np.asarray(dice[r], dtype=float) for r in regions]
    xs = _strip(ax_dice, dice_values, colors)
    if n <= _NAMED_CASES:
        for x, v in zip(xs, dice_values):
            if np.isfinite(v).any():
                worst = int(np.nanargmin(v))
                ax_dice.annotate(
                    case_ids[worst],
                    (x[worst], v[worst]),
                    xytext=(5, -3),
                    textcoords="offset points",
                    fontsize=6,
                    color="dimgrey",
                )
    means = [float(np.nanmean(v)) if np.isfinite(v).any() else float("nan") for v in dice_values]
    ax_dice.set_xticks(range(len(regions)), [f"{lab}\nmean {m:.3f}" for lab, m in zip(labels, means)], fontsize=8)
    ax_dice.set(ylabel="Dice (native grid)", ylim=(-0.03, 1.03), title="Dice per case")

    hd_values = [np.where(np.isinf(v), penalty_mm, v) for v in (np.asarray(hd95[r], dtype=float) for r in regions)]
    floor = 0.5  # mm: a perfect 0 mm shows at the bottom of the log axis
    shown = [np.maximum(v, floor) for v in hd_values]
    xs = _strip(ax_hd, shown, colors, seed=1)
    for x, v in zip(xs, hd_values):
        hit = v >= penalty_mm
        if hit.any():
            ax_hd.scatter(x[hit], np.full(hit.sum(), penalty_mm), marker="x", s=40, color="black", zorder=4)
    ax_hd.axhline(penalty_mm, color="grey", linestyle=":", linewidth=1)
    ax_hd.text(
        -0.45,
        penalty_mm * 1.05,
        f"{penalty_mm:g} mm: one side empty",
        fontsize=7,
        ha="left",
        va="bottom",
        color="dimgrey",
    )
    medians = [float(np.nanmedian(v)) if np.isfinite(v).any() else float("nan") for v in hd_values]
    ax_hd.set_yscale("log")
    ax_hd.set_xticks(range(len(regions)), [f"{lab}\nmedian {m:.3g} mm" for lab, m in zip(labels, medians)], fontsize=8)
    ax_hd.set(ylabel="HD95 (mm, log scale)", ylim=(floor * 0.8, penalty_mm * 2), title="HD95 per case")
    for ax in (ax_dice, ax_hd):
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"{title + ': ' if title else ''}{n} case{'s' if n != 1 else ''}", fontsize=10)
    return save_figure(fig, path)
