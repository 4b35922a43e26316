"""Shared fixtures: small synthetic datasets in each layout, generated once per session."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from brats_seg.config import DataConfig, ResolutionConfig  # noqa: E402

TINY = ResolutionConfig(name="tiny", spacing_mm=4.0, shape=[48, 56, 40])


@pytest.fixture(scope="session")
def synthetic_root(tmp_path_factory):
    """``layout -> folder`` with 3 labelled synthetic cases each (seed 0), read-only by convention."""
    from brats_seg.data.phantoms.synthetic import write_synthetic_dataset

    base = tmp_path_factory.mktemp("synthetic")
    roots = {}
    for layout in ("brats2021", "brats2023", "brats2024", "msd"):
        roots[layout] = base / layout
        write_synthetic_dataset(roots[layout], layout, n_cases=3, seed=0)
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
    return DataConfig(name=layout, layout=layout, root=str(root), cache_dir=str(tmp_path / "cache"),
                      num_workers=1, **kw)
