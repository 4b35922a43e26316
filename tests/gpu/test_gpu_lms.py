"""GPU acceptance of Large Model Support (skipped without a GPU; see README "GPU acceptance").

Each check runs ``scripts/benchmark.py`` in a subprocess, so every run gets a fresh GPU and
its own ``backend.gpu_memory_limit_mb`` cap (a logical device limit, set before TF starts).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _has_gpu() -> bool:
    if not shutil.which("nvidia-smi"):
        return False
    probe = subprocess.run(
        [sys.executable, "-c", "import tensorflow as tf; print(len(tf.config.list_physical_devices('GPU')))"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    return probe.returncode == 0 and probe.stdout.strip().splitlines()[-1:] != ["0"]


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _has_gpu(), reason="needs a CUDA GPU visible to TensorFlow")]

LIMIT_MB = 4096  # a 4 GB GPU, emulated on any larger one


def _bench(*overrides, timeout=1800):
    # The depth-4 U-Net of the README's LMS figures (the default depth, 3, suits the tiny grid).
    args = ["benchmark.steps=2", "trainer.batch_size=1", "model.depth=4", *overrides]
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "benchmark.py"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )
    if proc.returncode != 0:
        return None, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1]), ""


def _fits(shape, lms: str) -> bool:
    backend = "backend=gpu" if lms == "off" else "backend=gpu_lms"
    result, log = _bench(
        backend,
        f"backend.gpu_memory_limit_mb={LIMIT_MB}",
        f"lms={lms}",
        "lms.limit=1.0",
        f"resolution.shape=[{shape[0]},{shape[1]},{shape[2]}]",
        "resolution.name=probe",
    )
    if result is None and "ResourceExhausted" not in log and "does not fit" not in log and "OOM" not in log:
        pytest.fail(f"benchmark failed for another reason than memory:\n{log[-3000:]}")
    return result is not None


def _max_cube(lms: str) -> int:
    best = 0
    for side in range(64, 321, 32):  # cubes divisible by 2**4
        if not _fits((side, side, side), lms):
            break
        best = side
    return best


def test_auto_trains_larger_inputs_than_off_under_a_memory_limit():
    off, auto = _max_cube("off"), _max_cube("auto")
    print(f"\nlargest cube trainable in {LIMIT_MB} MB: lms=off {off}^3, lms=auto {auto}^3")
    assert auto > off > 0


@pytest.mark.parametrize("lms", ["off", "recompute", "offload"])
def test_device_peak_bytes_match_the_plan(lms):
    backend = "backend=gpu" if lms == "off" else "backend=gpu_lms"
    result, log = _bench(backend, f"lms={lms}", "resolution=half")
    assert result is not None, log[-3000:]
    print(
        f"\n{lms}: GPU peak {result['peak_bytes'] / 1e9:.2f} GB, predicted {result['predicted_peak_bytes'] / 1e9:.2f} GB"
    )
    assert abs(result["prediction_error"]) < 0.25
