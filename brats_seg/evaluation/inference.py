"""Inference: a trained run's model on one network-grid image, and back on the native grid.

Arrays are channels-last RAS throughout: an image ``(X, Y, Z, C)`` on the network grid
(``resolution.shape``), probabilities ``(X, Y, Z, R)`` with R = 3 (WT, TC, ET) or 1 (WT).

Two modes, chosen by ``evaluate.mode``:

* ``whole``: the whole network grid in one forward pass (the model was trained on it);
* ``sliding``: overlapping windows (each axis divisible by ``2**depth``; default half
  the grid, rounded) blended with a Gaussian importance map, as nnU-Net does: each
  window's voxels are weighted by a Gaussian centred on the window (sigma = 1/8 of the
  window per axis), and every voxel's probability is the weighted mean over the windows
  that cover it. Voxels near a window's edge, where zero padding makes the network
  least reliable, count least, so no seams show. For volumes too large to infer at once.

The model of a run is rebuilt from its ``config.json`` and its weights are loaded from
``checkpoints/<best|last>.keras`` (:func:`load_run_model`), so a training model wrapped
for Large Model Support loads into a plain one.

Thresholded regions become a label map in the layout's own values by
:func:`regions_to_mask`. WT-only models (R = 1) are written with the layout's **edema**
label for the whole tumour (msd 1, brats2021 2, brats2023 2): the file stays in the
layout's label set, and reading it back with ``labels_to_regions`` gives exactly the
predicted WT (TC and ET empty, as nothing was predicted for them).

Nothing here imports TensorFlow or Keras at module level: they are imported inside the
functions that need a model, after ``brats_seg.backend.configure``.
"""

from __future__ import annotations

import json
import logging
import math
import weakref
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from brats_seg.config import EvaluateConfig, TrainConfig, config_from_dict
from brats_seg.data.cache import CacheEntry
from brats_seg.data.errors import CaseError, DataError, DatasetError
from brats_seg.data.labels import REGION_NAMES, regions_to_labels
from brats_seg.data.layouts import Case, case_from_dir, discover_cases
from brats_seg.data.nifti import Volume, load_volume, save_mask
from brats_seg.data.preprocess import PreprocessRecord, check_same_grid, invert_to_native, preprocess_case

__all__ = [
    "MODES",
    "RunError",
    "PredictionFailed",
    "checkpoint_path",
    "check_evaluate_config",
    "load_run_config",
    "load_run_model",
    "default_window",
    "sliding_window_starts",
    "gaussian_importance_map",
    "predict_volume",
    "predict_case_native",
    "threshold_regions",
    "regions_to_mask",
    "check_native_shape",
    "find_input_cases",
    "load_case_image",
    "predict_new_case",
    "predict_new_cases",
]

log = logging.getLogger(__name__)

MODES = ("whole", "sliding")
_GAUSSIAN_SIGMA_SCALE = 1 / 8  # sigma per axis as a fraction of the window (nnU-Net's value)


class RunError(DataError):
    """A run folder or the inference settings cannot be used (no config.json, no checkpoint,
    unreadable files, a bad ``evaluate.*`` value); the message says what to do."""


class PredictionFailed(DataError):
    """Some input cases could not be predicted; the others' masks are written."""

    def __init__(self, failures: list[str], n_ok: int) -> None:
        self.failures = failures
        lines = "\n".join(f"  - {msg}" for msg in failures)
        super().__init__(
            f"{len(failures)} case(s) could not be predicted ({n_ok} mask(s) written):\n{lines}\n"
            "Fix or remove these cases and run again."
        )


# ---------------------------------------------------------------------------------------
# Run folders
# ---------------------------------------------------------------------------------------


def load_run_config(run_dir: str | Path) -> TrainConfig:
    """The :class:`TrainConfig` a run was trained with (``<run_dir>/config.json``).

    Raises:
        RunError: the folder or its config.json is missing or unreadable.
    """
    run_dir = Path(run_dir).expanduser()
    path = run_dir / "config.json"
    if not path.is_file():
        what = "does not exist" if not run_dir.is_dir() else "has no config.json"
        raise RunError(f"run folder {run_dir} {what}, so it is not a training run; train first: "
                       f"python train.py run_dir={run_dir}")
    try:
        return config_from_dict(TrainConfig, json.loads(path.read_text()))
    except (json.JSONDecodeError, UnicodeDecodeError, TypeError, ValueError) as e:
        raise RunError(f"{path} cannot be read as a brats-seg run config ({e}). Re-run training into a new run_dir.") from e


