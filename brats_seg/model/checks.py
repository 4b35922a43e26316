"""The rules a model config, an input shape, a batch size and a dtype policy must follow.

Pure Python, no TensorFlow or Keras import (the LMS planner calls them; see
``tests/unit/test_layout.py``). They are checked here once, for everyone that builds or
prices a U-Net: :func:`brats_seg.model.topology.unet_topology` checks the config and the
policy it describes, :func:`brats_seg.model.unet3d.build_unet3d` the config and the input
shape before it makes a layer, and :class:`brats_seg.lms.planner.workload.Workload` every
value it plans with. Each error names the bad value and what to use instead.

Input shapes are spatial, ``(x, y, z)`` of a channels-last ``(batch, x, y, z, channels)``
tensor in RAS; a U-Net of ``depth`` halves them ``depth`` times, so each must be a
multiple of ``2**depth``.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

from brats_seg.choices import check_choice
from brats_seg.config import ModelConfig, Norm, Precision, Upsample

__all__ = [
    "DTYPE_POLICIES",
    "IN_CHANNELS",
    "PRECISION_POLICIES",
    "check_batch_size",
    "check_depth",
    "check_input_shape",
    "check_model_config",
    "check_policy",
    "check_region_parents",
    "check_unet_config",
]

IN_CHANNELS = (1, 4)  # FLAIR only | FLAIR, T1, T1ce, T2
# Keras dtype policy -> the compute dtype of its layers (variables are float32 under each).
DTYPE_POLICIES = {"float32": "float32", "mixed_float16": "float16", "mixed_bfloat16": "bfloat16"}
# backend.precision -> the Keras dtype policy it trains under (the one table; backend.py applies it)
PRECISION_POLICIES = {
    Precision.fp32.value: "float32",
    Precision.bf16.value: "mixed_bfloat16",
    Precision.fp16.value: "mixed_float16",
}


def check_unet_config(cfg: ModelConfig, input_shape: Sequence[int]) -> None:
    """Validate a model config against a spatial input shape.

    Args:
        cfg: the model config.
        input_shape: spatial shape ``(x, y, z)`` of the network input.

    Raises:
        ValueError: naming the bad value and what to use instead.
    """
    check_model_config(cfg)
    check_input_shape(input_shape, cfg.depth)


def check_model_config(cfg: ModelConfig) -> None:
    """Validate the model config alone (:func:`check_unet_config` adds the input shape).

    Raises:
        ValueError: naming the bad value and what to use instead.
    """
    check_depth(cfg.depth)
    if not isinstance(cfg.base_filters, int) or cfg.base_filters < 1:
        raise ValueError(f"model.base_filters must be an integer >= 1, got {cfg.base_filters!r}.")
    if cfg.in_channels not in IN_CHANNELS:
        raise ValueError(f"model.in_channels must be 4 (FLAIR,T1,T1ce,T2) or 1 (FLAIR only), got {cfg.in_channels!r}.")
    if not isinstance(cfg.out_channels, int) or cfg.out_channels < 1:
        raise ValueError(
            f"model.out_channels must be the number of sigmoid outputs (>= 1), got {cfg.out_channels!r}; "
            "0 means one output per region of data.layout and is resolved by "
            "brats_seg.data.labels.resolve_model_outputs before a model is built."
        )
    check_choice(
        cfg.norm,
        Norm,
        "model.norm",
        hint=f"({cfg.norm!r} is not a normalisation this U-Net builds; "
        "instance and group norm keep no running statistics, so a recomputed block stays exact.)",
    )
    if cfg.norm == "group" and (not isinstance(cfg.groups, int) or cfg.groups < 1):
        raise ValueError(f"model.groups must be an integer >= 1 for norm=group, got {cfg.groups!r}.")
    check_choice(cfg.upsample, Upsample, "model.upsample")
    if cfg.region_parents:
        check_region_parents(cfg.region_parents, cfg.out_channels)


def check_input_shape(input_shape: Sequence[int], depth: int) -> tuple[int, int, int]:
    """Validate a spatial input shape for a U-Net of ``depth``; returns it as ints.

    Raises:
        ValueError: not three positive integers, or not divisible by ``2**depth`` (with
            the nearest shapes that are).
    """
    shape = tuple(input_shape)
    if len(shape) != 3 or not all(isinstance(s, numbers.Integral) and s > 0 for s in shape):
        raise ValueError(f"input_shape must be three positive integers (x, y, z), got {input_shape!r}.")
    multiple = 2**depth
    if any(s % multiple for s in shape):
        options = " or ".join(str(s) for s in _nearest_valid_shapes(shape, multiple))
        raise ValueError(
            f"input shape {shape} is not divisible by 2**depth = {multiple} (model.depth={depth}). "
            f"Use a resolution shape of multiples of {multiple}, e.g. {options}, or lower model.depth."
        )
    x, y, z = (int(s) for s in shape)
    return x, y, z


def check_region_parents(parents: Sequence[int], out_channels: int | None = None) -> None:
    """Validate nested-region parents: one per output, each an earlier output or -1.

    Raises:
        ValueError: a count other than ``out_channels``, or a parent not before its region.
    """
    if out_channels is not None and len(parents) != out_channels:
        raise ValueError(f"model.region_parents={list(parents)} must give one parent per output ({out_channels}).")
    if any(p >= r for r, p in enumerate(parents)):
        raise ValueError(f"region parents must come earlier in the output order, got {tuple(parents)!r}.")


def check_batch_size(batch_size: int) -> None:
    """Raises ValueError unless ``batch_size`` is an integer >= 1."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}.")


def check_policy(policy: str) -> str:
    """The Keras dtype policy named by ``policy`` (``fp32``/``fp16``/``bf16`` allowed).

    Raises:
        ValueError: an unknown policy, with the known ones.
    """
    policy = PRECISION_POLICIES.get(policy, policy)
    return check_choice(policy, DTYPE_POLICIES, "dtype policy", hint="(or fp32, fp16, bf16)")


def check_depth(depth: int) -> None:
    """Raises ValueError unless ``depth`` (down-sampling steps) is an integer >= 1."""
    if not isinstance(depth, int) or depth < 1:
        raise ValueError(f"model.depth must be an integer >= 1, got {depth!r}.")


def _nearest_valid_shapes(shape: Sequence[int], multiple: int) -> list[tuple[int, ...]]:
    """The valid shapes just below and just above ``shape`` (each axis a multiple)."""
    below = tuple(max(multiple, (s // multiple) * multiple) for s in shape)
    above = tuple(-(-s // multiple) * multiple for s in shape)
    return sorted({below, above})
