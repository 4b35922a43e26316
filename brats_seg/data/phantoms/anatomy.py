"""The healthy brain of a synthetic case, on the 2 mm working grid: tissues, contrasts, bias.

Everything here lives on :class:`Grid`, a 2 mm grid over the brain's bounding box inside the
1 mm case volume; :mod:`.synthetic` upsamples it to 1 mm. Arrays are ``(x, y, z)`` in array
order (x towards the patient's left, y towards posterior, z towards superior), coordinates
in mm from the brain centre. Modality tuples are in the project's channel order FLAIR, T1,
T1ce, T2 (:data:`brats_seg.data.layouts.CHANNELS`).

What the brain holds, and why it is not trivial to segment a tumour in it:

- a smoothly deformed ellipsoidal outline, 0 outside (skull-stripped, as BraTS is); cortex
  folded into gyri and CSF-filled sulci, white matter, deep grey nuclei, ventricles, the
  interhemispheric fissure, choroid plexus and veins;
- normal structures that mimic tumour in one channel: CSF is bright on T2 and dark on T1
  (like necrosis); periventricular caps, white-matter hyperintensities and FLAIR artefacts
  are bright on FLAIR (like edema); plexus and veins enhance on T1ce (like the rim);
- per-case contrasts (:data:`NORMAL`, jittered per case) and a multiplicative bias field
  per modality.

Deep structures are sampled at :func:`warp`-ed coordinates, so a mass pushes them aside. The
field helpers (:func:`smooth_noise`, :func:`ramp`, :func:`ellipsoid_level`) also shape the
tumour (:mod:`.tumour`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import ndimage as ndi

__all__ = [
    "NORMAL",
    "Grid",
    "bias_field",
    "brain_level",
    "ellipsoid_level",
    "make_grid",
    "normal_images",
    "ramp",
    "sample_anatomy",
    "sample_normal_contrast",
    "smooth_noise",
    "warp",
]

# Relative intensities (white matter on T1 = 1) per modality: FLAIR, T1, T1ce, T2 (CHANNELS order).
NORMAL = {
    "wm": (0.68, 1.00, 1.00, 0.55),
    "gm": (0.88, 0.72, 0.75, 0.78),
    "deep": (0.80, 0.82, 0.85, 0.66),
    "csf": (0.16, 0.25, 0.27, 1.70),
    "wmh": (1.15, 0.85, 0.86, 1.05),  # white-matter hyperintensities: FLAIR/T2 bright, not tumour
    "cap": (1.00, 0.92, 0.93, 0.85),  # periventricular caps
    "plexus": (0.75, 0.75, 1.60, 0.90),  # choroid plexus: enhances
    "vessel": (0.35, 0.55, 1.55, 0.35),  # veins and sinus: enhance, flow void on T2/FLAIR
}
_MID_MM = 2  # the working grid is 2 mm; fields are upsampled x2 to 1 mm
_RAMP_MM = 1.5  # width of partial-volume transitions


# --------------------------------------------------------------------------- fields


def smooth_noise(rng: np.random.Generator, shape: tuple[int, ...], sigma_mm: float) -> np.ndarray:
    """Smooth Gaussian noise on the 2 mm grid, unit standard deviation, float32."""
    n = ndi.gaussian_filter(rng.standard_normal(shape, dtype=np.float32), sigma_mm / _MID_MM)
    return n / max(float(n.std()), 1e-6)


def ramp(level_mm: np.ndarray, width_mm: float = _RAMP_MM) -> np.ndarray:
    """Soft indicator of ``level_mm > 0`` with a linear transition ``width_mm`` wide."""
    return np.clip(level_mm / width_mm + 0.5, 0.0, 1.0).astype(np.float32)


def ellipsoid_level(coords, centre, semi, rot=None) -> np.ndarray:
    """Approximate signed distance (mm, > 0 inside) to an ellipsoid surface."""
    d = [c - c0 for c, c0 in zip(coords, centre)]
    if rot is not None:
        d = [rot[i, 0] * d[0] + rot[i, 1] * d[1] + rot[i, 2] * d[2] for i in range(3)]
    r = np.sqrt(sum((di / si) ** 2 for di, si in zip(d, semi)))
    return ((1.0 - r) * min(semi)).astype(np.float32)


@dataclass
class Grid:
    """The 2 mm working grid over the brain's bounding box.

    ``start`` is the box's first voxel in the 1 mm volume, ``shape`` the 2 mm grid
    shape; ``coords`` are open (broadcastable) mm coordinates of cell centres
    relative to the brain centre.
    """

    start: tuple[int, int, int]
    shape: tuple[int, int, int]
    coords: tuple[np.ndarray, np.ndarray, np.ndarray]


def make_grid(centre: np.ndarray, half_mm: np.ndarray, volume_shape: tuple[int, int, int]) -> Grid:
    """The :class:`Grid` of ``centre`` +- ``half_mm`` (voxels of the 1 mm volume), clipped to ``volume_shape``."""
    start, shape, coords = [], [], []
    for axis in range(3):
        s0 = max(0, int(round(centre[axis] - half_mm[axis])))
        n = min(int(np.ceil((centre[axis] + half_mm[axis] - s0) / 2)), (volume_shape[axis] - s0) // 2)
        c = (s0 + 2 * np.arange(n) + 0.5 - centre[axis]).astype(np.float32)
        start.append(s0)
        shape.append(n)
        coords.append(c.reshape([-1 if i == axis else 1 for i in range(3)]))
    return Grid(tuple(start), tuple(shape), tuple(coords))


# --------------------------------------------------------------------------- anatomy


def brain_level(rng, grid: Grid, semi: np.ndarray) -> np.ndarray:
    """Depth below the brain surface (mm, > 0 inside) of a deformed ellipsoid."""
    u, v, w = (c / s for c, s in zip(grid.coords, semi))
    r = np.sqrt(u**2 + v**2 + w**2)
    r = r + 0.6 * np.clip(-w - 0.55, 0, None) ** 2  # flatter inferior surface
    r = r * (1 + rng.uniform(0.03, 0.06) * np.tanh(smooth_noise(rng, grid.shape, 9.0)))
    grad = np.sqrt((u / semi[0]) ** 2 + (v / semi[1]) ** 2 + (w / semi[2]) ** 2) / np.maximum(r, 1e-3)
    return ((1 - r) / np.maximum(grad, 1 / semi.max())).astype(np.float32)


def warp(grid: Grid, centre: np.ndarray, push_mm: float, radius_mm: float):
    """Coordinates at which to sample deep anatomy so it looks pushed away from a mass."""
    d = [c - c0 for c, c0 in zip(grid.coords, centre)]
    g = np.exp(-(d[0] ** 2 + d[1] ** 2 + d[2] ** 2) / (2 * radius_mm**2)) * (push_mm / radius_mm)
    return tuple((c + di * g).astype(np.float32) for c, di in zip(grid.coords, d))


def _ventricle_level(wc, scale: float) -> np.ndarray:
    """Level (mm, > 0 inside) of the ventricles: third, and lateral bodies and horns; ``scale`` widens them."""
    parts = [((0, 5, -4), (1.5 * scale, 12, 8))]  # third ventricle
    for s in (-1, 1):
        parts += [
            ((s * (2 + 4 * scale), 0, 12), (4 * scale, 28, 6 * scale)),  # body
            ((s * (3 + 5 * scale), -24, 7), (5 * scale, 10, 8 * scale)),  # frontal horn
            ((s * (6 + 8 * scale), 28, 6), (5 * scale, 12, 6 * scale)),  # atrium / occipital horn
            ((s * 28, 8, -18), (2.5 * scale, 12, 3.5 * scale)),  # temporal horn
        ]
    return np.maximum.reduce([ellipsoid_level(wc, c, sm) for c, sm in parts])


def _deep_level(wc) -> np.ndarray:
    """Level (mm, > 0 inside) of the deep grey nuclei: basal ganglia and thalami, both sides."""
    parts = []
    for s in (-1, 1):
        parts += [((s * 21, -4, 0), (8, 17, 10)), ((s * 10, 12, 2), (8, 11, 8))]  # basal ganglia, thalamus
    return np.maximum.reduce([ellipsoid_level(wc, c, sm) for c, sm in parts])


def sample_anatomy(rng, grid: Grid, depth: np.ndarray, wc) -> dict[str, np.ndarray]:
    """Soft fractions (2 mm grid) of wm, gm, deep, csf and of the mimicking structures.

    ``depth`` is :func:`brain_level`; ``wc`` are :func:`warp`-ed coordinates, at which the
    deep structures (ventricles, nuclei, fissure, plexus, sinus) are placed.
    """
    shape = grid.shape
    # Cortex: sulci are zero-crossing sheets of band-limited noise, reaching a few cm deep.
    sigma_fold = rng.uniform(3.0, 4.0)
    fold = smooth_noise(rng, shape, sigma_fold)
    sulcus_mm = np.abs(fold) * sigma_fold / 1.22
    sulcal_depth = rng.uniform(10, 16) + 4 * smooth_noise(rng, shape, 8.0)
    fissure_region = np.sqrt((wc[1] / 48) ** 2 + ((wc[2] - 8) / 26) ** 2)
    fissure_mm = np.abs(wc[0]) + 40 * np.clip(1.5 - fissure_region, 0, 1)
    outer = np.minimum.reduce([depth, sulcus_mm + 2 * np.clip(depth - sulcal_depth, 0, None), fissure_mm])
    csf_w, thick = rng.uniform(0.6, 1.6), rng.uniform(2.3, 3.2)
    vent = _ventricle_level(wc, rng.uniform(0.7, 1.5))
    csf = np.maximum(ramp(csf_w - outer), ramp(vent))
    gm = ramp(csf_w + thick - outer) * (1 - csf)
    deep = ramp(_deep_level(wc), 2.5) * (1 - csf) * (1 - gm)
    wm = np.clip(1 - csf - gm - deep, 0, 1)

    cap = np.clip(1 + vent / rng.uniform(2.0, 5.0), 0, 1) * (vent < 0) * rng.uniform(0.2, 0.8)
    # Confluent periventricular white-matter disease (none to marked) plus punctate foci.
    halo = np.clip(1 + vent / rng.uniform(8.0, 20.0), 0, 1) * (vent < 0)
    wmh = ramp(2 * (smooth_noise(rng, shape, 5.0) - rng.uniform(-0.5, 1.5)), 1.0) * halo
    candidates = np.flatnonzero((depth > 12) & (wm > 0.9))
    n_wmh = rng.poisson(rng.uniform(0, 6)) if candidates.size else 0
    for idx in rng.choice(candidates, size=n_wmh) if n_wmh else []:
        ijk = np.unravel_index(idx, shape)
        c = [float(grid.coords[a].ravel()[ijk[a]]) for a in range(3)]
        wmh = np.maximum(wmh, ramp(ellipsoid_level(grid.coords, c, [rng.uniform(1.5, 4.5)] * 3)))
    plexus = np.maximum.reduce(
        [ramp(ellipsoid_level(wc, (s * 16, 24, 8), [rng.uniform(2.5, 4.5)] * 3)) for s in (-1, 1)]
    ) * ramp(vent)
    sinus = ramp(2.5 - np.sqrt(wc[0] ** 2 + (depth - 1.5) ** 2)) * (wc[2] > -10)
    veins = csf * ramp(smooth_noise(rng, shape, 3.0) - 1.4, 0.5) * (depth < 25)  # cortical veins in sulci
    # FLAIR-only hyperintense artefacts (incomplete CSF suppression, inflow) low in the brain.
    artefact = np.zeros(shape, np.float32)
    for _ in range(rng.integers(1, 4)):
        c = (rng.uniform(-45, 45), rng.uniform(-40, 55), rng.uniform(-45, -5))
        r = rng.uniform(10, 24)
        lvl = ellipsoid_level(grid.coords, c, [r] * 3) + 0.3 * r * np.tanh(smooth_noise(rng, shape, 5.0))
        artefact = np.maximum(artefact, ramp(lvl, 6.0) * rng.uniform(0.4, 0.9))
    return {
        "wm": wm,
        "gm": gm,
        "deep": deep,
        "csf": csf,
        "flair_artefact": artefact,
        "cap": cap.astype(np.float32) * wm,
        "wmh": wmh * wm,
        "plexus": plexus,
        "vessel": np.maximum(sinus, veins).astype(np.float32),
    }


# --------------------------------------------------------------------------- contrast


def sample_normal_contrast(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A case's healthy relative intensities: each of :data:`NORMAL`'s values scaled by 0.94-1.06."""
    return {k: np.asarray(v) * rng.uniform(0.94, 1.06, 4) for k, v in NORMAL.items()}


