"""Predicting a case: network-grid probabilities back on the native grid, thresholded, and
written as a label map in the layout's own values.

Arrays are channels-last RAS: probabilities ``(x, y, z, R)``, one channel per region the
run's model predicts (``brats_seg.evaluation.run.run_regions``), label maps ``(x, y, z)``.

The label map that is written is what counts: thresholded regions need not be nested (ET
predicted outside WT), and :func:`regions_to_mask` resolves that by the layout's paint
order (ET > TC > WT, tumour over cavity); scores, overlays and the NIfTI file all come from
that one label map. WT-only models (R = 1) are written with the layout's **edema** label
for the whole tumour: the file stays in the layout's label set, and reading it back with
``labels_to_regions`` gives exactly the predicted WT (nothing else was predicted).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from brats_seg.config import EvaluateConfig, TrainConfig
from brats_seg.data.cache import CacheEntry
from brats_seg.data.case_io import load_case_image
from brats_seg.data.errors import CaseError, DataError
from brats_seg.data.labels import labels_to_regions, regions_to_labels
from brats_seg.data.layouts import Case
from brats_seg.data.nifti import save_mask
from brats_seg.data.preprocess import PreprocessRecord, invert_to_native, preprocess_case
from brats_seg.evaluation.run import run_regions
from brats_seg.evaluation.sliding import predict_volume

__all__ = [
    "PredictionFailed",
    "check_native_shape",
    "predict_case_labels",
    "predict_case_native",
    "predict_new_case",
    "predict_new_cases",
    "regions_to_mask",
    "threshold_regions",
]

log = logging.getLogger(__name__)


class PredictionFailed(DataError):
    """Some input cases could not be predicted; the others' masks are written."""

    def __init__(self, failures: list[str], n_ok: int) -> None:
        self.failures = failures
        lines = "\n".join(f"  - {msg}" for msg in failures)
        super().__init__(
            f"{len(failures)} case(s) could not be predicted ({n_ok} mask(s) written):\n{lines}\n"
            "Fix or remove these cases and run again."
        )


def predict_case_native(
    model,
    case: CacheEntry | np.ndarray,
    record: PreprocessRecord | dict | None = None,
    mode: str = "whole",
    window: Sequence[int] | None = None,
    overlap: float = 0.5,
    depth: int | None = None,
    mirror: bool = False,
) -> np.ndarray:
    """Probabilities of one case on its native RAS grid.

    Args:
        model: see :func:`brats_seg.evaluation.sliding.predict_volume`.
        case: a :class:`CacheEntry` (its cached image and record are used) or a
            network-grid image ``(X, Y, Z, C)``.
        record: the case's :class:`PreprocessRecord` (or dict); taken from the entry's
            meta.json when None.
        mode, window, overlap, depth, mirror: see ``predict_volume``.

    Returns:
        float32 ``(x, y, z, R)`` on the native RAS grid of the case's files; 0 outside
        the network window.
    """
    if isinstance(case, CacheEntry):
        image = np.load(case.image_path)  # float16, as cached: the model casts it on the device
        record = record if record is not None else case.meta["record"]
    else:
        image = np.asarray(case)
    if record is None:
        raise ValueError("predict_case_native needs the case's PreprocessRecord when given an array.")
    probs = predict_volume(model, image, mode=mode, window=window, overlap=overlap, depth=depth, mirror=mirror)
    return invert_to_native(probs, record)


def threshold_regions(probabilities: np.ndarray, threshold: float = 0.5) -> np.ndarray:
    """bool regions ``(x, y, z, R)``: probability above ``threshold``."""
    if not 0 < threshold < 1:
        raise ValueError(f"evaluate.threshold={threshold}: use a probability in (0, 1).")
    return np.asarray(probabilities) > threshold


