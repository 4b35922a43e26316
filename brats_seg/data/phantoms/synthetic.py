"""Synthetic BraTS-like cases: a skull-stripped brain with a glioma, in four MRI contrasts.

A case is a 240 x 240 x 155 volume at 1 mm with the LPS-style affine real BraTS files
carry (nibabel axcodes L, P, S). Arrays are channels-last ``(x, y, z)`` in array
order: x towards the patient's left, y towards posterior, z towards superior.

What is in it, and why it is not trivial to segment:

- a brain with a smoothly deformed ellipsoidal outline, 0 outside (skull-stripped, as
  BraTS is); cortex folded into gyri and CSF-filled sulci, white matter, deep grey
  nuclei, ventricles, the interhemispheric fissure, choroid plexus and veins;
- normal structures that mimic tumour in one channel: CSF is bright on T2 and dark on
  T1 (like necrosis); periventricular caps, white-matter hyperintensities and FLAIR
  artefacts are bright on FLAIR (like edema); plexus and veins enhance on T1ce (like
  the rim);
- one glioma (sometimes a satellite) of 10-38 mm nominal radius, deep or cortical in
  either hemisphere, pushing the ventricles aside: noise-deformed nested blobs for
  edema, an enhancing rim and a necrotic core; ~20 % of cases have no enhancement
  (the core is then non-enhancing tumour). Edema is patchy and fades towards its
  border to grey-matter levels; enhancement is heterogeneous;
- per-case contrasts, a multiplicative bias field per modality, Rician noise and a
  per-case, per-modality global scale, so no single-channel threshold gives the regions
  (the best per-case FLAIR threshold reaches a WT Dice of ~0.35 on average, < 0.8 always
  in the first 60 cases of seed 0).

Generation works on a 2 mm grid inside the brain's bounding box and upsamples smooth
fields to 1 mm; the tumour is drawn at 1 mm from the same level sets as its labels.
One case takes ~1 s on one core. :func:`write_synthetic_dataset` writes cases as int16
images / uint8 labels in any of the three layouts.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import ndimage as ndi
from tqdm import tqdm

from brats_seg.data.labels import LABELS
from brats_seg.data.layouts import CHANNELS, case_file_paths
from brats_seg.data.phantoms.writer import check_generator_args, write_case, write_msd_json

__all__ = [
    "SHAPE",
    "AFFINE",
    "MODALITIES",
    "Lesion",
    "CaseParams",
    "SyntheticCase",
    "sample_case_params",
    "generate_case",
    "tissue_to_labels",
    "add_resection_cavity",
    "case_files",
    "write_synthetic_dataset",
]

logger = logging.getLogger(__name__)

SHAPE = (240, 240, 155)  # voxels (x, y, z) at 1 mm, as in BraTS
AFFINE = np.array([[-1, 0, 0, 0], [0, -1, 0, 239], [0, 0, 1, 0], [0, 0, 0, 1]], dtype=float)
MODALITIES = CHANNELS  # project channel order (data.layouts owns it)
INT16_MAX = 32767

# Relative intensities (white matter on T1 = 1) per modality, in MODALITIES order.
_NORMAL = {
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


@dataclass
class SyntheticCase:
    """One generated case.

    Attributes:
        images: ``flair``, ``t1``, ``t1ce``, ``t2`` -> float32 ``(240, 240, 155)``,
            integer-valued intensities in [0, 32767]; 0 exactly outside the brain and
            >= 1 inside it (so ``images["flair"] > 0`` is the brain mask).
        tissue: uint8 ``(240, 240, 155)``: 0 background/normal brain, 1 edema,
            2 necrotic or non-enhancing core, 3 enhancing tumour, 4 resection cavity
            (only after :func:`add_resection_cavity`, for brats2024).
        affine: float ``(4, 4)`` voxel-to-world (mm), axcodes L, P, S.
        params: the drawn layout (tumour foci in mm, enhancement, scales).
    """

    images: dict[str, np.ndarray]
    tissue: np.ndarray
    affine: np.ndarray
    params: CaseParams

    @property
    def has_enhancing(self) -> bool:
        """False for the ~20 % of cases without enhancing tumour."""
        return self.params.has_enhancing

    def labels(self, layout: str) -> np.ndarray:
        """The label map in ``layout``'s own values, uint8 ``(240, 240, 155)``."""
        return tissue_to_labels(self.tissue, layout)


