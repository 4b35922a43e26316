"""Shared fixtures: small synthetic datasets in each layout, generated once per session."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# a step-time calibration cached in the user's home (lms.calibrate, calibrate_step_time.py quick=true)
# would take precedence over the shipped presets the tests assert against: the tests' own, empty
if "BRATS_SEG_CACHE_DIR" not in os.environ:
    import tempfile

    os.environ["BRATS_SEG_CACHE_DIR"] = tempfile.mkdtemp(prefix="brats_seg_test_cache_")
# and no test measures this CPU on first use (lms.calibrate=auto): parallel workers would time each
# other; tests/unit/test_self_calibration.py measures it on purpose
os.environ.setdefault("BRATS_SEG_CALIBRATE", "never")

from brats_seg.backend import configure_environment, decide_backend
from brats_seg.config import BackendConfig, DataConfig, ResolutionConfig

# TensorFlow's switches before any test imports it, as the entry points set them: oneDNN on
# (TensorFlow turns it on by itself only on CPUs with AVX512-VNNI and up, so on an AVX2 CPU the
# tests would otherwise run other kernels, and another CPU allocator, than the project does).
# backend=auto leaves GPUs visible for the gpu-marked tests (where nvidia-smi lists one).
configure_environment(decide_backend(BackendConfig()))

TINY = ResolutionConfig(name="tiny", spacing_mm=4.0, shape=[48, 56, 40])


@pytest.fixture(scope="session")
def synthetic_root(tmp_path_factory):
    """``layout -> folder`` with 3 labelled synthetic cases each (seed 0), read-only by convention."""
    from brats_seg.data.phantoms import synthetic

    # The four layouts hold the same three cases (case i of seed 0): each is generated once and
    # written four times (the generator is a pure function of its generator's state).
    generated, generate = {}, synthetic.generate_case

    def generate_once(rng):
        key = repr(rng.bit_generator.state)
        if key not in generated:
            generated[key] = generate(rng)
        return generated[key]

    base = tmp_path_factory.mktemp("synthetic")
    roots = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(synthetic, "generate_case", generate_once)
        for layout in ("brats2021", "brats2023", "brats2024", "msd"):
            roots[layout] = base / layout
            synthetic.write_synthetic_dataset(roots[layout], layout, n_cases=3, seed=0)
    return roots


@pytest.fixture
def dataset_copy(synthetic_root, tmp_path):
    """Copy a layout's synthetic dataset into tmp_path, for tests that modify files."""

    def copy(layout: str) -> Path:
        dst = tmp_path / f"{layout}_data"
        shutil.copytree(synthetic_root[layout], dst)
        return dst

    return copy


def data_config(root, layout: str, tmp_path, **kw) -> DataConfig:
    """A DataConfig for ``root`` with the cache under ``tmp_path``, preparing in-process."""
    return DataConfig(
        name=layout, layout=layout, root=str(root), cache_dir=str(tmp_path / "cache"), num_workers=1, **kw
    )


@contextlib.contextmanager
def mounted_tmpfs(folder: Path, size: str):
    """A tmpfs of ``size`` (``"4m"``) mounted at ``folder`` for the block, unmounted after it.

    Yields None where none can be mounted (not root, no mount command, refused), with the reason
    in the caller's hands: ``with mounted_tmpfs(...) as why_not`` is a str then, else None."""
    if os.geteuid() != 0:
        yield "mounting a size-limited tmpfs needs root"
        return
    if not shutil.which("mount"):
        yield "no mount command"
        return
    folder.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True, text=True
    )
    if done.returncode != 0:
        yield f"mount -t tmpfs failed: {done.stderr.strip()}"
        return
    try:
        yield None
    finally:
        if subprocess.run(["umount", str(folder)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(folder)], capture_output=True)  # a file still open: detach it


def skip_outside_ci(why: str) -> None:
    """Skip with ``why``; under ``CI`` fail instead: CI runs as root on a machine that has what these
    tests need (a memory cgroup, a tmpfs), so a skip there would hide a test that never ran."""
    if os.environ.get("CI"):
        pytest.fail(f"{why}: CI must run this test")
    pytest.skip(why)


def new_memory_cgroup(name: str) -> Path:
    """A fresh memory cgroup for a test's child process: a child of this process's own (v1), or of
    the root (v2). Skips the test, with the reason, where none can be made (not root, no memory
    controller; under CI it fails); the caller removes it (``rmdir``) when done."""
    from brats_seg.memory import cgroup_memory

    if os.geteuid() != 0:
        skip_outside_ci("creating a memory cgroup needs root")
    own = cgroup_memory()
    if own is None:
        skip_outside_ci("no memory cgroup controller is mounted here (/proc/self/cgroup, /proc/self/mountinfo)")
    if own["version"] == 1:
        folder = Path(own["path"]) / name
    else:
        root = Path(own["path"])
        while (root.parent / "cgroup.controllers").exists():
            root = root.parent
        if "memory" not in (root / "cgroup.subtree_control").read_text().split():
            skip_outside_ci(f"cgroup v2 without the memory controller enabled under {root}")
        folder = root / name
    try:
        folder.mkdir()
    except OSError as e:
        skip_outside_ci(f"cannot create a memory cgroup at {folder}: {e}")
    return folder
