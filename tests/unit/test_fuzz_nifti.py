"""Malformed NIfTI files: each ends in a one-line CaseError naming the file, fast and small.

Each row builds a valid 8x8x8 float32 image with nibabel, then breaks it: header fields are
patched through nibabel's own header dtype (the documented byte offsets of the 348-byte
NIfTI-1 / 540-byte NIfTI-2 header), raw bytes are cut or inserted, and ``.nii.gz`` rows gzip
the patched bytes.

Every row is loaded in a child process whose address space is capped (``RLIMIT_AS``), so a
reader that tries to allocate the size a header declares fails there with MemoryError (and
the row fails) instead of swapping this machine, and a crash of the interpreter is a failed
row rather than a dead test session. The child also reports its peak RSS growth.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import nibabel as nib
import numpy as np
import pytest

from brats_seg.data.errors import CaseError
from brats_seg.data.nifti import load_volume

REPO = Path(__file__).resolve().parents[2]
ADDRESS_SPACE_CAP_BYTES = 2 * 1024**3  # the child's whole address space: numpy + nibabel need ~0.5 GB
RSS_GROWTH_LIMIT_KB = 64 * 1024  # an 8x8x8 image needs a few KB; the absurd rows declare up to 10^15 bytes
SAYS_WHAT_TO_DO = ("re-export", "Rename it", "rename it", "Check the dataset layout")

# Runs one load in a capped child; prints a JSON result as its last line.
_CHILD = r"""
import json, resource, sys, traceback
cap = int(sys.argv[4])
resource.setrlimit(resource.RLIMIT_AS, (cap, resource.getrlimit(resource.RLIMIT_AS)[1]))
from brats_seg.data.errors import CaseError
from brats_seg.data.nifti import load_volume
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
out = {"ok": True}
try:
    load_volume(sys.argv[1], sys.argv[2], expect_ndim=int(sys.argv[3]))
except BaseException as e:
    out = {"ok": False, "type": type(e).__name__, "is_case_error": isinstance(e, CaseError),
           "message": str(e), "traceback": traceback.format_exc()}
