"""Unit tests of the LMS memory planner (pure Python, no TensorFlow)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from brats_seg.config import ModelConfig as _ModelConfig
from brats_seg.config import TrainConfig
from brats_seg.lms.planner import (
    CPU_MEMORY_MODELS,
    MemoryModel,
    Plan,
    PlanDoesNotFitError,
    compare_strategies,
    compute_network_cost,
    estimate_peak,
    fit_memory_model,
    memory_model_for,
    parse_limit,
    plan_lms,
    plan_lms_from_config,
    simulate,
    tail_kept,
)

FULL = (192, 224, 160)
HALF = (96, 112, 80)
GB = 10**9


def ModelConfig(**kw) -> _ModelConfig:  # noqa: N802 - the planner needs resolved outputs (WT, TC, ET)
    return _ModelConfig(**{"out_channels": 3, **kw})


def peaks(cfg: ModelConfig, shape, batch: int = 1, policy: str = "float32", **kwargs) -> dict[str, int]:
    """Predicted peak per strategy (auto only when it fits)."""
    out = compare_strategies(cfg, shape, batch, policy, "adam", 10**15, **kwargs)
    return {k: v["predicted_peak_bytes"] for k, v in out.items()}


# ---------------------------------------------------------------------------------------
# parse_limit
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, device_bytes, expected",
    [
        ("16GB", None, 16 * 10**9),
        ("16GiB", None, 16 * 2**30),
        ("16 gib", None, 16 * 2**30),
        ("512MB", None, 512 * 10**6),
        ("512MiB", None, 512 * 2**20),
        ("1.5GB", None, 1_500_000_000),
        ("1.5e10", None, 15_000_000_000),
        ("12345", None, 12345),
        ("2048B", None, 2048),
        ("0.8", 10 * 10**9, 8 * 10**9),
        ("1.0", 10 * 10**9, 10 * 10**9),
        ("1", 10 * 10**9, 10 * 10**9),
        (0.5, 4 * 10**9, 2 * 10**9),
        (12345, None, 12345),
    ],
)
def test_parse_limit(text, device_bytes, expected):
    assert parse_limit(text, device_bytes) == expected


@pytest.mark.parametrize("text", ["", "abc", "16XB", "-5GB", "16 G B", "0", "0GB", "1e", True])
def test_parse_limit_rejects_junk(text):
    with pytest.raises(ValueError, match="lms.limit"):
        parse_limit(text, 10 * GB)


def test_parse_limit_fraction_needs_device_size():
    with pytest.raises(ValueError, match="device size is unknown"):
        parse_limit("0.8", None)


# ---------------------------------------------------------------------------------------
# The memory model
# ---------------------------------------------------------------------------------------


def test_hand_count_tiny_network():
    """depth 1, base 2, 4x4x4 input, 4 -> 3 channels, float32, batch 1, instance norm.

    Level 0: 64 voxels, level 1: 8 voxels; an F-channel float32 tensor is 256*F (level 0)
    or 32*F (level 1) bytes; instance-norm stats are B*C*2 float32 (mean, 1/std).
    """
    cfg = ModelConfig(depth=1, base_filters=2)
    net = compute_network_cost(cfg, (4, 4, 4), 1, "float32", "adam")
    assert net.block_names == ["enc0", "bottleneck", "dec0", "head"]
    saved = {b.name: b.keep_saved_bytes for b in net.blocks}
    # enc0: image (4ch, 1024) for conv1; c1, r1, c2, r2 (2ch, 512 each); 2 norm stats (16 each)
    assert saved["enc0"] == 1024 + 4 * 512 + 2 * 16
    # bottleneck: pool in (enc0 out, 512) and out (2ch@l1, 64); c1, r1, c2, r2 (4ch@l1, 128 each); stats 32 each
    assert saved["bottleneck"] == 512 + 64 + 4 * 128 + 2 * 32
    # dec0: transpose-conv input (128); concat out (4ch, 1024); c1, r1, c2, r2 (512 each); stats 16 each
    assert saved["dec0"] == 128 + 1024 + 4 * 512 + 2 * 16
    # head: conv input (dec0 out, 512) and the sigmoid output (3ch float32, 768)
    assert saved["head"] == 512 + 768
    # Parameters: convs without bias under a norm; norms gamma+beta; up and head convs with bias.
    enc0 = 27 * 4 * 2 + 4 + 27 * 2 * 2 + 4
    bottleneck = 27 * 2 * 4 + 8 + 27 * 4 * 4 + 8
    dec0 = (8 * 4 * 2 + 2) + 27 * 4 * 2 + 4 + 27 * 2 * 2 + 4
    head = 2 * 3 + 3
    assert net.params == net.trainable_params == enc0 + bottleneck + dec0 + head
    assert net.persistent["weight_bytes"] == 4 * net.params
    assert net.persistent["optimizer_slot_bytes"] == 2 * 4 * net.params  # adam

    # All keep, at the loss step every saved tensor is alive once (shared ones counted once):
    # enc0 internals 3*512+32 and its output 512; bottleneck internals 64+3*128+64 and output 128;
    # dec0 internals 1024+3*512+32 and output 512; head output 768. The image is in data_bytes.
    timeline = simulate(net, ["keep"] * 4, size_bytes=0, prefetch=1)
    loss_step = timeline.steps.index("loss")
    expected_kept = (3 * 512 + 32 + 512) + (64 + 3 * 128 + 64 + 128) + (1024 + 3 * 512 + 32 + 512) + 768
    assert timeline.kept_bytes[loss_step] == expected_kept


def test_hand_count_kept_tail_of_the_last_block():
    """Recomputed, the block before the head (dec0) keeps its last conv unit: its input
    r1, the conv output c2 (the norm's input) and the norm's stats stay from its forward
    to the start of its backward, and only the front's FLOPs are recomputed.

    Same network as the hand count above (level-0 F-channel tensor: 256*F bytes).
    """
    cfg = ModelConfig(depth=1, base_filters=2)
    net = compute_network_cost(cfg, (4, 4, 4), 1, "float32", "adam")
    dec0 = net.blocks[2]
    assert dec0.tail_saved_bytes == 512 + 512 + 16
    tail_flops = 2 * 27 * 2 * 2 * 64 + 8 * 64 * 2 + 64 * 2  # conv2, norm2, relu2
    assert dec0.tail_forward_flops == tail_flops
    assert [tail_kept(net, i, "recompute") for i in range(4)] == [False, False, True, False]
    assert not tail_kept(net, 2, "keep")

    plan = plan_lms(cfg, (4, 4, 4), 1, "float32", "adam", 10**12, "recompute", size_bytes=0)
    assert plan.keep_tails == {"dec0"}
    assert plan.entry("dec0").recomputed_flops == dec0.forward_flops - tail_flops
    assert plan.entry("enc0").recomputed_flops == net.blocks[0].forward_flops
    assert plan.entry("dec0").kept_bytes == 128 + 512 + (512 + 512 + 16)  # its inputs + the tail
    assert "dec0: last conv unit kept" in plan.format_table()
    # At the loss step: the blocks' outputs (enc0 512, bottleneck 128, dec0 512, head 768) and dec0's tail.
    timeline = simulate(net, ["recompute"] * 4, size_bytes=0, prefetch=1)
    assert timeline.kept_bytes[timeline.steps.index("loss")] == 512 + 128 + 512 + 768 + (512 + 512 + 16)
    # ... and no longer once dec0's backward starts (the tail's tensors are freed first).
    assert timeline.kept_bytes[timeline.steps.index("backward dec0")] == 512 + 128
    assert Plan.from_json(plan.to_json()).keep_tails == {"dec0"}


def test_norm_saves_float32_copy_under_mixed_precision():
    cfg = ModelConfig(depth=1, base_filters=2)
    f32 = compute_network_cost(cfg, (4, 4, 4), 1, "float32")
    bf16 = compute_network_cost(cfg, (4, 4, 4), 1, "mixed_bfloat16")
    # enc0 under bf16: cast image (4ch*64*2) for conv1, r1 and r2 in bf16 (2ch*64*2 each),
    # two float32 norm inputs (2ch*64*4 each) and stats.
    assert bf16.blocks[0].keep_saved_bytes == 512 + 2 * 256 + 2 * 512 + 2 * 16
    assert bf16.blocks[0].keep_saved_bytes < f32.blocks[0].keep_saved_bytes
    shape = (64, 64, 64)
    assert estimate_peak(cfg, shape, 1, "mixed_bfloat16").peak_bytes < estimate_peak(cfg, shape, 1).peak_bytes


@pytest.mark.parametrize("strategy", ["off", "recompute", "offload"])
def test_peak_grows_with_batch_and_resolution(strategy):
    cfg = ModelConfig(depth=4)
    by_batch = [estimate_peak(cfg, HALF, b, strategy=strategy).peak_bytes for b in (1, 2, 4)]
    assert by_batch == sorted(by_batch) and len(set(by_batch)) == 3
    by_shape = [estimate_peak(cfg, s, 1, strategy=strategy).peak_bytes for s in ((48, 48, 48), HALF, FULL)]
    assert by_shape == sorted(by_shape) and len(set(by_shape)) == 3


@pytest.mark.parametrize(
    "cfg, shape, policy",
    [
        (ModelConfig(depth=4), FULL, "float32"),
        (ModelConfig(depth=4), HALF, "mixed_float16"),
        (ModelConfig(norm="group", upsample="trilinear"), HALF, "float32"),
        (ModelConfig(depth=3, base_filters=8), (48, 56, 40), "float32"),
        (ModelConfig(depth=2, base_filters=32, norm="group", groups=4), (64, 64, 64), "mixed_bfloat16"),
    ],
)
def test_recompute_below_off_and_offload_not_above_recompute(cfg, shape, policy):
    p = peaks(cfg, shape, 1, policy)
    assert p["recompute"] < p["off"]
    assert p["offload"] <= p["recompute"]


def test_offload_peak_grows_with_prefetch():
    cfg = ModelConfig(depth=4)
    by_prefetch = [estimate_peak(cfg, FULL, 1, strategy="offload", prefetch=k).peak_bytes for k in (0, 1, 3, 20)]
    assert by_prefetch == sorted(by_prefetch)


def test_mixed_precision_below_float32():
    p32, p16 = peaks(ModelConfig(depth=4), FULL, 1, "float32"), peaks(ModelConfig(depth=4), FULL, 1, "fp16")
    assert p16["off"] < p32["off"]


def test_full_resolution_is_plausible():
    """16 filters at 192x224x160, float32, batch 1 trains in 8.4 GB above the imported
    TensorFlow on CPU (peak RSS 9.6 GB; docs/lms_calibration.md): the calibrated
    prediction is within 15% of it, at the start of dec0's backward, and recompute
    saves more than 35% of it (measured: 39.3% after four steps)."""
    cfg = ModelConfig(depth=4, base_filters=16, norm="instance")
    t = estimate_peak(cfg, FULL, 1, "float32")
    assert 0.85 * 8.4 * GB <= t.peak_bytes <= 1.15 * 8.4 * GB
    assert t.peak_at == "backward dec0"
    assert estimate_peak(cfg, FULL, 1, "float32", strategy="recompute").peak_bytes < 0.65 * t.peak_bytes


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
    predicted = estimate_peak(ModelConfig(depth=depth, base_filters=filters), shape, 1, strategy=strategy,
                              memory_model=mm).peak_bytes
    assert abs(predicted - measured) <= 0.15 * measured


def test_avx2_preset_adds_the_gemm_weight_gradient_scratch():
    """On AVX2, oneDNN's gemm gradient by weights of dec0's first convolution (16 channels in
    at 8 filters) copies one sample's input and an im2col slice: 0.50 GB at full resolution,
    outside TensorFlow's allocator (RSS beyond the allocator's peak grew by 0.55 GB)."""
    cfg = ModelConfig(depth=4, base_filters=8)
    avx2 = compute_network_cost(cfg, FULL, 1, memory_model=CPU_MEMORY_MODELS["avx2"])
    assert avx2.persistent["library_scratch_bytes"] == 16 * (192 * 224 * 160 + 27 * 224 * 160) * 4
    batch2 = compute_network_cost(cfg, FULL, 2, memory_model=CPU_MEMORY_MODELS["avx2"])
    assert batch2.persistent["library_scratch_bytes"] == avx2.persistent["library_scratch_bytes"]  # per sample
    assert compute_network_cost(cfg, FULL, 1).persistent["library_scratch_bytes"] == 0  # AVX-512: direct kernels


def test_memory_model_for_picks_the_preset_of_the_device():
    assert memory_model_for("CPU", "avx512") == MemoryModel()
    assert memory_model_for("CPU", "avx2") == CPU_MEMORY_MODELS["avx2"] != MemoryModel()
    assert memory_model_for("CPU", "other") == CPU_MEMORY_MODELS["avx2"]  # the larger preset when unknown
    assert memory_model_for("GPU", "avx2") == MemoryModel()  # the host's ISA says nothing about the GPU


def test_runtime_allowance_excludes_the_imported_runtime():
    """The baseline of a measurement (and the RAM available to a run) already holds the
    imported TensorFlow (~0.85 GB RSS); the allowance is only what building and tracing add."""
    net = compute_network_cost(ModelConfig(depth=4), HALF, 1)
    assert 0.05 * GB <= net.persistent["runtime_bytes"] <= 0.3 * GB
    # it grows with the convolutions traced (their graphs and oneDNN primitives), not the input
    convs = sum(1 for blk in net.blocks for layer in blk.layers if layer.kind in ("conv", "up_transpose"))
    assert net.persistent["runtime_bytes"] == convs * MemoryModel().runtime_bytes_per_conv
    assert compute_network_cost(ModelConfig(depth=4), FULL, 1).persistent["runtime_bytes"] == net.persistent["runtime_bytes"]
    assert compute_network_cost(ModelConfig(depth=3), HALF, 1).persistent["runtime_bytes"] < net.persistent["runtime_bytes"]
    assert net.persistent["workspace_bytes"] == 0  # oneDNN's direct convolutions take no workspace tensor
    assert compute_network_cost(ModelConfig(depth=4), HALF, 1, memory_model=MemoryModel(workspace_factor=1.0)).persistent[
        "workspace_bytes"] == max(layer.workspace_ref_bytes for blk in net.blocks for layer in blk.layers)


def test_rebuilding_costs_its_runtime_and_a_share_of_the_largest_rebuild():
    """Recomputation adds the traced recompute graphs and the BFC pool pages its rebuilt
    tensors leave behind (a share of the largest block's rebuilt internals), once per step."""
    cfg = ModelConfig(depth=4)
    plain = MemoryModel(rebuild_runtime_bytes=0, rebuild_fragmentation=0.0)
    for strategy in ("off", "recompute"):
        with_terms = estimate_peak(cfg, HALF, 1, strategy=strategy).total_bytes
        without = estimate_peak(cfg, HALF, 1, strategy=strategy, memory_model=plain).total_bytes
        extra = {a - b for a, b in zip(with_terms, without)}
        if strategy == "off":
            assert extra == {0}  # nothing is rebuilt
            continue
        assert len(extra) == 1  # resident for the whole step
        net = compute_network_cost(cfg, HALF, 1)
        rebuilt = max(blk.internal_saved_bytes - (blk.tail_saved_bytes if tail_kept(net, i, strategy) else 0)
                      for i, blk in enumerate(net.blocks))
        mm = MemoryModel()
        assert extra.pop() == pytest.approx(mm.rebuild_runtime_bytes + mm.rebuild_fragmentation * rebuilt, abs=2)


def test_memory_model_rejects_bad_coefficients():
    with pytest.raises(ValueError, match="activation_factor"):
        MemoryModel(activation_factor=-1)
    with pytest.raises(ValueError, match="norm_saved_tensors"):
        MemoryModel(norm_saved_tensors=0.5)


def test_fit_memory_model_recovers_coefficients():
    truth = MemoryModel(runtime_bytes=1_500_000_000, activation_factor=1.2)
    workloads = [
        {"model_cfg": ModelConfig(depth=4), "input_shape": HALF, "batch_size": 1},
        {"model_cfg": ModelConfig(depth=4), "input_shape": HALF, "batch_size": 4},
        {"model_cfg": ModelConfig(depth=4), "input_shape": FULL, "batch_size": 1},
    ]
    samples = [(w, estimate_peak(**w, memory_model=truth).peak_bytes) for w in workloads]
    fitted = fit_memory_model(samples)
    assert fitted.activation_factor == pytest.approx(1.2, rel=1e-3)
    assert fitted.runtime_bytes == pytest.approx(1.5e9, rel=1e-3)


# ---------------------------------------------------------------------------------------
# Planning
# ---------------------------------------------------------------------------------------


def test_auto_with_huge_limit_keeps_everything():
    plan = plan_lms(ModelConfig(depth=4), FULL, 1, "float32", "adam", 10**15, "auto")
    assert all(b.policy == "keep" and not b.skip_offloaded for b in plan.blocks)
    assert plan.recomputed_flops == 0 and plan.moved_bytes == 0 and plan.overhead_s == 0
    assert plan.predicted_peak_bytes == plan.strategies["off"]["predicted_peak_bytes"]


@pytest.mark.parametrize(
    "cfg, shape, batch, policy",
    [
        (ModelConfig(depth=4), FULL, 1, "float32"),
        (ModelConfig(depth=4), HALF, 3, "mixed_float16"),
        (ModelConfig(norm="group", upsample="trilinear"), HALF, 2, "float32"),
        (ModelConfig(depth=3, base_filters=8), (48, 56, 40), 2, "mixed_bfloat16"),
    ],
)
@pytest.mark.parametrize("fraction", [0.0, 0.05, 0.3, 0.6, 0.95])
def test_auto_fits_whenever_offload_fits(cfg, shape, batch, policy, fraction):
    p = peaks(cfg, shape, batch, policy, size_bytes=0)
    limit = int(p["offload"] + fraction * (p["off"] - p["offload"]))
    plan = plan_lms(cfg, shape, batch, policy, "adam", limit, "auto", size_bytes=0)
    assert plan.fits and plan.predicted_peak_bytes <= limit
    assert plan.overhead_s <= plan.strategies["offload"]["overhead_s"] + 1e-12


@pytest.mark.parametrize("fraction", [0.0, 0.3, 0.9])
def test_auto_without_offload_fits_whenever_recompute_fits(fraction):
    p = peaks(ModelConfig(depth=4), FULL, 1, allow_offload=False)
    assert p["offload"] is None
    limit = int(p["recompute"] + fraction * (p["off"] - p["recompute"]))
    plan = plan_lms(ModelConfig(depth=4), FULL, 1, "float32", "adam", limit, "auto", allow_offload=False)
    assert plan.fits and plan.predicted_peak_bytes <= limit


@pytest.mark.parametrize("limit_gb", [1e6, 8.0, 6.5, 5.8, 4.0])
def test_allow_offload_false_never_offloads(limit_gb):
    try:
        plan = plan_lms(ModelConfig(depth=4), FULL, 1, "float32", "adam", int(limit_gb * GB), "auto", allow_offload=False)
    except PlanDoesNotFitError as err:
        assert err.best_strategy != "offload" and "offload" not in str(err)
        return
    assert all(b.policy in ("keep", "recompute") and not b.skip_offloaded and b.moved_bytes == 0
               for b in plan.blocks)
    assert plan.strategies["offload"]["predicted_peak_bytes"] is None
    assert plan.strategies["offload"]["reason"]


def test_offload_strategy_needs_a_gpu():
    with pytest.raises(ValueError, match="lms=recompute or lms=auto"):
        plan_lms(ModelConfig(depth=4), HALF, 1, "float32", "adam", 10**15, "offload", allow_offload=False)


def test_size_threshold_respected():
    cfg = ModelConfig(depth=4)
    net = compute_network_cost(cfg, HALF, 1)
    size = 20 * 10**6  # between the small deep tensors and the big shallow ones at half resolution
    sizes = [b for b in net.tensor_bytes.values()]
    assert min(sizes) < size < max(sizes)
    plan = plan_lms(cfg, HALF, 1, "float32", "adam", 10**15, "offload", size_bytes=size)
    for row, blk in zip(plan.blocks, net.blocks):
        moved = [t for t in blk.inputs if t != "image" and net.tensor_bytes[t] >= size]
        expected = 2 * sum(net.tensor_bytes[t] for t in moved)
        if row.skip_offloaded:
            assert blk.tensor_bytes[blk.skip_input] >= size
            expected += 2 * blk.skip_bytes
        assert row.moved_bytes == expected
        assert row.policy == ("offload" if moved else "recompute")
    assert any(row.moved_bytes for row in plan.blocks)

    # Nothing reaches a huge threshold: offload moves nothing and predicts what recompute does.
    huge = plan_lms(cfg, HALF, 1, "float32", "adam", 10**15, "offload", size_bytes=10**15)
    assert huge.moved_bytes == 0 and all(b.policy == "recompute" for b in huge.blocks)
    assert huge.predicted_peak_bytes == huge.strategies["recompute"]["predicted_peak_bytes"]


def test_offload_strategy_sends_skips_to_host():
    plan = plan_lms(ModelConfig(depth=4), FULL, 1, "float32", "adam", 10**15, "offload", size_bytes=0)
    assert [b.block for b in plan.blocks if b.skip_offloaded] == ["dec3", "dec2", "dec1", "dec0"]
    assert plan.offload_skips == {"enc0", "enc1", "enc2", "enc3"}  # the names brats_seg.lms.offload takes
    assert not any(b.skip_offloaded for b in plan_lms(ModelConfig(depth=4), FULL, 1, "float32", "adam", 10**15,
                                                       "recompute").blocks)


@pytest.mark.parametrize("strategy", ["recompute", "offload", "auto"])
def test_batch_norm_blocks_are_always_kept(strategy):
    """Recomputing BatchNormalization updates its moving statistics twice (offload.py refuses it)."""
    cfg = ModelConfig(norm="batch")
    p = peaks(cfg, FULL)
    limit = p["offload"] if strategy == "auto" else 10**15
    plan = plan_lms(cfg, FULL, 1, "float32", "adam", limit, strategy)
    assert all(b.policy == "keep" for b in plan.blocks if b.block != "head")
    assert not plan.offload_skips


def test_too_small_limit_suggests_batch_and_resolution():
    cfg = ModelConfig(depth=4)
    one, two = peaks(cfg, FULL, 1)["offload"], peaks(cfg, FULL, 2)["offload"]
    limit = (one + two) // 2
    with pytest.raises(PlanDoesNotFitError) as info:
        plan_lms(cfg, FULL, 2, "float32", "adam", limit, "auto")
    err = info.value
    message = str(err)
    assert err.max_batch_size == 1 and "largest batch that fits is 1" in message
    assert err.max_resolution == ("full", FULL) and "full 192x224x160" in message
    assert f"{limit / 1e9:.2f} GB" in message
    assert f"{err.smallest_peak_bytes / 1e9:.2f} GB with lms=" in message
    assert "lower trainer.batch_size to 1" in message


def test_much_too_small_limit_suggests_a_smaller_resolution():
    cfg = ModelConfig(depth=4)
    limit = (peaks(cfg, HALF)["offload"] + peaks(cfg, FULL)["offload"]) // 2
    with pytest.raises(PlanDoesNotFitError) as info:
        plan_lms(cfg, FULL, 1, "float32", "adam", limit, "auto")
    assert info.value.max_batch_size == 0 and "No batch size fits" in str(info.value)
    assert info.value.max_resolution == ("half", HALF) and "half 96x112x80" in str(info.value)


def test_fixed_strategy_over_the_limit_points_to_auto():
    cfg = ModelConfig(depth=4)
    p = peaks(cfg, FULL)
    limit = (p["off"] + p["offload"]) // 2
    with pytest.raises(PlanDoesNotFitError, match="use lms=auto"):
        plan_lms(cfg, FULL, 1, "float32", "adam", limit, "off")


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"input_shape": (48, 56, 40)}, "not divisible by 2\\*\\*depth = 16"),
        ({"policy": "float64"}, "dtype policy"),
        ({"optimizer": "lion"}, "optimizer"),
        ({"strategy": "swap"}, "lms strategy"),
        ({"batch_size": 0}, "batch_size"),
        ({"limit_bytes": -1}, "limit_bytes"),
    ],
)
def test_bad_arguments_are_named(kwargs, match):
    args = {"model_cfg": ModelConfig(depth=4), "input_shape": HALF, "batch_size": 1, "policy": "float32",
            "optimizer": "adam", "limit_bytes": 10**15, "strategy": "auto", **kwargs}
    with pytest.raises(ValueError, match=match):
        plan_lms(**args)


