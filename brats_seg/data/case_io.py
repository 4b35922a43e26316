"""Load one case's images and label map in RAS, checked: the one reader preparation and
prediction share.

Images come back channels-last ``(x, y, z, 4)`` float32 in the project's channel order
FLAIR, T1, T1ce, T2 whatever the layout (an MSD 4D image is reordered by the case's
``channels``, read from dataset.json); all files of a case must share one grid.
"""

from __future__ import annotations

import numpy as np

from brats_seg.data.errors import CaseError
from brats_seg.data.labels import check_label_map
from brats_seg.data.layouts import Case
from brats_seg.data.nifti import Volume, load_volume
from brats_seg.data.preprocess import check_same_grid

__all__ = ["load_case_image", "load_case_label"]


def load_case_image(case: Case) -> tuple[np.ndarray, Volume]:
    """A case's images ``(x, y, z, 4)`` float32 in RAS (FLAIR, T1, T1ce, T2) and the first file's volume.

    Raises:
        CaseError: unreadable files, not 4 modalities, or modalities on different grids.
    """
    if len(case.images) == 1:
        vol = load_volume(case.images[0], case.case_id, expect_ndim=4)
        if vol.data.shape[-1] != 4:
            raise CaseError(
                case.case_id,
                vol.path,
                f"expected 4 modalities along the 4th axis, found {vol.data.shape[-1]}",
                "A 4D image holds FLAIR, T1, T1ce, T2 in the order its dataset.json's 'modality' gives; "
                "pass a BraTS case folder otherwise.",
            )
        return np.ascontiguousarray(vol.data[..., list(case.channels)]), vol
    vols = [load_volume(p, case.case_id) for p in case.images]
    check_same_grid(case.case_id, [(str(v.path), v.original_shape, v.original_affine) for v in vols])
    return np.stack([v.data for v in vols], axis=-1), vols[0]


def load_case_label(case: Case, ref: Volume) -> Volume | None:
    """The case's label map (RAS, integer values of its layout), on ``ref``'s grid; None if unlabelled.

    Raises:
        CaseError: unreadable file, another grid than the images, or values outside the
            layout's label set (the message says which layout the values fit, if any).
    """
    if case.label is None:
        return None
    label = load_volume(case.label, case.case_id)
    check_same_grid(
        case.case_id,
        [
            (str(ref.path), ref.original_shape, ref.original_affine),
            (str(label.path), label.original_shape, label.original_affine),
        ],
    )
    label.data = check_label_map(
        case.case_id,
        case.label,
        label.data,
        case.layout,
        f"Is the dataset really laid out as data={case.layout}? If so, fix or remove this case "
        "(or run with data.on_error=skip).",
    )
    return label
