"""The planner's step-time model on a CPU (brats_seg.lms.planner.step_time): channel padding, the
fit, the per-CPU presets and their safe side, and recomputation priced by it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from brats_seg.config import ModelConfig
from brats_seg.lms.planner.cost import compute_network_cost, compute_step_flops
from brats_seg.lms.planner.plan import Plan
from brats_seg.lms.planner.search import compare_strategies, plan_lms
from brats_seg.lms.planner.step_time import (
    UNCALIBRATED_FACTOR,
    CpuTimeModel,
    TimeCoefficients,
    block_features,
    cpu_time_model,
    fit_coefficients,
    load_time_presets,
    step_features,
)
from brats_seg.lms.planner.workload import LMSOptions, Workload

SHAPE = (64, 64, 48)


def _net(filters: int, precision: str = "fp32", shape=SHAPE):
    model = ModelConfig(depth=3, base_filters=filters, out_channels=3)
    return compute_network_cost(Workload(model, shape, 1, precision))


def test_padded_flops_count_channels_up_to_the_block():
    # 16 filters: only the image's 4 channels (enc0's first convolution) and the head's 3 outputs
    # are padded; every block in between counts its real FLOPs
    net = _net(16)
    for i, blk in enumerate(net.blocks):
        real = sum(layer.forward_flops for layer in blk.layers if layer.kind in ("conv", "up_transpose"))
        padded = block_features(net, i, 16)[0]
        assert padded == pytest.approx(real) if blk.name not in ("enc0", "head") else padded > real
    assert step_features(net, 16)["padded_flops"] > compute_step_flops(net)
    # 6 filters pad to 16 (and 12 to 16, 24 to 32): more than 16/6 squared of the narrow network's
    # level-0 FLOPs would be, and never fewer than its real FLOPs
    narrow = _net(6)
    assert step_features(narrow, 16)["padded_flops"] > 2.5 * compute_step_flops(narrow)
    assert step_features(narrow, 8)["padded_flops"] < step_features(narrow, 16)["padded_flops"]
    # a 6-filter U-Net pads its first level to the 16-filter one's: same padded level-0 FLOPs
    assert block_features(narrow, 0, 16)[0] == pytest.approx(block_features(_net(16), 0, 16)[0])


def test_bytes_touched_follow_the_dtype_and_the_width():
    assert step_features(_net(8, "bf16"), 16)["bytes"] < 0.6 * step_features(_net(8), 16)["bytes"]
    assert step_features(_net(16), 16)["bytes"] > 1.8 * step_features(_net(8), 16)["bytes"]


def test_bytes_may_be_counted_with_each_activations_channels_padded_to_a_block():
    # 16 filters: every activation between the image (4 channels) and the head (3) is a multiple
    # of 16, so padding the bytes to 16 adds only at the ends; 6 filters pad 6, 12, 24 to 16, 16, 32
    wide, narrow = _net(16), _net(6)
    for i, blk in enumerate(wide.blocks):
        plain, padded = block_features(wide, i, 16)[1], block_features(wide, i, 16, 16)[1]
        assert padded == pytest.approx(plain) if blk.name not in ("enc0", "head") else padded > plain
    level0 = [i for i, blk in enumerate(narrow.blocks) if blk.name in ("enc0", "dec0")]
    for i in level0:  # the 6-filter level-0 activations stored as 16 channels, those of 8 as 8
        assert block_features(narrow, i, 16, 16)[1] > 2.0 * block_features(narrow, i, 16)[1]
    assert block_features(_net(8), 1, 16, 8)[1] == pytest.approx(block_features(_net(8), 1, 16)[1])
    # the step prices its bytes by its coefficients' bytes block; FLOPs are untouched by it
    assert step_features(narrow, 16, 16)["padded_flops"] == step_features(narrow, 16)["padded_flops"]
    per_byte = TimeCoefficients(per_flop_s=0.0, per_byte_s=1e-9, block=16, bytes_block=16)
    model = CpuTimeModel(cpu="test", block=16, coefficients={"float32": per_byte})
    assert model.step_s(narrow) == pytest.approx(1e-9 * step_features(narrow, 16, 16)["bytes"])


def test_the_calibration_keeps_the_bytes_padding_that_predicts_unseen_points(monkeypatch, tmp_path):
    """Steps timed as if activations were stored padded to 16 channels: the fit chooses that
    padding by leave-one-out error and predicts every left-out point; steps timed as stored keep 1."""
    from brats_seg.benchmark import step_time_fit
    from brats_seg.cpu import cpu_id

    monkeypatch.setattr(step_time_fit, "BLOCKS", (16,))  # the FLOPs' padding fixed: the bytes' is tested
    configurations = [("tiny", f, p) for f in (4, 6, 8, 12, 16, 24) for p in ("fp32",)]
    for truth_block in (16, 1):
        truth = TimeCoefficients(per_flop_s=1 / 200e9, per_byte_s=1 / 4e9, per_step_s=0.01, bytes_block=truth_block)
        lines = []
        for resolution, filters, precision in configurations:
            overrides = (
                "backend=cpu_onednn",
                f"resolution={resolution}",
                "model.depth=3",
                f"model.base_filters={filters}",
                f"backend.precision={precision}",
                "trainer.batch_size=1",
                "lms=off",
            )
            net, _ = step_time_fit._network(overrides)
            f = step_features(net, 16, truth_block)
            seconds = truth.seconds(f["padded_flops"], f["bytes"])
            lines.append({"overrides": list(overrides), "step_s": seconds, "strategy": "off", "precision": precision})
        path = tmp_path / f"sweep_{truth_block}.jsonl"
        path.write_text("".join(json.dumps({**r, "cpu_id": cpu_id()}) + "\n" for r in lines))
        record = step_time_fit.calibrate([path], [])
        assert record["fit"]["float32"]["bytes_block"] == truth_block
        assert max(abs(r["error"]) for r in record["leave_one_out"]) < 1e-3


def test_unaligned_flops_are_those_of_convolutions_whose_channels_miss_the_block():
    # 16 filters: only the image's 4 channels (enc0's first convolution) and the head's 3 outputs
    # miss 16; 12 filters (12, 24, 48): levels 0 and 1 miss 16 (and the 24 -> 48 convolution), 48
    # and 96 do not; with 8, 24 does not miss
    wide, narrow = _net(16), _net(12)
    assert step_features(wide, 16)["unaligned_flops"] == 0.0  # no align: no such term
    for i, blk in enumerate(wide.blocks):
        flops, _, unaligned, _ = block_features(wide, i, 16, 1, 16)
        expected = {"enc0": flops / 2, "head": flops}.get(blk.name, 0.0)  # enc0: 4 -> 16 padded as 16 -> 16
        assert unaligned == pytest.approx(expected), blk.name
    for i, blk in enumerate(narrow.blocks):
        flops, _, unaligned, _ = block_features(narrow, i, 16, 1, 16)
        if blk.name in ("bottleneck", "dec2"):
            assert unaligned == 0.0, blk.name
        elif blk.name == "enc2":
            assert 0.0 < unaligned < flops
        else:
            assert unaligned == flops, blk.name
        if blk.name in ("enc2", "dec1"):  # 24 channels: a multiple of 8
            assert block_features(narrow, i, 16, 1, 8)[2] == 0.0, blk.name
    # a cached calibration of that form still prices them by its coefficients' align
    extra = TimeCoefficients(per_flop_s=0.0, per_byte_s=0.0, block=16, per_unaligned_flop_s=1e-12, align=16)
    model = CpuTimeModel(cpu="test", block=16, coefficients={"float32": extra})
    assert model.step_s(narrow) == pytest.approx(1e-12 * step_features(narrow, 16, 1, 16)["unaligned_flops"])


def test_off_block_bytes_are_those_of_activations_whose_channels_miss_the_block():
    """Counted as stored (not padded), per tensor a layer reads or writes, forward in a block and
    three times that in a step (forward, gradients in and out), as the bytes term is."""
    for filters, align in ((12, 16), (12, 8), (16, 16), (6, 8)):
        net = _net(filters)
        total = 0.0
        for i, blk in enumerate(net.blocks):
            _, moved, _, off = block_features(net, i, 16, 1, align)
            expected = sum(
                blk.tensor_bytes.get(t, 0)
                for layer in blk.layers
                for t in (*layer.inputs, layer.output)
                if blk.tensor_channels.get(t, 0) % align
            )
            assert off == pytest.approx(expected), (filters, align, blk.name)
            assert 0.0 <= off <= moved
            assert block_features(net, i, 16, 1, 0)[3] == 0.0  # no align: no such term
            total += off
        f = step_features(net, 16, 1, align)
        assert f["unaligned_bytes"] == pytest.approx(3.0 * total)
    # 16 filters off the 16-block: only the image (4 channels) and the head's output (3), far less
    # than 12 filters, where levels 0 and 1 (12 and 24 channels) are off it
    assert (
        0.0
        < step_features(_net(16), 16, 1, 16)["unaligned_bytes"]
        < 0.2 * step_features(_net(12), 16, 1, 16)["unaligned_bytes"]
    )
    # 24 channels are on the 8-block: 12 filters have less off it than off the 16-block
    assert step_features(_net(12), 16, 1, 8)["unaligned_bytes"] < step_features(_net(12), 16, 1, 16)["unaligned_bytes"]
    # the step and a recomputed block price them by the coefficients' rate
    narrow = _net(12)
    c = TimeCoefficients(per_flop_s=0.0, per_byte_s=0.0, block=16, align=16, per_unaligned_byte_s=1e-10)
    model = CpuTimeModel(cpu="test", block=16, coefficients={"float32": c})
    assert model.step_s(narrow) == pytest.approx(1e-10 * step_features(narrow, 16, 1, 16)["unaligned_bytes"])
    assert model.block_forward_s(narrow, 0) == pytest.approx(1e-10 * block_features(narrow, 0, 16, 1, 16)[3])


def test_the_off_block_rate_is_recovered_where_it_differs_and_fits_to_zero_where_it_does_not(monkeypatch, tmp_path):
    """float32 steps timed with the traffic of activations off the 8-channel block at an extra rate:
    the fit (align 8, fixed for float32) recovers that rate and predicts every left-out point; steps
    timed without it fit the rate to 0 (non-negative: the term costs nothing where nothing
    differs); a sweep of four points, too few for a fourth coefficient, is fitted with one rate."""
    from brats_seg.benchmark import step_time_fit
    from brats_seg.cpu import cpu_id

    monkeypatch.setattr(step_time_fit, "BLOCKS", (1,))
    monkeypatch.setattr(step_time_fit, "BYTES_BLOCKS", (1,))
    assert step_time_fit.ALIGNS["float32"] == (8,)
    extra = 1 / 2e9
    for truth_align, widths in ((8, (4, 6, 8, 12, 16, 24, 32)), (0, (4, 6, 8, 12, 16, 24, 32)), (8, (4, 6, 12, 16))):
        truth = TimeCoefficients(
            per_flop_s=1 / 200e9, per_byte_s=1 / 4e9, per_step_s=0.01, block=1, align=truth_align,
            per_unaligned_byte_s=extra,
        )  # fmt: skip
        lines = []
        for filters in widths:
            overrides = (
                "backend=cpu_onednn",
                "resolution=tiny",
                "model.depth=3",
                f"model.base_filters={filters}",
                "backend.precision=fp32",
                "trainer.batch_size=1",
                "lms=off",
            )
            net, _ = step_time_fit._network(overrides)
            seconds = CpuTimeModel(cpu="truth", block=1, coefficients={"float32": truth}).step_s(net)
            lines.append({"overrides": list(overrides), "step_s": seconds, "strategy": "off", "precision": "fp32"})
        path = tmp_path / f"sweep_{truth_align}_{len(widths)}.jsonl"
        path.write_text("".join(json.dumps({**r, "cpu_id": cpu_id()}) + "\n" for r in lines))
        fit = step_time_fit.calibrate([path], [])
        c = fit["fit"]["float32"]
        assert c["per_unaligned_flop_s"] == 0.0  # the form before is no longer fitted
        if len(widths) == 4:
            assert c["align"] == 0 and c["per_unaligned_byte_s"] == 0.0
            continue
        assert c["align"] == 8
        if truth_align:
            assert c["per_unaligned_byte_s"] == pytest.approx(extra, rel=1e-3)
        else:
            assert c["per_unaligned_byte_s"] < 1e-3 * c["per_byte_s"]
        assert max(abs(r["error"]) for r in fit["leave_one_out"]) < 1e-3


def test_the_fit_recovers_known_coefficients_and_predicts_a_point_it_did_not_see():
    truth = TimeCoefficients(per_flop_s=1 / 300e9, per_byte_s=1 / 8e9, per_step_s=0.05)
    points = []
    for filters in (4, 8, 12, 16, 24):
        f = step_features(_net(filters), 16)
        points.append((f["padded_flops"], f["bytes"], truth.seconds(f["padded_flops"], f["bytes"])))
    fitted = fit_coefficients(points)
    model = CpuTimeModel(cpu="test", block=16, coefficients={"float32": fitted})
    unseen = _net(20)
    f = step_features(unseen, 16)
    assert model.step_s(unseen) == pytest.approx(truth.seconds(f["padded_flops"], f["bytes"]), rel=1e-4)
    with pytest.raises(ValueError, match="at least 3"):
        fit_coefficients(points[:2])


def _preset(tmp_path, cpu="CPU A", per_flop=1 / 200e9) -> Path:
    path = tmp_path / "step_time.json"
    path.write_text(
        json.dumps(
            {
                "cpus": {
                    cpu: {
                        "block": 16,
                        "fit": {
                            "float32": {"per_flop_s": per_flop, "per_byte_s": 1 / 10e9, "per_step_s": 0.02},
                            "bfloat16": {"per_flop_s": per_flop / 2, "per_byte_s": 1 / 10e9, "per_step_s": 0.02},
                        },
                    }
                }
            }
        )
    )
    return path


def test_a_cpu_without_its_calibration_gets_the_safe_side(tmp_path):
    path = _preset(tmp_path)
    own = cpu_time_model("CPU A", "avx512", path)
    other = cpu_time_model("CPU B", "avx512", path)
    avx2 = cpu_time_model("CPU C", "avx2", path)
    assert own.calibrated and not other.calibrated and "uncalibrated" in other.cpu
    net = _net(16)
    assert other.step_s(net) == pytest.approx(UNCALIBRATED_FACTOR * own.step_s(net))
    assert avx2.block == 8 and other.block == 16
    # bfloat16 is priced by its own coefficients, float16 (not measured on a CPU) by the slowest
    assert own.step_s(_net(16, "bf16")) < own.step_s(net)
    assert own.step_s(_net(16, "fp16")) >= own.step_s(_net(16, "bf16"))


def test_a_preset_that_is_not_a_calibration_is_named(tmp_path):
    bad = tmp_path / "step_time.json"
    bad.write_text('{"cpus": {"x": {"fit": {"float32": {"per_flop": 1}}}}}')
    with pytest.raises(ValueError, match="step_time.json is not a step-time calibration"):
        load_time_presets(bad)
    assert load_time_presets(tmp_path / "missing.json") == {}


def test_recomputation_is_priced_by_the_cpu_model_and_the_plan_says_its_step_time(tmp_path):
    model = cpu_time_model("CPU A", "avx512", _preset(tmp_path))
    workload = Workload(ModelConfig(depth=3, base_filters=8, out_channels=3), (96, 96, 64), 1, "fp32")
    net = compute_network_cost(workload)
    options = LMSOptions(limit_bytes=10**12, strategy="recompute", allow_offload=False, time_model=model)
    plan = plan_lms(workload, options)
    recomputed = [b for b in plan.blocks if b.policy == "recompute"]
    assert recomputed
    for row in recomputed:  # each block's forward time, in the share of its FLOPs recomputed
        i = [b.name for b in net.blocks].index(row.block)
        share = row.recomputed_flops / net.blocks[i].forward_flops
        assert row.overhead_s == pytest.approx(model.block_forward_s(net, i) * share)
    assert plan.base_step_s == pytest.approx(model.step_s(net))
    assert plan.predicted_step_s == pytest.approx(plan.base_step_s + plan.overhead_s)
    assert "predicted step" in plan.format_table()
    again = Plan.from_dict(json.loads(plan.to_json()))
    assert again.predicted_step_s == pytest.approx(plan.predicted_step_s)
    # off recomputes nothing: its step is the base step; compare_strategies reports both
    table = compare_strategies(workload, dataclasses.replace(options, strategy="auto"))
    assert table["off"]["step_s"] == pytest.approx(plan.base_step_s)
    assert table["recompute"]["step_s"] > table["off"]["step_s"]
    # a GPU keeps pricing by lms.device_tflops: no CPU step time
    gpu = plan_lms(workload, dataclasses.replace(options, allow_offload=True, time_model=None))
    assert gpu.predicted_step_s is None


def test_the_cpu_options_carry_this_cpus_model():
    from brats_seg.config import LMSConfig

    cpu = LMSOptions.from_config(LMSConfig(), None, allow_offload=False)
    gpu = LMSOptions.from_config(LMSConfig(), None, allow_offload=True)
    assert cpu.time_model is not None and gpu.time_model is None


def test_onednn_verbose_lines_are_summed_per_primitive_kind():
    from brats_seg.benchmark.onednn import onednn_profile

    text = "\n".join(
        [
            "onednn_verbose,v1,info,cpu,runtime:threadpool",
            "onednn_verbose,v1,primitive,exec,cpu,convolution,brg_conv_fwd:avx512_core,forward_training,src:f32,,mb1,2.5",
            "onednn_verbose,v1,primitive,exec,cpu,convolution,brg_conv_bwd_w:avx512_core,backward_weights,src:f32,,mb1,4.0",
            "onednn_verbose,v1,primitive,exec,cpu,reorder,jit:uni,undef,src:f32::blocked:abcde dst:f32,,1x4x8,1.5",
            "onednn_verbose,exec,cpu,reorder,simple:any,undef,src_f32::blocked:abcde,,1x4x8,2.0",  # oneDNN 2.x
            "onednn_verbose,v1,primitive,create:cache_miss,cpu,reorder,jit:uni,undef,,,,0.3",  # creation, not execution
            "unrelated line, 9.0",
        ]
    )
    profile = onednn_profile(text)
    assert profile["onednn_ms"] == {
        "convolution": 6.5,
        "convolution:backward_weights": 4.0,
        "convolution:forward_training": 2.5,
        "reorder": 3.5,
    }
    assert profile["onednn_total_ms"] == 10.0 and profile["reorder_share"] == 0.35
    assert profile["convolution_impl_ms"] == {"brg_conv_bwd_w:avx512_core": 4.0, "brg_conv_fwd:avx512_core": 2.5}
    assert onednn_profile("")["reorder_share"] is None


def test_the_width_figure_draws_time_rate_and_reorders(tmp_path):
    import matplotlib.image as mpimg

    from brats_seg.plots import plot_width_sweep

    def rec(f, p, t, share=None):
        return {
            "base_filters": f,
            "precision": p,
            "step_s": t,
            "predicted_step_s": t * 1.1,
            "flops_per_s": 1e11 * f / t,
            "sgemm_flops_per_s": 4.8e11,
            "shape": [192, 224, 160],
            "cpu": "test",
            "cpu_kind": "avx512",
            **({"reorder_share": share} if share is not None else {}),
        }

    timed = [rec(f, p, t) for f, p, t in [(4, "fp32", 1.7), (8, "fp32", 2.9), (16, "fp32", 5.0), (8, "bf16", 5.8)]]
    profiled = [rec(f, "fp32", 2.0, s) for f, s in [(4, 0.3), (8, 0.2), (16, 0.1)]]
    two = plot_width_sweep(timed, tmp_path / "two.png")
    three = plot_width_sweep(timed, tmp_path / "three.png", profiled)
    assert mpimg.imread(three).shape[1] > mpimg.imread(two).shape[1]  # the reorder panel
    with pytest.raises(ValueError, match="base_filters"):
        plot_width_sweep([{"step_s": 1.0}], tmp_path / "none.png")


class _WidthTimes:
    """A step-time model by the U-Net's width (its first convolution's outputs), no recomputation cost."""

    calibrated = True

    def __init__(self, seconds):
        self.seconds = seconds

    def step_s(self, net):
        return self.seconds[net.blocks[0].layers[0].channels[1]]

    def block_forward_s(self, net, i):
        return 0.0


def test_max_width_chooses_the_widest_that_fits_and_marks_a_width_a_wider_one_beats():
    from brats_seg.lms.planner.capacity import find_width
    from brats_seg.lms.planner.memory_model import MemoryModel

    workload = Workload(ModelConfig(depth=3, base_filters=8, out_channels=3), SHAPE, 1, "fp32")
    times = _WidthTimes({4: 1.0, 6: 3.0, 8: 2.0, 12: 4.0})  # 6 filters slower than 8, as fp32 on a Zen 5
    options = LMSOptions(limit_bytes=10**12, allow_offload=False, time_model=times)
    rows, chosen = find_width(workload, MemoryModel(), options, widths=(12, 4, 8, 6))
    assert [r.base_filters for r in rows] == [4, 6, 8, 12] and chosen == 12
    assert [r.slower_than_wider for r in rows] == [False, True, False, False]
    assert [r.predicted_step_s for r in rows] == [1.0, 3.0, 2.0, 4.0]
    # a budget between the smallest peaks of 8 and 12 filters (all recomputed): 8 is the widest that fits
    from brats_seg.lms.planner.search import estimate_peak

    def smallest(width):
        w = dataclasses.replace(workload, model_cfg=dataclasses.replace(workload.model_cfg, base_filters=width))
        return estimate_peak(w, LMSOptions(strategy="recompute", allow_offload=False), MemoryModel()).peak_bytes

    limit = (smallest(8) + smallest(12)) / 2 / (1 - MemoryModel().planning_margin)
    rows, chosen = find_width(
        workload, MemoryModel(), dataclasses.replace(options, limit_bytes=int(limit)), widths=(4, 6, 8, 12)
    )
    assert chosen == 8 and [r.fits for r in rows] == [True, True, True, False]
    _, none = find_width(workload, MemoryModel(), dataclasses.replace(options, limit_bytes=1000), widths=(4, 8))
    assert none is None