def checkpoint_path(run_dir: str | Path, checkpoint: str = "best") -> Path:
    """``<run_dir>/checkpoints/<best|last>.keras``, or ``checkpoint`` itself if it is a ``.keras`` file.

    Raises:
        RunError: the checkpoint file does not exist.
    """
    run_dir = Path(run_dir).expanduser()
    if checkpoint in ("best", "last"):
        path = run_dir / "checkpoints" / f"{checkpoint}.keras"
    elif checkpoint.endswith(".keras"):
        path = Path(checkpoint).expanduser()
    else:
        raise RunError(f"checkpoint={checkpoint!r}: use best, last, or the path of a .keras file.")
    if not path.is_file():
        raise RunError(f"checkpoint {path} not found: the run has not saved a model yet; train first: "
                       f"python train.py run_dir={run_dir}")
    return path


def check_evaluate_config(cfg: EvaluateConfig, depth: int = 0) -> None:
    """Check ``evaluate.*`` up front (before a model is loaded).

    Args:
        cfg: the inference settings.
        depth: the run's ``model.depth`` (sliding windows are multiples of ``2**depth``).

    Raises:
        RunError: naming the bad key and value.
    """
    if cfg.mode not in MODES:
        raise RunError(f"evaluate.mode={cfg.mode!r}: use one of {', '.join(MODES)}.")
    if not 0 < cfg.threshold < 1:
        raise RunError(f"evaluate.threshold={cfg.threshold}: use a probability in (0, 1), e.g. 0.5.")
    if not 0 <= cfg.window_overlap < 1:
        raise RunError(f"evaluate.window_overlap={cfg.window_overlap}: use a fraction in [0, 1), e.g. 0.5.")
    if cfg.window:
        try:
            _resolve_window(cfg.window, tuple(cfg.window), depth)
        except ValueError as e:
            raise RunError(str(e)) from None


def load_run_model(run_dir: str | Path, checkpoint: str = "best", config: TrainConfig | None = None):
    """Rebuild a run's U-Net (no LMS wrapping) and load a checkpoint's weights.

    Args:
        run_dir: the training run's folder.
        checkpoint: ``best`` | ``last`` | path of a ``.keras`` file.
        config: the run's config (read from ``config.json`` if None).

    Returns:
        A Keras model ``(B, X, Y, Z, in_channels) -> (B, X, Y, Z, out_channels)`` on the
        run's network grid.

    Raises:
        RunError: missing config/checkpoint, or weights that do not fit the config.
    """
    from brats_seg.model.unet3d import build_unet3d

    config = config or load_run_config(run_dir)
    path = checkpoint_path(run_dir, checkpoint)
    model = build_unet3d(config.model, tuple(config.resolution.shape))
    try:
        model.load_weights(str(path))
    except (ValueError, KeyError, OSError) as e:
        raise RunError(
            f"weights of {path} do not fit the model of {Path(run_dir) / 'config.json'} ({e}). "
            "Was config.json edited after training? Restore it, or evaluate another run."
        ) from e
    log.info("loaded %s into unet3d depth=%d base_filters=%d", path, config.model.depth, config.model.base_filters)
    return model


# ---------------------------------------------------------------------------------------
# Sliding windows
# ---------------------------------------------------------------------------------------


def default_window(shape: Sequence[int], depth: int) -> tuple[int, int, int]:
    """Half the grid per axis, rounded to the nearest multiple of ``2**depth`` (at least one)."""
    multiple = 2**depth
    return tuple(min(int(s), max(multiple, int(math.floor(s / 2 / multiple + 0.5)) * multiple)) for s in shape)


