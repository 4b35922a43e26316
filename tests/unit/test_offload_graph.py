"""LMS graph structure: what the traced training step holds, and what survives Grappler.

Traced graphs (this process): host ``/CPU:1``, compute ``/CPU:0``. Device strings are
recorded at trace time, so the placement plan is visible without the devices existing.
Forward and backward live in ONE FuncGraph (custom_gradient builds its backward into the
graph that calls ``tape.gradient``; no nested gradient functions); under ``model.fit`` that
graph is Keras' nested ``one_step_on_data`` function in the train function's library.

Run time (own process, 2 logical CPUs): the post-optimization and partition graphs from
RunMetadata, with Grappler at its default options.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import tensorflow as tf

from tests.unit.test_offload import (
    BLOCKS,
    SHAPE,
    _fit,
    _run_script,
    loss_fn,
    make_model,
)

HOST, COMPUTE = "/CPU:1", "/CPU:0"
INTERNAL = re.compile(r"/(enc\d|dec\d|bottleneck|head)_(conv|norm|relu|pool|up|concat|sigmoid|down)")


class Traced:
    """A traced train step: ops split into forward / backward, each block's forward inputs."""

    def __init__(self, policy, **wrapper_args):
        wrapper_args = {"host_device": HOST, "compute_device": COMPUTE, **wrapper_args}
        self.model = model = make_model(policy, wrapper_args=wrapper_args)
        self.block_inputs: dict[str, list] = {}
        for name, apply in list(model.applies.items()):
            model.applies[name] = self._spy(name, apply)
        marks = []

        @tf.function(jit_compile=False)
        def step(x):
            with tf.device(COMPUTE):
                with tf.GradientTape() as tape:
                    loss = loss_fn(model(x))
                marks.append(len(tf.compat.v1.get_default_graph().get_operations()))
                return tape.gradient(loss, model.trainable_variables)

        self.graph = step.get_concrete_function(tf.TensorSpec(SHAPE)).graph
        ops = self.graph.get_operations()
        self.forward, self.backward = ops[: marks[0]], ops[marks[0] :]
        self.backward_set = set(self.backward)

    def _spy(self, name, apply):
        def spy(*inputs):
            self.block_inputs.setdefault(name, list(inputs))  # first call = the forward pass
            return apply(*inputs)

        spy.layers = apply.layers
        if hasattr(apply, "split"):
            spy.split = apply.split
        return spy

    def ops(self, pattern: str) -> list:
        return [op for op in self.graph.get_operations() if re.search(pattern, op.name)]

    def kept(self) -> list:
        """Forward tensors the backward pass consumes (what stays alive between them)."""
        return [t for op in self.forward for t in op.outputs if any(c in self.backward_set for c in t.consumers())]

    def fan_in(self, op) -> set:
        """All ops ``op`` depends on (data and control), transitively."""
        seen, todo = set(), [op]
        while todo:
            node = todo.pop()
            for parent in [t.op for t in node.inputs] + list(node.control_inputs):
                if parent not in seen:
                    seen.add(parent)
                    todo.append(parent)
        return seen


def _on(op, device: str) -> bool:
    """``op`` is placed on ``device`` (``/CPU:1`` matches ``/device:CPU:1`` and full names)."""
    return op.device.endswith(device.split("/")[-1])


# ---------------------------------------------------------------------------------------
# Offload: every saved input crosses to the host in forward
# ---------------------------------------------------------------------------------------


def _host_copy_of(traced: Traced, t):
    """The host Identity holding ``t`` (directly, or the skip copy ``t`` was fetched from)."""
    direct = [c for c in t.consumers() if c.type == "Identity" and _on(c, HOST) and c in traced.forward]
    if direct:
        return direct[0]
    if t.op.name.endswith("copy_back"):  # a fetched skip: copy_back <- release <- to_host
        release = t.op.inputs[0].op
        return release.inputs[0].op if _on(release, HOST) else None
    return None


@pytest.mark.parametrize("skips", [set(), {"enc0", "enc1"}])
def test_offload_sends_every_block_input_to_host_in_forward(skips):
    traced = Traced("offload", offload_skips=skips)
    for name in BLOCKS:
        for t in traced.block_inputs[name]:
            host = _host_copy_of(traced, t)
            assert host is not None, f"{name}: input {t.name} has no host copy"
            assert host.type == "Identity" and _on(host, HOST) and host in traced.forward
    for name in skips:  # skips go to the host as soon as they are produced
        assert traced.ops(rf"lms_{name}_skip/to_host$")
        # ...and the decoder's copy back is reused as the saved input: no second transfer
        level = name[-1]
        skip_input = traced.block_inputs[f"dec{level}"][1]
        assert skip_input.op.name.endswith("copy_back")
        assert not [c for c in skip_input.consumers() if c.type == "Identity" and _on(c, HOST)]


