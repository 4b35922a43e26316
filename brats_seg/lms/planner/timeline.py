"""Device memory over one training step under a per-block plan, and where it peaks.

:func:`simulate` runs forward through the blocks, the loss, backward in reverse. Every
tensor is on the device over the union of the intervals in which someone needs it (its
producer kept it, a consumer kept or will recompute from it, an offloaded copy has come
back ``prefetch`` blocks early); gradients of block outputs live from their first producer
in backward to their consumer. The predicted peak is the largest step, and where it
happens is reported. A recomputed or offloaded last block before the head keeps its last
conv unit (:func:`tail_kept`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from brats_seg.lms.planner.cost import NetworkCost
from brats_seg.lms.planner.workload import DEFAULT_PREFETCH, DEFAULT_SIZE_BYTES

__all__ = ["POLICIES", "Timeline", "offloadable", "recomputed_flops", "simulate", "tail_kept"]

POLICIES = ("keep", "recompute", "offload")  # per block


@dataclass(frozen=True)
class Timeline:
    """Predicted device bytes per step of one training step.

    Steps: ``forward <block>`` for each block in order, ``loss``, ``backward <block>``
    in reverse order, and ``validation`` (the forward-only validation pass) when the
    workload validates.

    Attributes:
        steps: step labels.
        total_bytes: predicted bytes in use at each step's worst moment.
        kept_bytes: activations kept across steps (saved tensors, inputs, skips).
        gradient_bytes: activation gradients alive (block outputs' gradients).
        transient_bytes: the working set of the block (or loss) being run.
        persistent: bytes alive the whole step, by kind.
    """

    steps: tuple[str, ...]
    total_bytes: tuple[int, ...]
    kept_bytes: tuple[int, ...]
    gradient_bytes: tuple[int, ...]
    transient_bytes: tuple[int, ...]
    persistent: Mapping[str, int]

    @property
    def peak_index(self) -> int:
        return max(range(len(self.total_bytes)), key=self.total_bytes.__getitem__)

    @property
    def peak_bytes(self) -> int:
        return self.total_bytes[self.peak_index]

    @property
    def peak_at(self) -> str:
        return self.steps[self.peak_index]

    def breakdown(self) -> dict[str, int]:
        """Bytes by kind at the peak step."""
        i = self.peak_index
        return {
            **self.persistent,
            "kept_activation_bytes": self.kept_bytes[i],
            "activation_gradient_bytes": self.gradient_bytes[i],
            "transient_bytes": self.transient_bytes[i],
        }


def offloadable(net: NetworkCost, tensor: str, size_bytes: int) -> bool:
    """Whether ``tensor`` may go to the host: not an input of the step and at least ``size_bytes``."""
    return tensor not in net.pinned and net.tensor_bytes[tensor] >= size_bytes


def tail_kept(net: NetworkCost, i: int, policy: str) -> bool:
    """Whether block ``i`` under ``policy`` keeps its tail (last conv unit) un-recomputed.

    True for the last block before the head when it is recomputed or offloaded: its
    backward follows its forward at once (only the head and the loss run in between),
    so recomputing the tail would save nothing across the step, only cost its FLOPs,
    while recomputing just the front lowers the block's own backward peak (the tail's
    tensors are freed before the front is rebuilt). As PyTorch's
    ``checkpoint_sequential`` leaves its last segment un-checkpointed.
    """
    blk = net.blocks[i]
    return policy != "keep" and blk.tail_start is not None and i == len(net.blocks) - 2


def recomputed_flops(net: NetworkCost, i: int, policy: str) -> float:
    """Forward FLOPs block ``i`` runs again in backward under ``policy`` (its kept tail excluded)."""
    blk = net.blocks[i]
    if policy == "keep":
        return 0.0
    return blk.forward_flops - (blk.tail_forward_flops if tail_kept(net, i, policy) else 0.0)


def simulate(
    net: NetworkCost,
    policies: Sequence[str],
    skip_offloaded: Sequence[bool] | None = None,
    size_bytes: int = DEFAULT_SIZE_BYTES,
    prefetch: int = DEFAULT_PREFETCH,
) -> Timeline:
    """Simulate the device memory of one training step under a per-block plan.

    Args:
        net: cost tables from :func:`~brats_seg.lms.planner.cost.compute_network_cost`.
        policies: ``keep`` | ``recompute`` | ``offload`` per block, forward order.
        skip_offloaded: per block; True on ``dec{l}`` holds its skip tensor in host
            memory between ``enc{l+1}``'s forward and (``prefetch`` blocks before)
            ``dec{l}``'s forward. Ignored elsewhere.
        size_bytes: tensors smaller than this are never offloaded.
        prefetch: blocks ahead at which an offloaded tensor is copied back.

    Returns:
        The :class:`Timeline`.
    """
    blocks, n = net.blocks, len(net.blocks)
    if len(policies) != n:
        raise ValueError(f"need one policy per block ({n}), got {len(policies)}.")
    bad = [p for p in policies if p not in POLICIES]
    if bad:
        raise ValueError(f"policies must be among {', '.join(POLICIES)}, got {bad[0]!r}.")
    skip_offloaded = list(skip_offloaded or [False] * n)
    steps = n * 2 + 1  # t < n forward block t; t == n loss; t > n backward block 2n - t

    def back(i: int) -> int:
        return 2 * n - i

    kept = [0] * steps
    grads = [0] * steps
    transient = [0] * steps
    largest_rebuild = 0  # internals a recomputed block rebuilds in its backward

    def add(arr: list[int], nbytes: int, intervals: Iterable[tuple[int, int]]) -> None:
        alive = [False] * steps
        for start, end in intervals:
            for t in range(max(0, start), min(steps - 1, end) + 1):
                alive[t] = True
        for t in range(steps):
            if alive[t]:
                arr[t] += nbytes

    for tensor, nbytes in net.tensor_bytes.items():
        p, cs = net.producer[tensor], net.consumers[tensor]
        intervals: list[tuple[int, int]] = []
        # Forward: alive until its last forward reader, unless a skip held on the host.
        skip_reader = next((c for c in cs if c < n and blocks[c].skip_input == tensor), None)
        if skip_reader is not None and skip_offloaded[skip_reader] and offloadable(net, tensor, size_bytes):
            others = [c for c in cs if c != skip_reader]
            intervals.append((p, max(others, default=p)))
            intervals.append((max(p + 1, skip_reader - prefetch), skip_reader))
        else:
            intervals.append((p, max(cs)))
        if policies[p] == "keep" and tensor in blocks[p].saved:
            intervals.append((p, back(p)))
        for c in cs:
            if c == n or tensor not in blocks[c].inputs:  # the loss (its own step), Keras' input cast
                continue
            pol = policies[c]
            if pol == "keep":
                if tensor in blocks[c].saved:
                    intervals.append((c, back(c)))
            elif pol == "recompute" or not offloadable(net, tensor, size_bytes):
                intervals.append((c, back(c)))
            else:  # offloaded: back on the device `prefetch` blocks before its backward
                intervals.append((max(n, back(c) - prefetch), back(c)))
        add(kept, nbytes, intervals)
        if tensor not in net.pinned:  # the step's inputs have no gradient
            # Its gradient: from the first reader's backward (accumulated) to its producer's backward.
            add(grads, nbytes, [(back(max(cs)), back(p))])

    for i, blk in enumerate(blocks):
        if policies[i] == "keep":
            add(kept, blk.internal_saved_bytes, [(i, back(i))])
            transient[i] += blk.forward_working_keep_bytes
            transient[back(i)] += blk.backward_working_bytes
        elif tail_kept(net, i, policies[i]):
            # The tail's saved tensors live until its backward, which runs first in the
            # block's backward step; the front is rebuilt once they are freed.
            add(kept, blk.tail_saved_bytes, [(i, back(i) - 1)])
            transient[i] += blk.forward_working_drop_bytes
            transient[back(i)] += max(blk.tail_backward_bytes, blk.front_backward_bytes)
            largest_rebuild = max(largest_rebuild, blk.internal_saved_bytes - blk.tail_saved_bytes)
        else:
            transient[i] += blk.forward_working_drop_bytes
            transient[back(i)] += blk.internal_saved_bytes + blk.backward_working_bytes
            largest_rebuild = max(largest_rebuild, blk.internal_saved_bytes)
    transient[n] += net.loss_bytes

    mm = net.memory_model
    factor = mm.activation_factor
    # Rebuilt tensors leave freed chunks of their sizes in the pool that later, differently
    # sized tensors only partly reuse: the largest rebuild's share stays resident.
    rebuild = int(mm.rebuild_runtime_bytes + mm.rebuild_fragmentation * largest_rebuild) if largest_rebuild else 0
    fixed = net.persistent_bytes
    total = tuple(int(fixed + factor * (kept[t] + grads[t] + transient[t]) + rebuild) for t in range(steps))
    labels = (
        *(f"forward {b.name}" for b in blocks),
        "loss",
        *(f"backward {b.name}" for b in reversed(blocks)),
    )
    if net.validation_bytes is not None:  # the run's validation pass, between epochs: no LMS, nothing kept
        # TensorFlow's allocator keeps the training step's high-water resident (it never returns
        # memory to the system): the validation's tensors reuse it, and its NumPy arrays come on top
        val = int(factor * net.validation_bytes)
        trained = max(total) - fixed if total else 0
        kept.append(val)
        grads.append(0)
        transient.append(0)
        total = (*total, int(fixed + max(trained, val + rebuild) + net.validation_host_bytes))
        labels = (*labels, "validation")

    def scaled(arr: list[int]) -> tuple[int, ...]:
        return tuple(int(factor * v) for v in arr)

    return Timeline(labels, total, scaled(kept), scaled(grads), scaled(transient), dict(net.persistent))
