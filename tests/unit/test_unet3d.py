"""3D U-Net: shapes, block/layer names, dtypes, validation, the block wrapper."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from brats_seg.config import ModelConfig
from brats_seg.model.topology import level_filters, unet_block_names, unet_topology
from brats_seg.model.unet3d import TrilinearUpSampling3D, build_unet3d, make_unet_blocks


def _cfg(**overrides) -> ModelConfig:
    base = dict(depth=2, base_filters=4, norm="instance", upsample="transpose", in_channels=4, out_channels=3)
    return ModelConfig(**{**base, **overrides})


def _forward(model, shape, batch=2, seed=0):
    x = np.random.default_rng(seed).standard_normal((batch, *shape)).astype("float32")
    return model(x, training=False)


# (depth, base_filters, in, out, norm, upsample, spatial shape)
CONFIGS = [
    (2, 4, 4, 3, "instance", "transpose", (16, 16, 16)),
    (2, 6, 1, 1, "group", "trilinear", (32, 24, 16)),
    (3, 4, 1, 3, "batch", "transpose", (16, 24, 8)),
    (3, 6, 4, 1, "instance", "trilinear", (8, 16, 24)),
    (1, 5, 4, 3, "group", "transpose", (6, 10, 4)),
    (2, 3, 4, 3, "batch", "trilinear", (12, 8, 4)),
]


@pytest.mark.parametrize("depth,base,c_in,c_out,norm,upsample,shape", CONFIGS)
def test_output_shape_and_range(depth, base, c_in, c_out, norm, upsample, shape):
    cfg = _cfg(depth=depth, base_filters=base, in_channels=c_in, out_channels=c_out, norm=norm, upsample=upsample)
    model = build_unet3d(cfg, shape)
    assert model.input_shape == (None, *shape, c_in)
    assert model.output_shape == (None, *shape, c_out)
    y = _forward(model, (*shape, c_in)).numpy()
    assert y.shape == (2, *shape, c_out)
    assert y.dtype == np.float32
    assert np.all((y >= 0) & (y <= 1))


def test_block_names_in_forward_order():
    assert unet_block_names(1) == ["enc0", "bottleneck", "dec0", "head"]
    assert unet_block_names(3) == ["enc0", "enc1", "enc2", "bottleneck", "dec2", "dec1", "dec0", "head"]
    with pytest.raises(ValueError, match="depth"):
        unet_block_names(0)


def test_every_layer_is_named_after_its_block():
    cfg = _cfg(depth=3, upsample="trilinear")
    model = build_unet3d(cfg, (16, 16, 8))
    blocks = unet_block_names(3)
    names = [layer.name for layer in model.layers if layer.name != "image"]
    prefixes = {name.split("_")[0] for name in names}
    assert prefixes == set(blocks)
    for expected in (
        "enc0_conv1",
        "enc0_norm1",
        "enc0_relu1",
        "enc0_conv2",
        "enc1_pool",
        "enc2_norm2",
        "bottleneck_pool",
        "bottleneck_conv2",
        "dec2_up",
        "dec2_upconv",
        "dec2_concat",
        "dec0_conv2",
        "head_conv",
        "head_sigmoid",
    ):
        model.get_layer(expected)  # raises if missing
    assert "enc0_pool" not in names  # enc0 works on the input directly


def test_block_structure_filters_and_bias():
    depth, base = 3, 6
    model = build_unet3d(_cfg(depth=depth, base_filters=base, upsample="transpose"), (16, 16, 16))
    filters = level_filters(base, depth)
    assert filters == [6, 12, 24, 48]
    for level in range(depth):
        for block in (f"enc{level}", f"dec{level}"):
            for i in (1, 2):
                conv = model.get_layer(f"{block}_conv{i}")
                assert conv.filters == filters[level]
                assert conv.kernel_size == (3, 3, 3)
                assert conv.use_bias is False  # a norm follows
        up = model.get_layer(f"dec{level}_up")
        assert isinstance(up, keras.layers.Conv3DTranspose)
        assert up.filters == filters[level] and up.strides == (2, 2, 2)
    assert model.get_layer("bottleneck_conv1").filters == filters[depth]
    assert isinstance(model.get_layer("bottleneck_pool"), keras.layers.MaxPooling3D)
    # skip of dec{l} is enc{l}: concat input channels = F_l (up) + F_l (skip)
    assert model.get_layer("dec0_concat").output.shape[-1] == 2 * filters[0]


def test_trilinear_decoder_uses_upsampling_then_1x1_conv():
    model = build_unet3d(_cfg(depth=2, base_filters=4, upsample="trilinear"), (8, 8, 8))
    assert isinstance(model.get_layer("dec1_up"), TrilinearUpSampling3D)
    upconv = model.get_layer("dec1_upconv")
    assert upconv.kernel_size == (1, 1, 1) and upconv.filters == 8


def _linear_upsample_axis(x: np.ndarray, axis: int) -> np.ndarray:
    """Half-pixel-centre linear interpolation x2 along one axis, edges clamped."""
    n = x.shape[axis]
    src = np.clip((np.arange(2 * n) + 0.5) / 2 - 0.5, 0, n - 1)
    return np.apply_along_axis(lambda v: np.interp(src, np.arange(n), v), axis, x)


def test_trilinear_upsampling_matches_reference():
    x = np.random.default_rng(1).standard_normal((2, 3, 4, 5, 2)).astype("float32")
    expected = x
    for axis in (1, 2, 3):
        expected = _linear_upsample_axis(expected, axis)
    got = TrilinearUpSampling3D()(x).numpy()
    assert got.shape == (2, 6, 8, 10, 2)
    np.testing.assert_allclose(got, expected, atol=1e-5)
    # same as tf.image.resize(bilinear) per axis pair: (y, z) then (x, .)
    yz = tf.image.resize(x.reshape(2 * 3, 4, 5, 2), (8, 10), method="bilinear").numpy().reshape(2, 3, 8 * 10, 2)
    xyz = tf.image.resize(yz, (6, 80), method="bilinear").numpy().reshape(2, 6, 8, 10, 2)
    np.testing.assert_allclose(got, xyz, atol=1e-5)


def test_instance_norm_is_per_sample_per_channel():
    model = build_unet3d(_cfg(norm="instance"), (8, 8, 8))
    norm = model.get_layer("enc0_norm1")
    assert norm.groups == 4  # groups=-1 resolved to one group per channel (F_0 = 4)
    x = np.random.default_rng(2).standard_normal((2, 4, 5, 6, 4)).astype("float32") * 3 + 1
    mean = x.mean(axis=(1, 2, 3), keepdims=True)
    var = x.var(axis=(1, 2, 3), keepdims=True)
    np.testing.assert_allclose(norm(x).numpy(), (x - mean) / np.sqrt(var + norm.epsilon), atol=1e-4)


def test_group_norm_groups_are_clamped_to_divide_channels():
    model = build_unet3d(_cfg(norm="group", groups=8, base_filters=6, depth=2), (8, 8, 8))
    # channels 6, 12, 24 -> largest divisor <= 8: 6, 6, 8
    assert model.get_layer("enc0_norm1").groups == 6
    assert model.get_layer("enc1_norm1").groups == 6
    assert model.get_layer("bottleneck_norm2").groups == 8
    assert isinstance(
        build_unet3d(_cfg(norm="batch"), (8, 8, 8)).get_layer("dec0_norm1"), keras.layers.BatchNormalization
    )


@pytest.fixture
def policy():
    """Set a global dtype policy for one test; always back to float32 afterwards."""
    try:
        yield keras.mixed_precision.set_global_policy
    finally:
        keras.mixed_precision.set_global_policy("float32")


@pytest.mark.parametrize("upsample", ["transpose", "trilinear"])
def test_output_is_float32_under_mixed_float16(policy, upsample):
    policy("mixed_float16")
    model = build_unet3d(_cfg(upsample=upsample), (8, 8, 8))
    assert model.get_layer("enc0_conv1").compute_dtype == "float16"
    assert model.get_layer("dec0_up").compute_dtype == "float16"
    # the 1x1x1 head conv reads dec0's output in the compute dtype (no float32 copy of it is
    # kept); its logits are cast and the sigmoid and the loss run in float32
    assert model.get_layer("head_conv").compute_dtype == "float16"
    assert model.get_layer("head_sigmoid").compute_dtype == "float32"
    assert model.output.dtype == "float32"
    if tf.config.list_physical_devices("GPU"):  # TF has no float16 MaxPool3D kernel on CPU
        assert _forward(model, (8, 8, 8, 4)).dtype == tf.float32


@pytest.mark.parametrize("upsample", ["transpose", "trilinear"])
def test_forward_is_float32_under_mixed_bfloat16(policy, upsample):
    policy("mixed_bfloat16")  # the CPU mixed-precision path (backend.precision=bf16)
    model = build_unet3d(_cfg(upsample=upsample, norm="group", groups=2), (8, 8, 8))
    y = _forward(model, (8, 8, 8, 4))
    assert y.dtype == tf.float32
    assert np.all(np.isfinite(y.numpy()))


def test_policy_is_reset_after_mixed_precision_test():
    assert keras.mixed_precision.global_policy().name == "float32"


# (depth, norm, upsample, regions, policy): every value of each at least once
TOPOLOGY_CONFIGS = [
    (1, "instance", "transpose", "nested", "float32"),
    (1, "group", "transpose", "independent", "mixed_bfloat16"),
    (2, "group", "trilinear", "independent", "mixed_bfloat16"),
    (2, "batch", "trilinear", "nested", "float32"),
    (3, "batch", "transpose", "independent", "mixed_bfloat16"),
    (3, "instance", "trilinear", "independent", "float32"),
    (4, "instance", "trilinear", "nested", "mixed_bfloat16"),
    (4, "group", "transpose", "nested", "float32"),
]


@pytest.mark.parametrize("depth,norm,upsample,regions,dtype_policy", TOPOLOGY_CONFIGS)
def test_keras_model_is_its_topology(policy, depth, norm, upsample, regions, dtype_policy):
    """The layers of the built model are those of the topology the planner prices: same
    names in the same order, output shapes and dtypes, weights, kernels, biases and groups."""
    policy(dtype_policy)
    shape = (16, 32, 16)
    cfg = _cfg(
        depth=depth,
        base_filters=6,
        norm=norm,
        groups=4,
        upsample=upsample,
        in_channels=4,
        out_channels=3,
        region_parents=[-1, 0, 0] if regions == "nested" else [],
    )
    model = build_unet3d(cfg, shape)
    topology = unet_topology(cfg, dtype_policy)
    specs = [layer for block in topology.blocks for layer in block.model_layers]
    assert [layer.name for layer in model.layers if layer.name != "image"] == [spec.name for spec in specs]
    for spec in specs:
        layer = model.get_layer(spec.name)
        assert tuple(layer.output.shape) == (None, *spec.output.shape(shape), spec.output.channels), spec.name
        assert layer.output.dtype == spec.output.dtype, spec.name
        assert layer.count_params() == spec.params, spec.name
        assert sum(int(np.prod(w.shape)) for w in layer.trainable_weights) == spec.trainable_params, spec.name
        if spec.kernel:
            assert layer.kernel_size == (spec.kernel,) * 3 and layer.use_bias == spec.bias, spec.name
        if spec.kind == "norm" and norm != "batch":
            assert layer.groups == spec.groups, spec.name
    casts = [layer.name for block in topology.blocks for layer in block.layers if layer.kind == "cast"]
    assert casts == ([] if dtype_policy == "float32" else ["enc0_image_cast", "head_cast"])  # Keras' autocasts
    assert model.count_params() == sum(spec.params for spec in specs)


@pytest.mark.parametrize(
    "overrides,shape,match",
    [
        (
            {"depth": 3},
            (20, 16, 16),
            r"\(20, 16, 16\).*2\*\*depth = 8.*model.depth=3.*\(16, 16, 16\) or \(24, 16, 16\)",
        ),
        ({"depth": 2}, (6, 8, 8), r"\(6, 8, 8\).*\(4, 8, 8\) or \(8, 8, 8\)"),
        ({"in_channels": 2}, (8, 8, 8), "in_channels.*got 2"),
        ({"out_channels": 0}, (8, 8, 8), "out_channels.*got 0.*resolve_model_outputs"),
        ({"norm": "layer"}, (8, 8, 8), "norm.*instance, group, batch.*'layer'"),
        ({"upsample": "nearest"}, (8, 8, 8), "upsample.*'nearest'"),
        ({"depth": 0}, (8, 8, 8), "depth.*got 0"),
        ({"base_filters": 0}, (8, 8, 8), "base_filters.*got 0"),
        ({}, (8, 8), "three positive integers"),
    ],
)
def test_validation_errors(overrides, shape, match):
    with pytest.raises(ValueError, match=match):
        build_unet3d(_cfg(**overrides), shape)


def test_block_wrapper_sees_every_block_in_order_with_built_layers():
    depth = 3
    calls = []

    def wrapper(name, block, inputs):
        calls.append((name, len(inputs)))
        assert block.name == name
        assert all(layer.built for layer in block.layers)  # created and built outside the wrapper
        assert all(layer.name.startswith(f"{name}_") for layer in block.layers)
        return block(*inputs)

    cfg = _cfg(depth=depth, upsample="trilinear")
    wrapped = build_unet3d(cfg, (16, 16, 8), block_wrapper=wrapper)
    assert [name for name, _ in calls] == unet_block_names(depth)
    assert {name: n for name, n in calls if name.startswith("dec")} == {f"dec{l}": 2 for l in range(depth)}
    assert all(n == 1 for name, n in calls if not name.startswith("dec"))
    plain = build_unet3d(cfg, (16, 16, 8))
    assert [w.shape for w in wrapped.weights] == [w.shape for w in plain.weights]


@pytest.mark.parametrize("upsample", ["transpose", "trilinear"])
def test_block_split_is_front_then_last_conv_unit(upsample):
    """``Block.split = (front, tail)``: tail(front(x)) is the block, tail runs conv2/norm2/relu2 only."""
    cfg = _cfg(depth=2, upsample=upsample)
    blocks = make_unet_blocks(cfg)
    build_unet3d(cfg, (8, 8, 8), blocks=blocks)
    assert blocks["head"].split is None
    rng = np.random.default_rng(5)
    x0 = rng.standard_normal((1, 8, 8, 8, 4)).astype("float32")
    e0 = blocks["enc0"](x0)
    b = blocks["bottleneck"](blocks["enc1"](e0))
    d1 = blocks["dec1"](b, blocks["enc1"](e0))
    for name, inputs in [("enc0", [x0]), ("enc1", [e0]), ("dec0", [d1, e0])]:
        block = blocks[name]
        front, tail = block.split
        mid = front(*inputs)
        assert mid.shape[-1] == block.layers[-3].filters  # relu1's output: conv2's input
        np.testing.assert_allclose(np.asarray(tail(mid)), np.asarray(block(*inputs)), rtol=1e-6, atol=1e-6)
    seen = []
    for layer in (blocks["dec0"].layers[-3], blocks["dec0"].layers[-2]):
        original = layer.call

        def spy(*args, _layer=layer, _call=original, **kwargs):
            seen.append(_layer.name)
            return _call(*args, **kwargs)

        layer.call = spy
    blocks["dec0"].split[1](blocks["dec0"].split[0](d1, e0))
    assert seen == ["dec0_conv2", "dec0_norm2"]


class _RecomputeBlock(keras.layers.Layer):
    """What an LMS wrapper does: run a block's forward under a custom gradient."""

    def __init__(self, block):
        super().__init__(name=f"{block.name}_recompute")
        self.block = block
        self.block_layers = list(block.layers)  # tracked: the weights stay in the model
        self.built = True

    def call(self, inputs):
        return tf.recompute_grad(lambda *xs: self.block(*xs))(*inputs)


