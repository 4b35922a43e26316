"""LMS block wrappers (brats_seg.lms.runtime.offload): keep / recompute / offload give the same
gradients (float32, mixed_float16, MirroredStrategy), work under model.fit and in functional
models, count their bytes/FLOPs, and refuse blocks that cannot be recomputed.

Tensors are channels-last ``(batch, x, y, z, channels)``. The graph structure and what
Grappler does at run time are tested in ``test_offload_graph.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import layers

from brats_seg.lms.runtime.offload import BlockWrapper, LMSBlock
from brats_seg.lms.runtime.recompute_safety import RecomputeError, find_recompute_unsafe_layers
from brats_seg.lms.runtime.stats import OffloadStats

REPO = Path(__file__).resolve().parents[2]
BLOCKS = ["enc0", "enc1", "bottleneck", "dec1", "dec0", "head"]  # forward order, depth 2
SHAPE = (1, 8, 8, 8, 2)  # (B, x, y, z, C)
MIXED_PLAN = {
    "enc0": "offload",
    "enc1": "recompute",
    "bottleneck": "keep",
    "dec1": "offload",
    "dec0": "recompute",
    "head": "keep",
}


# ---------------------------------------------------------------------------------------
# A tiny U-Net with the builder's block interface (2 levels, skips enc0->dec0, enc1->dec1)
# ---------------------------------------------------------------------------------------


def _conv_norm_relu(name: str, filters: int) -> list:
    return [
        layers.Conv3D(filters, 3, padding="same", use_bias=False, name=f"{name}_conv1"),
        layers.GroupNormalization(groups=-1, name=f"{name}_norm1"),
        layers.ReLU(name=f"{name}_relu1"),
    ]


def make_tiny_blocks(filters: int = 4, down: str = "max", extra: dict | None = None) -> dict[str, list]:
    """Layers per block. ``down="conv"``: strided-conv down-sampling (MaxPool3D has no CPU
    float16 kernel). ``extra``: block name -> layer appended to that block."""

    def down_layer(name, f):
        if down == "max":
            return layers.MaxPooling3D(2, name=f"{name}_pool")
        return layers.Conv3D(f, 2, strides=2, name=f"{name}_down")

    blocks = {
        "enc0": _conv_norm_relu("enc0", filters),
        "enc1": [down_layer("enc1", filters)] + _conv_norm_relu("enc1", 2 * filters),
        "bottleneck": [down_layer("bottleneck", 2 * filters)] + _conv_norm_relu("bottleneck", 4 * filters),
        "dec1": [
            layers.Conv3DTranspose(2 * filters, 2, strides=2, name="dec1_up"),
            layers.Concatenate(name="dec1_concat"),
        ]
        + _conv_norm_relu("dec1", 2 * filters),
        "dec0": [layers.Conv3DTranspose(filters, 2, strides=2, name="dec0_up"), layers.Concatenate(name="dec0_concat")]
        + _conv_norm_relu("dec0", filters),
        "head": [
            layers.Conv3D(1, 1, dtype="float32", name="head_conv"),
            layers.Activation("sigmoid", dtype="float32", name="head_sigmoid"),
        ],
    }
    for name, layer in (extra or {}).items():
        blocks[name].append(layer)
    return blocks


def _run_layers(block_layers: list, x, skip=None):
    for layer in block_layers:
        x = layer([x, skip]) if isinstance(layer, layers.Concatenate) else layer(x)
    return x


def block_apply(block_layers: list):
    """``apply(x[, skip])`` running ``block_layers`` in order (concat merges the skip).

    Like ``unet3d.Block``, blocks with layers before their last conv unit carry
    ``split = (front, tail)``: the tail is the conv unit (``conv -> norm -> relu``).
    """

    def apply(x, skip=None):
        return _run_layers(block_layers, x, skip)

    apply.layers = block_layers
    if len(block_layers) > 3 and block_layers[-3].name.endswith("_conv1"):
        apply.split = (
            lambda x, skip=None: _run_layers(block_layers[:-3], x, skip),
            lambda x: _run_layers(block_layers[-3:], x),
        )
    return apply


def run_unet(run, applies: dict, x):
    """The U-Net's forward pass through ``run(block_name, apply_fn, inputs)``."""
    e0 = run("enc0", applies["enc0"], [x])  # (B, 8, 8, 8, F)
    e1 = run("enc1", applies["enc1"], [e0])  # (B, 4, 4, 4, 2F)
    b = run("bottleneck", applies["bottleneck"], [e1])  # (B, 2, 2, 2, 4F)
    d1 = run("dec1", applies["dec1"], [b, e1])  # (B, 4, 4, 4, 2F)
    d0 = run("dec0", applies["dec0"], [d1, e0])  # (B, 8, 8, 8, F)
    return run("head", applies["head"], [d0])  # (B, 8, 8, 8, 1) float32


