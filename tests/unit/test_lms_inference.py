"""The planner beyond the training step: the validation pass in the training plan, and the
evaluation / prediction process (brats_seg.lms.planner.inference, brats_seg.oom_inference)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from brats_seg.config import EvaluateConfig, ModelConfig
from brats_seg.lms.planner.cost import compute_network_cost, forward_only_bytes
from brats_seg.lms.planner.inference import NATIVE_SCORING_BYTES_PER_VOXEL, estimate_inference
from brats_seg.lms.planner.memory_model import MemoryModel
from brats_seg.lms.planner.timeline import simulate
from brats_seg.lms.planner.workload import Workload

CFG = ModelConfig(depth=3, base_filters=8, out_channels=3, region_parents=[-1, 0, 0])
SHAPE = (64, 64, 48)


def _timeline(batch, validates, policy="float32"):
    net = compute_network_cost(Workload(CFG, SHAPE, batch, policy, input_batches=3, validates=validates), MemoryModel())
    return net, simulate(net, ["keep"] * len(net.blocks))


def test_a_validating_run_plans_its_validation_pass_as_a_step():
    net, timeline = _timeline(2, validates=True)
    _, without = _timeline(2, validates=False)
    assert timeline.steps[-1] == "validation" and "validation" not in without.steps
    assert timeline.total_bytes[:-1] == without.total_bytes  # the training step itself is unchanged
    # one case at a time: the forward pass's activations of batch 2, halved, and the
    # validation pipeline's batches of one case (float16 image, uint8 labels)
    case = np.prod(SHAPE) * (4 * 2 + 3 * 1)
    assert net.validation_bytes == forward_only_bytes(net) // 2 + 3 * case
    # TensorFlow's allocator keeps the training step's high-water: validation reuses it (here it holds
    # more than the validation pass needs), and brings no NumPy arrays of its own (whole volumes)
    trained = max(without.total_bytes) - net.persistent_bytes
    assert trained > net.validation_bytes and net.validation_host_bytes == 0
    assert timeline.total_bytes[-1] == net.persistent_bytes + trained == max(without.total_bytes)


def test_a_patch_run_plans_its_sliding_validation_on_the_whole_grid():
    """Trained on patches, validation slides windows over whole volumes: besides the window's
    forward pass it holds the validation pipeline's whole volumes and the scoring's whole-grid
    tensors in TensorFlow's allocator, and the image, the blending's weights and two float32 arrays a
    region in NumPy, on top of the training step's high-water that the allocator keeps."""
    from brats_seg.lms.planner.cost import SLIDING_HOST_REGION_ARRAYS, SLIDING_SCORE_REGION_ARRAYS

    grid, patch = (128, 128, 96), (32, 32, 32)
    plain = compute_network_cost(Workload(CFG, patch, 2, input_batches=3, validates=True), MemoryModel())
    sliding = compute_network_cost(
        Workload(CFG, patch, 2, input_batches=3, validates=True, validation_grid=grid), MemoryModel()
    )
    voxels = np.prod(grid)
    pipeline = 3 * voxels * (4 * 2 + 3 * 1)  # three whole cases: float16 image, uint8 regions
    score = voxels * 4 * 3 * SLIDING_SCORE_REGION_ARRAYS
    host = voxels * (4 * 2 + 4 + 4 * 3 * SLIDING_HOST_REGION_ARRAYS)
    assert sliding.validation_bytes == forward_only_bytes(sliding) // 2 + pipeline + score
    assert sliding.validation_host_bytes == host and plain.validation_host_bytes == 0
    # against the same run planned as before: the patch-sized pipeline replaced by the whole grid's arrays
    assert sliding.validation_bytes - plain.validation_bytes == pipeline + score - 3 * np.prod(patch) * (4 * 2 + 3)
    timeline = simulate(sliding, ["keep"] * len(sliding.blocks))
    trained = max(timeline.total_bytes[:-1]) - sliding.persistent_bytes
    assert timeline.total_bytes[-1] == sliding.persistent_bytes + max(trained, sliding.validation_bytes) + host
    assert timeline.peak_at == "validation"  # 32^3 patches: the whole grid's validation is the peak
    # the training step is the same either way; a whole-volume workload has no validation grid
    assert sliding.persistent_bytes == plain.persistent_bytes
    from brats_seg.config import ResolutionConfig, TrainConfig, TrainerConfig

    cfg = TrainConfig(resolution=ResolutionConfig(name="half", spacing_mm=2.0, shape=[96, 112, 80]))
    assert Workload.from_config(cfg).validation_grid is None
    patched = dataclasses.replace(cfg, trainer=TrainerConfig(patch_size=[48, 48, 48]))
    assert Workload.from_config(patched).validation_grid == (96, 112, 80)


