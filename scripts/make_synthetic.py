"""Write a synthetic BraTS-like dataset in one of the layouts (brats2021, brats2023, brats2024, msd).

    python scripts/make_synthetic.py out=data/synthetic_msd layout=msd n_cases=10 seed=0
    python scripts/make_synthetic.py out=/tmp/unlabelled layout=brats2023 n_cases=3 labels=false

Cases whose files all exist already are kept, so re-running completes an interrupted
run. See ``brats_seg.data.phantoms.synthetic`` for what a case contains. A missing ``out=`` or a
bad value exits 2 with ``error: ...``, as every entry point does.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from brats_seg.cli import hydra_entry, to_config, user_errors
from brats_seg.script_configs import register_configs

register_configs()


@hydra_entry("../configs", "make_synthetic")
def main(cfg) -> None:
    conf = to_config(cfg)
    logging.getLogger("brats_seg").setLevel(logging.WARNING)  # the summary below says it all
    from brats_seg.data.phantoms.synthetic import write_synthetic_dataset

    out = Path(conf.out).expanduser()
    t0 = time.perf_counter()
    with user_errors("making the dataset"):
        if not str(conf.out).strip():
            raise ValueError("out is required: pass out=<the folder to write the dataset to>.")
        ids = write_synthetic_dataset(out, str(conf.layout), conf.n_cases, conf.seed, conf.labels)
    kind = "labelled" if conf.labels else "unlabelled"
    print(
        f"Wrote {len(ids)} {kind} {conf.layout} cases ({ids[0]} .. {ids[-1]}) to {out.resolve()} "
        f"in {time.perf_counter() - t0:.1f} s"
    )


if __name__ == "__main__":
    main()