def test_offload_keeps_only_host_copies_for_backward():
    traced = Traced("offload", offload_skips={"enc0"})
    kept = [t for t in traced.kept() if t.op.type not in ("Placeholder", "Const")]
    in_model = [t for t in kept if t.op.name.startswith(traced.model.name)]
    assert in_model, "nothing offloaded?"
    assert all(t.op.type == "Identity" and _on(t.op, HOST) for t in in_model), [t.name for t in in_model]


# ---------------------------------------------------------------------------------------
# Copies back: tied to the planned gradient op, on both host and device side
# ---------------------------------------------------------------------------------------


def _own_gradient_ops(traced: Traced, name: str) -> set:
    """The op(s) producing ``name``'s incoming gradient (what gates its recomputation)."""
    gates = traced.ops(rf"lms_{name}_recompute/Identity(_\d+)?$")
    return {c for op in gates for c in op.control_inputs}


@pytest.mark.parametrize("prefetch", [0, 1, 2])
def test_copy_back_waits_for_gradient_prefetch_blocks_ahead(prefetch):
    traced = Traced("offload", prefetch=prefetch)
    for i, name in enumerate(BLOCKS):
        fetch = traced.ops(rf"lms_{name}_fetch/(release|copy_back)(_\d+)?$")
        assert len(fetch) == 2 * len(traced.block_inputs[name]), name
        partner = BLOCKS[i + prefetch] if prefetch and i + prefetch < len(BLOCKS) else None
        own = _own_gradient_ops(traced, name)
        for op in fetch:
            assert op in traced.backward_set
            assert _on(op, HOST if "release" in op.name else COMPUTE), op.name
            controls = set(op.control_inputs)
            if partner is None:  # the last `prefetch` blocks: their own gradient
                assert controls == own, (op.name, controls, own)
                continue
            signal = traced.graph.get_operation_by_name(f"lms_{partner}_grad_start")
            assert controls == {signal}, (op.name, controls)
            # not at the last moment: the copy back does not wait for its own gradient...
            assert not own & (traced.fan_in(op) | {op}), op.name
            # ...and not at the start of backward: the partner's gradient needs the backward
            # (recomputation) of every block after the partner
            after = BLOCKS[BLOCKS.index(partner) + 1 :]
            depends = traced.fan_in(signal)
            for later in after:
                assert any(d.name.startswith(f"gradient_tape/lms_{later}_recompute/") for d in depends), (name, later)


def test_copy_back_signalled_by_a_kept_block():
    """A kept block has no custom gradient of its own: a marker on its output signals."""
    traced = Traced({"enc1": "offload", "dec0": "offload"})  # partners: bottleneck, head (kept)
    for name, partner, later in [("enc1", "bottleneck", "dec1"), ("dec0", "head", None)]:
        signal = traced.graph.get_operation_by_name(f"lms_{partner}_grad_start")
        assert signal in traced.backward_set
        fetch = traced.ops(rf"lms_{name}_fetch/(release|copy_back)(_\d+)?$")
        assert fetch and all(set(op.control_inputs) == {signal} for op in fetch)
        if later:  # the kept decoder's own backward (its conv's input gradient) comes first
            assert any(
                op.type == "Conv3DBackpropInputV2" and f"{later}_conv1" in op.name for op in traced.fan_in(signal)
            )


# ---------------------------------------------------------------------------------------
# Recompute: nothing inside a block is kept; the backward recomputes it after its gradient
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["keep", "recompute", "offload"])
def test_block_internals_kept_only_when_kept(policy):
    traced = Traced(policy)
    internals = sorted({t.op.name for t in traced.kept() if t.op.type != "Placeholder" and INTERNAL.search(t.op.name)})
    if policy == "keep":
        assert internals, "the keep plan should keep activations (test sanity)"
    else:
        assert internals == []