out["rss_growth_kb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(json.dumps(out))
"""


# ---------------------------------------------------------------- building broken files


def _image(shape=(8, 8, 8), dtype=np.float32, nifti2=False):
    data = np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape)
    img = (nib.Nifti2Image if nifti2 else nib.Nifti1Image)(data, np.diag([1.0, 1.0, 1.0, 1.0]))
    img.set_qform(img.affine, code=1)
    img.set_sform(img.affine, code=1)
    return img


def _valid(shape=(8, 8, 8), dtype=np.float32, nifti2=False) -> bytes:
    """A valid single-file NIfTI image as bytes (header, 4 extension-flag bytes, data)."""
    return _image(shape, dtype, nifti2).to_bytes()


def _patch(raw: bytes, nifti2: bool = False, **fields) -> bytes:
    """``raw`` with header fields replaced: ``dim={0: 8}`` sets one element, ``datatype=128`` a field."""
    header_dtype = nib.nifti2.header_dtype if nifti2 else nib.nifti1.header_dtype
    n = header_dtype.itemsize
    hdr = np.frombuffer(raw[:n], dtype=header_dtype).copy()  # nibabel writes native byte order
    for name, value in fields.items():
        if isinstance(value, dict):
            for i, v in value.items():
                hdr[name][0][i] = v
        else:
            hdr[name] = value
    return hdr.tobytes() + raw[n:]


def _with_extension(raw: bytes, esize: int) -> bytes:
    """``raw`` with one 16-byte extension slot whose esize field says ``esize`` bytes."""
    ext = struct.pack("<ii", esize, 0) + b"\0" * 8
    patched = _patch(raw, vox_offset=352 + len(ext))
    return patched[:348] + b"\x01\0\0\0" + ext + patched[352:]


def _big_endian() -> bytes:
    """The valid image written big-endian (header fields and voxels)."""
    header = nib.Nifti1Header.from_fileobj(io.BytesIO(_valid()))  # as written: vox_offset 352
    voxels = np.arange(512, dtype=">f4").reshape(8, 8, 8).tobytes(order="F")  # NIfTI: first axis fastest
    return header.as_byteswapped(">").binaryblock + b"\0" * 4 + voxels


def _flip_bytes(raw: bytes, start: int, stop: int) -> bytes:
    return raw[:start] + bytes(b ^ 0x5A for b in raw[start:stop]) + raw[stop:]


def _with_voxel(raw: bytes, index: int, value: float) -> bytes:
    """``raw`` (float32, data at byte 352) with voxel ``index`` (file order) set to ``value``."""
    at = 352 + 4 * index
    return raw[:at] + np.float32(value).tobytes() + raw[at + 4 :]


def _gz(raw: bytes) -> bytes:
    return gzip.compress(raw, compresslevel=1, mtime=0)


def _big_dims(nifti2=False, size=32767):
    """A tiny file whose header declares ``size``^3 float32 voxels (NIfTI-1 dims are int16)."""
    return _patch(_valid(nifti2=nifti2), nifti2=nifti2, dim={1: size, 2: size, 3: size})


# row -> (file name, builder of its bytes, expect_ndim, regex of what the message must say)
ROWS = {
    "dim0_zero": ("dim0_zero.nii", lambda: _patch(_valid(), dim={0: 0}), 3, r"dim\[0\]=0.*1 to 7"),
    "dim0_eight": ("dim0_eight.nii", lambda: _patch(_valid(), dim={0: 8}), 3, r"dim\[0\]=8.*1 to 7"),
    "dim0_negative": ("dim0_negative.nii", lambda: _patch(_valid(), dim={0: -3}), 3, r"dim\[0\]=-3.*1 to 7"),
    "2d_image": ("two_d.nii", lambda: _valid(shape=(8, 8)), 3, r"expected a 3D volume.*found 2D"),
    "5d_image": ("five_d.nii", lambda: _valid(shape=(8, 8, 8, 2, 2)), 3, r"expected a 3D volume.*found 5D"),
    "4d_where_3d": (
        "four_d.nii.gz",
        lambda: _gz(_valid(shape=(8, 8, 8, 2))),
        3,
        r"expected a 3D volume.*found 4D with shape \(8, 8, 8, 2\)",
    ),
    "3d_where_4d": ("three_d.nii.gz", lambda: _gz(_valid()), 4, r"expected a 4D image.*found 3D"),
    "zero_dim_size": ("zero_dim.nii", lambda: _patch(_valid(), dim={2: 0}), 3, r"dim\[2\]=0.*at least one voxel"),
    "negative_dim_size": (
        "negative_dim.nii",
        lambda: _patch(_valid(), dim={1: -8}),
        3,
        r"dim\[1\]=-8.*at least one voxel",
    ),
    "zero_pixdim": (
        "zero_pixdim.nii",
        lambda: _patch(_valid(), pixdim={1: 0.0}),
        3,
        r"pixdim\[1\]=0.*voxel sizes must be finite and positive",
    ),
    "negative_pixdim": (
        "negative_pixdim.nii",
        lambda: _patch(_valid(), pixdim={2: -1.0}),
        3,
        r"pixdim\[2\]=-1.*voxel sizes must be finite and positive",
    ),
    "nan_pixdim": (
        "nan_pixdim.nii.gz",
        lambda: _gz(_patch(_valid(), pixdim={3: np.nan})),
        3,
        r"pixdim\[3\]=nan.*finite and positive",
    ),
    "inf_pixdim": ("inf_pixdim.nii", lambda: _patch(_valid(), pixdim={1: np.inf}), 3, r"pixdim\[1\]=inf.*finite"),
    "zero_pixdim_no_sform_qform": (
        "all_zero_affine.nii",
        lambda: _patch(
            _valid(),
            sform_code=0,
            qform_code=0,
            pixdim={1: 0.0, 2: 0.0, 3: 0.0},
            srow_x=[0, 0, 0, 0],
            srow_y=[0, 0, 0, 0],
            srow_z=[0, 0, 0, 0],
        ),
        3,
        r"pixdim\[1\]=0.*finite and positive",
    ),
    "singular_sform": (
        "singular_sform.nii",
        lambda: _patch(_valid(), srow_x=[0, 0, 0, 0], srow_y=[0, 0, 0, 0], srow_z=[0, 0, 0, 0]),
        3,
        r"sform affine.*singular",
    ),
    "parallel_sform_axes": (
        "parallel_sform.nii",
        lambda: _patch(_valid(), srow_y=[1, 0, 0, 0]),
        3,
        r"sform affine.*singular",
    ),
    "nan_sform": ("nan_sform.nii", lambda: _patch(_valid(), srow_x={0: np.nan}), 3, r"sform affine.*NaN or Inf"),
    "nan_qform": (
        "nan_qform.nii",
        lambda: _patch(_valid(), sform_code=0, quatern_c=np.nan),
        3,
        r"qform affine.*(NaN or Inf|cannot be computed)",
    ),
    "impossible_quaternion": (
        "bad_quaternion.nii",
        lambda: _patch(_valid(), sform_code=0, quatern_b=1.0, quatern_c=1.0, quatern_d=1.0),
        3,
        r"qform affine cannot be computed",
    ),
    "absurd_size_nii": ("absurd.nii", lambda: _big_dims(), 3, r"declares .* bytes \(.* GB\) of voxel data.*file holds"),
    "absurd_size_nifti2": (
        "absurd2.nii",
        lambda: _big_dims(nifti2=True, size=100_000),
        3,
        r"declares .* bytes \(.* GB\) of voxel data.*file holds",
    ),
    "absurd_size_gz": (
        "absurd.nii.gz",
        lambda: _gz(_big_dims()),
        3,
        r"declares .* bytes \(.* GB\) of voxel data.*gzip file .* can hold at most",
    ),
    "int64_overflowing_dims": (
        "overflow.nii",
        lambda: _patch(_valid(nifti2=True), nifti2=True, dim={1: 2**40, 2: 2**40, 3: 2**40}),
        3,
        r"declares .* bytes \(.* GB\) of voxel data",
    ),
    "vox_offset_beyond_file": (
        "far_offset.nii",
        lambda: _patch(_valid(), vox_offset=1e6),
        3,
        r"from byte 1000000.*file holds 2400 bytes",
    ),
    "vox_offset_inside_header": (
        "low_offset.nii",
        lambda: _patch(_valid(), vox_offset=100.0),
        3,
        r"vox_offset=100.*inside the 352-byte header",
    ),
    "vox_offset_zero": (
        "zero_offset.nii",
        lambda: _patch(_valid(), vox_offset=0.0),
        3,  # nibabel read header as voxels
        r"vox_offset=0 lies inside the 352-byte header",
    ),
    "vox_offset_nan": (
        "nan_offset.nii",
        lambda: _patch(_valid(), vox_offset=np.nan),
        3,
        r"vox_offset=nan is not a byte offset",
    ),
    "unknown_datatype": (
        "dtype999.nii",
        lambda: _patch(_valid(), datatype=999),
        3,
        r"datatype code 999 is not a NIfTI data type",
    ),
    "rgb24": (
        "rgb.nii",
        lambda: _patch(_valid(), datatype=128, bitpix=24),
        3,
        r"RGB.*\(datatype 128\).*one integer or float value per voxel",
    ),
    "rgba32": (
        "rgba.nii.gz",
        lambda: _gz(_patch(_valid(), datatype=2304, bitpix=32)),
        3,
        r"RGBA.*\(datatype 2304\).*one integer or float value per voxel",
    ),
    "complex64": (
        "complex.nii",
        lambda: _patch(_valid(), datatype=32, bitpix=64),
        3,
        r"COMPLEX64.*\(datatype 32\).*one integer or float value per voxel",
    ),
    "float128": (
        "float128.nii",
        lambda: _patch(_valid(), datatype=1536, bitpix=128),
        3,
        r"FLOAT128.*\(datatype 1536\)",
    ),
    "huge_extension": (
        "huge_ext.nii",
        lambda: _with_extension(_valid(), 2**31 - 1),
        3,
        r"extension at byte 352 declares 2147483647 bytes.*voxel data at byte 368",
    ),
    "huge_extension_gz": (
        "huge_ext.nii.gz",
        lambda: _gz(_with_extension(_valid(), 2**31 - 1)),
        3,
        r"extension at byte 352 declares 2147483647 bytes",
    ),
    "negative_extension_size": (
        "neg_ext.nii",
        lambda: _with_extension(_valid(), -16),
        3,
        r"extension at byte 352 declares -16 bytes.*8-byte size",
    ),
    "truncated_header": ("short_header.nii", lambda: _valid()[:200], 3, r"header is truncated \(200 of 348 bytes\)"),
    "truncated_header_gz": (
        "short_header.nii.gz",
        lambda: _gz(_valid()[:300]),
        3,
        r"header is truncated \(300 of 348 bytes\)",
    ),
    "truncated_data": ("short_data.nii", lambda: _valid()[:1000], 3, r"file holds 1000 bytes"),
    "truncated_gzip_stream": (
        "cut.nii.gz",
        lambda: _gz(_valid())[:-40],
        3,
        r"cannot be read as NIfTI.*(ended before|truncated)",
    ),
    "not_gzip_named_gz": ("plain.nii.gz", lambda: _valid(), 3, r"named \.nii\.gz but is not gzip-compressed"),
    "garbage_named_gz": (
        "garbage.nii.gz",
        lambda: b"this is not a NIfTI file at all",
        3,
        r"cannot be read as NIfTI.*not gzip-compressed",
    ),
    "corrupt_deflate": (
        "corrupt.nii.gz",
        lambda: _flip_bytes(_gz(_valid()), 20, 60),
        3,
        r"cannot be read as NIfTI \(zlib.error: Error -3 while decompressing",
    ),
    "gzip_named_nii": ("gz_inside.nii", lambda: _gz(_valid()), 3, r"gzip-compressed but named \.nii"),
    "empty_nii": ("empty.nii", lambda: b"", 3, r"file is empty"),
    "empty_gz": ("empty.nii.gz", lambda: b"", 3, r"file is empty"),
    "empty_gzip_stream": ("empty_stream.nii.gz", lambda: _gz(b""), 3, r"header is truncated \(0 of 348 bytes\)"),
    "wrong_magic": ("magic.nii", lambda: _patch(_valid(), magic=b"abc"), 3, r"magic string 'abc'.*'n\+1'"),
    "pair_magic_in_single_file": (
        "pair.nii",
        lambda: _patch(_valid(), magic=b"ni1"),
        3,
        r"magic string 'ni1'.*separate \.img",
    ),
    "wrong_sizeof_hdr": (
        "sizeof.nii",
        lambda: _patch(_valid(), sizeof_hdr=1234),
        3,
        r"sizeof_hdr.*1234.*348 \(NIfTI-1\) or 540 \(NIfTI-2\)",
    ),
    "nan_scl_inter": (
        "nan_inter.nii",
        lambda: _patch(_valid(dtype=np.int16), scl_slope=2.0, scl_inter=np.nan),
        3,
        r"scl_inter=nan with scl_slope=2.*scaling is undefined",
    ),
    "nan_voxels": ("nan_voxels.nii", lambda: _with_voxel(_valid(), 5, np.nan), 3, r"1 voxels are NaN or Inf"),
}


def _load_in_capped_child(path: Path, expect_ndim: int) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO), OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path), "case7", str(expect_ndim), str(ADDRESS_SPACE_CAP_BYTES)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=15,
    )
    assert proc.returncode == 0, f"the loader crashed the interpreter (exit {proc.returncode}): {proc.stderr[-2000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(20)
@pytest.mark.parametrize("row", sorted(ROWS))
def test_malformed_nifti_is_a_one_line_case_error_naming_the_file(row, tmp_path):
    filename, build, expect_ndim, says = ROWS[row]
    path = tmp_path / filename
    path.write_bytes(build())
    out = _load_in_capped_child(path, expect_ndim)
    assert not out["ok"], f"{row}: loaded without an error"
    assert out["is_case_error"], f"{row}: {out['type']} instead of CaseError:\n{out['traceback']}"
    msg = out["message"]
    assert filename in msg, msg
    assert "\n" not in msg, msg
    assert re.search(says, msg), f"{row}: {msg!r} does not match {says!r}"
    assert any(hint in msg for hint in SAYS_WHAT_TO_DO), msg
    assert out["rss_growth_kb"] < RSS_GROWTH_LIMIT_KB, f"{row}: peak RSS grew by {out['rss_growth_kb']} KB"


# ---------------------------------------------------------------- what still loads


@pytest.mark.parametrize("slope", [0.0, np.nan, np.inf])
def test_zero_or_non_finite_scl_slope_means_unscaled(slope, tmp_path):
    """The NIfTI standard: scl_slope 0 means no scaling; nibabel reads NaN and Inf the same way."""
    path = tmp_path / "slope.nii"
    path.write_bytes(_patch(_valid(dtype=np.int16), scl_slope=slope, scl_inter=5.0))
    vol = load_volume(path, "c")
    np.testing.assert_array_equal(vol.data.ravel(), np.arange(512, dtype=np.float32))


@pytest.mark.parametrize(
    "name, raw",
    [
        ("plain.nii", _valid()),
        ("plain.nii.gz", _gz(_valid())),
        ("nifti2.nii.gz", _gz(_valid(nifti2=True))),
        ("big_endian.nii", _big_endian()),
        ("trailing_singleton.nii", _valid(shape=(8, 8, 8, 1))),
        (
            "with_extension.nii",
            (lambda img: (img.header.extensions.append(nib.nifti1.Nifti1Extension(6, b"hello")), img.to_bytes())[1])(
                _image()
            ),
        ),
    ],
)
def test_valid_variants_still_load(name, raw, tmp_path):
    path = tmp_path / name
    path.write_bytes(raw)
    vol = load_volume(path, "c")
    assert vol.data.shape == (8, 8, 8) and vol.spacing_mm == (1.0, 1.0, 1.0)
    np.testing.assert_array_equal(vol.data.ravel(), np.arange(512, dtype=np.float32))


def test_a_size_beyond_free_memory_is_refused_before_reading(tmp_path, monkeypatch):
    """A .nii.gz of zeros compresses ~1000:1, so fitting the file is not enough: free memory is checked too."""
    import brats_seg.data.nifti_header as nifti_header

    path = tmp_path / "zeros.nii.gz"
    path.write_bytes(_gz(_valid()))
    monkeypatch.setattr(nifti_header, "_available_memory_bytes", lambda: 1000)
    with pytest.raises(CaseError, match=r"zeros\.nii\.gz.*needs about .* GB of memory but .* GB is available") as err:
        load_volume(path, "c")
    assert "\n" not in str(err.value) and "data.num_workers" in str(err.value)


# ---------------------------------------------------------------- as preparation reports it


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_workers", [1, 2])
def test_preparation_reports_a_malformed_header_by_file(num_workers, dataset_copy, tmp_path):
    """Through prepare_dataset; with 2 workers the memory estimate reads the bad header first."""
    from brats_seg.data.dataset import PreparationFailed, prepare_dataset
    from tests.conftest import TINY, data_config

    root = dataset_copy("brats2021")
    case = sorted(p for p in root.iterdir() if p.is_dir())[0]
    flair = case / f"{case.name}_flair.nii.gz"  # the first image: the one the worker estimate reads
    flair.write_bytes(_gz(_patch(nib.load(str(flair)).to_bytes(), pixdim={1: np.nan})))
    cfg = data_config(root, "brats2021", tmp_path)
    cfg.num_workers = num_workers
    with pytest.raises(PreparationFailed) as err:
        prepare_dataset(cfg, TINY, progress=False)
    [(case_id, msg)] = err.value.failures
    assert case_id == case.name and flair.name in msg and "\n" not in msg, msg
    assert re.search(r"pixdim\[1\]=nan.*finite and positive", msg) and "data.on_error=skip" in msg, msg