class TinyUNet(keras.Model):
    """Subclassed model: ``call`` runs every block through the wrapper (None: directly)."""

    def __init__(self, wrapper=None, filters: int = 4, down: str = "max", extra: dict | None = None, **kwargs):
        super().__init__(**kwargs)
        self.wrapper = wrapper
        self.block_layers = make_tiny_blocks(filters, down, extra)
        self.applies = {name: block_apply(ls) for name, ls in self.block_layers.items()}

    def call(self, x):
        return run_unet(self.wrapper or (lambda name, fn, inputs: fn(*inputs)), self.applies, x)


def tiny_functional_unet(wrapper, filters: int = 4) -> keras.Model:
    """Functional model built like ``build_unet3d``: the wrapper sees KerasTensors."""
    block_layers = make_tiny_blocks(filters)
    applies = {name: block_apply(ls) for name, ls in block_layers.items()}
    image = keras.Input(SHAPE[1:], name="image")
    return keras.Model(image, run_unet(wrapper, applies, image))


def make_model(policy, seed: int = 1, x_shape=SHAPE, **kwargs) -> TinyUNet:
    """A built TinyUNet with identical weights for a given seed, whatever the plan."""
    keras.utils.set_random_seed(seed)
    plan = policy if isinstance(policy, dict) else dict.fromkeys(BLOCKS, policy)
    wrapper_args = kwargs.pop("wrapper_args", {})
    model = TinyUNet(BlockWrapper(plan, **wrapper_args), **kwargs)
    model(tf.zeros(x_shape))
    return model


def loss_fn(y):
    """A loss whose gradient differs per voxel (a plain sum would hide ordering bugs)."""
    weights = tf.reshape(tf.range(tf.size(y), dtype=y.dtype), tf.shape(y)) / tf.cast(tf.size(y), y.dtype)
    return tf.reduce_sum(tf.square(y - weights))


def gradients(model, x, compiled: bool = True) -> list[np.ndarray]:
    """d loss / d (input, every trainable variable), float32 numpy."""

    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = loss_fn(tf.cast(model(x), tf.float32))
        return tape.gradient(loss, [x, *model.trainable_variables])

    if compiled:
        step = tf.function(step, jit_compile=False)
    return [np.asarray(tf.cast(g, tf.float32)) for g in step(x)]


def assert_grads_close(ref, got, rtol, atol_scale):
    assert len(ref) == len(got)
    for i, (a, b) in enumerate(zip(ref, got)):
        assert a.shape == b.shape, i
        np.testing.assert_allclose(b, a, rtol=rtol, atol=atol_scale * float(np.max(np.abs(a))), err_msg=f"grad {i}")


@pytest.fixture
def x():
    return tf.constant(np.random.default_rng(0).standard_normal(SHAPE).astype("float32"))


# ---------------------------------------------------------------------------------------
# Gradients
# ---------------------------------------------------------------------------------------

PLANS = {
    "recompute": ("recompute", {}),
    "offload": ("offload", {}),
    "offload+skips": ("offload", {"offload_skips": {"enc0", "enc1"}}),
    "mixed+skips": (MIXED_PLAN, {"offload_skips": {"enc0"}}),
    "mixed prefetch=2": (MIXED_PLAN, {"prefetch": 2}),
    "mixed prefetch=0": (MIXED_PLAN, {"prefetch": 0, "offload_skips": {"enc0"}}),
    "recompute, kept tails": ("recompute", {"keep_tails": {"dec0", "dec1", "enc1"}}),
    "offload, kept tails": ("offload", {"keep_tails": {"dec0"}, "offload_skips": {"enc0"}}),
}


