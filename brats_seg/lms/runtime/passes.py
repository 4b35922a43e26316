"""Bookkeeping of one forward pass of the LMS block wrapper (:mod:`brats_seg.lms.runtime.offload`).

Each forward pass (per graph and thread, so each ``MirroredStrategy`` replica has its own)
records its block calls in order; a later block's backward finds an earlier block's call
here to issue its copy back.
"""

from __future__ import annotations

import dataclasses
import weakref
from typing import Any

import tensorflow as tf

__all__ = ["BlockCall", "ForwardPass", "TensorMap"]


class TensorMap:
    """Tensor -> value by identity, without keeping the tensor alive (eager memory)."""

    def __init__(self):
        self._items: dict[int, tuple[weakref.ref, Any]] = {}

    def put(self, tensor: tf.Tensor, value: Any) -> None:
        self._items[id(tensor)] = (weakref.ref(tensor), value)

    def get(self, tensor: Any) -> Any:
        item = self._items.get(id(tensor))
        return item[1] if item is not None and item[0]() is tensor else None

    def __bool__(self) -> bool:
        return bool(self._items)


@dataclasses.dataclass(eq=False)
class BlockCall:
    """One block call in one forward pass, shared by its forward and backward closures."""

    name: str
    index: int  # position in forward order within the pass
    policy: str
    inputs: list = dataclasses.field(default_factory=list)  # graph mode: anchors for skip fetches
    compute_device: str = ""  # where the block runs; copies back go there
    host_inputs: list | None = None  # offload: host copies of the inputs
    restored: list | None = None  # offload: copies back (issued by a later block's backward)
    prefetch_for: list = dataclasses.field(default_factory=list)  # calls fetched at our grad start


@dataclasses.dataclass(eq=False)
class ForwardPass:
    """The block calls of one forward pass, in forward order."""

    graph: Any
    calls: list = dataclasses.field(default_factory=list)
    skips: TensorMap = dataclasses.field(default_factory=TensorMap)  # skip output -> (host, producer)
    host_of: TensorMap = dataclasses.field(default_factory=TensorMap)  # fetched skip -> its host copy

    def has(self, name: str) -> bool:
        return any(c.name == name for c in self.calls)
