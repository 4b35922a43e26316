"""A second, independently built realistic dataset: gliomas grown in real brain anatomy.

Made differently from :mod:`brats_seg.data.phantoms.synthetic` (ellipsoid lesions in a procedural
head), so that a training recipe tuned on one can be judged on the other:

* **Anatomy** is the MNI152 ICBM 2009a symmetric template that ``nilearn`` ships in its
  wheel (T1 and grey/white-matter probability maps, 1 mm; usable offline). Each case
  sees it through its own random affine (rotation, anisotropic scale, shift), a smooth
  random deformation and the tumour's mass effect, resampled onto a BraTS-like
  240 x 240 x 155 grid at 1 mm.
* **Tumours** grow by a Fisher-Kolmogorov reaction-diffusion model
  (``du/dt = div(D grad u) + rho u (1 - u)``) from a seed in white matter, with diffusion
  ten times faster in white than in grey matter and none in CSF or outside the brain, so
  they spread along white-matter tracts. Compartments come from the tumour cell density
  ``u`` with per-case thresholds and a noise field: oedema (SNFH) where ``u`` is low,
  the tumour core where it is high, necrosis at its centre, an enhancing rim that is
  patchy; about one case in eight is non-enhancing. Label convention: BraTS 2021
  (1 NCR/NET, 2 ED, 4 ET), layout ``brats2021``.
* **Contrasts** (FLAIR, T1, T1ce, T2) from tissue fractions with per-case tissue
  intensities, the template's own T1 texture, tumour-compartment intensities with
  heterogeneity, a multiplicative bias field, partial-volume blur and noise.
* **Storage**: about half of the cases are stored LPS (x and y flipped, as DICOM-derived
  files are), the rest RAS, so the loader's reorientation is exercised.

Every case ``i`` is drawn from ``np.random.default_rng([seed, i])``: the same seed gives the
same files. Nothing here is committed data; ``scripts/make_mni_gliomas.py`` writes them.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import nibabel as nib
import numpy as np
import scipy.ndimage as ndi

from brats_seg.data.labels import LABELS
from brats_seg.data.layouts import CHANNELS, case_file_paths
from brats_seg.data.phantoms.writer import check_generator_args, write_case
from brats_seg.files import write_text_atomic

__all__ = [
    "GEOMETRY_SHIFT",
    "GRID_SHAPE",
    "SHIFT",
    "AcquisitionShift",
    "MNICase",
    "generate_mni_case",
    "mni_case_id",
    "write_mni_glioma_dataset",
]

log = logging.getLogger(__name__)

GRID_SHAPE = (240, 240, 155)  # the BraTS grid, 1 mm
MODALITIES = CHANNELS
_ROLES = LABELS["brats2021"].roles  # the cases are written in the brats2021 layout, with its labels
NCR, ED, ET = _ROLES["core"], _ROLES["edema"], _ROLES["enhancing"]

_TEMPLATES = {
    "t1": "mni_icbm152_t1_tal_nlin_sym_09a_converted.nii.gz",
    "gm": "mni_icbm152_gm_tal_nlin_sym_09a_converted.nii.gz",
    "wm": "mni_icbm152_wm_tal_nlin_sym_09a_converted.nii.gz",
}

# Tissue intensities per contrast (arbitrary units, WM of T1 = 1): csf, gm, wm, then the
# tumour compartments oedema, non-enhancing core, enhancing, necrosis.
_TUMOUR = ("ed", "core", "et", "nec")  # the compartments another protocol shows with other contrast
_MEANS = {
    "t1": dict(csf=0.30, gm=0.70, wm=1.00, ed=0.62, core=0.55, et=0.60, nec=0.35),
    "t1ce": dict(csf=0.32, gm=0.72, wm=1.00, ed=0.65, core=0.60, et=1.45, nec=0.35),
    "t2": dict(csf=1.60, gm=0.85, wm=0.55, ed=1.25, core=1.05, et=0.95, nec=1.50),
    "flair": dict(csf=0.25, gm=0.85, wm=0.70, ed=1.45, core=1.15, et=1.10, nec=0.70),
}


@dataclass
class MNICase:
    """One generated case on the output grid, RAS.

    Attributes:
        images: ``{modality: float32 (240, 240, 155)}``.
        labels: uint8 BraTS 2021 labels, same grid.
        affine: the RAS voxel-to-world affine of the grid.
        lps: whether the case is to be stored LPS.
    """

    images: dict[str, np.ndarray]
    labels: np.ndarray
    affine: np.ndarray
    lps: bool


@dataclass(frozen=True)
class AcquisitionShift:
    """How a case is acquired "as another scanner would" (the shifted test set): the same anatomy
    and tumour as the matched case, seen through a head tilted further in the scanner, thick
    slices resampled back to 1 mm, another protocol's tissue contrast, more noise, and other
    intensity response and bias.

    Attributes:
        tilt_deg: extra head rotation about each axis, uniform in +-tilt_deg (the matched
            cases' own is +-6 degrees).
        slice_mm: slice thickness along one axis, drawn per case, averaged over and resampled
            back to 1 mm linearly (images only: the reference stays at 1 mm, as BraTS
            annotates the resampled volumes).
        contrast: per contrast and tumour compartment, the share of its difference to white
            matter that this protocol shows, uniform in this range (another sequence's TE/TI,
            another contrast-agent dose or delay: e.g. a fainter enhancing rim on T1ce).
        noise: extra Gaussian noise, as a fraction of the image's white-matter level (a lower
            field or a faster sequence).
        gamma: per-contrast gamma on the intensities rescaled to [0, 1], uniform in this range.
        bias: amplitude of an extra multiplicative bias field (the matched cases' is 0.15).
    """

    tilt_deg: float = 15.0
    slice_mm: int = 4
    contrast: tuple[float, float] = (1.0, 1.0)
    noise: float = 0.0
    gamma: tuple[float, float] = (0.7, 1.4)
    bias: float = 0.3


# The shift first tried (issue 30): tilt, 4 mm slices, gamma and bias. It cost the recipes
# nothing (docs/measurements/recipe_study_zen5), so the test set of another scanner adds the
# protocol's contrast and noise (SHIFT).
GEOMETRY_SHIFT = AcquisitionShift()
SHIFT = AcquisitionShift(contrast=(0.5, 1.0), noise=0.06)


@functools.lru_cache(maxsize=1)
def _templates() -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The nilearn MNI152 maps as float32 in [0, 1], and their affine."""
    try:
        import nilearn.datasets
    except ImportError as e:  # pragma: no cover - a dependency
        raise RuntimeError(
            "the MNI glioma generator needs nilearn, a dependency of brats-seg: reinstall it "
            "(pip install -c requirements.lock -e .)"
        ) from e
    folder = Path(nilearn.datasets.__file__).parent / "data"
    maps, affine = {}, None
    for key, name in _TEMPLATES.items():
        path = folder / name
        if not path.is_file():
            raise RuntimeError(f"{path} is missing from the installed nilearn; reinstall nilearn>=0.10.")
        img = nib.as_closest_canonical(nib.load(path))
        maps[key] = (np.asarray(img.dataobj, dtype=np.float32) / 255.0).clip(0, 1)
        affine = img.affine
    return maps, affine


@functools.lru_cache(maxsize=1)
def _anatomy() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Brain mask, CSF fraction and the candidate tumour seeds (deep white matter)."""
    maps, _ = _templates()
    brain = ndi.binary_fill_holes(ndi.binary_closing(maps["t1"] > 0.05, iterations=2))
    csf = np.clip(brain.astype(np.float32) - maps["wm"] - maps["gm"], 0, 1)
    seeds = np.argwhere((maps["wm"] > 0.9) & ndi.binary_erosion(brain, iterations=15))
    return brain, csf, seeds


def _smooth_noise(rng: np.random.Generator, shape, sigma: float, amplitude: float = 1.0) -> np.ndarray:
    """Zero-mean, unit-std (times ``amplitude``) Gaussian-filtered white noise."""
    n = ndi.gaussian_filter(rng.standard_normal(shape).astype(np.float32), sigma)
    return (n / (n.std() + 1e-8) * amplitude).astype(np.float32)


def _diffuse(u: np.ndarray, d: np.ndarray, dt: float, rho: float) -> None:
    """One explicit step of ``du/dt = div(d grad u) + rho u (1 - u)``, in place; zero at the box faces."""
    lap = np.zeros_like(u)
    for ax in range(3):
        up, dn = np.roll(u, -1, ax), np.roll(u, 1, ax)
        dup, ddn = 0.5 * (d + np.roll(d, -1, ax)), 0.5 * (d + np.roll(d, 1, ax))
        lap += dup * (up - u) - ddn * (u - dn)
    u += dt * (lap + rho * u * (1 - u))
    u[0, :, :] = u[-1, :, :] = 0
    u[:, 0, :] = u[:, -1, :] = 0
    u[:, :, 0] = u[:, :, -1] = 0


def _grow(rng, wm: np.ndarray, gm: np.ndarray, seed_vox: np.ndarray, core_voxels: int):
    """Tumour cell density ``u`` (Fisher-Kolmogorov) and oedema field ``e`` on a 2 mm box
    around ``seed_vox`` (1 mm template voxels), both returned on the 1 mm template grid.

    ``u`` grows until its dense part (> 0.5) reaches ``core_voxels`` mm^3; the oedema is
    then that density spreading on without growth, mostly along white matter (vasogenic
    oedema follows the tracts), for a per-case time.
    """
    half = 36  # 2 mm voxels: a 144 mm box
    lo = np.maximum(seed_vox // 2 - half, 0)
    wm2, gm2 = wm[::2, ::2, ::2], gm[::2, ::2, ::2]
    hi = np.minimum(lo + 2 * half, wm2.shape)
    box = tuple(slice(a, b) for a, b in zip(lo, hi))
    d = (0.4 * wm2[box] + 0.04 * gm2[box]).astype(np.float32)  # none in CSF / outside the brain
    u = np.zeros_like(d)
    c = tuple(int(x) for x in seed_vox // 2 - lo)
    zz = np.indices(u.shape).astype(np.float32)
    u[sum((zz[a] - c[a]) ** 2 for a in range(3)) <= 2.0**2] = 1.0  # a 4 mm ball of tumour cells
    rho, dt = float(rng.uniform(0.15, 0.3)), 0.3
    for step in range(3000):
        _diffuse(u, d, dt, rho)
        if step % 10 == 0 and 8 * np.count_nonzero(u > 0.5) >= core_voxels:
            break
    e = u.copy()
    d_oedema = (2.0 * wm2[box] + 0.3 * gm2[box]).astype(np.float32)
    for _ in range(int(rng.integers(15, 45))):
        _diffuse(e, d_oedema, 0.08, 0.0)
    e = np.maximum(e, u)
    log.debug("tumour grown in %d steps, max density %.2f", step, float(u.max()))
    out = []
    for field in (u, e):
        full = np.zeros(wm.shape, np.float32)
        up = ndi.zoom(field, 2, order=1)
        dst = tuple(slice(2 * a, min(2 * a + s, n)) for a, s, n in zip(lo, up.shape, wm.shape))
        full[dst] = up[tuple(slice(0, s.stop - s.start) for s in dst)]
        out.append(full)
    return out[0], out[1]


def _compartments(rng, u: np.ndarray, e: np.ndarray, brain: np.ndarray) -> dict[str, np.ndarray]:
    """Boolean masks ed/core/et/nec from density and oedema, irregular per-case thresholds."""
    box = ndi.find_objects((e > 0.01).astype(np.int8))[0]
    noise = _smooth_noise(rng, tuple(s.stop - s.start for s in box), 2.0, 1.0)
    v, w = np.zeros_like(u), np.zeros_like(e)
    v[box] = u[box] * (1 + 0.12 * noise)
    w[box] = e[box] * (1 + 0.2 * noise)
    wt = ((w > rng.uniform(0.06, 0.12)) | (v > 0.3)) & brain
    core = (v > rng.uniform(0.55, 0.75)) & wt
    nec = (v > rng.uniform(0.97, 0.995)) & core if rng.random() < 0.8 else np.zeros_like(core)
    enhancing = rng.random() >= 0.125
    rim = core & ~nec
    if enhancing:
        patch = np.zeros_like(u)
        patch[box] = _smooth_noise(rng, tuple(s.stop - s.start for s in box), 3.0, 1.0)
        et = rim & (patch > rng.uniform(-1.0, 0.2))
    else:
        et = np.zeros_like(core)
    return {"ed": wt & ~core, "core": core & ~et & ~nec, "et": et, "nec": nec}


def _rotation(angles: np.ndarray) -> np.ndarray:
    cx, cy, cz = np.cos(angles)
    sx, sy, sz = np.sin(angles)
    return (
        np.array([[1, 0, 0], [0, cx, -sx], [0, sx, cx]])
        @ np.array([[cy, 0, sy], [0, 1, 0], [-sy, 0, cy]])
        @ np.array([[cz, -sz, 0], [sz, cz, 0], [0, 0, 1]])
    )


def _sampling_coords(
    rng, template_affine: np.ndarray, seed_world: np.ndarray, push_mm: float, tilt: np.ndarray | None = None
):
    """Template voxel coordinates for every output voxel: random affine, smooth warp and a
    radial mass effect around the tumour (backward mapping); ``tilt``, a rotation matrix, turns
    the head further in the scanner (the shifted set)."""
    shape = GRID_SHAPE
    out_affine = np.eye(4)
    out_affine[:3, 3] = -(np.array(shape) - 1) / 2.0 + np.array([0.0, -18.0, 10.0])  # brain centred like BraTS
    rot = _rotation(np.deg2rad(rng.uniform(-6, 6, 3)))
    if tilt is not None:
        rot = tilt @ rot
    scale = np.diag(rng.uniform(0.92, 1.08, 3))
    shift = rng.uniform(-5, 5, 3)
    grid = np.indices(shape, dtype=np.float32).reshape(3, -1)
    world = (rot @ scale).astype(np.float32) @ (grid + out_affine[:3, 3:4].astype(np.float32))
    world += shift[:, None].astype(np.float32)
    # Smooth warp (two random plane waves per axis, 80-160 mm long, ~1.5 mm) and the mass
    # effect (pull toward the seed).
    for axis in range(3):
        for _ in range(2):
            k = rng.standard_normal(3)
            k *= 2 * np.pi / (np.linalg.norm(k) * rng.uniform(80, 160))
            world[axis] += np.float32(rng.uniform(0.8, 2.0)) * np.sin(
                k.astype(np.float32) @ world + rng.uniform(0, 6.3)
            )
    r = world - seed_world[:, None]
    dist = np.linalg.norm(r, axis=0) + 1e-3
    world -= r / dist * (push_mm * np.exp(-((dist / (3 * max(push_mm, 1))) ** 2)))
    inv = np.linalg.inv(template_affine)
    vox = inv[:3, :3] @ world + inv[:3, 3:4]
    return vox.reshape(3, *shape).astype(np.float32), out_affine


def _bias_field(c: np.ndarray, amplitude: float = 0.15) -> np.ndarray:
    """A smooth multiplicative bias field (+-``amplitude``): exp of a random quadratic in x, y, z."""
    x, y, z = (np.linspace(-1, 1, n, dtype=np.float32) for n in GRID_SHAPE)
    x, y, z = x[:, None, None], y[None, :, None], z[None, None, :]
    p = (
        c[0] * x
        + c[1] * y
        + c[2] * z
        + c[3] * x * x
        + c[4] * y * y
        + c[5] * z * z
        + c[6] * x * y
        + c[7] * y * z
        + c[8] * x * z
    )
    return np.exp(amplitude * p / 3).astype(np.float32)


def mni_case_id(i: int) -> str:
    return f"MNIG_{i:05d}"


def _thick_slices(img: np.ndarray, axis: int, mm: int) -> np.ndarray:
    """``img`` acquired in ``mm``-thick slices along ``axis`` (1 mm voxels), resampled back to 1 mm
    linearly."""
    n = img.shape[axis]
    thick = ndi.uniform_filter1d(img, size=mm, axis=axis, mode="nearest")
    centres = np.arange(mm // 2, n, mm)
    slices = np.take(thick, centres, axis=axis)
    coords = np.clip((np.arange(n) - mm // 2) / mm, 0, len(centres) - 1)  # 1 mm positions in slice units
    lo = np.floor(coords).astype(int)
    hi = np.minimum(lo + 1, len(centres) - 1)
    w = (coords - lo).astype(np.float32)
    shape = [1] * img.ndim
    shape[axis] = n
    w = w.reshape(shape)
    return (np.take(slices, lo, axis=axis) * (1 - w) + np.take(slices, hi, axis=axis) * w).astype(np.float32)


def _acquire_shifted(images: dict[str, np.ndarray], rng: np.random.Generator, shift: AcquisitionShift):
    """Thick slices along one axis, noise, a gamma per contrast and an extra bias field (in place)."""
    axis = int(rng.integers(3))
    bias = _bias_field(rng.uniform(-1, 1, 9), shift.bias)
    noise_rng = np.random.default_rng(rng.integers(2**63))  # its own stream: the gammas drawn as without
    for m, img in images.items():
        inside = img > 0
        if shift.noise > 0:  # relative to the brain's median (about white matter), per acquired slice:
            # added at sqrt(slice_mm) times that, the slices' averaging brings it back to it
            level = float(np.median(img[inside])) if inside.any() else 1.0
            sd = shift.noise * level * np.sqrt(shift.slice_mm)
            img = np.clip(img + noise_rng.normal(0, sd, img.shape).astype(np.float32), 0, None)
        img = _thick_slices(img, axis, shift.slice_mm)
        top = float(img.max()) or 1.0
        img = (np.clip(img / top, 0, 1) ** rng.uniform(*shift.gamma)) * top * bias
        images[m] = (img * inside).astype(np.float32)


def generate_mni_case(
    rng: np.random.Generator, shift: AcquisitionShift | None = None, shift_rng: np.random.Generator | None = None
) -> MNICase:
    """One case (see the module doc); with ``shift``, the same case acquired as another scanner
    would (:class:`AcquisitionShift`), its differences drawn from ``shift_rng`` so that ``rng``
    draws exactly what the matched case draws."""
    maps, t_affine = _templates()
    wm, gm, t1 = maps["wm"], maps["gm"], maps["t1"]
    brain, csf, seeds = _anatomy()
    seed_vox = seeds[rng.integers(len(seeds))]  # a white-matter voxel away from the brain's edge
    target = int(rng.uniform(3e3, 30e3))  # mm^3 of dense tumour (about the core)
    u, e = _grow(rng, wm, gm, seed_vox, target)
    comp = _compartments(rng, u, e, brain)
    tilt, contrast_u = None, {}
    if shift is not None:  # every draw of the shift, whichever of its parts are on
        shift_rng = shift_rng if shift_rng is not None else np.random.default_rng()
        tilt = _rotation(np.deg2rad(shift_rng.uniform(-shift.tilt_deg, shift.tilt_deg, 3)))
        contrast_u = {m: shift_rng.random(len(_TUMOUR)) for m in MODALITIES}
    # Intensities on the template grid.
    images = {}
    bias_src = rng.uniform(-1, 1, 9)
    box = tuple(slice(max(b.start - 4, 0), b.stop + 4) for b in ndi.find_objects((e > 0.01).astype(np.int8))[0])
    shape = tuple(b.stop - b.start for b in (slice(b.start, min(b.stop, n)) for b, n in zip(box, u.shape)))
    box = tuple(slice(b.start, b.start + n) for b, n in zip(box, shape))
    weights = {k: ndi.gaussian_filter(comp[k][box].astype(np.float32), 0.8) for k in ("ed", "core", "et", "nec")}
    for m in MODALITIES:
        mean = {k: v * rng.uniform(0.93, 1.07) for k, v in _MEANS[m].items()}
        if shift is not None:  # the protocol's contrast (drawn from shift_rng: rng draws as matched)
            lo, hi = shift.contrast
            mean.update(
                {
                    k: mean["wm"] + (lo + (hi - lo) * contrast_u[m][j]) * (mean[k] - mean["wm"])
                    for j, k in enumerate(_TUMOUR)
                }
            )
        img = csf * mean["csf"] + gm * mean["gm"] + wm * mean["wm"]
        if m in ("t1", "t1ce"):
            img *= 0.85 + 0.3 * t1  # the template's own T1 texture
        het = 1 + 0.08 * _smooth_noise(rng, shape, 1.5)
        part = img[box]
        for key, w in weights.items():
            part = (1 - w) * part + w * mean[key] * het
        img[box] = part
        images[m] = img * brain
    seed_world = (t_affine @ np.r_[seed_vox, 1.0])[:3]
    push = float(rng.uniform(1.0, 6.0)) * (target / 15e3) ** (1 / 3)
    coords, out_affine = _sampling_coords(rng, t_affine, seed_world, push, tilt)
    labels_t = np.zeros(u.shape, np.uint8)
    labels_t[comp["ed"]] = ED
    labels_t[comp["core"] | comp["nec"]] = NCR
    labels_t[comp["et"]] = ET
    labels = ndi.map_coordinates(labels_t, coords, order=0, mode="constant", cval=0).astype(np.uint8)
    bias = _bias_field(bias_src)
    out = {}
    for m in MODALITIES:
        img = ndi.map_coordinates(images[m], coords, order=1, mode="constant", cval=0.0)
        inside = img > 0.02
        img = ndi.gaussian_filter(img, 0.5) * bias
        img += rng.normal(0, 0.025, img.shape).astype(np.float32) * inside
        gain = rng.uniform(350, 900)
        out[m] = np.clip(img * gain, 0, None).astype(np.float32) * inside
    lps = bool(rng.random() < 0.5)
    if shift is not None:
        _acquire_shifted(out, shift_rng, shift)
    return MNICase(out, labels, out_affine, lps=lps)


_SHIFT_RECORD = "acquisition.json"  # in a generated root: the acquisition its cases were written with


def _check_shift_record(out: Path, shift: AcquisitionShift | None) -> None:
    """Make ``out`` hold cases of this acquisition: a root written with another one (an older
    shift) has its case files removed, said once, so that they are written again; the
    acquisition is recorded before any case is written."""
    want = {"shift": None if shift is None else dataclasses.asdict(shift)}
    want = json.loads(json.dumps(want))
    path = out / _SHIFT_RECORD
    try:
        have = json.loads(path.read_text())
    except (OSError, ValueError):
        have = None
    cases = [p for p in out.glob("MNIG_*") if p.is_dir()]
    if have != want and (have is not None or (shift is not None and cases)):
        if cases:
            was = "an older generator's acquisition (not recorded)" if have is None else f"the acquisition {have}"
            log.warning(
                "%s holds %d cases written with %s; this generator acquires them as %s: writing them again",
                out,
                len(cases),
                was,
                want,
            )
        for p in cases:
            shutil.rmtree(p)
    if have != want:
        write_text_atomic(path, json.dumps(want, indent=1) + "\n")


def write_mni_glioma_dataset(
    out_dir: str | os.PathLike, n_cases: int = 20, seed: int = 0, shift: bool = False
) -> list[str]:
    """Write ``n_cases`` cases in the ``brats2021`` layout; existing complete cases are kept.

    Args:
        out_dir: dataset root (created).
        n_cases: number of cases, >= 1.
        seed: dataset seed, >= 0; case ``i`` uses ``default_rng([seed, i])``.
        shift: write each case as another scanner would acquire it (:data:`SHIFT`), its
            differences drawn from ``default_rng([seed, i, 1])``: the same case ids, anatomy,
            tumours and reference labels as the matched dataset of this seed.

    Returns:
        The case ids ``MNIG_00000`` ...
    """
    from tqdm.auto import tqdm

    check_generator_args(n_cases, seed)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _check_shift_record(out, SHIFT if shift else None)
    ids = []
    for i in tqdm(range(int(n_cases)), desc="MNI gliomas" + (" (shifted)" if shift else ""), unit="case"):
        cid = mni_case_id(i)
        ids.append(cid)
        files = case_file_paths(out, cid, "brats2021")
        if all(p.exists() for p in files.values()):
            continue
        case = generate_mni_case(
            np.random.default_rng([int(seed), i]), SHIFT if shift else None, np.random.default_rng([int(seed), i, 1])
        )
        affine, axes = case.affine, ()
        if case.lps:  # store LPS: flip x and y in the array, and in the affine
            f = np.diag([-1.0, -1.0, 1.0, 1.0])
            f[0, 3], f[1, 3] = GRID_SHAPE[0] - 1, GRID_SHAPE[1] - 1
            affine, axes = case.affine @ f, (0, 1)
        write_case(
            files,
            {m: np.flip(case.images[m], axes) for m in MODALITIES},
            np.flip(case.labels, axes),
            affine,
            "brats-seg MNI glioma",
        )
    log.info("MNI glioma dataset in %s: %d cases.", out, len(ids))
    return ids
