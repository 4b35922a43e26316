"""A study's charts: the arms of a study (``study.json``, made by
:func:`brats_seg.evaluation.studies.study.compute_study`) compared, from the plain record alone.

:func:`plot_study` draws, beside ``study.json``:

- ``val_dice_vs_time.png``: validation Dice (mean and per region) against cumulative training
  seconds (validation excluded), a thin line per run in its arm's colour, the arm's mean over
  seeds bold over the epochs its seeds share: the time each arm takes to a given accuracy;
- ``throughput.png``: training voxels/s and volumes/s per arm;
- ``<set>_metrics.png``: per arm, the Dice, HD95 and BraTS 2023 lesion-wise Dice of each region on
  an evaluated set (``test_metrics.png`` for the test split), mean ± std over seeds;
- ``resolution_study.png`` when the arms differ in resolution: Dice per region against spacing.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from brats_seg.plots.benchmark import plot_resolution_study
from brats_seg.plots.common import plt, save_figure

__all__ = ["plot_set_metrics", "plot_study", "plot_throughput", "plot_val_dice_vs_time"]

log = logging.getLogger(__name__)


# -- figures ------------------------------------------------------------------------------------


def _arm_colors(n: int) -> list:
    cmap = plt.get_cmap("tab10")
    return [cmap(i % 10) for i in range(n)]


def plot_val_dice_vs_time(study: Mapping, path: str | Path, title: str = "") -> Path:
    """Validation mean Dice and Dice per region against training minutes, a panel each."""
    keys = study["curve_keys"]  # the mean Dice, then each region's; each arm's mean_curves holds these
    ncols = 2
    nrows = math.ceil(len(keys) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(11, 3.8 * nrows), squeeze=False, layout="constrained")
    runs = {r["name"]: r for r in study["runs"]}
    for ax, key in zip(axes.flat, keys):
        for arm, color in zip(study["arms"], _arm_colors(len(study["arms"]))):
            curves = [runs[n]["curve"] for n in arm["runs"]]
            for c in curves:
                xs = [t / 60 for t, v in zip(c["train_time_s"], c[key]) if v is not None]
                ys = [v for v in c[key] if v is not None]
                alone = len(curves) == 1  # an arm of one run: its line is the arm's
                ax.plot(
                    xs,
                    ys,
                    "-o" if alone else "-",
                    color=color,
                    lw=1.6 if alone else 0.8,
                    alpha=1.0 if alone else 0.6,
                    markersize=2.5,
                    label=arm["label"] if alone else None,
                )
            mean = (arm.get("mean_curves") or {}).get(key)
            if mean is not None:
                ax.plot(
                    [t / 60 for t in mean["train_time_s"]],
                    mean[key],
                    "-",
                    color=color,
                    lw=2.4,
                    label=f"{arm['label']} (mean of {len(curves)})",
                )
            elif len(curves) > 1:
                ax.plot([], [], "-", color=color, lw=0.8, label=f"{arm['label']} ({len(curves)} runs)")
        name = "mean of regions" if key == "val_dice_mean" else key.rsplit("_", 1)[1].upper()
        ax.set(xlabel="training time (min, validation excluded)", ylabel="validation Dice", title=name)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(keys) :]:
        ax.set_visible(False)
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(title or "validation Dice against training time")
    return save_figure(fig, Path(path))


def _bars(ax, arms: Sequence[Mapping], get, width: float = 0.8) -> None:
    """One bar per arm at x = arm index: ``get(arm) -> stats``; the seeds as dots."""
    for i, (arm, color) in enumerate(zip(arms, _arm_colors(len(arms)))):
        stats = get(arm)
        if stats.get("mean") is None:
            continue
        ax.bar(i, stats["mean"], width, yerr=stats.get("std") or 0.0, capsize=3, color=color, alpha=0.8)
        seeds = [v for v in stats.get("values", []) if v is not None]
        ax.plot([i] * len(seeds), seeds, "k.", markersize=4)
    ax.set_xticks(range(len(arms)), [a["label"] for a in arms], fontsize=8, rotation=20, ha="right")
    ax.grid(axis="y", alpha=0.3)


def plot_throughput(study: Mapping, path: str | Path, title: str = "") -> Path:
    """Training voxels/s and volumes/s per arm (optimizer steps over training seconds), seeds as dots."""
    arms = study["arms"]
    fig, (ax_vox, ax_vol) = plt.subplots(1, 2, figsize=(11, 4.2), layout="constrained")

    def scaled(stats, factor):
        return {
            "mean": None if stats["mean"] is None else stats["mean"] * factor,
            "std": None if stats["std"] is None else stats["std"] * factor,
            "values": [None if v is None else v * factor for v in stats["values"]],
        }

    _bars(ax_vox, arms, lambda a: scaled(a["voxels_per_s"], 1e-6))
    ax_vox.set(ylabel="training voxels/s (millions)", title="voxels per second")
    _bars(ax_vol, arms, lambda a: a["volumes_per_s"])
    ax_vol.set(ylabel="training volumes/s (whole-volume equivalents)", title="volumes per second")
    fig.suptitle(title or "training throughput (mean ± std over seeds)")
    return save_figure(fig, Path(path))


def plot_set_metrics(study: Mapping, set_name: str, path: str | Path, title: str = "") -> Path:
    """Per arm, Dice, HD95 and lesion-wise Dice of each region on one evaluated set, mean ± std over seeds."""
    regions, arms = study["regions"], [a for a in study["arms"] if set_name in a["sets"]]
    metrics = study["metrics"]  # summary.json column -> its name
    fig, axes = plt.subplots(1, len(metrics), figsize=(5 * len(metrics), 4.4), layout="constrained")
    width = 0.8 / max(len(arms), 1)
    for ax, (metric, name) in zip(axes, metrics.items()):
        for j, (arm, color) in enumerate(zip(arms, _arm_colors(len(arms)))):
            stats = [arm["sets"][set_name]["metrics"].get(f"{metric}_{r}", {}) for r in regions]
            xs = [i + (j - (len(arms) - 1) / 2) * width for i in range(len(regions))]
            means = [s.get("mean") if s.get("mean") is not None else math.nan for s in stats]
            ax.bar(
                xs,
                means,
                width,
                yerr=[s.get("std") or 0.0 for s in stats],
                capsize=2,
                color=color,
                alpha=0.85,
                label=arm["label"],
            )
            for x, s in zip(xs, stats):
                seeds = [v for v in s.get("values", []) if v is not None]
                ax.plot([x] * len(seeds), seeds, "k.", markersize=3)
        ax.set_xticks(range(len(regions)), [r.upper() for r in regions])
        ax.set(title=name, ylim=(0, 1.05) if metric != "hd95" else (0, None))
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=7)
    n = arms[0]["sets"][set_name]["n_cases"] if arms else 0
    fig.suptitle(title or f"{set_name} ({n} cases, native grid): mean ± std over seeds, seeds as dots")
    return save_figure(fig, Path(path))


def _resolution_rows(study: Mapping, set_name: str) -> list[dict]:
    """The resolution chart's rows: per arm, Dice per region (mean over seeds of the case mean,
    with the case spread: one seed gives exactly the former study's chart)."""
    rows = []
    for arm in study["arms"]:
        entry = arm["sets"].get(set_name)
        if entry is None or arm["spacing_mm"] is None:
            continue
        label = str(arm["values"].get("resolution.name", arm["label"]))
        rows.append(
            {
                "label": label,
                "spacing_mm": float(arm["spacing_mm"]),
                "epochs": round(arm["epochs_done"]["mean"] or 0),
                "n_cases": entry["n_cases"],
                **{
                    f"dice_{r}": {
                        "mean": entry["metrics"][f"dice_{r}"]["mean"],
                        "std": entry["case_std"].get(f"dice_{r}") or 0.0,
                    }
                    for r in study["regions"]
                },
            }
        )
    return rows


