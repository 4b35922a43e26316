"""The cost tables (brats_seg.lms.planner.cost, brats_seg.lms.planner.layer_cost): hand counts on a tiny U-Net."""

from __future__ import annotations

import dataclasses

import pytest

from brats_seg.lms.planner.memory_model import MemoryModel
from brats_seg.lms.planner.plan import Plan
from brats_seg.lms.planner.search import plan_lms
from brats_seg.lms.planner.timeline import simulate, tail_kept
from brats_seg.lms.planner.workload import LMSOptions, Workload
from brats_seg.model.topology import unet_topology
from tests.unit.lms_workloads import HALF, ModelConfig, estimate, network


def test_hand_count_tiny_network():
    """depth 1, base 2, 4x4x4 input, 4 -> 3 channels, float32, batch 1, instance norm.

    Level 0: 64 voxels, level 1: 8 voxels; an F-channel float32 tensor is 256*F (level 0)
    or 32*F (level 1) bytes; instance-norm stats are B*C*2 float32 (mean, 1/std).
    """
    cfg = ModelConfig(depth=1, base_filters=2)
    net = network(cfg, (4, 4, 4))
    assert [b.name for b in net.blocks] == ["enc0", "bottleneck", "dec0", "head"]
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
    # dec0 internals 1024+3*512+32 and output 512; head output 768; the float32 image (1024)
    # that enc0's first conv keeps and the uint8 labels (3ch*64 = 192) the loss reads.
    timeline = simulate(net, ["keep"] * 4, size_bytes=0, prefetch=1)
    loss_step = timeline.steps.index("loss")
    expected_kept = (3 * 512 + 32 + 512) + (64 + 3 * 128 + 64 + 128) + (1024 + 3 * 512 + 32 + 512) + 768 + 1024 + 192
    assert timeline.kept_bytes[loss_step] == expected_kept
    # The float16 batch image (4ch*64*2 = 512) lives only while Keras casts it, as forward starts:
    # the same network without it differs by 512 at enc0's forward and nowhere else.
    assert net.tensor_bytes["batch_image"] == 512
    without = dataclasses.replace(
        net, tensor_bytes={t: (0 if t == "batch_image" else b) for t, b in net.tensor_bytes.items()}
    )
    other = simulate(without, ["keep"] * 4, size_bytes=0, prefetch=1)
    assert [a - b for a, b in zip(timeline.kept_bytes, other.kept_bytes)] == [512] + [0] * 8


def test_hand_count_kept_tail_of_the_last_block():
    """Recomputed, the block before the head (dec0) keeps its last conv unit: its input
    r1, the conv output c2 (the norm's input) and the norm's stats stay from its forward
    to the start of its backward, and only the front's FLOPs are recomputed.

    Same network as the hand count above (level-0 F-channel tensor: 256*F bytes).
    """
    cfg = ModelConfig(depth=1, base_filters=2)
    net = network(cfg, (4, 4, 4))
    dec0 = net.blocks[2]
    assert dec0.tail_saved_bytes == 512 + 512 + 16
    tail_flops = 2 * 27 * 2 * 2 * 64 + 8 * 64 * 2 + 64 * 2  # conv2, norm2, relu2
    assert dec0.tail_forward_flops == tail_flops
    assert [tail_kept(net, i, "recompute") for i in range(4)] == [False, False, True, False]
    assert not tail_kept(net, 2, "keep")

    plan = plan_lms(Workload(cfg, (4, 4, 4), 1), LMSOptions(limit_bytes=10**12, strategy="recompute", size_bytes=0))
    assert plan.keep_tails == {"dec0"}
    rows = {row.block: row for row in plan.blocks}
    assert rows["dec0"].recomputed_flops == dec0.forward_flops - tail_flops
    assert rows["enc0"].recomputed_flops == net.blocks[0].forward_flops
    assert rows["dec0"].kept_bytes == 128 + 512 + (512 + 512 + 16)  # its inputs + the tail
    assert "dec0: last conv unit kept" in plan.format_table()
    # At the loss step: the blocks' outputs (enc0 512, bottleneck 128, dec0 512, head 768), dec0's
    # tail, enc0's input (the float32 image, 1024, which a recomputed block keeps) and the labels (192).
    timeline = simulate(net, ["recompute"] * 4, size_bytes=0, prefetch=1)
    assert timeline.kept_bytes[timeline.steps.index("loss")] == 512 + 128 + 512 + 768 + (512 + 512 + 16) + 1024 + 192
    # ... and no longer once dec0's backward starts (the tail's tensors are freed first; the
    # labels after the loss).
    assert timeline.kept_bytes[timeline.steps.index("backward dec0")] == 512 + 128 + 1024
    assert Plan.from_json(plan.to_json()).keep_tails == {"dec0"}


