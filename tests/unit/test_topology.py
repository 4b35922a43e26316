"""The U-Net topology (brats_seg.model.topology): structure, dtypes, validation; no TensorFlow.

That the Keras model has exactly these layers is tested in test_unet3d.py
(``test_keras_model_is_its_topology``).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from brats_seg.config import ModelConfig
from brats_seg.model.checks import check_batch_size, check_input_shape, check_policy, check_unet_config
from brats_seg.model.topology import group_count, unet_topology


def _cfg(**overrides) -> ModelConfig:
    return ModelConfig(**{"depth": 2, "base_filters": 4, "out_channels": 3, **overrides})


def _blocks(topology) -> dict:
    return {block.name: block for block in topology.blocks}


def _layers(topology) -> list:
    return [layer for block in topology.blocks for layer in block.layers]


def test_blocks_layers_and_tensors_in_forward_order():
    t = unet_topology(_cfg(depth=2, upsample="trilinear"))
    assert list(_blocks(t)) == ["enc0", "enc1", "bottleneck", "dec1", "dec0", "head"]
    assert t.filters == (4, 8, 16)
    assert [layer.name for layer in _blocks(t)["dec1"].layers] == [
        "dec1_up",
        "dec1_upconv",
        "dec1_concat",
        "dec1_conv1",
        "dec1_norm1",
        "dec1_relu1",
        "dec1_conv2",
        "dec1_norm2",
        "dec1_relu2",
    ]
    dec1 = _blocks(t)["dec1"]
    assert [x.name for x in dec1.inputs] == ["bottleneck", "enc1"] and dec1.skip.name == "enc1"
    assert dec1.layers[0].output.channels == 16 and dec1.layers[1].output.channels == 8  # up keeps F_2, upconv F_1
    assert dec1.layers[2].inputs == (dec1.layers[1].output, _blocks(t)["enc1"].output)  # concat [up, skip]
    assert dec1.output.name == "dec1" and dec1.output.level == 1
    bottleneck = _blocks(t)["bottleneck"]
    assert bottleneck.layers[0].kind == "pool" and bottleneck.layers[0].output.level == 2
    assert bottleneck.output.shape((48, 56, 40)) == (12, 14, 10)


@pytest.mark.parametrize("upsample", ["transpose", "trilinear"])
def test_tail_is_the_last_conv_unit_and_reads_only_the_front(upsample):
    t = unet_topology(_cfg(upsample=upsample), "mixed_bfloat16")
    for block in t.blocks[:-1]:
        front, tail = block.layers[: block.tail_start], block.layers[block.tail_start :]
        assert [layer.name.removeprefix(f"{block.name}_") for layer in tail] == ["conv2", "norm2", "relu2"]
        assert tail[0].inputs == (front[-1].output,)
    assert _blocks(t)["head"].tail_start is None


def test_mixed_precision_casts_and_float32_head():
    f32, bf16 = unet_topology(_cfg(), "float32"), unet_topology(_cfg(), "bf16")
    assert bf16.policy == "mixed_bfloat16"
    assert [layer.name for layer in _layers(f32) if layer.kind == "cast"] == []
    casts = [layer for layer in _layers(bf16) if layer.kind == "cast"]
    assert [(c.name, c.output.dtype) for c in casts] == [("enc0_image_cast", "bfloat16"), ("head_cast", "float32")]
    assert bf16.image.dtype == "float32" and _blocks(bf16)["enc0"].layers[1].inputs == (casts[0].output,)
    assert {layer.output.dtype for block in bf16.blocks[:-1] for layer in block.layers} == {"bfloat16"}
    head = _blocks(bf16)["head"]
    # the head conv reads dec0's bfloat16 output as it is; its logits are cast for the float32 sigmoid
    assert [(layer.kind, layer.output.dtype, layer.float32) for layer in head.layers] == [
        ("conv", "bfloat16", False),
        ("cast", "float32", False),
        ("sigmoid", "float32", True),
    ]
    assert head.output.name == "head"


def test_nested_head_is_one_layer_with_the_parents():
    head = _blocks(unet_topology(_cfg(region_parents=[-1, 0, 0])))["head"]
    assert [(layer.name, layer.kind, layer.parents) for layer in head.layers] == [
        ("head_conv", "conv", ()),
        ("head_sigmoid", "nest", (-1, 0, 0)),
    ]
    assert _blocks(unet_topology(_cfg(region_parents=[-1, -1, -1])))["head"].layers[-1].kind == "sigmoid"


def test_parameters_per_layer():
    t = unet_topology(_cfg(depth=1, base_filters=2, norm="batch"))
    params = {layer.name: (layer.params, layer.trainable_params) for layer in _layers(t) if layer.params}
    assert params == {
        "enc0_conv1": (27 * 4 * 2,) * 2,
        "enc0_norm1": (8, 4),
        "enc0_conv2": (27 * 2 * 2,) * 2,
        "enc0_norm2": (8, 4),
        "bottleneck_conv1": (27 * 2 * 4,) * 2,
        "bottleneck_norm1": (16, 8),
        "bottleneck_conv2": (27 * 4 * 4,) * 2,
        "bottleneck_norm2": (16, 8),
        "dec0_up": (8 * 4 * 2 + 2,) * 2,
        "dec0_conv1": (27 * 4 * 2,) * 2,
        "dec0_norm1": (8, 4),
        "dec0_conv2": (27 * 2 * 2,) * 2,
        "dec0_norm2": (8, 4),
        "head_conv": (2 * 3 + 3,) * 2,
    }


def test_group_norm_groups_divide_the_channels():
    assert [group_count(8, c) for c in (6, 12, 24, 3)] == [6, 6, 8, 3]
    t = unet_topology(_cfg(norm="group", groups=8, base_filters=6))
    assert [layer.groups for layer in _layers(t) if layer.name.endswith("_norm1")] == [6, 6, 8, 6, 6]
    assert {
        layer.groups for layer in _blocks(unet_topology(_cfg(norm="instance")))["enc0"].layers if layer.kind == "norm"
    } == {4}  # one per channel


@pytest.mark.parametrize(
    "overrides,shape,match",
    [
        (
            {"depth": 3},
            (20, 16, 16),
            r"\(20, 16, 16\).*2\*\*depth = 8.*model.depth=3.*\(16, 16, 16\) or \(24, 16, 16\)",
        ),
        ({"in_channels": 2}, (8, 8, 8), "in_channels.*got 2"),
        ({"out_channels": 0}, (8, 8, 8), "out_channels.*got 0.*resolve_model_outputs"),
        ({"norm": "layer"}, (8, 8, 8), "norm.*instance, group, batch.*'layer'"),
        ({"norm": "group", "groups": 0}, (8, 8, 8), "model.groups.*got 0"),
        ({"upsample": "nearest"}, (8, 8, 8), "upsample.*'nearest'"),
        ({"depth": 0}, (8, 8, 8), "depth.*got 0"),
        ({"base_filters": 0}, (8, 8, 8), "base_filters.*got 0"),
        ({"region_parents": [-1, 0]}, (8, 8, 8), "one parent per output"),
        ({"region_parents": [1, -1, -1]}, (8, 8, 8), "earlier in the output order"),
        ({}, (8, 8), "three positive integers"),
    ],
)
def test_validation_names_the_value_and_the_fix(overrides, shape, match):
    with pytest.raises(ValueError, match=match):
        check_unet_config(_cfg(**overrides), shape)


def test_workload_checks():
    assert check_input_shape((48, 56, 40), 3) == (48, 56, 40)
    with pytest.raises(ValueError, match=r"\(48, 48, 32\) or \(48, 64, 48\)"):
        check_input_shape((48, 56, 40), 4)
    assert [check_policy(p) for p in ("fp32", "fp16", "bf16", "float32")] == [
        "float32",
        "mixed_float16",
        "mixed_bfloat16",
        "float32",
    ]
    with pytest.raises(ValueError, match="dtype policy.*'float64'"):
        check_policy("float64")
    check_batch_size(1)
    with pytest.raises(ValueError, match="batch_size.*got 0"):
        check_batch_size(0)


def test_topology_does_not_import_tensorflow():
    code = (
        "import sys; from brats_seg.model.topology import unet_topology; from brats_seg.config import ModelConfig; "
        "unet_topology(ModelConfig(depth=4, out_channels=3), 'bf16'); "
        "bad = [m for m in ('tensorflow', 'keras') if m in sys.modules]; assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
