"""The memory model's coefficients and CPU presets against measured peaks (brats_seg.lms.planner.memory_model).

The measurements and how the presets were fitted: docs/lms_calibration.md.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from brats_seg.benchmark.memory_calibration import predict  # the calibration's own prediction, as it fitted
from brats_seg.lms.planner.memory_model import (
    BASE_PRESETS,
    CPU_MEMORY_MODELS,
    PRESET_DIR,
    PREVIOUS_FITS,
    MemoryModel,
    base_preset,
    load_preset,
    memory_model_for,
    upper_bound,
)
from brats_seg.lms.planner.timeline import tail_kept
from tests.unit.lms_workloads import FULL, GB, HALF, ModelConfig, estimate, network

# The planner's aim on configurations it was not fitted on: never more than 8% under a
# measured peak, and over-prediction (a refused run that would have fitted) within 30% on the
# held-out points of a script-validated preset (they reach +10.0%, the aim is +15%; one read
# +17.6% before its third run; docs/lms_calibration.md). Every point, fitted or not,
# is within the preset's planning margin, the share of lms.limit a plan keeps free.
UNDER, OVER = -0.08, 0.30
PRESET_FILES = sorted(PRESET_DIR.glob("cpu_*.json"))
POINTS = [
    (f, key)
    for f in PRESET_FILES
    for key, e in json.loads(f.read_text())["points"].items()
    if not key.endswith("lms=auto")
]


@pytest.mark.parametrize("path,key", POINTS, ids=lambda v: v.stem if isinstance(v, Path) else v)
def test_each_preset_is_its_calibration_file_and_holds_on_its_points(path, key):
    """The CPU presets in use are scripts/calibrate_memory.py's output (brats_seg/lms/presets/):
    the error recorded in the file is what the code predicts; every point measured (the
    largest of its runs), fitted or held out, is under-predicted by less than the preset's
    planning margin; a held-out point (the validation grid the script measured on its CPU) is
    within -8% / +30% (held out: the ``validation`` and ``validation_bf16`` grids), or as far
    under as its own runs spread."""
    record = json.loads(path.read_text())
    entry = record["points"][key]
    measured = max(r["measured_bytes"] for r in entry["runs"])
    strategy = key.rsplit("lms=", 1)[1]
    overrides = [o for o in entry["overrides"] if not o.startswith("lms")]
    mm = CPU_MEMORY_MODELS[record["kind"]]
    error = predict(overrides, strategy, mm) / measured - 1
    assert error == pytest.approx(record["errors"][entry["grid"]][key], abs=1e-4)
    assert error >= -mm.planning_margin, f"{key}: {error:+.1%}, beyond the planning margin {mm.planning_margin:.1%}"
    if entry["grid"] in ("validation", "validation_bf16"):
        # held out: within the planner's aim, or as far under as the point's own runs spread
        # (a prediction cannot be closer than the measurement repeats; safety is the margin's job)
        runs = [r["measured_bytes"] for r in entry["runs"]]
        spread = 1 - min(runs) / max(runs)
        assert min(UNDER, -spread) <= error <= OVER, f"{key}: {error:+.1%} (its runs spread {spread:.0%})"


@pytest.mark.parametrize("path", PRESET_FILES, ids=lambda p: p.stem)
def test_each_presets_planning_margin_covers_what_it_under_predicts(path):
    """The share of lms.limit a plan keeps free comes from the calibration's cross-validation
    (calibrate_memory.py); it must cover the under-prediction of every point the preset was
    not fitted on, and of the lms=auto points (predicted by the plan, measured by the benchmark)."""
    record = json.loads(path.read_text())
    margin = CPU_MEMORY_MODELS[record["kind"]].planning_margin
    assert margin == record["fit"]["fields"]["planning_margin"] and 0.0 < margin < 0.2
    held_out = [*record["errors"].get("validation", {}).values()]
    autos = {k: e for k, e in record["points"].items() if k.endswith("lms=auto")}
    held_out += [r["predicted_peak_bytes"] / r["measured_bytes"] - 1 for e in autos.values() for r in e["runs"]]
    assert all(err >= -margin for err in held_out), (margin, min(held_out, default=None))
    for key, e in autos.items():  # and so lms=auto measured under its limit, every run
        limit = int(next(o for o in e["overrides"] if o.startswith("lms.limit=")).split("=")[1])
        assert all(r["measured_bytes"] <= limit for r in e["runs"]), key


def test_presets_are_base_rules_plus_the_fitted_fields(tmp_path):
    fields = {"activation_factor": 1.25, "runtime_bytes_per_conv": 9_000_000}
    (tmp_path / "cpu_avx2.json").write_text(json.dumps({"points": {}, "fit": {"fields": fields}}))
    loaded = load_preset("avx2", tmp_path)
    assert loaded.activation_factor == 1.25 and loaded.runtime_bytes_per_conv == 9_000_000
    assert isinstance(loaded.runtime_bytes_per_conv, int)
    assert loaded.conv_weight_grad_scratch == BASE_PRESETS["avx2"]["conv_weight_grad_scratch"]  # a rule, not fitted
    assert load_preset("avx512", tmp_path) == base_preset("avx512") == MemoryModel(**BASE_PRESETS["avx512"])  # no file
    (tmp_path / "cpu_avx2.json").write_text(json.dumps({"points": {}}))  # measured, not yet fitted
    assert load_preset("avx2", tmp_path) == base_preset("avx2")
    (tmp_path / "cpu_avx2.json").write_text('{"fit": {"fields": {"activation_factr": 1}}}')
    with pytest.raises(ValueError, match="cpu_avx2.json is not a memory calibration"):
        load_preset("avx2", tmp_path)
    (tmp_path / "cpu_avx2.json").write_text('{"fit": ')  # a torn file
    with pytest.raises(ValueError, match="calibrate_memory.py fit_only=true"):
        load_preset("avx2", tmp_path)


def test_full_resolution_is_plausible():
    """16 filters at 192x224x160, float32, batch 1 trains in 8.3-8.6 GB above the imported
    TensorFlow on CPU (three runs of calibrate_memory.py's validation point on a Sapphire
    Rapids): the prediction is within 15% of the largest, at the start of dec0's backward,
    and recompute saves more than 35% of it (measured: 5.0-5.35 GB, 38%)."""
    cfg = ModelConfig(depth=4, base_filters=16, norm="instance")
    mm = memory_model_for("CPU", "avx512_amx")
    t = estimate(cfg, FULL, 1, "float32", memory_model=mm)
    assert 0.85 * 8.62 * GB <= t.peak_bytes <= 1.15 * 8.62 * GB
    assert t.peak_at == "backward dec0"
    assert estimate(cfg, FULL, 1, "float32", strategy="recompute", memory_model=mm).peak_bytes < 0.65 * t.peak_bytes


def test_avx2_preset_adds_the_gemm_weight_gradient_scratch():
    """On AVX2, oneDNN's gemm gradient by weights of dec0's first convolution (16 channels in
    at 8 filters) copies one sample's input and an im2col slice: 0.50 GB at full resolution,
    outside TensorFlow's allocator (RSS beyond the allocator's peak grew by 0.55 GB)."""
    cfg = ModelConfig(depth=4, base_filters=8)
    avx2 = network(cfg, FULL, 1, memory_model=base_preset("avx2"))  # a rule of the kind, not fitted
    assert avx2.persistent["library_scratch_bytes"] == 16 * (192 * 224 * 160 + 27 * 224 * 160) * 4
    batch2 = network(cfg, FULL, 2, memory_model=base_preset("avx2"))
    assert batch2.persistent["library_scratch_bytes"] == avx2.persistent["library_scratch_bytes"]  # per sample
    assert network(cfg, FULL, 1).persistent["library_scratch_bytes"] == 0  # AVX-512: direct kernels


def test_memory_model_for_picks_the_preset_of_the_kind_or_the_safe_side():
    assert set(CPU_MEMORY_MODELS) == {"avx512_amx"}  # the kinds calibrated with the current model
    assert memory_model_for("CPU", "avx512_amx") == CPU_MEMORY_MODELS["avx512_amx"] == load_preset("avx512_amx")
    assert memory_model_for("GPU", "avx2") == MemoryModel()  # the host's CPU says nothing about the GPU
    # AVX-512 without AMX (Zen 4), AVX2-only CPUs and unknown ones have no preset of the current
    # model: they plan with the field-by-field largest of the calibrated presets and of their own
    # kind's rules, which predicts at least what each does, keeping the uncalibrated 10% free.
    for kind in ("avx512", "avx2", "other"):
        safe = memory_model_for("CPU", kind)
        rules = base_preset(kind) if kind in BASE_PRESETS else MemoryModel()
        previous = [dataclasses.replace(rules, **PREVIOUS_FITS[kind])] if kind in PREVIOUS_FITS else []
        assert safe == upper_bound(rules, *previous, *CPU_MEMORY_MODELS.values())
        assert safe.planning_margin == max(m.planning_margin for m in [rules, *previous, *CPU_MEMORY_MODELS.values()])
        assert safe.planning_margin >= 0.1
    assert memory_model_for("CPU", "avx2").conv_weight_grad_scratch == 1.0  # AVX2's gemm scratch, a rule of its own
    assert memory_model_for("CPU", "avx2").rebuild_fragmentation == PREVIOUS_FITS["avx2"]["rebuild_fragmentation"]
    withdrawn = json.loads(
        (PRESET_DIR.parents[2] / "docs" / "measurements" / "cpu_avx2_before_fused_norm.json").read_text()
    )
    for name, value in PREVIOUS_FITS["avx2"].items():  # the withdrawn preset's own fit, rounded
        assert value == pytest.approx(withdrawn["fit"]["fields"][name], abs=1e-4)
    safe = memory_model_for("CPU", "avx2")
    for cfg, shape, batch, policy, strategy in [
        (ModelConfig(depth=4, base_filters=16), FULL, 1, "float32", "off"),
        (ModelConfig(depth=3, base_filters=12, upsample="trilinear"), HALF, 2, "mixed_bfloat16", "recompute"),
        (ModelConfig(depth=4, base_filters=8, norm="group"), HALF, 3, "float32", "recompute"),
    ]:
        peaks = [
            estimate(cfg, shape, batch, policy, strategy=strategy, memory_model=m).peak_bytes
            for m in CPU_MEMORY_MODELS.values()
        ]
        assert estimate(cfg, shape, batch, policy, strategy=strategy, memory_model=safe).peak_bytes >= max(peaks)


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
        "workspace_bytes"
    ] == max(layer.workspace_ref_bytes for blk in net.blocks for layer in blk.layers)


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
        rebuilt = max(
            blk.internal_saved_bytes - (blk.tail_saved_bytes if tail_kept(net, i, strategy) else 0)
            for i, blk in enumerate(net.blocks)
        )
        mm = MemoryModel()
        assert extra.pop() == pytest.approx(mm.rebuild_runtime_bytes + mm.rebuild_fragmentation * rebuilt, abs=2)


def test_memory_model_rejects_bad_coefficients():
    with pytest.raises(ValueError, match="activation_factor"):
        MemoryModel(activation_factor=-1)
    with pytest.raises(ValueError, match="planning_margin must be below 0.5"):
        MemoryModel(planning_margin=0.5)
    with pytest.raises(ValueError, match="batch_norm_saved_tensors"):
        MemoryModel(batch_norm_saved_tensors=0.5)


def test_bf16_scratch_grows_with_the_volume_only_and_only_under_bfloat16():
    """What a bfloat16 step holds outside the allocator (MemoryModel.bf16_scratch_*): measured
    the same at batch 1 and 2 and at 8 and 16 filters, growing with the volume."""
    mm = MemoryModel(bf16_scratch_bytes=30_000_000, bf16_scratch_bytes_per_voxel=120.0)

    def scratch(cfg, shape, batch, policy):
        return network(
            cfg,
            shape,
            batch,
            policy,
            memory_model=mm,
        ).persistent["bf16_scratch_bytes"]

    voxels = 96 * 112 * 80
    one = scratch(ModelConfig(depth=3, base_filters=8), HALF, 1, "mixed_bfloat16")
    assert one == 30_000_000 + 120 * voxels
    assert scratch(ModelConfig(depth=4, base_filters=16), HALF, 2, "mixed_bfloat16") == one
    assert scratch(ModelConfig(depth=3, base_filters=8), FULL, 1, "mixed_bfloat16") == 30_000_000 + 120 * 8 * voxels
    assert scratch(ModelConfig(depth=3, base_filters=8), HALF, 1, "float32") == 0
    plain = estimate(ModelConfig(depth=3, base_filters=8), HALF, 1, "mixed_bfloat16").peak_bytes
    assert (
        estimate(ModelConfig(depth=3, base_filters=8), HALF, 1, "mixed_bfloat16", memory_model=mm).peak_bytes
        == plain + one
    )  # alive the whole step: it adds to the peak wherever that is


def test_bf16_scratch_grows_more_slowly_past_full_resolution():
    """Past ``bf16_scratch_knee_voxels`` the scratch grows by ``..._beyond`` bytes a voxel (a base
    rule from points past full resolution); without it, the same line; the safe side of two
    presets takes the larger slope, a rule one of them does not set included."""
    knee = 192 * 224 * 160
    mm = MemoryModel(
        bf16_scratch_bytes=30_000_000, bf16_scratch_bytes_per_voxel=120.0, bf16_scratch_bytes_per_voxel_beyond=54.0
    )

    def scratch(shape, m):
        return network(
            ModelConfig(depth=4, base_filters=8),
            shape,
            1,
            "mixed_bfloat16",
            memory_model=m,
        ).persistent["bf16_scratch_bytes"]

    assert scratch(FULL, mm) == 30_000_000 + 120 * knee
    twice = (384, 448, 320)
    assert scratch(twice, mm) == 30_000_000 + 120 * knee + 54 * 7 * knee
    line = dataclasses.replace(mm, bf16_scratch_bytes_per_voxel_beyond=None)
    assert scratch(twice, line) == 30_000_000 + 120 * 8 * knee
    assert upper_bound(mm, MemoryModel()).bf16_scratch_bytes_per_voxel_beyond == 54.0
    assert upper_bound(line, MemoryModel()).bf16_scratch_bytes_per_voxel_beyond is None


def test_the_sapphire_rapids_2x_run_it_was_not_fitted_on_is_predicted_within_the_aim():
    """The slope past full resolution was taken from 288x336x240 against full resolution; the 2x
    training run on the same CPU (docs/measurements/2x_avx512_amx/measure_2x.log: its plan's
    policies and its measured peak) is the held-out point: within -8% / +15%."""
    import re

    from brats_seg.config import DataConfig
    from brats_seg.lms.planner.cost import compute_network_cost
    from brats_seg.lms.planner.timeline import simulate
    from brats_seg.lms.planner.workload import Workload, pipeline_batches

    log = (Path(__file__).resolve().parents[2] / "docs/measurements/2x_avx512_amx/measure_2x.log").read_text()
    measured = float(re.search(r"train\+validation: measured ([\d.]+) GB above the runtime", log).group(1)) * 1e9
    recomputed = re.search(r"LMS: (.*) \(last conv unit kept\)", log).group(1)
    policies = dict(item.split("=") for item in recomputed.split(", "))
    filters = int(re.search(r"model\.base_filters=(\d+)", log).group(1))
    workload = Workload(
        ModelConfig(depth=4, base_filters=filters, out_channels=3),
        (384, 448, 320),
        1,
        "bf16",
        input_batches=pipeline_batches(DataConfig().prefetch_batches),
        validates=True,
    )
    net = compute_network_cost(workload, memory_model_for("CPU", "avx512_amx"))
    peak = simulate(net, [policies.get(b.name, "keep") for b in net.blocks], [False] * len(net.blocks), 0, 1).peak_bytes
    assert -0.08 <= peak / measured - 1 <= 0.15, f"measured {measured / 1e9:.2f} GB, predicted {peak / 1e9:.2f} GB"


def test_bf16_scratch_on_avx512_without_amx_grows_with_the_width_where_the_first_level_is_narrow():
    """MemoryModel.bf16_scratch_bytes_per_voxel_filter: the larger of the per-voxel rule and bytes
    per voxel and base filter, for widths whose first level does not fill 16 channels."""
    mm = MemoryModel(
        bf16_scratch_bytes=1000, bf16_scratch_bytes_per_voxel=10.0, bf16_scratch_bytes_per_voxel_filter=16.0
    )

    def scratch(f):
        return network(
            ModelConfig(depth=4, base_filters=f),
            FULL,
            1,
            "mixed_bfloat16",
            memory_model=mm,
        ).persistent["bf16_scratch_bytes"]

    voxels = 192 * 224 * 160
    assert scratch(8) == 16 * 8 * voxels and scratch(10) == 16 * 10 * voxels
    assert scratch(16) == 1000 + 10 * voxels  # 16 channels fill the block: the per-voxel rule
    assert memory_model_for("CPU", "avx512").bf16_scratch_bytes_per_voxel_filter > 0
    assert memory_model_for("CPU", "avx512_amx").bf16_scratch_bytes_per_voxel_filter == 0


def test_the_zen5_2x_step_it_was_not_fitted_on_is_predicted_within_the_aim():
    """The per-filter rule was taken from full resolution and 288x336x240 on an AMD Zen 5; the 2x step
    at 10 filters (docs/measurements/2x_zen5/f10/step_benchmark.jsonl, its plan's policies) is held out."""
    from brats_seg.lms.planner.cost import compute_network_cost
    from brats_seg.lms.planner.timeline import simulate
    from brats_seg.lms.planner.workload import Workload

    folder = Path(__file__).resolve().parents[2] / "docs/measurements/2x_zen5/f10"
    record = json.loads((folder / "step_benchmark.jsonl").read_text().splitlines()[-1])
    policies = dict(
        line.split()[:2]
        for line in (folder / "plan.txt").read_text().splitlines()
        if line.split()[:1]
        and line.split()[0] in ("enc0", "enc1", "enc2", "enc3", "bottleneck", "dec3", "dec2", "dec1", "dec0", "head")
    )
    workload = Workload(
        ModelConfig(depth=4, base_filters=record["base_filters"], out_channels=3),
        tuple(record["shape"]),
        1,
        record["precision"],
    )
    net = compute_network_cost(workload, memory_model_for("CPU", "avx512"))
    peak = simulate(net, [policies[b.name].rstrip("*") for b in net.blocks], [False] * len(net.blocks), 0, 1).peak_bytes
    assert -0.08 <= peak / record["measured_bytes"] - 1 <= 0.15, (peak, record["measured_bytes"])