@pytest.mark.parametrize(
    "filters, precision, planar",
    [(8, "bf16", True), (16, "bf16", False), (6, "fp32", True), (8, "fp32", False), (12, "fp32", False)],
)
def test_planar_norm_counts_one_copy_of_the_tensor_in_each_pass(filters, precision, planar):
    """Instance norm of a channel count oneDNN's channels-last kernel does not vectorise runs on
    a transposed copy (brats_seg.model.norm): one more tensor of its size in forward and backward."""
    cfg = ModelConfig(depth=1, base_filters=filters)
    norm = next(layer for layer in network(cfg, (8, 8, 8), policy=precision).blocks[0].layers if layer.kind == "norm")
    size = 8 * 8 * 8 * filters * (2 if precision == "bf16" else 4)
    assert norm.forward_scratch_bytes == norm.backward_scratch_bytes == (size if planar else 0)


@pytest.mark.parametrize("lag, working", [(0, 1248), (2, 2272), (100, 4864)])
def test_hand_count_backward_walk_frees_saved_tensors_with_the_release_lag(lag, working):
    """dec0 with trilinear up-sampling, walked backward: a layer's working set is counted
    with what the layers up to ``lag`` after it saved (the rest is freed by then).

    Same network as the hand count above, ``upsample=trilinear`` (level-0 F-channel tensor:
    256*F bytes). dec0's layers and what they save (internal tensors only): up (nothing),
    upconv (up 1024), concat (nothing), conv1 (concat 1024), norm1 (conv1 512, stats 16),
    relu1 (relu1 512), conv2 (relu1), norm2 (conv2 512, stats 16), relu2 (the output, not
    internal): 3616 bytes. Working sets (internal gradients + scratch): up 1024 + 3.75 x
    1024 scratch = 4864; upconv, conv1 1536; concat 1536; norm1, norm2, relu1, conv2 1024
    (a norm has no scratch under float32); relu2 512.

    lag 0: the worst moment is up's backward, nothing internal saved any more, with its 4864:
    1248 beyond the 3616 saved bytes (norm2's backward reaches 3616 + 1024). lag 2: up's backward with
    what up, upconv and concat saved (1024) plus 4864 = 5888, 2272 beyond. A lag past the block's length
    counts every saved tensor with the worst layer (4864): the block-level count.
    """
    cfg = ModelConfig(depth=1, base_filters=2, upsample="trilinear")
    # (2 channels run instance norm's planar view, whose copies test_planar_norm_... counts: left out here)
    mm = MemoryModel(backward_release_lag_layers=lag, norm_planar_tensors=0)
    dec0 = network(cfg, (4, 4, 4), memory_model=mm).blocks[2]
    assert [layer.kind for layer in dec0.layers] == [
        "up_trilinear",
        "conv",
        "concat",
        "conv",
        "norm",
        "relu",
        "conv",
        "norm",
        "relu",
    ]
    assert dec0.internal_saved_bytes == 3616
    assert dec0.backward_working_bytes == working


def test_norm_saves_its_input_in_its_own_dtype_under_mixed_precision():
    cfg = ModelConfig(depth=1, base_filters=2)
    f32 = network(cfg, (4, 4, 4), 1, "float32")
    bf16 = network(cfg, (4, 4, 4), 1, "mixed_bfloat16")
    # enc0 under bf16: cast image (4ch*64*2) for conv1, r1 and r2 in bf16 (2ch*64*2 each),
    # the two norm inputs c1 and c2 in bf16 (2ch*64*2 each, no float32 copy) and stats.
    assert bf16.blocks[0].keep_saved_bytes == 512 + 2 * 256 + 2 * 256 + 2 * 16
    # float32: the image itself (4ch*64*4), r1, r2, c1, c2 (2ch*64*4) and stats: twice the activations.
    assert f32.blocks[0].keep_saved_bytes == 1024 + 4 * 512 + 2 * 16

    # Instance norm (oneDNN's kernel) has no temporaries at one sample, one copy of its tensor
    # (its dtype) per pass at two (split and concatenated); the XLA group path float32 ones
    # under bf16 only.
    # (2 channels run the planar view, whose copies test_planar_norm_... counts: left out here)
    def enc0_norm1(cfg, batch, policy):
        net = network(cfg, (4, 4, 4), batch, policy, memory_model=MemoryModel(norm_planar_tensors=0))
        return {layer.name: layer for layer in net.blocks[0].layers}["enc0_norm1"]

    for policy in ("float32", "mixed_bfloat16"):
        one = enc0_norm1(cfg, 1, policy)
        assert one.forward_scratch_bytes == one.backward_scratch_bytes == 0
    two = enc0_norm1(cfg, 2, "mixed_bfloat16")
    assert two.forward_scratch_bytes == two.backward_scratch_bytes == 2 * 256  # 2 samples x 2ch x 64 x 2 bytes
    group = ModelConfig(depth=1, base_filters=2, norm="group", groups=1)
    assert enc0_norm1(group, 1, "float32").backward_scratch_bytes == 0
    bf16_group = enc0_norm1(group, 1, "mixed_bfloat16")
    assert bf16_group.forward_scratch_bytes == int(1.25 * 512) and bf16_group.backward_scratch_bytes == int(2.0 * 512)
    assert bf16.blocks[0].keep_saved_bytes < f32.blocks[0].keep_saved_bytes
    shape = (64, 64, 64)
    assert estimate(cfg, shape, 1, "mixed_bfloat16").peak_bytes < estimate(cfg, shape, 1).peak_bytes