def test_recompute_wrapper_gives_the_same_outputs_and_gradients():
    cfg = _cfg(depth=2, upsample="trilinear")
    plain = build_unet3d(cfg, (8, 8, 8))
    wrapped = build_unet3d(cfg, (8, 8, 8), block_wrapper=lambda name, block, inputs: _RecomputeBlock(block)(inputs))
    wrapped.set_weights(plain.get_weights())
    x = np.random.default_rng(3).standard_normal((2, 8, 8, 8, 4)).astype("float32")

    def value_and_grads(model):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(model(x, training=True) ** 2)
        return loss, tape.gradient(loss, model.trainable_weights)

    loss_a, grads_a = value_and_grads(plain)
    loss_b, grads_b = value_and_grads(wrapped)
    np.testing.assert_allclose(loss_a.numpy(), loss_b.numpy(), rtol=1e-6)
    for a, b in zip(grads_a, grads_b):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-6)


def test_save_and_load_keras_file(tmp_path):
    model = build_unet3d(_cfg(upsample="trilinear", norm="group", groups=3), (8, 8, 8))
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.models.load_model(path)
    np.testing.assert_allclose(_forward(loaded, (8, 8, 8, 4)).numpy(), _forward(model, (8, 8, 8, 4)).numpy(), atol=1e-6)


