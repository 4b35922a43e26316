"""Each stage of the recorded runs planned again by the current planner, against the peak above the
runtime each stage measured (history.csv's measured_bytes, its largest epoch). The records' own
plans (plan.json, at the commit that trained them) are printed beside: what a planner change did.

    python docs/measurements/patch_schedule_zen5/replan.py docs/measurements/patch_schedule_zen5/half/arm-* ...

A run's memory does not depend on the planner (lms=off in every record), so the measured peaks stand
for any planner version.
"""

import csv
import json
import sys
from pathlib import Path

from brats_seg.lms.planner.preflight import compare_run
from brats_seg.patch_schedule import Stage
from brats_seg.resolve import stage_config
from brats_seg.run_dir import RunFolder

rows = []
for folder in map(Path, sys.argv[1:]):
    if not (folder / "history.csv").is_file() or not (folder / "plan.json").is_file():  # older records: no plan.json
        continue
    cfg = RunFolder(folder).read_config()
    plan = json.loads((folder / "plan.json").read_text())
    history = list(csv.DictReader((folder / "history.csv").open()))
    stages = plan.get("stages") or [
        {"patch": cfg.trainer.patch_size or "whole", "share": 1.0, "batch_size": cfg.trainer.batch_size, "plan": plan}
    ]
    for k, entry in enumerate(stages, start=1):
        patch = None if entry["patch"] == "whole" else tuple(entry["patch"])
        stage = Stage(patch, entry["share"], entry["batch_size"])
        measured = max(float(h["measured_bytes"]) for h in history if int(float(h.get("stage") or 1)) == k)
        old = entry["plan"]["predicted_peak_bytes"]
        new = compare_run(stage_config(cfg, stage), "CPU")[2]["off"]["predicted_peak_bytes"]  # never refused
        rows.append((folder.name, k, stage.name, measured, old, new))
        print(
            f"{folder.name:<36} stage {k} {stage.name:>12}: measured {measured / 1e9:6.2f} GB, "
            f"recorded plan {old / 1e9:6.2f} GB ({measured / old - 1:+6.1%}), "
            f"this planner {new / 1e9:6.2f} GB ({measured / new - 1:+6.1%})"
        )
errors = [m / n - 1 for *_, m, _, n in rows]
if errors:
    print(f"\n{len(rows)} stages: measured / this planner's plan - 1 from {min(errors):+.1%} to {max(errors):+.1%}")