def test_nested_region_head_keeps_its_sigmoids_and_products():
    """NestedRegionSigmoid multiplies each sub-region by WT: its backward needs both factors,
    so the head keeps one more head-sized float32 tensor than with independent sigmoids."""
    plain = network(ModelConfig(depth=4), HALF, 1)
    nested = network(ModelConfig(depth=4, region_parents=[-1, 0, 0]), HALF, 1)
    head_plain, head_nested = plain.blocks[-1], nested.blocks[-1]
    assert [layer.kind for layer in head_nested.layers][-2:] == ["sigmoid", "nest"]
    head_bytes = 96 * 112 * 80 * 3 * 4
    assert head_nested.keep_saved_bytes - head_plain.keep_saved_bytes == head_bytes


@pytest.mark.parametrize("policy", ["float32", "mixed_float16"])
@pytest.mark.parametrize("overrides", [{}, {"upsample": "trilinear", "norm": "group"}, {"region_parents": [-1, 0, 0]}])
def test_cost_rows_are_the_layers_of_the_topology(policy, overrides):
    """Every layer of the topology is priced once, in call order (a nested sigmoid as its
    sigmoids and then their products), with its own weights; nothing else is."""
    cfg = ModelConfig(depth=3, **overrides)
    topology, net = unet_topology(cfg, policy), network(cfg, HALF, 1, policy)
    for spec, blk in zip(topology.blocks, net.blocks):
        expected = [layer.name for layer in spec.layers] + (["head_nest"] if spec.layers[-1].kind == "nest" else [])
        assert [row.name for row in blk.layers] == expected
        assert blk.params == sum(layer.params for layer in spec.layers)
        assert blk.inputs == tuple(t.name for t in spec.inputs) and blk.output == spec.name
        if spec.tail_start is not None:
            assert blk.layers[blk.tail_start].name == spec.layers[spec.tail_start].name
    assert [b.name for b in net.blocks] == [b.name for b in topology.blocks]


def test_the_nnunet_preset_plans_its_temporaries_in_a_pipeline_fed_run_only():
    """Its float32 channels in and out of batchgenerators and the coordinate grid with its
    rotated copy: (4 + 3) channels x 4 bytes x 2 + 3 x 8 bytes x 2 = 104 bytes a voxel."""
    from brats_seg.lms.planner.cost import compute_network_cost

    cfg = ModelConfig(depth=2, base_filters=4)
    fed = Workload(cfg, (16, 16, 16), 1, input_batches=3, augment="nnunet")
    light = dataclasses.replace(fed, augment="light")
    assert compute_network_cost(fed).persistent["augment_bytes"] == 16**3 * 104
    assert compute_network_cost(fed).persistent_bytes - compute_network_cost(light).persistent_bytes == 16**3 * 104
    assert compute_network_cost(dataclasses.replace(fed, input_batches=0)).persistent["augment_bytes"] == 0
    with pytest.raises(ValueError, match="trainer.augment='heavy': use one of none, light, nnunet"):
        dataclasses.replace(fed, augment="heavy")


def test_a_train_config_plans_the_preset_it_trains_with():
    from brats_seg.config import TrainConfig, TrainerConfig

    assert Workload.from_config(TrainConfig(trainer=TrainerConfig(augment="nnunet"))).augment == "nnunet"
    assert Workload.from_config(TrainConfig(trainer=TrainerConfig(augment=False))).augment == "none"
