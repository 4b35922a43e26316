#!/usr/bin/env python
"""Write the MNI152 glioma dataset (real anatomy, reaction-diffusion tumours), brats2021 layout.

    python scripts/make_mni_gliomas.py [out=data/mni_gliomas] [n_cases=20] [seed=0]

Same seed, same files; complete cases already there are kept. Train on it with
``python train.py data=mni_gliomas`` (which also generates it on first use).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

USAGE = "python scripts/make_mni_gliomas.py [out=data/mni_gliomas] [n_cases=20] [seed=0]"


def main(argv: list[str]) -> int:
    args = {"out": "data/mni_gliomas", "n_cases": "20", "seed": "0"}
    for a in argv:
        key, sep, value = a.partition("=")
        if not sep or key not in args:
            print(f"error: unknown argument {a!r}\nusage: {USAGE}", file=sys.stderr)
            return 2
        args[key] = value
    try:
        n, seed = int(args["n_cases"]), int(args["seed"])
        from brats_seg.data.phantoms.mni_gliomas import write_mni_glioma_dataset

        ids = write_mni_glioma_dataset(args["out"], n, seed)
    except ValueError as e:
        print(f"error: {e}\nusage: {USAGE}", file=sys.stderr)
        return 2
    print(f"Wrote {len(ids)} MNI glioma cases ({ids[0]} .. {ids[-1]}) to {Path(args['out']).resolve()} (brats2021 layout)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
