"""Label conventions of the three dataset layouts: the one module that owns them.

Every layout stores a single label map per case; the project trains on three nested
binary regions, channels-last ``(x, y, z, 3)`` in the order WT, TC, ET:

=========  ==========================  ========  ======  ====
layout     labels                      WT        TC      ET
=========  ==========================  ========  ======  ====
msd        1 edema, 2 non-enh., 3 enh  1,2,3     2,3     3
brats2021  1 NCR/NET, 2 ED, 4 ET       1,2,4     1,4     4
brats2023  1 NETC, 2 SNFH, 3 ET        1,2,3     1,3     3
=========  ==========================  ========  ======  ====

:func:`regions_to_labels` is the exact inverse on any label map of the layout's set,
so predictions are written back in the layout's own labels.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = [
    "LabelConvention",
    "LABELS",
    "REGION_NAMES",
    "invalid_label_values",
    "check_label_map",
    "labels_to_regions",
    "regions_to_labels",
]

REGION_NAMES = ("wt", "tc", "et")


@dataclass(frozen=True)
class LabelConvention:
    """Label values of one layout, by tissue class.

    Attributes:
        edema: peritumoural edema / SNFH (in WT only).
        core: necrotic and non-enhancing core (in WT and TC).
        enhancing: enhancing tumour (in WT, TC and ET).
    """

    edema: int
    core: int
    enhancing: int

    @property
    def values(self) -> tuple[int, ...]:
        """All valid values, background first."""
        return (0, *sorted((self.edema, self.core, self.enhancing)))


LABELS: dict[str, LabelConvention] = {
    "msd": LabelConvention(edema=1, core=2, enhancing=3),
    "brats2021": LabelConvention(edema=2, core=1, enhancing=4),
    "brats2023": LabelConvention(edema=2, core=1, enhancing=3),
}


def _convention(layout: str) -> LabelConvention:
    try:
        return LABELS[layout]
    except KeyError:
        raise ValueError(f"Unknown layout {layout!r}; expected one of {sorted(LABELS)}.") from None


def invalid_label_values(label: np.ndarray, layout: str) -> list:
    """Values present in ``label`` that are not in the layout's label set."""
    conv = _convention(layout)
    return [v for v in np.unique(label).tolist() if v not in conv.values]


def check_label_map(case_id: str, path, data: np.ndarray, layout: str, hint: str) -> np.ndarray:
    """``data`` as an integer label map, or a CaseError naming the file and the bad values.

    Args:
        case_id, path: for the message.
        data: the label (or mask) file's voxels.
        layout: whose label set applies.
        hint: what the user should do about bad values.
    """
    from brats_seg.data.errors import CaseError

    labels = np.rint(data)
    if not np.array_equal(labels, data):
        raise CaseError(case_id, path, "label map holds non-integer values", "Write it as an integer label map.")
    bad = invalid_label_values(labels, layout)
    if bad:
        raise CaseError(case_id, path, f"label values {[int(v) for v in bad]} are not in the {layout} label set "
                        f"{list(_convention(layout).values)}", hint)
    return labels.astype(np.int16)


def labels_to_regions(label: np.ndarray, layout: str) -> np.ndarray:
    """Map a label map to nested WT/TC/ET regions.

    Args:
        label: integer label map, shape ``(x, y, z)``.
        layout: ``msd`` | ``brats2021`` | ``brats2023``.

    Returns:
        uint8 array ``(x, y, z, 3)``: WT, TC, ET in {0, 1}.
    """
    conv = _convention(layout)
    label = np.asarray(label)
    et = label == conv.enhancing
    tc = et | (label == conv.core)
    wt = tc | (label == conv.edema)
    return np.stack([wt, tc, et], axis=-1).astype(np.uint8)


def regions_to_labels(regions: np.ndarray, layout: str) -> np.ndarray:
    """Inverse of :func:`labels_to_regions`, in the layout's own label values.

    Regions need not be nested (a thresholded prediction may have ET outside WT); the
    innermost region wins, as in the BraTS convention: ET > TC > WT.

    Args:
        regions: array ``(x, y, z, 3)`` (WT, TC, ET), bool or {0, 1}.
        layout: ``msd`` | ``brats2021`` | ``brats2023``.

    Returns:
        uint8 label map ``(x, y, z)``.
    """
    conv = _convention(layout)
    regions = np.asarray(regions)
    if regions.ndim != 4 or regions.shape[-1] != 3:
        raise ValueError(f"regions should have shape (x, y, z, 3), got {regions.shape}.")
    wt, tc, et = (regions[..., i].astype(bool) for i in range(3))
    label = np.zeros(regions.shape[:3], dtype=np.uint8)
    label[wt] = conv.edema
    label[tc] = conv.core
    label[et] = conv.enhancing
    return label