def test_forward_only_is_below_the_keep_all_training_step_and_halves_under_bf16():
    f32 = compute_network_cost(Workload(CFG, SHAPE, 1), MemoryModel())
    bf16 = compute_network_cost(Workload(CFG, SHAPE, 1, "mixed_bfloat16"), MemoryModel())
    kept = sum({t: b.tensor_bytes[t] for b in f32.blocks for t in b.saved}.values())
    assert forward_only_bytes(f32) < kept
    assert 0.45 < forward_only_bytes(bf16) / forward_only_bytes(f32) < 0.6  # float32 input and head remain


def test_inference_estimate_counts_mirroring_resampling_and_scoring():
    workload = Workload(CFG, SHAPE, 1)
    mm = MemoryModel()
    probs = int(np.prod(SHAPE)) * 3 * 4
    plain = estimate_inference(workload, mm, mirror=False)
    mirrored = estimate_inference(workload, mm, mirror=True)
    assert mirrored.forward_bytes == plain.forward_bytes + probs  # the first pass's probabilities wait
    native = 2 * int(np.prod(SHAPE))
    scored = estimate_inference(workload, mm, mirror=False, native_voxels=native)
    written = estimate_inference(workload, mm, mirror=False, native_voxels=native, scoring=False)
    flair = native * 4  # a prediction keeps the native FLAIR (float32) for its overlay, through every moment
    assert written.forward_bytes - scored.forward_bytes == flair
    assert scored.scoring_bytes - written.scoring_bytes == native * NATIVE_SCORING_BYTES_PER_VOXEL - flair
    bigger = estimate_inference(workload, mm, mirror=False, resampled_voxels=3 * int(np.prod(SHAPE)))
    assert bigger.native_bytes - plain.native_bytes == 2 * 2 * int(np.prod(SHAPE)) * 4  # one channel, twice
    assert plain.peak_bytes == max(plain.forward_bytes, plain.native_bytes, plain.scoring_bytes)
    assert batch_independent(workload, mm)


def test_on_cpu_the_moments_after_the_forward_pass_add_to_it_and_a_prediction_preprocesses_beside_it():
    """TensorFlow's CPU allocator keeps the forward pass's memory resident (measured: the RSS stays at
    the forward's peak with 32 MB allocated), so the native grid's arrays, the scoring's and the next
    case's preprocessing come on top of it; on a GPU the host's arrays count from the runtime."""
    workload, mm = Workload(CFG, SHAPE, 1), MemoryModel()
    voxels, native, resampled = int(np.prod(SHAPE)), 3 * int(np.prod(SHAPE)), 2 * int(np.prod(SHAPE))
    grids = {"native_voxels": native, "resampled_voxels": resampled}
    cpu = estimate_inference(workload, mm, mirror=True, **grids)
    gpu = estimate_inference(workload, mm, mirror=True, pool_retained=False, **grids)
    probs = voxels * 3 * 4
    native_arrays = probs + 2 * resampled * 4 + native * 4 * 4  # network probabilities, a channel twice, 3 + 1 native
    assert cpu.native_bytes - cpu.forward_bytes == native_arrays
    assert cpu.scoring_bytes - cpu.forward_bytes == native * (3 * 4 + NATIVE_SCORING_BYTES_PER_VOXEL)
    assert cpu.forward_bytes == gpu.forward_bytes and cpu.peak_bytes > gpu.peak_bytes
    assert gpu.scoring_bytes < cpu.forward_bytes < cpu.scoring_bytes  # on a GPU the forward's activations are gone
    assert cpu.preprocessing_bytes == 0 and cpu.peak_at == "scoring"  # evaluation reads the cache
    prep = 200 * voxels  # more than the native grid's arrays
    predicted = estimate_inference(workload, mm, mirror=True, scoring=False, preparation_bytes=prep, **grids)
    assert predicted.preprocessing_bytes == predicted.forward_bytes + prep and predicted.peak_at == "preprocessing"
    assert (
        estimate_inference(
            workload, mm, scoring=False, preparation_bytes=prep, pool_retained=False, **grids
        ).preprocessing_bytes
        < prep + gpu.forward_bytes
    )


def batch_independent(workload, mm) -> bool:
    """Evaluation runs one case at a time whatever the run's training batch."""
    return estimate_inference(dataclasses.replace(workload, batch_size=3), mm) == estimate_inference(workload, mm)


def test_inference_over_the_limit_is_refused_with_what_would_fit(tmp_path):
    from brats_seg.config import DataConfig, LMSConfig, ResolutionConfig, TrainConfig
    from brats_seg.oom_inference import check_inference_memory
    from brats_seg.run_dir import RunError

    run = TrainConfig(
        data=DataConfig(layout="brats2021"),
        resolution=ResolutionConfig(name="x", spacing_mm=1.0, shape=[192, 224, 160]),
        model=ModelConfig(depth=4, base_filters=16),
        lms=LMSConfig(limit="1GB"),
    )
    with pytest.raises(RunError) as err:
        check_inference_memory(run, EvaluateConfig(), "CPU", "float32")
    message = str(err.value)
    assert "192x224x160" in message and "lms.limit 1.00 GB" in message
    from brats_seg.cpu import has_native_bf16

    assert "evaluate.mirror=false (" in message
    assert ("backend.precision=bf16" in message) == has_native_bf16()  # only where oneDNN can run it
    run.lms.limit = "64GB"
    estimate = check_inference_memory(run, EvaluateConfig(), "CPU", "float32")
    assert 1e9 < estimate.peak_bytes < 8e9


