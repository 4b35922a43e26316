"""Inference of one image on the network grid: whole volume, or overlapping windows.

Arrays are channels-last RAS: an image ``(X, Y, Z, C)`` on the network grid
(``resolution.shape``), probabilities ``(X, Y, Z, R)``, one channel per predicted region.

Two modes, chosen by ``evaluate.mode``:

* ``whole``: the whole network grid in one forward pass (the model was trained on it);
* ``sliding``: overlapping windows (each axis divisible by ``2**depth``; default half
  the grid, rounded) blended with a Gaussian importance map, as nnU-Net does: each
  window's voxels are weighted by a Gaussian centred on the window (sigma = 1/8 of the
  window per axis), and every voxel's probability is the weighted mean over the windows
  that cover it. Voxels near a window's edge, where zero padding makes the network
  least reliable, count least, so no seams show. Only for models whose normalisation
  does not depend on the input's extent (``model.norm=batch``): see
  :func:`brats_seg.evaluation.inference.run.check_evaluate_config`.

Keras is imported only when a window model has to be cloned.
"""

from __future__ import annotations

import logging
import math
import weakref
from collections.abc import Sequence

import numpy as np

from brats_seg.choices import check_choice
from brats_seg.config import EvalMode
from brats_seg.evaluation.inference.ensemble_model import Ensemble

__all__ = [
    "GAUSSIAN_SIGMA_SCALE",
    "default_window",
    "gaussian_importance_map",
    "predict_volume",
    "resolve_window",
    "sliding_window_starts",
    "window_corners",
]

log = logging.getLogger(__name__)

_GAUSSIAN_SIGMA_SCALE = 1 / 8  # sigma per axis as a fraction of the window (nnU-Net's value)
GAUSSIAN_SIGMA_SCALE = _GAUSSIAN_SIGMA_SCALE  # the blending's sigma, for those who record it (an export)


def default_window(shape: Sequence[int], depth: int) -> tuple[int, int, int]:
    """Half the grid per axis, rounded to the nearest multiple of ``2**depth`` (at least one)."""
    multiple = 2**depth
    return tuple(min(int(s), max(multiple, math.floor(s / 2 / multiple + 0.5) * multiple)) for s in shape)


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
    n_steps = math.ceil((size - window) / target_step) + 1
    if n_steps == 1:
        return [0]
    step = (size - window) / (n_steps - 1)
    return [round(step * i) for i in range(n_steps)]


def window_corners(shape: Sequence[int], window: Sequence[int], overlap: float) -> list[tuple[int, int, int]]:
    """Start corners ``(x, y, z)`` of the sliding windows over ``shape``, in the order sliding mode
    runs and sums them (x slowest, z fastest): :func:`sliding_window_starts` along each axis.

    Args:
        shape: grid ``(X, Y, Z)`` (voxels).
        window: window ``(wx, wy, wz)``, each ``<=`` its axis.
        overlap: fraction of the window shared by neighbours, in ``[0, 1)``.
    """
    starts = [sliding_window_starts(int(s), int(w), overlap) for s, w in zip(shape, window)]
    return [(i, j, k) for i in starts[0] for j in starts[1] for k in starts[2]]


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


_WINDOW_MODELS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


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
    """The model's channels of ``image`` (FLAIR-only models: channel 0), in the image's float
    dtype (the cache's float16 is not upcast here: the model casts it on the device)."""
    image = np.asarray(image)
    if image.ndim != 4:
        raise ValueError(f"image should have shape (X, Y, Z, C), got {image.shape}.")
    channels = model.input_shape[-1]
    if image.shape[-1] < channels:
        raise ValueError(f"image has {image.shape[-1]} channels but the model takes {channels} (FLAIR, T1, T1ce, T2).")
    dtype = image.dtype if image.dtype in (np.float16, np.float32) else np.float32
    return np.ascontiguousarray(image[..., :channels], dtype=dtype)