def sliding_window_starts(size: int, window: int, overlap: float) -> list[int]:
    """Start indices of windows along one axis (nnU-Net's rule).

    Steps are at most ``window * (1 - overlap)`` apart, spread evenly so that the first
    window starts at 0 and the last ends at ``size``.

    Args:
        size: grid size along the axis (voxels).
        window: window size (voxels), ``<= size``.
        overlap: fraction of the window shared by neighbours, in ``[0, 1)``.
    """
    if window > size:
        raise ValueError(f"window {window} is larger than the grid axis {size}.")
    target_step = max(1.0, window * (1.0 - overlap))
    n_steps = int(math.ceil((size - window) / target_step)) + 1
    if n_steps == 1:
        return [0]
    step = (size - window) / (n_steps - 1)
    return [int(round(step * i)) for i in range(n_steps)]


def gaussian_importance_map(window: Sequence[int], sigma_scale: float = _GAUSSIAN_SIGMA_SCALE) -> np.ndarray:
    """Gaussian weights ``(wx, wy, wz)`` centred on the window, maximum 1, never 0.

    Args:
        window: window shape.
        sigma_scale: sigma per axis as a fraction of the window size.
    """
    axes = []
    for n in window:
        centre, sigma = (n - 1) / 2, max(n * sigma_scale, 1e-3)
        axes.append(np.exp(-0.5 * ((np.arange(n) - centre) / sigma) ** 2))
    weights = axes[0][:, None, None] * axes[1][None, :, None] * axes[2][None, None, :]
    weights /= weights.max()
    tiny = weights[weights > 0].min() if np.any(weights > 0) else 1.0
    return np.maximum(weights, tiny).astype(np.float32)  # no zero weight: every voxel is covered


def _model_depth(model) -> int:
    """Down-sampling steps of a model (its MaxPooling3D layers); 0 for a model without any."""
    return sum(1 for layer in model.layers if type(layer).__name__ == "MaxPooling3D")


_WINDOW_MODELS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _model_for(model, spatial: tuple[int, int, int]):
    """``model`` itself if it accepts ``spatial``, else a clone on that grid sharing its layers."""
    expected = tuple(model.input_shape[1:4])
    if expected == spatial or all(s is None for s in expected):
        return model
    import keras

    cache = _WINDOW_MODELS.setdefault(model, {})
    if spatial not in cache:
        channels = model.input_shape[-1]
        # clone_function=identity: the same layers (and weights) on a new input grid.
        cache[spatial] = keras.models.clone_model(
            model, input_tensors=keras.Input(shape=(*spatial, channels)), clone_function=lambda layer: layer
        )
    return cache[spatial]


def _check_image(model, image: np.ndarray) -> np.ndarray:
    image = np.asarray(image)
    if image.ndim != 4:
        raise ValueError(f"image should have shape (X, Y, Z, C), got {image.shape}.")
    channels = model.input_shape[-1]
    if image.shape[-1] < channels:
        raise ValueError(f"image has {image.shape[-1]} channels but the model takes {channels} (FLAIR, T1, T1ce, T2).")
    return np.ascontiguousarray(image[..., :channels], dtype=np.float32)  # FLAIR-only models: channel 0


def _resolve_window(window, shape: tuple[int, int, int], depth: int) -> tuple[int, int, int]:
    if not window:
        return default_window(shape, depth)
    window = tuple(int(w) for w in window)
    multiple = 2**depth
    if len(window) != 3 or any(w < 1 for w in window):
        raise ValueError(f"evaluate.window should be 3 positive sizes (x, y, z), got {list(window)}.")
    if any(w % multiple for w in window):
        fixed = [max(multiple, round(w / multiple) * multiple) for w in window]
        raise ValueError(
            f"evaluate.window={list(window)} is not divisible by 2**depth = {multiple}; use e.g. {fixed}."
        )
    clamped = tuple(min(w, s) for w, s in zip(window, shape))
    if clamped != window:
        log.warning("evaluate.window %s is larger than the grid %s; using %s", list(window), list(shape), list(clamped))
    return clamped