def regions_to_mask(regions: np.ndarray, layout: str, names: Sequence[str]) -> np.ndarray:
    """Label map in the layout's own values from predicted regions (see the module doc).

    Args:
        regions: ``(x, y, z, R)`` bool, one channel per name.
        layout: the run's ``data.layout``.
        names: the region of each channel (``run_regions(config)``).

    Returns:
        uint8 ``(x, y, z)``.
    """
    return regions_to_labels(np.asarray(regions).astype(bool), layout, names)


def predict_case_labels(probabilities: np.ndarray, layout: str, names: Sequence[str], threshold: float
                        ) -> tuple[np.ndarray, np.ndarray]:
    """``(label map, its regions)`` of native-grid probabilities: what is written and scored.

    The regions are read back from the label map (``labels_to_regions``), so they are
    nested as the written file is, whatever the thresholded channels were.
    """
    labels = regions_to_mask(threshold_regions(probabilities, threshold), layout, names)
    return labels, labels_to_regions(labels, layout, names).astype(bool)


def check_native_shape(case_id: str, path, native: np.ndarray, shape: Sequence[int]) -> None:
    """Raise :class:`CaseError` if a native-grid array does not match a file's RAS shape."""
    if tuple(native.shape[:3]) != tuple(shape):
        raise CaseError(
            case_id, path, f"RAS shape {tuple(shape)} differs from the preprocessed grid {tuple(native.shape[:3])}",
            "The file changed since it was cached: re-run scripts/prepare_data.py.",
        )


def predict_new_case(model, case: Case, config: TrainConfig, output: Path, eval_cfg: EvaluateConfig) -> Path:
    """Predict one case and write ``<output>/<case_id>.nii.gz`` (and ``overlays/<case_id>.png``).

    The mask is in ``config.data.layout``'s labels (:func:`regions_to_mask`), on the grid
    of the case's first image file, with that file's affine and header.

    Raises:
        CaseError: bad files, or a brain box larger than the run's resolution.shape.
    """
    from brats_seg.evaluation.overlays import save_overlay

    names = run_regions(config)
    image, ref = load_case_image(case)  # (x, y, z, 4) native RAS
    net_image, _, record = preprocess_case(
        case.case_id, image, ref.spacing_mm, config.resolution.spacing_mm, config.resolution.shape,
        allow_crop=config.data.allow_crop,
    )
    probs = predict_case_native(
        model, net_image, record, mode=eval_cfg.mode, window=eval_cfg.window, overlap=eval_cfg.window_overlap,
        mirror=eval_cfg.mirror
    )  # (x, y, z, R)
    labels, regions = predict_case_labels(probs, config.data.layout, names, eval_cfg.threshold)
    path = save_mask(labels, ref.original_affine, ref.original_header, Path(output) / f"{case.case_id}.nii.gz")
    if eval_cfg.overlays:
        save_overlay(image[..., 0], None, regions, Path(output) / "overlays" / f"{case.case_id}.png",
                     title=case.case_id, spacing_mm=ref.spacing_mm, region_names=names)
    return path


def predict_new_cases(
    model,
    cases: Sequence[Case],
    config: TrainConfig,
    output: str | Path,
    eval_cfg: EvaluateConfig | None = None,
    progress: bool = True,
) -> list[Path]:
    """Predict every case (progress bar); a bad case is reported and the others go on.

    Returns:
        The mask paths written, in case order.

    Raises:
        PredictionFailed: some cases failed (listed with their file and problem); the
            masks of the others are written.
    """
    from tqdm.auto import tqdm

    eval_cfg = eval_cfg or EvaluateConfig()
    output = Path(output).expanduser()
    output.mkdir(parents=True, exist_ok=True)
    written, failures = [], []
    for case in tqdm(cases, desc="predicting", unit="case", disable=not progress):
        try:
            written.append(predict_new_case(model, case, config, output, eval_cfg))
        except CaseError as e:
            log.error("%s", e)
            failures.append(str(e))
    if failures:
        raise PredictionFailed(failures, len(written))
    return written