@pytest.mark.alone  # the allocator's peak depends on the op order, which a busy neighbour changes
@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_forward_only_estimate_covers_the_allocators_peak_of_whole_volume_inference(policy):
    """The estimate of the forward pass (each tensor freed after its last reader, a layer's
    internals counted together) against TensorFlow's allocator during ``predict_volume``'s
    forward pass. Measured on four shapes and both policies: 9-26% above, never below."""
    from brats_seg.cpu import has_native_bf16

    if policy == "mixed_bfloat16" and not has_native_bf16():
        pytest.skip("this CPU has no native bfloat16: oneDNN cannot run bf16 convolutions here")
    import keras
    import tensorflow as tf

    from brats_seg.evaluation.inference.sliding import predict_volume
    from brats_seg.model.unet3d import build_unet3d

    keras.mixed_precision.set_dtype_policy(policy)
    try:
        model = build_unet3d(CFG, SHAPE)
        image = np.random.default_rng(0).standard_normal((*SHAPE, 4)).astype(np.float16)
        predict_volume(model, image)  # traced
        tf.config.experimental.reset_memory_stats("CPU:0")
        base = tf.config.experimental.get_memory_info("CPU:0")["current"]
        predict_volume(model, image)
        peak = tf.config.experimental.get_memory_info("CPU:0")["peak"] - base
    finally:
        keras.mixed_precision.set_dtype_policy("float32")
    net = compute_network_cost(Workload(CFG, SHAPE, 1, policy), MemoryModel())
    predicted = forward_only_bytes(net, with_loss=False) - net.tensor_bytes["labels"]
    assert peak <= predicted <= 1.4 * peak, (peak, predicted)


def test_the_mirrored_pass_runs_after_the_first_not_beside_it():
    """Test-time mirroring runs the mirrored pass once the first pass has ended (a control
    dependency in the traced graph), as the inference estimate assumes: the allocator's peak of
    the mirrored call stays at one pass's plus the first pass's float32 probabilities waiting
    and the mirrored input, where two passes side by side held both passes' activations (measured at
    full resolution on a Zen 5: 1.99 against 1.35 GB, docs/measurements/inference_first_call_zen5/)."""
    import tensorflow as tf

    from brats_seg.evaluation.inference.sliding import predict_volume
    from brats_seg.model.unet3d import build_unet3d

    model = build_unet3d(CFG, SHAPE)
    image = np.random.default_rng(0).standard_normal((*SHAPE, 4)).astype(np.float16)
    peaks = {}
    for mirror in (False, True):
        predict_volume(model, image, mirror=mirror)  # traced
        tf.config.experimental.reset_memory_stats("CPU:0")
        base = tf.config.experimental.get_memory_info("CPU:0")["current"]
        predict_volume(model, image, mirror=mirror)
        peaks[mirror] = tf.config.experimental.get_memory_info("CPU:0")["peak"] - base
    # beyond one pass: the first pass's probabilities, the flipped input, the second pass's
    # probabilities, flipped back, and their mean (float32); two passes side by side held about
    # twice one pass here (51.9 against 27.3 MB), one after the other 30-35 MB
    probs, flipped = int(np.prod(SHAPE)) * CFG.out_channels * 4, int(np.prod(SHAPE)) * 4 * 4
    assert peaks[True] <= peaks[False] + 4 * probs + flipped, (peaks, probs)


@pytest.mark.parametrize("spacing_mm", [4.0, 2.5])
def test_a_predictions_records_from_the_headers_are_the_grids_its_preprocessing_makes(synthetic_root, spacing_mm):
    """predict.py plans from the input files' headers (no voxels read): the native and resampled grids
    must be those preprocessing then makes, and the preparation estimate that of the case's grid."""
    from brats_seg.data.case_io import load_case_image
    from brats_seg.data.layouts import discover_cases
    from brats_seg.data.prep_memory import prediction_records
    from brats_seg.data.preprocess import estimate_preparation_bytes, preprocess_case

    shape = [48, 56, 40] if spacing_mm == 4.0 else [80, 96, 64]
    cases = discover_cases(synthetic_root["brats2023"], "brats2023")[0][:2]
    records = prediction_records(cases, spacing_mm, shape)
    assert len(records) == len(cases)
    for case, record in zip(cases, records):
        image, ref = load_case_image(case)
        _, _, made = preprocess_case(case.case_id, image, ref.spacing_mm, spacing_mm, shape, allow_crop=True)
        assert record["native_shape"] == list(made.native_shape)
        assert record["resampled_shape"] == list(made.resampled_shape)
        assert record["preparation_bytes"] == estimate_preparation_bytes(image.shape, ref.spacing_mm, spacing_mm, shape)