def predict_volume(
    model,
    image: np.ndarray,
    mode: str = "whole",
    window: Sequence[int] | None = None,
    overlap: float = 0.5,
    depth: int | None = None,
    batch_size: int = 1,
    mirror: bool = False,
) -> np.ndarray:
    """Probabilities of one image on the network grid.

    Args:
        model: Keras model ``(B, X, Y, Z, C) -> (B, X, Y, Z, R)`` sigmoid probabilities.
        image: ``(X, Y, Z, C')`` float image, ``C' >= C`` (extra channels dropped:
            FLAIR-only models take channel 0).
        mode: ``whole`` | ``sliding``.
        window: sliding window ``(wx, wy, wz)``; None/empty = half the grid, rounded.
        overlap: sliding mode: fraction of the window shared by neighbours, ``[0, 1)``.
        depth: down-sampling steps (windows are multiples of ``2**depth``); None = the
            model's MaxPooling3D count.
        batch_size: windows per forward pass.
        mirror: also predict the left-right mirrored image (axis x, as in training
            augmentation) and average the two (test-time mirroring, as nnU-Net does).

    Returns:
        float32 ``(X, Y, Z, R)`` probabilities.

    Raises:
        ValueError: bad mode, window, overlap, or an image that does not fit the model.
    """
    if mode not in MODES:
        raise ValueError(f"evaluate.mode={mode!r}: use one of {', '.join(MODES)}.")
    if not 0 <= overlap < 1:
        raise ValueError(f"evaluate.window_overlap={overlap}: use a fraction in [0, 1).")
    image = _check_image(model, image)
    if mirror:
        probs = predict_volume(model, image, mode, window, overlap, depth, batch_size)
        mirrored = predict_volume(model, np.ascontiguousarray(image[::-1]), mode, window, overlap, depth, batch_size)
        return 0.5 * (probs + mirrored[::-1])
    shape = tuple(int(s) for s in image.shape[:3])
    if mode == "whole":
        return _forward(_model_for(model, shape), image[None])[0]
    depth = _model_depth(model) if depth is None else int(depth)
    win = _resolve_window(window, shape, depth)
    return _predict_sliding(_model_for(model, win), image, win, overlap, batch_size)


def _forward(model, batch: np.ndarray) -> np.ndarray:
    return np.asarray(model(batch, training=False), dtype=np.float32)


def _predict_sliding(model, image: np.ndarray, window, overlap: float, batch_size: int) -> np.ndarray:
    shape = image.shape[:3]
    starts = [sliding_window_starts(s, w, overlap) for s, w in zip(shape, window)]
    corners = [(i, j, k) for i in starts[0] for j in starts[1] for k in starts[2]]
    weights = gaussian_importance_map(window)  # (wx, wy, wz)
    total = None  # (X, Y, Z, R) weighted sum of probabilities
    norm = np.zeros(shape, dtype=np.float32)  # (X, Y, Z) sum of weights
    log.debug("sliding window %s, overlap %.2f: %d windows", window, overlap, len(corners))
    for b in range(0, len(corners), max(1, batch_size)):
        chunk = corners[b : b + max(1, batch_size)]
        boxes = [tuple(slice(c, c + w) for c, w in zip(corner, window)) for corner in chunk]
        probs = _forward(model, np.stack([image[box] for box in boxes]))  # (B, wx, wy, wz, R)
        if total is None:
            total = np.zeros((*shape, probs.shape[-1]), dtype=np.float32)
        for box, p in zip(boxes, probs):
            total[box] += p * weights[..., None]
            norm[box] += weights
    return total / norm[..., None]


