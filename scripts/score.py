#!/usr/bin/env python
"""Score existing masks against a labelled dataset (no model, no TensorFlow).

    python scripts/score.py pred_dir=/out/masks ref_dir=/data/BraTS2021 data=brats2021
    python scripts/score.py pred_dir=/out/masks ref_dir=/data/BraTS2024-GLI data=brats2024   # WT, TC, ET, RC
    python scripts/score.py pred_dir=/out/masks ref_dir=/data/Task01_BrainTumour data=msd out=scores/msd.csv

Masks are ``<pred_dir>/<case_id>.nii.gz`` in the layout's own labels, on the reference
label files' grids. A reference case without a mask counts as an empty prediction (as
the BraTS challenge scores a missing submission) and is listed. Writes the same
``metrics.csv`` columns as scripts/evaluate.py (legacy, lesion-wise BraTS 2023-24 and
today's official panoptica metrics, per region of the layout) to ``out`` (default
``<pred_dir>/metrics.csv``) and ``summary.json`` beside it. Exits 2 with a message on a
mask on another grid or with labels outside the layout's set.
"""

from __future__ import annotations

from brats_seg.cli import hydra_entry, to_config, user_errors
from brats_seg.script_configs import register_configs

register_configs()


@hydra_entry("../configs", "score")
def main(cfg) -> None:
    from brats_seg.data.errors import DatasetError
    from brats_seg.evaluation.scoring.metrics import HD95_EMPTY_MM
    from brats_seg.evaluation.scoring.score import score_masks
    from brats_seg.evaluation.scoring.table import format_summary_table

    conf = to_config(cfg)
    ref_dir = conf.ref_dir or conf.data.root
    with user_errors():
        if not str(ref_dir).strip():
            raise DatasetError("ref_dir is not set: pass ref_dir=<the labelled dataset root>.")
        result = score_masks(conf.pred_dir, ref_dir, conf.data.layout, conf.out or None, conf.data.on_error)
    print(f"\nscored {result.summary['n_cases']} case(s) of {ref_dir} ({conf.data.layout} labels):\n")
    print(format_summary_table(result.summary, result.regions))
    if result.missing:
        print(
            f"\n{len(result.missing)} case(s) had no mask in {conf.pred_dir} and were scored as empty "
            f"predictions (Dice 0, HD95 {HD95_EMPTY_MM} mm where the reference is not empty): "
            f"{', '.join(result.missing)}"
        )
    if result.unmatched:
        print(f"{len(result.unmatched)} mask(s) without a reference case were ignored: {', '.join(result.unmatched)}")
    print(f"\n  metrics  {result.csv_path}")
    print(f"  summary  {result.summary_path}")


if __name__ == "__main__":
    main()
