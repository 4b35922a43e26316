"""The memory model's coefficients and CPU presets against measured peaks (brats_seg.lms.memory_model).

The measurements and how the presets were fitted: docs/lms_calibration.md.
"""

from __future__ import annotations

import pytest

from brats_seg.lms.memory_model import CPU_MEMORY_MODELS, MemoryModel, memory_model_for
from brats_seg.lms.timeline import tail_kept
from tests.unit.lms_workloads import FULL, GB, HALF, ModelConfig, estimate, network

# Measured on CPU (backend=cpu_onednn, float32, Adam, batch 1, depth 4 unless noted):
# peak RSS of model build + 4 training steps above the RSS just before the build (what
# scripts/benchmark.py ... benchmark.steps=3 reports as measured_bytes), mean of two runs
# with their range: the BFC pool keeps touching new pages for a few steps (more under
# recompute), so the steady state, not the first step, is what a training run holds.
# (base_filters, shape, depth, lms) -> bytes; docs/lms_calibration.md.
MEASURED = {
    (8, (64, 64, 48), 4, "off"): 0.318e9,  # 0.313-0.324
    (8, (64, 64, 48), 4, "recompute"): 0.295e9,  # 0.294-0.296
    (8, HALF, 4, "off"): 0.743e9,  # 0.737-0.749
    (8, HALF, 4, "recompute"): 0.576e9,  # 0.575-0.578
    (8, FULL, 4, "off"): 4.403e9,  # 4.315-4.492
    (8, FULL, 4, "recompute"): 2.658e9,  # 2.444-2.871
    (16, (48, 56, 40), 3, "off"): 0.289e9,  # 0.287-0.292
    (16, (48, 56, 40), 3, "recompute"): 0.252e9,  # 0.248-0.256
    (16, (64, 64, 48), 4, "off"): 0.530e9,  # 0.518-0.542
    (16, (64, 64, 48), 4, "recompute"): 0.460e9,  # 0.438-0.481
    (16, HALF, 4, "off"): 1.352e9,  # 1.339-1.365
    (16, HALF, 4, "recompute"): 0.955e9,  # 0.939-0.971
    (16, (128, 128, 96), 4, "off"): 2.307e9,  # 2.305-2.310
    (16, (128, 128, 96), 4, "recompute"): 1.512e9,  # 1.498-1.525
    (16, (160, 192, 128), 4, "off"): 4.956e9,  # 4.956-4.957
    (16, (160, 192, 128), 4, "recompute"): 2.788e9,  # 2.621-2.954
    (16, FULL, 4, "off"): 8.781e9,  # 8.454-9.108
    (16, FULL, 4, "recompute"): 5.092e9,  # 5.044-5.140
}


# The same measured on an AVX2-only CPU (AMD EPYC, oneDNN isa avx2), one run each: the
# calibration grid of the "avx2" preset, then points it was not fitted on (the slow test's,
# two runs each) (docs/lms_calibration.md, "AVX2-only CPUs").
MEASURED_AVX2 = {
    (16, (64, 64, 48), 4, "off"): 0.617e9,
    (16, (64, 64, 48), 4, "recompute"): 0.562e9,
    (16, (48, 56, 40), 3, "off"): 0.340e9,
    (16, (48, 56, 40), 3, "recompute"): 0.311e9,
    (16, (128, 128, 96), 4, "off"): 2.539e9,
    (16, (128, 128, 96), 4, "recompute"): 1.863e9,
    (8, (160, 192, 128), 4, "off"): 3.038e9,
    (8, (160, 192, 128), 4, "recompute"): 2.298e9,
    (8, (64, 64, 48), 4, "off"): 0.369e9,
    (32, (64, 64, 48), 4, "off"): 1.224e9,
    (8, (64, 64, 48), 4, "recompute"): 0.360e9,  # held out: 0.340-0.380
    (8, HALF, 4, "off"): 0.918e9,  # held out: 0.916-0.920
    (8, HALF, 4, "recompute"): 0.738e9,  # held out: 0.730-0.746
    (8, FULL, 4, "off"): 5.117e9,  # held out: 5.103-5.130
    (8, FULL, 4, "recompute"): 3.921e9,  # held out: 3.711-4.130
}
_CALIBRATIONS = [("avx512", k, v) for k, v in MEASURED.items()] + [("avx2", k, v) for k, v in MEASURED_AVX2.items()]


@pytest.mark.parametrize("isa,key,measured", _CALIBRATIONS,
                         ids=lambda v: f"f{v[0]}-{'x'.join(map(str, v[1]))}-d{v[2]}-{v[3]}" if isinstance(v, tuple) else None)
