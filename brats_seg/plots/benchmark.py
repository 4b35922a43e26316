"""The benchmark sweep's and the resolution study's figures.

Each function takes plain records (the JSON lines ``scripts/benchmark.py`` writes, the
resolution study's summaries) and writes PNGs through :func:`brats_seg.plots.common.save_figure`.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from brats_seg.plots.common import plt, save_figure

__all__ = ["plot_benchmark_sweep", "plot_resolution_study", "plot_step_time_fit", "plot_width_sweep"]

log = logging.getLogger(__name__)

_GB = 1e9


def _series(records: Iterable[Mapping], y) -> dict[str, list[tuple[float, float]]]:
    """``label -> [(input voxels per step, y(record))]`` sorted, one line per precision and strategy."""
    lines: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for r in records:
        voxels = float(r["batch_size"]) * r["shape"][0] * r["shape"][1] * r["shape"][2]
        value = y(r)
        if value is not None:
            lines[f"{r['precision']}, lms={r['strategy']}"].append((voxels, value))
    return {k: sorted(v) for k, v in sorted(lines.items())}


def plot_benchmark_sweep(records: Sequence[Mapping], out_dir: str | Path, title: str = "") -> list[Path]:
    """Three figures of a benchmark sweep, in ``out_dir``.

    - ``throughput.png``: voxels per second against the input's voxels per step, a line per
      precision and LMS strategy;
    - ``memory.png``: measured peak (RSS above the runtime on CPU) against the input's voxels,
      the planner's prediction drawn dashed over each line;
    - ``flops.png``: the step's FLOP/s against the input's voxels, with the same runs' 4096^2
      float32 SGEMM rate as a band (its lowest to highest).

    Args:
        records: ``scripts/benchmark.py`` results (``shape``, ``batch_size``, ``precision``,
            ``strategy``, ``voxels_per_s``, ``measured_bytes``, ``predicted_peak_bytes``,
            ``flops_per_s``, ``sgemm_flops_per_s``, ``cpu``).
        out_dir: folder for the PNGs.
        title: prefix of each figure's title (e.g. the CPU).

    Returns:
        The paths written.
    """
    out_dir = Path(out_dir)
    records = [r for r in records if "voxels_per_s" in r]
    if not records:
        raise ValueError("no benchmark results to plot")
    title = title or f"{records[0].get('cpu', '')} ({records[0].get('cpu_kind', '')})"
    paths = []

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, points in _series(records, lambda r: r["voxels_per_s"]).items():
        ax.plot([p[0] / 1e6 for p in points], [p[1] / 1e6 for p in points], "o-", label=label)
    ax.set(
        xlabel="input voxels per step (millions)",
        ylabel="training throughput (million voxels / s)",
        title=f"{title}: training speed",
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    paths.append(save_figure(fig, out_dir / "throughput.png"))

    fig, ax = plt.subplots(figsize=(7, 4.5))
    measured = _series(records, lambda r: r["measured_bytes"] / _GB)
    predicted = _series(records, lambda r: r.get("predicted_peak_bytes", 0) / _GB or None)
    for (label, points), color in zip(measured.items(), plt.rcParams["axes.prop_cycle"].by_key()["color"] * 4):
        ax.plot([p[0] / 1e6 for p in points], [p[1] for p in points], "o-", color=color, label=f"{label} measured")
        if label in predicted:
            pts = predicted[label]
            ax.plot(
                [p[0] / 1e6 for p in pts], [p[1] for p in pts], "--", color=color, alpha=0.8, label=f"{label} planner"
            )
    ax.set(
        xlabel="input voxels per step (millions)",
        ylabel="peak memory (GB)",
        title=f"{title}: peak memory, measured and planned",
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    paths.append(save_figure(fig, out_dir / "memory.png"))

    fig, ax = plt.subplots(figsize=(7, 4.5))
    sgemm = [r["sgemm_flops_per_s"] for r in records if r.get("sgemm_flops_per_s")]
    if sgemm:
        ax.axhspan(
            min(sgemm) / 1e9,
            max(sgemm) / 1e9,
            color="grey",
            alpha=0.25,
            label=f"float32 SGEMM 4096^2, same runs ({min(sgemm) / 1e9:.0f}-{max(sgemm) / 1e9:.0f})",
        )
    for label, points in _series(records, lambda r: r.get("flops_per_s")).items():
        ax.plot([p[0] / 1e6 for p in points], [p[1] / 1e9 for p in points], "o-", label=label)
    ax.set(
        xlabel="input voxels per step (millions)",
        ylabel="GFLOP/s of the training step",
        title=f"{title}: step FLOP/s against SGEMM",
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    paths.append(save_figure(fig, out_dir / "flops.png"))
    return paths


def _filters(r: Mapping) -> int | None:
    """A record's ``model.base_filters`` (its own field, or from its overrides)."""
    if r.get("base_filters") is not None:
        return int(r["base_filters"])
    for o in r.get("overrides", []):
        if o.startswith("model.base_filters="):
            return int(o.split("=", 1)[1])
    return None


