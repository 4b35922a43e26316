"""What a per-block LMS configuration costs: bytes kept and moved, FLOPs recomputed, seconds lost.

A block's overhead is its recomputed FLOPs at the device's rate (on a CPU, the share of
the block's forward time its step-time model predicts) plus the host transfers
that compute does not hide: the copy to the host overlaps the block's own forward, the
copy back the backward of the ``prefetch`` blocks issued before it; a skip held on the
host overlaps the forward of the blocks between its producer and its reader.
"""

from __future__ import annotations

from collections.abc import Sequence

from brats_seg.lms.planner.cost import NetworkCost
from brats_seg.lms.planner.plan import BlockPlan
from brats_seg.lms.planner.timeline import offloadable, recomputed_flops, tail_kept
from brats_seg.lms.planner.workload import LMSOptions

__all__ = ["block_row", "plan_overhead"]


def _forward_s(net: NetworkCost, i: int, options: LMSOptions) -> float:
    if options.time_model is not None:
        return options.time_model.block_forward_s(net, i)
    return net.blocks[i].forward_flops / options.device_flops


def _recompute_s(net: NetworkCost, i: int, recomputed: float, options: LMSOptions) -> float:
    """Seconds to recompute ``recomputed`` of block ``i``'s forward FLOPs (all of it, or its
    front when the tail is kept): that share of the block's forward time."""
    if options.time_model is None or not recomputed:
        return recomputed / options.device_flops
    return _forward_s(net, i, options) * recomputed / max(net.blocks[i].forward_flops, 1.0)


def block_row(net: NetworkCost, i: int, policy: str, skip_offloaded: bool, options: LMSOptions) -> BlockPlan:
    """Account block ``i`` under a policy: kept/moved bytes, recomputed FLOPs, overhead seconds.

    Args:
        net: the cost tables.
        i: block index, forward order.
        policy: ``keep`` | ``recompute`` | ``offload``.
        skip_offloaded: ``dec{l}`` only: its skip waits in host memory.
        options: the options that price transfers and recomputation (``size_bytes``,
            ``prefetch``, ``host_bandwidth_bps``, ``device_flops``).

    Returns:
        The plan's row for the block.
    """
    blk, n = net.blocks[i], len(net.blocks)
    bw, back_factor = options.host_bandwidth_bps, net.memory_model.backward_flops_factor
    moved = [t for t in blk.inputs if offloadable(net, t, options.size_bytes)] if policy == "offload" else []
    recomputed = recomputed_flops(net, i, policy)
    tail = tail_kept(net, i, policy)
    if policy == "keep":
        kept = blk.keep_saved_bytes
    else:
        kept = sum(blk.tensor_bytes[t] for t in blk.inputs if t not in moved) + (blk.tail_saved_bytes if tail else 0)
    overhead = _recompute_s(net, i, recomputed, options)
    moved_one_way = sum(blk.tensor_bytes[t] for t in moved)
    if moved_one_way:
        # To host: overlaps the block's own forward. Back: overlaps the backward of the
        # `prefetch` blocks that run between the copy's issue and this block's backward.
        ahead = range(i + 1, min(n, i + 1 + options.prefetch))
        hide_back = sum(back_factor * _forward_s(net, j, options) for j in ahead)
        overhead += max(0.0, moved_one_way / bw - _forward_s(net, i, options))
        overhead += max(0.0, moved_one_way / bw - hide_back)
    skip_moved = 0
    if skip_offloaded and blk.skip_input and offloadable(net, blk.skip_input, options.size_bytes):
        skip_moved = blk.skip_bytes
        producer = net.producer[blk.skip_input]
        hide_out = sum(_forward_s(net, j, options) for j in range(producer + 1, i))
        hide_in = sum(_forward_s(net, j, options) for j in range(max(producer + 1, i - options.prefetch), i))
        overhead += max(0.0, skip_moved / bw - hide_out) + max(0.0, skip_moved / bw - hide_in)
    return BlockPlan(
        block=blk.name,
        policy=policy,
        kept_bytes=int(kept),
        moved_bytes=int(2 * (moved_one_way + skip_moved)),
        recomputed_flops=recomputed,
        skip_offloaded=bool(skip_moved),
        tail_kept=tail,
        keep_bytes=blk.keep_saved_bytes,
        input_bytes=blk.input_bytes,
        skip_bytes=blk.skip_bytes,
        forward_flops=blk.forward_flops,
        overhead_s=overhead,
    )


def plan_overhead(net: NetworkCost, policies: Sequence[str], skips: Sequence[bool], options: LMSOptions) -> float:
    """Predicted extra seconds per step of a per-block configuration."""
    return sum(block_row(net, i, p, s, options).overhead_s for i, (p, s) in enumerate(zip(policies, skips)))
