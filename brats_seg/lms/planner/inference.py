"""Memory of evaluation and prediction: whole-volume inference, mirroring, the way back to the native grid.

``scripts/evaluate.py`` and ``scripts/predict.py`` run each case through
``brats_seg.evaluation.inference.sliding.predict_volume`` (the model in a ``tf.function``, which frees
every tensor after its last reader; test-time mirroring in the same graph) and
``brats_seg.data.preprocess.invert_to_native`` (a channel at a time), then threshold, write
and score on the native grid. This module predicts that process's peak above the imported
runtime from the same cost tables as the training plan (:mod:`brats_seg.lms.planner.cost`), so a run
trained under ``lms.limit`` is evaluated under it too, or refused before any model is loaded.

Per case, at the worst of four moments:

- **forward**: the weights and the per-convolution runtime, the case's float16 image twice
  (the host's array and TensorFlow's copy of it), and the forward pass's activations
  (:func:`~brats_seg.lms.planner.cost.forward_only_bytes`); with mirroring the second pass runs
  while the first one's float32 probabilities wait, and the mean makes two more;
- **back to the native grid**: the float32 probabilities on the network grid, one channel
  on the resampled grid twice (the padded window and SimpleITK's copy), and the native
  probabilities of every channel;
- **scoring**: the native probabilities, label maps and the metrics' distance maps, a few
  native-sized float64 arrays (:data:`NATIVE_SCORING_BYTES_PER_VOXEL`);
- **preprocessing** (prediction from a case's files): the next case's native channels, its
  resampled grid and its network-grid image
  (:func:`brats_seg.data.preprocess.estimate_preparation_bytes`, given by the caller).

On CPU the moments after the first forward pass add to it: TensorFlow's CPU allocator under
oneDNN keeps what the forward pass reached resident once it is freed (measured at full resolution
on a Zen 5: the RSS stays at the forward's peak while the allocator holds 32 MB, and
``malloc_trim`` returns nothing), and the NumPy and SimpleITK arrays of the native grid and of the
next case's preprocessing are allocated beside it. On a GPU the device's pool holds the forward
pass and the host's arrays are elsewhere: the moments are counted from the runtime as before.
A prediction from files also keeps the case's native FLAIR (for overlays) through all of them.

An ensemble of ``members`` models (:mod:`brats_seg.evaluation.inference.ensemble`) runs them one after
the other: every member's weights are held, and the running sum of the finished members' float32
probabilities waits through the next member's forward pass.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from brats_seg.lms.planner.cost import compute_network_cost, forward_only_bytes
from brats_seg.lms.planner.layer_cost import FLOAT32_BYTES
from brats_seg.lms.planner.memory_model import MemoryModel
from brats_seg.lms.planner.workload import Workload

__all__ = ["NATIVE_SCORING_BYTES_PER_VOXEL", "InferenceEstimate", "estimate_inference"]

# Native-grid arrays alive while a case is scored: the reference and predicted label maps,
# per-region boolean masks, surface-distance maps (float64) and panoptica's instance maps:
# about six float64 arrays of the native grid. An allowance, not calibrated.
NATIVE_SCORING_BYTES_PER_VOXEL = 48


@dataclass(frozen=True)
class InferenceEstimate:
    """Predicted memory of evaluating or predicting one case (bytes above the imported runtime).

    Attributes:
        forward_bytes: at the forward pass (or the mirrored second pass).
        native_bytes: while the probabilities go back to the native grid.
        scoring_bytes: while the case is scored on the native grid.
        preprocessing_bytes: while the next case is read and preprocessed from its files
            (0: evaluation from the cache).
        peak_bytes: the largest of the four.
        peak_at: ``forward``, ``native``, ``scoring`` or ``preprocessing``.
    """

    forward_bytes: int
    native_bytes: int
    scoring_bytes: int
    preprocessing_bytes: int = 0

    def _moments(self) -> tuple[tuple[str, int], ...]:
        return (
            ("forward", self.forward_bytes),
            ("native", self.native_bytes),
            ("scoring", self.scoring_bytes),
            ("preprocessing", self.preprocessing_bytes),
        )

    @property
    def peak_bytes(self) -> int:
        return max(b for _, b in self._moments())

    @property
    def peak_at(self) -> str:
        return max(self._moments(), key=lambda kv: kv[1])[0]


def estimate_inference(
    workload: Workload,
    memory_model: MemoryModel,
    mirror: bool = True,
    resampled_voxels: int | None = None,
    native_voxels: int | None = None,
    scoring: bool = True,
    members: int = 1,
    preparation_bytes: int = 0,
    pool_retained: bool = True,
) -> InferenceEstimate:
    """The peak of evaluating (``scoring``) or predicting one case of ``workload``'s shape.

    Args:
        workload: the model, network grid and dtype policy (batch and pipeline ignored:
            one case at a time, read from the cache or the input files).
        memory_model: the device's coefficients (``activation_factor``, the runtime).
        mirror: test-time mirroring (``evaluate.mirror``).
        resampled_voxels: voxels of the case's resampled grid (the native extent at the
            network spacing; the cache's ``resampled_shape``); default the network grid's.
        native_voxels: voxels of the native grid; default the network grid's.
        scoring: whether the case is scored (evaluation) or only written (prediction).
        members: models of an ensemble, run one after the other (1: a single run's model).
        preparation_bytes: a case's preprocessing from its files (prediction:
            :func:`brats_seg.data.preprocess.estimate_preparation_bytes` of the largest case); 0
            from the cache.
        pool_retained: the forward pass's memory stays resident after it (CPU: TensorFlow's
            allocator keeps it), so the later moments add to it; False (GPU): they count from
            the runtime.
    """
    one = dataclasses.replace(workload, batch_size=1, input_batches=0, validates=False)
    net = compute_network_cost(one, memory_model)
    mm = memory_model
    voxels = 1
    for s in one.input_shape:
        voxels *= s
    regions = one.model_cfg.out_channels
    probs = voxels * regions * FLOAT32_BYTES  # float32 probabilities on the network grid
    resampled = resampled_voxels or voxels
    native = native_voxels or voxels
    # under bfloat16, what oneDNN holds outside the allocator (MemoryModel.bf16_scratch_*), taken
    # as the training step's: an evaluation in bf16 at 96x112x80 measured 0.30 GB against 0.23 GB
    # predicted without it (its forward-only share is not calibrated apart; this errs high)
    runtime = (
        net.persistent["runtime_bytes"]
        + max(1, members) * (net.persistent["weight_bytes"] + net.persistent["weight_cast_bytes"])
        + net.persistent["bf16_scratch_bytes"]
    )
    host_image = net.tensor_bytes["batch_image"]  # the float16 image on the host; TensorFlow holds a copy
    activations = forward_only_bytes(net, with_loss=False) - net.tensor_bytes["labels"]  # no labels, no loss
    # outside the allocator at the first call: the kind's allowance (AVX2, Zen 4/5 in float32), or
    # under bfloat16 the training step's scratch already in ``runtime`` when that is larger
    outside = max(0.0, mm.inference_scratch_bytes_per_voxel * voxels - net.persistent["bf16_scratch_bytes"])
    forward = runtime + host_image + mm.activation_factor * activations + outside
    if mirror:  # the first pass's probabilities wait through the second; then the mean of both
        forward = max(forward + mm.activation_factor * probs, runtime + host_image + 3 * probs)
    if members > 1:  # the finished members' sum waits through the next member's pass
        forward += probs
    flair = 0 if scoring else native * FLOAT32_BYTES  # a prediction keeps the native FLAIR for its overlay
    forward += flair
    after = forward if pool_retained else runtime + flair  # what the later moments add to
    back = after + probs + 2 * resampled * FLOAT32_BYTES + native * (regions + 1) * FLOAT32_BYTES
    score = after + native * regions * FLOAT32_BYTES + (native * NATIVE_SCORING_BYTES_PER_VOXEL if scoring else 0)
    # the next case's preprocessing: beside the resident forward pass on CPU (from the second case on)
    prep = ((after if pool_retained else runtime) + preparation_bytes) if preparation_bytes else 0
    return InferenceEstimate(int(forward), int(back), int(score), int(prep))