# ---------------------------------------------------------------------------------------
# Nested region outputs (model.regions=nested)
# ---------------------------------------------------------------------------------------


def test_region_parents_follow_the_label_sets_of_each_layout():
    from brats_seg.data.labels import region_parents

    assert region_parents("brats2021") == (-1, 0, 0)  # TC and ET within WT, the outermost region holding them
    assert region_parents("msd") == (-1, 0, 0)
    assert region_parents("brats2024") == (-1, 0, 0, -1)  # the resection cavity is no tumour region
    assert region_parents("brats2023", out_channels=1) == (-1,)  # WT only


def test_nested_sigmoid_is_each_region_times_its_parent():
    from brats_seg.model.unet3d import NestedRegionSigmoid

    rng = np.random.default_rng(1)
    z = rng.normal(size=(2, 3, 4, 5, 4)).astype(np.float32)
    p = np.asarray(NestedRegionSigmoid((-1, 0, 1, -1))(z))
    s = 1 / (1 + np.exp(-z))
    np.testing.assert_allclose(p[..., 0], s[..., 0], rtol=1e-6)
    np.testing.assert_allclose(p[..., 1], s[..., 0] * s[..., 1], rtol=1e-5)
    np.testing.assert_allclose(p[..., 2], s[..., 0] * s[..., 1] * s[..., 2], rtol=1e-5)
    np.testing.assert_allclose(p[..., 3], s[..., 3], rtol=1e-6)  # no parent
    assert (p[..., 2] <= p[..., 1]).all() and (p[..., 1] <= p[..., 0]).all()  # nested by construction
    with pytest.raises(ValueError, match="earlier in the output order"):
        NestedRegionSigmoid((1, -1))