def tissue_to_labels(tissue: np.ndarray, layout: str) -> np.ndarray:
    """Map tissue codes 1 edema / 2 core / 3 enhancing / 4 cavity to ``layout``'s label values.

    Args:
        tissue: uint8 ``(x, y, z)`` with values in {0, 1, 2, 3} (and 4 for a layout
            with a resection-cavity label).
        layout: a key of ``brats_seg.data.labels.LABELS``.

    Returns:
        uint8 ``(x, y, z)`` label map.
    """
    if layout not in LABELS:
        raise ValueError(f"Unknown layout {layout!r}; expected one of {sorted(LABELS)}.")
    conv = LABELS[layout]
    lut = np.array([0, conv.edema, conv.core, conv.enhancing, conv.cavity or 0], dtype=np.uint8)
    if conv.cavity is None and (tissue == 4).any():
        raise ValueError(f"layout {layout} has no resection-cavity label; the case has a cavity (use brats2024).")
    return lut[tissue]


# --------------------------------------------------------------------------- fields


def _upsample2(a: np.ndarray) -> np.ndarray:
    """Linear x2 upsampling of a cell-centred grid (= ``ndi.zoom(a, 2, order=1,
    grid_mode=True, mode="nearest")``, 3x faster). ``(n, m, k)`` -> ``(2n, 2m, 2k)``."""
    for axis in range(a.ndim):
        a = np.moveaxis(a, axis, 0)
        prev = np.concatenate([a[:1], a[:-1]])
        nxt = np.concatenate([a[1:], a[-1:]])
        out = np.empty((2 * a.shape[0],) + a.shape[1:], dtype=a.dtype)
        out[0::2] = 0.75 * a + 0.25 * prev
        out[1::2] = 0.75 * a + 0.25 * nxt
        a = np.moveaxis(out, 0, axis)
    return np.ascontiguousarray(a)


def _noise(rng: np.random.Generator, shape: tuple[int, ...], sigma_mm: float) -> np.ndarray:
    """Smooth Gaussian noise on the 2 mm grid, unit standard deviation, float32."""
    n = ndi.gaussian_filter(rng.standard_normal(shape, dtype=np.float32), sigma_mm / _MID_MM)
    return n / max(float(n.std()), 1e-6)


def _ramp(level_mm: np.ndarray, width_mm: float = _RAMP_MM) -> np.ndarray:
    """Soft indicator of ``level_mm > 0`` with a linear transition ``width_mm`` wide."""
    return np.clip(level_mm / width_mm + 0.5, 0.0, 1.0).astype(np.float32)


def _ellipsoid_level(coords, centre, semi, rot=None) -> np.ndarray:
    """Approximate signed distance (mm, > 0 inside) to an ellipsoid surface."""
    d = [c - c0 for c, c0 in zip(coords, centre)]
    if rot is not None:
        d = [rot[i, 0] * d[0] + rot[i, 1] * d[1] + rot[i, 2] * d[2] for i in range(3)]
    r = np.sqrt(sum((di / si) ** 2 for di, si in zip(d, semi)))
    return ((1.0 - r) * min(semi)).astype(np.float32)


def _rotation(rng: np.random.Generator) -> np.ndarray:
    q, r = np.linalg.qr(rng.standard_normal((3, 3)))
    return q * np.sign(np.diag(r))


@dataclass
class _Grid:
    """The 2 mm working grid over the brain's bounding box.

    ``start`` is the box's first voxel in the 1 mm volume, ``shape`` the 2 mm grid
    shape; ``coords`` are open (broadcastable) mm coordinates of cell centres
    relative to the brain centre.
    """

    start: tuple[int, int, int]
    shape: tuple[int, int, int]
    coords: tuple[np.ndarray, np.ndarray, np.ndarray]