# ---------------------------------------------------------------------------------------
# Native grid, thresholds, label maps
# ---------------------------------------------------------------------------------------


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
        model: see :func:`predict_volume`.
        case: a :class:`CacheEntry` (its cached image and record are used) or a
            network-grid image ``(X, Y, Z, C)``.
        record: the case's :class:`PreprocessRecord` (or dict); taken from the entry's
            meta.json when None.
        mode, window, overlap, depth, mirror: see :func:`predict_volume`.

    Returns:
        float32 ``(x, y, z, R)`` on the native RAS grid of the case's files; 0 outside
        the network window.
    """
    if isinstance(case, CacheEntry):
        image = np.load(case.image_path).astype(np.float32)
        record = record if record is not None else case.meta["record"]
    else:
        image = np.asarray(case, dtype=np.float32)
    if record is None:
        raise ValueError("predict_case_native needs the case's PreprocessRecord when given an array.")
    probs = predict_volume(model, image, mode=mode, window=window, overlap=overlap, depth=depth, mirror=mirror)
    return invert_to_native(probs, record)


def threshold_regions(probabilities: np.ndarray, threshold: float = 0.5) -> np.ndarray:
    """bool regions ``(x, y, z, R)``: probability above ``threshold``."""
    if not 0 < threshold < 1:
        raise ValueError(f"evaluate.threshold={threshold}: use a probability in (0, 1).")
    return np.asarray(probabilities) > threshold


def regions_to_mask(regions: np.ndarray, layout: str) -> np.ndarray:
    """Label map in the layout's own values from predicted regions.

    Args:
        regions: ``(x, y, z, 3)`` WT, TC, ET, or ``(x, y, z, 1)`` WT only.
        layout: ``msd`` | ``brats2021`` | ``brats2023``.

    Returns:
        uint8 ``(x, y, z)``; for WT-only regions, WT voxels get the layout's edema label.
    """
    regions = np.asarray(regions).astype(bool)
    if regions.ndim != 4 or regions.shape[-1] not in (1, 3):
        raise ValueError(f"regions should have shape (x, y, z, 3) or (x, y, z, 1), got {regions.shape}.")
    if regions.shape[-1] == 1:
        empty = np.zeros(regions.shape[:3] + (2,), dtype=bool)
        regions = np.concatenate([regions, empty], axis=-1)  # WT only: no TC/ET -> edema label
    return regions_to_labels(regions, layout)


def check_native_shape(case_id: str, path, native: np.ndarray, shape: Sequence[int]) -> None:
    """Raise :class:`CaseError` if a native-grid array does not match a file's RAS shape."""
    if tuple(native.shape[:3]) != tuple(shape):
        raise CaseError(
            case_id, path, f"RAS shape {tuple(shape)} differs from the preprocessed grid {tuple(native.shape[:3])}",
            "The file changed since it was cached: re-run scripts/prepare_data.py.",
        )



# ---------------------------------------------------------------------------------------
# New (unlabelled) cases: scripts/predict.py
# ---------------------------------------------------------------------------------------

_NIFTI_EXTS = (".nii.gz", ".nii")
_BRATS_SEPARATORS = {"brats2021": "_", "brats2023": "-"}
_INPUT_HELP = "input=<case folder | MSD 4D .nii.gz | folder of 4D images | .txt list | dataset root>"


def _stem(path: Path) -> str:
    for ext in _NIFTI_EXTS:
        if path.name.endswith(ext):
            return path.name[: -len(ext)]
    return path.stem


def _is_nifti(path: Path) -> bool:
    return path.is_file() and path.name.endswith(_NIFTI_EXTS)


def _brats_case_layout(folder: Path, layout: str) -> str | None:
    """The brats layout whose file names ``<folder>/<folder name><sep>*`` the folder holds."""
    order = [layout] + [name for name in _BRATS_SEPARATORS if name != layout]
    for name in order:
        sep = _BRATS_SEPARATORS.get(name)
        if sep and any(_is_nifti(p) for p in folder.glob(f"{folder.name}{sep}*")):
            return name
    return None


def _cases_at(path: Path, layout: str, allow_root: bool) -> list[Case]:
    if path.is_file():
        if _is_nifti(path):
            return [Case(_stem(path), "msd", (path,), None)]  # an MSD-style 4D image
        raise DatasetError(f"input {path} is not a NIfTI image or a .txt list: pass {_INPUT_HELP}.")
    if not path.is_dir():
        raise DatasetError(f"input {path} does not exist: pass {_INPUT_HELP}.")
    if allow_root and (path / "dataset.json").is_file():
        return discover_cases(path, "msd", require_labels=False)[0]
    brats = _brats_case_layout(path, layout)
    if brats is not None:
        return [case_from_dir(path, brats)]
    images = sorted(p for p in path.iterdir() if _is_nifti(p))
    if images:
        return [Case(_stem(p), "msd", (p,), None) for p in images]  # e.g. MSD imagesTs/
    if allow_root:
        return discover_cases(path, layout, require_labels=False)[0]
    raise DatasetError(f"{path} is neither a case folder nor a 4D image: list {_INPUT_HELP.split('=')[1]} entries.")


def _read_list(path: Path) -> list[Path]:
    entries = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        entry = Path(line).expanduser()
        if not entry.is_absolute():
            beside = path.parent / entry
            entry = beside if beside.exists() or not entry.exists() else entry
        entries.append(entry)
    if not entries:
        raise DatasetError(f"input list {path} names no case: write one case folder or 4D image per line.")
    return entries