def test_a_sub_region_loss_does_not_reach_its_parents_logit():
    """The parent factor is a constant to the child's loss: a TC-only loss moves the TC logit
    (by ``P(WT) * sigmoid'(z_TC)`` per unit of ``dL/dP(TC)``) and leaves WT's logit alone,
    so WT learns from its own reference only."""
    import tensorflow as tf

    from brats_seg.model.unet3d import NestedRegionSigmoid

    z = tf.Variable(np.random.default_rng(2).normal(size=(1, 3, 3, 3, 3)).astype(np.float32))
    with tf.GradientTape() as tape:
        tc = NestedRegionSigmoid((-1, 0, 0))(z)[..., 1]
        loss = tf.reduce_sum(tc)
    grad = tape.gradient(loss, z).numpy()
    s = 1 / (1 + np.exp(-z.numpy()))
    np.testing.assert_array_equal(grad[..., 0], 0.0)
    np.testing.assert_array_equal(grad[..., 2], 0.0)
    np.testing.assert_allclose(grad[..., 1], s[..., 0] * s[..., 1] * (1 - s[..., 1]), rtol=1e-5)


def test_nested_head_saves_loads_and_starts_each_child_at_half_its_parent(tmp_path):
    import keras

    from brats_seg.model.unet3d import build_unet3d

    cfg = ModelConfig(depth=2, base_filters=4, out_channels=3, region_parents=[-1, 0, 1], foreground_prior=0.01)
    model = build_unet3d(cfg, (16, 16, 16))
    bias = model.get_layer("head_conv").bias.numpy()
    np.testing.assert_allclose(bias, [np.log(0.01 / 0.99), 0.0, 0.0], rtol=1e-6)
    x = np.random.default_rng(0).normal(size=(1, 16, 16, 16, 4)).astype(np.float32)
    p = model.predict(x, verbose=0)
    assert (p[..., 2] <= p[..., 1] + 1e-7).all() and (p[..., 1] <= p[..., 0] + 1e-7).all()
    model.save(tmp_path / "m.keras")
    np.testing.assert_allclose(keras.models.load_model(tmp_path / "m.keras").predict(x, verbose=0), p, rtol=1e-6)
    independent = build_unet3d(ModelConfig(depth=2, base_filters=4, out_channels=3), (16, 16, 16))
    assert independent.get_layer("head_sigmoid").__class__.__name__ == "Activation"
    with pytest.raises(ValueError, match="one parent per output"):
        build_unet3d(ModelConfig(depth=2, base_filters=4, out_channels=3, region_parents=[-1, 0]), (16, 16, 16))


