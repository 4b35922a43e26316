"""What every figure shares: matplotlib without a display, and saving a PNG atomically."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, also on a machine without a display
import matplotlib.pyplot as plt

from brats_seg.files import atomic_path

__all__ = ["plt", "region_colors", "save_figure"]

# One colour per region wherever regions are drawn (WT, TC, ET, RC in the layouts' order).
_REGION_COLORS = {"wt": "#2ca02c", "tc": "#ff7f0e", "et": "#d62728", "rc": "#1f77b4"}


def region_colors(regions) -> list[str]:
    """The colour of each region (the same in every figure); other names get grey."""
    return [_REGION_COLORS.get(r, "#7f7f7f") for r in regions]


def save_figure(fig, path: str | Path, dpi: int = 120) -> Path:
    """Write ``fig`` to ``path`` as a PNG through a temporary name and close it.

    Raises:
        DiskFullError: the disk is full (naming the PNG); nothing half-written is left.
    """
    path = Path(path)
    try:
        with atomic_path(path) as tmp:  # its folder is created
            fig.savefig(tmp, dpi=dpi, bbox_inches="tight")
    finally:
        plt.close(fig)  # also on failure: pyplot keeps every open figure
    return path