@pytest.mark.parametrize("plan", PLANS, ids=list(PLANS))
def test_gradients_match_keep_float32(plan, x):
    ref = gradients(make_model("keep"), x)
    policy, wrapper_args = PLANS[plan]
    got = gradients(make_model(policy, wrapper_args=wrapper_args), x)
    # float32: rtol 1e-5 as required; the tiny atol only covers entries that are ~0.
    assert_grads_close(ref, got, rtol=1e-5, atol_scale=1e-7)


def test_gradients_match_keep_eager(x):
    """Eager mode gives the same numbers (no memory guarantee there; see the module doc)."""
    ref = gradients(make_model("keep"), x, compiled=False)
    got = gradients(make_model(MIXED_PLAN, wrapper_args={"offload_skips": {"enc0"}}), x, compiled=False)
    assert_grads_close(ref, got, rtol=1e-5, atol_scale=1e-6)


@pytest.fixture
def mixed_float16():
    keras.mixed_precision.set_global_policy("mixed_float16")
    yield
    keras.mixed_precision.set_global_policy("float32")


@pytest.mark.parametrize("policy", ["recompute", "offload"])
def test_gradients_match_keep_mixed_float16(policy, x, mixed_float16):
    """float16 activations and input gradients, float32 variables and their gradients.

    Tolerance rtol 1e-2, atol 1e-3 x max|grad|: float16 has a 2**-10 ~ 1e-3 unit round-off;
    the recomputed forward may round intermediate values differently (fused kernels, other
    op order), a few ulps that the backward pass can amplify. Observed: identical on CPU.
    """
    ref = gradients(make_model("keep", down="conv"), x)
    model = make_model(policy, down="conv", wrapper_args={"offload_skips": {"enc0"}})
    assert model.block_layers["enc0"][0].compute_dtype == "float16"
    assert model.trainable_variables[0].dtype == "float32"
    got = gradients(model, x)
    assert_grads_close(ref, got, rtol=1e-2, atol_scale=1e-3)


def test_unwatched_input_gets_no_gradient(x):
    """The image is not watched in training: its gradient is not used (the conv gradient
    function still builds Conv3DBackpropInputV2; with no consumer it is pruned at run time)."""
    model = make_model("offload")

    @tf.function(jit_compile=False)
    def step(x):
        with tf.GradientTape() as tape:
            loss = loss_fn(model(x))
        return tape.gradient(loss, model.trainable_variables)

    graph = step.get_concrete_function(x).graph
    first_conv_grads = [
        op for op in graph.get_operations() if op.type == "Conv3DBackpropInputV2" and "lms_enc0_recompute" in op.name
    ]
    assert len(first_conv_grads) == 1
    assert all(not t.consumers() for t in first_conv_grads[0].outputs)
    ref = make_model("keep")
    ref_grads = tf.function(lambda x: _var_grads(ref, x))(x)
    for a, b in zip(ref_grads, step(x)):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-7 * float(np.max(np.abs(a))))


def _var_grads(model, x):
    with tf.GradientTape() as tape:
        loss = loss_fn(model(x))
    return tape.gradient(loss, model.trainable_variables)


# ---------------------------------------------------------------------------------------
# model.fit, functional models, stats
# ---------------------------------------------------------------------------------------


def _fit(model, epochs=2):
    rng = np.random.default_rng(3)
    data_x = rng.standard_normal((4, *SHAPE[1:])).astype("float32")
    data_y = (rng.random((4, *SHAPE[1:4], 1)) > 0.5).astype("float32")
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="binary_crossentropy", jit_compile=False)
    history = model.fit(data_x, data_y, batch_size=2, epochs=epochs, shuffle=False, verbose=0)
    return history.history["loss"], [v.numpy() for v in model.trainable_variables]


@pytest.mark.parametrize("policy", ["recompute", "offload"])
def test_fit_matches_keep(policy):
    ref_loss, ref_weights = _fit(make_model("keep"))
    loss, weights = _fit(make_model(policy, wrapper_args={"offload_skips": {"enc0"}}))
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    for a, b in zip(ref_weights, weights):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-7)


