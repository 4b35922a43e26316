"""The glioma of a synthetic case: its foci, their nested level sets, its contrast and its painting.

One glioma (sometimes a satellite) of 10-38 mm nominal radius, deep or cortical in either
hemisphere: noise-deformed nested blobs for edema, an enhancing rim and a necrotic core;
~20 % of cases have no enhancement (the core is then non-enhancing tumour). Edema avoids
CSF, follows white matter, is patchy, and fades towards its border to grey-matter levels;
enhancement is heterogeneous.

Levels are approximate signed distances (mm, > 0 inside) on the 2 mm grid of
:mod:`.anatomy`, arrays ``(x, y, z)`` in array order; :mod:`.synthetic` upsamples them to
1 mm, and both the tissue codes (:func:`tissue_codes`) and the images
(:func:`paint_tumour`) are taken from the same 1 mm levels, so a thin rim is as thick in
the image as in the label map. Modality tuples are in the project's channel order FLAIR,
T1, T1ce, T2 (:data:`brats_seg.data.layouts.CHANNELS`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from brats_seg.data.layouts import CHANNELS
from brats_seg.data.phantoms.anatomy import Grid, ellipsoid_level, ramp, sample_normal_contrast, smooth_noise

__all__ = [
    "Contrast",
    "Lesion",
    "paint_tumour",
    "sample_contrast",
    "sample_lesions",
    "tissue_codes",
    "tumour_box",
    "tumour_levels",
]


# --------------------------------------------------------------------------- foci


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


def sample_lesions(rng: np.random.Generator, semi: np.ndarray) -> tuple[Lesion, ...]:
    """The tumour foci in a brain of semi-axes ``semi`` (mm): the main one, and in ~15 % of cases a satellite."""
    side = rng.choice([-1.0, 1.0])  # either hemisphere, from deep (12 mm off midline) to cortical
    while True:
        lesion_centre = np.array(
            [
                side * rng.uniform(12, 0.7 * semi[0]),
                rng.uniform(-0.65, 0.65) * semi[1],
                rng.uniform(-0.55, 0.6) * semi[2],
            ]
        )
        if np.linalg.norm(lesion_centre / semi) <= 0.75:
            break
    r_wt = float(np.exp(rng.uniform(np.log(10), np.log(38))))  # 4 to 230 cm^3 nominal
    lesions = [_sized_lesion(rng, lesion_centre, r_wt)]
    if rng.random() < 0.15:  # satellite focus
        offset = rng.standard_normal(3)
        offset *= r_wt * rng.uniform(0.8, 1.4) / np.linalg.norm(offset)
        lesions.append(_sized_lesion(rng, lesion_centre + offset, r_wt * rng.uniform(0.3, 0.5)))
    return tuple(lesions)


def _sized_lesion(rng, centre: np.ndarray, r_wt: float) -> Lesion:
    """A focus of WT radius ``r_wt``: core 0.5-0.85 of it, necrosis 0.5-0.85 of the core (none under 2 mm)."""
    r_core = r_wt * rng.uniform(0.5, 0.85)
    r_nec = min(r_core * rng.uniform(0.5, 0.85), r_core - 2.5)
    return Lesion(
        tuple(np.round(centre, 2).tolist()), round(r_wt, 2), round(r_core, 2), round(r_nec, 2) if r_nec >= 2.0 else 0.0
    )


# --------------------------------------------------------------------------- levels


def _rotation(rng: np.random.Generator) -> np.ndarray:
    """A random orthogonal 3 x 3 matrix (Haar-distributed: QR of a Gaussian matrix, signs fixed)."""
    q, r = np.linalg.qr(rng.standard_normal((3, 3)))
    return q * np.sign(np.diag(r))


def _lesion_levels(rng, grid: Grid, lesion: Lesion) -> tuple[tuple[slice, ...], list[np.ndarray]]:
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
        coarse = np.tanh(smooth_noise(rng, shape, max(2.5, radius / 3)))
        fine = np.tanh(smooth_noise(rng, shape, 2.0))
        lvl = ellipsoid_level(coords, centre, axes, rot) * (radius / axes.min())
        levels.append((lvl + jitter * radius * coarse + 0.07 * radius * fine).astype(np.float32))
    wt, core, nec = levels
    core = np.minimum(core, wt)  # nested: nec in core in WT
    nec = np.minimum(nec, core - 1.5)
    return box, [wt, core, nec]


def tumour_levels(rng, grid: Grid, lesions: tuple[Lesion, ...], frac: dict[str, np.ndarray]):
    """Combined WT/core/necrosis levels on the 2 mm grid; edema avoids CSF and follows WM."""
    wt, core, nec = (np.full(grid.shape, -100.0, np.float32) for _ in range(3))
    for lesion in lesions:
        box, (w, c, n) = _lesion_levels(rng, grid, lesion)
        wt[box], core[box], nec[box] = np.maximum(wt[box], w), np.maximum(core[box], c), np.maximum(nec[box], n)
    wt = np.maximum(core, wt + 3 * (frac["wm"] - 0.5) - 8 * frac["csf"])
    return wt, core, nec


# --------------------------------------------------------------------------- contrast and painting


@dataclass
class Contrast:
    """A case's relative intensities, each ``(4,)`` in CHANNELS order, and edema shape."""

    normal: dict[str, np.ndarray]
    necrosis: np.ndarray
    solid: np.ndarray  # enhancing rim, or non-enhancing core if the case has no enhancement
    edema_gain: np.ndarray  # edema = white matter * (1 + gain * p), p in [0, 1]
    p_edge: float  # p at the edema border (grey-matter level on FLAIR/T2)
    border_mm: float  # width of the zone over which edema fades to p_edge


