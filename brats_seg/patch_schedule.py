"""The patch schedule (``trainer.patch_schedule``): patches first, the whole volume last.

A schedule is a list of **stages**, each a patch size or ``whole`` (the grid itself), its
**share** of the training and, optionally, its own batch size:

* with ``trainer.time_budget_s`` a share is of the budget's training seconds (wall-clock time,
  validation excluded): a stage ends at the first step past its share, and that epoch is cut
  there, validated and saved, as the budget's end is;
* without a budget a share is of ``trainer.epochs``: stage ``k`` trains the epochs from
  ``round(epochs * (s_1 + ... + s_{k-1}))`` on, each stage at least one.

Stages change only between epochs, so a resumed run is always inside one stage, at an epoch and
step of that stage's data (exact, as for a single patch size). The optimizer, its moments and the
learning-rate schedule run on across stages: one cosine over the whole budget (or over the
steps of all epochs).

The preset ``grow`` derives a schedule from the grid and ``model.depth``
(:func:`grow_stages`): Progressive Growing of Patch Size (Fischer et al., MICCAI 2024), ending
on the whole volume. Its sides start at ``2 * 2**depth`` (a 2^3 bottleneck) and grow by about
1.5x (about 3.4x the voxels) in multiples of ``2**depth``, capped by the grid; a stage holding
:data:`WHOLE_AT` of the grid's voxels or more becomes the whole volume, which ends it. The
whole volume gets half the time (:data:`WHOLE_SHARE`), the patch stages share the other half
equally, and every stage trains at ``trainer.batch_size`` (PGPS's efficiency mode: the patch
stages' steps are cheap, so they make many updates, as the project's 48^3 arm at batch 2 did;
PGPS's performance mode, a batch keeping a step's voxels constant, is a schedule with a
``batch_size`` per stage). These choices were made before any study run, not tuned on one.
Without a budget the shares are turned into epochs by each stage's predicted epoch time (the
step-time model's), so that they mean wall-clock time there too (``brats_seg.resolve``).

Pure Python: read before TensorFlow loads (``brats_seg.resolve``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

__all__ = [
    "GROW",
    "WHOLE",
    "WHOLE_AT",
    "WHOLE_SHARE",
    "Stage",
    "grow_stages",
    "inference_patch",
    "parse_schedule",
    "stage_epochs",
]

GROW = "grow"  # the preset's name: part of the command-line contract
WHOLE = "whole"  # a stage's patch: the grid itself
WHOLE_SHARE = 0.5  # grow's share of the time on the whole volume; the patch stages share the rest
WHOLE_AT = 0.7  # a grown patch holding this share of the grid's voxels or more becomes the whole volume
_GROWTH = 1.5  # grow's side factor per stage
_SHARE_SUM_TOL = 1e-6


@dataclasses.dataclass(frozen=True)
class Stage:
    """One stage of a schedule: ``patch`` (None = the whole volume), its ``share`` of the training
    and the global ``batch_size`` it trains with."""

    patch: tuple[int, int, int] | None
    share: float
    batch_size: int

    @property
    def name(self) -> str:
        """``48x48x48`` or ``whole``: how logs, MLflow and plan.json name the stage."""
        return WHOLE if self.patch is None else "x".join(str(p) for p in self.patch)

    def to_dict(self) -> dict:
        return {
            "patch": WHOLE if self.patch is None else list(self.patch),
            "share": self.share,
            "batch_size": self.batch_size,
        }

    @classmethod
    def from_dict(cls, data: Mapping) -> Stage:
        patch = data["patch"]
        return cls(
            None if patch in (None, WHOLE) else tuple(int(p) for p in patch),
            float(data["share"]),
            int(data["batch_size"]),
        )


def _sides_message(grid: Sequence[int], multiple: int) -> str:
    return "; ".join(
        f"{axis}: {multiple}..{int(s) - int(s) % multiple} in steps of {multiple}" for axis, s in zip("xyz", grid)
    )


def check_patch(
    value, key: str, grid: Sequence[int], depth: int, whole_word: bool = False
) -> tuple[int, int, int] | None:
    """A patch as ``key`` gives it (``trainer.patch_size``, or a stage's ``patch``): None for the
    whole volume (null, or ``whole`` where ``whole_word``), else its 3 sides, each a multiple of
    ``2**depth`` (the U-Net halves it ``depth`` times) and at most the grid on its axis.

    Raises:
        ValueError: naming ``key`` and the allowed sides.
    """
    if value is None or (whole_word and isinstance(value, str) and value.strip().lower() == WHOLE):
        return None
    grid, multiple = [int(g) for g in grid], 2 ** int(depth)
    sides = list(value) if isinstance(value, Sequence) and not isinstance(value, str) else None
    if sides is None or len(sides) != 3 or any(isinstance(p, bool) or not isinstance(p, int) or p < 1 for p in sides):
        raise ValueError(
            f"{key}={value!r}: use {repr(WHOLE) if whole_word else 'null'} or 3 positive sizes [x, y, z]; allowed "
            f"sides at model.depth={depth} on {grid}: {_sides_message(grid, multiple)}."
        )
    if any(p % multiple or p > g for p, g in zip(sides, grid)):
        raise ValueError(
            f"{key}={sides}: each side must be a multiple of 2**model.depth = {multiple} and at "
            f"most resolution.shape={grid}; allowed sides: {_sides_message(grid, multiple)}."
        )
    return tuple(int(p) for p in sides)


def parse_schedule(value, grid: Sequence[int], depth: int, batch_size: int) -> tuple[Stage, ...] | None:
    """``trainer.patch_schedule`` as stages, every value checked; None for none (null or ``[]``).

    Args:
        value: ``grow``, or a list of stages, each ``{patch: whole | [x, y, z], share: s,
            batch_size: b}`` (``batch_size`` optional: ``trainer.batch_size``); shares > 0 summing to 1.
        grid: ``resolution.shape``.
        depth: ``model.depth`` (a patch side is a multiple of ``2**depth``).
        batch_size: ``trainer.batch_size``, the batch of a stage that names none (and grow's reference).

    Raises:
        ValueError: naming the stage and key as the user types them, and what to use.
    """
    if value is None or (isinstance(value, Sequence) and not isinstance(value, str) and len(value) == 0):
        return None
    grid = [int(g) for g in grid]
    if isinstance(value, str):
        if value.strip().lower() != GROW:
            raise ValueError(
                f"trainer.patch_schedule={value!r}: use {GROW!r} (the preset), null (one patch size or "
                "the whole volume: trainer.patch_size) or a list of stages [{patch: [x, y, z] | whole, "
                "share: s, batch_size: b}, ...]."
            )
        return grow_stages(grid, depth, batch_size)
    if not isinstance(value, Sequence):
        raise ValueError(f"trainer.patch_schedule={value!r}: use {GROW!r} or a list of stages.")
    stages = []
    for i, item in enumerate(value):
        where = f"trainer.patch_schedule[{i}]"
        if not isinstance(item, Mapping) or "patch" not in item or "share" not in item:
            raise ValueError(
                f"{where}={item!r}: a stage is {{patch: [x, y, z] | whole, share: s}} with an optional batch_size."
            )
        unknown = sorted(set(item) - {"patch", "share", "batch_size"})
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {unknown}; a stage has patch, share and batch_size.")
        share = item["share"]
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share <= 1:
            raise ValueError(f"{where}.share={share!r}: use a share of the training in (0, 1]; the shares sum to 1.")
        batch = item.get("batch_size")
        batch = batch_size if batch is None else batch
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ValueError(
                f"{where}.batch_size={batch!r}: use a positive global batch (or leave it out: "
                f"trainer.batch_size={batch_size})."
            )
        patch = check_patch(item["patch"], f"{where}.patch", grid, depth, whole_word=True)
        stages.append(Stage(patch, float(share), int(batch)))
    total = sum(s.share for s in stages)
    if abs(total - 1.0) > _SHARE_SUM_TOL:
        raise ValueError(f"trainer.patch_schedule: the shares sum to {total:g}, not 1: {[s.share for s in stages]}.")
    return tuple(stages)


def grow_stages(grid: Sequence[int], depth: int, batch_size: int) -> tuple[Stage, ...]:
    """The ``grow`` preset's stages for ``grid`` at ``depth`` (module doc): patches growing by
    about 1.5x a side, then the whole volume with half the time, all at ``batch_size``."""
    grid, multiple = [int(g) for g in grid], 2 ** int(depth)
    whole = math.prod(grid)
    patches, side = [], 2 * multiple
    while True:
        patch = tuple(min(side, g - g % multiple) for g in grid)
        if math.prod(patch) >= WHOLE_AT * whole or all(p >= g for p, g in zip(patch, grid)):
            break
        if patches and patch == patches[-1]:  # capped on every axis it can grow on: the whole volume next
            break
        patches.append(patch)
        side = max(side + multiple, int(side * _GROWTH) // multiple * multiple)
    if not patches:  # a grid no bigger than the smallest useful patch: the whole volume only
        return (Stage(None, 1.0, batch_size),)
    share = (1.0 - WHOLE_SHARE) / len(patches)
    return (*(Stage(p, share, batch_size) for p in patches), Stage(None, 1.0 - share * len(patches), batch_size))


def stage_epochs(stages: Sequence[Stage], epochs: int) -> list[int]:
    """The first epoch (0-based) of each stage for a run of ``epochs`` without a budget: the
    shares' cumulative sums rounded, each stage at least one epoch.

    Raises:
        ValueError: fewer epochs than stages.
    """
    if epochs < len(stages):
        raise ValueError(
            f"trainer.epochs={epochs} is fewer than the schedule's {len(stages)} stages: every stage "
            f"trains at least one epoch (raise trainer.epochs, or give a time budget)."
        )
    starts, cumulative = [], 0.0
    for i, stage in enumerate(stages):
        first = round(epochs * cumulative)
        first = max(first, starts[-1] + 1 if starts else 0)
        first = min(first, epochs - (len(stages) - i))  # room for the stages after it
        starts.append(first)
        cumulative += stage.share
    return starts


def inference_patch(cfg) -> list[int] | None:
    """The patch a trained run infers with, by sliding windows (None: whole volumes): its
    ``trainer.patch_size``, or its patch schedule's last stage's (``grow`` ends on the whole volume).

    Args:
        cfg: the run's :class:`~brats_seg.config.TrainConfig` (its ``config.json``).
    """
    t = cfg.trainer
    stages = parse_schedule(getattr(t, "patch_schedule", None), cfg.resolution.shape, cfg.model.depth, t.batch_size)
    if stages:
        last = stages[-1].patch
        return None if last is None else list(last)
    return [int(p) for p in t.patch_size] if t.patch_size else None