def test_functional_model_wraps_blocks_in_layers():
    """On KerasTensors the wrapper adds one LMSBlock layer per block, owning its weights."""
    keras.utils.set_random_seed(1)
    ref = tiny_functional_unet(BlockWrapper({}))  # every block kept
    keras.utils.set_random_seed(1)
    model = tiny_functional_unet(BlockWrapper(MIXED_PLAN, offload_skips={"enc0"}))
    assert [layer.name for layer in model.layers[1:]] == BLOCKS
    assert all(isinstance(layer, LMSBlock) for layer in model.layers[1:])
    # conv+GN x5 blocks (3 each) + 2 transposed-conv (kernel, bias) + head conv (kernel, bias)
    assert len(model.trainable_variables) == len(ref.trainable_variables) == 5 * 3 + 2 * 2 + 2
    model.set_weights(ref.get_weights())
    ref_loss, ref_weights = _fit(ref)
    loss, weights = _fit(model)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    for a, b in zip(ref_weights, weights):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-7)
    # Inference runs the layers directly (no tape: nothing to save).
    np.testing.assert_allclose(
        model.predict(np.ones((1, *SHAPE[1:]), "float32"), verbose=0),
        ref.predict(np.ones((1, *SHAPE[1:]), "float32"), verbose=0),
        rtol=1e-6,
    )


def test_stats_count_bytes_and_flops_per_pass():
    stats = OffloadStats(flops_per_block={"enc0": 1000, "dec1": 10})
    model = make_model(MIXED_PLAN, wrapper_args={"offload_skips": {"enc0"}, "stats": stats})
    stats.reset()
    _fit(model, epochs=1)  # 2 steps of batch 2; Keras traces with a None batch
    f = 4  # filters; float32 = 4 bytes
    per_example = 4 * (
        8**3 * 2  # enc0 input (offload)
        + 8**3 * f  # enc0 output, skip to host
        + 2**3 * 4 * f
        + 4**3 * 2 * f  # dec1 inputs: bottleneck output, enc1 output (offload)
    )
    result = stats.result()
    assert result["lms_passes"] == 2
    assert result["lms_offloaded_bytes"] == 2 * per_example
    # enc0 recomputed (offload) and dec1 (offload), dec0 has no FLOPs given; batch 2.
    assert result["lms_recomputed_flops"] == 2 * (1000 + 10)
    stats.reset()
    assert stats.result()["lms_passes"] == 0


def test_inference_adds_no_lms_ops(x):
    model = make_model("offload", wrapper_args={"offload_skips": {"enc0"}})
    graph = tf.function(lambda x: model(x)).get_concrete_function(x).graph
    assert not [op.name for op in graph.get_operations() if "lms_" in op.name]


# ---------------------------------------------------------------------------------------
# Refusals and argument checks
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("compiled", [False, True])
def test_batchnorm_in_recompute_block_is_refused(compiled, x):
    keras.utils.set_random_seed(1)
    bn = layers.BatchNormalization(name="enc1_bn")
    model = TinyUNet(BlockWrapper({"enc1": "recompute"}), extra={"enc1": bn})
    model(x)  # inference: fine
    with pytest.raises(RecomputeError, match=r"enc1.*BatchNormalization.*model.norm=instance"):
        gradients(model, x, compiled=compiled)


def test_batchnorm_in_kept_block_is_fine(x):
    keras.utils.set_random_seed(1)
    model = TinyUNet(BlockWrapper({"enc0": "recompute"}), extra={"enc1": layers.BatchNormalization(name="enc1_bn")})
    model(x)
    assert all(np.all(np.isfinite(g)) for g in gradients(model, x))


def test_state_write_in_recompute_block_is_refused_in_graph_mode(x):
    """A layer the static scan cannot see (a closure over a plain variable) is caught from
    the ops of the traced forward pass."""
    keras.utils.set_random_seed(1)
    model = make_model({"enc0": "keep"})
    counter = tf.Variable(0.0, trainable=False)
    inner = model.applies["enc1"]

    def counting_apply(*inputs):
        counter.assign_add(1.0)
        return inner(*inputs)

    model.applies["enc1"] = counting_apply
    model.wrapper.policies["enc1"] = "recompute"
    with pytest.raises(RecomputeError, match=r"enc1.*AssignAddVariableOp"):
        gradients(model, x)