def test_cpu_presets_match_their_measurements(isa, key, measured):
    """Each CPU preset is its calibration: every peak measured on that ISA within 15%."""
    filters, shape, depth, strategy = key
    mm = CPU_MEMORY_MODELS[isa]
    predicted = estimate(ModelConfig(depth=depth, base_filters=filters), shape, 1, strategy=strategy,
                         memory_model=mm).peak_bytes
    assert abs(predicted - measured) <= 0.15 * measured


def test_full_resolution_is_plausible():
    """16 filters at 192x224x160, float32, batch 1 trains in 8.4 GB above the imported
    TensorFlow on CPU (peak RSS 9.6 GB; docs/lms_calibration.md): the calibrated
    prediction is within 15% of it, at the start of dec0's backward, and recompute
    saves more than 35% of it (measured: 39.3% after four steps)."""
    cfg = ModelConfig(depth=4, base_filters=16, norm="instance")
    t = estimate(cfg, FULL, 1, "float32")
    assert 0.85 * 8.4 * GB <= t.peak_bytes <= 1.15 * 8.4 * GB
    assert t.peak_at == "backward dec0"
    assert estimate(cfg, FULL, 1, "float32", strategy="recompute").peak_bytes < 0.65 * t.peak_bytes


# Measured on CPU (backend=cpu_onednn, float32, Adam, batch 1, depth 4 unless noted):
# peak RSS of model build + 4 training steps above the RSS just before the build (what
# scripts/benchmark.py ... benchmark.steps=3 reports as measured_bytes), mean of two runs
# with their range: the BFC pool keeps touching new pages for a few steps (more under
# recompute), so the steady state, not the first step, is what a training run holds.
# (base_filters, shape, depth, lms) -> bytes; docs/lms_calibration.md.
MEASURED = {
    (8, (64, 64, 48), 4, "off"): 0.318e9,  # 0.313-0.324
    (8, (64, 64, 48), 4, "recompute"): 0.295e9,  # 0.294-0.296
    (8, HALF, 4, "off"): 0.743e9,  # 0.737-0.749
    (8, HALF, 4, "recompute"): 0.576e9,  # 0.575-0.578
    (8, FULL, 4, "off"): 4.403e9,  # 4.315-4.492
    (8, FULL, 4, "recompute"): 2.658e9,  # 2.444-2.871
    (16, (48, 56, 40), 3, "off"): 0.289e9,  # 0.287-0.292
    (16, (48, 56, 40), 3, "recompute"): 0.252e9,  # 0.248-0.256
    (16, (64, 64, 48), 4, "off"): 0.530e9,  # 0.518-0.542
    (16, (64, 64, 48), 4, "recompute"): 0.460e9,  # 0.438-0.481
    (16, HALF, 4, "off"): 1.352e9,  # 1.339-1.365
    (16, HALF, 4, "recompute"): 0.955e9,  # 0.939-0.971
    (16, (128, 128, 96), 4, "off"): 2.307e9,  # 2.305-2.310
    (16, (128, 128, 96), 4, "recompute"): 1.512e9,  # 1.498-1.525
    (16, (160, 192, 128), 4, "off"): 4.956e9,  # 4.956-4.957
    (16, (160, 192, 128), 4, "recompute"): 2.788e9,  # 2.621-2.954
    (16, FULL, 4, "off"): 8.781e9,  # 8.454-9.108
    (16, FULL, 4, "recompute"): 5.092e9,  # 5.044-5.140
}


# The same measured on an AVX2-only CPU (AMD EPYC, oneDNN isa avx2), one run each: the
# calibration grid of the "avx2" preset, then points it was not fitted on (the slow test's,
# two runs each) (docs/lms_calibration.md, "AVX2-only CPUs").
MEASURED_AVX2 = {
    (16, (64, 64, 48), 4, "off"): 0.617e9,
    (16, (64, 64, 48), 4, "recompute"): 0.562e9,
    (16, (48, 56, 40), 3, "off"): 0.340e9,
    (16, (48, 56, 40), 3, "recompute"): 0.311e9,
    (16, (128, 128, 96), 4, "off"): 2.539e9,
    (16, (128, 128, 96), 4, "recompute"): 1.863e9,
    (8, (160, 192, 128), 4, "off"): 3.038e9,
    (8, (160, 192, 128), 4, "recompute"): 2.298e9,
    (8, (64, 64, 48), 4, "off"): 0.369e9,
    (32, (64, 64, 48), 4, "off"): 1.224e9,
    (8, (64, 64, 48), 4, "recompute"): 0.360e9,  # held out: 0.340-0.380
    (8, HALF, 4, "off"): 0.918e9,  # held out: 0.916-0.920
    (8, HALF, 4, "recompute"): 0.738e9,  # held out: 0.730-0.746
    (8, FULL, 4, "off"): 5.117e9,  # held out: 5.103-5.130
    (8, FULL, 4, "recompute"): 3.921e9,  # held out: 3.711-4.130
}
_CALIBRATIONS = [("avx512", k, v) for k, v in MEASURED.items()] + [("avx2", k, v) for k, v in MEASURED_AVX2.items()]


