"""CPU feature detection from /proc/cpuinfo text (both kinds of machine this project runs on),
and the precision check that uses it."""

from __future__ import annotations

import pytest

from brats_seg import cpu
from brats_seg.backend import BackendError, check_precision, configure, decide_backend
from brats_seg.config import BackendConfig
from brats_seg.cpu import cpu_flags, cpu_isa, cpu_kind, cpu_model_name, device_has_native_bf16, has_native_bf16

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


ZEN4 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9R14 96-Core Processor
flags\t\t: fpu sse sse2 avx avx2 fma avx512f avx512dq avx512cd avx512bw avx512vl avx512_bf16 avx512_vnni
"""


def test_kinds_tell_amx_from_avx512_bf16_alone():
    assert cpu_kind(SAPPHIRE_RAPIDS, {}) == "avx512_amx"
    assert cpu_kind(ZEN4, {}) == "avx512" and has_native_bf16(ZEN4, {})  # Zen 4: AVX512-BF16, no AMX
    assert cpu_kind(EPYC, {}) == "avx2" and cpu_kind("", {}) == "other"
    assert cpu_isa(ZEN4, {}) == cpu_isa(SAPPHIRE_RAPIDS, {}) == "avx512"


@pytest.mark.parametrize(
    "cap, kind, bf16",
    [
        ("AVX2", "avx2", False),
        ("avx512_core", "avx512", False),
        ("AVX512_CORE_BF16", "avx512", True),
        ("AVX512_CORE_AMX", "avx512_amx", True),
        ("DEFAULT", "avx512_amx", True),
        ("bogus", "avx512_amx", True),
    ],
)
def test_onednn_cap_lowers_what_the_cpu_is_taken_for(cap, kind, bf16):
    """oneDNN runs the capped set's kernels: the presets and the bf16 check must follow it
    (an unknown value caps nothing, as oneDNN ignores it)."""
    assert cpu_kind(SAPPHIRE_RAPIDS, {"ONEDNN_MAX_CPU_ISA": cap}) == kind
    assert has_native_bf16(SAPPHIRE_RAPIDS, {"ONEDNN_MAX_CPU_ISA": cap}) is bf16
    assert cpu_kind(EPYC, {"ONEDNN_MAX_CPU_ISA": cap}) == "avx2"  # a cap never raises the CPU
    assert cpu_kind(SAPPHIRE_RAPIDS, {"DNNL_MAX_CPU_ISA": "AVX2"}) == "avx2"  # oneDNN's older name


def test_sapphire_rapids_is_avx512_with_native_bf16():
    assert cpu_isa(SAPPHIRE_RAPIDS) == "avx512"
    assert has_native_bf16(SAPPHIRE_RAPIDS)
    assert "amx_tile" in cpu_flags(SAPPHIRE_RAPIDS)
    assert cpu_model_name(SAPPHIRE_RAPIDS).startswith("Intel(R) Xeon(R) Platinum")


def test_epyc_avx2_only_has_no_native_bf16():
    assert cpu_isa(EPYC) == "avx2"
    assert not has_native_bf16(EPYC)
    assert cpu_model_name(EPYC) == "AMD EPYC"


def test_every_gpu_computes_bf16_and_a_cpu_as_its_flags_say(monkeypatch):
    for native in (False, True):
        monkeypatch.setattr(cpu, "has_native_bf16", lambda *a, native=native: native)  # as tests stand in for the CPU
        assert device_has_native_bf16("GPU") and device_has_native_bf16("CPU") is native


def test_unknown_cpu():
    assert cpu_flags("") == frozenset()
    assert cpu_isa("") == "other" and not has_native_bf16("")
    assert cpu_isa("flags : avx512f avx2\n") == "avx2"  # AVX-512 F alone is not oneDNN's avx512_core


# --- backend.precision against what the CPU can do (issue: bf16 on a CPU without native bf16) ---


def test_bf16_refused_on_a_cpu_without_native_bf16_with_the_reason_and_the_fix():
    with pytest.raises(BackendError) as err:
        check_precision("bf16", "CPU", EPYC)
    message = str(err.value)
    assert "AVX512-BF16 or AMX-BF16" in message and "AMD EPYC" in message
    assert "im2col" in message and "backend.precision=fp32" in message


def test_bf16_accepted_where_it_is_native_or_on_a_gpu():
    check_precision("bf16", "CPU", SAPPHIRE_RAPIDS)
    check_precision("bf16", "GPU", EPYC)
    check_precision("fp32", "CPU", EPYC)


def test_fp16_refused_on_cpu_whatever_the_flags():
    with pytest.raises(BackendError, match="fp16 needs a GPU"):
        check_precision("fp16", "CPU", SAPPHIRE_RAPIDS)


def test_the_start_refuses_bf16_before_any_model_on_a_faked_avx2_cpu(monkeypatch):
    """The entry points' own path (decide, then configure) with the host's flags faked to an AVX2-only
    CPU: refused where decided, before the policy is set."""
    import keras

    monkeypatch.setattr(cpu, "_cpuinfo", lambda: EPYC)
    before = keras.mixed_precision.global_policy().name
    with pytest.raises(BackendError, match="backend.precision=bf16 needs a CPU"):
        configure(decide_backend(BackendConfig(name="cpu_onednn", precision="bf16")))
    assert keras.mixed_precision.global_policy().name == before  # refused before the policy was set