def test_resolving_the_config_sets_the_parents_of_the_layout():
    from brats_seg.config import DataConfig, TrainConfig
    from brats_seg.data.labels import resolve_model_outputs

    cfg = resolve_model_outputs(TrainConfig(data=DataConfig(layout="brats2024")))
    assert cfg.model.out_channels == 4 and cfg.model.region_parents == [-1, 0, 0, -1]
    cfg = TrainConfig(data=DataConfig(layout="brats2021"))
    cfg.model.regions = "independent"
    assert resolve_model_outputs(cfg).model.region_parents == [-1, -1, -1]
    cfg.model.regions = "hierarchical"
    with pytest.raises(ValueError, match="model.regions"):
        resolve_model_outputs(cfg)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("channels", [6, 8, 16])
def test_instance_norm_planar_and_channels_last_views_agree_with_a_reference(dtype, channels):
    """Channel counts oneDNN's channels-last kernel does not vectorise (6 and 8 in bfloat16, 6 in
    float32) run on the planar view: the same function, forward and backward, as a float64 reference."""
    from brats_seg.model.norm import instance_norm
    from brats_seg.model.topology import instance_norm_is_planar

    assert instance_norm_is_planar(channels, dtype) == (channels % (4 if dtype == "float32" else 16) != 0)
    rng = np.random.default_rng(channels)
    x64 = rng.standard_normal((2, 6, 7, 8, channels)) * 3 + rng.standard_normal(channels) * 5
    dy64 = rng.standard_normal(x64.shape)
    gamma64, beta64 = 1 + 0.1 * rng.standard_normal(channels), 0.1 * rng.standard_normal(channels)
    x = tf.cast(tf.constant(x64, tf.float32), dtype)
    gamma, beta = tf.constant(gamma64, tf.float32), tf.constant(beta64, tf.float32)
    with tf.GradientTape() as tape:
        tape.watch([x, gamma, beta])
        y = instance_norm(x, gamma, beta, 1e-5)
    dx, dgamma, dbeta = tape.gradient(
        y, [x, gamma, beta], output_gradients=tf.cast(tf.constant(dy64, tf.float32), dtype)
    )
    assert y.dtype == dtype and dx.dtype == dtype
    xr = tf.cast(x, tf.float64).numpy()  # the reference sees the same rounded input
    mean, var = xr.mean(axis=(1, 2, 3), keepdims=True), xr.var(axis=(1, 2, 3), keepdims=True)
    xhat = (xr - mean) / np.sqrt(var + 1e-5)
    dyr = tf.cast(tf.cast(tf.constant(dy64, tf.float32), dtype), tf.float64).numpy()
    g = gamma64 * dyr
    dx_ref = (
        g - g.mean(axis=(1, 2, 3), keepdims=True) - xhat * (g * xhat).mean(axis=(1, 2, 3), keepdims=True)
    ) / np.sqrt(var + 1e-5)
    tol = 2e-4 if dtype == "float32" else 5e-2
    np.testing.assert_allclose(tf.cast(y, tf.float64).numpy(), xhat * gamma64 + beta64, atol=tol * 10)
    np.testing.assert_allclose(tf.cast(dx, tf.float64).numpy(), dx_ref, atol=tol * 10)
    np.testing.assert_allclose(dgamma.numpy(), (dyr * xhat).sum(axis=(0, 1, 2, 3)), rtol=tol, atol=tol * 50)
    np.testing.assert_allclose(dbeta.numpy(), dyr.sum(axis=(0, 1, 2, 3)), rtol=tol, atol=tol * 50)