@pytest.mark.parametrize("policy", ["recompute", "offload"])
def test_kept_tail_is_kept_and_its_front_recomputed(policy):
    """dec0 = [up, concat] + tail [conv1, norm1, relu1]: only the tail's tensors are kept
    for backward, and the backward re-runs the up-sampling but not the tail's conv."""
    traced = Traced(policy, keep_tails={"dec0"})
    internals = {t.op.name for t in traced.kept() if t.op.type != "Placeholder" and INTERNAL.search(t.op.name)}
    assert internals and all(re.search(r"/dec0_(conv1|norm1|relu1)", name) for name in internals), internals
    assert any("dec0_conv1" in name for name in internals)  # the tail's conv output, for the norm's gradient
    recomputed = {op.type for op in traced.ops(r"^lms_dec0_recompute/") if op.type.startswith("Conv3D")}
    assert "Conv3DBackpropInputV2" in recomputed  # the recomputed transposed conv (up)
    assert "Conv3D" not in recomputed  # the tail's conv is not run again
    assert [op for op in traced.backward if op.name.startswith("lms_dec1_recompute/") and op.type == "Conv3D"]


@pytest.mark.parametrize("policy,backward_convs", [("keep", 2), ("recompute", 8), ("offload", 8)])
def test_backward_recomputes_the_convolutions(policy, backward_convs):
    traced = Traced(policy)
    forward = [op for op in traced.forward if op.type == "Conv3D"]
    backward = [op for op in traced.backward if op.type == "Conv3D"]
    assert len(forward) == 6  # one per block
    # 2 are the gradients of the transposed convolutions; recompute adds the 6 blocks' convs
    assert len(backward) == backward_convs
    if policy != "keep":
        for name in BLOCKS:
            assert [op for op in backward if op.name.startswith(f"lms_{name}_recompute/")], name


@pytest.mark.parametrize("policy", ["recompute", "offload"])
def test_recomputation_waits_for_its_incoming_gradient(policy):
    traced = Traced(policy)
    for name in BLOCKS:
        gates = traced.ops(rf"^lms_{name}_recompute/Identity(_\d+)?$")
        assert len(gates) == len(traced.block_inputs[name])
        for gate in gates:
            assert gate.control_inputs and all(c in traced.backward_set for c in gate.control_inputs)
        convs = [op for op in traced.ops(rf"^lms_{name}_recompute/") if op.type == "Conv3D"]
        assert convs and all(set(gates) & traced.fan_in(conv) for conv in convs)


# ---------------------------------------------------------------------------------------
# Under model.fit: the step is Keras' nested one_step_on_data function
# ---------------------------------------------------------------------------------------


def test_fit_step_holds_gated_copies():
    model = make_model("offload", wrapper_args={"host_device": HOST, "compute_device": COMPUTE})
    _fit(model, epochs=1)
    functions = [
        f
        for cell in model.train_function.__closure__
        if hasattr(cell.cell_contents, "_list_all_concrete_functions")
        for concrete in cell.cell_contents._list_all_concrete_functions()
        for f in concrete.graph.as_graph_def().library.function
    ]
    releases = [
        n
        for f in functions
        if "one_step_on_data" in f.signature.name
        for n in f.node_def
        if re.search(r"_fetch/release(_\d+)?$", n.name)
    ]
    assert len(releases) == len(BLOCKS) + 2  # one per block input; dec1 and dec0 take two
    for node in releases:
        assert node.device.endswith("CPU:1")
        assert [i for i in node.input if i.startswith("^")], node.name


# ---------------------------------------------------------------------------------------
# Run time: Grappler (default options) and partitioning, 2 logical CPUs
# ---------------------------------------------------------------------------------------