def _make_grid(centre: np.ndarray, half_mm: np.ndarray) -> _Grid:
    start, shape, coords = [], [], []
    for axis in range(3):
        s0 = max(0, int(round(centre[axis] - half_mm[axis])))
        n = min(int(np.ceil((centre[axis] + half_mm[axis] - s0) / 2)), (SHAPE[axis] - s0) // 2)
        c = (s0 + 2 * np.arange(n) + 0.5 - centre[axis]).astype(np.float32)
        start.append(s0)
        shape.append(n)
        coords.append(c.reshape([-1 if i == axis else 1 for i in range(3)]))
    return _Grid(tuple(start), tuple(shape), tuple(coords))


# --------------------------------------------------------------------------- case parameters


@dataclass(frozen=True)
class Lesion:
    """One tumour focus: nested noise-deformed blobs of these nominal radii.

    Attributes:
        centre_mm: (x, y, z) offset from the brain centre in mm, array axis order
            (+x = patient left, +y = posterior, +z = superior).
        r_wt_mm: whole-tumour (edema) radius.
        r_core_mm: tumour-core radius.
        r_nec_mm: necrosis radius; 0 = a solid core.
    """

    centre_mm: tuple[float, float, float]
    r_wt_mm: float
    r_core_mm: float
    r_nec_mm: float


@dataclass(frozen=True)
class CaseParams:
    """The scalars that lay a case out, drawn first by :func:`generate_case` (cheap to sample).

    Attributes:
        brain_centre: (x, y, z) voxel coordinates of the brain centre.
        brain_semi_mm: semi-axes of the brain ellipsoid before deformation.
        lesions: the main tumour, then an optional satellite (~15 % of cases).
        has_enhancing: False for ~20 % of cases: no enhancing tumour, no rim.
        scales: per modality, the scanner value of relative intensity 1 (T1 white matter).
        noise_rel: Rician noise sigma relative to that scale.
    """

    brain_centre: tuple[float, float, float]
    brain_semi_mm: tuple[float, float, float]
    lesions: tuple[Lesion, ...]
    has_enhancing: bool
    scales: tuple[float, float, float, float]
    noise_rel: float


def sample_case_params(rng: np.random.Generator) -> CaseParams:
    """Draw a case's layout: brain size and position, tumour foci, enhancement, scales."""
    centre = np.array([120, 118, 74], float) + rng.uniform(-4, 4, 3)
    semi = np.array([rng.uniform(62, 72), rng.uniform(78, 90), rng.uniform(56, 64)])
    has_enhancing = bool(rng.random() >= 0.2)
    side = rng.choice([-1.0, 1.0])  # either hemisphere, from deep (12 mm off midline) to cortical
    while True:
        lesion_centre = np.array([side * rng.uniform(12, 0.7 * semi[0]), rng.uniform(-0.65, 0.65) * semi[1],
                                  rng.uniform(-0.55, 0.6) * semi[2]])
        if np.linalg.norm(lesion_centre / semi) <= 0.75:
            break
    r_wt = float(np.exp(rng.uniform(np.log(10), np.log(38))))  # 4 to 230 cm^3 nominal
    lesions = [_sized_lesion(rng, lesion_centre, r_wt)]
    if rng.random() < 0.15:  # satellite focus
        offset = rng.standard_normal(3)
        offset *= r_wt * rng.uniform(0.8, 1.4) / np.linalg.norm(offset)
        lesions.append(_sized_lesion(rng, lesion_centre + offset, r_wt * rng.uniform(0.3, 0.5)))
    scales = np.exp(rng.uniform(np.log(300), np.log(2000), 4))
    return CaseParams(
        brain_centre=tuple(centre.round(2).tolist()),
        brain_semi_mm=tuple(semi.round(2).tolist()),
        lesions=tuple(lesions),
        has_enhancing=has_enhancing,
        scales=tuple(scales.round(2).tolist()),
        noise_rel=round(float(rng.uniform(0.015, 0.035)), 4),
    )


def _sized_lesion(rng, centre: np.ndarray, r_wt: float) -> Lesion:
    r_core = r_wt * rng.uniform(0.5, 0.85)
    r_nec = min(r_core * rng.uniform(0.5, 0.85), r_core - 2.5)
    return Lesion(tuple(np.round(centre, 2).tolist()), round(r_wt, 2), round(r_core, 2),
                  round(r_nec, 2) if r_nec >= 2.0 else 0.0)


# --------------------------------------------------------------------------- anatomy


def _brain_level(rng, grid: _Grid, semi: np.ndarray) -> np.ndarray:
    """Depth below the brain surface (mm, > 0 inside) of a deformed ellipsoid."""
    u, v, w = (c / s for c, s in zip(grid.coords, semi))
    r = np.sqrt(u**2 + v**2 + w**2)
    r = r + 0.6 * np.clip(-w - 0.55, 0, None) ** 2  # flatter inferior surface
    r = r * (1 + rng.uniform(0.03, 0.06) * np.tanh(_noise(rng, grid.shape, 9.0)))
    grad = np.sqrt((u / semi[0]) ** 2 + (v / semi[1]) ** 2 + (w / semi[2]) ** 2) / np.maximum(r, 1e-3)
    return ((1 - r) / np.maximum(grad, 1 / semi.max())).astype(np.float32)


def _warp(grid: _Grid, centre: np.ndarray, push_mm: float, radius_mm: float):
    """Coordinates at which to sample deep anatomy so it looks pushed away from a mass."""
    d = [c - c0 for c, c0 in zip(grid.coords, centre)]
    g = np.exp(-(d[0] ** 2 + d[1] ** 2 + d[2] ** 2) / (2 * radius_mm**2)) * (push_mm / radius_mm)
    return tuple((c + di * g).astype(np.float32) for c, di in zip(grid.coords, d))


def _ventricle_level(wc, scale: float) -> np.ndarray:
    parts = [((0, 5, -4), (1.5 * scale, 12, 8))]  # third ventricle
    for s in (-1, 1):
        parts += [
            ((s * (2 + 4 * scale), 0, 12), (4 * scale, 28, 6 * scale)),  # body
            ((s * (3 + 5 * scale), -24, 7), (5 * scale, 10, 8 * scale)),  # frontal horn
            ((s * (6 + 8 * scale), 28, 6), (5 * scale, 12, 6 * scale)),  # atrium / occipital horn
            ((s * 28, 8, -18), (2.5 * scale, 12, 3.5 * scale)),  # temporal horn
        ]
    return np.maximum.reduce([_ellipsoid_level(wc, c, sm) for c, sm in parts])


def _deep_level(wc) -> np.ndarray:
    parts = []
    for s in (-1, 1):
        parts += [((s * 21, -4, 0), (8, 17, 10)), ((s * 10, 12, 2), (8, 11, 8))]  # basal ganglia, thalamus
    return np.maximum.reduce([_ellipsoid_level(wc, c, sm) for c, sm in parts])


def _anatomy(rng, grid: _Grid, depth: np.ndarray, wc) -> dict[str, np.ndarray]:
    """Soft fractions (2 mm grid) of wm, gm, deep, csf and of the mimicking structures."""
    shape = grid.shape
    # Cortex: sulci are zero-crossing sheets of band-limited noise, reaching a few cm deep.
    sigma_fold = rng.uniform(3.0, 4.0)
    fold = _noise(rng, shape, sigma_fold)
    sulcus_mm = np.abs(fold) * sigma_fold / 1.22
    sulcal_depth = rng.uniform(10, 16) + 4 * _noise(rng, shape, 8.0)
    fissure_region = np.sqrt((wc[1] / 48) ** 2 + ((wc[2] - 8) / 26) ** 2)
    fissure_mm = np.abs(wc[0]) + 40 * np.clip(1.5 - fissure_region, 0, 1)
    outer = np.minimum.reduce([depth, sulcus_mm + 2 * np.clip(depth - sulcal_depth, 0, None), fissure_mm])
    csf_w, thick = rng.uniform(0.6, 1.6), rng.uniform(2.3, 3.2)
    vent = _ventricle_level(wc, rng.uniform(0.7, 1.5))
    csf = np.maximum(_ramp(csf_w - outer), _ramp(vent))
    gm = _ramp(csf_w + thick - outer) * (1 - csf)
    deep = _ramp(_deep_level(wc), 2.5) * (1 - csf) * (1 - gm)
    wm = np.clip(1 - csf - gm - deep, 0, 1)

    cap = np.clip(1 + vent / rng.uniform(2.0, 5.0), 0, 1) * (vent < 0) * rng.uniform(0.2, 0.8)
    # Confluent periventricular white-matter disease (none to marked) plus punctate foci.
    halo = np.clip(1 + vent / rng.uniform(8.0, 20.0), 0, 1) * (vent < 0)
    wmh = _ramp(2 * (_noise(rng, shape, 5.0) - rng.uniform(-0.5, 1.5)), 1.0) * halo
    candidates = np.flatnonzero((depth > 12) & (wm > 0.9))
    n_wmh = rng.poisson(rng.uniform(0, 6)) if candidates.size else 0
    for idx in rng.choice(candidates, size=n_wmh) if n_wmh else []:
        ijk = np.unravel_index(idx, shape)
        c = [float(grid.coords[a].ravel()[ijk[a]]) for a in range(3)]
        wmh = np.maximum(wmh, _ramp(_ellipsoid_level(grid.coords, c, [rng.uniform(1.5, 4.5)] * 3)))
    plexus = np.maximum.reduce(
        [_ramp(_ellipsoid_level(wc, (s * 16, 24, 8), [rng.uniform(2.5, 4.5)] * 3)) for s in (-1, 1)]
    ) * _ramp(vent)
    sinus = _ramp(2.5 - np.sqrt(wc[0] ** 2 + (depth - 1.5) ** 2)) * (wc[2] > -10)
    veins = csf * _ramp(_noise(rng, shape, 3.0) - 1.4, 0.5) * (depth < 25)  # cortical veins in sulci
    # FLAIR-only hyperintense artefacts (incomplete CSF suppression, inflow) low in the brain.
    artefact = np.zeros(shape, np.float32)
    for _ in range(rng.integers(1, 4)):
        c = (rng.uniform(-45, 45), rng.uniform(-40, 55), rng.uniform(-45, -5))
        r = rng.uniform(10, 24)
        lvl = _ellipsoid_level(grid.coords, c, [r] * 3) + 0.3 * r * np.tanh(_noise(rng, shape, 5.0))
        artefact = np.maximum(artefact, _ramp(lvl, 6.0) * rng.uniform(0.4, 0.9))
    return {
        "wm": wm, "gm": gm, "deep": deep, "csf": csf, "flair_artefact": artefact,
        "cap": cap.astype(np.float32) * wm, "wmh": wmh * wm,
        "plexus": plexus, "vessel": np.maximum(sinus, veins).astype(np.float32),
    }


# --------------------------------------------------------------------------- tumour


def _lesion_levels(rng, grid: _Grid, lesion: Lesion) -> tuple[tuple[slice, ...], list[np.ndarray]]:
    """WT, core and necrosis levels (mm, > 0 inside) of one lesion in its sub-box."""
    box = []
    for axis in range(3):
        c = grid.coords[axis].ravel()
        lo = min(int(np.searchsorted(c, lesion.centre_mm[axis] - 1.5 * lesion.r_wt_mm - 6)), c.size - 1)
        hi = int(np.searchsorted(c, lesion.centre_mm[axis] + 1.5 * lesion.r_wt_mm + 6))
        box.append(slice(lo, min(max(hi, lo + 1), c.size)))  # never empty, even for a focus off the grid
    box = tuple(box)
    coords = tuple(grid.coords[a][tuple(box[a] if i == a else slice(None) for i in range(3))] for a in range(3))
    shape = tuple(s.stop - s.start for s in box)
    rot = _rotation(rng)
    levels, centre = [], np.asarray(lesion.centre_mm)
    for radius, jitter in ((lesion.r_wt_mm, 0.3), (lesion.r_core_mm, 0.22), (lesion.r_nec_mm, 0.15)):
        if radius <= 0:
            levels.append(np.full(shape, -100.0, np.float32))
            continue
        axes = radius * rng.uniform(0.75, 1.25, 3)
        centre = centre + rng.uniform(-0.15, 0.15, 3) * radius
        coarse = np.tanh(_noise(rng, shape, max(2.5, radius / 3)))
        fine = np.tanh(_noise(rng, shape, 2.0))
        lvl = _ellipsoid_level(coords, centre, axes, rot) * (radius / axes.min())
        levels.append((lvl + jitter * radius * coarse + 0.07 * radius * fine).astype(np.float32))
    wt, core, nec = levels
    core = np.minimum(core, wt)  # nested: nec in core in WT
    nec = np.minimum(nec, core - 1.5)
    return box, [wt, core, nec]


def _tumour_levels(rng, grid: _Grid, lesions: tuple[Lesion, ...], frac: dict[str, np.ndarray]):
    """Combined WT/core/necrosis levels on the 2 mm grid; edema avoids CSF and follows WM."""
    wt, core, nec = (np.full(grid.shape, -100.0, np.float32) for _ in range(3))
    for lesion in lesions:
        box, (w, c, n) = _lesion_levels(rng, grid, lesion)
        wt[box], core[box], nec[box] = np.maximum(wt[box], w), np.maximum(core[box], c), np.maximum(nec[box], n)
    wt = np.maximum(core, wt + 3 * (frac["wm"] - 0.5) - 8 * frac["csf"])
    return wt, core, nec


# --------------------------------------------------------------------------- contrast


def _bias(rng, grid: _Grid, strength: float) -> np.ndarray:
    """Multiplicative bias field: exp of a sum of random low-frequency plane waves."""
    log_b = np.zeros(grid.shape, np.float32)
    for _ in range(5):
        k = rng.standard_normal(3)
        k *= 2 * np.pi / rng.uniform(150, 400) / np.linalg.norm(k)  # wavelength 15-40 cm
        phase = k[0] * grid.coords[0] + k[1] * grid.coords[1] + k[2] * grid.coords[2]
        log_b += np.cos(phase + rng.uniform(0, 2 * np.pi)).astype(np.float32)
    return np.exp(strength * log_b / np.sqrt(2.5)).astype(np.float32)


@dataclass
class _Contrast:
    """A case's relative intensities, each ``(4,)`` in MODALITIES order, and edema shape."""

    normal: dict[str, np.ndarray]
    necrosis: np.ndarray
    solid: np.ndarray  # enhancing rim, or non-enhancing core if the case has no enhancement
    edema_gain: np.ndarray  # edema = white matter * (1 + gain * p), p in [0, 1]
    p_edge: float  # p at the edema border (grey-matter level on FLAIR/T2)
    border_mm: float  # width of the zone over which edema fades to p_edge


def _sample_contrast(rng, params: CaseParams) -> _Contrast:
    normal = {k: np.asarray(v) * rng.uniform(0.94, 1.06, 4) for k, v in _NORMAL.items()}
    necrosis = rng.uniform([0.25, 0.30, 0.33, 1.30], [0.65, 0.45, 0.50, 1.70])
    if params.has_enhancing:
        solid = rng.uniform([0.85, 0.70, 1.30, 0.85], [1.15, 0.85, 1.80, 1.10])
    else:
        solid = rng.uniform([0.80, 0.55, 0.58, 1.10], [1.30, 0.72, 0.78, 1.60])
    gain = np.array([rng.uniform(0.5, 0.9), -0.22, -0.2, rng.uniform(1.0, 1.6)])
    main = params.lesions[0]
    # Annotators draw WT on the visible FLAIR hyperintensity, so edema stays above grey
    # matter out to its labelled border: it fades over the outer fifth to half of its
    # thickness to p_edge of its full contrast, not to nothing.
    border_mm = rng.uniform(0.2, 0.45) * max(main.r_wt_mm - main.r_core_mm, 6.0)
    return _Contrast(normal, necrosis, solid, gain, float(rng.uniform(0.45, 0.65)), float(border_mm))


def _normal_images(rng, grid: _Grid, frac: dict[str, np.ndarray], con: _Contrast) -> list[np.ndarray]:
    """Tumour-free relative intensities of the four modalities on the 2 mm grid."""
    tex = 1 + 0.03 * _noise(rng, grid.shape, 1.5)
    images = []
    for m in range(4):
        img = sum(frac[k] * con.normal[k][m] for k in ("wm", "gm", "deep", "csf")) * tex
        for k in ("cap", "wmh", "plexus", "vessel"):
            img += frac[k] * (con.normal[k][m] - img)
        if m == 0:
            img = img * (1 + frac["flair_artefact"])
        images.append(img.astype(np.float32))
    return images


def _tumour_box(wt: np.ndarray) -> tuple[tuple[slice, ...], tuple[slice, ...]] | None:
    """Slices of the 2 mm grid around the tumour (with a margin) and the same box at 1 mm."""
    inside = np.argwhere(wt > -2.0)
    if inside.size == 0:
        return None
    lo, hi = np.maximum(inside.min(0) - 1, 0), inside.max(0) + 2
    return tuple(slice(a, b) for a, b in zip(lo, hi)), tuple(slice(2 * a, 2 * b) for a, b in zip(lo, hi))


def _tissue(wt: np.ndarray, core: np.ndarray, nec: np.ndarray, has_et: bool) -> np.ndarray:
    """Tissue codes (0-3) from 1 mm tumour levels."""
    t = (wt > 0).astype(np.uint8)
    t[core > 0] = 3 if has_et else 2
    t[(core > 0) & (nec > 0)] = 2
    return t


def _paint_tumour(images, levels, bias, patchy, enhancement, tex, con: _Contrast) -> None:
    """Blend the tumour into 1 mm relative images (views of its box), in place.

    Compartments are drawn at 1 mm from the same levels as the labels, so a thin rim is
    as thick in the image as in the label map. ``patchy`` and ``enhancement`` scale the
    edema's and the solid part's contrast to white matter (heterogeneous tumours).
    """
    wt, core, nec = levels
    f_wt, f_core, f_nec = _ramp(wt, 1.0), _ramp(core, 1.0), _ramp(nec, 1.0)
    # Edema fades to grey-matter levels on FLAIR/T2 in the outer part of its thickness; on
    # FLAIR (and T1) it is also patchy.
    p = con.p_edge + (1 - con.p_edge) * np.clip(wt / con.border_mm, 0, 1)
    wm = con.normal["wm"]
    for m, img in enumerate(images):
        edema = wm[m] * (1 + con.edema_gain[m] * (p if MODALITIES[m] == "t2" else p * patchy))
        solid = wm[m] + (con.solid[m] - wm[m]) * enhancement
        tumour = (f_wt - f_core) * edema + (f_core - f_nec) * solid + f_nec * con.necrosis[m]
        img *= 1 - f_wt
        img += tumour * tex * bias[m]


# --------------------------------------------------------------------------- case


def generate_case(rng: np.random.Generator) -> SyntheticCase:
    """Generate one synthetic BraTS-like case.

    Args:
        rng: the only source of randomness; the same generator state gives the same case.

    Returns:
        :class:`SyntheticCase` with four ``(240, 240, 155)`` float32 images, the uint8
        tissue map and the BraTS affine.
    """
    params = sample_case_params(rng)
    semi = np.asarray(params.brain_semi_mm)
    grid = _make_grid(np.asarray(params.brain_centre), semi * 1.07 + 3)
    depth = _brain_level(rng, grid, semi)
    main = params.lesions[0]
    wc = _warp(grid, np.asarray(main.centre_mm), min(0.3 * main.r_wt_mm, 10.0), 1.5 * main.r_wt_mm)
    frac = _anatomy(rng, grid, depth, wc)
    levels = _tumour_levels(rng, grid, params.lesions, frac)
    con = _sample_contrast(rng, params)
    bias_strength = rng.uniform(0.08, 0.2)
    bias = [_bias(rng, grid, bias_strength) for _ in MODALITIES]
    normal = _normal_images(rng, grid, frac, con)
    patchy = np.clip(1 + rng.uniform(0.25, 0.5) * _noise(rng, grid.shape, 6.0), 0.3, 1.1)
    enhancement = np.clip(1 + rng.uniform(0.2, 0.45) * _noise(rng, grid.shape, 4.0), 0.15, 1.2)
    tumour_tex = 1 + 0.1 * _noise(rng, grid.shape, 2.5)

    # From here on at 1 mm, over the brain's bounding box.
    brain = _upsample2(depth) > 0
    images = [_upsample2(img * b) for img, b in zip(normal, bias)]
    tissue_box = np.zeros(brain.shape, np.uint8)
    tumour_box = _tumour_box(levels[0])
    if tumour_box is not None:
        sub, full = tumour_box
        up = [_upsample2(np.ascontiguousarray(a[sub])) for a in (*levels, patchy, enhancement, tumour_tex, *bias)]
        tissue_box[full] = _tissue(*up[:3], params.has_enhancing)
        _paint_tumour([img[full] for img in images], up[:3], up[6:], *up[3:6], con=con)
    tissue_box[~brain] = 0

    box = tuple(slice(s, s + 2 * n) for s, n in zip(grid.start, grid.shape))
    tissue = np.zeros(SHAPE, np.uint8)
    tissue[box] = tissue_box
    out = {}
    for name, img, scale in zip(MODALITIES, images, params.scales):
        signal = img[brain] * np.float32(scale)
        sigma = np.float32(params.noise_rel * scale)
        n1 = rng.standard_normal(signal.shape, dtype=np.float32) * sigma
        n2 = rng.standard_normal(signal.shape, dtype=np.float32) * sigma
        img[:] = 0
        img[brain] = np.clip(np.rint(np.sqrt((signal + n1) ** 2 + n2**2)), 1, INT16_MAX)  # Rician magnitude
        out[name] = np.zeros(SHAPE, np.float32)
        out[name][box] = img
    return SyntheticCase(out, tissue, AFFINE.copy(), params)


def add_resection_cavity(case: SyntheticCase, rng: np.random.Generator) -> SyntheticCase:
    """A post-treatment version of ``case``: part of the tumour core resected (BraTS 2024 GLI).

    A fluid-filled cavity (tissue code 4; CSF-like on every contrast: dark on FLAIR and T1,
    bright on T2) replaces an ellipsoid around the tumour core's centre, of 0.5-0.9 times the
    core's extent; the tumour outside it stays (residual enhancing rim, edema). Cases
    without a tumour core are returned unchanged.
    """
    core = np.argwhere(case.tissue >= 2)
    if core.size == 0:
        return case
    centre = core.mean(0) + rng.uniform(-2, 2, 3)
    semi = np.maximum((core.max(0) - core.min(0)) / 2 * rng.uniform(0.5, 0.9, 3), 3.0)  # mm at 1 mm voxels
    lo = np.maximum(np.floor(centre - semi).astype(int) - 1, 0)
    hi = np.minimum(np.ceil(centre + semi).astype(int) + 2, SHAPE)
    box = tuple(slice(a, b) for a, b in zip(lo, hi))
    grid = np.stack(np.meshgrid(*[np.arange(a, b) for a, b in zip(lo, hi)], indexing="ij"), -1)
    cavity = (((grid - centre) / semi) ** 2).sum(-1) <= 1.0
    cavity &= case.images["flair"][box] > 0  # inside the brain
    tissue = case.tissue.copy()
    tissue[box][cavity] = 4
    images = {}
    normal = case.tissue == 0
    for m, name in enumerate(MODALITIES):
        img = case.images[name].copy()
        reference = float(np.median(img[normal & (img > 0)])) / _NORMAL["gm"][m]  # ~ white matter on T1 = 1
        fluid = reference * _NORMAL["csf"][m]
        noise = rng.normal(0.0, 0.03 * fluid + 1.0, int(cavity.sum()))
        img[box][cavity] = np.clip(np.rint(fluid + noise), 1, INT16_MAX)
        images[name] = img
    return SyntheticCase(images, tissue, case.affine, case.params)


# --------------------------------------------------------------------------- writing

def _case_id(layout: str, i: int) -> str:
    if layout == "brats2021":
        return f"BraTS2021_{i:05d}"
    if layout == "brats2023":
        return f"BraTS-GLI-{i:05d}-000"
    if layout == "brats2024":
        return f"BraTS-GLI-{i:05d}-100"  # the 2024 post-treatment timepoints
    return f"BRATS_{i + 1:03d}"


_DESCRIPTION = "brats-seg synthetic"


def case_files(out_dir: str | os.PathLike, layout: str, i: int, with_labels: bool = True) -> dict[str, Path]:
    """Paths of case ``i``'s files (:func:`brats_seg.data.layouts.case_file_paths`): keys
    ``flair``, ``t1``, ``t1ce``, ``t2``, ``seg`` for the BraTS layouts, ``image`` (4D) and
    ``seg`` for msd; ``seg`` only if ``with_labels``."""
    if layout not in LABELS:
        raise ValueError(f"Unknown layout {layout!r}; expected one of {sorted(LABELS)}.")
    return case_file_paths(out_dir, _case_id(layout, i), layout, with_labels)


def write_synthetic_dataset(
    out_dir: str | os.PathLike,
    layout: str = "brats2021",
    n_cases: int = 10,
    seed: int = 0,
    with_labels: bool = True,
) -> list[str]:
    """Generate ``n_cases`` cases and write them in ``layout``'s file structure.

    Case ``i`` is drawn from ``np.random.default_rng([seed, i])``, so it does not depend
    on ``n_cases``. Cases whose files all exist already are skipped; each file is
    written atomically. Images are int16, labels uint8 in the layout's own values.

    Args:
        out_dir: dataset root (created if needed).
        layout: ``brats2021`` | ``brats2023`` | ``brats2024`` (with a resection cavity in
            ~75 % of cases) | ``msd``.
        n_cases: number of cases, >= 1.
        seed: dataset seed, >= 0.
        with_labels: False writes no label files (an unlabelled test set; for msd the
            images go to ``imagesTs`` and are listed under ``test``).

    Returns:
        The case ids, in order (``BraTS2021_00000``, ``BraTS-GLI-00000-000`` or ``BRATS_001``).
    """
    if layout not in LABELS:
        raise ValueError(f"Unknown layout {layout!r}; expected one of {sorted(LABELS)}.")
    check_generator_args(n_cases, seed)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    case_ids, written = [], 0
    for i in tqdm(range(int(n_cases)), desc=f"synthetic {layout}", unit="case"):
        files = case_files(out, layout, i, with_labels)
        case_ids.append(_case_id(layout, i))
        if all(p.exists() for p in files.values()):
            continue
        case = generate_case(np.random.default_rng([int(seed), i]))
        if LABELS[layout].cavity is not None:  # post-treatment: most cases have a resection cavity
            cavity_rng = np.random.default_rng([int(seed), i, 4])
            if cavity_rng.random() < 0.75:
                case = add_resection_cavity(case, cavity_rng)
        write_case(files, case.images, case.labels(layout), case.affine, _DESCRIPTION)
        written += 1
    if layout == "msd":
        write_msd_json(out, case_ids, with_labels, "Synthetic BraTS-like gliomas (brats-seg), MSD Task01_BrainTumour layout", "brats_seg.data.phantoms.synthetic")
    logger.info("Synthetic %s dataset in %s: %d cases (%d written, %d existed).",
                layout, out, len(case_ids), written, len(case_ids) - written)
    return case_ids