def plot_width_sweep(
    records: Sequence[Mapping], path: str | Path, profile: Sequence[Mapping] = (), title: str = ""
) -> Path:
    """Throughput against the U-Net's width (``configs/benchmark_sweeps/width.yaml``), one figure:

    - seconds per step against ``model.base_filters``, a line per precision, the planner's
      ``predicted_step_s`` dashed over each;
    - useful GFLOP/s (the step's FLOPs, unpadded, over its time) with the same runs' SGEMM band;
    - with ``profile`` (the same sweep run with ``benchmark.onednn_verbose=true``): the share of
      oneDNN's time spent in reorders (layout changes) per width.

    Args:
        records: ``scripts/benchmark.py`` results of one shape at several widths.
        path: the PNG.
        profile: results with ``reorder_share`` (may be empty).
        title: the figure's title (default: the CPU).
    """
    records = [r for r in records if "step_s" in r and _filters(r) is not None]
    if not records:
        raise ValueError("no benchmark results with model.base_filters to plot")
    title = (
        title
        or f"{records[0].get('cpu', '')} ({records[0].get('cpu_kind', '')}), {'x'.join(map(str, records[0]['shape']))}"
    )
    profiled = [r for r in profile if r.get("reorder_share") is not None and _filters(r) is not None]
    fig, axes = plt.subplots(1, 3 if profiled else 2, figsize=(15 if profiled else 10.5, 4.2))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for k, precision in enumerate(sorted({r["precision"] for r in records})):
        rows = sorted((r for r in records if r["precision"] == precision), key=_filters)
        xs = [_filters(r) for r in rows]
        axes[0].plot(xs, [r["step_s"] for r in rows], "o-", color=colors[k], label=f"{precision} measured")
        if any(r.get("predicted_step_s") for r in rows):
            pts = [(x, r["predicted_step_s"]) for x, r in zip(xs, rows) if r.get("predicted_step_s")]
            axes[0].plot(*zip(*pts), "--", color=colors[k], alpha=0.8, label=f"{precision} planner")
        axes[1].plot(xs, [r["flops_per_s"] / 1e9 for r in rows], "o-", color=colors[k], label=precision)
        prof = sorted((r for r in profiled if r["precision"] == precision), key=_filters)
        if prof:
            axes[2].plot(
                [_filters(r) for r in prof],
                [100 * r["reorder_share"] for r in prof],
                "o-",
                color=colors[k],
                label=precision,
            )
    sgemm = [r["sgemm_flops_per_s"] for r in records if r.get("sgemm_flops_per_s")]
    if sgemm:
        axes[1].axhspan(min(sgemm) / 1e9, max(sgemm) / 1e9, color="grey", alpha=0.25, label="fp32 SGEMM 4096^2")
    axes[0].set(xlabel="model.base_filters", ylabel="seconds per training step", title="step time")
    axes[1].set(xlabel="model.base_filters", ylabel="GFLOP/s of useful work", title="FLOP rate")
    if profiled:
        axes[2].set(xlabel="model.base_filters", ylabel="% of oneDNN time in reorders", title="layout changes")
    widths = sorted({_filters(r) for r in records})
    for ax in axes:
        ax.set_xticks(widths)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    return save_figure(fig, Path(path))


def plot_step_time_fit(groups: Mapping[str, Sequence[Mapping]], path: str | Path, title: str = "") -> Path:
    """The planner's step time against the measured one, log-log, a marker per group of points
    (``fitted``, ``leave one out``, ``held out``: rows with ``measured_s`` and ``predicted_s``),
    with the diagonal and a +-25% band."""
    fig, ax = plt.subplots(figsize=(6, 5.5))
    values = [v for rows in groups.values() for r in rows for v in (r["measured_s"], r["predicted_s"])]
    if not values:
        raise ValueError("no step-time points to plot")
    lo, hi = min(values) / 1.3, max(values) * 1.3
    ax.fill_between(
        [lo, hi], [lo * 0.75, hi * 0.75], [lo * 1.25, hi * 1.25], color="grey", alpha=0.2, label="within 25%"
    )
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
    for (label, rows), marker in zip(groups.items(), "osD^v"):
        if rows:
            ax.plot(
                [r["measured_s"] for r in rows],
                [r["predicted_s"] for r in rows],
                marker,
                alpha=0.8,
                label=f"{label} ({len(rows)})",
            )
    ax.set(
        xscale="log",
        yscale="log",
        xlim=(lo, hi),
        ylim=(lo, hi),
        xlabel="measured seconds per step",
        ylabel="planner's seconds per step",
        title=title or "step-time model against measurements",
    )
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return save_figure(fig, Path(path))


def plot_resolution_study(
    rows: Sequence[Mapping], path: str | Path, regions: Sequence[str] = ("wt", "tc", "et"), title: str = ""
) -> Path:
    """Dice per region against the training resolution (the seeds' chart), scored on the native grid.

    Args:
        rows: one per resolution: ``{"spacing_mm", "label", "epochs", "n_cases", "dice_<r>": {"mean",
            "std"}}`` (``summary.json``'s entries of the run's evaluation).
        path: the PNG.
        regions: regions to draw.
        title: the figure's title.
    """
    rows = sorted(rows, key=lambda r: -r["spacing_mm"])  # coarse to fine
    labels = [f"{r['label']}\n{r['spacing_mm']:g} mm\n{r['epochs']} epochs" for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    width = 0.8 / len(regions)
    for k, region in enumerate(regions):
        means = [r[f"dice_{region}"]["mean"] for r in rows]
        stds = [r[f"dice_{region}"].get("std", 0.0) for r in rows]
        xs = [i + (k - (len(regions) - 1) / 2) * width for i in range(len(rows))]
        ax.bar(xs, means, width, yerr=stds, capsize=3, label=region.upper())
        for x, m in zip(xs, means):
            ax.text(x, m + 0.01, f"{m:.2f}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(rows)), labels, fontsize=8)
    ax.set(
        ylabel="Dice on the native grid (mean, std over test cases)",
        ylim=(0, 1.05),
        title=title or "Dice per region against training resolution",
    )
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, Path(path))
