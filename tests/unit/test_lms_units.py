"""Reading ``lms.limit`` and printing sizes (brats_seg.lms.planner.units)."""

from __future__ import annotations

import pytest

from brats_seg.files import format_bytes
from brats_seg.lms.planner.units import format_gb, format_shape, parse_limit

GB = 10**9


@pytest.mark.parametrize(
    "text, device_bytes, expected",
    [
        ("16GB", None, 16 * 10**9),
        ("16GiB", None, 16 * 2**30),
        ("16 gib", None, 16 * 2**30),
        ("512MB", None, 512 * 10**6),
        ("512MiB", None, 512 * 2**20),
        ("1.5GB", None, 1_500_000_000),
        ("1.5e10", None, 15_000_000_000),
        ("12345", None, 12345),
        ("2048B", None, 2048),
        ("0.8", 10 * 10**9, 8 * 10**9),
        ("1.0", 10 * 10**9, 10 * 10**9),
        ("1", 10 * 10**9, 10 * 10**9),
        (0.5, 4 * 10**9, 2 * 10**9),
        (12345, None, 12345),
    ],
)
def test_parse_limit(text, device_bytes, expected):
    assert parse_limit(text, device_bytes) == expected


@pytest.mark.parametrize("text", ["", "abc", "16XB", "-5GB", "16 G B", "0", "0GB", "1e", True])
def test_parse_limit_rejects_junk(text):
    with pytest.raises(ValueError, match="lms.limit"):
        parse_limit(text, 10 * GB)


def test_parse_limit_fraction_needs_device_size():
    with pytest.raises(ValueError, match="device size is unknown"):
        parse_limit("0.8", None)


def test_sizes_print_in_si_units():
    assert [format_bytes(n) for n in (512, 3_100, 840_200_000, 12_345_000_000)] == [
        "512 B",
        "3.1 kB",
        "840.2 MB",
        "12.35 GB",
    ]
    assert format_gb(16 * GB) == "16.00 GB" and format_shape((192, 224, 160)) == "192x224x160"
