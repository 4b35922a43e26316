#!/usr/bin/env python
"""Validate, preprocess and cache a dataset at one resolution, and write its split.

    python scripts/prepare_data.py data=brats2021 data.root=/data/BraTS2021 resolution=half
    python scripts/prepare_data.py data=msd data.root=/data/Task01_BrainTumour data.on_error=skip

Prints how many cases were prepared (built now / already cached), which were skipped
and why, the array shapes, the cache's size on disk, and the time taken; exits 2 on bad data
unless ``data.on_error=skip``. Before writing anything it predicts what the entries to build will
take (the resolution's grid fixes an entry's size: ~76 MB at full, ~9.5 MB at half) and refuses,
with the sizes, when the disk has less free; the progress bar shows cases/s, the ETA and the bytes
written. SIGTERM/SIGINT stop it (and its worker processes) with exit status 75;
the same command then builds only the cases not prepared yet.
"""

from __future__ import annotations

from brats_seg.cli import hydra_entry, to_config, user_errors
from brats_seg.script_configs import register_configs

register_configs()


@hydra_entry("../configs", "prepare")
def main(cfg) -> None:
    from brats_seg.data.cache import cache_bytes_on_disk, entry_bytes
    from brats_seg.data.dataset import prepare_dataset
    from brats_seg.data.labels import region_names
    from brats_seg.files import format_bytes

    conf = to_config(cfg)
    with user_errors("preparation"):
        ds = prepare_dataset(conf.data, conf.resolution)
    n = len(ds.entries)
    shape = tuple(conf.resolution.shape)
    print(
        f"prepared {n} cases ({ds.n_built} built now, {n - ds.n_built} already cached) "
        f"in {ds.seconds:.1f} s at {conf.resolution.spacing_mm} mm"
    )
    regions = region_names(conf.data.layout)
    names = ", ".join(r.upper() for r in regions)
    print(f"  image  {shape + (4,)} float16, regions {shape + (len(regions),)} uint8 ({names})")
    print(
        f"  cache  {ds.cache_root}: {format_bytes(cache_bytes_on_disk(ds.cache_root))} on disk "
        f"({format_bytes(entry_bytes(shape, 4, len(regions)))} a labelled case)"
    )
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
