#!/usr/bin/env python
"""Write the MNI152 glioma dataset (real anatomy, reaction-diffusion tumours), brats2021 layout.

    python scripts/make_mni_gliomas.py [out=data/mni_gliomas] [n_cases=20] [seed=0]

Same seed, same files; complete cases already there are kept. Train on it with
``python train.py data=mni_gliomas`` (which also generates it on first use).
"""

from __future__ import annotations

from pathlib import Path

from brats_seg.cli import hydra_entry, to_config, user_errors
from brats_seg.script_configs import register_configs

register_configs()


@hydra_entry("../configs", "make_mni_gliomas")
def main(cfg) -> None:
    from brats_seg.data.phantoms.mni_gliomas import write_mni_glioma_dataset

    conf = to_config(cfg)
    with user_errors("writing the MNI glioma dataset"):
        ids = write_mni_glioma_dataset(conf.out, conf.n_cases, conf.seed)
    print(f"Wrote {len(ids)} MNI glioma cases ({ids[0]} .. {ids[-1]}) to {Path(conf.out).resolve()} (brats2021 layout)")


if __name__ == "__main__":
    main()