def normal_images(rng, grid: Grid, frac: dict[str, np.ndarray], normal: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Tumour-free relative intensities of the four modalities on the 2 mm grid.

    ``frac`` is :func:`sample_anatomy`, ``normal`` the case's :func:`sample_normal_contrast`.
    """
    tex = 1 + 0.03 * smooth_noise(rng, grid.shape, 1.5)
    images = []
    for m in range(4):
        img = sum(frac[k] * normal[k][m] for k in ("wm", "gm", "deep", "csf")) * tex
        for k in ("cap", "wmh", "plexus", "vessel"):
            img += frac[k] * (normal[k][m] - img)
        if m == 0:
            img = img * (1 + frac["flair_artefact"])
        images.append(img.astype(np.float32))
    return images


def bias_field(rng, grid: Grid, strength: float) -> np.ndarray:
    """Multiplicative bias field: exp of a sum of random low-frequency plane waves."""
    log_b = np.zeros(grid.shape, np.float32)
    for _ in range(5):
        k = rng.standard_normal(3)
        k *= 2 * np.pi / rng.uniform(150, 400) / np.linalg.norm(k)  # wavelength 15-40 cm
        phase = k[0] * grid.coords[0] + k[1] * grid.coords[1] + k[2] * grid.coords[2]
        log_b += np.cos(phase + rng.uniform(0, 2 * np.pi)).astype(np.float32)
    return np.exp(strength * log_b / np.sqrt(2.5)).astype(np.float32)