def test_avx2_preset_adds_the_gemm_weight_gradient_scratch():
    """On AVX2, oneDNN's gemm gradient by weights of dec0's first convolution (16 channels in
    at 8 filters) copies one sample's input and an im2col slice: 0.50 GB at full resolution,
    outside TensorFlow's allocator (RSS beyond the allocator's peak grew by 0.55 GB)."""
    cfg = ModelConfig(depth=4, base_filters=8)
    avx2 = network(cfg, FULL, 1, memory_model=CPU_MEMORY_MODELS["avx2"])
    assert avx2.persistent["library_scratch_bytes"] == 16 * (192 * 224 * 160 + 27 * 224 * 160) * 4
    batch2 = network(cfg, FULL, 2, memory_model=CPU_MEMORY_MODELS["avx2"])
    assert batch2.persistent["library_scratch_bytes"] == avx2.persistent["library_scratch_bytes"]  # per sample
    assert network(cfg, FULL, 1).persistent["library_scratch_bytes"] == 0  # AVX-512: direct kernels


def test_memory_model_for_picks_the_preset_of_the_device():
    assert memory_model_for("CPU", "avx512") == MemoryModel()
    assert memory_model_for("CPU", "avx2") == CPU_MEMORY_MODELS["avx2"] != MemoryModel()
    assert memory_model_for("CPU", "other") == CPU_MEMORY_MODELS["avx2"]  # the larger preset when unknown
    assert memory_model_for("GPU", "avx2") == MemoryModel()  # the host's ISA says nothing about the GPU


def test_runtime_allowance_excludes_the_imported_runtime():
    """The baseline of a measurement (and the RAM available to a run) already holds the
    imported TensorFlow (~0.85 GB RSS); the allowance is only what building and tracing add."""
    net = network(ModelConfig(depth=4), HALF, 1)
    assert 0.05 * GB <= net.persistent["runtime_bytes"] <= 0.3 * GB
    # it grows with the convolutions traced (their graphs and oneDNN primitives), not the input
    convs = sum(1 for blk in net.blocks for layer in blk.layers if layer.kind in ("conv", "up_transpose"))
    assert net.persistent["runtime_bytes"] == convs * MemoryModel().runtime_bytes_per_conv
    assert network(ModelConfig(depth=4), FULL, 1).persistent["runtime_bytes"] == net.persistent["runtime_bytes"]
    assert network(ModelConfig(depth=3), HALF, 1).persistent["runtime_bytes"] < net.persistent["runtime_bytes"]
    assert net.persistent["workspace_bytes"] == 0  # oneDNN's direct convolutions take no workspace tensor
    assert network(ModelConfig(depth=4), HALF, 1, memory_model=MemoryModel(workspace_factor=1.0)).persistent[
        "workspace_bytes"] == max(layer.workspace_ref_bytes for blk in net.blocks for layer in blk.layers)


def test_rebuilding_costs_its_runtime_and_a_share_of_the_largest_rebuild():
    """Recomputation adds the traced recompute graphs and the BFC pool pages its rebuilt
    tensors leave behind (a share of the largest block's rebuilt internals), once per step."""
    cfg = ModelConfig(depth=4)
    plain = MemoryModel(rebuild_runtime_bytes=0, rebuild_fragmentation=0.0)
    for strategy in ("off", "recompute"):
        with_terms = estimate(cfg, HALF, 1, strategy=strategy).total_bytes
        without = estimate(cfg, HALF, 1, strategy=strategy, memory_model=plain).total_bytes
        extra = {a - b for a, b in zip(with_terms, without)}
        if strategy == "off":
            assert extra == {0}  # nothing is rebuilt
            continue
        assert len(extra) == 1  # resident for the whole step
        net = network(cfg, HALF, 1)
        rebuilt = max(blk.internal_saved_bytes - (blk.tail_saved_bytes if tail_kept(net, i, strategy) else 0)
                      for i, blk in enumerate(net.blocks))
        mm = MemoryModel()
        assert extra.pop() == pytest.approx(mm.rebuild_runtime_bytes + mm.rebuild_fragmentation * rebuilt, abs=2)


def test_memory_model_rejects_bad_coefficients():
    with pytest.raises(ValueError, match="activation_factor"):
        MemoryModel(activation_factor=-1)
    with pytest.raises(ValueError, match="norm_saved_tensors"):
        MemoryModel(norm_saved_tensors=0.5)
