"""CPU feature detection from /proc/cpuinfo text (both kinds of machine this project runs on)."""

from __future__ import annotations

from brats_seg.cpu import cpu_flags, cpu_isa, cpu_model_name, has_native_bf16

SAPPHIRE_RAPIDS = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz
flags\t\t: fpu sse sse2 avx avx2 fma avx512f avx512dq avx512cd avx512bw avx512vl avx512_bf16 amx_bf16 amx_tile
"""
EPYC = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC
flags\t\t: fpu sse sse2 avx f16c avx2 fma bmi2 sha_ni vaes
"""


def test_sapphire_rapids_is_avx512_with_native_bf16():
    assert cpu_isa(SAPPHIRE_RAPIDS) == "avx512"
    assert has_native_bf16(SAPPHIRE_RAPIDS)
    assert "amx_tile" in cpu_flags(SAPPHIRE_RAPIDS)
    assert cpu_model_name(SAPPHIRE_RAPIDS).startswith("Intel(R) Xeon(R) Platinum")


def test_epyc_avx2_only_has_no_native_bf16():
    assert cpu_isa(EPYC) == "avx2"
    assert not has_native_bf16(EPYC)
    assert cpu_model_name(EPYC) == "AMD EPYC"


def test_unknown_cpu():
    assert cpu_flags("") == frozenset()
    assert cpu_isa("") == "other" and not has_native_bf16("")
    assert cpu_isa("flags : avx512f avx2\n") == "avx2"  # AVX-512 F alone is not oneDNN's avx512_core