def plot_study(study: Mapping, out_dir: str | Path, title: str = "") -> list[Path]:
    """Every chart of the study into ``out_dir`` (the module doc lists them); their paths."""
    out_dir = Path(out_dir)
    prefix = f"{title}: " if title else ""
    paths = [
        plot_val_dice_vs_time(
            study, out_dir / "val_dice_vs_time.png", prefix + "validation Dice against training time"
        ),
        plot_throughput(study, out_dir / "throughput.png", prefix + "training throughput (mean ± std over seeds)"),
    ]
    for s in study["sets"]:
        if any(s in a["sets"] for a in study["arms"]):
            paths.append(plot_set_metrics(study, s, out_dir / f"{s.replace('@', '_')}_metrics.png"))
    if "resolution.name" in study["arm_keys"] and study["sets"]:
        rows = _resolution_rows(study, study["sets"][0])
        if rows:
            common = study["common"]
            paths.append(
                plot_resolution_study(
                    rows,
                    out_dir / "resolution_study.png",
                    regions=study["regions"],
                    title=f"{common.get('data.name', '')}: Dice on the native grid against training resolution "
                    f"({common.get('backend.precision', 'precision varies')})",
                )
            )
    log.info("study charts: %s", ", ".join(p.name for p in paths))
    return paths