def sample_contrast(rng: np.random.Generator, has_enhancing: bool, main: Lesion) -> Contrast:
    """A case's healthy contrasts, then its tumour's (``main`` is the main focus, which sets the edema border)."""
    normal = sample_normal_contrast(rng)
    necrosis = rng.uniform([0.25, 0.30, 0.33, 1.30], [0.65, 0.45, 0.50, 1.70])
    if has_enhancing:
        solid = rng.uniform([0.85, 0.70, 1.30, 0.85], [1.15, 0.85, 1.80, 1.10])
    else:
        solid = rng.uniform([0.80, 0.55, 0.58, 1.10], [1.30, 0.72, 0.78, 1.60])
    gain = np.array([rng.uniform(0.5, 0.9), -0.22, -0.2, rng.uniform(1.0, 1.6)])
    # Annotators draw WT on the visible FLAIR hyperintensity, so edema stays above grey
    # matter out to its labelled border: it fades over the outer fifth to half of its
    # thickness to p_edge of its full contrast, not to nothing.
    border_mm = rng.uniform(0.2, 0.45) * max(main.r_wt_mm - main.r_core_mm, 6.0)
    return Contrast(normal, necrosis, solid, gain, float(rng.uniform(0.45, 0.65)), float(border_mm))


def tumour_box(wt: np.ndarray) -> tuple[tuple[slice, ...], tuple[slice, ...]] | None:
    """Slices of the 2 mm grid around the tumour (with a margin) and the same box at 1 mm."""
    inside = np.argwhere(wt > -2.0)
    if inside.size == 0:
        return None
    lo, hi = np.maximum(inside.min(0) - 1, 0), inside.max(0) + 2
    return tuple(slice(a, b) for a, b in zip(lo, hi)), tuple(slice(2 * a, 2 * b) for a, b in zip(lo, hi))


def tissue_codes(wt: np.ndarray, core: np.ndarray, nec: np.ndarray, has_et: bool) -> np.ndarray:
    """Tissue codes from 1 mm tumour levels: 0 none, 1 edema, 2 necrosis or non-enhancing core, 3 enhancing."""
    t = (wt > 0).astype(np.uint8)
    t[core > 0] = 3 if has_et else 2
    t[(core > 0) & (nec > 0)] = 2
    return t


def paint_tumour(images, levels, bias, patchy, enhancement, tex, con: Contrast) -> None:
    """Blend the tumour into 1 mm relative images (views of its box), in place.

    Compartments are drawn at 1 mm from the same levels as the labels, so a thin rim is
    as thick in the image as in the label map. ``patchy`` and ``enhancement`` scale the
    edema's and the solid part's contrast to white matter (heterogeneous tumours).
    """
    wt, core, nec = levels
    f_wt, f_core, f_nec = ramp(wt, 1.0), ramp(core, 1.0), ramp(nec, 1.0)
    # Edema fades to grey-matter levels on FLAIR/T2 in the outer part of its thickness; on
    # FLAIR (and T1) it is also patchy.
    p = con.p_edge + (1 - con.p_edge) * np.clip(wt / con.border_mm, 0, 1)
    wm = con.normal["wm"]
    for m, img in enumerate(images):
        edema = wm[m] * (1 + con.edema_gain[m] * (p if CHANNELS[m] == "t2" else p * patchy))
        solid = wm[m] + (con.solid[m] - wm[m]) * enhancement
        tumour = (f_wt - f_core) * edema + (f_core - f_nec) * solid + f_nec * con.necrosis[m]
        img *= 1 - f_wt
        img += tumour * tex * bias[m]
