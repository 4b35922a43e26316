"""Random crops for patch training: where each crop of an epoch lies, and reading it from the cache.

Patch mode (``trainer.patch_size``) trains on crops of the cached volume instead of the whole
grid, as nnU-Net and MONAI do. Everything here is a pure function of ``(seed, epoch,
position)`` and the case's own content, so a resumed run draws exactly the crops an
uninterrupted one draws:

* **an epoch** visits every training case :func:`crops_per_case` times (as many crops as hold
  its voxels), in an order drawn from ``(seed, epoch)``;
* **which crops hold tumour**: of the crops at global positions ``g = epoch * per_epoch +
  position``, crop ``g`` is forced to contain tumour when ``floor((g + 1) * f) > floor(g * f)``
  for ``f = trainer.foreground_fraction``: exactly ``f`` of every run's crops, spread evenly (at
  ``f = 1/3`` every third crop), whatever the batch;
* **a forced crop** is centred on a tumour voxel: a region is drawn among those the case has
  (WT, TC, ET: small ET is found as often as WT), then one of that region's voxels, as nnU-Net
  samples a class and then one of its locations; the crop is moved inside the grid where the
  centre is near an edge. A case without tumour gives a random crop (said once per case);
* **any other crop** lies anywhere in the grid, uniformly.

A crop reads only its own voxels from the memory-mapped ``image.npy`` and ``regions.npy``. To
find tumour voxels the case's ``regions.npy`` is read once (uint8: 20 MB at full resolution,
not the 110 MB float16 image), and at most :data:`LOCATIONS_PER_REGION` voxels per region are
kept (about 36 KB a case), drawn with a fixed seed, so the list does not depend on the visit
order.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

import numpy as np

__all__ = [
    "LOCATIONS_PER_REGION",
    "PatchSampler",
    "crop_origin",
    "crops_per_case",
    "is_foreground_crop",
    "steps_per_epoch",
    "tumour_locations",
]

log = logging.getLogger(__name__)

LOCATIONS_PER_REGION = 2000  # tumour voxels kept per region and case to centre forced crops on
_CROP_STREAM = 7  # the crops' random stream, apart from the augmentation's (seed, epoch, position)
_LOCATION_SEED = 1234  # the fixed seed of the kept voxels: a case's list does not depend on the run


def crops_per_case(grid: Sequence[int], patch: Sequence[int] | None) -> int:
    """Crops of each training case per epoch: as many as hold the case's voxels,
    ``round(prod(grid) / prod(patch))`` (at least 1; 1 for whole volumes). An epoch of either mode
    thus trains on about the same number of voxels, so ``trainer.epochs``, ``val_every`` and
    ``warmup_epochs`` mean the same amount of data in both (48^3 crops of the 96x112x80 grid: 8)."""
    if not patch:
        return 1
    return max(1, round(math.prod(int(g) for g in grid) / math.prod(int(p) for p in patch)))


def steps_per_epoch(
    n_cases: int, grid: Sequence[int], patch: Sequence[int] | None, batch_size: int, max_steps: int | None = None
) -> int:
    """Batches (>= 1) per training epoch over ``n_cases`` cases cached on ``grid``: each case
    :func:`crops_per_case` times, in full batches (remainder dropped), at most ``max_steps``
    (``trainer.steps_per_epoch``; None or 0: no cap). The one rule the loop, the input pipeline
    and the run's time estimate share (no TensorFlow here).

    Raises:
        ValueError: fewer cases (crops) than one batch, or a bad batch size / cap.
    """
    elements = n_cases * crops_per_case(grid, patch)  # what an epoch visits
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}.")
    if elements < batch_size:
        raise ValueError(
            f"{elements} training case(s) cannot fill one batch of {batch_size}: "
            f"lower trainer.batch_size to at most {max(elements, 1)} or add cases."
        )
    steps = elements // batch_size
    if max_steps is not None and max_steps != 0:
        if max_steps < 0:
            raise ValueError(f"trainer.steps_per_epoch must be >= 1 or null, got {max_steps!r}.")
        steps = min(steps, max_steps)
    return steps


def is_foreground_crop(global_position: int, fraction: float) -> bool:
    """Whether the crop at ``global_position`` of the run must contain tumour (module doc)."""
    if fraction <= 0:
        return False
    if fraction >= 1:
        return True
    g = int(global_position)
    return math.floor((g + 1) * fraction + 1e-9) > math.floor(g * fraction + 1e-9)


def tumour_locations(regions: np.ndarray, per_region: int = LOCATIONS_PER_REGION) -> list[np.ndarray]:
    """Per region channel, up to ``per_region`` voxel coordinates ``(n, 3)`` int32 where it is set.

    Args:
        regions: ``(x, y, z, R)`` region masks (any integer or bool dtype).
        per_region: kept per region, drawn without replacement with a fixed seed.
    """
    rng = np.random.default_rng(_LOCATION_SEED)
    regions = np.asarray(regions)  # one read of a memory-mapped file, not one per channel
    out = []
    for channel in range(regions.shape[-1]):
        coords = np.argwhere(regions[..., channel] > 0).astype(np.int32)
        if len(coords) > per_region:
            coords = coords[np.sort(rng.choice(len(coords), per_region, replace=False))]
        out.append(coords)
    return out


def crop_origin(
    shape: Sequence[int], patch: Sequence[int], rng: np.random.Generator, centre: Sequence[int] | None = None
) -> tuple[int, int, int]:
    """The crop's first voxel: centred on ``centre`` (moved inside the grid), or uniform."""
    origin = []
    for axis, (size, side) in enumerate(zip(shape, patch)):
        last = int(size) - int(side)
        if centre is None:
            origin.append(int(rng.integers(0, last + 1)))
        else:
            origin.append(int(min(max(int(centre[axis]) - int(side) // 2, 0), last)))
    return tuple(origin)  # type: ignore[return-value]


class PatchSampler:
    """The crop of the case at ``(epoch, position)`` of a run (module doc).

    Args:
        shape: the cached grid ``(x, y, z)``.
        patch: the crop ``(px, py, pz)``, at most ``shape`` on every axis.
        seed: the run's seed (``trainer.seed``).
        fraction: ``trainer.foreground_fraction``.
        per_epoch: crops per epoch over the cluster (``steps * batch_size``): the global position.
    """

    def __init__(self, shape: Sequence[int], patch: Sequence[int], seed: int, fraction: float, per_epoch: int):
        self.shape = tuple(int(s) for s in shape)
        self.patch = tuple(int(p) for p in patch)
        if len(self.patch) != 3 or any(p < 1 or p > s for p, s in zip(self.patch, self.shape)):
            raise ValueError(f"trainer.patch_size={list(self.patch)} does not fit the cached grid {list(self.shape)}.")
        self.seed, self.fraction, self.per_epoch = int(seed), float(fraction), int(per_epoch)
        self._locations: dict[int, list[np.ndarray]] = {}
        self._said_no_tumour: set[int] = set()

    def locations(self, case: int, regions: np.ndarray) -> list[np.ndarray]:
        """The case's kept tumour voxels per region (read from ``regions`` on its first crop)."""
        if case not in self._locations:
            self._locations[case] = tumour_locations(regions)
        return self._locations[case]

    def origin(self, epoch: int, position: int, case: int, regions: np.ndarray, case_name: str = "") -> tuple:
        """``(origin, forced)``: the crop's first voxel, and whether it was centred on tumour."""
        rng = np.random.default_rng([self.seed, int(epoch), int(position), _CROP_STREAM])
        if not is_foreground_crop(int(epoch) * self.per_epoch + int(position), self.fraction):
            return crop_origin(self.shape, self.patch, rng), False
        present = [coords for coords in self.locations(case, regions) if len(coords)]
        if not present:
            if case not in self._said_no_tumour:
                self._said_no_tumour.add(case)
                log.info(
                    "case %s has no tumour: its crops meant to hold tumour (trainer.foreground_fraction=%g) "
                    "are drawn anywhere",
                    case_name or case,
                    self.fraction,
                )
            return crop_origin(self.shape, self.patch, rng), False
        coords = present[int(rng.integers(len(present)))]
        centre = coords[int(rng.integers(len(coords)))]
        return crop_origin(self.shape, self.patch, rng, centre), True

    def crop(
        self, epoch: int, position: int, case: int, image: np.ndarray, regions: np.ndarray, case_name: str = ""
    ) -> tuple[np.ndarray, np.ndarray]:
        """The crop of ``image`` and ``regions`` (memory-mapped: only the crop is read), contiguous."""
        (x, y, z), _ = self.origin(epoch, position, case, regions, case_name)
        px, py, pz = self.patch
        box = (slice(x, x + px), slice(y, y + py), slice(z, z + pz))
        return np.ascontiguousarray(image[box]), np.ascontiguousarray(regions[box])
