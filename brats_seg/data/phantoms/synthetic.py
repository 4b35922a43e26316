"""Synthetic BraTS-like cases: a skull-stripped brain with a glioma, in four MRI contrasts.

A case is a 240 x 240 x 155 volume at 1 mm with the LPS-style affine real BraTS files
carry (nibabel axcodes L, P, S). Arrays are channels-last ``(x, y, z)`` in array
order: x towards the patient's left, y towards posterior, z towards superior.

A case puts together the healthy brain of :mod:`.anatomy` (folded cortex, white and deep
grey matter, ventricles, and normal structures that mimic tumour in one channel) and the
glioma of :mod:`.tumour` (one or two foci of edema, enhancing rim and necrotic core, ~20 %
without enhancement), which pushes the ventricles aside. On top of those mimics, per-case
contrasts, a multiplicative bias field per modality, Rician noise and a per-case,
per-modality global scale mean no single-channel threshold gives the regions (the best
per-case FLAIR threshold reaches a WT Dice of ~0.35 on average, < 0.8 always in the first
60 cases of seed 0).

Generation works on a 2 mm grid inside the brain's bounding box and upsamples smooth
fields to 1 mm; the tumour is drawn at 1 mm from the same level sets as its labels.
One case takes ~1 s on one core. :func:`add_resection_cavity` makes a post-treatment case
(brats2024); :func:`write_synthetic_dataset` writes cases as int16 images / uint8 labels in
any of the layouts.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from brats_seg.choices import check_choice
from brats_seg.data.labels import LABELS
from brats_seg.data.layouts import CHANNELS, case_file_paths
from brats_seg.data.phantoms.anatomy import (
    NORMAL,
    bias_field,
    brain_level,
    make_grid,
    normal_images,
    sample_anatomy,
    smooth_noise,
    warp,
)
from brats_seg.data.phantoms.tumour import (
    Lesion,
    paint_tumour,
    sample_contrast,
    sample_lesions,
    tissue_codes,
    tumour_box,
    tumour_levels,
)
from brats_seg.data.phantoms.writer import check_generator_args, write_case, write_msd_json

__all__ = [
    "AFFINE",
    "MODALITIES",
    "SHAPE",
    "CaseParams",
    "SyntheticCase",
    "add_resection_cavity",
    "case_files",
    "generate_case",
    "sample_case_params",
    "tissue_to_labels",
    "write_synthetic_dataset",
]

logger = logging.getLogger(__name__)

SHAPE = (240, 240, 155)  # voxels (x, y, z) at 1 mm, as in BraTS
AFFINE = np.array([[-1, 0, 0, 0], [0, -1, 0, 239], [0, 0, 1, 0], [0, 0, 0, 1]], dtype=float)
MODALITIES = CHANNELS  # project channel order (data.layouts owns it)
INT16_MAX = 32767


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
    check_choice(layout, sorted(LABELS), "layout")
    conv = LABELS[layout]
    lut = np.array([0, conv.edema, conv.core, conv.enhancing, conv.cavity or 0], dtype=np.uint8)
    if conv.cavity is None and (tissue == 4).any():
        raise ValueError(f"layout {layout} has no resection-cavity label; the case has a cavity (use brats2024).")
    return lut[tissue]


# --------------------------------------------------------------------------- case parameters


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
    lesions = sample_lesions(rng, semi)
    scales = np.exp(rng.uniform(np.log(300), np.log(2000), 4))
    return CaseParams(
        brain_centre=tuple(centre.round(2).tolist()),
        brain_semi_mm=tuple(semi.round(2).tolist()),
        lesions=lesions,
        has_enhancing=has_enhancing,
        scales=tuple(scales.round(2).tolist()),
        noise_rel=round(float(rng.uniform(0.015, 0.035)), 4),
    )


# --------------------------------------------------------------------------- case


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
    grid = make_grid(np.asarray(params.brain_centre), semi * 1.07 + 3, SHAPE)
    depth = brain_level(rng, grid, semi)
    main = params.lesions[0]
    wc = warp(grid, np.asarray(main.centre_mm), min(0.3 * main.r_wt_mm, 10.0), 1.5 * main.r_wt_mm)
    frac = sample_anatomy(rng, grid, depth, wc)
    levels = tumour_levels(rng, grid, params.lesions, frac)
    con = sample_contrast(rng, params.has_enhancing, main)
    bias_strength = rng.uniform(0.08, 0.2)
    bias = [bias_field(rng, grid, bias_strength) for _ in MODALITIES]
    normal = normal_images(rng, grid, frac, con.normal)
    patchy = np.clip(1 + rng.uniform(0.25, 0.5) * smooth_noise(rng, grid.shape, 6.0), 0.3, 1.1)
    enhancement = np.clip(1 + rng.uniform(0.2, 0.45) * smooth_noise(rng, grid.shape, 4.0), 0.15, 1.2)
    tumour_tex = 1 + 0.1 * smooth_noise(rng, grid.shape, 2.5)

    # From here on at 1 mm, over the brain's bounding box.
    brain = _upsample2(depth) > 0
    images = [_upsample2(img * b) for img, b in zip(normal, bias)]
    tissue_box = np.zeros(brain.shape, np.uint8)
    boxes = tumour_box(levels[0])
    if boxes is not None:
        sub, full = boxes
        up = [_upsample2(np.ascontiguousarray(a[sub])) for a in (*levels, patchy, enhancement, tumour_tex, *bias)]
        tissue_box[full] = tissue_codes(*up[:3], params.has_enhancing)
        paint_tumour([img[full] for img in images], up[:3], up[6:], *up[3:6], con=con)
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
        reference = float(np.median(img[normal & (img > 0)])) / NORMAL["gm"][m]  # ~ white matter on T1 = 1
        fluid = reference * NORMAL["csf"][m]
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
    check_choice(layout, sorted(LABELS), "layout")
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
    check_choice(layout, sorted(LABELS), "layout")
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
        write_msd_json(
            out,
            case_ids,
            with_labels,
            "Synthetic BraTS-like gliomas (brats-seg), MSD Task01_BrainTumour layout",
            "brats_seg.data.phantoms.synthetic",
        )
    logger.info(
        "Synthetic %s dataset in %s: %d cases (%d written, %d existed).",
        layout,
        out,
        len(case_ids),
        written,
        len(case_ids) - written,
    )
    return case_ids