RUNTIME_SCRIPT = r"""
import json, re
import numpy as np
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
from tensorflow.python.eager import context
from tests.unit.test_offload import SHAPE, loss_fn, make_model

out = {"grappler_options": tf.config.optimizer.get_experimental_options()}
x = tf.constant(np.random.default_rng(0).standard_normal(SHAPE).astype("float32"))

def run(policy, **wrapper_args):
    model = make_model(policy, wrapper_args={"host_device": "/CPU:1", **wrapper_args})

    @tf.function(jit_compile=False)
    def step(x):
        with tf.device("/CPU:0"):
            with tf.GradientTape() as tape:
                loss = loss_fn(model(x))
            return tape.gradient(loss, model.trainable_variables)

    traced = step.get_concrete_function(x).graph
    n_release = sum(1 for op in traced.get_operations() if re.search(r"release(_\d+)?$", op.name))
    context.enable_run_metadata()
    grads = step(x)
    metadata = context.export_run_metadata()
    context.disable_run_metadata()
    fg = max(metadata.function_graphs, key=lambda f: len(f.post_optimization_graph.node))  # the step
    post = fg.post_optimization_graph
    parts = {p.node[0].device[-5:]: p for p in fg.partition_graphs}
    host, dev = parts.get("CPU:1", tf.compat.v1.GraphDef()), parts["CPU:0"]  # keep: no host partition
    host_nodes = {n.name: n for n in host.node}

    def from_device(name, hops=3):  # data input chain reaches a _Recv (sent by the device)
        node = host_nodes.get(name)
        for _ in range(hops):
            if node is None:
                return False
            if node.op == "_Recv":
                return True
            data = [i for i in node.input if not i.startswith("^")]
            node = host_nodes.get(data[0].split(":")[0]) if data else None
        return False

    releases = [n for n in post.node if re.search(r"release(_\d+)?$", n.name)]
    host_releases = [n for n in host.node if re.search(r"release(_\d+)?$", n.name)]
    return {
        "grads": [g.numpy().tolist() for g in grads],
        "traced_releases": n_release,
        "post_releases": len(releases),
        "post_releases_on_host": all(n.device.endswith("CPU:1") for n in releases),
        "post_releases_gated": all(any(i.startswith("^") for i in n.input) for n in releases),
        "host_releases_gated": all(any(i.startswith("^") for i in n.input) for n in host_releases),
        "host_releases_fed_from_device": all(from_device(n.name) for n in host_releases),
        "device_recvs_of_releases": sum(
            1 for n in dev.node if n.op == "_Recv" and re.search(r"release(_\d+)?/_\d+$", n.name)),
        "convs": sum(1 for n in post.node if "Conv3D" in n.op and "Backprop" not in n.op),
    }

out["keep"] = run("keep")
out["recompute"] = run("recompute")
out["offload"] = run("offload", offload_skips={"enc0"})

# The trap: a device-side copy back reading a host Identity, gated only on the device.
@tf.function
def naive(a):
    with tf.device("/CPU:0"):
        b = tf.nn.relu(a)
        with tf.device("/CPU:1"):
            h = tf.identity(b, name="naive_to_host")
        s = tf.reduce_sum(b * 2.0)
        with tf.control_dependencies([s]):
            c = tf.identity(h, name="naive_copy_back")
        return s + tf.reduce_sum(c)

context.enable_run_metadata()
naive(tf.ones((4, 4)))
metadata = context.export_run_metadata()
context.disable_run_metadata()
post = metadata.function_graphs[0].post_optimization_graph
out["naive_nodes"] = sorted(n.name for n in post.node if n.name.startswith("naive"))
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def runtime():
    return _run_script(RUNTIME_SCRIPT)


def test_grappler_defaults_are_used(runtime):
    options = runtime["grappler_options"]
    assert not options.get("disable_meta_optimizer")
    assert not any(v is False for k, v in options.items() if k.endswith("_optimization"))


def test_grappler_removes_a_naive_device_only_copy_back(runtime):
    """Why the host-side ``release`` exists: with the gate only on the device copy, the
    dependency optimizer drops the host Identity (fewer device crossings) - no offload."""
    assert "naive_to_host" not in runtime["naive_nodes"]


def test_offload_copies_survive_grappler_and_partitioning(runtime):
    off = runtime["offload"]
    assert off["traced_releases"] >= len(BLOCKS)
    assert off["post_releases"] == off["traced_releases"]  # none optimized away
    assert off["post_releases_on_host"] and off["post_releases_gated"]
    # after partitioning: each release is on the host partition, still gated (its control
    # input arrives through a _Recv from the compute device), fed by data the compute device
    # sent in forward, and the compute device receives its output (the copy back)
    assert off["host_releases_gated"] and off["host_releases_fed_from_device"]
    assert off["device_recvs_of_releases"] == off["traced_releases"]


def test_recomputation_survives_grappler(runtime):
    """CSE does not merge the recomputed convolutions into the forward ones."""
    assert runtime["keep"]["convs"] == 6 + 2
    assert runtime["recompute"]["convs"] == runtime["offload"]["convs"] == 6 + 2 + 6


def test_runtime_gradients_match_keep(runtime):
    ref = runtime["keep"]["grads"]
    for policy in ("recompute", "offload"):
        for a, b in zip(ref, runtime[policy]["grads"]):
            a, b = np.asarray(a), np.asarray(b)
            np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-7 * float(np.max(np.abs(a))))
