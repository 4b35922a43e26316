"""Write a synthetic BraTS-like dataset in one of the three layouts.

    python scripts/make_synthetic.py out=data/synthetic_msd layout=msd n_cases=10 seed=0
    python scripts/make_synthetic.py out=/tmp/unlabelled layout=brats2023 n_cases=3 labels=false

Cases whose files all exist already are kept, so re-running completes an interrupted
run. See ``brats_seg.data.phantoms.synthetic`` for what a case contains.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from brats_seg.cli import hydra_entry

USAGE = "python scripts/make_synthetic.py out=DIR [layout=brats2021|brats2023|brats2024|msd] [n_cases=10] [seed=0] [labels=true]"


@hydra_entry("../configs", "make_synthetic")
def main(cfg: DictConfig) -> None:
    if OmegaConf.is_missing(cfg, "out") or not str(cfg.out).strip():
        sys.exit(f"make_synthetic: `out` is required: the folder to write the dataset to.\n  usage: {USAGE}")
    logging.getLogger("brats_seg").setLevel(logging.WARNING)  # the summary below says it all
    from brats_seg.data.phantoms.synthetic import write_synthetic_dataset

    out = Path(str(cfg.out)).expanduser()
    t0 = time.perf_counter()
    try:
        ids = write_synthetic_dataset(out, str(cfg.layout), int(cfg.n_cases), int(cfg.seed), bool(cfg.labels))
    except ValueError as e:
        sys.exit(f"make_synthetic: {e}\n  usage: {USAGE}")
    kind = "labelled" if cfg.labels else "unlabelled"
    print(f"Wrote {len(ids)} {kind} {cfg.layout} cases ({ids[0]} .. {ids[-1]}) to {out.resolve()} "
          f"in {time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
