"""What makes a block unsafe to recompute, and the checks that refuse it with the fix.

A recompute/offload block runs its forward twice (forward pass, then again in backward).
Refused: layers whose forward writes state (BatchNormalization moving statistics,
Dropout's seed generator, stateful random ops), which would run twice with different
results, and XLA (``jit_compile=True``), which ignores host placements and may merge the
recomputation with the forward pass.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import keras
import tensorflow as tf

# Private TF module, pinned by the tensorflow 2.21 requirement: no public TF2 API tells
# whether the current graph is inside an XLA context.
from tensorflow.python.ops import control_flow_util as _cf_util

__all__ = ["RecomputeError", "check_layers", "check_new_ops", "check_not_xla", "find_recompute_unsafe_layers"]

# Graph ops that change state: run twice (forward + recompute) they corrupt training.
_WRITE_OP_PREFIXES = ("Assign", "ResourceScatter", "ResourceApply", "ResourceSparseApply")
_STATEFUL_RANDOM_OPS = frozenset(
    {
        "RandomUniform",
        "RandomUniformInt",
        "RandomStandardNormal",
        "TruncatedNormal",
        "RandomGamma",
        "RandomPoisson",
        "RandomPoissonV2",
        "RandomShuffle",
        "Multinomial",
    }
)


class RecomputeError(ValueError):
    """A block planned for recompute/offload cannot be recomputed safely."""

    # AutoGraph re-raises errors from a traced function with their own type only if the
    # type uses Exception.__init__ (else it raises a StagingError); keep the type visible.
    __init__ = Exception.__init__


def find_recompute_unsafe_layers(obj: Any, _depth: int = 0, _seen: set | None = None) -> list[str]:
    """Layers reachable from ``obj`` that must not be recomputed, as ``"name (Class)"``.

    Unsafe: BatchNormalization (moving statistics updated twice) and layers owning a
    ``seed_generator`` (Dropout & co.: a different mask in the recomputation). Looks
    through Keras layers and their sub-layers, a ``.layers`` attribute (``Block``), bound
    methods, ``functools.partial``, closures, dataclasses, lists, tuples and dicts.

    Args:
        obj: an ``apply_fn``, a layer, or a container of them.

    Returns:
        Descriptions, possibly empty.
    """
    seen = set() if _seen is None else _seen
    if _depth > 6 or id(obj) in seen or obj is None or isinstance(obj, (str, bytes, int, float, type)):
        return []
    seen.add(id(obj))
    if isinstance(obj, keras.layers.Layer):
        return [
            f"{layer.name} ({type(layer).__name__})"
            for layer in obj._flatten_layers(include_self=True, recursive=True)
            if "BatchNormalization" in type(layer).__name__ or getattr(layer, "seed_generator", None) is not None
        ]
    if isinstance(obj, dict):
        children = list(obj.values())
    elif isinstance(obj, (list, tuple, set, frozenset)):
        children = list(obj)
    elif isinstance(obj, functools.partial):
        children = [obj.func, *obj.args, *obj.keywords.values()]
    else:
        children = [getattr(obj, a, None) for a in ("layers", "__self__", "__wrapped__")]
        if dataclasses.is_dataclass(obj):
            children += [getattr(obj, f.name) for f in dataclasses.fields(obj)]
        for cell in getattr(obj, "__closure__", None) or ():
            try:
                children.append(cell.cell_contents)
            except ValueError:  # empty cell
                pass
    return [found for child in children for found in find_recompute_unsafe_layers(child, _depth + 1, seen)]


def check_layers(block_name: str, policy: str, apply_fn: Callable, layers: Iterable | None) -> None:
    unsafe = sorted(set(find_recompute_unsafe_layers([apply_fn, list(layers or [])])))
    if not unsafe:
        return
    if any("BatchNormalization" in u for u in unsafe):
        fix = "Use model.norm=instance or model.norm=group, or plan 'keep' for this block."
        why = "recomputing would update the BatchNormalization moving statistics twice per step"
    else:
        fix = "Move that layer out of the block, or plan 'keep' for this block."
        why = "the recomputation would draw a different random mask than the forward pass"
    raise RecomputeError(
        f"block {block_name!r} is planned as {policy!r} but contains {', '.join(unsafe)}: {why}. {fix}"
    )


def check_new_ops(block_name: str, policy: str, ops: Sequence[tf.Operation]) -> None:
    """Refuse state writes or stateful random ops in a recomputed block's forward (graph mode)."""
    for op in ops:
        if op.type.startswith(_WRITE_OP_PREFIXES) or op.type in _STATEFUL_RANDOM_OPS:
            raise RecomputeError(
                f"block {block_name!r} is planned as {policy!r} but its forward pass runs the "
                f"stateful op {op.name!r} ({op.type}), e.g. BatchNormalization statistics or a "
                "Dropout seed update; recomputing would run it twice with different results. "
                "Move that layer out of the block, or plan 'keep' for this block."
            )


def check_not_xla(block_name: str, policy: str) -> None:
    if not tf.executing_eagerly() and _cf_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()):
        raise RuntimeError(
            f"block {block_name!r} is planned as {policy!r} inside an XLA-compiled function; XLA "
            "ignores host placements and may merge the recomputation with the forward pass. "
            "Compile with jit_compile=False (backend.xla=false) when LMS is on."
        )