def test_dropout_in_recompute_block_is_refused():
    assert find_recompute_unsafe_layers(block_apply([layers.Dropout(0.5, name="d")])) == ["d (Dropout)"]
    assert find_recompute_unsafe_layers(block_apply(make_tiny_blocks()["enc0"])) == []


def test_xla_is_refused(x):
    model = make_model("recompute")

    @tf.function(jit_compile=True)
    def step(x):
        with tf.GradientTape() as tape:
            loss = loss_fn(model(x))
        return tape.gradient(loss, model.trainable_variables)

    with pytest.raises(RuntimeError, match="jit_compile=False"):
        step.get_concrete_function(x)


def test_bad_arguments():
    with pytest.raises(ValueError, match=r"one of keep, recompute, offload.*'enc0': 'swap'"):
        BlockWrapper({"enc0": "swap"})
    with pytest.raises(ValueError, match="lms.prefetch"):
        BlockWrapper({}, prefetch=-1)


# ---------------------------------------------------------------------------------------
# MirroredStrategy with 2 logical CPU replicas (own process: devices are fixed at TF start)
# ---------------------------------------------------------------------------------------

MIRRORED_SCRIPT = r"""
import json, os
import numpy as np
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 3)
import keras
from brats_seg.lms.runtime.offload import BlockWrapper
from brats_seg.lms.runtime.stats import OffloadStats
from tests.unit.test_offload import BLOCKS, MIXED_PLAN, SHAPE, TinyUNet, loss_fn

strategy = tf.distribute.MirroredStrategy(["/CPU:1", "/CPU:2"])  # host: /CPU:0
x = tf.constant(np.random.default_rng(0).standard_normal((2, *SHAPE[1:])).astype("float32"))
out = {}
for name, plan in [("keep", {}), ("offload", {b: "offload" for b in BLOCKS}), ("mixed", MIXED_PLAN)]:
    keras.utils.set_random_seed(1)
    with strategy.scope():
        stats = OffloadStats()
        skips = {"enc0"} if plan else None
        model = TinyUNet(BlockWrapper(plan, host_device="/CPU:0", offload_skips=skips, stats=stats))
        model(x[:1])

    @tf.function(jit_compile=False)
    def step(x):
        def replica_step(x):
            with tf.GradientTape() as tape:
                loss = loss_fn(model(x))
            return tape.gradient(loss, model.trainable_variables)
        return strategy.run(replica_step, args=(x,))

    dist_x = strategy.experimental_distribute_values_from_function(lambda ctx: x[ctx.replica_id_in_sync_group:][:1])
    per_replica = step(dist_x)
    out[name] = {"grads": [[t.numpy().tolist() for t in strategy.experimental_local_results(g)] for g in per_replica],
                 "stats": stats.result()}
    graph = step.get_concrete_function(dist_x).graph
    # every release (host) op must be gated by a signal of its own replica's device
    out[name]["releases"] = [
        (op.name, op.device, [c.device for c in op.control_inputs])
        for op in graph.get_operations() if op.name.endswith("release") or "/release_" in op.name
    ]
print(json.dumps(out))
"""


def _run_script(script: str, timeout: int = 240) -> dict:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, env=env, timeout=timeout
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_mirrored_strategy_two_logical_cpus():
    out = _run_script(MIRRORED_SCRIPT)
    ref = out["keep"]["grads"]
    for name in ("offload", "mixed"):  # mixed: offload, recompute and keep blocks
        got = out[name]["grads"]
        for g_ref, g in zip(ref, got):
            for replica in (0, 1):
                a, b = np.asarray(g_ref[replica]), np.asarray(g[replica])
                np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-7 * float(np.max(np.abs(a))), err_msg=name)
    assert out["offload"]["stats"]["lms_passes"] == 2  # one step x two replicas
    assert out["offload"]["stats"]["lms_offloaded_bytes"] > 0
    releases = out["offload"]["releases"]
    assert len(releases) >= 2 * len(BLOCKS)
    for name, device, control_devices in releases:
        assert device.endswith("CPU:0"), name  # the host
        replica_device = "CPU:2" if name.startswith("replica_1/") else "CPU:1"
        assert control_devices and all(d.endswith(replica_device) for d in control_devices), (name, control_devices)