def find_input_cases(source: str | Path, layout: str) -> list[Case]:
    """The cases named by ``scripts/predict.py input=``.

    Accepted: a BraTS case folder (brats2021 or brats2023 file names); an MSD-style 4D
    image (``.nii``/``.nii.gz``, FLAIR, T1, T1ce, T2 along the 4th axis); a folder of
    such images (e.g. MSD ``imagesTs/``); a dataset root (MSD with dataset.json, or
    case folders in ``layout``; labels not needed); or a ``.txt`` file listing case
    folders or 4D images, one per line (relative paths are taken from the list's
    folder; blank lines and ``#`` comments are ignored).

    Args:
        source: the ``input=`` value.
        layout: the run's ``data.layout`` (tried first for case folders and roots).

    Returns:
        Cases (images only; any label file is ignored by prediction), in input order.

    Raises:
        DatasetError: nothing usable at ``source``, or duplicate case ids.
        CaseError: a case folder lacks a modality file.
    """
    if not str(source).strip():
        raise DatasetError(f"input is not set: pass {_INPUT_HELP}.")
    path = Path(source).expanduser()
    if path.is_file() and path.suffix == ".txt":
        cases = [case for entry in _read_list(path) for case in _cases_at(entry, layout, allow_root=False)]
    else:
        cases = _cases_at(path, layout, allow_root=True)
    ids = [c.case_id for c in cases]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise DatasetError(f"input {path}: case ids {dupes} occur more than once; their masks would overwrite each other.")
    return cases


def load_case_image(case: Case) -> tuple[np.ndarray, Volume]:
    """A case's images ``(x, y, z, 4)`` float32 in RAS (FLAIR, T1, T1ce, T2) and the first image's volume.

    Raises:
        CaseError: unreadable files, not 4 modalities, or modalities on different grids.
    """
    if len(case.images) == 1:
        vol = load_volume(case.images[0], case.case_id, expect_ndim=4)
        if vol.data.shape[-1] != 4:
            raise CaseError(
                case.case_id, vol.path, f"expected 4 modalities along the 4th axis, found {vol.data.shape[-1]}",
                "A 4D input holds FLAIR, T1, T1ce, T2 (MSD order); pass a BraTS case folder otherwise.",
            )
        return vol.data, vol
    vols = [load_volume(p, case.case_id) for p in case.images]
    check_same_grid(case.case_id, [(str(v.path), v.original_shape, v.original_affine) for v in vols])
    return np.stack([v.data for v in vols], axis=-1), vols[0]


def predict_new_case(model, case: Case, config: TrainConfig, output: Path, eval_cfg: EvaluateConfig) -> Path:
    """Predict one case and write ``<output>/<case_id>.nii.gz`` (and ``overlays/<case_id>.png``).

    The mask is in ``config.data.layout``'s labels (:func:`regions_to_mask`), on the grid
    of the case's first image file, with that file's affine and header.

    Raises:
        CaseError: bad files, or a brain box larger than the run's resolution.shape.
    """
    from brats_seg.evaluation.overlays import save_overlay

    image, ref = load_case_image(case)  # (x, y, z, 4) native RAS
    net_image, _, record = preprocess_case(
        case.case_id, image, ref.spacing_mm, config.resolution.spacing_mm, config.resolution.shape,
        allow_crop=config.data.allow_crop,
    )
    probs = predict_case_native(
        model, net_image, record, mode=eval_cfg.mode, window=eval_cfg.window, overlap=eval_cfg.window_overlap,
        mirror=eval_cfg.mirror
    )  # (x, y, z, R)
    regions = threshold_regions(probs, eval_cfg.threshold)
    path = save_mask(regions_to_mask(regions, config.data.layout), ref.original_affine, ref.original_header,
                     Path(output) / f"{case.case_id}.nii.gz")
    if eval_cfg.overlays:
        save_overlay(image[..., 0], None, regions, Path(output) / "overlays" / f"{case.case_id}.png",
                     title=case.case_id, spacing_mm=ref.spacing_mm, region_names=REGION_NAMES[: regions.shape[-1]])
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
