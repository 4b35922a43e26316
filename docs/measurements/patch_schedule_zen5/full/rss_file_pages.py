"""Where do the small-patch stages' 0.8-0.9 GB above their plans come from? One epoch of crops, read
as ``PatchSampler.crop`` reads them from the memory-mapped cache (the study's 13 training cases at
1 mm), in a fresh process, with its file-backed and anonymous resident memory before and after
(``/proc/self/status``: RssFile, RssAnon). Needs the study's prepared cache (run_full.sh makes it);
run from the repository's root, as the study ran (its cache folder is named by its data root).

    for p in 32,32,32 64,64,64 96,96,96; do
      python docs/measurements/patch_schedule_zen5/full/rss_file_pages.py $p 1
    done > docs/measurements/patch_schedule_zen5/full/rss_file_pages.txt
"""

import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO))

from brats_seg.data.dataset import dataset_cache_dir  # noqa: E402
from brats_seg.data.patches import PatchSampler, crops_per_case  # noqa: E402
from brats_seg.project import compose_config  # noqa: E402
from brats_seg.resolve import resolve_paths  # noqa: E402

RECORD = REPO / "docs/measurements/patch_schedule_zen5/full/arm-grow_seed-0"
# the study's cache as this clone prepares it (run_full.sh): <data.cache_dir>/<name>_<hash of the root>/full
_STUDY = resolve_paths(compose_config("train", ["experiment=patches_vs_whole_full", "+arm=grow"]))
CACHE = dataset_cache_dir(_STUDY.data) / _STUDY.resolution.name


def resident() -> dict[str, int]:
    with open("/proc/self/status") as f:
        return {
            k: int(v.split()[0]) * 1024
            for k, v in (line.split(":", 1) for line in f)
            if k in ("RssAnon", "RssFile", "VmRSS")
        }


def main(patch: list[int], epochs: int) -> None:
    cases = json.loads((RECORD / "split.json").read_text())["train"]
    arrays = [
        (np.load(CACHE / c / "image.npy", mmap_mode="r"), np.load(CACHE / c / "regions.npy", mmap_mode="r"))
        for c in cases
    ]
    shape = arrays[0][0].shape[:3]
    per_case = crops_per_case(shape, patch)
    sampler = PatchSampler(shape, patch, 0, 1 / 3, per_case * len(cases))
    before = resident()
    position = 0
    for epoch in range(epochs):
        for k, (image, regions) in enumerate(arrays):
            for _ in range(per_case):
                sampler.crop(epoch, position, k, image, regions)
                position += 1
    after = resident()
    files = sum(a.nbytes + b.nbytes for a, b in arrays)
    print(
        f"patch {patch}: {len(cases)} cases of {shape}, {per_case} crops a case, {epochs} epoch(s): "
        f"RssFile +{(after['RssFile'] - before['RssFile']) / 1e9:.2f} GB, "
        f"RssAnon +{(after['RssAnon'] - before['RssAnon']) / 1e9:.2f} GB (the cases' cache files {files / 1e9:.2f} GB)"
    )


if __name__ == "__main__":
    main([int(x) for x in sys.argv[1].split(",")], int(sys.argv[2]))