def test_plan_from_train_config():
    cfg = TrainConfig()
    cfg.lms = dataclasses.replace(cfg.lms, name="auto", limit="0.9")
    plan = plan_lms_from_config(cfg, device_bytes=64 * GB, allow_offload=True)
    assert plan.limit_bytes == int(0.9 * 64 * GB) and plan.strategy == "auto"
    assert plan.inputs["input_shape"] == list(cfg.resolution.shape) and plan.inputs["policy"] == "float32"


# ---------------------------------------------------------------------------------------
# The plan object
# ---------------------------------------------------------------------------------------


def test_json_round_trip_has_the_required_keys():
    cfg = ModelConfig(depth=4)
    p = peaks(cfg, FULL)
    plan = plan_lms(cfg, FULL, 1, "float32", "adam", (p["off"] + p["offload"]) // 2, "auto")
    data = json.loads(plan.to_json())
    assert data["limit_bytes"] == plan.limit_bytes
    assert set(data["strategies"]) == {"off", "recompute", "offload", "auto"}
    for summary in data["strategies"].values():
        assert {"predicted_peak_bytes", "recomputed_flops", "moved_bytes"} <= set(summary)
    assert [row["block"] for row in data["plan"]] == compute_network_cost(cfg, FULL, 1).block_names
    for row in data["plan"]:
        assert {"block", "policy", "kept_bytes", "moved_bytes", "recomputed_flops", "skip_offloaded"} <= set(row)
    assert {"recomputed_flops", "moved_bytes", "overhead_s"} <= set(data["totals"])
    assert Plan.from_json(plan.to_json()) == plan


def test_auto_strategy_absent_with_reason_when_nothing_fits():
    out = compare_strategies(ModelConfig(depth=4), FULL, 1, "float32", "adam", 10**8)
    assert out["auto"]["predicted_peak_bytes"] is None and "no plan fits" in out["auto"]["reason"]
    assert out["off"]["fits"] is False and out["off"]["predicted_peak_bytes"] > 10**8


def test_from_dict_rejects_other_json():
    with pytest.raises(ValueError, match="not a saved LMS plan"):
        Plan.from_dict({"hello": 1})


def test_format_table_names_every_block():
    plan = plan_lms(ModelConfig(depth=3), HALF, 1, "float32", "adam", 10**15, "recompute")
    table = plan.format_table()
    for name in ["enc0", "enc1", "enc2", "bottleneck", "dec2", "dec1", "dec0", "head"]:
        assert f"\n{name} " in table
    assert "GB" in table and "GFLOP" in table and "recompute" in table


def test_planner_does_not_import_tensorflow():
    code = ("import sys, brats_seg.lms.planner as p; "
            "p.plan_lms(p.ModelConfig(depth=4, out_channels=3), (96, 112, 80), 1, 'float32', 'adam', 10**15); "
            "bad = [m for m in ('tensorflow', 'keras') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_nested_region_head_keeps_its_sigmoids_and_products():
    """NestedRegionSigmoid multiplies each sub-region by WT: its backward needs both factors,
    so the head keeps one more head-sized float32 tensor than with independent sigmoids."""
    plain = compute_network_cost(ModelConfig(depth=4), HALF, 1)
    nested = compute_network_cost(ModelConfig(depth=4, region_parents=[-1, 0, 0]), HALF, 1)
    head_plain, head_nested = plain.blocks[-1], nested.blocks[-1]
    assert [layer.kind for layer in head_nested.layers][-2:] == ["sigmoid", "nest"]
    head_bytes = 96 * 112 * 80 * 3 * 4
    assert head_nested.keep_saved_bytes - head_plain.keep_saved_bytes == head_bytes
