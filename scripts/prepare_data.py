#!/usr/bin/env python
"""Validate, preprocess and cache a dataset at one resolution, and write its split.

    python scripts/prepare_data.py data=brats2021 data.root=/data/BraTS2021 resolution=half
    python scripts/prepare_data.py data=msd data.root=/data/Task01_BrainTumour data.on_error=skip

Prints how many cases were prepared (built now / already cached), which were skipped
and why, the array shapes, and the time taken; exits 2 on bad data unless
``data.on_error=skip``. SIGTERM/SIGINT stop it (and its worker processes) with exit status 75;
the same command then builds only the cases not prepared yet.
"""

from __future__ import annotations

from brats_seg.cli import hydra_entry, to_config, user_errors
from brats_seg.script_configs import register_configs

register_configs()


@hydra_entry("../configs", "prepare")
def main(cfg) -> None:
    from brats_seg.data.dataset import prepare_dataset

    conf = to_config(cfg)
    with user_errors("preparation"):
        ds = prepare_dataset(conf.data, conf.resolution)
    n = len(ds.entries)
    shape = tuple(conf.resolution.shape)
    print(
        f"prepared {n} cases ({ds.n_built} built now, {n - ds.n_built} already cached) "
        f"in {ds.seconds:.1f} s at {conf.resolution.spacing_mm} mm"
    )
    print(f"  image  {shape + (4,)} float16, regions {shape + (3,)} uint8 (WT, TC, ET)")
    print(f"  cache  {ds.cache_root}")
    print(
        f"  split  {ds.split_path}: train {len(ds.split['train'])}, val {len(ds.split['val'])}, "
        f"test {len(ds.split['test'])}"
    )
    if ds.skipped:
        print(f"skipped {len(ds.skipped)} case(s) (data.on_error=skip):")
        for _, msg in ds.skipped:
            print(f"  - {msg}")


if __name__ == "__main__":
    main()
