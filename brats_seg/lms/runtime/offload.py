"""Block-level Large Model Support: keep, recompute or offload a U-Net block's activations.

Tensors are channels-last ``(batch, x, y, z, channels)`` throughout.

:class:`BlockWrapper` is the ``block_wrapper(block_name, apply_fn, inputs)``
that the U-Net builder calls once per block (``enc0 .. bottleneck .. dec0, head``, in
forward order). Per block the plan says:

``keep``
    ``apply_fn(*inputs)``: TensorFlow keeps whatever the block's gradients need.
``recompute``
    A ``tf.custom_gradient`` over the block inputs. Forward runs ``apply_fn`` with the
    gradient tapes of the thread stopped, so no internal activation is referenced by the
    backward pass; backward re-runs ``apply_fn`` under a ``tf.GradientTape`` on the kept
    inputs and returns gradients for the inputs and the block's variables.
``offload``
    The same, but forward copies the inputs to ``host_device`` and keeps only the host
    copies; backward copies them back to the compute device and recomputes.

Scheduling (graph mode: one ``tf.function`` holding forward and backward, as Keras'
train step does). The executor runs a node as soon as its inputs are ready; it knows
no "backward phase". Control dependencies therefore carry the plan:

* the copy back of block ``A`` waits for the gradient reaching block ``B``, the block
  ``prefetch`` positions later in forward order (``prefetch`` blocks earlier in the
  backward order). It is built inside ``B``'s backward under
  ``tf.control_dependencies`` on a ``NoOp`` ``lms_<B>_grad_start`` that depends on
  ``B``'s incoming gradient. The last ``prefetch`` blocks wait for their own gradient.
* the dependency sits on a host-side ``release`` Identity as well as on the device-side
  ``copy_back``: after partitioning, a cross-device edge is a ``_Send``/``_Recv`` pair
  whose ``_Recv`` has no inputs and is posted at step start, so gating only the device
  op would let the data arrive as soon as the host copy exists.
* the recomputation waits for the block's own incoming gradient; otherwise the
  recomputed activations would be ready, computed and held during forward, and
  Grappler's common-subexpression elimination could merge them with the forward ones.

``A`` and ``B`` meet through a Python object shared by their closures: each forward pass
(per graph and thread, so each ``MirroredStrategy`` replica has its own) records its block
calls in order, and ``B``'s backward issues ``A``'s copy back.

Kept tails: for a block named in ``keep_tails`` whose ``apply_fn`` has a ``split =
(front, tail)`` (``apply == tail(front(...))``, as ``brats_seg.model.unet3d.Block``),
only ``front`` runs under the recompute/offload policy; ``tail`` (its last conv unit) runs
normally and TensorFlow keeps what it saves. Meant for the last block before the head:
its backward follows its forward at once, so recomputing its tail would rebuild tensors
that would otherwise have lived only a moment longer, and the peak of its backward
(``front``'s recomputation) no longer holds the tail's tensors. The last segment of
PyTorch's ``checkpoint_sequential`` is not checkpointed for the same reason.

Skips: blocks named in ``offload_skips`` send their output to the host when produced; a
later block (not the next one) taking that tensor among its ``inputs`` gets a copy back
issued when the block ``prefetch`` positions before it starts (a dependency on that
block's inputs). An ``offload`` consumer reuses the host copy instead of copying again.

Grappler (default options): the dependency optimizer removes a forward ``to_host``
Identity whose only consumer is on the host; the transfer still happens in forward
because the consumer (``release``) is on the host. ``release`` itself is kept.

Eager mode: numerically the same, no memory guarantee. Control dependencies are no-ops;
``B``'s backward still issues ``A``'s copy back early, but TensorFlow's eager
``custom_gradient`` keeps each block's output alive in its backward closure.

Functional models: on symbolic ``KerasTensor`` inputs the wrapper returns the output of
an :class:`LMSBlock` layer named after the block, whose ``call`` applies the policy when
the model runs; it tracks the block's layers (weights belong to the model).

Refused in recompute/offload blocks (:mod:`brats_seg.lms.runtime.recompute_safety`): layers whose
forward writes state, and XLA. Counters: :class:`brats_seg.lms.runtime.stats.OffloadStats`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import keras
import tensorflow as tf

# Private TF module, pinned by the tensorflow 2.21 requirement: no public TF2 API stops
# the tapes of the current thread or tells whether a tape is recording / watching.
from tensorflow.python.eager import record as _tape

from brats_seg.lms.planner.timeline import POLICIES  # the planner names the policies; the wrapper runs them
from brats_seg.lms.runtime.passes import BlockCall, ForwardPass
from brats_seg.lms.runtime.recompute_safety import check_layers, check_new_ops, check_not_xla
from brats_seg.lms.runtime.stats import OffloadStats

__all__ = ["POLICIES", "BlockWrapper", "LMSBlock"]

logger = logging.getLogger(__name__)


def _default_compute_device() -> str:
    return "/GPU:0" if tf.config.list_logical_devices("GPU") else "/CPU:0"


def _current_graph() -> Any:
    return None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()


# ---------------------------------------------------------------------------------------
# The wrapper
# ---------------------------------------------------------------------------------------


class BlockWrapper:
    """Runs U-Net blocks under a keep/recompute/offload plan.

    Call as ``wrapper(block_name, apply_fn, inputs) -> output``; ``apply_fn(*inputs)`` runs
    the block's (already built) Keras layers. Blocks missing from the plan are kept.

    Args:
        policies: block name -> ``keep`` | ``recompute`` | ``offload``; missing blocks are kept.
        host_device: where offloaded tensors live.
        prefetch: a block's copy back is issued when the gradient reaches the block this
            many positions later in forward order (``0``: when its own gradient arrives).
        offload_skips: block names whose OUTPUT (a skip that a later block receives among
            its ``inputs``) stays on the host between producer and consumer. Useful when the
            producer is recompute/offload (a kept block's last ReLU keeps its output anyway).
        stats: optional :class:`OffloadStats` counting bytes offloaded and FLOPs recomputed.
        compute_device: device for copies back; default: the device the block ran on (its
            output's placement), else ``/GPU:0`` if any GPU is visible, else ``/CPU:0``.
        block_layers: optional block name -> layers, checked (like what ``apply_fn``
            references) for BatchNormalization and random layers.
        keep_tails: block names whose ``apply_fn.split`` tail (last conv unit) is kept
            while the front follows the block's policy (``Plan.keep_tails``).

    Raises:
        ValueError: an unknown policy or a negative ``prefetch``.
    """

    def __init__(
        self,
        policies: Mapping[str, str],
        host_device: str = "/CPU:0",
        prefetch: int = 1,
        offload_skips: set[str] | None = None,
        stats: OffloadStats | None = None,
        compute_device: str | None = None,
        block_layers: Mapping[str, Iterable] | None = None,
        keep_tails: set[str] | None = None,
    ):
        bad = {name: p for name, p in policies.items() if p not in POLICIES}
        if bad:
            raise ValueError(f"LMS policies must be one of {', '.join(POLICIES)}, got {bad}. Fix the plan.")
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
            raise ValueError(f"lms.prefetch must be an integer >= 0 (blocks ahead), got {prefetch!r}.")
        self.policies = dict(policies)
        self.host_device = host_device
        self.prefetch = prefetch
        self.offload_skips = set(offload_skips or ())
        self.stats = stats
        self.compute_device = compute_device
        self.block_layers = dict(block_layers or {})
        self.keep_tails = set(keep_tails or ())
        self._passes: dict[int, ForwardPass] = {}  # thread id -> its latest forward pass
        self._lock = threading.Lock()
        self._checked: set[str] = set()  # blocks whose layers were checked
        self._told: set[str] = set()  # one-off log messages already given

    def __call__(self, block_name: str, apply_fn: Callable, inputs: Sequence | Any) -> Any:
        inputs = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
        if any(isinstance(x, keras.KerasTensor) for x in inputs):  # functional model construction
            return LMSBlock(self, block_name, apply_fn, getattr(apply_fn, "layers", ()))(inputs)
        return self.run(block_name, apply_fn, inputs)

    def run(self, block_name: str, apply_fn: Callable, inputs: list) -> tf.Tensor:
        """Run one block on concrete (eager or graph) tensors under its policy.

        Args:
            block_name: ``enc0`` .. ``head``.
            apply_fn: ``apply_fn(*inputs) -> (B, x, y, z, C)``.
            inputs: ``[x]`` or ``[x, skip]``, each ``(B, x, y, z, C)``.

        Returns:
            The block output ``(B, x', y', z', C')``.
        """
        policy = self.policies.get(block_name, "keep")
        if not _tape.could_possibly_record():  # inference / shape inference: nothing to save
            return apply_fn(*inputs)
        if policy != "keep":
            check_not_xla(block_name, policy)
            if block_name not in self._checked:
                check_layers(block_name, policy, apply_fn, self.block_layers.get(block_name))
                self._checked.add(block_name)
                logger.debug(
                    "LMS block %s: %s (host %s, prefetch %d)", block_name, policy, self.host_device, self.prefetch
                )
            if tf.executing_eagerly():
                self._tell_once(
                    "eager",
                    logging.INFO,
                    "LMS runs eagerly: gradients are exact but activations are not freed early; train "
                    "inside tf.function (model.fit without run_eagerly=True) to save memory.",
                )
        fwd = self._pass_for(block_name)
        call = BlockCall(block_name, len(fwd.calls), policy)
        fwd.calls.append(call)
        if self.stats is not None and call.index == 0:
            self.stats.add_pass()
        inputs = self._fetch_skips(fwd, call, inputs)
        if fwd.graph is not None:
            call.inputs = inputs
        split = getattr(apply_fn, "split", None) if block_name in self.keep_tails else None
        if policy == "keep":
            y = apply_fn(*inputs)
        elif split is not None:  # front under the policy, tail kept
            front, tail = split
            y = tail(self._custom_gradient_block(fwd, call, front, inputs))
        else:
            y = self._custom_gradient_block(fwd, call, apply_fn, inputs)
        target = call.index - self.prefetch
        if self.prefetch > 0 and target >= 0 and fwd.calls[target].policy == "offload":
            call.prefetch_for.append(fwd.calls[target])
            if policy == "keep":
                y = self._grad_start_marker(call, y)
        if block_name in self.offload_skips:
            self._send_skip(fwd, call, y)
        return y

    def reset(self) -> None:
        """Forget recorded forward passes (each is replaced by the next pass anyway)."""
        with self._lock:
            self._passes.clear()

    def _tell_once(self, key: str, level: int, message: str, *args) -> None:
        if key not in self._told:
            self._told.add(key)
            logger.log(level, message, *args)

    def _pass_for(self, block_name: str) -> ForwardPass:
        """This thread's current forward pass; a new one on a new graph or a repeated block."""
        graph = _current_graph()
        with self._lock:
            fwd = self._passes.get(threading.get_ident())
            if fwd is None or fwd.graph is not graph or fwd.has(block_name):
                fwd = self._passes[threading.get_ident()] = ForwardPass(graph)
            return fwd

    # -- recompute / offload -------------------------------------------------------------

    def _custom_gradient_block(self, fwd: ForwardPass, call: BlockCall, apply_fn: Callable, inputs: list):
        offload = call.policy == "offload"
        needs_grad = [_tape.should_record_backprop([x]) for x in inputs]  # e.g. not the image
        if self.stats is not None:  # counted outside the block: its forward must not write state
            self.stats.add_recomputed(call.name, inputs[0])
            if offload:
                self.stats.add_offloaded([x for x in inputs if fwd.host_of.get(x) is None])
        wrapper = self

        @tf.custom_gradient
        def block(*xs):
            graph = _current_graph()
            first_op = len(graph.get_operations()) if graph is not None else 0
            with _tape.stop_recording():  # nothing in here is recorded, so nothing is kept
                if offload:
                    with tf.name_scope(f"lms_{call.name}"):
                        call.host_inputs = [wrapper._host_copy(fwd, x) for x in xs]
                y = apply_fn(*xs)
            if graph is not None:
                check_new_ops(call.name, call.policy, graph.get_operations()[first_op:])
            call.compute_device = wrapper.compute_device or y.device or xs[0].device or _default_compute_device()
            kept = None if offload else list(xs)

            def grad(*dys, variables=None):
                wrapper._on_grad_start(call, dys)
                if offload and call.restored is None:  # no later block issued it: fetch now
                    logger.debug("LMS block %s: copy back issued at its own gradient", call.name)
                    wrapper._copy_back(call, dys)
                xs_back = call.restored if offload else kept
                with tf.name_scope(f"lms_{call.name}_recompute"):
                    with tf.control_dependencies(dys):  # recompute only once the gradient arrives
                        xs_re = [tf.identity(x) for x in xs_back]
                    watched = [x for x, need in zip(xs_re, needs_grad) if need]
                    with tf.GradientTape() as tape:
                        tape.watch(watched)
                        with tf.control_dependencies(dys):
                            y_re = apply_fn(*xs_re)
                    grads = iter(tape.gradient(y_re, watched + list(variables or []), output_gradients=list(dys)))
                    input_grads = [next(grads) if need else None for need in needs_grad]
                    variable_grads = list(grads)
                if tf.executing_eagerly():
                    call.host_inputs = call.restored = None
                return input_grads if variables is None else (input_grads, variable_grads)

            return y, grad

        return block(*inputs)

    def _host_copy(self, fwd: ForwardPass, x: tf.Tensor) -> tf.Tensor:
        """The host copy of block input ``x``: a fetched skip's host copy, else a new one."""
        host = fwd.host_of.get(x)
        if host is not None:
            return host
        with tf.device(self.host_device):
            return tf.identity(x, name="to_host")

    def _grad_start_marker(self, call: BlockCall, y: tf.Tensor) -> tf.Tensor:
        """Identity on a kept block's output whose gradient issues the planned copies back."""
        wrapper = self

        @tf.custom_gradient
        def marker(t):
            def grad(dy):
                wrapper._on_grad_start(call, [dy])
                return dy

            return tf.identity(t), grad

        return marker(y)

    def _on_grad_start(self, call: BlockCall, dys: Sequence[tf.Tensor]) -> None:
        """At the start of ``call``'s backward: issue the copies back planned for now."""
        if not call.prefetch_for:
            return
        signal = None if tf.executing_eagerly() else [tf.group(*dys, name=f"lms_{call.name}_grad_start")]
        for target in call.prefetch_for:
            if target.restored is None and target.host_inputs is not None:
                self._copy_back(target, signal)

    def _copy_back(self, call: BlockCall, control: Sequence | None) -> None:
        with tf.name_scope(f"lms_{call.name}_fetch"):
            call.restored = [self._fetch(h, control, call.compute_device) for h in call.host_inputs]

    def _fetch(self, host: tf.Tensor, control: Sequence | None, compute_device: str) -> tf.Tensor:
        """Copy ``host`` to ``compute_device`` once every op in ``control`` has run.

        ``release`` (host) and ``copy_back`` (device) both carry the dependencies; the
        host-side one is what delays the transfer at run time (see the module docstring).
        """
        with tf.control_dependencies(control or []), tf.device(self.host_device):
            staged = tf.identity(host, name="release")
        # A second context: inside the first, TF would drop the edge as implied by `staged`.
        with tf.control_dependencies(control or []), tf.device(compute_device):
            return tf.identity(staged, name="copy_back")

    # -- skips ---------------------------------------------------------------------------

    def _send_skip(self, fwd: ForwardPass, call: BlockCall, y: tf.Tensor) -> None:
        with tf.device(self.host_device), tf.name_scope(f"lms_{call.name}_skip"):
            host = tf.identity(y, name="to_host")
        call.compute_device = call.compute_device or self.compute_device or y.device or _default_compute_device()
        fwd.skips.put(y, (host, call))
        if self.stats is not None:
            self.stats.add_offloaded([y])

    def _fetch_skips(self, fwd: ForwardPass, call: BlockCall, inputs: list) -> list:
        """Replace host-kept skips among ``inputs`` by copies back issued ``prefetch`` blocks early."""
        if not fwd.skips:
            return inputs
        out = []
        for x in inputs:
            entry = fwd.skips.get(x)
            anchor = call.index - self.prefetch
            if entry is None or call.index == entry[1].index + 1 or anchor <= entry[1].index:
                if entry is not None and call.index > entry[1].index + 1:
                    self._tell_once(
                        f"skip:{entry[1].name}",
                        logging.WARNING,
                        "LMS: lms.prefetch=%d reaches back to %s, so its skip stays on the device for %s; "
                        "lower lms.prefetch or drop %s from the offloaded skips.",
                        self.prefetch,
                        entry[1].name,
                        call.name,
                        entry[1].name,
                    )
                out.append(x)  # not a skip, the very next block, or a fetch planned before the send
                continue
            host, producer = entry
            anchor_inputs = [t for t in inputs if t is not x] if anchor == call.index else fwd.calls[anchor].inputs
            with tf.name_scope(f"lms_{producer.name}_skip_fetch"):
                restored = self._fetch(host, None if fwd.graph is None else anchor_inputs, producer.compute_device)
            fwd.host_of.put(restored, host)
            out.append(restored)
        return out


class LMSBlock(keras.layers.Layer):
    """A Keras layer running one block through a :class:`BlockWrapper` (functional models).

    Tracks the block's layers, so their weights belong to the model. Inputs pass
    unchanged (no dtype conversion); the block's own layers apply their dtype policies.
    Not serialisable to ``.keras`` (it holds a Python callable); weights save normally.

    Args:
        wrapper: the wrapper holding the plan.
        block_name: block name; also the layer name.
        apply_fn: ``apply_fn(*inputs) -> output``.
        block_layers: the block's layers, to track their weights.
    """

    def __init__(
        self, wrapper: BlockWrapper, block_name: str, apply_fn: Callable, block_layers: Iterable = (), **kwargs
    ):
        super().__init__(name=block_name, autocast=False, **kwargs)
        self._convert_input_args = False
        self.wrapper = wrapper
        self.block_name = block_name
        self.apply_fn = apply_fn
        self.block_layers = list(block_layers)
        self.built = True

    def call(self, inputs):
        return self.wrapper.run(self.block_name, self.apply_fn, list(inputs))
