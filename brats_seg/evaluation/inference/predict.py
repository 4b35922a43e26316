"""Predicting a case: network-grid probabilities back on the native grid, thresholded, and
written as a label map in the layout's own values.

Arrays are channels-last RAS: probabilities ``(x, y, z, R)``, one channel per region the
run's model predicts (``brats_seg.evaluation.inference.run.run_regions``), label maps ``(x, y, z)``.

The label map that is written is what counts: thresholded regions need not be nested (ET
predicted outside WT), and :func:`regions_to_mask` resolves that by the layout's paint
order (ET > TC > WT, tumour over cavity); scores, overlays and the NIfTI file all come from
that one label map. WT-only models (R = 1) are written with the layout's **edema** label
for the whole tumour: the file stays in the layout's label set, and reading it back with
``labels_to_regions`` gives exactly the predicted WT (nothing else was predicted).

Prediction continues where it stopped: ``<output>/predict.json``
(:mod:`brats_seg.evaluation.inference.predict_manifest`, written atomically after each case)
records the model, the settings and per case what it read and wrote. The same command again skips
the cases whose record still holds and predicts the rest; another model or other settings predict
every case again. The output folder is locked while a prediction writes it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from brats_seg.choices import check_choice
from brats_seg.config import EvaluateConfig, TrainConfig
from brats_seg.data.cache import CacheEntry
from brats_seg.data.case_io import load_case_image
from brats_seg.data.errors import CaseError, DataError
from brats_seg.data.labels import LABELS, labels_to_regions, regions_to_labels
from brats_seg.data.layouts import Case
from brats_seg.data.nifti import save_mask
from brats_seg.data.preprocess import PreprocessRecord, invert_to_native, preprocess_case
from brats_seg.evaluation.inference.predict_manifest import (
    MANIFEST,
    already_predicted,
    case_record,
    manifest_settings,
    mask_path,
    overlay_path,
    read_manifest,
    remove_leftovers,
    write_manifest,
)
from brats_seg.evaluation.inference.run import run_regions
from brats_seg.evaluation.inference.sliding import predict_volume
from brats_seg.evaluation.postprocess import PostProcessing
from brats_seg.locks import hold_lock
from brats_seg.signals import report_progress

__all__ = [
    "MANIFEST",
    "PredictionFailed",
    "Segmentation",
    "check_labels",
    "check_native_shape",
    "predict_case_labels",
    "predict_case_native",
    "predict_new_case",
    "predict_new_cases",
    "regions_to_mask",
    "relabel",
    "segment_case",
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
        model: see :func:`brats_seg.evaluation.inference.sliding.predict_volume`.
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


def predict_case_labels(
    probabilities: np.ndarray, layout: str, names: Sequence[str], threshold: float
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
            case_id,
            path,
            f"RAS shape {tuple(shape)} differs from the preprocessed grid {tuple(native.shape[:3])}",
            "The file changed since it was cached: re-run scripts/prepare_data.py.",
        )


@dataclasses.dataclass(frozen=True)
class Segmentation:
    """One case segmented on its native grid (what :func:`segment_case` returns).

    Attributes:
        labels: uint8 ``(x, y, z)`` RAS label map, post-processed, in the labels asked for.
        regions: bool ``(x, y, z, R)``: the regions read back from ``labels``.
        probabilities: float32 ``(x, y, z, R)`` on the native RAS grid (before thresholding).
        flair: float32 ``(x, y, z)``: the case's FLAIR (RAS), for overlays.
        ref: the case's first image file (grid, affine, header, spacing).
    """

    labels: np.ndarray
    regions: np.ndarray
    probabilities: np.ndarray
    flair: np.ndarray
    ref: object


def check_labels(labels: str, error: type[Exception] = ValueError) -> str:
    """``labels=`` (predict.py, the served model's params): empty (the run's layout) or a layout whose
    label values to write; else ``error`` naming the choices."""
    if labels:
        check_choice(labels, LABELS, "labels", error=error, hint="empty = the run's data.layout")
    return labels


def relabel(labels: np.ndarray, layout: str, to_layout: str, names: Sequence[str]) -> np.ndarray:
    """A label map of ``layout`` in ``to_layout``'s label values (the same regions ``names``):
    e.g. brats2021's ET 4 as BraTS 2023's 3. The same map when the layouts are the same."""
    if to_layout == layout:
        return labels
    return regions_to_mask(labels_to_regions(labels, layout, names).astype(bool), to_layout, names)


def segment_case(
    model,
    case: Case,
    config: TrainConfig,
    eval_cfg: EvaluateConfig,
    postprocess: PostProcessing | None = None,
    labels: str = "",
) -> Segmentation:
    """Segment one case from its files: preprocessing onto the run's grid, the model, the native
    grid again, the threshold, ``postprocess`` (the run's rules, or None) and the label values of
    ``labels`` (a layout; empty: the run's ``data.layout``).

    Raises:
        CaseError: bad files (naming the case and file), or a brain box larger than the run's
            resolution.shape.
    """
    names = run_regions(config)
    image, ref = load_case_image(case)  # (x, y, z, 4) native RAS
    net_image, _, record = preprocess_case(
        case.case_id,
        image,
        ref.spacing_mm,
        config.resolution.spacing_mm,
        config.resolution.shape,
        allow_crop=config.data.allow_crop,
    )
    flair = np.array(image[..., 0])  # kept for overlays; the four native channels are not held through the forward pass
    del image
    ref = dataclasses.replace(ref, data=flair)  # nor the first file's own copy (a 4D file's: all four channels)
    probs = predict_case_native(
        model,
        net_image,
        record,
        mode=eval_cfg.mode,
        window=eval_cfg.window,
        overlap=eval_cfg.window_overlap,
        mirror=eval_cfg.mirror,
    )  # (x, y, z, R)
    layout = config.data.layout
    mask, regions = predict_case_labels(probs, layout, names, eval_cfg.threshold)
    if postprocess is not None and not postprocess.is_identity:
        mask = postprocess.apply(mask, layout, ref.spacing_mm)
        regions = labels_to_regions(mask, layout, names).astype(bool)
    mask = relabel(mask, layout, labels or layout, names)
    return Segmentation(mask, regions, probs, flair, ref)


def predict_new_case(
    model,
    case: Case,
    config: TrainConfig,
    output: Path,
    eval_cfg: EvaluateConfig,
    postprocess: PostProcessing | None = None,
    labels: str = "",
) -> Path:
    """Predict one case and write ``<output>/<case_id>.nii.gz`` (and ``overlays/<case_id>.png``).

    The mask is :func:`segment_case`'s, in ``labels``' label values (a layout; empty: the run's
    ``data.layout``, :func:`regions_to_mask`), on the grid of the case's first image file, with
    that file's affine and header.

    Raises:
        CaseError: bad files, or a brain box larger than the run's resolution.shape.
    """
    from brats_seg.evaluation.overlays import save_overlay

    seg = segment_case(model, case, config, eval_cfg, postprocess, labels)
    path = save_mask(
        seg.labels, seg.ref.original_affine, seg.ref.original_header, mask_path(Path(output), case.case_id)
    )
    if eval_cfg.overlays:
        save_overlay(
            seg.flair,
            None,
            seg.regions,
            overlay_path(Path(output), case.case_id),
            title=case.case_id,
            spacing_mm=seg.ref.spacing_mm,
            region_names=run_regions(config),
        )
    return path


def predict_new_cases(
    model,
    cases: Sequence[Case],
    config: TrainConfig,
    output: str | Path,
    eval_cfg: EvaluateConfig | None = None,
    progress: bool = True,
    model_identity: dict | None = None,
    postprocess: PostProcessing | None = None,
    labels: str = "",
) -> list[Path]:
    """Predict every case (progress bar); a bad case is reported and the others go on.

    Args:
        model: the run's model (or a test double).
        cases: the input cases.
        config: the run's config.
        output: folder for the masks (created).
        eval_cfg: inference settings.
        progress: show a tqdm bar.
        model_identity: what identifies ``model`` (``{"checkpoint": RunFolder.checkpoint_identity(...)}``):
            with it, ``<output>/predict.json`` records each
            case done, and cases written before by the same model and settings are skipped. None:
            every case is predicted and nothing is recorded.
        postprocess: the rules applied to each mask
            (:func:`brats_seg.evaluation.serving.exported.prediction_postprocessing`), or None.
        labels: the layout whose label values the masks are written in (``predict.py labels=``);
            empty: the run's ``data.layout``.

    Returns:
        The mask paths, in case order (skipped cases' included).

    Raises:
        PredictionFailed: some cases failed (listed with their file and problem); the
            masks of the others are written.
        LockedError: another prediction is writing ``output``.
    """
    eval_cfg = eval_cfg or EvaluateConfig()
    output = Path(output).expanduser()
    output.mkdir(parents=True, exist_ok=True)
    if model_identity is None:
        return _predict_cases(model, cases, config, output, eval_cfg, progress, None, {}, postprocess, labels)
    with hold_lock(output, "prediction output folder"):
        remove_leftovers(output)
        settings = manifest_settings(config, eval_cfg, model_identity, postprocess, labels)
        done = read_manifest(output, settings)
        return _predict_cases(model, cases, config, output, eval_cfg, progress, settings, done, postprocess, labels)


def _predict_cases(
    model,
    cases: Sequence[Case],
    config: TrainConfig,
    output: Path,
    eval_cfg: EvaluateConfig,
    progress: bool,
    settings: dict | None,
    done: dict[str, dict],
    postprocess: PostProcessing | None = None,
    labels: str = "",
) -> list[Path]:
    """:func:`predict_new_cases` once the output folder is locked and ``predict.json`` read
    (``done``: its cases; ``settings`` None: no manifest)."""
    from tqdm.auto import tqdm

    skip = {c.case_id for c in cases if already_predicted(c, output, eval_cfg.overlays, done)}
    if skip:
        log.info(
            "%d of %d cases were predicted before by this model with these settings (%s): skipping them",
            len(skip),
            len(cases),
            output / MANIFEST,
        )
    written, failures = [], []
    report_progress(f"0 of {len(cases)} cases")
    for i, case in enumerate(tqdm(cases, desc="predicting", unit="case", disable=not progress)):
        if case.case_id in skip:
            written.append(mask_path(output, case.case_id))
        else:
            try:
                written.append(predict_new_case(model, case, config, output, eval_cfg, postprocess, labels))
            except CaseError as e:
                log.error("%s", e)
                failures.append(str(e))
                done.pop(case.case_id, None)
            else:
                if settings is not None:  # after the mask: the record says it is complete
                    done[case.case_id] = case_record(case, output, eval_cfg.overlays)
                    write_manifest(output, settings, done)
        report_progress(f"{i + 1} of {len(cases)} cases")
    if failures:
        raise PredictionFailed(failures, len(written))
    return written