def resolve_window(window, shape: tuple[int, int, int], depth: int) -> tuple[int, int, int]:
    if not window:
        return default_window(shape, depth)
    window = tuple(int(w) for w in window)
    multiple = 2**depth
    if len(window) != 3 or any(w < 1 for w in window):
        raise ValueError(f"evaluate.window should be 3 positive sizes (x, y, z), got {list(window)}.")
    if any(w % multiple for w in window):
        fixed = [max(multiple, round(w / multiple) * multiple) for w in window]
        raise ValueError(f"evaluate.window={list(window)} is not divisible by 2**depth = {multiple}; use e.g. {fixed}.")
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
        model: Keras model ``(B, X, Y, Z, C) -> (B, X, Y, Z, R)`` sigmoid probabilities, or an
            :class:`~brats_seg.evaluation.inference.ensemble_model.Ensemble` (the mean of its members').
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
    check_choice(mode, EvalMode, "evaluate.mode")
    if not 0 <= overlap < 1:
        raise ValueError(f"evaluate.window_overlap={overlap}: use a fraction in [0, 1).")
    if isinstance(model, Ensemble):  # the members one after the other, their running sum kept
        total = None
        for member in model.models:
            probs = predict_volume(member, image, mode, window, overlap, depth, batch_size, mirror)
            if total is None:
                total = probs if probs.flags.writeable else probs.copy()
            else:
                total += probs
        total /= len(model.models)
        return total
    image = _check_image(model, image)
    shape = tuple(int(s) for s in image.shape[:3])
    if mode == "whole":  # mirrored inside the graph: no flipped copy of the volume on the host
        return _forward(_model_for(model, shape), image[None], mirror)[0]
    if mirror:
        probs = predict_volume(model, image, mode, window, overlap, depth, batch_size)
        mirrored = predict_volume(model, np.ascontiguousarray(image[::-1]), mode, window, overlap, depth, batch_size)
        return 0.5 * (probs + mirrored[::-1])
    depth = _model_depth(model) if depth is None else int(depth)
    win = resolve_window(window, shape, depth)
    return _predict_sliding(_model_for(model, win), image, win, overlap, batch_size)


_FORWARD_FNS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _forward(model, batch: np.ndarray, mirror: bool = False) -> np.ndarray:
    """``model(batch)`` as float32, in a ``tf.function``: Keras' eager functional call keeps
    every intermediate tensor until the output (the whole forward pass's activations at once:
    at 2x resolution more than the machine's memory), the graph executor frees each one after
    its last use. ``mirror``: the mean with the prediction of the x-mirrored input."""
    import keras

    if not isinstance(model, keras.Model):  # any other callable (a test double) runs on arrays
        probs = np.asarray(model(batch, training=False), dtype=np.float32)
        if mirror:
            flipped = np.asarray(model(np.ascontiguousarray(batch[:, ::-1]), training=False), dtype=np.float32)
            probs = 0.5 * (probs + flipped[:, ::-1])
        return probs
    fns = _FORWARD_FNS.setdefault(model, {})
    if mirror not in fns:
        import tensorflow as tf

        def forward(x):  # (B, X, Y, Z, C) -> (B, X, Y, Z, R) float32
            p = tf.cast(model(x, training=False), tf.float32)
            if mirror:
                # the mirrored pass starts once the first has ended: the two are independent in
                # the graph, and the executor would run them side by side, both passes'
                # activations alive at once (1.7-1.9x the first call's estimate at full
                # resolution in float32, measured on a Zen 5), for no gain on a CPU whose
                # threads one pass already fills
                with tf.control_dependencies([p]):
                    flipped = tf.reverse(x, axis=[1])
                q = tf.cast(model(flipped, training=False), tf.float32)
                p = 0.5 * (p + tf.reverse(q, axis=[1]))
            return p

        fns[mirror] = tf.function(forward, reduce_retracing=True, autograph=False)
    return fns[mirror](batch).numpy()


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
