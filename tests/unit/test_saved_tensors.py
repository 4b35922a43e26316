"""What the traced training step keeps for backward: bfloat16 where the maths allows, and what
the LMS planner's rules say, byte for byte (brats_seg.lms.runtime.saved_tensors).

Only traces graphs (nothing runs), so it holds on any CPU, with or without native bf16.
"""

from __future__ import annotations

import keras
import pytest

from brats_seg.config import ModelConfig
from brats_seg.lms.planner.cost import compute_network_cost
from brats_seg.lms.planner.memory_model import MemoryModel
from brats_seg.lms.planner.workload import Workload
from brats_seg.lms.runtime.saved_tensors import trace_saved_tensors
from brats_seg.model.unet3d import build_unet3d
from brats_seg.training.losses import SoftDiceBCELoss

SHAPE = (32, 24, 16)  # (x, y, z): small odd-sized levels down to depth 3
LEVELS = {tuple(s // 2**level for s in SHAPE) for level in range(4)}

CONFIGS = [  # (norm, batch, upsample, regions)
    ("instance", 1, "transpose", "nested"),  # the default: fused kernel at one sample
    ("instance", 2, "trilinear", "independent"),  # the XLA path for several samples
    ("group", 1, "transpose", "nested"),
    ("batch", 1, "transpose", "nested"),  # Keras' batch norm, which keeps a float32 copy
]


def _traced(policy, norm, batch, upsample, regions):
    keras.mixed_precision.set_dtype_policy(policy)
    try:
        cfg = ModelConfig(
            depth=3,
            base_filters=8,
            norm=norm,
            groups=4,
            upsample=upsample,
            out_channels=3,
            region_parents=[-1, 0, 0] if regions == "nested" else [-1, -1, -1],
        )
        kept = trace_saved_tensors(build_unet3d(cfg, SHAPE), SoftDiceBCELoss(), batch, SHAPE, 4, 3)
    finally:
        keras.mixed_precision.set_dtype_policy("float32")
    return cfg, kept


def _planned_kept_bytes(cfg, batch, policy) -> tuple[int, int]:
    """What the planner says the step keeps with every block kept: every tensor some layer
    saves (once), the labels and the kernels' compute-dtype copies; and the slack allowed for
    the norms' statistics, which the planner counts as two float32 numbers per group (per
    channel for instance and batch norm) and sample where a kernel may keep up to twice that
    and a few scalars."""
    net = compute_network_cost(Workload(cfg, SHAPE, batch, policy), MemoryModel())
    saved = {t: blk.tensor_bytes[t] for blk in net.blocks for t in blk.saved}
    stats = [
        blk.tensor_bytes[f"{layer.output}_stats"] for blk in net.blocks for layer in blk.layers if layer.kind == "norm"
    ]
    slack = sum(stats) + 16 * len(stats)
    return sum(saved.values()) + net.tensor_bytes["labels"] + net.persistent["weight_cast_bytes"], slack


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
@pytest.mark.parametrize("norm, batch, upsample, regions", CONFIGS)
def test_planner_keeps_what_the_traced_graph_keeps(policy, norm, batch, upsample, regions):
    cfg, kept = _traced(policy, norm, batch, upsample, regions)
    planned, slack = _planned_kept_bytes(cfg, batch, policy)
    traced = sum(t.nbytes for t in kept)
    assert abs(traced - planned) <= slack, (traced, planned, slack)


@pytest.mark.parametrize("norm, batch, upsample, regions", [c for c in CONFIGS if c[0] != "batch"])
def test_bf16_keeps_every_activation_in_bfloat16_at_half_the_bytes(norm, batch, upsample, regions):
    """Under backend.precision=bf16 every feature map kept for backward is bfloat16: float32
    is kept only for the head's region probabilities (out_channels at the input grid) and
    statistics; and the same activations take exactly half the bytes of float32's."""
    _cfg, f32 = _traced("float32", norm, batch, upsample, regions)
    _, bf16 = _traced("mixed_bfloat16", norm, batch, upsample, regions)
    head_bytes = batch * SHAPE[0] * SHAPE[1] * SHAPE[2] * 3 * 4  # one float32 head-sized tensor
    wide_f32 = [(t.name, t.shape) for t in bf16 if t.dtype == "float32" and t.nbytes > head_bytes]
    assert not wide_f32, f"float32 feature maps kept under bf16: {wide_f32}"
    assert {t.dtype for t in bf16 if t.nbytes > head_bytes} == {"bfloat16"}

    def activations(kept):  # feature maps: all but the head's float32 outputs and the labels
        return sum(
            t.nbytes
            for t in kept
            if len(t.shape) == 5
            and t.shape[0] == batch
            and t.shape[1:4] in LEVELS
            and t.dtype != "uint8"
            and not t.name.startswith("unet3d_1/head_sigmoid")
        )

    assert 2 * activations(bf16) == activations(f32)


def test_bf16_keeps_a_float32_copy_only_with_keras_batch_norm():
    """model.norm=batch is Keras' BatchNormalization, which upcasts and keeps float32: the
    planner's batch-norm rule says so, and the graph shows it (the instance and group norms
    of brats_seg.model.norm do not)."""
    _, bf16 = _traced("mixed_bfloat16", "batch", 1, "transpose", "nested")
    per_norm = SHAPE[0] * SHAPE[1] * SHAPE[2] * 8 * 4  # enc0's float32 norm input (8 channels)
    assert any(t.dtype == "float32" and t.nbytes == per_norm and "enc0_norm1" in t.name for t in bf16)
